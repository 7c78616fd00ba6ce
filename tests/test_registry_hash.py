"""The content hash of a proposition covers its check modules and every ``proofs_checks`` module
they import, transitively (no hand-kept list); ``registry`` imports nothing of the package.

The hash is computed over a mapping module name -> source text, so each test edits a copy of the
sources in memory and never a file on disk."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from proofs_checks import REGISTRY
from proofs_checks.registry import (
    imported_closure,
    imported_modules,
    package_sources,
)

ROOT = Path(__file__).resolve().parents[1]
COMMON = "proofs_checks.propositions.common"


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return dict(package_sources())


def edited(sources: dict[str, str], module: str, old: str, new: str) -> dict[str, str]:
    text = sources[module]
    assert text.count(old) == 1, (module, old)
    return {**sources, module: text.replace(old, new)}


def test_the_hash_over_the_sources_on_disk_is_the_hash(sources) -> None:
    for pid in ("RA-1", "EB-3", "GEO-stiefel"):
        p = REGISTRY[pid]
        assert p.content_hash(sources) == p.hash
        assert re.fullmatch(r"[0-9a-f]{64}", p.hash)


def test_a_constant_in_common_changes_the_hash_of_its_users(sources) -> None:
    """RADIUS fixes RA-1's trust region; ``factorised_gradient_check`` in the same module is EB-3's
    check. Before, common.py was outside the hash and this edit left both hashes unchanged."""
    changed = edited(sources, COMMON, "RADIUS = 0.05", "RADIUS = 0.07")
    for pid in ("RA-1", "EB-3"):
        p = REGISTRY[pid]
        assert p.content_hash(changed) != p.content_hash(sources), pid
    # a proposition whose checks never import common keeps its hash
    assert REGISTRY["REF-2"].content_hash(changed) == REGISTRY["REF-2"].content_hash(sources)


def test_shared_machinery_is_covered_through_imports(sources) -> None:
    ra1 = imported_closure({c.run.__module__ for c in REGISTRY["RA-1"].checks}, sources)
    assert {
        "proofs_checks.propositions.ra1_steepest_descent",
        COMMON,
        "proofs_checks.harness",
        "proofs_checks.bounds",
        "proofs_checks.registry",
    } <= set(ra1)
    # the runner, the CLI, benchmarks and the package __init__ files are not check code
    assert not {"proofs_checks", "proofs_checks.certificate", "proofs_checks.cli"} & set(ra1)
    assert not any(m.startswith("proofs_checks.bench") for m in ra1)
    geo = imported_closure({c.run.__module__ for c in REGISTRY["GEO-stiefel"].checks}, sources)
    assert "proofs_checks.geometry_laws" in geo
    harness = edited(sources, "proofs_checks.harness", "DIGITS = (30, 60)", "DIGITS = (30, 61)")
    assert REGISTRY["RA-1"].content_hash(harness) != REGISTRY["RA-1"].hash
    assert REGISTRY["EB-6"].content_hash(harness) == REGISTRY["EB-6"].hash


def test_code_outside_the_import_closure_does_not_move_the_hash(sources) -> None:
    changed = {**sources, "proofs_checks.cli": sources["proofs_checks.cli"] + "\n# a comment\n"}
    assert REGISTRY["RA-1"].content_hash(changed) == REGISTRY["RA-1"].hash


def test_import_forms_are_resolved() -> None:
    pkg = {
        "pkg": "X = 1\n",
        "pkg.a": "",
        "pkg.sub": "",
        "pkg.sub.b": "",
        "pkg.sub.c": "",
        "pkg.sub.d": "",
        "pkg.e": "",
    }
    source = (
        "import os\n"
        "import pkg.a\n"
        "from pkg import X\n"  # a name, not a module: the package itself
        "from pkg.sub import b\n"  # a module of a package: that module only
        "from . import c\n"
        "from .. import e\n"
        "def f():\n"
        "    from .d import thing\n"  # imports in functions count too
    )
    found = imported_modules("pkg.sub.mod", source, {**pkg, "pkg.sub.mod": source})
    assert found == {"pkg", "pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.sub.d", "pkg.e"}
    chain = {"pkg.top": "from pkg import mid\n", "pkg.mid": "import pkg.low\n", "pkg.low": ""}
    assert imported_closure(["pkg.top", "elsewhere"], chain) == ["pkg.low", "pkg.mid", "pkg.top"]


def test_registry_imports_nothing_of_the_package() -> None:
    tree = ast.parse((ROOT / "proofs_checks" / "registry.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("proofs_checks")
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("proofs_checks") for a in node.names)


def test_the_implementation_hash_covers_the_code_under_test_and_only_it() -> None:
    """A comment (or a bug) in reference/optim_transforms.py changes RA-2's implementation hash and
    not its statement-and-checks hash; an edit of the checks' shared code does the reverse."""
    from proofs_checks.registry import project_sources

    sources = dict(project_sources())
    ra2 = REGISTRY["RA-2"]
    assert ra2.implementation_content_hash(sources) == ra2.implementation_hash
    optim = edited(
        sources,
        "reference.optim_transforms",
        "def scale_by_adam(",
        "# a comment\ndef scale_by_adam(",
    )
    assert ra2.implementation_content_hash(optim) != ra2.implementation_hash
    checks_only = {k: v for k, v in optim.items() if k.startswith("proofs_checks")}
    assert ra2.content_hash(checks_only) == ra2.hash
    common = edited(sources, COMMON, "RADIUS = 0.05", "RADIUS = 0.07")
    assert ra2.implementation_content_hash(common) == ra2.implementation_hash
    assert (
        REGISTRY["RA-1"].content_hash(
            {k: v for k, v in common.items() if k.startswith("proofs_checks")}
        )
        != REGISTRY["RA-1"].hash
    )
