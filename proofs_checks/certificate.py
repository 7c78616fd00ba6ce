"""Run the registry and write certificates: JSON (DESIGN §9), Markdown and LaTeX.

A certificate records the machine with ``environment()`` (from ``reference.environment``,
re-exported here), the one recorder that benchmarks and comparisons extend with their own keys.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from proofs_checks import latex, machine_checked
from proofs_checks.registry import REGISTRY, CheckResult, Context, PropositionResult, run_check
from reference.environment import LIBRARIES as LIBRARIES  # re-exported
from reference.environment import environment

#: The files ``Certificate.write`` produces, in this order.
CERTIFICATE_FILES = ("certificate.json", "certificate.md", "certificate.tex", "certificate.bib")
#: The most ids a BibTeX title lists; past that it gives their number (``Certificate.bib_title``).
BIB_TITLE_IDS = 3


def _bib_id(pid: str) -> str:
    """A proposition id for BibTeX: LaTeX text in braces (its case kept by every style)."""
    return "{" + latex.text(pid) + "}"


def _number(x: float | None) -> float | None:
    """JSON has no inf/NaN: those become null (the check's detail says what happened)."""
    return x if x is not None and math.isfinite(x) else None


def _ratio(residual: float | None, tolerance: float | None) -> float:
    if residual is None or tolerance is None:
        return math.inf
    if tolerance == 0:
        return 0.0 if residual == 0 else math.inf
    return residual / tolerance


def worst(result: PropositionResult) -> CheckResult | None:
    """The check whose residual is closest to (or furthest past) its tolerance."""
    return max(
        result.ran,
        key=lambda c: _ratio(c.outcome.residual, c.outcome.tolerance),
        default=None,
    )


@dataclass
class Certificate:
    results: list[PropositionResult]
    seed: int
    quick: bool
    environment: dict[str, Any] = field(default_factory=environment)
    #: Propositions chosen but not run here, each {"id", "title", "reason"} (a required module
    #: missing); they neither pass nor fail the certificate, and it says so.
    not_run: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seed": self.seed,
            "quick": self.quick,
            "propositions": [_proposition_dict(r) for r in self.results],
            "not_run": self.not_run,
            "environment": self.environment,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def to_markdown(self) -> str:
        lines = [
            "# Certificate",
            "",
            f"**{'PASSED' if self.passed else 'FAILED'}** — seed {self.seed}"
            f"{', quick run' if self.quick else ''}; "
            f"commit {self.environment.get('git_commit') or 'unknown'}; "
            f"{self.environment['created']}.",
            "",
            summary_table(self.results),
            "",
            *(f"Not run: {n['id']} ({n['title']}): {n['reason']}." for n in self.not_run),
            *([""] if self.not_run else []),
        ]
        for r in self.results:
            p = r.proposition
            lines += [
                f"## {p.id}: {p.title}",
                "",
                f"> {p.statement}",
                "",
                "Hypotheses: " + "; ".join(p.hypotheses) + ".",
                "",
                *(["Remarks (not certified): " + " ".join(p.remarks), ""] if p.remarks else []),
                f"Exercised: {exercised_text(r)}.",
                "",
                f"Content hash: `{p.hash}`; implementation hash: `{p.implementation_hash}`",
                "",
                "| kind | check | residual | tolerance | passed | control | control rejected |",
                "|---|---|---|---|---|---|---|",
            ]
            for c in r.checks:
                lines.append(
                    f"| {c.kind} | {c.name} | {_fmt(c.outcome.residual)} | "
                    f"{_fmt(c.outcome.tolerance)} | {_passed(c)} | {c.control} | "
                    f"{_rejection(c)} |"
                )
            lines.append("")
            for c in r.checks:
                ran = "; ".join(f"{what} {value}" for what, value in c.outcome.exercised)
                lines.append(
                    f"- *{c.name}*{f' ({ran})' if ran else ''}: {c.outcome.detail}. "
                    f"Control: {c.control_outcome.detail}."
                )
            lines.append("")
        lines += [
            "## Environment",
            "",
            "```json",
            json.dumps(self.environment, indent=2),
            "```",
            "",
        ]
        return "\n".join(lines)

    def to_latex(self) -> str:
        """The certificate as ASCII LaTeX for pdflatex (``proofs_checks.latex``: symbols as
        commands, Greek in math mode). One file for both uses: ``\\input{certificate}`` in a
        paper (whose preamble loads amsmath and amssymb) sets the body only; compiled on its
        own (``pdflatex certificate.tex``) it is a complete article. The tables use fixed
        column widths, so long check names wrap inside the page."""
        env = self.environment
        out = [
            r"% rattn certificate. In a paper: \input{certificate} (needs amsmath, amssymb).",
            r"% On its own: pdflatex certificate.tex. ASCII only; no other package needed.",
            r"\makeatletter",
            r"\ifx\documentclass\@twoclasseserror",
            r"  \gdef\rattnend{}",
            r"\else",
            r"  \gdef\rattnend{\end{document}}",
            r"  \documentclass[10pt]{article}",
            r"  \usepackage[T1]{fontenc}",
            r"  \usepackage{amsmath,amssymb}",
            r"  \usepackage[margin=2.2cm]{geometry}",
            r"  \begin{document}",
            r"\fi",
            r"\makeatother",
            # identifiers and code in typewriter type break only at spaces and allowed breaks:
            # \sloppy lets those lines stretch instead of overflowing the margin
            r"\begingroup\sloppy\setlength{\tabcolsep}{3pt}",
            r"\section*{Certificate}",
            rf"Result: \textbf{{{'passed' if self.passed else 'FAILED'}}}; seed {self.seed}"
            rf"{'; quick run' if self.quick else ''}; "
            rf"{_provenance_tex(env)}; {latex.text(env['created'])}.",
        ]
        for r in self.results:
            p = r.proposition
            out += [
                "",
                rf"\subsection*{{{latex.text(p.id)}: {latex.text(p.title)}}}",
                rf"\noindent\textbf{{Proposition ({latex.text(p.id)}).}} {latex.math(p.statement)}",
                "",
                r"\noindent Hypotheses: " + "; ".join(latex.text(h) for h in p.hypotheses) + ".",
                "",
                *(
                    [r"\noindent Remarks (not certified): " + latex.math(" ".join(p.remarks)), ""]
                    if p.remarks
                    else []
                ),
                rf"\noindent Exercised: {latex.text(exercised_text(r))}.",
                "",
                rf"\noindent{{\footnotesize Hash {latex.code(p.hash)}\\ "
                rf"implementation hash {latex.code(p.implementation_hash)}}}",
                "",
                r"{\small\noindent\begin{tabular}{@{}p{0.11\linewidth}p{0.36\linewidth}"
                r"p{0.13\linewidth}p{0.13\linewidth}p{0.15\linewidth}@{}}",
                r"\hline kind & check & residual & tolerance & passed / control rejected \\ \hline",
            ]
            for c in r.checks:
                out.append(
                    rf"{c.kind} & {latex.text(c.name)} & {latex.text(_fmt(c.outcome.residual))} & "
                    rf"{latex.text(_fmt(c.outcome.tolerance))} & {latex.text(_passed(c))} / "
                    rf"{latex.text(_rejection(c))} \\"
                )
            out.append(r"\hline\end{tabular}}")
        versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        out += [
            "",
            *(
                rf"\noindent Not run: {latex.text(n['id'])} ({latex.text(n['title'])}): "
                rf"{latex.text(n['reason'])}.\par"
                for n in self.not_run
            ),
            rf"\noindent Python {latex.text(env['python'])} on {latex.text(env['platform'])}; "
            rf"{latex.text(versions)}.\par",
            r"\endgroup",
            r"\rattnend",
            "",
        ]
        return "\n".join(out)

    def to_bib(self) -> str:
        """A BibTeX entry for the certificate: key ``rattn-<first 8 of the source hash>-s<seed>``;
        a short title (``bib_title``); the ids, package version, seed, result, commit and hashes
        in ``note``. Every id is in braces, so that a style that changes the case of titles and
        notes leaves it as it is."""
        env = self.environment
        version = env["versions"].get("rattn") or "unknown"
        source = env.get("source_hash") or "unknown"
        ids = ", ".join(_bib_id(r.proposition.id) for r in self.results)
        details = (
            f"rattn {version}, seed {self.seed}{', quick run' if self.quick else ''}: "
            f"{'passed' if self.passed else 'FAILED'}; source hash {source}; "
            f"commit {env.get('git_commit') or 'unknown'}"
            + (" (with uncommitted changes)" if env.get("git_dirty") else "")
        )
        return "\n".join(
            [
                f"@misc{{rattn-{source[:8]}-s{self.seed},",
                "  author = {{rattn}},",
                f"  title = {{{self.bib_title()}}},",
                f"  year = {{{env['created'][:4]}}},",
                "  howpublished = {\\texttt{rattn certify}},",
                f"  note = {{Propositions {ids}; {latex.text(details)}}},",
                "}",
                "",
            ]
        )

    def bib_title(self) -> str:
        """The BibTeX title: the ids, each in braces, when there are at most BIB_TITLE_IDS of
        them (``Certificate of {RA-4} and {EB-3}``), else their number (``Certificate of 35
        propositions``); the full list is in the entry's ``note``."""
        ids = [_bib_id(r.proposition.id) for r in self.results]
        if not ids or len(ids) > BIB_TITLE_IDS:
            n = len(ids)
            return f"Certificate of {n} proposition{'' if n == 1 else 's'}"
        listed = ids[0] if len(ids) == 1 else ", ".join(ids[:-1]) + f" and {ids[-1]}"
        return f"Certificate of {listed}"

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write CERTIFICATE_FILES (JSON, Markdown, LaTeX, BibTeX) into ``out_dir`` (created
        if needed; refused first by ``check_destination``), all or none: each is written
        in full to a temporary file in ``out_dir``, and they are renamed into place
        (``os.replace``) only when all are written. An error or an interrupt while
        writing leaves the previous certificates as they were and no temporary file behind."""
        check_destination(out_dir)
        out = Path(out_dir)
        texts = {
            "json": self.to_json() + "\n",
            "md": self.to_markdown(),
            "tex": self.to_latex(),
            "bib": self.to_bib(),
        }
        temps: list[Path] = []
        try:
            out.mkdir(parents=True, exist_ok=True)
            for suffix, text in texts.items():
                temps.append(out / f".certificate.{suffix}.{secrets.token_hex(4)}.tmp")
                with temps[-1].open("x", encoding="utf-8") as fh:
                    fh.write(text)
                    fh.flush()
                    os.fsync(fh.fileno())
            for tmp, name in zip(temps, CERTIFICATE_FILES, strict=True):
                os.replace(tmp, out / name)
        except BaseException:
            for tmp in temps:
                tmp.unlink(missing_ok=True)
            raise
        return [out / name for name in CERTIFICATE_FILES]


def check_destination(out_dir: str | Path, files: Sequence[str] = CERTIFICATE_FILES) -> None:
    """Refuse a destination the certificates could not be written to, so that ``rattn certify``
    says so before its checks run rather than after: ``out_dir`` must be a directory or be
    creatable as one (its nearest existing ancestor a directory), none of CERTIFICATE_FILES in
    it may be a directory, and that directory must take a new file (probed with a temporary
    file, removed at once). Raises ValueError naming the path and the problem; creates
    nothing."""
    out = Path(out_dir)
    prefix = f"cannot write certificates to {str(out)!r}"
    for name in files:
        if (out / name).is_dir():
            raise ValueError(f"{prefix}: {str(out / name)!r} is a directory")
    existing = out
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        what = "it" if existing == out else repr(str(existing))
        kind = "a file, not a directory" if existing.is_file() else "not a directory"
        raise ValueError(f"{prefix}: {what} is {kind}")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".certificate-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(
            f"{prefix}: cannot create files in {str(existing)!r} ({exc.strerror})"
        ) from None


def _proposition_dict(r: PropositionResult) -> dict[str, Any]:
    p = r.proposition
    return {
        "id": p.id,
        "title": p.title,
        "statement": p.statement,
        "hypotheses": list(p.hypotheses),
        "seeds": p.seeds,
        "remarks": list(p.remarks),
        "exercised": r.exercised,
        "passed": r.passed,
        "hash": p.hash,
        "implementation_hash": p.implementation_hash,
        "checks": [
            {
                "kind": c.kind,
                "name": c.name,
                "passed": c.passed,
                "not_run": c.not_run,
                "residual": _number(c.outcome.residual),
                "tolerance": _number(c.outcome.tolerance),
                "detail": c.outcome.detail,
                "exercised": dict(c.outcome.exercised),
                "control": {
                    "variant": c.control,
                    "rejected": c.control_rejected,
                    "residual": _number(c.control_outcome.residual),
                    "tolerance": _number(c.control_outcome.tolerance),
                    "detail": c.control_outcome.detail,
                },
                "seconds": round(c.seconds, 3),
            }
            for c in r.checks
        ],
    }


def summary_table(results: Iterable[PropositionResult]) -> str:
    """Markdown table: id, title, kinds, worst residual against its tolerance, pass."""
    rows = ["| id | title | kinds | worst residual / tolerance | passed |", "|---|---|---|---|---|"]
    for r in results:
        w = worst(r)
        cell = f"{_fmt(w.outcome.residual)} / {_fmt(w.outcome.tolerance)}" if w else "–"
        rows.append(
            f"| {r.proposition.id} | {r.proposition.title} | {kinds_text(r)} | "
            f"{cell} | {_yes(r.passed)} |"
        )
    return "\n".join(rows)


def kinds_text(r: PropositionResult) -> str:
    """The kinds of the checks that ran, then those of the proposition's that did not run here
    ("float64, property; not run: machine-checked")."""
    ran = {c.kind for c in r.ran}
    text = ", ".join(k for k in r.proposition.kinds if k in ran) or "none"
    missing = [k for k in r.proposition.kinds if k not in ran]
    return text + (f"; not run: {', '.join(missing)}" if missing else "")


def exercised_text(r: PropositionResult) -> str:
    """What a proposition's checks exercised, one clause per kind of value ("sizes St(7, 3);
    points 8 random"), and how many checks report it when not all do."""
    clauses = [f"{what} {', '.join(values)}" for what, values in r.exercised.items()]
    text = "; ".join(clauses) if clauses else "not recorded by its checks"
    if 0 < r.exercised_by < len(r.ran):
        text += f" (recorded by {r.exercised_by} of the {len(r.ran)} checks that ran)"
    return text


def _passed(c: CheckResult) -> str:
    """Whether the check passed ("yes", "NO"), or "not run" (its program is missing here)."""
    return "not run" if c.not_run else _yes(c.outcome.passed)


def _rejection(c: CheckResult) -> str:
    """Whether the control was rejected, how far past its tolerance, and whether that makes it
    a near miss: "yes (28×, near miss)"; "not run" for a check that was not run."""
    if c.not_run:
        return "not run"
    if not c.control_rejected:
        return _yes(False)
    ratio = c.control_ratio
    notes = [] if ratio is None else [f"{ratio:.2g}×" if math.isfinite(ratio) else "non-finite"]
    if c.near_miss:
        notes.append("near miss")
    return _yes(True) + (f" ({', '.join(notes)})" if notes else "")


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.2e}"


