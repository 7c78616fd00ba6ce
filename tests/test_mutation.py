"""``proofs_checks.mutation`` makes real mutants: each one valid Python that differs from its file
at the line it names, by the change it names (the judging itself is long and not run here)."""

from __future__ import annotations

import ast

import pytest

from proofs_checks import mutation


@pytest.mark.parametrize("file", list(mutation.JUDGES))
def test_mutants_are_valid_and_differ_from_the_source(file) -> None:
    source = ast.unparse(ast.parse((mutation.ROOT / file).read_text(encoding="utf-8")))
    found = mutation.mutants(file)
    assert len(found) >= 10
    kinds = {m.change.split(" ")[0] for m, _ in found}
    assert {"Add", "constant"} <= kinds
    for m, text in found[:: max(1, len(found) // 8)]:
        compile(text, file, "exec")
        assert text != source, m
        assert m.file == file and m.line >= 1 and m.function


def test_a_mutant_changes_exactly_the_node_it_names() -> None:
    text = next(t for m, t in mutation.mutants("reference/linalg.py") if m.change == "Add -> Sub")
    original = ast.unparse(ast.parse((mutation.ROOT / "reference/linalg.py").read_text()))
    changed = [
        (a, b) for a, b in zip(original.splitlines(), text.splitlines(), strict=True) if a != b
    ]
    assert len(changed) == 1 and "-" in changed[0][1]
