"""EB-4 (a)'s null law: the quantile that calibrates the token-Gram count, against dense draws.

``token_gram_count`` counts λ_{k+1} when λ_{k+1}/mean(λ_{k+2}, …) exceeds
``largest_root_quantile(n − k, N − k, 0.99)``, the 0.99-quantile of T = λ₁/mean(λ₂, …, λ_p) for a
Wishart_p(N, I), drawn from the Laguerre ensemble (``reference.capacity.largest_root``). This
check draws the same T from dense Gaussian matrices instead (W = ZZᵀ, Z ∈ ℝ^{p×N} iid N(0, 1),
eigenvalues by LAPACK) and counts how often it exceeds the library's quantile c.

Criterion. With M dense draws the count E is Binomial(M, α_c), α_c = P(T > c), and α_c itself
is the level of a quantile estimated from m = 10,000 Laguerre draws: mean 1 − q, variance
q(1 − q)/m. So E has mean M(1 − q) and variance M·q(1 − q) + M²·q(1 − q)/m (the second term: the
quantile's own error, scaled to the count). Pass when |E − M(1 − q)| ≤ 5 standard deviations
(exactly, with E binomial and α_c Beta-distributed, a false rejection has probability about
1e-5 per size). At M = 5,000 and q = 0.99: mean 50, standard deviation 8.6, so 7 ≤ E ≤ 93.

Power: large sizes hide an error of the Laguerre parametrisation (its effect shrinks as N/p
grows), so the check includes (4, 4), where the matrix is square. There the sub-diagonal drawn as
χ_{p−i} instead of χ_{p−1−i} puts 101 of 5,000 dense draws above its quantile (5.9 standard
deviations, seed 0), where at (16, 1,600) it puts 35 (1.7).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from proofs_checks.harness import substituted
from proofs_checks.registry import Context, Outcome
from reference.capacity import largest_root

#: The null laws read by EB-4 (a)'s count at its sizes (n = 16, N = S·d_v = 1,600): the first
#: test (k = 0) and the one after three directions counted (k = 3); and a square one (N = p),
#: where the law is farthest from its large-N limit.
SIZES = ((16, 1600), (13, 1597), (4, 4))
QUANTILE, DENSE_DRAWS, SIGMAS, TAG = 0.99, 5_000, 5.0, 406
CONTROL = (
    "the off-diagonal of the Laguerre matrix BBᵀ dropped (the eigenvalues taken as its "
    "independent diagonal χ² entries: no repulsion), substituted into "
    "reference.capacity.largest_root"
)


_LAGUERRE = largest_root.laguerre_tridiagonal
#: Dense draws per batch (a batch of Z holds CHUNK·p·N floats: 100 MB at (16, 1600)).
CHUNK = 500


def _no_repulsion(p: int, dof: int, draws: int, rng: np.random.Generator) -> tuple:
    diagonal, off2 = _LAGUERRE(p, dof, draws, rng)
    return diagonal, np.zeros_like(off2)


def dense_statistic(p: int, dof: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """T = λ₁/mean(λ₂, …, λ_p) of ``draws`` dense Wishart_p(dof, I) matrices."""
    parts = []
    for start in range(0, draws, CHUNK):
        z = rng.standard_normal((min(CHUNK, draws - start), p, dof))
        lam = np.linalg.eigvalsh(z @ np.swapaxes(z, 1, 2))
        parts.append(lam[:, -1] / np.mean(lam[:, :-1], axis=1))
    return np.concatenate(parts)


def spread(q: float, dense: int, laguerre: int) -> float:
    """The standard deviation of the exceedance count (module docstring)."""
    return math.sqrt(dense * q * (1 - q) + dense**2 * q * (1 - q) / laguerre)


def null_law(ctx: Context, wrong: bool) -> Outcome:
    """At each (p, N) of ``SIZES``: c = ``largest_root_quantile(p, N, 0.99)`` computed afresh
    (its cache cleared before and after, so that a substitution takes effect and does not
    linger), then E = #{T > c} over 5,000 dense draws of default_rng([seed, 406, p]). Residual:
    the largest |E − 50| in standard deviations (8.6, module docstring); tolerance 5.
    Control: the Laguerre matrix's off-diagonal dropped, substituted into
    ``reference.capacity.largest_root``."""
    sd = spread(QUANTILE, DENSE_DRAWS, largest_root.DRAWS)
    expected = DENSE_DRAWS * (1 - QUANTILE)
    counts = {}
    largest_root.largest_root_quantile.cache_clear()
    try:
        with (
            substituted(largest_root, "laguerre_tridiagonal", _no_repulsion)
            if wrong
            else contextlib.nullcontext()
        ):
            quantiles = {
                size: largest_root.largest_root_quantile(*size, QUANTILE) for size in SIZES
            }
    finally:
        largest_root.largest_root_quantile.cache_clear()
    for (p, dof), c in quantiles.items():
        rng = np.random.default_rng([ctx.seed, TAG, p])
        counts[(p, dof)] = int(np.sum(dense_statistic(p, dof, DENSE_DRAWS, rng) > c))
    worst = max(abs(e - expected) / sd for e in counts.values())
    listed = "; ".join(
        f"(p, N) = ({p}, {dof}): c = {quantiles[(p, dof)]:.4f}, {e} of {DENSE_DRAWS} above"
        for (p, dof), e in counts.items()
    )
    return Outcome.bound(
        worst,
        SIGMAS,
        f"{listed} (expected {expected:.0f} ± {sd:.1f})",
        {
            "sizes": ", ".join(f"Wishart_{p}({dof})" for p, dof in SIZES),
            "samples": f"{DENSE_DRAWS} dense draws each; quantiles from {largest_root.DRAWS} "
            "Laguerre draws",
            "dtypes": "float64",
            "seeds": f"default_rng([{ctx.seed}, {TAG}, p])",
        },
    )
