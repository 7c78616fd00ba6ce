"""Selective implementation hashes: a proposition's implementation hash covers the module-level
code of the modules its checks import and the functions its checks call (the call map,
``proofs_checks/call_map.json``), so an edit inside a function moves the hashes of the
propositions that call it and of no others."""

from __future__ import annotations

import json

import pytest

from proofs_checks import registry
from proofs_checks.registry import (
    REGISTRY,
    call_map,
    called_source,
    function_spans,
    imported_closure,
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


def test_function_spans_name_methods_by_their_class() -> None:
    spans = function_spans(TOY)
    assert [name for name, _, _ in spans] == ["f", "C.m", "C.p", "g"]
    lines = TOY.splitlines()
    assert [lines[first] for _, first, _ in spans][1:3] == ["    def m(self):", "    def p(self):"]
    assert lines[spans[2][1] - 1] == "    @property"  # the decorator is module-level code


def test_called_source_drops_only_functions_traced_as_called_by_others() -> None:
    callers = {"f": ["A"], "C.m": ["B"], "C.p": ["A", "B"]}
    a = called_source(TOY, callers, "A")
    assert "return x + 1" in a and "return 3" in a
    assert "return 2" not in a and "# C.m: not called by A" in a
    assert "return math.pi" in a  # listed for nobody: no trace vouches for it, so kept
    assert "LIMIT = 3" in a and "@property" in a
    b = called_source(TOY, callers, "B")
    assert "return x + 1" not in b and "return 2" in b
    assert called_source(TOY, {}, "A") == TOY


def test_the_call_map_is_current() -> None:
    """The committed map was traced on exactly these sources; otherwise every hash silently
    covers whole modules again."""
    assert call_map(), (
        "proofs_checks/call_map.json was traced on other sources: regenerate it with "
        "`python proofs_checks/call_trace.py --map --jobs 2`"
    )


def test_a_map_traced_on_other_sources_is_never_used(tmp_path, monkeypatch) -> None:
    doc = json.loads(registry.CALL_MAP.read_text(encoding="utf-8"))
    doc["traced_on"]["reference.optim"] = "0" * 64
    stale = tmp_path / "call_map.json"
    stale.write_text(json.dumps(doc), encoding="utf-8")
    monkeypatch.setattr(registry, "CALL_MAP", stale)
    registry.call_map.cache_clear()
    try:
        assert registry.call_map() == {}
    finally:
        registry.call_map.cache_clear()


def _edit_inside(sources: dict[str, str], module: str, function: str) -> dict[str, str]:
    """``sources`` with a comment added on the line after ``function``'s ``def`` line: inside
    its span (within the signature's parentheses or the body)."""
    text = sources[module]
    (first,) = [first for name, first, _ in function_spans(text) if name == function]
    lines = text.splitlines(keepends=True)
    lines.insert(first + 1, "    # an edit\n")
    return {**sources, module: "".join(lines)}


def _moved(before: dict[str, str], after: dict[str, str], calls) -> set[str]:
    def digest(p, sources):
        return p.implementation_content_hash(sources, calls)

    return {p.id for p in REGISTRY.values() if digest(p, after) != digest(p, before)}


#: (module, function, a proposition known to call it, one whose checks import the module but
#: do not call it): edits in three modules of both packages.
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
    checks import the module; a known caller among them, a known importer that does not call
    it not. Control: without the map (whole modules, as before) every importer moves."""
    sources = dict(project_sources())
    calls = call_map()
    edited = _edit_inside(sources, module, function)
    importers = {
        p.id
        for p in REGISTRY.values()
        if module in imported_closure({c.run.__module__ for c in p.checks}, sources)
    }
    moved = _moved(sources, edited, calls)
    assert moved == set(calls[module][function]) & importers
    assert caller in moved and other in importers - moved
    assert _moved(sources, edited, {}) == importers


def test_a_module_level_edit_moves_every_importer() -> None:
    sources = dict(project_sources())
    edited = {**sources, "reference.optim": sources["reference.optim"] + "\nLIMIT = 1\n"}
    importers = {
        p.id
        for p in REGISTRY.values()
        if "reference.optim" in imported_closure({c.run.__module__ for c in p.checks}, sources)
    }
    assert _moved(sources, edited, call_map()) == importers


@pytest.mark.slow
def test_the_map_is_what_a_fresh_trace_finds() -> None:
    """Two propositions traced again, in fresh interpreters, quick and full: the functions of
    three modules they call are those the map lists for them."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(registry.__file__).with_name("call_trace.py")
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
