"""``rattn verify CERT.json``: re-run a certificate on the code installed here and compare
everything it records that a reader sees.

What a referee runs: the certificate's ids, with its seed and its quick flag, through the
installed registry (``certify``), and the re-run's JSON (``Certificate.to_dict``) compared with
the recorded one, field by field:

- per proposition: ``title``, ``statement``, ``hypotheses``, ``seeds``, ``remarks``,
  ``exercised``, ``passed``, ``hash`` and ``implementation_hash``, equal as JSON values
  (``True`` is not ``1``);
- its ``checks``: as many, and per check (``checks[k]``) ``kind``, ``name``, ``passed``,
  ``not_run`` (the reason a check was not run, e.g. coqc missing; so a check not run where the
  certificate was made and run here, or the reverse, is a difference), ``exercised``,
  ``control.variant`` and ``control.rejected`` equal; ``tolerance`` and ``control.tolerance``
  within TOLERANCE_RTOL relative; ``residual`` and ``control.residual`` by the residual rule
  below; null (a non-finite value) equals null only;
- the certificate's ``passed`` against the conjunction of its propositions' ``passed`` (each
  compared with its re-run above);
- ``environment.versions.rattn`` against the version installed here;
- each ``not_run`` entry: a proposition of the installed registry, with its title, that
  requires an optional module (``Proposition.requires``); one that requires nothing cannot
  have been left out for a missing module.

The residual rule. A residual is measured in floating point: re-run with the same seed on one
machine it is the same number, but on another machine (another BLAS, another order of the same
sums) it is another sample of the same rounding errors, which the check's tolerance bounds and
nothing tighter does. So a recorded residual r₀ and its re-run r₁ (the re-run's tolerance t)
match when ``|r₁ − r₀| ≤ max((1 − 1/RESIDUAL_FACTOR)·max(|r₀|, |r₁|), RESIDUAL_FLOOR·t)``:
within a factor RESIDUAL_FACTOR = 2 of each other (a choice, not a bound: the same computation
rounded in another order gives residuals of the same size, not the same digits), or differing
by at most t/16 (RESIDUAL_FLOOR), so that a residual of 0 here and a rounding-level one there,
both deep inside the tolerance, still match. A check whose tolerance is 0 (a symbolic one,
exact) must record its residual exactly. On one machine the rule accepts the bit-identical
re-run and refuses any residual moved by more than a factor 2 and by more than t/16: a residual
of 0.26·t recorded as 1e-300 is refused; one of 1e-5·t recorded as 1e-300 is not (what the
certificate says of it, far inside its tolerance, is unchanged). Tolerances are closed-form
bounds evaluated in float64, so the relative TOLERANCE_RTOL = 1e-9 leaves room for rounding
only.

Not compared: each check's ``detail`` (prose quoting measured values, whose last digits may
differ between machines) and ``seconds``, the seed and the quick flag (the re-run uses the
recorded ones), the platform and the other libraries' versions (a referee's machine is another
one), and ``environment.source_hash`` (reported beside the result: the per-proposition hashes
are what pins the code).

An id the installed registry does not have, or one whose optional modules are not installed
here, is a mismatch. Each difference is reported with the proposition's id (null for the
certificate itself), the field, the recorded value and the value here. The certificate is
read with ``safe_json.read_json`` (no code runs from it); a file that is not a certificate,
or that lists an id twice, is refused with its name (ValueError).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from proofs_checks.certificate import certify
from proofs_checks.registry import REGISTRY
from proofs_checks.safe_json import label, read_json
from reference.environment import source_hash

#: Residuals recorded and re-run match within this factor of each other (module docstring).
RESIDUAL_FACTOR = 2.0
#: ... or when they differ by at most this fraction of the check's tolerance.
RESIDUAL_FLOOR = 1 / 16
#: Tolerances recorded and re-run match within this relative difference.
TOLERANCE_RTOL = 1e-9

#: The proposition fields compared as JSON values.
PROPOSITION_FIELDS = (
    "title",
    "statement",
    "hypotheses",
    "seeds",
    "remarks",
    "exercised",
    "passed",
    "hash",
    "implementation_hash",
)


def _read(path: Path) -> dict[str, Any]:
    """The certificate's JSON, its fields checked; ValueError naming the file otherwise."""
    doc = read_json(path)
    name = label(path)
    if not isinstance(doc, dict):
        raise ValueError(f"{name}: not a certificate (a JSON object is expected)")
    seed, quick, props = doc.get("seed"), doc.get("quick"), doc.get("propositions")
    if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
        raise ValueError(f"{name}: the certificate's seed is {seed!r}, not an integer ≥ 0")
    if not isinstance(quick, bool):
        raise ValueError(f"{name}: the certificate's quick flag is {quick!r}")
    if not isinstance(props, list) or not props:
        raise ValueError(f"{name}: the certificate lists no proposition")
    for k, p in enumerate(props):
        if not (
            isinstance(p, dict)
            and isinstance(p.get("id"), str)
            and isinstance(p.get("passed"), bool)
        ):
            raise ValueError(f"{name}: proposition {k} has no id or no result")
    ids: set[str] = set()
    for p in props:
        if p["id"] in ids:
            raise ValueError(f"{name}: proposition {p['id']} is listed twice")
        ids.add(p["id"])
    not_run = doc.get("not_run")
    if isinstance(not_run, list):
        both = [n["id"] for n in not_run if isinstance(_field(n, "id"), str) and n["id"] in ids]
        if both:
            raise ValueError(f"{name}: proposition {both[0]} is listed as run and as not run")
    return doc


