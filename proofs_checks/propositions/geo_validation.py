"""GEO's validation check: ``check_point`` and the constructor refuse exactly beyond the stated
thresholds; its control moves each threshold by ±0.5% in the reference's modules."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases
from proofs_checks.harness import substituted
from proofs_checks.registry import Context, Outcome

#: How far the validation control moves a threshold: ±0.5%, far outside the cases' 1e-6
#: margins (``geometry_cases.MARGIN``).
NEAR_MISS = 0.005


def _near_misses(name: str) -> list[tuple[str, Callable[[], contextlib.AbstractContextManager]]]:
    """(label, context) of each near miss of the reference's thresholds that ``name``'s cases
    test, each moved by +0.5% and by −0.5%: atol (``DEFAULT_ATOL``, substituted into
    ``reference.stiefel``, ``reference.fixed_rank`` and ``reference.partial_isometry``, each of
    which reads its own name), R1's rank test (``reference.fixed_rank.RANK_EPS``) and R2's
    limit (``reference.fixed_rank.CONDITION_LIMIT``)."""

    def atol(factor: float) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        for module in (ref.stiefel, ref.fixed_rank, ref.partial_isometry):
            stack.enter_context(substituted(module, "DEFAULT_ATOL", factor * cases.ATOL))
        return stack

    out = []
    for f in (1 + NEAR_MISS, 1 - NEAR_MISS):
        if name == "stiefel" or cases.ORTHONORMAL[name]:
            out.append((f"atol × {f}", lambda f=f: atol(f)))
        if name == "fixed_rank_embedded":
            out.append(
                (
                    f"R1 rank × {f}",
                    lambda f=f: substituted(ref.fixed_rank, "RANK_EPS", f * cases.EPS),
                )
            )
        if name == "fixed_rank_quotient":
            limit = f * cases.CONDITION_LIMIT
            out.append(
                (
                    f"R2 limit × {f}",
                    lambda v=limit: substituted(ref.fixed_rank, "CONDITION_LIMIT", v),
                )
            )
    return out


def check_validation(name: str) -> Callable[[Context, bool], Outcome]:
    make = ref.Stiefel if name == "stiefel" else ref.GEOMETRIES[name]

    def threshold_decisions(ctx: Context) -> tuple[list[str], dict[str, object]]:
        """The labels of the wrong decisions, and what was exercised."""
        geo = make(*(cases.STIEFEL if name == "stiefel" else cases.SIZES))
        rng = np.random.default_rng([ctx.seed, 7])
        x = geo.random_point(rng)
        validity = cases.validity_cases(name, x, rng)
        if name in cases.TANGENT_CHECKED:
            validity += cases.tangent_cases(name, geo, x, rng)
        exercised = {
            "instances": repr(geo),
            "cases": f"{len(validity)} at the thresholds, {len(cases.size_cases(name))} sizes",
            "seeds": ctx.seed,
            "dtypes": "float64",
        }
        return [c.label for c in validity if c.refused_by(geo) != c.refused], exercised

    def run(ctx: Context, wrong: bool) -> Outcome:
        """``check_point`` refuses exactly beyond the stated thresholds, decided at the
        thresholds themselves, and the constructor exactly outside 1 ≤ r ≤ min(m, n): every
        case of ``geometry_cases.validity_cases`` (a factor at 1 ∓ 1e-6 × atol, R1's core at
        1 ∓ 1e-6 × its rank tolerance r·ε, R2's conditioning at 1 ∓ 1e-6 × 1e-8; St(d, r),
        P1, P2, P3: ``check_tangent`` at 1 ∓ 1e-6 × atol·max(1, ‖ξ‖), ``tangent_cases``; each
        case's quantity exact to 2e-7 and the validators' rounding ≤ 1.6e-7 of a threshold)
        and of ``size_cases``. Residual: the number of wrong decisions, tolerance 0. Control,
        near misses (``_near_misses``): each threshold these cases test moved by +0.5% and by
        −0.5% in turn, substituted into the reference's modules; the control's residual is the
        fewest wrong decisions any near miss caused (rejected only if every one is caught)."""
        if wrong:
            caught = {}
            for label, moved in _near_misses(name):
                with moved():
                    caught[label] = len(threshold_decisions(ctx)[0])
            least = min(caught.values())
            return Outcome(
                least == 0, float(least), 0.0, f"wrong decisions per near miss: {caught}"
            )
        wrong_calls, exercised = threshold_decisions(ctx)
        wrong_calls += [
            f"sizes {sizes}"
            for sizes, refused in cases.size_cases(name)
            if cases.refuses(make, *sizes) != refused
        ]
        return Outcome.bound(
            float(len(wrong_calls)), 0.0, f"wrong decisions: {wrong_calls or 'none'}", exercised
        )

    return run
