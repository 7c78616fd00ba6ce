"""``proofs_checks.dev.mutation`` makes real mutants: each one valid Python that differs from
its file at the line it names, by the change it names (the judging itself is long and not run
here)."""

from __future__ import annotations

import ast

import pytest

from proofs_checks.dev import mutation

#: Two judged files by default (one reference, one port module); every file with ``-m slow``.
DEFAULT_FILES = ("reference/optim.py", "torch_port/optim/transforms.py")


def test_the_default_files_are_judged_files() -> None:
    """A default file that is not judged would leave the default run without a mutant."""
    assert set(DEFAULT_FILES) <= set(mutation.JUDGES)


@pytest.mark.parametrize(
    "file",
    [f if f in DEFAULT_FILES else pytest.param(f, marks=pytest.mark.slow) for f in mutation.JUDGES],
)
def test_mutants_are_valid_and_differ_from_the_source(file) -> None:
    source = ast.unparse(ast.parse((mutation.ROOT / file).read_text(encoding="utf-8")))
    found = mutation.mutants(file)
    assert len(found) >= 10
    kinds = {m.change.split(" ")[0] for m, _ in found}
    assert "constant" in kinds and len(kinds) >= 2  # operators vary by file (presets: none)
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


def test_certify_only_leaves_what_certify_let_through_to_be_read(tmp_path) -> None:
    """With the tests not run, a mutant that no proposition judges is let through (not
    called a survivor), and the copy's file is restored."""
    file = "reference/linalg.py"
    mutant, text = mutation.mutants(file)[0]
    target = tmp_path / file
    target.parent.mkdir(parents=True)
    target.write_text("original", encoding="utf-8")
    row = mutation._verdict(mutant, text, tmp_path, [], tests=False)
    assert row["verdict"] == mutation.LET_THROUGH and row["tests_exit"] is None
    assert target.read_text(encoding="utf-8") == "original"


def _key(m: mutation.Mutant) -> dict:
    return {"line": m.line, "function": m.function, "change": m.change, "col": m.col}


def test_every_mutant_of_a_file_has_its_own_key() -> None:
    found = [m for m, _ in mutation.mutants("reference/linalg.py")]
    assert len(set(found)) == len(found)


@pytest.mark.slow
def test_mutants_are_judged_by_the_propositions_that_call_their_function(tmp_path) -> None:
    """The trace, in a fresh interpreter as the tool runs it: the port's R1 projection and
    rgrad are called by PORT-5 alone, the capacity tasks by EB-4 alone, what runs while the
    certificate's modules are imported (their bodies, class bodies) is charged to both, and a
    module first imported inside one proposition's checks (the port's, inside PORT-5's) to
    that one."""
    import json
    import subprocess
    import sys

    out = tmp_path / "calls.json"
    files = ["torch_port/fixed_rank.py", "reference/capacity/tasks.py"]
    script = mutation.ROOT / "proofs_checks" / "dev" / "call_trace.py"
    env = {"PYTHONPATH": str(mutation.ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(script), str(out), *files, "--ids", "PORT-5,EB-4"],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    calls = json.loads(out.read_text(encoding="utf-8"))
    port, tasks = calls["torch_port/fixed_rank.py"], calls["reference/capacity/tasks.py"]
    assert port["proj_tangent"] == port["egrad_to_rgrad"] == ["PORT-5"]
    assert tasks["static_task"] == tasks["linear_qk_task"] == ["EB-4"]
    assert tasks["<module>"] == tasks["PlantedTask"] == ["PORT-5", "EB-4"]
    assert port["<module>"] == ["PORT-5"]  # imported inside PORT-5's checks, not before