def same(recorded: Any, here: Any) -> bool:
    """Equal as JSON values: the same text once written (so ``True`` is not ``1``, nor ``1.0``
    ``1``)."""
    return json.dumps(recorded, sort_keys=True) == json.dumps(here, sort_keys=True)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def residual_matches(recorded: Any, here: float | None, tolerance: float | None) -> bool:
    """The residual rule of the module docstring: null equals null only; at a ``tolerance`` of
    0, equal; otherwise within a factor RESIDUAL_FACTOR, or within RESIDUAL_FLOOR of the
    re-run's ``tolerance``."""
    if recorded is None or here is None:
        return recorded is None and here is None
    if not _number(recorded):
        return False
    if tolerance == 0:  # an exact check (SymPy's): its residual is exact too
        return recorded == here
    floor = RESIDUAL_FLOOR * tolerance if tolerance is not None else 0.0
    spread = (1 - 1 / RESIDUAL_FACTOR) * max(abs(recorded), abs(here))
    return abs(recorded - here) <= max(spread, floor)


def residual_at(tolerance: float | None) -> Callable[[Any, float | None], bool]:
    """``residual_matches`` at the re-run's ``tolerance``, as a rule of two values."""
    return functools.partial(residual_matches, tolerance=tolerance)


def tolerance_matches(recorded: Any, here: float | None) -> bool:
    """Null equals null only; otherwise within TOLERANCE_RTOL relative."""
    if recorded is None or here is None:
        return recorded is None and here is None
    return _number(recorded) and abs(recorded - here) <= TOLERANCE_RTOL * max(
        abs(recorded), abs(here)
    )


def _field(obj: Any, key: str) -> Any:
    """``obj[key]`` when ``obj`` is a JSON object that has it, else None."""
    return obj.get(key) if isinstance(obj, dict) else None


