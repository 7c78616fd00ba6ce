"""The proposition catalogue, docs/propositions.md, generated from the registry.

Regenerate with ``python -m proofs_checks.catalogue > docs/propositions.md``; a test fails when the
file is stale.
"""

from __future__ import annotations

import inspect

from proofs_checks.registry import REGISTRY


def render_catalogue() -> str:
    lines = [
        "# Proposition catalogue",
        "",
        "Generated from the registry by `python -m proofs_checks.catalogue`; do not edit by hand.",
        "Cite a proposition by its id and the content hash below (the hash covers the statement,",
        "the hypotheses, the source of every check and of every `proofs_checks` module the checks'",
        "modules import, directly or not; `rattn certify` prints the same hash). Certificates",
        "also record each proposition's implementation hash, over the code of `reference` and",
        "`torch_port` its checks exercise (the modules that run for them, less the bodies of the",
        "functions only other propositions call), which changes with the code under test.",
        "",
    ]
    for p in REGISTRY.values():
        lines += [
            f"## {p.id}: {p.title}",
            "",
            f"> {p.statement}",
            "",
            "**Hypotheses.** " + "; ".join(p.hypotheses) + ".",
            "",
            f"**Seeds.** {p.seeds}.",
            *(["", "**Remarks (not certified).** " + " ".join(p.remarks)] if p.remarks else []),
            "",
            f"**Hash.** `{p.hash}`",
            "",
            "| kind | check | negative control |",
            "|---|---|---|",
            *(f"| {c.kind} | {c.name} | {c.control} |" for c in p.checks),
            "",
        ]
        for c in p.checks:
            doc = " ".join(inspect.getdoc(c.run).split()) if c.run.__doc__ else ""
            lines.append(f"- *{c.name}* ({c.kind}). {doc}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_catalogue(), end="")