def _provenance_tex(env: dict[str, Any]) -> str:
    """The code certified: commit (and whether it was edited) and the source hash."""
    commit = env.get("git_commit")
    where = (
        rf"commit {latex.code(commit)}"
        + (" with uncommitted changes" if env.get("git_dirty") else "")
        if commit
        else "no git commit"
    )
    return rf"{where}; source hash {latex.code(env.get('source_hash') or 'unknown')}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def resolve_ids(ids: Iterable[str] | None) -> list[str]:
    """The requested ids in registry order (all when None); ValueError names unknown ones."""
    if not ids:
        return list(REGISTRY)
    by_folded = {k.casefold(): k for k in REGISTRY}
    unknown = [i for i in ids if i.casefold() not in by_folded]
    if unknown:
        raise ValueError(
            f"unknown proposition id(s): {', '.join(unknown)}; known: {', '.join(REGISTRY)}"
        )
    wanted = {by_folded[i.casefold()] for i in ids}
    return [i for i in REGISTRY if i in wanted]


def certify(
    ids: Iterable[str] | None = None, quick: bool = False, seed: int = 0, progress: bool = False
) -> Certificate:
    """Run every check of the chosen propositions (all by default) and its negative control."""
    chosen = [REGISTRY[i] for i in resolve_ids(ids)]
    not_run = [{"id": p.id, "title": p.title, "reason": p.missing} for p in chosen if p.missing]
    ctx = Context(seed=seed, quick=quick)
    results = [PropositionResult(p) for p in chosen if not p.missing]
    jobs = [(r, c) for r in results for c in r.proposition.checks]
    # the context manager closes the bar at once when a check raises or is interrupted
    with tqdm(jobs, desc="certify", unit="check", disable=not progress, file=sys.stderr) as bar:
        for result, check in bar:
            bar.set_postfix_str(f"{result.proposition.id} {check.kind}")
            result.checks.append(run_check(check, ctx))
    return Certificate(results, seed, quick, environment=_environment(results), not_run=not_run)


def _environment(results: Sequence[PropositionResult]) -> dict[str, Any]:
    """``environment()`` with the versions of what the checks that ran used beyond the
    package's requirements: the optional modules their propositions require (torch for the
    PORT propositions) and, when a machine-checked check ran, Coq's and MathComp's (``tools``)."""
    libraries = sorted({m for r in results for m in r.proposition.requires})
    ran = {c.kind for r in results for c in r.ran}
    extra = {"tools": machine_checked.coq_versions()} if "machine-checked" in ran else {}
    return environment(*libraries, **extra)
