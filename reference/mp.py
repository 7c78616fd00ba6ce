"""Multi-precision (mpmath) versions of the Stiefel operations the certificates need.

Matrices are NumPy object arrays of ``mpmath.mpf``, so ``@`` and ``+`` work as for float64 arrays
while every operation rounds at mpmath's working precision. Set the precision around a call with
``mpmath.workdps(digits)``; inputs are converted at the precision in force.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import mpmath
import numpy as np

Array = np.ndarray


def to_mp(a: Array) -> Array:
    """Convert a float (or object) array to an object array of mpf at the working precision."""
    return np.vectorize(mpmath.mpf, otypes=[object])(np.asarray(a))


def to_float(a: Array) -> Array:
    """Round an mpf array to float64."""
    return np.vectorize(float, otypes=[np.float64])(a)


def eye(r: int) -> Array:
    return to_mp(np.eye(r))


def sym(a: Array) -> Array:
    """sym(A) = (A + Aᵀ)/2."""
    return (a + a.T) / 2


def skew(a: Array) -> Array:
    """skew(A) = (A − Aᵀ)/2."""
    return (a - a.T) / 2


def frobenius(a: Array) -> mpmath.mpf:
    """‖A‖ = sqrt(Σ A_ij²) at the working precision (mpf has no practical overflow)."""
    return mpmath.sqrt(mpmath.fsum(v * v for v in np.ravel(a)))


def proj(w: Array, z: Array) -> Array:
    """P_W(Z) = Z − W sym(WᵀZ)."""
    return z - w @ sym(w.T @ z)


def inv_sqrt_spd(s: Array) -> Array:
    """S^{-1/2} = Q diag(λ^{-1/2}) Qᵀ from the symmetric eigendecomposition (mpmath.eigsy)."""
    lam, q = mpmath.eigsy(mpmath.matrix(sym(s).tolist()))
    q = np.array(q.tolist(), dtype=object)
    return (q * np.array([1 / mpmath.sqrt(v) for v in lam], dtype=object)) @ q.T


def polar(a: Array) -> Array:
    """A (AᵀA)^{-1/2}, the orthonormal polar factor of a full-column-rank A."""
    return a @ inv_sqrt_spd(a.T @ a)


def _ratio(num: Array, den: Array) -> Array:
    """num/den entry by entry with 0/0 := 0 (a zero gradient entry gives a zero step)."""
    return np.vectorize(lambda a, b: a * 0 if b == 0 else a / b, otypes=[object])(num, den)


class Trajectory(NamedTuple):
    points: list  # W_0, W_1, …, W_T
    steps: list  # ξ_1, …, ξ_T (after the trust region)
    m_hats: list  # m̂_1, …, m̂_T at the point each step starts from


def adam_trajectory(
    w0: Array,
    egrads: Sequence[Array],
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    trust_radius: float | None = None,
    moment: str = "frame",
    reduction: str = "mean",
) -> Trajectory:
    """The Riemannian Adam trajectory of ``reference.optim.riemannian_adam`` on St(d, r), with
    its defaults (DESIGN §5).

    An independent transcription of DESIGN §5 at the working precision: g = P_W(G);
    m ← β1 m + (1 − β1) g; v ← β2 v + (1 − β2)·s(g) with s(g) = ‖g‖²/(entries) ("mean") or
    ‖g‖² ("sum"); ξ = −lr·m̂/(√v̂ + ε), m̂ = m/(1 − β1^t), v̂ = v/(1 − β2^t);
    ξ ← ξ·min(1, Δ/‖ξ‖); W ← polar(W + ξ); m ← P_W(m). ``moment="elementwise"`` keeps one v per
    entry (0/0 := 0 in its ratio) and projects the direction (the ablation arm). v itself is
    kept, not √v, and with no rescaling: the reference's overflow-safe route is not transcribed.
    """
    if moment not in ("frame", "elementwise"):
        raise ValueError(f"unknown moment {moment!r}; choose 'frame' or 'elementwise'")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"unknown reduction {reduction!r}; choose 'mean' or 'sum'")
    b1, b2 = mpmath.mpf(betas[0]), mpmath.mpf(betas[1])
    lr, eps = mpmath.mpf(lr), mpmath.mpf(eps)
    w = to_mp(w0)
    m = w * 0
    v = w * 0 if moment == "elementwise" else mpmath.mpf(0)
    out = Trajectory([w], [], [])
    for t, egrad in enumerate(egrads, start=1):
        g = proj(w, to_mp(egrad))
        m = b1 * m + (1 - b1) * g
        m_hat = m / (1 - b1**t)
        if moment == "elementwise":
            v = b2 * v + (1 - b2) * g * g
            root = np.vectorize(mpmath.sqrt, otypes=[object])(v / (1 - b2**t))
            xi = proj(w, -lr * _ratio(m_hat, root + eps))
        else:
            s = frobenius(g) ** 2
            v = b2 * v + (1 - b2) * (s / g.size if reduction == "mean" else s)
            xi = -lr * m_hat / (mpmath.sqrt(v / (1 - b2**t)) + eps)
        if trust_radius is not None:
            n = frobenius(xi)
            if n > trust_radius:
                xi = xi * (mpmath.mpf(trust_radius) / n)
        w_next = polar(w + xi)
        m = proj(w_next, m)
        w = w_next
        out.points.append(w)
        out.steps.append(xi)
        out.m_hats.append(m_hat)
    return out


def _capped(xi: Array, radius: float | None) -> Array:
    """ξ·min(1, Δ/‖ξ‖) (no cap for Δ None)."""
    if radius is None:
        return xi
    n = frobenius(xi)
    return xi * (mpmath.mpf(radius) / n) if n > radius else xi


def momentum_trajectory(
    w0: Array, egrads: Sequence[Array], lr: float, beta: float = 0.9, c: float = 1.0
) -> Trajectory:
    """The trajectory of ``reference.optim.riemannian_momentum`` on St(d, r), transcribed from
    DESIGN §5 at the working precision: g = P_W(G); M ← β M + (1 − β) g;
    ξ = −lr·M/max(‖M‖, c); W ← polar(W + ξ); M ← P_W(M). ``m_hats`` holds each step's M."""
    b, lr, c = mpmath.mpf(beta), mpmath.mpf(lr), mpmath.mpf(c)
    w = to_mp(w0)
    m = w * 0
    out = Trajectory([w], [], [])
    for egrad in egrads:
        m = b * m + (1 - b) * proj(w, to_mp(egrad))
        xi = -lr * m / max(frobenius(m), c)
        w_next = polar(w + xi)
        out.m_hats.append(m)
        m = proj(w_next, m)
        w = w_next
        out.points.append(w)
        out.steps.append(xi)
    return out


