"""The property checks of EB-1 and EB-2: Hypothesis over sizes, ranks, scales of A* and seeds."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from proofs_checks.harness import property_check, seeds
from proofs_checks.propositions.eb_static_problem import (
    PROP_ALS,
    PROP_DIMS,
    PROP_N,
    PROP_SCALE,
    TAG_FLOAT,
    _candidate_count,
    achievability_ratio,
    deficiency_ratio,
    positivity_ratio,
    static_problem,
)
from proofs_checks.registry import Context, Outcome


def property_deficiency(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ n ≤ 10, 0 ≤ r* ≤ n, 0 ≤ r ≤ n, 1 ≤ d, d_v ≤ 6, scale 10^[-3, 3] of A*
    and seeds: at the drawn r and at r* − 1 (so every example with r* ≥ 2 tests a deficient
    rank), every candidate (5 ALS iterates) satisfies ℰ̂ ≥ b̂_r − tol and b̂_r > tol iff r < r*;
    residual violation/tolerance ≤ 1."""

    def measure(example) -> tuple[float, float]:
        (n, rstar, r), (d, dv), scale_exp, seed = example
        a_star, c, w = static_problem(n, d, dv, rstar, seed, TAG_FLOAT)
        a_star = a_star * 10.0**scale_exp
        rng = np.random.default_rng([seed, 1])
        worst = 0.0
        for rank in sorted({r, max(rstar - 1, 0)}):
            ratio, _ = deficiency_ratio(a_star, c, w, rank, rng, wrong, PROP_ALS)
            worst = max(worst, ratio, positivity_ratio(a_star, c, w, rank, rstar))
        return worst, 1.0

    exercised = {
        "sizes": _property_sizes(),
        "options": (
            f"scale of A* 10^[{PROP_SCALE[0]}, {PROP_SCALE[1]}]; at r and r* − 1; "
            f"{_candidate_count(PROP_ALS)} candidates per rank ({PROP_ALS} ALS iterates)"
        ),
        "dtypes": "float64",
    }
    what = "violation/tolerance of ℰ ≥ b_r and b_r > 0"
    return property_check(ctx, _property_strategy(), measure, what, exercised=exercised)


def _ranks(max_n: int = PROP_N):
    """(n, r*, r) with 0 ≤ r*, r ≤ n."""
    return st.integers(1, max_n).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(0, n))
    )


def _property_strategy():
    """((n, r*, r), (d, d_v), scale exponent, seed) of the property checks of EB-1 and EB-2."""
    dims = st.integers(*PROP_DIMS)
    return st.tuples(_ranks(), st.tuples(dims, dims), st.floats(*PROP_SCALE), seeds())


def _property_sizes() -> str:
    """The domain the property checks search (the shapes measured are reported beside it)."""
    lo, hi = PROP_DIMS
    return f"1 ≤ n ≤ {PROP_N}, 0 ≤ r*, r ≤ n, {lo} ≤ d, d_v ≤ {hi}"


def property_achievability(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ n ≤ 10, 0 ≤ r* ≤ n, 1 ≤ d, d_v ≤ 6, scale 10^[-3, 3] and seeds, at
    every r = 0…n: |ℰ̂(A_r) − b̂_r| and σ_{r+1}(A_r) within their rounding tolerances."""

    def measure(example) -> tuple[float, float]:
        (n, rstar, _), (d, dv), scale_exp, seed = example
        a_star, c, w = static_problem(n, d, dv, rstar, seed, TAG_FLOAT)
        a_star = a_star * 10.0**scale_exp
        return max(achievability_ratio(a_star, c, w, r, wrong) for r in range(n + 1)), 1.0

    exercised = {
        "sizes": _property_sizes(),
        "options": f"scale of A* 10^[{PROP_SCALE[0]}, {PROP_SCALE[1]}]; every r = 0…n",
        "dtypes": "float64",
    }
    what = "|ℰ(A_r) − b_r|/tol and rank of A_r"
    return property_check(ctx, _property_strategy(), measure, what, exercised=exercised)
