"""The rounding bounds of an audit replay: how far the port's point (and state) after a
step may be from the reference's in the dtype it ran in (``step_bound``, ``state_bound``).

The bound e ≤ B of a step in dtype w (unit roundoff u) is, with Δ = ‖C(ȳ) − C(x̄)‖ the length
of the exact step, s = ‖C(ȳ)‖ the size of the point after it and κ the conditioning of the
point (``step_bound``, ``proofs_checks.audit.elements.Elements.conditioning``):

    B = L·δ + K·u·(κ·(n + r + 2·log2(n·r))·Δ + (r + 4)·s)

- L·δ: the port stepped from x, the reference from x̄. The step map of every rule here is
  Lipschitz in the point with a constant 1 + O(‖ξ‖) near the manifold (the projection, the
  moments' normalisation and the retraction each change by O(‖ξ‖)·δ; the retractions that end
  in a polar factor remove a normal offset to first order, the others carry it with factor
  ≤ 1 + O(‖ξ‖)); L = 2 covers every step with ‖ξ‖ ≤ 1/2 (a longer step is marked as such).
- The direction ξ is formed with inner products of length ≤ n (the largest matrix dimension:
  the projection's Wᵀ G) and r, and with norms of n·r entries summed pairwise by torch
  (error ≤ log2(n·r)·u, twice: the frame's RMS and the trust-region norm): relative error
  (n + r + 2·log2(n·r))·u of the step. Where the rule solves with the Gram matrix of a factor
  that is not a frame (R2's preconditioned metric, R1's core S), the error of the solve is κ
  times its backward error, κ = max cond(F)² over those factors (1 for frames).
- The retraction rounds the sum x + ξ (u·s), forms a product of inner length r with a factor
  cast to w (r·u·s + u·s), and stores the result in w (u·s); a safety factor K = 4 covers the
  second-order terms (γ_k = k·u/(1 − k·u)) and the float64 parts (Gram, eigendecomposition)
  that are ≥ 2^29 times smaller in float32.

- A Stiefel retraction that factors W + ξ itself in the working dtype (``polar_svd``: its
  SVD; ``qr``: its Householder QR; ``exp``: the exponential of a 2r×2r block and products with
  [W, ξ]) has a backward error of at most p(n, r)·u·‖W + ξ‖, p(n, r) = n·r (Golub & Van Loan,
  4th ed., §5.2, §8.6), which the polar factor (or Q) carries with condition ≤ 2 for
  κ(W + ξ) ≤ sqrt(1 + ‖ξ‖²) ≤ 1.12: 2·p·u·s more. Without it, a float64 step of the SVD route
  was measured at 1.18 times the bound (seed 78 of the Stiefel Brockett problem, momentum).
  The worst-case constant n·r assumes every rounding error of the factorisation adds up with
  the same sign; under the probabilistic model of Higham & Mary (SIAM J. Sci. Comput. 41(5),
  2019, Thm. 2.4: the rounding errors independent with mean zero) a sum of n·r of them stays
  below λ·sqrt(n·r)·u·(1 + O(u)) except with probability 2·exp(−λ²(1 − u)²/2), so
  p = min(n·r, λ·sqrt(n·r)) with λ = ``ROUNDING_LAMBDA`` = 7 (a false alarm at most
  4.6e-11 per step from this term; at St(768, 64), 222 times below n·r).
- For the elementwise moment, κ is at least the entrywise amplification a of
  ``elementwise_amplification`` (its direction is scale-free entry by entry, so a small entry of
  the gradient carries a large relative rounding error into its step), and a·δ is added.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from proofs_checks.audit.trace import DTYPES

#: The Lipschitz constant of one step in its starting point, and the safety factor of the
#: rounding terms (module docstring).
LIPSCHITZ = 2.0
SAFETY = 4.0
#: The largest step (Frobenius norm of C(ȳ) − C(x̄)) the Lipschitz constant L covers.
LARGEST_STEP = 0.5


def _roundoff(dtype: str) -> float:
    """u of a recorded dtype ("torch.float32", …: ``trace.DTYPES``)."""
    return DTYPES[dtype].roundoff


def _accepted(dtype: str) -> float:
    """The orthonormality residual ‖FᵀF − I‖ up to which the port accepts a point of this
    dtype as on its manifold (sqrt(ε), ``torch_port.geometry.default_atol``). A recorded point
    beyond it is one the port would have refused: that step fails."""
    return DTYPES[dtype].accepted


#: Stiefel retractions that factor the d×r matrix W + ξ itself in the working dtype.
FACTORING_RETRACTIONS = ("polar_svd", "qr", "exp")
#: λ of the probabilistic rounding bound of a factorisation (module docstring).
ROUNDING_LAMBDA = 7.0


def factoring_constant(n: int, r: int) -> float:
    """p = min(n·r, λ·sqrt(n·r)): the backward error of factoring an n×r matrix, in units of
    u·‖W + ξ‖, worst case or (the smaller, for n·r > λ² = 49) under the probabilistic model."""
    return min(n * r, ROUNDING_LAMBDA * math.sqrt(n * r))


def step_bound(
    dtype: str,
    delta: float,
    step: float,
    size: float,
    n: int,
    r: int,
    kappa: float = 1.0,
    factoring: bool = False,
) -> float:
    """B = L·δ + K·u·(κ·(n + r + 2·log2(n·r))·Δ + (r + 4)·s) (module docstring), plus
    2·p·u·s for a retraction that factors W + ξ itself (``factoring``; p:
    ``factoring_constant``)."""
    u = _roundoff(dtype)
    inner = n + r + 2.0 * math.log2(n * r)
    factored = 2 * factoring_constant(n, r) * u * size if factoring else 0.0
    return LIPSCHITZ * delta + SAFETY * u * (kappa * inner * step + (r + 4) * size) + factored


def elementwise_amplification(
    geometry: Any,
    x: Any,
    g: Any,
    lr: float,
    t: int,
    b2: float,
    length: float,
    n: int,
    r: int,
    dtype: str,
) -> float:
    """The amplification a of the direction's relative error for ``moment="elementwise"``.

    That direction is m̂_ij/(√v̂_ij + ε) entry by entry, of degree zero in each entry's own
    history, so a relative error ε_ij of the entry ḡ_ij of this step's Riemannian gradient moves
    it by at most 2ρ_t·ε_ij (ρ_t = ``bounds.adam_ratio_bound``). Rounding bounds the entries'
    absolute errors relative to ‖ḡ‖, not to each entry: |δḡ_ij| ≤ (n + r)·u·‖ḡ‖, so
    ε_ij ≤ (n + r)·u·‖ḡ‖/|ḡ_ij| (at most 1 where the entry is itself at that level, τ). The
    step, lr times the (non-expansively projected) direction, then errs by
    lr·2ρ_t·(n + r)·u·‖ḡ‖·sqrt(Σ_ij 1/max(|ḡ_ij|, τ)²), which is a·(n + r)·u·Δ with
    a = 2ρ_t·lr·‖ḡ‖·sqrt(Σ_ij 1/max(|ḡ_ij|, τ)²)/Δ. A point off by δ changes ḡ's entries by
    ≤ 2δ‖G‖ likewise, hence the a·δ term of the bound (Δ ≤ 1/2)."""
    from proofs_checks.bounds import adam_ratio_bound
    from reference.geometry import parts

    if length == 0.0:
        return 0.0
    rg = np.concatenate([np.ravel(a) for a in parts(geometry.egrad_to_rgrad(x, g))])
    norm = float(np.linalg.norm(rg))
    if norm == 0.0:
        return 0.0
    tau = (n + r) * _roundoff(dtype) * norm
    total = float(np.sqrt(np.sum(1.0 / np.maximum(np.abs(rg), tau) ** 2)))
    return 2 * adam_ratio_bound(t, b2) * lr * norm * total / length


def state_bound(
    dtype: str, delta: float, deviation: float, size: float, n: int, r: int, kappa: float = 1.0
) -> float:
    """B_s = (2·(e + L·δ) + K·u·κ·(n + r + 2·log2(n·r)))·‖s̄‖ for a state entry s̄ of the
    reference after the step (the moment transported to ȳ, or √v): the port's entry was formed
    at x and transported to y, the reference's at x̄ and to ȳ; the projection P_y differs from
    P_ȳ by ≤ 2‖y − ȳ‖ (e, measured) and the new moment by ≤ 2·L·δ relative (its gradient was
    projected at x, not x̄); the rounding is that of the direction (``step_bound``)."""
    u = _roundoff(dtype)
    inner = n + r + 2.0 * math.log2(n * r)
    return (2.0 * (deviation + LIPSCHITZ * delta) + SAFETY * u * kappa * inner) * size
