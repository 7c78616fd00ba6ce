"""Rounding-error bounds that the float64 and mpmath tolerances are derived from.

Notation (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1–3.5): u is the
unit roundoff (2^-53 in float64), γ_k = k·u/(1 − k·u). A dot product of length k has absolute
error ≤ γ_k Σ|a_i b_i|, so ‖fl(AB) − AB‖_F ≤ γ_k ‖A‖_F ‖B‖_F for an inner dimension k.
"""

from __future__ import annotations

import mpmath
import numpy as np

FLOAT64_U = float(np.finfo(np.float64).eps) / 2


def unit_roundoff(digits: int | None = None) -> float:
    """u for float64 (digits=None) or for mpmath at ``digits`` decimal digits."""
    if digits is None:
        return FLOAT64_U
    with mpmath.workdps(digits):
        return float(mpmath.mp.eps) / 2


def gamma(k: int, u: float = FLOAT64_U) -> float:
    """γ_k = k·u/(1 − k·u)."""
    if k * u >= 1:
        raise ValueError(f"γ_k undefined for k·u = {k * u} ≥ 1")
    return k * u / (1 - k * u)


def cosine_tolerance(n: int, u: float = FLOAT64_U) -> float:
    """Bound on |1 − cos(a, b)| when b = s·a exactly (s > 0) but both were rounded entrywise.

    A componentwise relative perturbation δ ≤ 2u turns a by an angle ≤ δ, so 1 − cos ≤ δ²/2.
    Evaluating ⟨a, b⟩/(‖a‖‖b‖) adds ≤ γ_n (dot product) + 2γ_{n+1} (two norms) + u (division).
    Rounded up: 4γ_{n+1}.
    """
    return 4 * gamma(n + 1, u)


def frame_error(d: int, r: int, u: float = FLOAT64_U, kappa: float = 1.0) -> float:
    """A-priori bound on ‖WᵀW − I‖ for W = polar(A) = A (AᵀA)^{-1/2} computed in floating point.

    Forming the Gram costs γ_d κ²√r (relative to its norm r·κ², for an A of condition κ);
    the symmetric eigensolver is backward stable with error ≤ p(r)·u‖Gram‖ for a modest p
    (Golub & Van Loan, 4th ed., §8.3; LAPACK Users' Guide §4.7), taken as r·u; the two
    products A·K and Kᵀ·(AᵀA)·K add 2γ_r κ² √r. Collected:
    ≤ 10·(γ_d + r·u + 2γ_r)·κ²·r.
    """
    return 10 * (gamma(d, u) + r * u + 2 * gamma(r, u)) * kappa**2 * r


def step_error(d: int, r: int, u: float = FLOAT64_U) -> float:
    """Bound on the error one step of a frame rule adds to W (norm ‖W‖_F = √r).

    The step is a projection (two products of inner dimension d and r), a handful of scalar
    operations on a tangent of n = d·r entries (relative 4γ_{n+1}, cf. ``cosine_tolerance``),
    and a polar retraction (``frame_error``). For ‖ξ‖ ≤ √r:
    ≤ (2γ_d + 2γ_r)·r + 4γ_{n+1}·√r + frame_error(d, r).
    """
    n = d * r
    return (
        (2 * gamma(d, u) + 2 * gamma(r, u)) * r
        + 4 * gamma(n + 1, u) * np.sqrt(r)
        + frame_error(d, r, u)
    )


def trajectory_tolerance(d: int, r: int, steps: int, u: float = FLOAT64_U) -> float:
    """Bound on the distance between two T-step trajectories that agree in exact arithmetic.

    Each run carries a forward error that grows by at most ``step_error`` per step and is
    amplified by the step map's Lipschitz constant in W. Projection transport and the polar map
    are 1-Lipschitz near the manifold and a scale-free direction −lr·P_W(G)/RMS moves by at most
    2·lr·√(d·r) per unit change of W, so the constant is ≤ 2 under the hypothesis
    lr·√(d·r) ≤ 1/2 that every trajectory check states. Two runs: twice the bound of one.
    2·Σ_{t<T} 2^t·step_error = 2·(2^T − 1)·step_error.
    """
    return 2 * (2**steps - 1) * step_error(d, r, u)


