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
    assert {"constant"} <= kinds and kinds & {"Add", "Sub"}
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


def test_a_rejudge_takes_what_certify_let_through() -> None:
    file = "reference/linalg.py"
    found = mutation.mutants(file)
    row = {"file": file, "certify_exit": 0}
    earlier = [
        {**row, **_key(found[0][0]), "verdict": "killed by certify"},
        {**row, **_key(found[1][0]), "verdict": "killed by the tests"},
        {**row, **_key(found[2][0]), "verdict": "survived"},
    ]
    again = {m for m, _ in mutation.to_rejudge([file], earlier)}
    assert found[0][0] not in again and {found[1][0], found[2][0]} <= again


def _key(m: mutation.Mutant) -> dict:
    return {"line": m.line, "function": m.function, "change": m.change, "col": m.col}


def test_every_mutant_of_a_file_has_its_own_key() -> None:
    found = [m for m, _ in mutation.mutants("reference/linalg.py")]
    assert len(set(found)) == len(found)
