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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from proofs_checks.registry import REGISTRY, CheckResult, Context, PropositionResult, run_check
from reference.environment import LIBRARIES as LIBRARIES  # re-exported
from reference.environment import environment

#: The files ``Certificate.write`` produces, in this order.
CERTIFICATE_FILES = ("certificate.json", "certificate.md", "certificate.tex")


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
        result.checks,
        key=lambda c: _ratio(c.outcome.residual, c.outcome.tolerance),
        default=None,
    )


@dataclass
class Certificate:
    results: list[PropositionResult]
    seed: int
    quick: bool
    environment: dict[str, Any] = field(default_factory=environment)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seed": self.seed,
            "quick": self.quick,
            "propositions": [_proposition_dict(r) for r in self.results],
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
                f"Content hash: `{p.hash}`",
                "",
                "| kind | check | residual | tolerance | passed | control | control rejected |",
                "|---|---|---|---|---|---|---|",
            ]
            for c in r.checks:
                lines.append(
                    f"| {c.kind} | {c.name} | {_fmt(c.outcome.residual)} | "
                    f"{_fmt(c.outcome.tolerance)} | {_yes(c.outcome.passed)} | {c.control} | "
                    f"{_yes(c.control_rejected)} |"
                )
            lines.append("")
            for c in r.checks:
                lines.append(
                    f"- *{c.name}*: {c.outcome.detail}. Control: {c.control_outcome.detail}."
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
        env = self.environment
        out = [
            r"% Compile with lualatex or xelatex: check details contain Unicode.",
            r"\documentclass{article}",
            r"\usepackage{amsmath,amssymb,amsthm,booktabs,longtable,fontspec,unicode-math}",
            r"\newtheorem*{proposition}{Proposition}",
            r"\begin{document}",
            r"\section*{Certificate}",
            rf"Result: \textbf{{{'passed' if self.passed else 'FAILED'}}}; seed {self.seed}; "
            rf"commit \texttt{{{_tex(env.get('git_commit') or 'unknown')}}}; "
            rf"{_tex(env['created'])}.",
        ]
        for r in self.results:
            p = r.proposition
            out += [
                rf"\subsection*{{{_tex(p.id)}: {_tex(p.title)}}}",
                rf"\begin{{proposition}}[{_tex(p.id)}]{p.statement}\end{{proposition}}",
                rf"Hash: \texttt{{{p.hash}}}.",
                r"\begin{longtable}{lllll}\toprule",
                r"kind & check & residual & tolerance & passed / control rejected \\ \midrule",
            ]
            for c in r.checks:
                out.append(
                    rf"{c.kind} & {_tex(c.name)} & {_fmt(c.outcome.residual)} & "
                    rf"{_fmt(c.outcome.tolerance)} & {_yes(c.outcome.passed)} / "
                    rf"{_yes(c.control_rejected)} \\"
                )
            out.append(r"\bottomrule\end{longtable}")
        versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        out += [
            rf"\noindent Python {_tex(env['python'])} on {_tex(env['platform'])}; "
            rf"{_tex(versions)}.",
            r"\end{document}",
            "",
        ]
        return "\n".join(out)

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write certificate.json, certificate.md and certificate.tex into ``out_dir`` (created
        if needed; refused first by ``check_destination``), all three or none: each is written
        in full to a temporary file in ``out_dir``, and they are renamed into place
        (``os.replace``) only when all three are written. An error or an interrupt while
        writing leaves the previous certificates as they were and no temporary file behind."""
        check_destination(out_dir)
        out = Path(out_dir)
        texts = {"json": self.to_json() + "\n", "md": self.to_markdown(), "tex": self.to_latex()}
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


def check_destination(out_dir: str | Path) -> None:
    """Refuse a destination the certificates could not be written to, so that ``rattn certify``
    says so before its checks run rather than after: ``out_dir`` must be a directory or be
    creatable as one (its nearest existing ancestor a directory), none of CERTIFICATE_FILES in
    it may be a directory, and that directory must take a new file (probed with a temporary
    file, removed at once). Raises ValueError naming the path and the problem; creates
    nothing."""
    out = Path(out_dir)
    prefix = f"cannot write certificates to {str(out)!r}"
    for name in CERTIFICATE_FILES:
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
        "passed": r.passed,
        "hash": p.hash,
        "checks": [
            {
                "kind": c.kind,
                "name": c.name,
                "passed": c.passed,
                "residual": _number(c.outcome.residual),
                "tolerance": _number(c.outcome.tolerance),
                "detail": c.outcome.detail,
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
            f"| {r.proposition.id} | {r.proposition.title} | {', '.join(r.proposition.kinds)} | "
            f"{cell} | {_yes(r.passed)} |"
        )
    return "\n".join(rows)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.2e}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


_TEX = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\^{}",
    "\\": r"\textbackslash{}",
}


def _tex(text: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(text))


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
    ctx = Context(seed=seed, quick=quick)
    results = [PropositionResult(p) for p in chosen]
    jobs = [(r, c) for r in results for c in r.proposition.checks]
    # the context manager closes the bar at once when a check raises or is interrupted
    with tqdm(jobs, desc="certify", unit="check", disable=not progress, file=sys.stderr) as bar:
        for result, check in bar:
            bar.set_postfix_str(f"{result.proposition.id} {check.kind}")
            result.checks.append(run_check(check, ctx))
    return Certificate(results, seed, quick)
