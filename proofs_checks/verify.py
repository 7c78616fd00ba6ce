"""``rattn verify CERT.json``: re-run a certificate on the code installed here and say, per
proposition, whether the result and both hashes are the ones the certificate records.

What a referee runs: the certificate's ids, with its seed and its quick flag, through the
installed registry (``certify``); a proposition *matches* when it passes or fails as recorded,
its statement-and-checks hash is the recorded ``hash`` and its implementation hash the recorded
``implementation_hash``. An id the installed registry does not have, or a hash the certificate
does not record, is a mismatch. The certificate is read as JSON (no code runs from it); one that
is not a certificate is refused with its name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proofs_checks.certificate import certify
from proofs_checks.registry import REGISTRY
from reference.environment import source_hash


def _read(path: Path) -> dict[str, Any]:
    """The certificate's JSON, its fields checked; ValueError naming the file otherwise."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        message = f"{path}: not a readable certificate ({type(err).__name__}: {err})"
        raise ValueError(message) from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a certificate (a JSON object is expected)")
    seed, quick, props = doc.get("seed"), doc.get("quick"), doc.get("propositions")
    if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
        raise ValueError(f"{path}: the certificate's seed is {seed!r}, not an integer ≥ 0")
    if not isinstance(quick, bool):
        raise ValueError(f"{path}: the certificate's quick flag is {quick!r}")
    if not isinstance(props, list) or not props:
        raise ValueError(f"{path}: the certificate lists no proposition")
    for k, p in enumerate(props):
        if not (
            isinstance(p, dict)
            and isinstance(p.get("id"), str)
            and isinstance(p.get("passed"), bool)
        ):
            raise ValueError(f"{path}: proposition {k} has no id or no result")
    return doc


def verify(path: str | Path, *, progress: bool = False) -> dict[str, Any]:
    """Re-run the certificate at ``path`` (module docstring); one JSON-ready document with
    ``matches`` (bool) and ``propositions`` (id, recorded and current result and hashes,
    ``match``)."""
    path = Path(path)
    doc = _read(path)
    recorded = {p["id"]: p for p in doc["propositions"]}
    known = [i for i in recorded if i in REGISTRY]
    results = {}
    if known:
        cert = certify(known, quick=doc["quick"], seed=doc["seed"], progress=progress)
        results = {r.proposition.id: r for r in cert.results}
    rows = []
    for pid, rec in recorded.items():
        r = results.get(pid)
        now = None if r is None else r.proposition
        row = {
            "id": pid,
            "recorded_passed": rec["passed"],
            "passed": None if r is None else r.passed,
            "hash_matches": now is not None and rec.get("hash") == now.hash,
            "implementation_hash_matches": now is not None
            and rec.get("implementation_hash") == now.implementation_hash,
            "reason": None if now is not None else "not a proposition of the installed registry",
        }
        row["match"] = (
            r is not None
            and row["passed"] == rec["passed"]
            and row["hash_matches"]
            and row["implementation_hash_matches"]
        )
        rows.append(row)
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    return {
        "certificate": str(path),
        "seed": doc["seed"],
        "quick": doc["quick"],
        "matches": all(row["match"] for row in rows),
        "recorded_source_hash": env.get("source_hash"),
        "source_hash": source_hash(),
        "propositions": rows,
    }


def format_verify(result: dict[str, Any]) -> str:
    """Markdown table of ``verify``, then the verdict."""

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
    same = result["recorded_source_hash"] == result["source_hash"]
    lines += [
        "",
        f"Source hash: recorded {result['recorded_source_hash'] or 'none'}, installed "
        f"{result['source_hash']} ({'the same' if same else 'different'}).",
        "",
        "MATCHES" if result["matches"] else "DOES NOT MATCH",
    ]
    return "\n".join(lines)
