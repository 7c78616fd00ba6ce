"""Rank estimators on a spectrum, and the count of the token Gram's eigenvalues above its noise.

Group 1 of ``reference.capacity``. Estimators on a spectrum σ₁ ≥ σ₂ ≥ … ≥ σ_m ≥ 0 (any order is
accepted and sorted): ``numerical_rank``, ``energy_threshold_rank``, ``energy_effective_rank``,
``roy_vetterli_rank``, ``stable_rank``, ``largest_gap_rank`` and its floor for attention
``attention_gap_floor`` (the rule of ``rattn rank``); ``estimate_all`` returns all of them. Then
the Marchenko–Pastur edge ``mp_edge`` and the Tracy–Widom threshold ``tracy_widom_threshold`` of
a Wishart's largest eigenvalue, the token Gram ``token_gram`` (a pre-training statistic, read from
the outputs alone) and the count of its eigenvalues above the noise, ``token_gram_count``
(returning a ``GramCount``). The bias of each estimator is stated in its docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from reference.capacity.largest_root import largest_root_quantile
from reference.capacity.validation import EPS, Array, _sequences, spectrum

#: Quantiles of the Tracy–Widom law TW₁ (real case), from the tables of Bejan (2005) and
#: Tracy & Widom (1996): P(TW₁ ≤ q) for the keys below.
TRACY_WIDOM_1 = {0.90: 0.4501, 0.95: 0.9793, 0.99: 2.0234}


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


def attention_gap_floor(s: Array | Sequence[float], noise: float, n: int) -> float:
    """The floor of the largest-gap rank under attention: max(noise, σ₁/n).

    This is the rule of ``rattn rank`` for ``--attention linear`` and ``softmax``, and the rule
    that EB-4 (b) and EB-8 certify: ``largest_gap_rank(s, attention_gap_floor(s, edge, n))``
    with ``s`` the singular values of the pooled (or first-order) coefficient Ĉ, ``edge`` the
    95% quantile of its sampling error's spectral norm ‖Ĉ − E Ĉ‖₂ (``noise_edge``) and n the
    number of tokens per sequence. Values below the floor cannot make a gap. Reason for each
    term: by Weyl no singular value moves by more than ‖Ĉ − E Ĉ‖₂, so a value of E Ĉ that is 0
    stays below the edge with probability ≥ 95%; σ₁/n covers the finite-n tail of EB-7, since
    the pooled population coefficient W_Vᵀ[Kᵀ + (K + tr(K) I)/n] has rank r* only as n → ∞ and
    its tail singular values are of order (‖K‖₂ + |tr K|)/n (σ_{r*+1} ≤ (‖K‖₂ + |tr K|)/n by
    Weyl), i.e. of order σ₁/n; a tail above σ₁/n (|tr K| > ‖K‖₂, e.g. a PSD K) is a plateau
    that the largest gap separates from the signal.

    Validation: ``s`` a finite non-negative 1-D spectrum (σ₁ = 0 when it is empty or zero),
    ``noise`` finite and ≥ 0, ``n`` an integer ≥ 1; otherwise ``ValueError``.
    """
    s = spectrum(s)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n (tokens per sequence) must be an integer ≥ 1, got {n!r}")
    if not (np.isfinite(noise) and noise >= 0.0):
        raise ValueError(f"noise must be finite and ≥ 0, got {noise}")
    top = float(s[0]) if s.size else 0.0
    return max(float(noise), top / int(n))


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
    rank: int  #: number of eigenvalues counted
    eigenvalues: Array  #: of the token Gram, decreasing
    #: mean of the eigenvalues not counted: σ²·(N − rank)/N once the counted ones are strong
    noise: float
    #: the value the last eigenvalue tested had to exceed: λ_{rank+1}'s, or, when rank = n − 1,
    #: the one λ_{n−1} passed
    threshold: float
    #: the value each tested eigenvalue had to exceed, λ₁'s first (the counted ones passed theirs)
    thresholds: tuple[float, ...]


def token_gram_count(y: Array, quantile: float = 0.99) -> GramCount:
    """Sequential count of token-Gram eigenvalues above the noise's largest root.

    G = ``token_gram(Y)`` has eigenvalues λ₁ ≥ … ≥ λ_n; N = S·d_v. With k eigenvalues counted
    (k = 0, 1, …), λ_{k+1} is counted when

        λ_{k+1} > c_k·mean(λ_{k+2}, …, λ_n),  c_k = ``largest_root_quantile``(n − k, N − k, q),

    the ``quantile`` of λ₁/mean(λ₂, …) of a Wishart_{n−k}(N − k, I); the count stops at the first
    eigenvalue that fails (or at n − 1). Eigenvalues below n·ε·λ₁ (rounding) never count.

    Justification: when exactly k directions are planted (H_k), G's compression to the
    complement of range(A*) is σ²·Wishart_{n−k}(N)/N, and once those k directions stand well above
    the noise G's last n − k eigenvalues are those of σ²·Wishart_{n−k}(N − k)/N (each counted
    direction takes one degree of freedom), so λ_{k+1}/mean(λ_{k+2}, …) tends to the law c_k is
    read from: under H_k the count goes past k with probability at most 1 − ``quantile``,
    reached as the counted directions grow (1% by default, ± the quantile's Monte Carlo error
    of 0.1%; at finite signal the test is conservative). The ratio needs no estimate of σ² and
    no asymptotics (the earlier count's Tracy–Widom threshold with σ̂² = the mean of all
    eigenvalues, λ₁ included, was exceeded by 0.55% of null draws at n = 16, not 1%). Bias: a
    direction whose
    eigenvalue stands within the null's spread of the noise edge is missed (under-count near
    the BBP edge √(n/N), more so when several such directions inflate the mean of the rest);
    the noise must be iid across tokens. Needs no knowledge of W*. Only for static mixing:
    under input-conditioned attention G tends to a·I + b·11ᵀ (EB-5), whatever rank K is, and
    its finite-sample fluctuations are not Wishart, so the count says nothing about the
    kernel's rank.
    """
    y = _sequences(y, "Y")
    s, n, dv = y.shape
    if s * dv < n:
        raise ValueError(f"the token-Gram count needs S·d_v ≥ n, got S·d_v = {s * dv}, n = {n}")
    lam = np.linalg.eigvalsh(token_gram(y))[::-1]
    tiny = n * EPS * max(lam[0], 0.0)
    k, thresholds = 0, []
    while k < n - 1:
        root = largest_root_quantile(n - k, s * dv - k, quantile)
        thresholds.append(max(root * float(np.mean(lam[k + 1 :])), tiny))
        if not lam[k] > thresholds[-1]:
            break
        k += 1
    last = thresholds[-1] if thresholds else tiny  # n = 1: nothing to test
    return GramCount(k, lam, float(np.mean(lam[k:])), last, tuple(thresholds))
