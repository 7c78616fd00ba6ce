"""Planted tasks with a known rank r*, and the closed forms of the static surrogate.

Group 2 of ``reference.capacity``. Planted factors (``orthonormal``, ``planted_spectrum``,
``planted_kernel``, ``planted_mixer``), the token-mixing maps of attention
(``linear_attention_mixing``, ``softmax_attention_mixing``), the seeded tasks ``static_task``,
``linear_qk_task`` and ``softmax_task`` (flat or decaying spectra; a PSD option for the kernel),
each returned as a ``PlantedTask``, and the closed forms of the static surrogate (``cholesky`` of
the token covariance, ``static_excess_risk``, ``deficiency_bound``, ``truncated_mixer``; EB-1,
EB-2), of the token Gram (``gram_population``; EB-4) and of the pooled regression
(``pooled_population``; EB-7).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from reference.capacity.validation import EPS, Array, _matrix, _rng, spectrum
from reference.linalg import qr_signfixed


# ---------------------------------------------------------------------------------------------
# 2. Planted tasks
# ---------------------------------------------------------------------------------------------
def orthonormal(m: int, k: int, rng: int | np.random.Generator) -> Array:
    """A Haar-random m×k matrix with orthonormal columns (k ≤ m) or orthonormal rows (k > m)."""
    if m < 1 or k < 1:
        raise ValueError(f"needs m ≥ 1 and k ≥ 1, got m = {m}, k = {k}")
    rng = _rng(rng)
    if k <= m:
        return qr_signfixed(rng.standard_normal((m, k)))[0]
    return qr_signfixed(rng.standard_normal((k, m)))[0].T


def planted_spectrum(r: int, spec: str | Sequence[float] = "flat") -> Array:
    """The r planted singular values: "flat" (all 1), "decay" (linspace(1, 0.5, r)), or the
    given positive values (sorted decreasing)."""
    if isinstance(spec, str):
        if r < 0:
            raise ValueError(f"the planted rank must be ≥ 0, got {r}")
        if spec == "flat":
            return np.ones(r)
        if spec == "decay":
            return np.linspace(1.0, 0.5, r) if r > 1 else np.ones(r)
        raise ValueError(f"spectrum must be 'flat', 'decay' or a sequence, got {spec!r}")
    s = spectrum(spec)
    if s.size != r or (r and s[-1] <= 0):
        raise ValueError(f"an explicit spectrum needs {r} positive values, got {list(s)}")
    return s


def planted_kernel(
    d: int,
    r: int,
    rng: int | np.random.Generator,
    spec: str | Sequence[float] = "flat",
    psd: bool = False,
) -> Array:
    """K = U diag(s) Vᵀ ∈ ℝ^{d×d} of rank r with Haar U, V ∈ St(d, r); V = U when ``psd`` (then
    K ⪰ 0 and tr K = Σs > 0: the self-attention bias of background §5 II-P(c))."""
    if not 1 <= r <= d:
        raise ValueError(f"needs 1 ≤ r ≤ d, got d = {d}, r = {r}")
    rng = _rng(rng)
    s = planted_spectrum(r, spec)
    u = orthonormal(d, r, rng)
    v = u if psd else orthonormal(d, r, rng)
    return (u * s) @ v.T


def planted_mixer(
    n: int, r: int, rng: int | np.random.Generator, spec: str | Sequence[float] = "flat"
) -> Array:
    """A* = U diag(s) Vᵀ ∈ ℝ^{n×n} of rank r (Haar U, V ∈ St(n, r))."""
    if not 0 <= r <= n:
        raise ValueError(f"needs 0 ≤ r ≤ n, got n = {n}, r = {r}")
    rng = _rng(rng)
    if r == 0:
        return np.zeros((n, n))
    s = planted_spectrum(r, spec)
    return (orthonormal(n, r, rng) * s) @ orthonormal(n, r, rng).T


def _mixing_args(x: Array, k: Array) -> tuple[Array, Array]:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim not in (2, 3) or min(x.shape) < 1:
        raise ValueError(f"X must have shape (S, n, d) or (n, d), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"X has {int(np.sum(~np.isfinite(x)))} non-finite entries (NaN or inf)")
    k = _matrix(k, "K")
    d = x.shape[-1]
    if k.shape != (d, d):
        raise ValueError(f"K must be d×d = {d}×{d}, got shape {k.shape}")
    return x, k


def linear_attention_mixing(x: Array, k: Array) -> Array:
    """A(X) = X K Xᵀ / n for X of shape (S, n, d) (or one (n, d) sequence)."""
    x, k = _mixing_args(x, k)
    return x @ k @ np.swapaxes(x, -1, -2) / x.shape[-2]


def softmax_attention_mixing(x: Array, k: Array, beta: float = 1.0) -> Array:
    """A(X) = rowsoftmax(β X K Xᵀ / √d) for X of shape (S, n, d) (or one (n, d) sequence); the
    row maximum is subtracted before exp (exact in exact arithmetic, no overflow)."""
    x, k = _mixing_args(x, k)
    if not np.isfinite(beta):
        raise ValueError(f"beta must be finite, got {beta}")
    logits = beta * (x @ k @ np.swapaxes(x, -1, -2)) / math.sqrt(x.shape[-1])
    logits = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class PlantedTask:
    """Sequences with a planted rank. ``x``: (S, n, d); ``y``: (S, n, d_v); ``rank``: r*;
    ``mixer``: A* (static) or None; ``kernel``: K (attention) or None; ``value``: W* or W_V;
    ``covariance``: the token covariance C (static) or None."""

    kind: str
    x: Array
    y: Array
    rank: int
    value: Array
    noise: float
    mixer: Array | None = None
    kernel: Array | None = None
    beta: float | None = None
    covariance: Array | None = None


def _check_sizes(s: int, n: int, d: int, dv: int, noise: float) -> None:
    if min(s, n, d, dv) < 1:
        raise ValueError(f"needs S, n, d, d_v ≥ 1, got S={s}, n={n}, d={d}, d_v={dv}")
    if not (np.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be finite and ≥ 0, got {noise}")


def static_task(
    s: int,
    n: int,
    d: int,
    dv: int,
    r: int,
    seed: int | np.random.Generator = 0,
    noise: float = 0.01,
    spec: str | Sequence[float] = "flat",
    covariance: Array | None = None,
) -> PlantedTask:
    """Static surrogate Y_s = A* X_s W* + σE_s, rank A* = r (``planted_mixer``), W* =
    ``orthonormal(d, d_v)``, X_s = C^{1/2}Z_s (C = I by default; any square root L with
    LLᵀ = C gives the same law, here the Cholesky factor), Z, E with iid N(0, 1) entries."""
    _check_sizes(s, n, d, dv, noise)
    rng = _rng(seed)
    a = planted_mixer(n, r, rng, spec)
    w = orthonormal(d, dv, rng)
    x = rng.standard_normal((s, n, d))
    if covariance is not None:
        x = cholesky(covariance, n) @ x
    y = a @ x @ w + noise * rng.standard_normal((s, n, dv))
    return PlantedTask("static", x, y, r, w, noise, mixer=a, covariance=covariance)


def linear_qk_task(
    s: int,
    n: int,
    d: int,
    dv: int,
    r: int,
    seed: int | np.random.Generator = 0,
    noise: float = 0.01,
    spec: str | Sequence[float] = "flat",
    psd: bool = False,
) -> PlantedTask:
    """Linear QK attention Y_s = (X_s K X_sᵀ/n) X_s W_V + σE_s with K = ``planted_kernel``
    (rank r), W_V = ``orthonormal(d, d_v)``, tokens iid N(0, I_d)."""
    _check_sizes(s, n, d, dv, noise)
    rng = _rng(seed)
    k = planted_kernel(d, r, rng, spec, psd)
    w = orthonormal(d, dv, rng)
    x = rng.standard_normal((s, n, d))
    y = linear_attention_mixing(x, k) @ x @ w + noise * rng.standard_normal((s, n, dv))
    return PlantedTask("linear", x, y, r, w, noise, kernel=k)


def softmax_task(
    s: int,
    n: int,
    d: int,
    dv: int,
    r: int,
    beta: float = 2.0,
    seed: int | np.random.Generator = 0,
    noise: float = 0.01,
    spec: str | Sequence[float] = "flat",
    psd: bool = False,
) -> PlantedTask:
    """Softmax attention Y_s = rowsoftmax(β X_s K X_sᵀ/√d) X_s W_V + σE_s, K =
    ``planted_kernel`` (rank r), W_V = ``orthonormal(d, d_v)``, tokens iid N(0, I_d)."""
    _check_sizes(s, n, d, dv, noise)
    if not np.isfinite(beta):
        raise ValueError(f"beta must be finite, got {beta}")
    rng = _rng(seed)
    k = planted_kernel(d, r, rng, spec, psd)
    w = orthonormal(d, dv, rng)
    x = rng.standard_normal((s, n, d))
    y = softmax_attention_mixing(x, k, beta) @ x @ w + noise * rng.standard_normal((s, n, dv))
    return PlantedTask("softmax", x, y, r, w, noise, kernel=k, beta=float(beta))


# -- closed forms of the static surrogate (EB-1, EB-2) ------------------------------------------
def cholesky(c: Array | None, n: int) -> Array:
    """Lower-triangular L with LLᵀ = C (the identity for C = None); raises unless C is SPD."""
    if c is None:
        return np.eye(n)
    c = _matrix(c, "C")
    if c.shape != (n, n):
        raise ValueError(f"the token covariance must be {n}×{n}, got shape {c.shape}")
    if not np.allclose(c, c.T, rtol=0, atol=n * EPS * np.max(np.abs(c))):
        raise ValueError("the token covariance must be symmetric")
    try:
        return np.linalg.cholesky(c)
    except np.linalg.LinAlgError:
        raise ValueError("the token covariance must be positive definite") from None


def _static_args(a_star: Array, w: Array, c: Array | None) -> tuple[Array, Array, Array]:
    a_star, w = _matrix(a_star, "A*"), _matrix(w, "W*")
    n = a_star.shape[0]
    if a_star.shape != (n, n):
        raise ValueError(f"A* must be square, got shape {a_star.shape}")
    return a_star, w, cholesky(c, n)


def static_excess_risk(a: Array, a_star: Array, w: Array, c: Array | None = None) -> float:
    """Excess risk of the static mixer A in the surrogate Ŷ = A X W*:
    ℰ(A) = E‖AXW* − Y‖² − E‖A*XW* − Y‖² = ‖W*‖_F² ‖(A − A*)C^{1/2}‖_F² for X = C^{1/2}Z (Z iid
    N(0, 1)) and noise independent of X with mean zero (EB-1). Computed with the Cholesky factor
    L of C: ‖ML‖_F² = tr(MCMᵀ) = ‖MC^{1/2}‖_F²."""
    a_star, w, ell = _static_args(a_star, w, c)
    a = _matrix(a, "A")
    if a.shape != a_star.shape:
        raise ValueError(f"A must have the shape of A* {a_star.shape}, got {a.shape}")
    return float(np.sum(w * w) * np.sum(np.square((a - a_star) @ ell)))


def deficiency_bound(a_star: Array, w: Array, r: int, c: Array | None = None) -> float:
    """‖W*‖_F² Σ_{i>r} σ_i²(A*C^{1/2}): the least excess risk of a mixer of rank ≤ r (EB-1).
    Positive iff r < r* = rank A* (and W* ≠ 0)."""
    a_star, w, ell = _static_args(a_star, w, c)
    if r < 0:
        raise ValueError(f"the student rank must be ≥ 0, got {r}")
    sig = np.linalg.svd(a_star @ ell, compute_uv=False)
    return float(np.sum(w * w) * np.sum(np.square(sig[r:])))


def truncated_mixer(a_star: Array, r: int, c: Array | None = None) -> Array:
    """A_r = [A*C^{1/2}]_r C^{-1/2}, the best mixer of rank ≤ r (EB-2), computed as
    [A*L]_r L^{-1} with L the Cholesky factor of C (equal: A*L = A*C^{1/2}Q with Q orthogonal,
    and [BQ]_r = [B]_r Q). [·]_r is the truncated SVD; A_{r*} = A*."""
    a_star = _matrix(a_star, "A*")
    n = a_star.shape[0]
    if a_star.shape != (n, n):
        raise ValueError(f"A* must be square, got shape {a_star.shape}")
    if r < 0:
        raise ValueError(f"the student rank must be ≥ 0, got {r}")
    ell = cholesky(c, n)
    u, sig, vt = np.linalg.svd(a_star @ ell)
    r = min(r, n)
    b_r = (u[:, :r] * sig[:r]) @ vt[:r]
    return scipy.linalg.solve_triangular(ell, b_r.T, lower=True, trans="T").T


def gram_population(a_star: Array, w: Array, noise: float, c: Array | None = None) -> Array:
    """The expected token Gram of the static surrogate (EB-4 (a)): for Y = A*XW* + σE with
    X = C^{1/2}Z (Z, E with iid N(0, 1) entries), E[YYᵀ]/d_v = (‖W*‖_F²/d_v)·A*CA*ᵀ + σ²I,
    the mean of ``spectra.token_gram`` (E[XW*W*ᵀXᵀ] = tr(W*W*ᵀ)·C)."""
    a_star, w = _matrix(a_star, "A*"), _matrix(w, "W*")
    n = a_star.shape[0]
    if a_star.shape != (n, n):
        raise ValueError(f"A* must be n×n, got {a_star.shape}")
    if not (np.isfinite(noise) and noise >= 0):
        raise ValueError(f"the noise level σ must be finite and ≥ 0, got {noise}")
    ell = cholesky(c, n)
    mixed = a_star @ ell
    return (np.sum(w * w) / w.shape[1]) * (mixed @ mixed.T) + noise**2 * np.eye(n)


def pooled_population(k: Array, w_v: Array, n: int) -> Array:
    """The population pooled-regression coefficient of linear QK attention (EB-7):
    C = W_Vᵀ[Kᵀ + (K + tr(K) I)/n] ∈ ℝ^{d_v×d}, i.e. E[y_i x_iᵀ] for
    y_i = W_Vᵀ Σ_j (x_iᵀKx_j/n) x_j with x_j iid N(0, I_d), the j = i term included
    (Isserlis: E[x xᵀ Kᵀ x xᵀ] = K + Kᵀ + tr(K) I)."""
    k, w_v = _matrix(k, "K"), _matrix(w_v, "W_V")
    d = k.shape[0]
    if k.shape != (d, d) or w_v.shape[0] != d:
        raise ValueError(f"K must be d×d and W_V d×d_v, got K {k.shape}, W_V {w_v.shape}")
    if n < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    return w_v.T @ (k.T + (k + np.trace(k) * np.eye(d)) / n)