def _check_differences(k: int, rec: Any, now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, recorded, here) for each field of check ``k`` that differs."""
    prefix = f"checks[{k}]"
    if not isinstance(rec, dict):
        keys = ("kind", "name", "passed", "residual", "tolerance")
        return [(prefix, rec, {key: now[key] for key in keys})]
    rc, nc = _field(rec, "control"), now["control"]
    pairs = [
        ("kind", rec.get("kind"), now["kind"], same),
        ("name", rec.get("name"), now["name"], same),
        ("passed", rec.get("passed"), now["passed"], same),
        ("not_run", rec.get("not_run"), now["not_run"], same),
        ("exercised", rec.get("exercised"), now["exercised"], same),
        ("residual", rec.get("residual"), now["residual"], residual_at(now["tolerance"])),
        ("tolerance", rec.get("tolerance"), now["tolerance"], tolerance_matches),
        ("control.variant", _field(rc, "variant"), nc["variant"], same),
        ("control.rejected", _field(rc, "rejected"), nc["rejected"], same),
        ("control.residual", _field(rc, "residual"), nc["residual"], residual_at(nc["tolerance"])),
        ("control.tolerance", _field(rc, "tolerance"), nc["tolerance"], tolerance_matches),
    ]
    return [(f"{prefix}.{name}", r, h) for name, r, h, matches in pairs if not matches(r, h)]


def proposition_differences(rec: dict[str, Any], now: dict[str, Any]) -> list[dict[str, Any]]:
    """Each field of the recorded proposition ``rec`` that differs from its re-run ``now``
    (both as ``Certificate.to_dict`` writes them): ``{"id", "field", "recorded", "here"}``."""
    found = [
        (key, rec.get(key), now[key])
        for key in PROPOSITION_FIELDS
        if not same(rec.get(key), now[key])
    ]
    checks, here = rec.get("checks"), now["checks"]
    names = [f"{c['kind']}: {c['name']}" for c in here]
    if not isinstance(checks, list):
        found.append(("checks", checks, names))
    else:
        if len(checks) != len(here):
            recorded = [f"{_field(c, 'kind')}: {_field(c, 'name')}" for c in checks]
            found.append(("checks", recorded, names))
        for k, (c, n) in enumerate(zip(checks, here, strict=False)):
            found += _check_differences(k, c, n)
    return [{"id": rec["id"], "field": f, "recorded": r, "here": h} for f, r, h in found]


def certificate_differences(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The differences of the certificate's own fields (``id`` null, or the not-run entry's):
    its ``passed`` against its propositions', its package version against the installed one,
    and its ``not_run`` entries against the registry."""
    found: list[dict[str, Any]] = []
    props = doc["propositions"]
    conjunction = all(p["passed"] for p in props)
    if not same(doc.get("passed"), conjunction):
        found.append(
            {"id": None, "field": "passed", "recorded": doc.get("passed"), "here": conjunction}
        )
    version = _field(_field(doc.get("environment"), "versions"), "rattn")
    installed = _installed_version()
    if not same(version, installed):
        found.append(
            {
                "id": None,
                "field": "environment.versions.rattn",
                "recorded": version,
                "here": installed,
            }
        )
    not_run = doc.get("not_run", [])
    if not isinstance(not_run, list):
        return [*found, {"id": None, "field": "not_run", "recorded": not_run, "here": []}]
    for k, entry in enumerate(not_run):
        pid = _field(entry, "id")
        p = REGISTRY.get(pid) if isinstance(pid, str) else None
        if p is None:
            found.append(
                {
                    "id": None,
                    "field": f"not_run[{k}].id",
                    "recorded": pid,
                    "here": "not a proposition of the installed registry",
                }
            )
        elif not p.requires:
            found.append(
                {
                    "id": pid,
                    "field": "not_run",
                    "recorded": _field(entry, "reason"),
                    "here": "requires no optional module: it runs wherever rattn is installed",
                }
            )
        if p is not None and not same(_field(entry, "title"), p.title):
            found.append(
                {
                    "id": pid,
                    "field": "not_run.title",
                    "recorded": _field(entry, "title"),
                    "here": p.title,
                }
            )
    return found


