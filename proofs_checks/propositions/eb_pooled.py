"""EB-7: the data-only frontier for linear QK attention (pooled token regression).

For linear QK attention y_i = W_Vᵀ Σ_j (x_iᵀ K x_j / n) x_j with iid N(0, I_d) tokens, the pooled
regression of y_i on x_i over all tokens has the population coefficient
C_n = W_Vᵀ[Kᵀ + (K + tr(K) I)/n] (the j = i term included, by Isserlis' theorem). Its rank is r*
only in the limit n → ∞ ("even without the value map at scale"); at finite n it carries a tail of
order 1/n (background §5 II-P(a)).
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp
from hypothesis import strategies as st

from proofs_checks.bounds import FLOAT64_U, gamma
from proofs_checks.harness import gaussian_expectation, property_check, seeds
from proofs_checks.propositions.common import CHI2_CUT, root_chi2
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import capacity
from reference.linalg import frobenius

#: Monte Carlo: n = 4 tokens, d = d_v = 4, r* = 2, noise 0.1, S = 2^17 sequences.
MC_N, MC_D, MC_RSTAR, MC_NOISE, MC_S = 4, 4, 2, 0.1, 2**17
#: Spectrum check: d = d_v = 10, r* = 2 (so d ≥ 4r* + 1), n from 1 to 2^20.
SP_D, SP_RSTAR = 10, 2
SP_NS = (1, 2, 4, 16, 64, 256, 1024, 2**14, 2**20)
TAG_MC, TAG_SPEC = 701, 702
#: Property check: d in PROP_D (d_v = d), 1 ≤ r* ≤ (d − 1)/3, 1 ≤ n ≤ PROP_N_MAX, the scale of K
#: 10^PROP_SCALE.
PROP_D, PROP_N_MAX, PROP_SCALE = (4, 12), 10**6, (-3, 3)

CONTROL_TRACE = "the tr(K)·I term dropped: C = W_Vᵀ[Kᵀ + K/n]"
CONTROL_SELF = "the j = i term dropped: C = W_Vᵀ Kᵀ (n − 1)/n"


def claimed(k: np.ndarray, w: np.ndarray, n: int, wrong: str | None = None) -> np.ndarray:
    """The claimed coefficient: ``capacity.pooled_population`` (the implementation), or a
    negative control: "trace" (tr(K) I dropped) or "self" (the j = i term dropped)."""
    if wrong == "trace":
        return w.T @ (k.T + k / n)
    if wrong == "self":
        return w.T @ k.T * ((n - 1) / n)
    return capacity.pooled_population(k, w, n)


# ---------------------------------------------------------------------------------------------
# Symbolic
# ---------------------------------------------------------------------------------------------
def symbolic_isserlis(ctx: Context, wrong: bool) -> Outcome:
    """SymPy with Gaussian moments (``gaussian_expectation``): (i) at d = 4 with a symbolic K
    (16 entries), E[x xᵀ K x xᵀ] = K + Kᵀ + tr(K) I (Isserlis; d = 4 realises every coincidence
    pattern of the four indices of E[x_a x_c x_e x_b]); (ii) at d = d_v = 2 and n = 2, 3 with
    symbolic K and W_V, E[y_1 x_1ᵀ] = W_Vᵀ[Kᵀ + (K + tr(K) I)/n] for
    y_1 = W_Vᵀ Σ_j (x_1ᵀKx_j/n) x_j summed over all j (the j = 1 term included). Control: both
    claims with the tr(K) I term dropped."""
    left = []
    d = 4
    x = sp.Matrix(sp.symbols(f"x0:{d}", real=True))
    k = sp.Matrix(d, d, sp.symbols(f"k0:{d * d}", real=True))
    trace_term = sp.zeros(d, d) if wrong else k.trace() * sp.eye(d)
    moment = gaussian_expectation(x * x.T * k * x * x.T, list(x))
    left.append(moment - (k + k.T + trace_term))
    sizes = [f"d = {d} (Isserlis step)"]
    d = 2
    k = sp.Matrix(d, d, sp.symbols(f"k0:{d * d}", real=True))
    w = sp.Matrix(d, d, sp.symbols(f"w0:{d * d}", real=True))
    ns = (2, 3)
    sizes.append(f"d = d_v = {d}, n ∈ {{{', '.join(map(str, ns))}}} (identity)")
    for n in ns:
        xs = [sp.Matrix(sp.symbols(f"x{j}_0:{d}", real=True)) for j in range(n)]
        y = w.T * sum(((xs[0].T * k * xj)[0, 0] / n * xj for xj in xs), sp.zeros(d, 1))
        coef = gaussian_expectation(y * xs[0].T, [v for xj in xs for v in xj])
        trace_term = sp.zeros(d, d) if wrong else k.trace() * sp.eye(d)
        left.append(coef - w.T * (k.T + (k + trace_term) / n))
    nonzero = sum(1 for e in left if sp.expand(e) != sp.zeros(*e.shape))
    return Outcome(
        nonzero == 0,
        float(nonzero),
        0.0,
        f"{nonzero} of 3 identities left nonzero (d = 4; n = 2, 3)",
        exercised={
            "sizes": "; ".join(sizes),
            "options": "symbolic K and W_V, exact Gaussian moments",
            "dtypes": "exact (SymPy)",
            "seeds": "none (deterministic)",
        },
    )


# ---------------------------------------------------------------------------------------------
# Monte Carlo
# ---------------------------------------------------------------------------------------------
def monte_carlo(ctx: Context, wrong: bool) -> Outcome:
    """``capacity.linear_qk_task`` with n = 4, d = d_v = 4, r* = 2 (flat, K not symmetric), noise
    0.1, S = 2^17 = 131072 sequences, seed [ctx.seed, 701]. Per sequence Z_s = Y_sᵀX_s/n
    (= mean_i y_i x_iᵀ; E[x xᵀ] = I, so E[Z_s] is the pooled-regression coefficient);
    Ĉ = mean Z_s, v̂ = Σ_s‖Z_s − Ĉ‖²/(S(S − 1)), T = ‖Ĉ − C‖²/v̂. By the CLT T ≈ Σ w_j χ²₁ with
    Σ w_j = 1, so P(T > 30) ≤ P(χ²₁ > 30) ≈ 4e-8 (Székely & Bakirov 2003). Pass: √T ≤ √30.
    Control: the claimed C without the j = i term."""
    rng = np.random.default_rng([ctx.seed, TAG_MC])
    task = capacity.linear_qk_task(MC_S, MC_N, MC_D, MC_D, MC_RSTAR, rng, noise=MC_NOISE)
    z = np.swapaxes(task.y, 1, 2) @ task.x / MC_N
    c = claimed(task.kernel, task.value, MC_N, "self" if wrong else None)
    t, se = root_chi2(z, c)
    gap = frobenius(
        claimed(task.kernel, task.value, MC_N) - claimed(task.kernel, task.value, MC_N, "self")
    )
    return Outcome.bound(
        t,
        math.sqrt(CHI2_CUT),
        f"√T = ‖Ĉ − C‖/SE with ‖Ĉ − C‖ = {t * se:.3g}, SE = {se:.3g}; tr K = "
        f"{np.trace(task.kernel):.3g}; the j = i term moves C by {gap:.3g}",
        {
            "sizes": f"n = {MC_N}, d = d_v = {MC_D}, r* = {MC_RSTAR}, noise σ = {MC_NOISE:g}",
            "samples": f"S = {z.shape[0]} sequences",
            "dtypes": "float64",
            "seeds": f"default_rng([{ctx.seed}, {TAG_MC}])",
        },
    )


# ---------------------------------------------------------------------------------------------
# The spectrum of C_n
# ---------------------------------------------------------------------------------------------
def coefficient_tolerance(k: np.ndarray, w: np.ndarray, n: int, u: float = FLOAT64_U) -> float:
    """Bound on |σ_i(fl(C_n)) − σ_i(C_n)| (and on the rounding of the bounds compared with it):
    tr K errs by γ_d Σ|K_ii|; Kᵀ + (K + tI)/n by u-relative additions; the product with W_Vᵀ
    (inner dimension d) by γ_d:
    ‖fl(C) − C‖_F ≤ γ_{d+3}‖W‖_F(‖K‖_F(1 + 1/n) + (|t| + γ_dΣ|K_ii|)√d/n);
    the SVD adds d·u·‖C‖₂ ≤ d·u‖W‖_F(‖K‖_F + |t|√d) and ‖K‖₂ from an SVD errs by d·u‖K‖_F."""
    d = k.shape[0]
    t = abs(float(np.trace(k)))
    nk, nw = frobenius(k), frobenius(w)
    diag = float(np.sum(np.abs(np.diag(k))))
    product = (
        gamma(d + 3, u) * nw * (nk * (1 + 1 / n) + (t + gamma(d, u) * diag) * math.sqrt(d) / n)
    )
    return product + d * u * nw * (nk + t * math.sqrt(d)) + d * u * nk / n


def spectrum_ratio(
    k: np.ndarray, w: np.ndarray, rstar: int, n: int, psd: bool, wrong: bool
) -> float:
    """Worst violation/tolerance of, for C_n with W_V orthogonal (σ_i(C_n) = σ_i(M_n)):
    (a) σ_{d−2r*}(C_n) ≥ |tr K|/n; (b) σ_{r*+1}(C_n) ≤ (‖K‖₂ + |tr K|)/n; (c) for K ⪰ 0,
    σ_min(C_n) ≥ tr K/n; tolerance ``coefficient_tolerance``."""
    d = k.shape[0]
    t = abs(float(np.trace(k)))
    sv = np.linalg.svd(claimed(k, w, n, "trace" if wrong else None), compute_uv=False)
    e = coefficient_tolerance(k, w, n)
    k2 = np.linalg.svd(k, compute_uv=False)[0]
    worst = max((t / n - sv[d - 2 * rstar - 1]) / e, (sv[rstar] - (k2 + t) / n) / e)
    if psd:
        worst = max(worst, (t / n - sv[-1]) / e)
    return worst


def counterexample(n: int, d: int) -> np.ndarray:
    """K = u vᵀ with unit u ⊥̸ v, uᵀv = √(n/(2(n + 1))): tr K ≠ 0 but M_n = Kᵀ + (K + tr(K) I)/n
    is singular (on span{u, v} it acts as [[2c/n, 1/n], [1, c(1 + 1/n)]] of determinant
    (2c²(n + 1) − n)/n² = 0)."""
    c = math.sqrt(n / (2 * (n + 1)))
    u, v = np.zeros(d), np.zeros(d)
    u[0], v[0], v[1] = 1.0, c, math.sqrt(1 - c * c)
    return np.outer(u, v)


def float64_spectrum(ctx: Context, wrong: bool) -> Outcome:
    """d = d_v = 10, r* = 2, W_V orthogonal, seed [ctx.seed, 702], a flat non-symmetric K and a
    decaying PSD K, for n ∈ {1, 2, 4, 16, 64, 256, 1024, 2^14, 2^20}: claims (a)–(c) of
    ``spectrum_ratio``; (d) the limit W_VᵀKᵀ has σ_{r*+1} ≤ tolerance (rank r*) and
    ‖C_n − W_VᵀKᵀ‖_F ≤ ‖K + tr(K) I‖_F/n + tolerance; (e) the rank-one counterexample has
    σ_min(C_16) ≤ tolerance (full rank is not implied by tr K ≠ 0). Residual: worst ratio."""
    rng = np.random.default_rng([ctx.seed, TAG_SPEC])
    w = capacity.orthonormal(SP_D, SP_D, rng)
    kernels = {
        False: capacity.planted_kernel(SP_D, SP_RSTAR, rng),
        True: capacity.planted_kernel(SP_D, SP_RSTAR, rng, "decay", psd=True),
    }
    worst, tails = 0.0, []
    for psd, k in kernels.items():
        limit = w.T @ k.T
        e_inf = coefficient_tolerance(k, w, 2**60)
        worst = max(worst, np.linalg.svd(limit, compute_uv=False)[SP_RSTAR] / e_inf)
        shift = frobenius(k + np.trace(k) * np.eye(SP_D))
        for n in SP_NS:
            worst = max(worst, spectrum_ratio(k, w, SP_RSTAR, n, psd, wrong))
            dist = frobenius(claimed(k, w, n, "trace" if wrong else None) - limit)
            worst = max(worst, (dist - shift / n) / coefficient_tolerance(k, w, n))
        sv = np.linalg.svd(claimed(k, w, 1024), compute_uv=False)
        tails.append(
            f"{'PSD' if psd else 'UVᵀ'}: 1024·σ_(r*+1)(C_1024) = {1024 * sv[SP_RSTAR]:.3f}"
        )
    n_cex = 16
    k = counterexample(n_cex, SP_D)
    sv = np.linalg.svd(claimed(k, w, n_cex), compute_uv=False)
    worst = max(worst, sv[-1] / coefficient_tolerance(k, w, n_cex))
    return Outcome.bound(
        worst,
        1.0,
        f"worst violation/tolerance of (a)–(e); {'; '.join(tails)}; "
        f"counterexample σ_min(C_16) = {sv[-1]:.1e} with tr K = {np.trace(k):.3f}",
        {
            "sizes": (f"d = d_v = {SP_D}, r* = {SP_RSTAR}, n ∈ {{{', '.join(map(str, SP_NS))}}}"),
            "options": (
                f"K flat non-symmetric and decaying PSD ({len(kernels)} kernels); the "
                f"rank-one counterexample at n = {n_cex}"
            ),
            "dtypes": "float64",
            "seeds": f"default_rng([{ctx.seed}, {TAG_SPEC}])",
        },
    )


def property_spectrum(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 4 ≤ d ≤ 12 (d_v = d, W_V orthogonal), 1 ≤ r* ≤ (d − 1)/3, n = 1…10^6,
    K flat non-symmetric or decaying PSD, scale 10^[-3, 3] and seeds: claims (a)–(c) of
    ``spectrum_ratio`` within ``coefficient_tolerance`` (ratio ≤ 1)."""

    def measure(example) -> tuple[float, float]:
        (d, rstar), n, psd, scale_exp, seed = example
        rng = np.random.default_rng([seed, TAG_SPEC])
        w = capacity.orthonormal(d, d, rng)
        k = 10.0**scale_exp * capacity.planted_kernel(
            d, rstar, rng, "decay" if psd else "flat", psd
        )
        return max(spectrum_ratio(k, w, rstar, n, psd, wrong), 0.0), 1.0

    strategy = st.tuples(
        st.integers(*PROP_D).flatmap(lambda d: st.tuples(st.just(d), st.integers(1, (d - 1) // 3))),
        st.integers(1, PROP_N_MAX),
        st.booleans(),
        st.floats(*PROP_SCALE),
        seeds(),
    )
    return property_check(
        ctx,
        strategy,
        measure,
        "violation/tolerance of the tail bounds",
        exercised={
            "sizes": (
                f"{PROP_D[0]} ≤ d ≤ {PROP_D[1]} (d_v = d), 1 ≤ r* ≤ (d − 1)/3, 1 ≤ n ≤ {PROP_N_MAX}"
            ),
            "options": (
                f"K flat non-symmetric or decaying PSD, scale 10^[{PROP_SCALE[0]}, {PROP_SCALE[1]}]"
            ),
            "dtypes": "float64",
        },
    )


register(
    Proposition(
        id="EB-7",
        title="Data-only frontier for linear QK attention: the pooled-regression identity",
        statement=(
            r"Let $x_1,\dots,x_n$ be iid $\mathcal{N}(0,I_d)$, $K\in\mathbb{R}^{d\times d}$ of "
            r"rank $r^*$, $W_V\in\mathbb{R}^{d\times d_v}$ and "
            r"$y_i=W_V^\top\sum_{j=1}^n\tfrac{1}{n}(x_i^\top Kx_j)\,x_j$ (the $j=i$ term "
            r"included). The pooled regression $\hat y=Cx$ has the population coefficient "
            r"$C_n=\mathbb{E}[y_ix_i^\top]=W_V^\top\big[K^\top+\tfrac{1}{n}(K+\operatorname{tr}"
            r"(K)\,I)\big]$, by $\mathbb{E}[xx^\top Kxx^\top]=K+K^\top+\operatorname{tr}(K)\,I$. "
            r"With $M_n=K^\top+(K+\operatorname{tr}(K)I)/n$: $M_n$ acts as "
            r"$\tfrac{\operatorname{tr}K}{n}I$ on $\ker K\cap\ker K^\top$, so "
            r"$\sigma_{d-2r^*}(M_n)\ge|\operatorname{tr}K|/n$, and by Weyl "
            r"$\sigma_{r^*+1}(M_n)\le(\|K\|_2+|\operatorname{tr}K|)/n$: for $d\ge3r^*+1$ and "
            r"$\operatorname{tr}K\ne0$ the tail is exactly of order $1/n$ and "
            r"$\operatorname{rank}M_n\ge d-2r^*>r^*$ at every finite $n$. $M_n$ is nonsingular "
            r"for every $n$ when $K\succeq0$, $K\ne0$, and for generic $K$, but not for every $K$ "
            r"with $\operatorname{tr}K\ne0$ ($K=uv^\top$ with unit $u$, $v$ and "
            r"$u^\top v=\sqrt{n/(2(n+1))}$). As "
            r"$n\to\infty$, $C_n\to W_V^\top K^\top$, of rank $r^*$ for orthogonal $W_V$."
        ),
        hypotheses=(
            "tokens iid N(0, I_d), independent across positions and sequences",
            "linear QK attention A(X) = X K Xᵀ/n, noise (if any) independent with mean zero",
            "the tail bounds: d ≥ 3r* + 1 and tr K ≠ 0; W_V orthogonal",
            "checked: the Isserlis step symbolically at d = 4 (every coincidence pattern of the "
            "four indices); the identity symbolically at d = d_v = 2, n = 2, 3 (symbolic K, W_V) "
            "and by Monte Carlo at n = d = d_v = 4; the spectral claims at d = 10 for n = 1…2^20 "
            "and at 4 ≤ d ≤ 12, n ≤ 10^6, with a flat non-symmetric and a decaying PSD K",
        ),
        remarks=(
            r"For $W_V$ of full row rank $d$, Ostrowski's theorem gives "
            r"$\sigma_{\min}(W_V)\sigma_i(M_n)\le\sigma_i(C_n)\le\|W_V\|_2\sigma_i(M_n)$, "
            r"so the order-$1/n$ tail and the rank carry over; the checks run orthogonal $W_V$ "
            r"only.",
        ),
        checks=(
            Check(
                "symbolic",
                "Isserlis step and the identity at n = 2, 3",
                symbolic_isserlis,
                CONTROL_TRACE,
            ),
            Check("float64", "Monte Carlo, S = 2^17, χ² criterion", monte_carlo, CONTROL_SELF),
            Check("float64", "1/n tail, full rank, limit rank r*", float64_spectrum, CONTROL_TRACE),
            Check("property", "tail bounds over d, r*, n, scale", property_spectrum, CONTROL_TRACE),
        ),
        seeds=(
            "numpy default_rng([seed, 701]) (Monte Carlo: S = 2^17 sequences of n = 4 tokens), "
            "[seed, 702] (spectrum and property cases, Hypothesis drawing the seed); the "
            "certificate's seed defaults to 0"
        ),
    )
)
