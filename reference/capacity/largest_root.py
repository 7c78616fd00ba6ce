"""The null law of the token-Gram count: the largest root of a Wishart over the mean of the rest.

For W ~ Wishart_p(N, σ²I) with eigenvalues λ₁ ≥ … ≥ λ_p, the statistic

    T = λ₁ / mean(λ₂, …, λ_p)

does not depend on σ². ``largest_root_quantile(p, N, q)`` is its q-quantile, drawn exactly (no
asymptotics) from the β = 1 Laguerre ensemble of Dumitriu & Edelman (2002): the eigenvalues of W
are those of BBᵀ, B lower bidiagonal with independent entries

    B_ii ~ χ_{N−i},  B_{i+1,i} ~ χ_{p−1−i}   (i = 0, 1, …),

so a draw costs O(p) variates and one symmetric tridiagonal eigenproblem, of which only λ₁ and
the trace (Σ of B's squared entries) are needed. λ₁ is found by Sturm-count bisection on all the
draws at once. Monte Carlo error: with m draws the true level of the estimated q-quantile has
standard deviation √(q(1 − q)/m) (0.001 at q = 0.99, m = 10,000); the draws come from a fixed
generator, so the quantile is a deterministic function of (p, N, q, m).
"""

from __future__ import annotations

import functools

import numpy as np

from reference.capacity.validation import Array

#: Draws behind each quantile (level error √(q(1 − q)/m): 0.001 at q = 0.99).
DRAWS = 10_000
#: Bisection halvings of λ₁'s Gershgorin interval: relative error 2^-40 of the interval.
HALVINGS = 40
#: Entries of the draws × p arrays made at once (32 MB each; the peak is about six of them).
BLOCK = 2**22


def laguerre_tridiagonal(p: int, dof: int, draws: int, rng: np.random.Generator) -> tuple:
    """(diagonal, squared off-diagonal) of BBᵀ for ``draws`` Laguerre draws (module docstring):
    diag_i = a_i² + b_{i−1}², off_i² = a_i²·b_i² with a_i² ~ χ²_{N−i}, b_i² ~ χ²_{p−1−i}."""
    a2 = rng.chisquare(dof - np.arange(p), size=(draws, p))
    b2 = rng.chisquare(p - 1 - np.arange(p - 1), size=(draws, p - 1))
    diagonal = a2 + np.pad(b2, ((0, 0), (1, 0)))
    return diagonal, a2[:, :-1] * b2


def tridiagonal_largest(diagonal: Array, off2: Array) -> Array:
    """λ₁ of each symmetric tridiagonal matrix (rows of ``diagonal``, squared off-diagonals
    ``off2``) by bisection on the Sturm count: the number of eigenvalues below x is the number of
    negative pivots of T − xI, q₀ = d₀ − x, q_i = d_i − x − e²_{i−1}/q_{i−1}, a pivot with
    |q| ≤ pivmin replaced by −pivmin before it is counted (as LAPACK's dstebz does). Start:
    [0, Gershgorin bound] (BBᵀ is PSD)."""
    p = diagonal.shape[1]
    off = np.sqrt(off2)
    radius = np.pad(off, ((0, 0), (0, 1))) + np.pad(off, ((0, 0), (1, 0)))
    high = np.max(diagonal + radius, axis=1)
    low = np.zeros_like(high)
    pivmin = np.finfo(float).tiny / np.finfo(float).eps * np.maximum(high, 1.0)
    for _ in range(HALVINGS):
        mid = 0.5 * (low + high)
        pivot = _away_from_zero(diagonal[:, 0] - mid, pivmin)
        below = (pivot < 0).astype(np.int64)
        for i in range(1, p):
            pivot = _away_from_zero(diagonal[:, i] - mid - off2[:, i - 1] / pivot, pivmin)
            below += pivot < 0
        top_above = below < p  # some eigenvalue is ≥ mid, so λ₁ ≥ mid
        low = np.where(top_above, mid, low)
        high = np.where(top_above, high, mid)
    return 0.5 * (low + high)


def _away_from_zero(pivot: Array, pivmin: Array) -> Array:
    return np.where(np.abs(pivot) <= pivmin, -pivmin, pivot)


@functools.lru_cache(maxsize=1024)
def largest_root_quantile(p: int, dof: int, quantile: float = 0.99, draws: int = DRAWS) -> float:
    """The ``quantile`` of T = λ₁/mean(λ₂, …, λ_p) for W ~ Wishart_p(``dof``, I) (module
    docstring), from ``draws`` Laguerre draws made in blocks of at most ``BLOCK`` entries
    (memory O(BLOCK), not O(draws·p)): block 0 from default_rng([p, dof, draws]), block c > 0
    from default_rng([p, dof, draws, c]), so that up to BLOCK/p draws are one block. Needs
    p ≥ 2 and dof ≥ p (a Wishart of full rank)."""
    if p < 2 or dof < p:
        raise ValueError(f"needs p ≥ 2 and dof ≥ p, got p = {p}, dof = {dof}")
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must lie in (0, 1), got {quantile}")
    if draws < 1:
        raise ValueError(f"draws must be ≥ 1, got {draws}")
    per = max(1, BLOCK // p)
    ratios = []
    for c, start in enumerate(range(0, draws, per)):
        rng = np.random.default_rng([p, dof, draws, c][: 4 if c else 3])
        diagonal, off2 = laguerre_tridiagonal(p, dof, min(per, draws - start), rng)
        top = tridiagonal_largest(diagonal, off2)
        ratios.append(top / ((diagonal.sum(axis=1) - top) / (p - 1)))
    return float(np.quantile(np.concatenate(ratios), quantile))
