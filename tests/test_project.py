"""House rules: layering of the packages, the generated catalogue, README and CI agree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from proofs_checks.catalogue import render_catalogue

ROOT = Path(__file__).resolve().parents[1]


def imported_roots(package: str, skip: str | None = None) -> dict[str, set[str]]:
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        if skip and skip in path.parts:
            continue
        roots = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                roots.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = roots
    return found


def test_reference_imports_only_numerics() -> None:
    forbidden = {"torch", "sympy", "hypothesis", "pytest", "proofs_checks", "torch_port"}
    for path, roots in imported_roots("reference").items():
        assert not roots & forbidden, (path, roots & forbidden)


def test_torch_port_core_does_not_import_reference() -> None:
    for path, roots in imported_roots("torch_port", skip="experiments").items():
        assert not roots & {"reference", "proofs_checks"}, path


def test_proofs_checks_imports_torch_lazily_only() -> None:
    """Module-level imports of proofs_checks never name torch, except in the two packages that
    drive torch optimizers, port_compare and conformance, which only their commands import
    (inside the command): certify runs without torch."""
    for path in (ROOT / "proofs_checks").rglob("*.py"):
        if {"port_compare", "conformance"} & set(path.relative_to(ROOT / "proofs_checks").parts):
            continue
        body = ast.parse(path.read_text(encoding="utf-8")).body
        top = {a.name.split(".")[0] for n in body if isinstance(n, ast.Import) for a in n.names}
        top |= {n.module.split(".")[0] for n in body if isinstance(n, ast.ImportFrom) and n.module}
        assert not top & {"torch", "torch_port"}, path


def test_catalogue_is_up_to_date() -> None:
    written = (ROOT / "docs" / "propositions.md").read_text(encoding="utf-8")
    assert written == render_catalogue(), (
        "regenerate: python -m proofs_checks.catalogue > docs/propositions.md"
    )


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    assert commands[0].strip() == "pip install . && rattn certify"
    assert commands[1].strip() in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


#: The longest a module of the three packages may be: one idea per module (DESIGN §2).
MODULE_LINES = 500


def test_no_module_is_longer_than_one_idea_needs() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for package in ("reference", "proofs_checks", "torch_port")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES
    }
    assert not long, f"modules over {MODULE_LINES} lines: {long}"