def _installed_version() -> str | None:
    """The version of the rattn distribution installed here (None when it is not)."""
    try:
        return metadata.version("rattn")
    except metadata.PackageNotFoundError:
        return None


def verify(path: str | Path, *, progress: bool = False) -> dict[str, Any]:
    """Re-run the certificate at ``path`` and compare it (module docstring). One JSON-ready
    document: ``matches`` (bool), ``propositions`` (per id: recorded and current result, whether
    both hashes match, ``reason`` when it could not be re-run, ``match``) and ``differences``
    (each ``{"id", "field", "recorded", "here"}``)."""
    path = Path(path)
    doc = _read(path)
    recorded = doc["propositions"]
    runnable = [p["id"] for p in recorded if p["id"] in REGISTRY and not REGISTRY[p["id"]].missing]
    here: dict[str, dict[str, Any]] = {}
    if runnable:
        cert = certify(runnable, quick=doc["quick"], seed=doc["seed"], progress=progress)
        here = {p["id"]: p for p in cert.to_dict()["propositions"]}
    rows, differences = [], []
    for rec in recorded:
        pid, now = rec["id"], here.get(rec["id"])
        if now is None:
            known = REGISTRY.get(pid)
            reason = known.missing if known else "not a proposition of the installed registry"
            diffs = [{"id": pid, "field": "passed", "recorded": rec["passed"], "here": None}]
        else:
            reason, diffs = None, proposition_differences(rec, now)
        differences += diffs
        rows.append(
            {
                "id": pid,
                "recorded_passed": rec["passed"],
                "passed": None if now is None else now["passed"],
                "hash_matches": now is not None and same(rec.get("hash"), now["hash"]),
                "implementation_hash_matches": now is not None
                and same(rec.get("implementation_hash"), now["implementation_hash"]),
                "reason": reason,
                "match": not diffs,
            }
        )
    differences += certificate_differences(doc)
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    return {
        "certificate": str(path),
        "seed": doc["seed"],
        "quick": doc["quick"],
        "matches": not differences,
        "recorded_source_hash": env.get("source_hash"),
        "source_hash": source_hash(),
        "propositions": rows,
        "differences": differences,
    }


def format_verify(result: dict[str, Any]) -> str:
    """Markdown table of ``verify``, each difference on a line of its own, then the verdict."""

    def yes(v: Any) -> str:
        return "—" if v is None else ("yes" if v else "NO")

    lines = [
        f"Re-run of {result['certificate']} (seed {result['seed']}"
        f"{', quick' if result['quick'] else ''}) on the installed code:",
        "",
        "| id | recorded | now | hash | implementation hash | match |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["propositions"]:
        verdict = "yes" if row["match"] else "NO" + (f" ({row['reason']})" if row["reason"] else "")
        recorded = "passed" if row["recorded_passed"] else "failed"
        now = "—" if row["passed"] is None else ("passed" if row["passed"] else "failed")
        lines.append(
            f"| {row['id']} | {recorded} | {now} | {yes(row['hash_matches'])} "
            f"| {yes(row['implementation_hash_matches'])} | {verdict} |"
        )
    if result["differences"]:
        lines += ["", "Differences (recorded, then here):", ""]
        lines += [format_difference(d) for d in result["differences"]]
    same_source = result["recorded_source_hash"] == result["source_hash"]
    lines += [
        "",
        f"Source hash: recorded {result['recorded_source_hash'] or 'none'}, installed "
        f"{result['source_hash']} ({'the same' if same_source else 'different'}).",
        "",
        "MATCHES" if result["matches"] else "DOES NOT MATCH",
    ]
    return "\n".join(lines)


def format_difference(d: dict[str, Any]) -> str:
    """One line: ``- ID FIELD: recorded VALUE; here VALUE`` (values as JSON)."""

    def shown(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False)

    where = "certificate" if d["id"] is None else d["id"]
    return f"- {where} {d['field']}: recorded {shown(d['recorded'])}; here {shown(d['here'])}"