def tangent_error(d: int, r: int, norm: float, u: float = FLOAT64_U) -> float:
    """Bound on ‖Wᵀξ + ξᵀW‖ for ξ = P_W(Z) (times scalars) computed in floating point, ‖ξ‖ = norm.

    Wᵀ(Z − W·S) = WᵀZ − S − (WᵀW − I)S: the products add 2(γ_d + γ_r)√r‖ξ‖-sized errors on each
    side of the symmetrisation and the point's own error adds frame_error·‖ξ‖. Collected:
    (4γ_d + 4γ_r)·√r·‖ξ‖ + 2·frame_error(d, r)·‖ξ‖.
    """
    return ((4 * gamma(d, u) + 4 * gamma(r, u)) * np.sqrt(r) + 2 * frame_error(d, r, u)) * norm


def gram_tolerance(d: int, r: int, norm_xi: float, u: float = FLOAT64_U) -> float:
    """Bound on ‖fl((W + ξ)ᵀ(W + ξ)) − I − fl(ξᵀξ)‖ for a computed point W and tangent ξ.

    In exact arithmetic the difference is (WᵀW − I) + (Wᵀξ + ξᵀW); rounding the two Gram products
    adds γ_d(‖W + ξ‖² + ‖ξ‖²) ≤ γ_d((√r + ‖ξ‖)² + ‖ξ‖²).
    """
    products = gamma(d, u) * ((np.sqrt(r) + norm_xi) ** 2 + norm_xi**2)
    return products + frame_error(d, r, u) + tangent_error(d, r, norm_xi, u)


def relative_tolerance(d: int, r: int, spread: float = 1.0, u: float = FLOAT64_U) -> float:
    """Bound on ‖a − b‖/‖b‖ for two evaluations of one frame rule's step whose inputs differ by
    an exact positive factor (b = c^k × the other evaluation in exact arithmetic).

    Each evaluation may project G (two products: ≤ (2γ_d + 2γ_r)·√r·‖G‖ absolute error), which
    relative to the step's size ‖P_W G‖ is amplified by spread = ‖G‖/‖P_W G‖ (0 when both
    evaluations start from the same projected vector), and applies at most three scalar factors
    entrywise plus one comparison value (≤ 6u relative). Two evaluations:
    2·(spread·(2γ_d + 2γ_r)·√r + 6u).
    """
    return 2 * (spread * (2 * gamma(d, u) + 2 * gamma(r, u)) * np.sqrt(r) + 6 * u)


def eps_identity_tolerance(d: int, r: int, u: float = FLOAT64_U) -> float:
    """Bound on |‖ξ_ε − ξ_0‖ − (predicted)|/M for two steps of one frame rule from the same
    state that differ only in ε (RA-2), each optionally capped at Δ, M = min(‖ξ_0‖, Δ) (Δ = ∞
    without the cap); n = d·r entries.

    In exact arithmetic both steps are positive multiples of the same m̂. Each computed step
    carries ≤ 6u relative error from its scalar factors (cf. ``relative_tolerance``); the cap
    ξ·min(1, Δ/‖ξ‖) adds the norm (entries divided by max|ξ| (u), a sum of n squares (γ_n), a
    square root and a product (2u)), the division Δ/‖ξ‖ and the product (2u): ≤ γ_n + 12u in
    all. The measured ‖ξ_ε − ξ_0‖ is off by ≤ (γ_n + 12u)·2M from the steps plus (γ_n + 2u)·M
    from its own norm; the prediction min(‖ξ_0‖, Δ) − min(‖ξ_0‖·q, Δ), q = √v̂/(√v̂ + ε), by
    ≤ 2(γ_n + 6u)·M (‖ξ_0‖ as above, q three roundings). Collected: 5γ_n + 38u.
    """
    return 5 * gamma(d * r, u) + 38 * u


