"""Shared machinery of the checks: seeded problems, trajectories, precision ladders, properties."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

import reference as ref
from proofs_checks.bounds import unit_roundoff
from proofs_checks.registry import Context, Outcome
from reference.linalg import frobenius

#: Working precisions of the mpmath checks: a rounding residual falls ~30 orders between them.
DIGITS = (30, 60)


@dataclass
class FrameProblem:
    """A seeded frame W0 ∈ St(d, r) and a fixed sequence of Euclidean gradients."""

    geometry: ref.Stiefel
    w0: np.ndarray
    grads: list[np.ndarray]


def frame_problem(d: int, r: int, steps: int, seed: int, grad_rms: float = 1.0) -> FrameProblem:
    rng = np.random.default_rng(seed)
    geometry = ref.Stiefel(d, r)
    w0 = geometry.random_point(rng)
    return FrameProblem(
        geometry, w0, [grad_rms * rng.standard_normal((d, r)) for _ in range(steps)]
    )


@dataclass
class Step:
    """One step of a rule: the point it starts from, the state it starts from (``prior``), the
    tangent step ξ, and the chain state after it (before transport)."""

    w: Any
    prior: Any
    xi: Any
    state: Any


def trajectory(
    opt: ref.optim.Optimizer, geometry: Any, x0: Any, grads: Sequence[Any]
) -> tuple[list[Step], Any]:
    """Run ``opt`` along fixed gradients; returns the steps and the final point."""
    state, x, steps = opt.init(geometry, x0), x0, []
    for g in grads:
        xi, new_state = opt.update(geometry, x, g, state)
        y = opt.move(geometry, x, xi)
        steps.append(Step(x, state, xi, new_state))
        state, x = opt.transform.transport(geometry, x, y, new_state), y
    return steps, x


def max_distance(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max(frobenius(x - y) for x, y in zip(a, b, strict=True))


def cos_residual(a: np.ndarray, b: np.ndarray) -> float:
    """|1 − cos(a, b)|; two zero vectors count as aligned, one zero vector as opposite (2)."""
    na, nb = frobenius(a), frobenius(b)
    if na == 0.0 or nb == 0.0:
        return 0.0 if na == nb else 2.0
    return abs(1.0 - float(np.vdot(a / na, b / nb)))


def ladder(
    measure: Callable[[int], float],
    tolerance: Callable[[float], float],
    what: str,
    digits: Sequence[int] = DIGITS,
    exercised: Mapping[str, object] | None = None,
) -> Outcome:
    """A residual computed at several working precisions must stay under the rounding bound of
    each, tolerance(u_digits): it then falls in step with the precision (rounding), whereas a
    mathematical error stays put. Reports the residual and tolerance at the highest precision;
    what it exercised is ``exercised`` and the precisions."""
    rows, ok = [], True
    for dps in digits:
        with mpmath.workdps(dps):
            res = float(measure(dps))
        tol = tolerance(unit_roundoff(dps))
        ok &= bool(res <= tol)
        rows.append(f"{dps} digits: {res:.2e} (≤ {tol:.1e})")
    ran = {**(exercised or {}), "precisions": ", ".join(f"{d} digits" for d in digits)}
    return Outcome(ok, res, tol, f"{what}; " + ", ".join(rows), exercised=ran)


def _is_shape(v: Any) -> bool:
    """(d, r) of a frame or (n, r*, r) of the EB checks: a tuple of two or three integers."""
    return (
        isinstance(v, tuple)
        and len(v) in (2, 3)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
    )


def _shapes_text(seen: set[tuple[int, ...]]) -> str:
    """The shapes an example search measured: all of them when few, else how many and their
    range."""
    if len(seen) <= 6:
        return ", ".join(map(str, sorted(seen)))
    lo, hi = min(seen), max(seen)
    return f"{len(seen)} shapes from {lo} to {hi}"


def shapes(max_d: int = 64) -> st.SearchStrategy[tuple[int, int]]:
    """(d, r) with 1 ≤ r ≤ d ≤ max_d."""
    return st.integers(1, max_d).flatmap(lambda d: st.tuples(st.just(d), st.integers(1, d)))


#: ``substituted``'s mark of a name the object inherits rather than stores.
_INHERITED = object()


@contextlib.contextmanager
def substituted(module: object, name: str, value: object) -> Iterator[None]:
    """``module.name`` replaced by ``value`` inside the block, restored after it whatever
    happens: a negative control that puts its wrong variant into the library, so that the code
    path under test runs it (rather than a branch inside the check)."""
    old = vars(module).get(name, _INHERITED)  # as stored: a staticmethod stays one
    getattr(module, name)  # a name that does not exist is an error, not a new attribute
    setattr(module, name, value)
    try:
        yield
    finally:
        if old is _INHERITED:
            delattr(module, name)
        else:
            setattr(module, name, old)


def shape_corners(*rest: Any, max_d: int = 64) -> list[tuple]:
    """Explicit examples at the corners of 2 ≤ d ≤ ``max_d``, 1 ≤ r ≤ d: r = 1 and r = d at the
    smallest and the largest d, each followed by the fixed ``rest`` of the example's tuple
    (St(1, 1), whose tangent space is {0}, is left out: every claim is empty there)."""
    return [((d, r), *rest) for d, r in ((2, 1), (2, 2), (max_d, 1), (max_d, max_d))]


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


def property_check(
    ctx: Context,
    strategy: st.SearchStrategy,
    measure: Callable[[Any], tuple[float, float]],
    what: str,
    examples: int = 40,
    explicit: Sequence[Any] = (),
    exercised: Mapping[str, object] | None = None,
) -> Outcome:
    """Hypothesis searches ``strategy`` for an example with residual > tolerance.

    ``measure(example) -> (residual, tolerance)``. Deterministic under ``ctx.seed``; no shrinking
    (the first counterexample is reported as found). ``explicit`` examples are always tried
    first, whatever the seed: the corners of the claimed domain that a check (or its control)
    must see on every run. What it exercised: ``exercised``, the number of examples measured,
    the seed and, when an example starts with a shape, the shapes measured.
    """
    worst: dict[str, Any] = {"ratio": -1.0, "residual": 0.0, "tolerance": 0.0, "example": None}
    n = max(5, examples // 4) if ctx.quick else examples
    seen: set[tuple[int, ...]] = set()
    measured: list[Any] = []

    @hypothesis_seed(ctx.seed)
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=False,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @given(strategy)
    def prop(example: Any) -> None:
        measured.append(example)
        if isinstance(example, tuple) and example and _is_shape(example[0]):
            seen.add(example[0])
        res, tol = measure(example)
        ratio = res / tol if tol > 0 else (0.0 if res == 0 else np.inf)
        if not ratio <= worst["ratio"]:
            worst.update(ratio=ratio, residual=res, tolerance=tol, example=example)
        assert res <= tol

    for e in reversed(explicit):
        prop = example(e)(prop)
    try:
        prop()
        passed = True
    except AssertionError:
        passed = False
    verdict = "no counterexample" if passed else "counterexample"
    ran = {
        **(exercised or {}),
        "examples": f"{len(measured)} measured ({len(explicit)} explicit)",
        "seeds": f"Hypothesis seed {ctx.seed}",
    }
    if seen:
        ran["shapes"] = _shapes_text(seen)
    return Outcome(
        passed,
        float(worst["residual"]),
        float(worst["tolerance"]),
        f"{what}; {n} examples, {verdict}; worst example {worst['example']}",
        exercised=ran,
    )


def vanishes(expr: Any) -> bool:
    """True when SymPy reduces ``expr`` (a scalar or a matrix expression) to zero."""
    import sympy as sp

    e = sp.simplify(sp.expand(expr).doit())
    if isinstance(e, sp.MatrixBase):
        return all(sp.simplify(v) == 0 for v in e)
    if e == 0 or isinstance(e, sp.ZeroMatrix):
        return True
    if isinstance(e, sp.MatrixExpr):
        terms = e.args if isinstance(e, sp.MatAdd) else (e,)
        return all(sp.simplify(t.as_coeff_mmul()[0]) == 0 for t in terms)
    return False


def identities(left: Sequence[Any], symbols: str) -> Outcome:
    """Exact identities ``left`` = 0 (SymPy, ``vanishes``): residual the number left nonzero,
    tolerance 0; ``symbols`` names what is symbolic (the check's "sizes")."""
    nonzero = sum(1 for e in left if not vanishes(e))
    return Outcome(
        nonzero == 0,
        float(nonzero),
        0.0,
        f"{nonzero} of {len(left)} identities left nonzero",
        exercised={"sizes": symbols, "dtypes": "exact (SymPy)", "seeds": "none (exact)"},
    )


def gaussian_expectation(expr: Any, variables: Sequence[Any]) -> Any:
    """E[expr] for independent standard normal ``variables`` (a scalar or a SymPy matrix): expand
    into monomials and replace each z^k by its moment E[z^k] = (k − 1)!! for even k, 0 for odd
    k. Exact, since the joint moments of independent N(0, 1) factorise."""
    import sympy as sp

    if isinstance(expr, sp.MatrixBase):
        return expr.applyfunc(lambda e: gaussian_expectation(e, variables))
    poly = sp.Poly(sp.expand(expr), *variables)
    total = sp.Integer(0)
    for monom, coeff in poly.terms():
        moment = sp.Integer(1)
        for k in monom:
            moment *= 0 if k % 2 else sp.factorial2(k - 1)
        total += coeff * moment
    return sp.expand(total)
