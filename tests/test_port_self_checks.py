"""The PORT checks check themselves: every control runs the variant it puts into the port, the
absolute tolerances are the formulas of ``bounds.py``, and an edit of a port module moves the
implementation hash of exactly the propositions whose checks import it."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

from proofs_checks import REGISTRY, harness
from proofs_checks.bounds import step_error
from proofs_checks.propositions import port
from proofs_checks.registry import (
    Context,
    _guarded,
    call_map,
    imported_closure,
    project_sources,
)

CTX = Context(seed=0, quick=True)
PORT = [p for p in REGISTRY.values() if p.id.startswith("PORT-")]
PORT_CHECKS = [pytest.param(p, c, id=f"{p.id}-{i}") for p in PORT for i, c in enumerate(p.checks)]


def _counted(value: object, name: str, calls: dict[str, int]) -> object:
    """A plain function substituted into the library, wrapped to count its calls (it keeps
    being a method when put on a class); anything else (a number, a class) as it is."""
    if not callable(value) or isinstance(value, (type, staticmethod, classmethod)):
        return value

    @functools.wraps(value)
    def counting(*args, **kwargs):
        calls[name] += 1
        return value(*args, **kwargs)

    return counting


def _control_runs(check, monkeypatch) -> dict[str, int]:
    """{name substituted: times its variant was called (-1 for a value that is not a
    function)} while ``check``'s control runs."""
    calls: dict[str, int] = {}
    original = harness.substituted

    @contextlib.contextmanager
    def recording(module: object, name: str, value: object) -> Iterator[None]:
        calls.setdefault(name, 0)
        wrapped = _counted(value, name, calls)
        if wrapped is value:
            calls[name] = -1
        with original(module, name, wrapped):
            yield

    for module in list(sys.modules.values()):
        if getattr(module, "substituted", None) is original:
            monkeypatch.setattr(module, "substituted", recording)
    outcome = _guarded(check, CTX, True)
    monkeypatch.undo()
    assert not outcome.crashed, outcome.detail
    return calls


#: Checks whose control substitutes its variant in the worker processes they start, where
#: this process cannot count it: the check itself refuses a control run whose workers report
#: that the variant never ran (``test_a_worker_control_that_never_ran_is_refused``).
IN_WORKERS = {("PORT-9", "FSDP2 over two gloo processes against one process")}


@pytest.mark.parametrize(("proposition", "check"), PORT_CHECKS)
def test_every_port_control_runs_its_variant(proposition, check, monkeypatch) -> None:
    """A control that substituted nothing, or whose substituted function the port never
    called, would show nothing about the port: the variant must be put in and run."""
    if (proposition.id, check.name) in IN_WORKERS:
        pytest.skip("the variant runs in the check's worker processes (IN_WORKERS)")
    calls = _control_runs(check, monkeypatch)
    assert calls, (proposition.id, check.name, "the control substitutes nothing")
    assert all(n != 0 for n in calls.values()), (proposition.id, check.name, calls)


def test_a_control_whose_variant_is_never_called_is_caught(monkeypatch) -> None:
    """PORT-4's defaults check with a control that substitutes its variant under a name the
    port never calls: the substitution happens, and the count shows it ran nowhere."""
    check = next(c for c in REGISTRY["PORT-4"].checks if c.name == "the defaults")

    def run(ctx: Context, wrong: bool):
        if not wrong:
            return check.run(ctx, False)
        with harness.substituted(port, "_never_called_by_the_port", lambda *a: None):
            return check.run(ctx, False)

    port._never_called_by_the_port = None
    try:
        calls = _control_runs(type(check)(check.kind, check.name, run, check.control), monkeypatch)
    finally:
        del port._never_called_by_the_port
    assert calls == {"_never_called_by_the_port": 0}


def test_a_worker_control_that_never_ran_is_refused(monkeypatch) -> None:
    """The two-process check's control, with workers that report no call of the variant (as
    if the substitution had missed the port): the check raises, so the control cannot count
    as rejected; each named check exists."""
    from proofs_checks.propositions import port_gloo

    names = {(p.id, c.name) for p in PORT for c in p.checks}
    assert IN_WORKERS <= names
    monkeypatch.setattr(port_gloo, "run_workers", lambda wrong: ({}, {}, [0, 3]))
    check = next(
        c for c in REGISTRY["PORT-9"].checks if c.run is port_gloo.fsdp_against_one_process
    )
    outcome = _guarded(check, CTX, True)
    assert outcome.crashed and "variant ran [0, 3] times" in outcome.detail


#: The absolute tolerances of PORT's checks, as bounds.py writes them (a resolution check
#: reruns its sibling with the same bound; the ratio checks hold their bound inside the
#: residual and have tolerance 1, the exact ones 0).
ABSOLUTE = {
    ("PORT-3", "20 capturable steps against the reference"): 20 * step_error(16, 4),
    ("PORT-3", "resolution: capturable steps 1e-9 relative too long are caught"): (
        20 * step_error(16, 4)
    ),
    ("PORT-4", "float32 gradients whose norm overflows"): 2 * step_error(16, 4, 2.0**-24),
    ("PORT-4", "the defaults"): 4 * step_error(16, 4),
    ("PORT-4", "resolution: a default ε 1e-8 relative off is caught"): 4 * step_error(16, 4),
}


@pytest.mark.parametrize(("proposition", "check"), PORT_CHECKS)
def test_port_tolerances_are_the_bounds_formulas(proposition, check) -> None:
    tolerance = check.run(CTX, False).tolerance
    want = ABSOLUTE.get((proposition.id, check.name))
    if want is None:
        assert tolerance in (0.0, 1.0), (proposition.id, check.name, tolerance)
    else:
        assert tolerance == pytest.approx(want, rel=1e-12), (proposition.id, check.name)


#: Modules of the optimizer that no PORT proposition's checks import (their hashes cannot see
#: an edit there), with what they hold: none since PORT-10 imports ``torch_port.convert``, which
#: imports ``optim.groups``.
NOT_IN_A_PORT_PROPOSITION: dict[str, str] = {}


def test_an_edit_of_a_port_module_moves_the_hashes_of_its_users_only() -> None:
    """Every torch_port module that a PORT proposition's checks import: appending a comment
    to it changes the implementation hash of exactly the propositions whose hash covers it
    (``implementation_modules``: the import closure, parent packages, and the modules the
    call map says run for it), the import closure among them; every module of the optimizer
    but those of NOT_IN_A_PORT_PROPOSITION is in one closure."""
    sources, calls = project_sources(), call_map()
    closures = {
        p.id: set(imported_closure({c.run.__module__ for c in p.checks}, sources)) for p in PORT
    }
    covered = {p.id: set(p.implementation_modules(sources, calls)) for p in PORT}
    used = sorted({m for c in closures.values() for m in c if m.startswith("torch_port")})
    optimizer = {m for m in sources if m.startswith("torch_port.optim.")}
    assert optimizer - set(used) == set(NOT_IN_A_PORT_PROPOSITION)
    for module in used:
        edited = {**sources, module: sources[module] + "\n# an edit\n"}
        for p in PORT:
            moved = p.implementation_content_hash(edited) != p.implementation_content_hash(sources)
            assert moved == (module in covered[p.id]), (module, p.id)
            assert module not in closures[p.id] or moved, (module, p.id)
