"""Selective implementation hashes: a proposition's implementation hash covers the module-level
code of the modules that run for it and the bodies of the functions its checks call (the call
map, ``proofs_checks/call_map.json``), so an edit inside a function moves the hashes of the
propositions that call it and of no others."""

from __future__ import annotations

import json

import pytest

from proofs_checks import registry
from proofs_checks.registry import (
    REGISTRY,
    call_map,
    called_source,
    function_bodies,
    project_sources,
)

TOY = """\
import math

LIMIT = 3


def f(x):
    return x + 1


class C:
    def m(self):
        return 2

    @property
    def p(self):
        return 3


def g():
    return math.pi
"""


def test_function_bodies_name_methods_by_their_class_and_keep_signatures() -> None:
    bodies = function_bodies(TOY)
    assert [name for name, _, _ in bodies] == ["f", "C.m", "C.p", "g"]
    lines = TOY.splitlines()
    assert [lines[first].strip() for _, first, _ in bodies] == [
        "return x + 1",
        "return 2",
        "return 3",
        "return math.pi",
    ]
    one_line = "def h(): return 1\n\n\ndef k():\n    return 2\n"
    assert [name for name, _, _ in function_bodies(one_line)] == ["k"]  # h kept whole


def test_called_source_drops_only_bodies_traced_as_called_by_others() -> None:
    callers = {"f": ["A"], "C.m": ["B"], "C.p": ["A", "B"], "g": []}
    a = called_source(TOY, callers, "A")
    assert "return x + 1" in a and "return 3" in a
    assert "return 2" not in a and "# C.m: body not called by A" in a
    assert "def m(self):" in a  # signatures (and their defaults) run at import: kept
    assert "return math.pi" in a  # listed for nobody: no trace vouches for it, so kept
    assert "LIMIT = 3" in a and "@property" in a
    b = called_source(TOY, callers, "B")
    assert "return x + 1" not in b and "return 2" in b
    assert called_source(TOY, {}, "A") == TOY


def test_lines_are_counted_as_python_counts_them() -> None:
    """A form feed is no line end for Python: the body dropped is still the right one."""
    text = "# page\x0c\x0c break\n" + TOY
    a = called_source(text, {"f": ["B"]}, "A")
    assert "return x + 1" not in a and "return 2" in a and "def f(x):" in a


def test_the_call_map_is_current() -> None:
    """The committed map was traced on exactly these sources; otherwise every hash silently
    covers whole modules again."""
    assert call_map(), (
        "proofs_checks/call_map.json was traced on other sources: regenerate it with "
        "`python proofs_checks/dev/call_trace.py --map --jobs 2`"
    )


def test_a_map_traced_on_other_sources_is_never_used(tmp_path, monkeypatch) -> None:
    doc = json.loads(registry.CALL_MAP.read_text(encoding="utf-8"))
    doc["traced_on"]["reference.optim"] = "0" * 64
    stale = tmp_path / "call_map.json"
    stale.write_text(json.dumps(doc), encoding="utf-8")
    monkeypatch.setattr(registry, "CALL_MAP", stale)
    assert registry.call_map() == {}  # read again: the map's path is part of what it depends on


def _edit_inside(sources: dict[str, str], module: str, function: str) -> dict[str, str]:
    """``sources`` with a comment added after the first line of ``function``'s body (a comment
    before its first statement would be module-level text)."""
    text = sources[module]
    (first,) = [first for name, first, _ in function_bodies(text) if name == function]
    lines = text.splitlines(keepends=True)
    lines.insert(first + 1, "    # an edit\n")  # after the body's first line: inside it
    return {**sources, module: "".join(lines)}


def _moved(before: dict[str, str], after: dict[str, str], calls) -> set[str]:
    def digest(p, sources):
        return p.implementation_content_hash(sources, calls)

    return {p.id for p in REGISTRY.values() if digest(p, after) != digest(p, before)}


def _covering(module: str, sources: dict[str, str], calls) -> set[str]:
    return {p.id for p in REGISTRY.values() if module in p.implementation_modules(sources, calls)}


#: (module, function, a proposition known to call it, one whose hash covers the module but
#: whose checks do not call it): edits in three modules of both packages.
EDITS = [
    ("reference.optim", "riemannian_adam", "RA-2", "PORT-1"),
    ("reference.linalg", "polar", "RA-3", "EB-1"),
    ("torch_port.stiefel", "StiefelFrames.retract_scaled", "PORT-1", "PORT-10"),
]


@pytest.mark.parametrize(("module", "function", "caller", "other"), EDITS)
def test_an_edit_inside_a_function_moves_the_hashes_of_its_callers_only(
    module: str, function: str, caller: str, other: str
) -> None:
    """Moved: exactly the propositions that the map lists for the function, among those whose
    hash covers the module; a known caller among them, a known other not. Control: without a
    map (none traced on these sources), every proposition moves."""
    sources = dict(project_sources())
    calls = call_map()
    edited = _edit_inside(sources, module, function)
    covering = _covering(module, sources, calls)
    moved = _moved(sources, edited, calls)
    assert moved == set(calls[module][function]) & covering
    assert caller in moved and other in covering - moved
    assert _moved(sources, edited, {}) == set(REGISTRY)


def test_the_modules_that_run_are_covered_though_no_check_imports_them() -> None:
    """``torch_port/__init__.py`` runs for PORT-5 (it imports the port's package) and
    ``reference.environment`` for every proposition (the certificate records it): both are
    covered, so a patch put there moves the hashes."""
    sources, calls = dict(project_sources()), call_map()
    assert "torch_port" in REGISTRY["PORT-5"].implementation_modules(sources, calls)
    assert all(
        "reference.environment" in p.implementation_modules(sources, calls)
        for p in REGISTRY.values()
    )


def test_a_module_level_edit_moves_every_proposition_it_runs_for() -> None:
    sources, calls = dict(project_sources()), call_map()
    edited = {**sources, "reference.optim": sources["reference.optim"] + "\nLIMIT = 1\n"}
    assert _moved(sources, edited, calls) == _covering("reference.optim", sources, calls)


@pytest.mark.slow
def test_the_map_is_what_a_fresh_trace_finds() -> None:
    """Two propositions traced again, in fresh interpreters, quick and full: the functions of
    three modules they call are those the map lists for them."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(registry.__file__).parent / "dev" / "call_trace.py"
    spec = importlib.util.spec_from_file_location("call_trace", path)
    call_trace = importlib.util.module_from_spec(spec)
    sys.modules["call_trace"] = call_trace
    spec.loader.exec_module(call_trace)
    ids = ["RA-2", "PORT-1"]
    files = ["reference/optim.py", "reference/linalg.py", "torch_port/stiefel.py"]
    fresh = call_trace.trace(files, ids, qualified=True, full=True, jobs=2)
    calls = call_map()
    for f in files:
        module = f.removesuffix(".py").replace("/", ".")
        listed = {q: set(who) & set(ids) for q, who in calls.get(module, {}).items()}
        found = {q: set(who) for q, who in fresh[f].items()}
        assert {q: w for q, w in listed.items() if w} == found, module