def rsgd_trajectory(
    w0: Array, egrads: Sequence[Array], lr: float, trust_radius: float | None = None
) -> Trajectory:
    """``reference.optim.rsgd``: ξ = −lr·P_W(G), capped at Δ; W ← polar(W + ξ)."""
    w = to_mp(w0)
    out = Trajectory([w], [], [])
    for egrad in egrads:
        xi = _capped(-mpmath.mpf(lr) * proj(w, to_mp(egrad)), trust_radius)
        w = polar(w + xi)
        out.points.append(w)
        out.steps.append(xi)
    return out


def normalized_rsgd_trajectory(w0: Array, egrads: Sequence[Array], lr: float) -> Trajectory:
    """``reference.optim.normalized_rsgd``: ξ = −lr·g/RMS(g), g = P_W(G), RMS(g) =
    ‖g‖/sqrt(d·r) (0/0 := 0); W ← polar(W + ξ)."""
    w = to_mp(w0)
    out = Trajectory([w], [], [])
    for egrad in egrads:
        g = proj(w, to_mp(egrad))
        rms = frobenius(g) / mpmath.sqrt(g.size)
        xi = g * 0 if rms == 0 else -mpmath.mpf(lr) * g / rms
        w = polar(w + xi)
        out.points.append(w)
        out.steps.append(xi)
    return out


def adamw_trajectory(
    x0: Array,
    egrads: Sequence[Array],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> Trajectory:
    """torch's AdamW on a plain array, transcribed from its documentation at the working
    precision, entry by entry: x ← x − lr·λ·x; m ← β1 m + (1 − β1) g; v ← β2 v + (1 − β2) g²;
    x ← x − lr·m̂/(√v̂ + ε) with m̂ = m/(1 − β1^t), v̂ = v/(1 − β2^t). ``steps`` holds each
    x_t − x_{t−1}, ``m_hats`` each m̂."""
    b1, b2 = mpmath.mpf(betas[0]), mpmath.mpf(betas[1])
    lr, eps, lam = mpmath.mpf(lr), mpmath.mpf(eps), mpmath.mpf(weight_decay)
    sqrt = np.vectorize(mpmath.sqrt, otypes=[object])
    x = to_mp(x0)
    m, v = x * 0, x * 0
    out = Trajectory([x], [], [])
    for t, egrad in enumerate(egrads, start=1):
        g = to_mp(egrad)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        x_next = x * (1 - lr * lam) - lr * m_hat / (sqrt(v / (1 - b2**t)) + eps)
        out.points.append(x_next)
        out.steps.append(x_next - x)
        out.m_hats.append(m_hat)
        x = x_next
    return out