def sqrt_v_tolerance(n: int, steps: int, u: float = FLOAT64_U) -> float:
    """Bound on the relative error of the frame second moment √v_t after t steps, computed as
    √v ← hypot(fl(√β2)·√v, fl(√(1 − β2))·RMS(g)) with RMS(g) = s·‖g/s‖/√n (s = max|g|), against
    the exact recursion v_t = β2·v_{t−1} + (1 − β2)·‖g_t‖²/n on the same float64 β2 and g_t.

    RMS(g) errs relatively by ≤ u (g/s) + γ_n/2 + u (the norm) + 2u (√n and the division) + u
    (times s) ≤ γ_{n+6} =: η. 1 − β2 is exact (Sterbenz, β2 ≥ ½); each square root, product
    and the hypot (< 1 ulp) adds ≤ 2u to its argument's relative error, and a square root of a
    positive combination of two terms with relative errors a and b errs by ≤ max(a, b). So
    δ_t ≤ max(δ_{t−1}, η) + 4u, δ_0 = 0, and δ_t ≤ η + 4tu ≤ γ_{n+6} + γ_{4t} (γ_k absorbs the
    terms of second order)."""
    return gamma(n + 6, u) + gamma(4 * steps, u)


def adam_ratio_bound(steps: int, b2: float) -> float:
    """ρ_T = sqrt(T/β2^{T−1}) ≥ |m̂_t/(√v̂_t + ε)| for every entry and t ≤ T.

    m̂_t is a convex combination of g_1 … g_t (weights (1 − β1)β1^{t−k}/(1 − β1^t)), so
    |m̂_t| ≤ max_k |g_k| = |g_{k*}|, while v̂_t ≥ (1 − β2)β2^{t−k*} g_{k*}²/(1 − β2^t) and
    (1 − β2^t)/(1 − β2) = Σ_{j<t} β2^j ≤ t.
    """
    return float(np.sqrt(steps / b2 ** (steps - 1)))


def adamw_tolerance(
    n: int,
    steps: int,
    x0_norm: float,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    u: float = FLOAT64_U,
) -> float:
    """Bound on ‖x_T − x_T^exact‖ for T steps of elementwise AdamW on n entries along fixed
    gradients (x ← x − lr·(m̂/(√v̂ + ε) + λx)).

    Per entry, the computed ratio m̂/(√v̂ + ε) has relative error at most
    κ = γ_{3T} (m's three operations a step) + γ_{4T} (√v's four) + 2u/(1 − β1) + u/(1 − β2)
    (the bias corrections 1 − β^t, whose power is within 2u and whose subtraction then cancels)
    + 6u (the divisions, the square root, + ε), and the ratio is at most ρ_T
    (``adam_ratio_bound``). Forming x − lr·(ratio + λx) adds 4u·(|x| + lr·ρ_T + lr·λ|x|). The
    gradients are fixed, so an error in x is only multiplied by 1 − lr·λ ≤ 1 afterwards. Over
    the n entries and T steps, with X = ‖x_0‖ + T·lr·√n·ρ_T ≥ max_t ‖x_t‖:
    T·(4u·(1 + lr·λ)·X + lr·√n·ρ_T·(κ + 4u)).
    """
    b1, b2 = betas
    rho = adam_ratio_bound(steps, b2)
    kappa = gamma(3 * steps, u) + gamma(4 * steps, u) + 2 * u / (1 - b1) + u / (1 - b2) + 6 * u
    x_max = x0_norm + steps * lr * np.sqrt(n) * rho
    return steps * (
        4 * u * (1 + lr * weight_decay) * x_max + lr * np.sqrt(n) * rho * (kappa + 4 * u)
    )


def sharded_run_tolerance(steps: int, size: float, u: float = FLOAT64_U) -> float:
    """Bound on max |θ_sharded − θ| after T steps of a data-parallel run (each rank its share
    of the batch, the gradients reduced over the ranks) against one process on the whole
    batch, for entries |θ| ≤ ``size``: T·100·u·size.

    The reduced gradient is the full-batch mean up to the order of summation (γ_B relative
    for B sequences, and γ_2 for the ranks' mean of means: below 10u for B ≤ 8). Adam's
    update is of degree 0 in its gradients to first order, so a relative change δ of the
    gradients moves a step of size ≤ lr·ρ by ≤ lr·ρ·δ, and its own arithmetic adds a few u
    relative to |θ|; the difference already made is carried by a step map whose Lipschitz
    constant is 1 + O(lr). With lr ≤ 10⁻² over T ≤ 20 steps, 100u·size a step covers these
    terms with room to spare (tests/test_fsdp.py uses the same budget over 20 steps).
    """
    return steps * 100 * u * size
