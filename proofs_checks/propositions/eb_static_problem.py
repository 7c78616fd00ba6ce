"""The static surrogate of EB-1 and EB-2 as the checks draw it: the problem sizes, the seeded
problems (A*, C, W*), the rounding bound ``excess_tolerance``, the rank-≤r candidates that try
to beat the deficiency bound, and the ratios to tolerance each check measures."""

from __future__ import annotations

import math

import numpy as np

from proofs_checks.bounds import FLOAT64_U, gamma
from reference import capacity
from reference.linalg import frobenius, haar_orthogonal

#: float64 problem: n = 24 tokens, d = 32, d_v = 16, r* = 4 with σ(A*) = (3, 2.5, 2, 1.5)
#: (background §6 P1), C with eigenvalues uniform in [1/4, 3/4].
N, D, DV, RSTAR = 24, 32, 16, 4
SPEC = (3.0, 2.5, 2.0, 1.5)
#: mpmath problem: n = 6, d = 4, d_v = 3, r* = 3, a decaying spectrum.
MP_N, MP_D, MP_DV, MP_RSTAR = 6, 4, 3, 3
#: Eigenvalues of C are drawn in [LAMBDA_LO, LAMBDA_HI]: C ⪯ ¾I, so σ_i(A*C^{1/2}) < σ_i(A*) and
#: the negative controls (C^{1/2} dropped) are strictly wrong; κ(L) ≤ √3.
LAMBDA_LO, LAMBDA_HI = 0.25, 0.75
#: Stream tags of the seeded generators (numpy ``default_rng([seed, tag])``).
TAG_FLOAT, TAG_MP = 101, 102
PERTURB = (1e-6, 1e-3, 1e-1)
ALS_STEPS = 30
#: Property checks: 1 ≤ n ≤ PROP_N (0 ≤ r*, r ≤ n), d and d_v in PROP_DIMS, the scale of A*
#: 10^PROP_SCALE, and PROP_ALS alternating-least-squares iterates among the candidates.
PROP_N, PROP_DIMS, PROP_SCALE, PROP_ALS = 10, (1, 6), (-3, 3), 5


