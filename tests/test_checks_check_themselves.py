"""The checks of ``rattn certify`` check themselves: each way a check can be weakened while still
passing is rejected here, and each rejection is shown on a deliberately weakened copy.

- **The residual comes from the implementation.** With the code under test poisoned (its entry
  points replaced by a function that raises), every non-symbolic check's honest branch must
  crash: a check that measured something else would still pass.
- **Tolerances stay rounding bounds.** A float64 tolerance that is not a normalised ratio (1),
  a documented slope or statistical criterion, is at most sqrt(ε) = 1.5e-8 (a bound that lets
  half of the digits go wrong is not a rounding bound), an mpmath one at most 1e-25.
- **Property checks range over their domain**: at least three distinct (d, r) among the
  examples of a check over shapes, and the corners r = 1 and r = d for the RA checks.
- **mpmath checks fall with the working precision**: two precisions or more, each residual
  under its own precision's bound (``harness.ladder``), the highest one at mpmath rounding.
- **Long runs keep their lengths**: the constraint runs take the steps their names state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import re
import sys
from collections.abc import Callable, Iterator

import pytest

import reference as ref
import reference.capacity as cap
from proofs_checks import REGISTRY, harness
from proofs_checks.propositions import geo
from proofs_checks.registry import Check, Context, Outcome, Proposition, _guarded
from reference import mp
from reference import optim as ro

CTX = Context(seed=0, quick=True)


def _raises(*args, **kwargs):
    raise RuntimeError("poisoned: the check called the code under test")


def _geometry_classes() -> set[type]:
    made = {type(ref.GEOMETRIES[n](6, 5, 2)) for n in ref.GEOMETRIES} | {ref.Stiefel}
    return {c for k in made for c in inspect.getmro(k) if c.__module__.startswith("reference")}


#: What each GEO law exercises (a word of its check's name -> the method it must call).
GEO_LAWS = {
    "stated thresholds": "check_point",
    "transport": "transport",
    "gradient": "egrad_to_rgrad",
    "retraction": "retract",
    "projection": "proj_tangent",
    "constraints": "retract",
    "quotient": "inner",
    "validation": "check_tangent",
    "nearest point": "project_point",
}

#: Checks whose claim is about mathematics evaluated in the check itself, not about the
#: library: RA-6's invariance L(W_QQ, W_KQ) = L and identity skew(W_QᵀG_Q + W_KᵀG_K) = 0 hold
#: for any loss f(W_Q W_Kᵀ), which the check differentiates itself (complex step).
IMPLEMENTATION_FREE = {
    ("RA-6", "invariance and skew(W_QᵀG_Q + W_KᵀG_K) = 0 for the differentiated loss"),
    ("RA-6", "gauge residual over shapes and seeds"),
}


def _targets(proposition: Proposition, check: Check) -> list[tuple[object, str]]:
    """The entry points of the code under test that ``check`` must call."""
    pid = proposition.id
    if pid.startswith(("RA-", "REF-")):
        out = [(ro.Optimizer, "step"), (ro.Optimizer, "update"), (mp, "adam_trajectory")]
        out += [(mp, "polar"), (mp, "proj")]
        if pid == "RA-3":
            out.append((ref.linalg, "polar"))
        return out
    if pid.startswith("GEO-"):
        key = next(k for k in GEO_LAWS if k in check.name)
        methods = [GEO_LAWS[key]] + (["proj"] if key == "projection" else [])
        return [(cls, m) for cls in _geometry_classes() for m in methods if hasattr(cls, m)]
    if pid.startswith("EB-"):  # the package's names and its modules' own (called as module.f)
        modules = [cap] + [m for k, m in sys.modules.items() if k.startswith("reference.capacity.")]
        return [
            (module, n)
            for module in modules
            for n in dir(module)
            if not n.startswith("_")
            and callable(getattr(module, n))
            and getattr(getattr(module, n), "__module__", "").startswith("reference.capacity")
        ]
    return []


@contextlib.contextmanager
def poisoned(targets: list[tuple[object, str]]) -> Iterator[None]:
    saved = [
        (owner, name, owner.__dict__.get(name), name in owner.__dict__) for owner, name in targets
    ]
    for owner, name in targets:
        setattr(owner, name, _raises)
    try:
        yield
    finally:
        for owner, name, old, had in reversed(saved):
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)


def _clear_caches() -> None:
    """Forget the checks' memoised measurements (EB-6, EB-8 cache their replicates), so that a
    poisoned run computes afresh."""
    for name, module in list(sys.modules.items()):
        if name.startswith("proofs_checks.propositions"):
            for obj in vars(module).values():
                if callable(getattr(obj, "cache_clear", None)):
                    obj.cache_clear()


def calls_the_implementation(proposition: Proposition, check: Check) -> bool:
    _clear_caches()
    with poisoned(_targets(proposition, check)):
        return _guarded(check, CTX, False).crashed


def _checks(keep: Callable[[Proposition, Check], bool]) -> list:
    """(proposition, check) of every registered check that ``keep`` selects, as test params."""
    return [
        pytest.param(p, c, id=f"{p.id}-{c.kind}-{i}")
        for p in REGISTRY.values()
        for i, c in enumerate(p.checks)
        if keep(p, c)
    ]


NUMERIC = _checks(
    lambda p, c: (
        not p.id.startswith("PORT-")  # PORT's substitutions: test_propositions
        and c.kind not in ("symbolic", "machine-checked")  # proofs about the mathematics
        and (p.id, c.name) not in IMPLEMENTATION_FREE
    )
)


@pytest.mark.parametrize(("proposition", "check"), NUMERIC)
def test_every_numeric_check_measures_the_code_under_test(proposition, check) -> None:
    assert _targets(proposition, check), "no entry points named for this proposition"
    assert calls_the_implementation(proposition, check), (
        f"{proposition.id} '{check.name}' passes with the code under test poisoned"
    )


def _constant_unless_wrong(check: Check) -> Check:
    """The weakened copy: only the control branch calls the code."""

    def run(ctx: Context, wrong: bool) -> Outcome:
        return check.run(ctx, True) if wrong else Outcome(True, 0.0, 1.0, "constant")

    return dataclasses.replace(check, run=run)


def test_a_check_that_does_not_call_the_code_is_caught() -> None:
    ra2 = REGISTRY["RA-2"]
    weakened = _constant_unless_wrong(ra2.checks[1])
    assert not calls_the_implementation(ra2, weakened)


def test_a_transport_law_that_never_calls_transport_is_caught() -> None:
    """The GEO transport check rewritten to reuse u at y (the control's variant) as its honest
    branch: the poisoned transport is never reached."""
    p = REGISTRY["GEO-stiefel"]
    check = next(c for c in p.checks if "transport" in c.name)
    case = geo._case("stiefel")

    def run(ctx: Context, wrong: bool) -> Outcome:
        g, x = geo._point(case, ctx)
        res, detail = geo.law.transport_law(g, x, ctx.seed, identity=True)
        return Outcome.bound(res, geo.law.law_tolerance(g, x), detail)

    assert calls_the_implementation(p, check)
    assert not calls_the_implementation(p, dataclasses.replace(check, run=run))


# -- controls substituted into the library ---------------------------------------------------------
#: Propositions every control of which puts a near miss into the library (not the same
#: measurement held to a wrong claim, such as degrees swapped or the claim made for other data).
SUBSTITUTED_CONTROLS = ("RA-7", "EB-4", "EB-5", "EB-8", "PORT-5")


def _control_substitutes(check: Check, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether ``check``'s control runs under ``harness.substituted``."""
    calls = []
    original = harness.substituted

    @contextlib.contextmanager
    def recording(module: object, name: str, value: object) -> Iterator[None]:
        calls.append(name)
        with original(module, name, value):
            yield

    for module in list(sys.modules.values()):
        if getattr(module, "substituted", None) is original:
            monkeypatch.setattr(module, "substituted", recording)
    _clear_caches()
    outcome = _guarded(check, CTX, True)
    monkeypatch.undo()
    return bool(calls) and not outcome.crashed


@pytest.mark.parametrize(
    ("proposition", "check"),
    _checks(
        lambda p, c: (
            (p.id in SUBSTITUTED_CONTROLS and c.kind != "symbolic" and not p.missing)
            or p.id == "RA-7"
            or (p.id.startswith("GEO-") and "stated thresholds" in c.name)
        )
    ),
)
def test_near_miss_controls_go_through_the_library(proposition, check, monkeypatch) -> None:
    assert _control_substitutes(check, monkeypatch), (proposition.id, check.name, check.control)


def test_a_control_that_leaves_the_library_untouched_is_caught(monkeypatch) -> None:
    """RA-7's property check with a control that measures the honest library and holds the gap
    to a wrong value: it is rejected, and the test above sees that no substitution ran."""
    from proofs_checks.propositions import ra7_degree as ra7

    check = next(c for c in REGISTRY["RA-7"].checks if c.kind == "property")

    def swapped_claim(ctx: Context, wrong: bool) -> Outcome:
        if not wrong:
            return check.run(ctx, False)
        gap = ra7.degree_gap(8, 3, ctx.seed, 1e3)[0]
        return Outcome.bound(abs(gap - 1e3), 1e-12, "the gap held to a wrong value")

    weakened = dataclasses.replace(check, run=swapped_claim)
    assert not _guarded(weakened, CTX, True).passed
    assert not _control_substitutes(weakened, monkeypatch)


# -- tolerances ------------------------------------------------------------------------------------
#: Tolerances that are not rounding bounds, by what they are: a normalised ratio, the Taylor
#: slope's 0.1, a χ² criterion (5.48 = the 1 − 10⁻⁶ quantile scale used by EB-1, EB-5, EB-7),
#: EB-6's ratio bound, the statistical checks' counts of misses or hits (``binomial``) and EB-4's
#: null-law count in standard deviations (5, ``eb_null``).
NOT_ROUNDING = {
    ("GEO-", "Taylor slope"),
    ("EB-1", "χ²"),
    ("EB-4", "χ²"),
    ("EB-5", "χ²"),
    ("EB-7", "χ²"),
    ("EB-6", "EY/κ"),
    ("EB-", "P ≥ 0.9"),
    ("EB-4", "P ≤ 0.2"),
    ("EB-4", "noise alone"),
    ("EB-4", "null law"),
}
FLOAT64_CEILING = math.sqrt(2.0**-52)
MPMATH_CEILING = 1e-25


def _tolerance_ok(proposition: Proposition, check: Check, outcome: Outcome) -> bool:
    tol = outcome.tolerance
    if tol is None or tol in (0.0, 1.0):
        return True
    if any(proposition.id.startswith(p) and w in check.name for p, w in NOT_ROUNDING):
        return True
    ceiling = MPMATH_CEILING if check.kind == "mpmath" else FLOAT64_CEILING
    return tol <= ceiling


@pytest.mark.parametrize(("proposition", "check"), NUMERIC)
def test_tolerances_are_rounding_bounds(proposition, check) -> None:
    outcome = check.run(CTX, False)
    assert _tolerance_ok(proposition, check, outcome), (proposition.id, check.name, outcome)


def test_a_tolerance_multiplied_by_a_million_is_caught() -> None:
    ra2 = REGISTRY["RA-2"]
    check = ra2.checks[1]  # float64 trajectories, tolerance trajectory_tolerance(64, 16, 6)

    def loose(ctx: Context, wrong: bool) -> Outcome:
        out = check.run(ctx, wrong)
        return dataclasses.replace(out, tolerance=1e6 * out.tolerance)

    assert _tolerance_ok(ra2, check, check.run(CTX, False))
    weakened = dataclasses.replace(check, run=loose)
    assert not _tolerance_ok(ra2, weakened, weakened.run(CTX, False))


# -- property coverage -----------------------------------------------------------------------------
def _shapes_drawn(
    check: Check, monkeypatch, replace_strategy: Callable | None = None
) -> tuple[set, set]:
    """(shapes of the examples Hypothesis generated, shapes of the explicit ones) that a
    property check measures (its module's ``property_check`` wrapped to record them)."""
    module = inspect.getmodule(check.run)
    generated: set = set()
    corners: set = set()
    real = harness.property_check

    def recording(ctx, strategy, measure, what, examples=40, explicit=(), exercised=None):
        fixed = list(explicit)

        def measured(example):
            if isinstance(example, tuple) and example and harness._is_shape(example[0]):
                (corners if example in fixed else generated).add(tuple(example[0]))
            return measure(example)

        if replace_strategy is not None:
            strategy = replace_strategy(strategy)
        return real(ctx, strategy, measured, what, examples, explicit, exercised)

    monkeypatch.setattr(module, "property_check", recording)
    check.run(CTX, False)
    return generated, corners


SHAPE_PROPERTIES = _checks(lambda p, c: c.kind == "property" and "shapes" in c.name)


@pytest.mark.parametrize(("proposition", "check"), SHAPE_PROPERTIES)
def test_property_checks_over_shapes_see_several_shapes(proposition, check, monkeypatch) -> None:
    """Three shapes or more among the generated examples (the explicit ones aside); the RA
    checks, over 1 ≤ r ≤ d ≤ 64, also see r = 1 and r = d at d = 2 and d = 64 on every seed
    (``harness.shape_corners``)."""
    generated, corners = _shapes_drawn(check, monkeypatch)
    assert len(generated) >= 3, generated
    if proposition.id.startswith("RA-"):
        assert {(2, 1), (2, 2), (64, 1), (64, 64)} <= corners | generated, corners


def test_a_property_check_shrunk_to_one_shape_is_caught(monkeypatch) -> None:
    from hypothesis import strategies as st

    check = next(c for c in REGISTRY["RA-4"].checks if c.kind == "property")

    def one_shape(strategy):
        return st.tuples(st.just((8, 3)), harness.seeds())

    generated, _ = _shapes_drawn(check, monkeypatch, one_shape)
    assert generated == {(8, 3)}  # the corners alone would not show it: they are fixed


# -- mpmath ladders --------------------------------------------------------------------------------
def _ladder_rows(detail: str) -> list[tuple[int, float]]:
    return [(int(d), float(v)) for d, v in re.findall(r"(\d+) digits: ([0-9.e+-]+)", detail)]


def _falls_with_precision(detail: str) -> bool:
    """Two precisions or more (``harness.ladder`` has held each residual under its own
    precision's bound, so a mathematical error, which stays put, fails at the higher one), and
    the residual at the highest precision is mpmath rounding, not a float64 one (≤ 1e-25)."""
    rows = _ladder_rows(detail)
    return len({d for d, _ in rows}) >= 2 and max(rows)[1] <= MPMATH_CEILING


LADDERS = _checks(lambda p, c: c.kind == "mpmath" and "precision" in c.name)


@pytest.mark.parametrize(("proposition", "check"), LADDERS)
def test_mpmath_checks_fall_with_the_working_precision(proposition, check) -> None:
    detail = check.run(CTX, False).detail
    assert _falls_with_precision(detail), detail


def test_an_mpmath_check_at_one_precision_is_caught(monkeypatch) -> None:
    check = next(c for c in REGISTRY["RA-2"].checks if c.kind == "mpmath")
    module = inspect.getmodule(check.run)
    real = harness.ladder
    monkeypatch.setattr(module, "ladder", lambda *a, **k: real(*a, digits=(60,)))
    assert not _falls_with_precision(check.run(CTX, False).detail)


# -- long runs -------------------------------------------------------------------------------------
def test_the_constraint_runs_take_the_steps_they_state(monkeypatch) -> None:
    """GEO's "constraints preserved over 1000 steps" runs 1000 steps (200 quick), as its detail
    reports; a run cut to 2 steps is caught by the same reading."""
    assert (geo.LONG_STEPS, geo.QUICK_STEPS) == (1000, 200)
    check = next(c for c in REGISTRY["GEO-stiefel"].checks if "constraints" in c.name)
    assert f"{geo.LONG_STEPS} steps" in check.name
    assert "after 200 steps" in check.run(CTX, False).detail
    monkeypatch.setattr(geo, "QUICK_STEPS", 2)
    assert "after 200 steps" not in check.run(CTX, False).detail


def test_a_direction_check_that_stops_measuring_the_step_is_caught(monkeypatch) -> None:
    """RA-1's float64 direction check weakened to measure nothing (its cosine residual made
    0 while the trajectory still runs, so the poisoning test above is still satisfied): its
    resolution check, a near miss put into ``reference.optim``, then passes its control, which
    ``test_propositions`` rejects."""
    from proofs_checks.propositions import ra1_steepest_descent as ra1
    from proofs_checks.registry import run_check

    check = next(c for c in REGISTRY["RA-1"].checks if c.run is ra1.direction_resolution)
    assert run_check(check, CTX).control_rejected
    monkeypatch.setattr(ra1, "cos_residual", lambda a, b: 0.0)
    assert not run_check(check, CTX).control_rejected
