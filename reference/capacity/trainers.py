"""Trainers: plain gradient descent on factorised students, closed-form gradients (EB-3, EB-6).

Group 4 of ``reference.capacity``. ``static_statistics`` and ``linear_qk_statistics`` (sufficient
statistics of the empirical risk), the algebraic kernels ``static_gradient``,
``linear_qk_gradient``, ``quadratic_form`` and ``factor_gradients`` (pure algebra without
validation: they also run on object arrays of exact SymPy numbers, in the symbolic checks of EB-3
and EB-6), ``factorised_gd``, ``small_init`` and the front ends ``train_static_student`` and
``train_linear_qk_student``, which return a ``StudentFit``. Divergence (a step too large for the
problem) raises ``ValueError`` naming lr and the step or loss measured; no trainer returns NaN.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from reference.capacity.validation import Array, _matrix, _pair, _rng


# ---------------------------------------------------------------------------------------------
# 4. Trainers: plain gradient descent on factorised students (EB-3, EB-6)
# ---------------------------------------------------------------------------------------------
class StudentFit(NamedTuple):
    """A trained factorised student. ``loss`` is the final empirical risk computed from the
    sufficient statistics, ½tr(AHAᵀ) − tr(BᵀA) + ½c (static) or ½kᵀ𝓗k − ⟨B, K⟩ + ½c (linear QK):
    ≥ 0 in exact arithmetic (a mean of squares), but near a perfect fit the three terms cancel
    and rounding, of order u·c (u = 2⁻⁵³), can leave it slightly negative. It is reported as
    computed, not clamped at 0."""

    operator: Array  #: the learned product: Â = U Vᵀ (static) or K̂ = W_Q W_Kᵀ (linear QK)
    left: Array  #: U (n × m) or W_Q (d × r)
    right: Array  #: V (n × m) or W_K (d × r)
    loss: float  #: the final empirical risk (may be ≈ −u·c at a perfect fit; see above)


class StaticStatistics(NamedTuple):
    """Sufficient statistics of the static surrogate's empirical risk (all scaled by 1/(S‖W‖_F²)):
    ``h`` = Σ_s X_sWWᵀX_sᵀ, ``b`` = Σ_s Y_sWᵀX_sᵀ (n × n), ``c`` = Σ_s ‖Y_s‖_F²."""

    h: Array
    b: Array
    c: float


class LinearQKStatistics(NamedTuple):
    """Sufficient statistics of the linear-QK empirical risk with a fixed value map (all scaled
    by 1/(S·n)): ``hess`` = Σ_s X_sᵀX_s ⊗ P_sP_sᵀ (d² × d², row-major vec), ``b`` = Σ_s
    X_sᵀY_sP_sᵀ (d × d), ``c`` = Σ_s ‖Y_s‖_F², with P_s = X_sᵀX_sW_V/n."""

    hess: Array
    b: Array
    c: float


def static_statistics(x: Array, y: Array, w: Array) -> StaticStatistics:
    """H, B, c of ``StaticStatistics`` for the static student Ŷ_s = A X_s W (W known, d × d_v).

    The empirical risk is L(A) = Σ_s ‖A X_s W − Y_s‖_F² / (2S‖W‖_F²) = ½tr(AHAᵀ) − tr(BᵀA) + ½c.
    For X = C^{1/2}Z: H → C and B → A*C when Y = A*XW + E (E independent, mean zero)."""
    x, y = _pair(x, y)
    w = _matrix(w, "W")
    s, _, d = x.shape
    if w.shape != (d, y.shape[2]):
        raise ValueError(f"W must be d×d_v = {d}×{y.shape[2]}, got shape {w.shape}")
    scale = s * float(np.sum(w * w))
    if scale == 0.0:
        raise ValueError("W is zero: the static student has no signal")
    xw = x @ w
    # einsum (C loops), not a GEMM: threaded BLAS on skinny products is slow on a busy machine
    h = np.einsum("sik,sjk->ij", xw, xw) / scale
    b = np.einsum("sik,sjk->ij", y, xw) / scale
    return StaticStatistics(0.5 * (h + h.T), b, float(np.sum(y * y)) / scale)


def static_gradient(a: Array, h: Array, b: Array) -> Array:
    """∇_A L(A) = A H − B for L(A) = ½tr(AHAᵀ) − tr(BᵀA) + ½c (H symmetric); batched over
    leading axes. No validation (it also runs on object arrays of exact numbers)."""
    return a @ h - b


def linear_qk_statistics(x: Array, y: Array, w_v: Array) -> LinearQKStatistics:
    """𝓗, B, c of ``LinearQKStatistics`` for the linear-QK student Ŷ_s = X_s K P_s with
    P_s = X_sᵀX_sW_V/n (i.e. Ŷ_s = (X_sKX_sᵀ/n)X_sW_V, value map W_V fixed and known).

    The empirical risk is L(K) = Σ_s ‖X_sKP_s − Y_s‖_F²/(2Sn) = ½kᵀ𝓗k − ⟨B, K⟩ + ½c with
    k = vec_row(K), since vec_row(XKP) = (X ⊗ Pᵀ)vec_row(K): a quadratic in K (reduced-rank
    regression once K = W_QW_Kᵀ with W_Q, W_K ∈ ℝ^{d×r}). With iid N(0, I) tokens, orthogonal
    W_V and n → ∞, 𝓗 → I_{d²}."""
    x, y = _pair(x, y)
    w_v = _matrix(w_v, "W_V")
    s, n, d = x.shape
    if w_v.shape != (d, y.shape[2]):
        raise ValueError(f"W_V must be d×d_v = {d}×{y.shape[2]}, got shape {w_v.shape}")
    g1 = np.swapaxes(x, 1, 2) @ x  # XᵀX, (S, d, d)
    p = g1 @ w_v / n  # (S, d, d_v)
    g2 = p @ np.swapaxes(p, 1, 2)  # PPᵀ, (S, d, d)
    m = np.einsum("sp,sq->pq", g1.reshape(s, d * d), g2.reshape(s, d * d))  # [(a, c), (b, e)]
    hess = m.reshape(d, d, d, d).transpose(0, 2, 1, 3).reshape(d * d, d * d) / (s * n)
    b = np.sum(np.swapaxes(x, 1, 2) @ y @ np.swapaxes(p, 1, 2), axis=0) / (s * n)
    return LinearQKStatistics(0.5 * (hess + hess.T), b, float(np.sum(y * y)) / (s * n))


def linear_qk_gradient(k: Array, hess: Array, b: Array) -> Array:
    """∇_K L(K) = reshape(𝓗 vec_row(K)) − B (= Σ_s X_sᵀ(X_sKP_s − Y_s)P_sᵀ/(Sn)); batched over
    leading axes. No validation (it also runs on object arrays of exact numbers)."""
    d = k.shape[-1]
    flat = k.reshape(*k.shape[:-2], d * d, 1)
    return (hess @ flat).reshape(k.shape) - b


def quadratic_form(k: Array, hess: Array) -> Array:
    """vec_row(K)ᵀ 𝓗 vec_row(K), batched over leading axes: with 𝓗 from held-out sequences and
    K = K̂ − K*, twice the excess test risk against noiseless targets."""
    d = k.shape[-1]
    flat = k.reshape(*k.shape[:-2], d * d, 1)
    return (np.swapaxes(flat, -1, -2) @ hess @ flat)[..., 0, 0]


def factor_gradients(g: Array, u: Array, v: Array) -> tuple[Array, Array]:
    """Chain rule through the product M = U Vᵀ: for a loss ℓ(M) with ∇_M ℓ = G,
    ∇_U ℓ(UVᵀ) = G V and ∇_V ℓ(UVᵀ) = Gᵀ U (since dM = dU Vᵀ + U dVᵀ and
    ⟨G, dU Vᵀ⟩ = ⟨GV, dU⟩, ⟨G, U dVᵀ⟩ = ⟨GᵀU, dV⟩). Batched; no validation."""
    return g @ v, np.swapaxes(g, -1, -2) @ u


def _gd_args(lr: float, steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be an integer ≥ 0, got {steps!r}")
    if not (isinstance(lr, (int, float, np.number)) and np.isfinite(lr) and lr > 0):
        raise ValueError(f"needs a finite lr > 0, got lr = {lr!r}")


def _factor(a: Array, name: str) -> Array:
    a = np.array(a, dtype=np.float64)
    if a.ndim < 2 or min(a.shape[-2:]) < 1:
        raise ValueError(f"{name} must be a (batch of) non-empty matrices, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has {int(np.sum(~np.isfinite(a)))} non-finite entries")
    return a


def factorised_gd(gradient, u0: Array, v0: Array, lr: float, steps: int) -> tuple[Array, Array]:
    """Plain gradient descent on (U, V) for a loss of M = U Vᵀ with ∇_M = ``gradient(M)``:
    (U, V) ← (U − lr·G V, V − lr·Gᵀ U), G = gradient(U Vᵀ), both factors updated from the same
    iterate (simultaneous GD, no momentum, no weight decay). Batched over leading axes.

    Validation: ``gradient`` callable, lr finite and > 0, steps an integer ≥ 0, U₀ and V₀ finite
    (batches of) matrices with the same width and the same batch shape. Divergence: when an
    iterate becomes non-finite (lr too large; for a quadratic loss in M with Hessian λ_max,
    lr·2‖M‖₂·λ_max < 1 along the path is a safe step), ``ValueError`` names lr, the step and the
    largest entry of the last finite iterate; NaN is never returned."""
    if not callable(gradient):
        raise ValueError(f"gradient must be callable (M ↦ ∇_M), got {type(gradient).__name__}")
    _gd_args(lr, steps)
    u, v = _factor(u0, "U₀"), _factor(v0, "V₀")
    if u.shape[:-2] != v.shape[:-2] or u.shape[-1] != v.shape[-1]:
        raise ValueError(
            f"U₀ and V₀ must share the batch shape and the width, got {u.shape} and {v.shape}"
        )
    for t in range(steps):
        with np.errstate(over="ignore", invalid="ignore"):
            gu, gv = factor_gradients(gradient(u @ np.swapaxes(v, -1, -2)), u, v)
            u_new, v_new = u - lr * gu, v - lr * gv
        if not (np.all(np.isfinite(u_new)) and np.all(np.isfinite(v_new))):
            last = max(float(np.max(np.abs(u))), float(np.max(np.abs(v))))
            raise ValueError(
                f"gradient descent diverged at step {t + 1} of {steps} with lr = {lr:g}: the "
                f"factors became non-finite (largest entry {last:.3g} at step {t}); use a "
                "smaller lr"
            )
        u, v = u_new, v_new
    return u, v


def small_init(rows: int, width: int, init: float, rng: int | np.random.Generator) -> Array:
    """A factor with iid N(0, init²/rows) entries (‖column‖ ≈ init): the small initialisation.
    Validation: rows and width integers ≥ 1, init finite and ≥ 0."""
    for name, value in (("rows", rows), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"small_init needs an integer {name} ≥ 1, got {value!r}")
    if not (np.isfinite(init) and init >= 0):
        raise ValueError(f"init must be finite and ≥ 0, got {init}")
    return init * _rng(rng).standard_normal((rows, width)) / math.sqrt(rows)


def _train_args(width: int, steps: int, lr: float, init: float, limit: int, name: str) -> None:
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)):
        raise ValueError(f"the {name} must be an integer, got {width!r}")
    if not 1 <= width <= limit:
        raise ValueError(f"the {name} must be in 1…{limit}, got {width}")
    _gd_args(lr, steps)
    if not (np.isfinite(init) and init >= 0):
        raise ValueError(f"needs a finite init ≥ 0, got lr = {lr}, init = {init}")


def _factorised_student(
    gradient, rows: int, width: int, steps: int, lr: float, init: float, seed, name: str
) -> tuple[Array, Array, Array]:
    """(U Vᵀ, U, V) after ``factorised_gd`` on ``gradient`` from ``small_init`` factors U₀, V₀
    (rows × width, drawn in that order from ``seed``); the arguments checked by ``_train_args``
    first, the width named ``name`` in its messages."""
    _train_args(width, steps, lr, init, rows, name)
    rng = _rng(seed)
    u0, v0 = small_init(rows, width, init, rng), small_init(rows, width, init, rng)
    u, v = factorised_gd(gradient, u0, v0, lr, steps)
    return u @ v.T, u, v


def _final_loss(loss: float, lr: float, steps: int) -> float:
    if not math.isfinite(loss):
        raise ValueError(
            f"training diverged: the final empirical risk is not finite ({loss}) after {steps} "
            f"steps with lr = {lr:g}; use a smaller lr (or a smaller init)"
        )
    return loss


def train_static_student(
    x: Array,
    y: Array,
    w: Array,
    width: int | None = None,
    steps: int = 1000,
    lr: float = 0.1,
    init: float = 1e-3,
    seed: int | np.random.Generator = 0,
) -> StudentFit:
    """Factorised static student A = U Vᵀ (U, V ∈ ℝ^{n×m}, m = ``width``, default n: full
    width, no rank constraint) trained by plain gradient descent from a small initialisation
    (``small_init``: iid N(0, init²/n) entries) on the empirical risk
    L(A) = Σ_s ‖A X_s W − Y_s‖_F²/(2S‖W‖_F²) = ½tr(AHAᵀ) − tr(BᵀA) + ½c (``static_statistics``).

    Gradient (closed form): G = ∇_A L = U Vᵀ H − B, ∇_U = G V, ∇_V = Gᵀ U; step
    (U, V) ← (U − lr·GV, V − lr·GᵀU) for ``steps`` steps. Implicit bias (Saxe et al. 2014;
    Gunasekar et al. 2017; Li, Luo & Lyu 2021): from init α a direction whose target singular
    value is s grows like α²e^{2·lr·s·t}, so directions of A* (s = σ_i(A*) with H ≈ I) are
    learned after ≈ log(s/α²)/(2·lr·s) steps while those of the noise (s ≈ 2σ√(n/(S d_v))) stay
    near α²e^{2·lr·s·T}: for T in between, Â has rank r* to within that level, although the
    empirical minimiser BH⁻¹ is full rank. Run long enough, GD converges to BH⁻¹.

    Raises ``ValueError`` for bad arguments (width in 1…n, steps ≥ 0, lr > 0, init ≥ 0) and on
    divergence (non-finite factors or final risk; the message names lr)."""
    stats = static_statistics(x, y, w)
    n = stats.h.shape[0]
    width = n if width is None else width
    a, u, v = _factorised_student(
        lambda a: static_gradient(a, stats.h, stats.b), n, width, steps, lr, init, seed,
        "student width",
    )  # fmt: skip
    with np.errstate(over="ignore", invalid="ignore"):
        loss = 0.5 * float(np.sum((a @ stats.h) * a)) - float(np.sum(stats.b * a)) + 0.5 * stats.c
    return StudentFit(a, u, v, _final_loss(loss, lr, steps))


def train_linear_qk_student(
    x: Array,
    y: Array,
    w_v: Array,
    rank: int,
    steps: int = 1000,
    lr: float = 0.2,
    init: float = 1e-2,
    seed: int | np.random.Generator = 0,
) -> StudentFit:
    """Linear-QK student of QK rank r: K = W_Q W_Kᵀ with W_Q, W_K ∈ ℝ^{d×r}, value map W_V fixed
    and known, trained by plain gradient descent from a small initialisation (iid N(0, init²/d))
    on L(K) = Σ_s ‖(X_sKX_sᵀ/n)X_sW_V − Y_s‖_F²/(2Sn) = ½kᵀ𝓗k − ⟨B, K⟩ + ½c
    (``linear_qk_statistics``).

    Gradient (closed form): G = ∇_K L = Σ_s X_sᵀ(X_sKP_s − Y_s)P_sᵀ/(Sn) = reshape(𝓗k) − B with
    P_s = X_sᵀX_sW_V/n; ∇_{W_Q} = G W_K, ∇_{W_K} = Gᵀ W_Q; step
    (W_Q, W_K) ← (W_Q − lr·GW_K, W_K − lr·GᵀW_Q) for ``steps`` steps. With W_V fixed this is
    reduced-rank regression in K; for r < rank K* no rank-r K reaches the Bayes risk (EB-6).

    Raises ``ValueError`` for bad arguments (rank in 1…d, steps ≥ 0, lr > 0, init ≥ 0) and on
    divergence (non-finite factors or final risk; the message names lr)."""
    stats = linear_qk_statistics(x, y, w_v)
    d = stats.b.shape[0]
    k, u, v = _factorised_student(
        lambda k: linear_qk_gradient(k, stats.hess, stats.b), d, rank, steps, lr, init, seed,
        "QK rank",
    )  # fmt: skip
    with np.errstate(over="ignore", invalid="ignore"):
        quad = float(quadratic_form(k, stats.hess))
        loss = 0.5 * quad - float(np.sum(stats.b * k)) + 0.5 * stats.c
    return StudentFit(k, u, v, _final_loss(loss, lr, steps))
