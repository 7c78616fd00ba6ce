"""Capacity of token mixing: rank estimators, planted tasks, pre-training estimators, trainers.

This is the float64 reference for the Entropic-Bound propositions (DESIGN §6, EB-1…EB-8; the
reconstruction in ``background/entropic_bound.md``). A sequence is X ∈ ℝ^{n×d} (rows are tokens
x_i), the value map is W_V ∈ ℝ^{d×d_v}, and the output is Y = A·X·W_V + σE with a token-mixing
operator A ∈ ℝ^{n×n}:

- static surrogate: A = A* is an input-independent parameter of rank r*;
- linear QK attention: A(X) = X K Xᵀ / n with K = W_Q W_Kᵀ ∈ ℝ^{d×d};
- softmax attention: A(X) = rowsoftmax(β X K Xᵀ / √d).

Batches of sequences are arrays X of shape (S, n, d) and Y of shape (S, n, d_v). Every public
function validates its input and raises ``ValueError`` naming the problem and the measured value,
except the four algebraic kernels of the trainers (``static_gradient``, ``linear_qk_gradient``,
``quadratic_form``, ``factor_gradients``): they also run on object arrays of exact SymPy numbers
(the symbolic checks of EB-3 and EB-6) and inside the training loops, so they are pure algebra and
say so; their callers (``factorised_gd`` and the ``train_*`` front ends) validate.

Four groups of functions:

1. **Estimators on a spectrum** σ₁ ≥ σ₂ ≥ … ≥ σ_m ≥ 0 (any order is accepted and sorted):
   ``numerical_rank``, ``energy_threshold_rank``, ``energy_effective_rank``, ``roy_vetterli_rank``,
   ``stable_rank``, ``largest_gap_rank`` and its floor for attention ``attention_gap_floor`` (the
   rule of ``rattn rank``); ``estimate_all`` returns all of them. Plus the Marchenko–Pastur count
   of token-Gram eigenvalues, ``token_gram_count``.
2. **Planted tasks** with a known rank r*: ``static_task``, ``linear_qk_task``, ``softmax_task``
   (seeded; flat or decaying spectra; a PSD option for the kernel) and the closed forms of the
   static surrogate (``static_excess_risk``, ``deficiency_bound``, ``truncated_mixer``) and of the
   pooled regression (``pooled_population``).
3. **Pre-training estimators** (from data, before any training): ``token_gram`` and
   ``token_gram_count``, ``ols_static_mixer``, ``pooled_regression``, ``first_order_softmax`` and
   ``inversion_estimator``.
4. **Trainers** (EB-3, EB-6): plain gradient descent on factorised students with closed-form
   gradients, ``static_statistics``/``linear_qk_statistics`` (sufficient statistics of the
   empirical risk), ``static_gradient``, ``linear_qk_gradient``, ``quadratic_form``,
   ``factor_gradients``, ``factorised_gd``, ``small_init`` and the front ends
   ``train_static_student`` and ``train_linear_qk_student``. Divergence (a step too large for the
   problem) raises ``ValueError`` naming lr and the step or loss measured; no trainer returns NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.linalg

from reference.linalg import qr_signfixed

Array = np.ndarray
EPS = float(np.finfo(np.float64).eps)

#: Quantiles of the Tracy–Widom law TW₁ (real case), from the tables of Bejan (2005) and
#: Tracy & Widom (1996): P(TW₁ ≤ q) for the keys below.
TRACY_WIDOM_1 = {0.90: 0.4501, 0.95: 0.9793, 0.99: 2.0234}


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def _matrix(a: Array, name: str) -> Array:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a matrix (2-D array), got shape {a.shape}")
    if a.size and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has {int(np.sum(~np.isfinite(a)))} non-finite entries")
    return a


def _sequences(a: Array, name: str) -> Array:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 3:
        raise ValueError(f"{name} must have shape (S, n, features), got shape {a.shape}")
    if min(a.shape) < 1:
        raise ValueError(f"{name} is empty: shape {a.shape}")
    bad = int(np.sum(~np.isfinite(a)))
    if bad:
        raise ValueError(f"{name} has {bad} non-finite entries (NaN or inf)")
    return a


def _pair(x: Array, y: Array) -> tuple[Array, Array]:
    x, y = _sequences(x, "X"), _sequences(y, "Y")
    if x.shape[:2] != y.shape[:2]:
        raise ValueError(f"X and Y must share (S, n): X has shape {x.shape}, Y has shape {y.shape}")
    return x, y


def spectrum(s: Array | Sequence[float]) -> Array:
    """A validated spectrum: 1-D, finite, non-negative, sorted in decreasing order (a copy)."""
    s = np.asarray(s, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"a spectrum must be a 1-D array of singular values, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"a spectrum has {int(np.sum(~np.isfinite(s)))} non-finite values")
    if s.size and s.min() < 0:
        raise ValueError(f"singular values must be ≥ 0, got min {s.min():.3g}")
    return np.sort(s)[::-1].copy()


def singular_values(z: Array) -> Array:
    """σ(Z) in decreasing order (LAPACK SVD: each σ_i within ~m·u·‖Z‖₂ of the exact value)."""
    z = _matrix(z, "Z")
    if z.size == 0:
        return np.zeros(0)
    return np.linalg.svd(z, compute_uv=False)


def _scaled(s: Array) -> Array:
    """σ/σ₁ (ratios are all the estimators need; avoids overflow of Σσ² for huge σ)."""
    return s / s[0]


# ---------------------------------------------------------------------------------------------
# 1. Estimators on a spectrum
# ---------------------------------------------------------------------------------------------
def numerical_rank(s: Array | Sequence[float], tau: float = 1e-3) -> int:
    """Numerical rank at relative threshold τ: #{i : σ_i > τ·σ₁} (0 for a zero spectrum).

    Bias: every noise singular value above τσ₁ counts, so a noisy full-rank estimate of a rank-r
    operator gives m once the noise exceeds τσ₁ (over-estimate; the usual failure under softmax
    or finite-n tails); a decaying spectrum loses its directions below τσ₁ (under-estimate).
    Scale invariant.
    """
    s = spectrum(s)
    if not 0.0 <= tau < 1.0:
        raise ValueError(f"tau must be in [0, 1), got {tau}")
    if s.size == 0 or s[0] == 0.0:
        return 0
    return int(np.sum(s > tau * s[0]))


def energy_threshold_rank(s: Array | Sequence[float], eta: float = 0.9) -> int:
    """Energy-threshold rank r_η = min{k : Σ_{i≤k} σ_i² ≥ η Σ_i σ_i²} (0 for a zero spectrum).

    The partial sums are compared with a relative slack of m·ε (m values, ε = 2^-52), so that an
    exact tie (ηr an integer for a flat spectrum) resolves to the smaller k in floating point.
    Bias: r_η ≤ rank, and for a flat spectrum of rank r, r_η = ⌈ηr⌉ exactly, so r_0.9 < r once
    r ≥ 10 and r_0.99 < r once r ≥ 100; a decaying spectrum is under-counted (its weak directions
    carry little energy). Squaring suppresses small tails: a noise tail of total energy below
    (1 − η)Σσ² does not count, which is why r_η resists the softmax and finite-n tails.
    """
    s = spectrum(s)
    if not 0.0 < eta <= 1.0:
        raise ValueError(f"eta must be in (0, 1], got {eta}")
    if s.size == 0 or s[0] == 0.0:
        return 0
    e = np.square(_scaled(s))
    cum = np.cumsum(e)
    target = eta * cum[-1] * (1.0 - s.size * EPS)
    return int(np.argmax(cum >= target)) + 1


def _entropy_rank(p: Array) -> float:
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


def energy_effective_rank(s: Array | Sequence[float]) -> float:
    """Energy (entropy) effective rank erank_E = exp(−Σ e_i log e_i), e_i = σ_i²/Σ_j σ_j².

    (0 log 0 := 0; a zero spectrum gives 0.) 1 ≤ erank_E ≤ rank, with equality erank_E = r iff
    the r nonzero σ are equal. Bias: below the rank for any unequal spectrum (σ = (3, 2.5, 2, 1.5)
    gives 3.571); squaring the weights makes it insensitive to small tails (a tail of energy
    fraction δ spread over k values adds about δ·(1 + log(k/δ)) to log erank_E).
    """
    s = spectrum(s)
    if s.size == 0 or s[0] == 0.0:
        return 0.0
    e = np.square(_scaled(s))
    return _entropy_rank(e / np.sum(e))


def roy_vetterli_rank(s: Array | Sequence[float]) -> float:
    """Roy–Vetterli effective rank (EUSIPCO 2007): exp(−Σ p_i log p_i), p_i = σ_i/Σ_j σ_j.

    (0 for a zero spectrum.) 1 ≤ erank_RV ≤ rank, equality iff the nonzero σ are equal;
    erank_RV ≥ erank_E (the L1 weights are flatter). Bias: σ enters linearly, so a small
    full-rank tail inflates it much more than erank_E: σ = (3, 2.5, 2, 1.5) gives 3.876, and
    twenty extra values of 0.008 raise it to 4.356 (erank_E moves by < 0.01).
    """
    s = spectrum(s)
    if s.size == 0 or s[0] == 0.0:
        return 0.0
    p = _scaled(s)
    return _entropy_rank(p / np.sum(p))


def stable_rank(s: Array | Sequence[float]) -> float:
    """Stable rank ‖Z‖_F²/‖Z‖₂² = Σσ_i²/σ₁² (0 for a zero spectrum).

    1 ≤ stable rank ≤ rank, equality iff flat. Bias: dominated by σ₁, so it strongly
    under-estimates a decaying spectrum (σ = (3, 2.5, 2, 1.5) gives 21.5/9 = 2.389).
    """
    s = spectrum(s)
    if s.size == 0 or s[0] == 0.0:
        return 0.0
    return float(np.sum(np.square(_scaled(s))))


def largest_gap_rank(s: Array | Sequence[float], floor: float = 0.0) -> int:
    """Largest-gap rank k̂ = argmax_{1≤k<m} σ_k / max(σ_{k+1}, floor) (the first maximiser).

    Only k with σ_k > floor are candidates (0 when σ₁ ≤ floor; 1 when m = 1 and σ₁ > floor).
    With floor = 0 a zero σ_{k+1} after a positive σ_k is an infinite gap, so an exactly rank-r
    spectrum gives r. A positive floor (a noise level) stops a noise bulk below it from creating
    a gap. Bias: never returns m (for m ≥ 2): full rank must be read from another estimator;
    without a floor, the ratio of the smallest singular values of a square noise matrix is
    heavy-tailed (σ_min of a Gaussian n×n matrix has a density linear at 0), so a spurious gap at
    the end of the spectrum can win; for a smoothly decaying spectrum without a gap the answer is
    arbitrary. Scale invariant when the floor scales with σ.
    """
    s = spectrum(s)
    if not (np.isfinite(floor) and floor >= 0.0):
        raise ValueError(f"floor must be finite and ≥ 0, got {floor}")
    m = s.size
    if m == 0 or s[0] == 0.0 or s[0] <= floor:
        return 0
    if m == 1:
        return 1
    num, den = s[:-1], np.maximum(s[1:], floor)
    ratio = np.zeros(m - 1)
    ratio[(num > floor) & (den == 0)] = np.inf  # floor = 0 and an exact zero follows
    ok = (num > floor) & (den > 0)
    ratio[ok] = num[ok] / den[ok]
    return int(np.argmax(ratio)) + 1


def attention_gap_floor(s: Array | Sequence[float], standard_error: float, n: int) -> float:
    """The floor of the largest-gap rank under attention: max(standard_error, σ₁/n).

    This is the rule of ``rattn rank`` for ``--attention linear`` and ``softmax``, and the rule
    that EB-4 (b) and EB-8 certify: ``largest_gap_rank(s, attention_gap_floor(s, SE, n))`` with
    ``s`` the singular values of the pooled (or first-order) coefficient, SE its cluster-robust
    standard error and n the number of tokens per sequence. Values below the floor cannot make a
    gap. Reason for each term: SE bounds the sampling error of every singular value (Weyl) at the
    one-standard-error level; σ₁/n covers the finite-n tail of EB-7, since the pooled population
    coefficient W_Vᵀ[Kᵀ + (K + tr(K) I)/n] has rank r* only as n → ∞ and its tail singular values
    are of order (‖K‖₂ + |tr K|)/n (σ_{r*+1} ≤ (‖K‖₂ + |tr K|)/n by Weyl), i.e. of order σ₁/n.

    Validation: ``s`` a finite non-negative 1-D spectrum (σ₁ = 0 when it is empty or zero),
    ``standard_error`` finite and ≥ 0, ``n`` an integer ≥ 1; otherwise ``ValueError``.
    """
    s = spectrum(s)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n (tokens per sequence) must be an integer ≥ 1, got {n!r}")
    if not (np.isfinite(standard_error) and standard_error >= 0.0):
        raise ValueError(f"standard_error must be finite and ≥ 0, got {standard_error}")
    top = float(s[0]) if s.size else 0.0
    return max(float(standard_error), top / int(n))


def estimate_all(
    s: Array | Sequence[float], tau: float = 1e-3, floor: float = 0.0
) -> dict[str, float]:
    """Every spectrum estimator at once: numerical rank at τ and 1e-2, r_0.9, r_0.99, erank_E,
    erank_RV, stable rank and the largest-gap rank with the given floor."""
    s = spectrum(s)
    return {
        f"numerical_rank(tau={tau:g})": numerical_rank(s, tau),
        "numerical_rank(tau=0.01)": numerical_rank(s, 1e-2),
        "energy_threshold_rank(eta=0.9)": energy_threshold_rank(s, 0.9),
        "energy_threshold_rank(eta=0.99)": energy_threshold_rank(s, 0.99),
        "energy_effective_rank": energy_effective_rank(s),
        "roy_vetterli_rank": roy_vetterli_rank(s),
        "stable_rank": stable_rank(s),
        "largest_gap_rank": largest_gap_rank(s, floor),
    }


# ---------------------------------------------------------------------------------------------
# Marchenko–Pastur count on the token Gram
# ---------------------------------------------------------------------------------------------
def mp_edge(noise: float, p: int, dof: int) -> float:
    """Upper edge of the Marchenko–Pastur law of W/N for W ~ Wishart_p(N, noise·I):
    noise·(1 + √(p/N))² (N = ``dof``)."""
    if p < 1 or dof < 1:
        raise ValueError(f"needs p ≥ 1 and dof ≥ 1, got p = {p}, dof = {dof}")
    return noise * (1.0 + math.sqrt(p / dof)) ** 2


def tracy_widom_threshold(noise: float, p: int, dof: int, quantile: float = 0.99) -> float:
    """The ``quantile`` of the largest eigenvalue of W/N, W ~ Wishart_p(N, noise·I), from the
    Tracy–Widom approximation of Johnstone (2001): λ₁(W)/noise ≈ μ + σ·TW₁ with
    μ = (√(N − ½) + √(p − ½))², σ = (√(N − ½) + √(p − ½))(1/√(N − ½) + 1/√(p − ½))^{1/3}.
    It lies above the Marchenko–Pastur edge by q·σ/N: O(N^{-2/3}) relative when p ∝ N, and
    ≈ q·p^{-1/6}N^{-1/2} for fixed p (q the TW₁ quantile)."""
    if quantile not in TRACY_WIDOM_1:
        raise ValueError(f"quantile must be one of {sorted(TRACY_WIDOM_1)}, got {quantile}")
    if p < 1 or dof < 1:
        raise ValueError(f"needs p ≥ 1 and dof ≥ 1, got p = {p}, dof = {dof}")
    a, b = math.sqrt(dof - 0.5), math.sqrt(p - 0.5)
    mu = (a + b) ** 2
    sigma = (a + b) * (1 / a + 1 / b) ** (1 / 3)
    return noise * (mu + TRACY_WIDOM_1[quantile] * sigma) / dof


def token_gram(y: Array) -> Array:
    """Token Gram G = Σ_s Y_s Y_sᵀ / (S·d_v) ∈ ℝ^{n×n} (symmetric PSD).

    For the static surrogate Y = A*XW* + σE with X = C^{1/2}Z: G → (‖W*‖_F²/d_v)·A*CA*ᵀ + σ²I,
    whose eigenvalues are (‖W*‖_F²/d_v)σ_i²(A*C^{1/2}) + σ² (background I-P). Its compression
    to the complement of range(A*) is exactly the noise Gram, a Wishart_n(S·d_v, σ²I)/(S·d_v).
    """
    y = _sequences(y, "Y")
    s, n, dv = y.shape
    flat = np.swapaxes(y, 0, 1).reshape(n, s * dv)
    g = flat @ flat.T / (s * dv)
    return 0.5 * (g + g.T)


class GramCount(NamedTuple):
    rank: int  #: number of eigenvalues above ``threshold``
    eigenvalues: Array  #: of the token Gram, decreasing
    noise: float  #: estimated σ² (mean of the eigenvalues not counted)
    threshold: float  #: the count's threshold (Tracy–Widom quantile of the noise's λ_max)


def token_gram_count(y: Array, quantile: float = 0.99) -> GramCount:
    """Count of token-Gram eigenvalues above the noise's largest-eigenvalue quantile.

    G = ``token_gram(Y)`` has eigenvalues λ₁ ≥ … ≥ λ_n. With k eigenvalues counted, the noise
    level is estimated as σ̂² = mean(λ_{k+1}, …, λ_n) (the mean of a Wishart_p(N, σ²I)/N spectrum
    is σ²), and the count becomes #{λ_i > ``tracy_widom_threshold``(σ̂², n, S·d_v, quantile)}
    (≈ σ̂²(1 + √(n/(S d_v)))², the Marchenko–Pastur edge, plus the Tracy–Widom margin); starting
    from k = 0 this is repeated to its fixed point (k never decreases, so at most n rounds).
    Eigenvalues below n·ε·λ₁ (rounding) never count, and k ≤ n − 1.

    Justification: by Cauchy interlacing, λ_{r*+1}(G) ≤ λ_max of the noise Gram compressed to
    range(A*)^⊥, a Wishart of dimension n − r* ≤ n, so at the true σ² the probability of counting
    a noise eigenvalue is ≤ 1 − quantile (asymptotically). Bias: σ̂² is slightly low (the trailing
    eigenvalues of G interlace below those of the compression, by at most r*·(bulk width)/(n − r*)),
    which errs towards over-counting when n − r* is small; signal eigenvalues with
    (‖W*‖²/d_v)σ_i²(A*C^{1/2}) below ≈ σ²·2√(n/(S d_v)) are lost (under-count); the noise must be
    iid across tokens. Needs no knowledge of W*. Only for static mixing: under input-conditioned
    attention G tends to a·I + b·11ᵀ (EB-5), whatever rank K is, and its finite-sample
    fluctuations are not iid noise, so the count says nothing about the kernel's rank.
    """
    y = _sequences(y, "Y")
    s, n, dv = y.shape
    lam = np.linalg.eigvalsh(token_gram(y))[::-1]
    tiny = n * EPS * max(lam[0], 0.0)
    k, noise, threshold = 0, 0.0, 0.0
    for _ in range(n):
        noise = float(np.mean(lam[k:]))
        threshold = max(tracy_widom_threshold(max(noise, 0.0), n, s * dv, quantile), tiny)
        k_new = min(int(np.sum(lam > threshold)), n - 1)
        if k_new <= k:
            break
        k = k_new
    return GramCount(k, lam, noise, threshold)


# ---------------------------------------------------------------------------------------------
# 2. Planted tasks
# ---------------------------------------------------------------------------------------------
def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


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


# ---------------------------------------------------------------------------------------------
# 3. Pre-training estimators
# ---------------------------------------------------------------------------------------------
def ols_static_mixer(x: Array, y: Array) -> Array:
    """The least-squares static mixer Â = (Σ_s Y_s X_sᵀ)(Σ_s X_s X_sᵀ)^{-1} ∈ ℝ^{n×n} of the model
    Y ≈ A X (needs d_v = d and S·d ≥ n).

    Consistent for A* when Y = A*X + E (W* = I). With a general W*, E[YXᵀ] = tr(W*)·A*C, so it is
    diluted by tr(W*). Under input-conditioned attention with exchangeable tokens it tends to
    a·I + b·11ᵀ whatever the kernel's rank (EB-5), so no estimator applied to it recovers r*.
    """
    x, y = _pair(x, y)
    if x.shape[2] != y.shape[2]:
        raise ValueError(
            f"the static mixer Y ≈ A X needs d_v = d, got d = {x.shape[2]}, d_v = {y.shape[2]}"
        )
    s, n, d = x.shape
    if s * d < n:
        raise ValueError(f"Σ X Xᵀ is singular: needs S·d ≥ n, got S·d = {s * d} < n = {n}")
    xf = np.swapaxes(x, 0, 1).reshape(n, s * d)
    gyx = np.swapaxes(y, 0, 1).reshape(n, s * d) @ xf.T
    gxx = xf @ xf.T
    return np.linalg.solve(gxx.T, gyx.T).T


class Regression(NamedTuple):
    coef: Array  #: d_v × d (``first_order_softmax``: the coefficient on x_i)
    stderr: float  #: cluster-robust estimate of ‖coef − E coef‖_F (sequence clusters)
    mean_coef: Array | None = None  #: ``first_order_softmax`` only: the coefficient on x̄


def _ols(z: Array, y: Array, block: int | None = None) -> tuple[Array, float]:
    """OLS of y (S, n, q) on features z (S, n, p): the coefficient B (q × p) of y ≈ B z, and the
    sequence-level cluster-robust (sandwich) error of its first ``block`` columns (all by
    default): sqrt(Σ_s ‖[(Σ_i e_i z_iᵀ) H^{-1}]_{:, :block}‖_F²), H = Σ z zᵀ, e the residuals.
    (Ĉ − C = Σ_s (Σ_i e_i z_iᵀ) H^{-1} with independent sequences; H^{-1} treated as fixed.)"""
    s, n, p = z.shape
    zz = z.reshape(s * n, p)
    h = zz.T @ zz
    lam = np.linalg.eigvalsh(h)
    if lam[-1] <= 0.0 or lam[0] <= p * EPS * lam[-1]:
        ratio = lam[0] / lam[-1] if lam[-1] > 0 else 0.0
        raise ValueError(
            f"the token design is rank deficient (λ_min/λ_max of Σ z zᵀ = {ratio:.2e} for {p} "
            "features): more sequences, or tokens that are not all zero, are needed"
        )
    coef = np.linalg.solve(h, zz.T @ y.reshape(s * n, -1)).T
    resid = y - z @ coef.T
    clusters = np.swapaxes(z, 1, 2) @ resid  # (Σ_i e_i z_iᵀ)ᵀ, p × q per sequence
    err = np.linalg.solve(h, clusters)[:, :block, :]  # rows of H^{-1}(Σ z eᵀ) = columns of B
    return coef, float(np.sqrt(np.sum(np.square(err))))


def pooled_regression(x: Array, y: Array) -> Regression:
    """Pooled token regression (linear QK attention, value map unknown): Ĉ = argmin Σ‖y_i − C x_i‖²
    over all tokens of all sequences, Ĉ = (Σ y xᵀ)(Σ x xᵀ)^{-1} ∈ ℝ^{d_v×d}.

    For linear QK attention with iid N(0, I) tokens, Ĉ → W_Vᵀ[Kᵀ + (K + tr(K)I)/n] (EB-7): rank
    r* only as n → ∞, with a tail of singular values of order (‖K‖₂ + |tr K|)/n at finite n (the
    j = i term), and up to 2r* values of order ‖K‖/n when K is not symmetric. ``stderr`` is the
    sequence-level cluster-robust (sandwich) estimate of the sampling error ‖Ĉ − E Ĉ‖_F, which
    bounds the sampling error of every singular value (Weyl) at the one-standard-error level.
    """
    x, y = _pair(x, y)
    return Regression(*_ols(x, y))


def first_order_softmax(x: Array, y: Array) -> Regression:
    """First-order (Stein) softmax estimator: regress y_i on [x_i, x̄] (x̄ the sequence mean).

    As β → 0, rowsoftmax(βL) ≈ (1 + β(ℓ_ij − ℓ̄_i))/n, so y_i ≈ W_Vᵀx̄ + (β/√d) W_Vᵀ S_c Kᵀ x_i with
    S_c the centred token covariance: the coefficient on x_i (``coef``) has rank r* up to O(1/n)
    and O(β²) terms, the one on x̄ (``mean_coef``) ≈ W_Vᵀ to first order. Bias: with a PSD part
    in K (tokens attend to themselves) the output carries W_Vᵀx_i and the value map's full rank
    leaks into ``coef``: recovery is only partial, and energy estimators over-count as β grows
    (background §6 P4c). Needs S > d (x̄ varies only across sequences).
    """
    x, y = _pair(x, y)
    s, _, d = x.shape
    if s <= d:
        raise ValueError(f"the first-order estimator needs S > d sequences, got S = {s}, d = {d}")
    xbar = np.broadcast_to(x.mean(axis=1, keepdims=True), x.shape)
    coef, err = _ols(np.concatenate([x, xbar], axis=2), y, block=d)
    return Regression(coef[:, :d], err, coef[:, d:])


def inversion_estimator(
    x: Array, y: Array, w_v: Array, beta: float = 1.0, floor: float = 1e-12
) -> Array:
    """Inversion estimator (softmax attention, value map W_V known): K̂ ∈ ℝ^{d×d}.

    Per sequence Â_s = Y_s (X_s W_V)^+, which equals A_s exactly (without noise) iff X_s W_V has
    full row rank n. That needs **n ≤ d_v** (and, since rank X_s W_V ≤ rank W_V ≤ min(d, d_v),
    n ≤ d as well; background §5 states n ≤ d_v for d ≥ d_v). Otherwise A is identified only
    modulo {B : B X W_V = 0}, of dimension n(n − rank X W_V) ≥ n(n − d_v), so this function
    **raises ValueError** naming n and d_v (or n and d, or the measured σ_min/σ_max of X_s W_V);
    it never returns an unidentified estimate. Then L̂ = log max(Â, floor), centred by rows
    (softmax is invariant to row shifts: log A · J = βXKXᵀJ/√d with J = I − 11ᵀ/n), and K̂
    solves Σ_s ‖L̂_s J − (β/√d) X_s K (J X_s)ᵀ‖_F² in least squares (d² unknowns; the stacked
    design must have rank d², raised otherwise). Bias: the log amplifies the noise of small
    probabilities (nonlinear inversion), and entries of Â ≤ 0 from noise are clipped at
    ``floor``; recovery is partial at large β or large noise.
    """
    x, y = _pair(x, y)
    w_v = _matrix(w_v, "W_V")
    s, n, d = x.shape
    dv = y.shape[2]
    if w_v.shape != (d, dv):
        raise ValueError(f"W_V must be d×d_v = {d}×{dv}, got shape {w_v.shape}")
    if n > dv:
        raise ValueError(
            f"the inversion estimator needs n ≤ d_v to identify the mixing matrix, got n = {n} > "
            f"d_v = {dv}: A is then determined only modulo a {n * (n - dv)}-dimensional set"
        )
    if n > d:
        raise ValueError(
            f"the inversion estimator needs n ≤ d (rank X_s W_V ≤ d), got n = {n} > d = {d}"
        )
    if not (np.isfinite(beta) and beta != 0):
        raise ValueError(f"beta must be finite and nonzero, got {beta}")
    if not (floor > 0):
        raise ValueError(f"floor must be > 0, got {floor}")
    xw = x @ w_v
    sv = np.linalg.svd(xw, compute_uv=False)
    worst = float(np.min(sv[:, -1] / sv[:, 0]))
    if worst <= n * EPS:
        raise ValueError(
            f"X_s W_V is rank deficient for some sequence (σ_min/σ_max = {worst:.2e}): "
            "A is not identified"
        )
    a_hat = y @ np.linalg.pinv(xw)
    logs = np.log(np.maximum(a_hat, floor))
    lc = logs - logs.mean(axis=2, keepdims=True)
    xc = x - x.mean(axis=1, keepdims=True)
    design = (beta / math.sqrt(d)) * np.einsum("sia,sjb->sijab", x, xc).reshape(s * n * n, d * d)
    sol, _, rank, _ = np.linalg.lstsq(design, lc.reshape(s * n * n), rcond=None)
    if rank < d * d:
        raise ValueError(
            f"K is not identified: the stacked design has rank {rank} < d² = {d * d} "
            f"(S·n(n − 1) = {s * n * (n - 1)} equations); more sequences are needed"
        )
    return sol.reshape(d, d)


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
    _train_args(width, steps, lr, init, n, "student width")
    rng = _rng(seed)
    u0, v0 = small_init(n, width, init, rng), small_init(n, width, init, rng)
    u, v = factorised_gd(lambda a: static_gradient(a, stats.h, stats.b), u0, v0, lr, steps)
    a = u @ v.T
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
    _train_args(rank, steps, lr, init, d, "QK rank")
    rng = _rng(seed)
    u0, v0 = small_init(d, rank, init, rng), small_init(d, rank, init, rng)
    u, v = factorised_gd(lambda k: linear_qk_gradient(k, stats.hess, stats.b), u0, v0, lr, steps)
    k = u @ v.T
    with np.errstate(over="ignore", invalid="ignore"):
        quad = float(quadratic_form(k, stats.hess))
        loss = 0.5 * quad - float(np.sum(stats.b * k)) + 0.5 * stats.c
    return StudentFit(k, u, v, _final_loss(loss, lr, steps))
