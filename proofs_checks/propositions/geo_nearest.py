"""GEO-stiefel's nearest-point check: the polar factor on stacks, at scalings 2^±600, and its
rank test decided on exact Grams."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases
from proofs_checks.bounds import frame_error
from proofs_checks.harness import substituted
from proofs_checks.propositions.geo_variants import STIEFEL
from proofs_checks.registry import Context, Outcome
from reference.linalg import frobenius

#: The scalings of the nearest-point check: exact powers of two, far from 1 both ways.
SCALES = (2.0**-600, 2.0**600)


def _rank_test_matrix(sigma_sq: float) -> np.ndarray:
    """A 7×3 matrix with max entry 1 and the exactly diagonal Gram diag(2, 1, σ²) (columns
    e_1 + e_4, e_2, σ·e_3; σ a power of two): its Gram and eigenvalues are computed exactly, so
    the rank test sees λ_min/λ_max = σ²/2 with no rounding."""
    a = np.zeros(STIEFEL)
    a[0, 0] = a[3, 0] = a[1, 1] = 1.0
    a[2, 2] = np.sqrt(sigma_sq)
    return a


def stiefel_nearest_point(ctx: Context, wrong: bool) -> Outcome:
    """``project_point`` (the polar factor) of St(7, 3), on what its docstring claims:

    - a stack of three matrices (W + 0.3·Gaussian, κ about 2 to 3) is factored slice by
      slice: each slice within 2κ·``frame_error``(7, 3, κ) of the SVD route's U Vᵀ of that
      slice (each route's forward error is at most κ × its orthonormality bound: the inverse
      square root of a Gram of condition κ² amplifies the Gram's relative error by ≤ κ²/2 and
      A adds κ);
    - polar(sA) = polar(A) bit for bit for s = 2^±600 (A is divided by its largest entry, an
      exact operation for a power-of-two s, before the Gram is formed, which would overflow or
      underflow otherwise);
    - the rank test refuses λ_min ≤ ε·λ_max·d and accepts above it: on exact Grams (see
      ``_rank_test_matrix``) with λ_max = 2, d = 7, σ² = 2^-49 (below 2·7ε = 3.1e-15) is
      refused and σ² = 2^-47 (7.1e-15) accepted.

    Residual: the worst stack deviation relative to its bound, plus the number of inexact
    scalings and wrong rank decisions, tolerance 1. Control: the polar factor without its
    prescaling (substituted into ``reference.linalg``)."""
    geo = ref.Stiefel(*STIEFEL)
    rng = np.random.default_rng([ctx.seed, 6])
    stack = np.stack([geo.random_point(rng) + 0.3 * rng.standard_normal(STIEFEL) for _ in range(3)])
    kappas = [float(np.linalg.cond(a)) for a in stack]
    original = ref.linalg.polar

    def unscaled(a):
        lam, q = np.linalg.eigh(ref.linalg.sym(ref.linalg.transpose(a) @ a))
        if np.any(lam[..., 0] <= np.finfo(np.float64).eps * lam[..., -1] * a.shape[-2]):
            raise ValueError("polar factor of a rank-deficient matrix")
        return a @ ((q / np.sqrt(lam)[..., None, :]) @ ref.linalg.transpose(q))

    with substituted(ref.linalg, "polar", unscaled) if wrong else contextlib.nullcontext():
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            stacked = geo.project_point(stack)
            worst = max(
                frobenius(q - ref.linalg.polar_svd(a)) / (2 * k * frame_error(*STIEFEL, kappa=k))
                for q, a, k in zip(stacked, stack, kappas, strict=True)
            )
            a = stack[0]
            inexact = sum(
                not np.array_equal(_or_nan(geo.project_point, s * a), original(a)) for s in SCALES
            )
        decisions = sum(
            cases.refuses(geo.project_point, _rank_test_matrix(sigma_sq)) != refuse
            for sigma_sq, refuse in ((2.0**-49, True), (2.0**-47, False))
        )
    return Outcome.bound(
        float(worst + inexact + decisions),
        1.0,
        f"stack: {worst:.2e} of its bound (κ ≤ {max(kappas):.2f}); inexact scalings "
        f"{inexact} of {len(SCALES)}; wrong rank decisions {decisions} of 2",
        {
            "instances": repr(geo),
            "points": "a stack of 3 random matrices, 2 scalings, 2 exact Grams",
            "seeds": ctx.seed,
            "dtypes": "float64",
        },
    )


def _or_nan(fn: Callable, a: np.ndarray) -> np.ndarray:
    try:
        return fn(a)
    except ValueError:
        return np.full_like(a, np.nan)