def static_problem(
    n: int, d: int, dv: int, rstar: int, seed: int, tag: int, spec=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A*, C, W*): A* = ``capacity.planted_mixer`` of rank r* (spectrum ``spec``, default a
    decay from 1 to ½), C = Q diag(λ) Qᵀ with Haar Q and λ uniform in [¼, ¾], W* =
    ``capacity.orthonormal(d, d_v)``; seeded by ``default_rng([seed, tag])``."""
    rng = np.random.default_rng([seed, tag])
    a_star = capacity.planted_mixer(n, rstar, rng, "decay" if spec is None else spec)
    q = haar_orthogonal(n, rng)
    c = (q * rng.uniform(LAMBDA_LO, LAMBDA_HI, n)) @ q.T
    c = 0.5 * (c + c.T)
    return a_star, c, capacity.orthonormal(d, dv, rng)


def excess_tolerance(
    n: int, m: float, kappa: float, w2: float, entries: int, u: float = FLOAT64_U
) -> float:
    """Bound on |ℰ̂(A) − ℰ(A)| + |b̂_r − b_r| for the computed excess ℰ̂ = fl(‖W‖²‖(A − A*)L‖²)
    and bound b̂_r = fl(‖W‖² Σ_{i>r} σ_i²(A*L)), where m ≥ (‖A‖_F + ‖A*‖_F)·‖L‖_F bounds the norm
    of every matrix formed, κ = κ₂(L), w2 = ‖W‖_F² and ``entries`` = d·d_v.

    (1) D = fl(A − A*) errs by ≤ u(‖A‖ + ‖A*‖) and the product DL adds γ_n‖D‖‖L‖, so
        ‖fl(DL) − DL‖ ≤ 2γ_n·m; squaring a sum of n² squares: ≤ (4γ_n + 4γ_n² + γ_{n²})·m².
    (2) fl(A*L) errs by ≤ γ_n m and the SVD is backward stable with error ≤ n·u‖A*L‖₂ ≤ γ_n m
        (taking p(n) = n), so each σ_i moves by η ≤ 2γ_n m (Weyl) and the tail sum by
        ≤ 2√n·m·η + nη² + γ_n m² = (4√n γ_n + 4nγ_n² + γ_n)·m².
    (3) For A = Â_r (the computed truncation), the formed factors lose orthogonality by ≤ n·u,
        the product U_rΣ_rV_rᵀ adds γ_r and the triangular solve by L is backward stable with a
        forward error ≤ γ_n κ: ‖Â_rL − B_r‖ ≤ ε = 6γ_n κ m, so the excess moves by ≤ 2mε + ε².
    (4) The factor ‖W‖² carries relative error γ_{entries+1}.
    Total: w2·[(1) + (2) + 2mε + ε²] + γ_{entries+1}·w2·m².
    """
    gn, gn2 = gamma(n, u), gamma(n * n, u)
    eps = 6 * gn * kappa * m
    first = (4 * gn + 4 * gn**2 + gn2) * m**2
    second = (4 * math.sqrt(n) * gn + 4 * n * gn**2 + gn) * m**2
    return w2 * (first + second + 2 * m * eps + eps**2 + gamma(entries + 1, u) * m**2)


def _ratio(excess_of: float, tol: float) -> float:
    """excess_of/tol, with 0/0 := 0 (an all-zero problem: every quantity is exactly 0)."""
    if tol > 0:
        return excess_of / tol
    return 0.0 if excess_of <= 0 else np.inf


def _scale(a: np.ndarray, a_star: np.ndarray, ell: np.ndarray) -> float:
    return (frobenius(a) + frobenius(a_star)) * frobenius(ell)


def _kappa(ell: np.ndarray) -> float:
    s = np.linalg.svd(ell, compute_uv=False)
    return float(s[0] / s[-1])


def _list(values) -> str:
    """Numbers as the certificate prints them: "3, 2.5, 2"."""
    return ", ".join(f"{v:g}" for v in values)


def _sizes(n: int, d: int, dv: int, rstar: int) -> str:
    """The "sizes" a check exercised."""
    return f"n = {n}, d = {d}, d_v = {dv}, r* = {rstar}"


def _candidate_count(als: int) -> int:
    """How many mixers ``candidates`` returns for r ≥ 1: the truncation, one per ``PERTURB``
    scale, the random mixer and ``als`` iterates."""
    return 1 + len(PERTURB) + 1 + als


def wrong_bound(a_star: np.ndarray, w: np.ndarray, r: int) -> float:
    """The negative control of EB-1: ‖W‖² Σ_{i>r} σ_i²(A*), C^{1/2} dropped."""
    return float(np.sum(w * w) * np.sum(np.square(np.linalg.svd(a_star, compute_uv=False)[r:])))


def wrong_truncation(a_star: np.ndarray, r: int) -> np.ndarray:
    """The negative control of EB-2: [A*]_r, the truncated SVD of A* itself."""
    u, s, vt = np.linalg.svd(a_star)
    return (u[:, :r] * s[:r]) @ vt[:r]


def candidates(
    a_star: np.ndarray, c: np.ndarray, r: int, rng: np.random.Generator, als: int = ALS_STEPS
):
    """Rank-≤r mixers: the truncation A_r, A_r with both factors perturbed at the scales
    ``PERTURB``, a Gaussian rank-r mixer, and every iterate of ``als`` alternating-least-squares
    steps on ‖PQᵀL − A*L‖ from a random start (an independent optimiser)."""
    n = a_star.shape[0]
    out = [capacity.truncated_mixer(a_star, r, c)]
    if r == 0:
        return out
    ell = np.linalg.cholesky(c)
    b_star = a_star @ ell
    u, s, vt = np.linalg.svd(b_star)
    p0, q0 = u[:, :r] * s[:r], vt[:r].T  # B_r = P Qᵀ
    ell_inv = np.linalg.inv(ell)
    for eps in PERTURB:
        p = p0 + eps * rng.standard_normal(p0.shape)
        q = q0 + eps * rng.standard_normal(q0.shape)
        out.append(p @ q.T @ ell_inv)
    out.append(rng.standard_normal((n, r)) @ rng.standard_normal((r, n)))
    q = rng.standard_normal((n, r))
    for _ in range(als):
        p = np.linalg.lstsq((q.T @ ell).T, b_star.T, rcond=None)[0].T  # P = B*(QᵀL)⁺
        t = np.linalg.lstsq(p, b_star, rcond=None)[0]  # QᵀL = P⁺B*
        q = (t @ ell_inv).T
        out.append(p @ q.T)
    return out


def deficiency_ratio(
    a_star: np.ndarray, c: np.ndarray, w: np.ndarray, r: int, rng, wrong: bool, als: int
) -> tuple[float, float]:
    """max over ``candidates`` of (b̂_r − ℰ̂(A))/tol (the bound's violation over its rounding
    tolerance), and the least ℰ̂/b̂ found by the candidates (1 = tight)."""
    n = a_star.shape[0]
    ell = np.linalg.cholesky(c)
    kappa, w2 = _kappa(ell), float(np.sum(w * w))
    bound = wrong_bound(a_star, w, r) if wrong else capacity.deficiency_bound(a_star, w, r, c)
    worst, tight = -np.inf, np.inf
    for a in candidates(a_star, c, r, rng, als):
        excess = capacity.static_excess_risk(a, a_star, w, c)
        tol = excess_tolerance(n, _scale(a, a_star, ell), kappa, w2, w.size)
        worst = max(worst, _ratio(bound - excess, tol))
        if bound > 0:
            tight = min(tight, excess / bound)
    return worst, tight


def positivity_ratio(a_star: np.ndarray, c: np.ndarray, w: np.ndarray, r: int, rstar: int) -> float:
    """The bound is > 0 iff r < r*: b̂_r/tol for r ≥ r* (must be ≤ 1: zero up to rounding) and
    tol/b̂_r for r < r* (≤ 1: above rounding)."""
    n = a_star.shape[0]
    ell = np.linalg.cholesky(c)
    tol = excess_tolerance(
        n, _scale(a_star, a_star, ell), _kappa(ell), float(np.sum(w * w)), w.size
    )
    b = capacity.deficiency_bound(a_star, w, r, c)
    return _ratio(b, tol) if r >= rstar else _ratio(tol, b)


def achievability_ratio(
    a_star: np.ndarray, c: np.ndarray, w: np.ndarray, r: int, wrong: bool
) -> float:
    """|ℰ̂(A_r) − b̂_r|/tol, with rank(A_r) ≤ r as σ_{r+1}(Â_r)/tol_rank, the larger of the two
    (tol_rank = (γ_r‖A*L‖_F + 2γ_nκ‖Â_r‖_F‖L‖_F)‖L^{-1}‖₂ + n·u‖Â_r‖₂: the rounding of the
    rank-r product and of the triangular solve, plus the SVD's own error)."""
    n = a_star.shape[0]
    a_r = wrong_truncation(a_star, r) if wrong else capacity.truncated_mixer(a_star, r, c)
    ell = np.linalg.cholesky(c)
    kappa, w2 = _kappa(ell), float(np.sum(w * w))
    tol = excess_tolerance(n, _scale(a_r, a_star, ell), kappa, w2, w.size)
    excess = capacity.static_excess_risk(a_r, a_star, w, c)
    ratio = _ratio(abs(excess - capacity.deficiency_bound(a_star, w, r, c)), tol)
    if r < n:
        sv = np.linalg.svd(a_r, compute_uv=False)
        inv_norm = 1.0 / np.linalg.svd(ell, compute_uv=False)[-1]
        tol_rank = (
            gamma(max(r, 1)) * frobenius(a_star @ ell)
            + 2 * gamma(n) * kappa * frobenius(a_r) * frobenius(ell)
        ) * inv_norm + n * FLOAT64_U * sv[0]
        ratio = max(ratio, _ratio(sv[r], tol_rank))
    return ratio
