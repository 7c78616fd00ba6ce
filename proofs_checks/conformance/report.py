"""The certificate of an optimizer: ``rattn conform --out DIR`` writes conformance.json,
conformance.md and conformance.tex (ASCII LaTeX, ``proofs_checks.latex``), as ``rattn certify``
writes its certificates: the target, its package version and source hash, the claims, and the
result of each property with its measured value and bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proofs_checks import latex

FILES = ("conformance.json", "conformance.md", "conformance.tex")


def verdict(row: dict[str, Any]) -> str:
    """ "passed"/"FAILED" for a claimed property, "measured" or "not measured" otherwise."""
    if row["claimed"]:
        return "passed" if row["passed"] is True else "FAILED"
    return "not measured" if row["passed"] is None and row["value"] is None else "measured"


def _claim(row: dict[str, Any]) -> str:
    if not row["claimed"]:
        return "not claimed"
    return "claimed" if row["claim"] is True else f"claimed: {row['claim']}"


def _header(report: dict[str, Any]) -> list[tuple[str, str]]:
    rule = report["rule"] or "none"
    if report["settings"]:
        rule += " " + json.dumps(report["settings"], sort_keys=True)
    return [
        ("Target", report["target"]),
        ("Package", f"{report['package']} {report['version'] or '(version unknown)'}"),
        ("Source SHA-256", report["source_hash"] or "(no source file)"),
        (
            "Geometry, dtype, seed, lr",
            f"{report['geometry']}, {report['dtype']}, {report['seed']}, {report['lr']:g}",
        ),
        ("Rule", rule),
        ("Result", "PASSED" if report["passed"] else "FAILED: " + ", ".join(report["failed"])),
    ]


def to_markdown(report: dict[str, Any]) -> str:
    lines = ["# Conformance certificate", ""]
    lines += [
        f"- {k}: `{v}`" if k in ("Target", "Source SHA-256") else f"- {k}: {v}"
        for k, v in _header(report)
    ]
    lines += [
        "",
        "| property | claim | verdict | measured | bound | detail |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["properties"]:
        lines.append(
            f"| {row['id']} | {_claim(row)} | {verdict(row)} | {_fmt(row['value'])} | "
            f"{_fmt(row['bound'])} | {row['detail'].replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def to_latex(report: dict[str, Any]) -> str:
    out = [
        r"% rattn conform certificate: \input{conformance} in a paper (amsmath, amssymb).",
        r"\begingroup\sloppy",
        r"\section*{Conformance certificate}",
        r"\begin{description}",
    ]
    for k, v in _header(report):
        value = latex.code(v) if k == "Source SHA-256" else latex.text(v)
        out.append(rf"\item[{latex.text(k)}] {value}")
    out += [r"\end{description}", r"\begin{itemize}"]
    for row in report["properties"]:
        out.append(
            rf"\item \textbf{{{latex.text(row['id'])}}} ({latex.text(_claim(row))}, "
            rf"{latex.text(verdict(row))}): {latex.text(row['detail'])}"
        )
    out += [r"\end{itemize}", r"\endgroup", ""]
    return "\n".join(out)


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


def write(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write the three files into out_dir (created if needed); their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = (
        json.dumps(report, indent=2, ensure_ascii=False) + "\n",
        to_markdown(report),
        to_latex(report),
    )
    paths = [out / name for name in FILES]
    for path, text in zip(paths, texts, strict=True):
        path.write_text(text, encoding="utf-8")
    return paths
