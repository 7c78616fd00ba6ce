"""EB-3: recovery of r* by gradient descent from a small initialisation (static surrogate).

Background §3 I-R: a full-width factorised student A = U Vᵀ (U, V ∈ ℝ^{n×n}, no rank constraint)
trained by plain gradient descent from a small initialisation learns the singular directions of
the target one at a time (Saxe, McClelland & Ganguli 2014; Gunasekar et al. 2017; Li, Luo & Lyu
2021). A direction whose empirical target value is s grows like α²e^{2ηst}: the planted directions
(s = σ_i(A*)) are learned after ≈ log(s/α²)/(2ηs) steps, while the noise directions of the
empirical cross-covariance (s ≤ ε ≈ 2σ√(n/(S·d_v))) stay at ≈ α²e^{2ηεT}. Between the two time
scales the learned Â has rank r* to that level, although the empirical risk minimiser BH⁻¹ is
full rank. The trainer is ``reference.capacity.train_static_student`` (closed-form gradients,
checked exactly against SymPy below).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy as sp

from proofs_checks.propositions import binomial
from proofs_checks.propositions.common import (
    asymmetric_draw,
    exact,
    factorised_gradient_check,
    symbol_matrix,
)
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import capacity

#: Planted task: n = 12 tokens, d = d_v = 16 (W* orthogonal, known), r* = 3 with
#: σ(A*) = (2, 1.5, 1), noise σ = 0.1, S = 500 sequences.
N, D, RSTAR, NOISE, S = 12, 16, 3, 0.1, 500
SPEC = (2.0, 1.5, 1.0)
#: Gradient descent: full width m = n, init α = 1e-3 (U₀, V₀ iid N(0, α²/n)), step η = 0.1 (H ≈ I,
#: so η·2σ₁(A*)·λ_max(H) < 1), T = 1000 steps. Time scales: the weakest planted direction (s = 1)
#: is learned after log(1/α²)/(2η) ≈ 69 steps; the noise (ε ≈ 2σ√(n/(S d_v)) ≈ 0.0077) grows by at
#: most e^{2ηεT} ≈ 4.7, to ≈ 5e-6 ≪ τσ₁ = 2e-3.
WIDTH, INIT, LR, STEPS = N, 1e-3, 0.1, 1000
#: The negative control: the same training from a large initialisation α = 1.
CONTROL_INIT = 1.0
#: Numerical-rank threshold τ (relative to σ₁) and the energy thresholds of the criterion.
TAU, ETAS = 1e-3, (0.9, 0.99)
#: Independent replicates (numpy default_rng([seed, 301, i]), i = 0…k − 1), judged by the exact
#: binomial test of ``binomial``.
REPLICATES = binomial.REPLICATES
TAG, TAG_INIT, TAG_SYM = 301, 302, 303

CONTROL = "a large initialisation α = 1 (the same data, step and number of steps)"
CONTROL_GRADIENT = "the transpose dropped in the chain rule: ∇_V = G U instead of Gᵀ U"


def replicate_statistics(seed: int) -> tuple[np.ndarray, np.ndarray, list, list]:
    """The REPLICATES planted tasks of one certificate seed: stacked H, B (``static_statistics``),
    the planted A* and W* of each."""
    hs, bs, mixers, values = [], [], [], []
    for i in range(REPLICATES):
        task = capacity.static_task(
            S, N, D, D, RSTAR, np.random.default_rng([seed, TAG, i]), noise=NOISE, spec=SPEC
        )
        stats = capacity.static_statistics(task.x, task.y, task.value)
        hs.append(stats.h)
        bs.append(stats.b)
        mixers.append(task.mixer)
        values.append(task.value)
    return np.array(hs), np.array(bs), mixers, values


def train(h: np.ndarray, b: np.ndarray, init: float, seed: int) -> np.ndarray:
    """The students of all replicates at once (``capacity.factorised_gd`` batched over the
    leading axis; the same update as ``capacity.train_static_student``)."""
    rng = np.random.default_rng([seed, TAG_INIT])
    u0 = np.array([capacity.small_init(N, WIDTH, init, rng) for _ in range(REPLICATES)])
    v0 = np.array([capacity.small_init(N, WIDTH, init, rng) for _ in range(REPLICATES)])
    u, v = capacity.factorised_gd(lambda a: capacity.static_gradient(a, h, b), u0, v0, LR, STEPS)
    return u @ np.swapaxes(v, 1, 2)


def gd_recovery(ctx: Context, wrong: bool) -> Outcome:
    """Statistical criterion over 100 independent replicates (default_rng([seed, 301, i])): n = 12,
    d = d_v = 16, r* = 3, σ(A*) = (2, 1.5, 1), noise 0.1, S = 500; full-width student (m = n)
    trained by plain GD, α = 1e-3, η = 0.1, T = 1000. A replicate passes when the learned Â has
    numerical rank (τ = 1e-3) = r_0.9 = r_0.99 = r* AND excess risk ℰ(Â) ≤ ℰ(BH⁻¹), the excess
    of the empirical minimiser, AND BH⁻¹ has rank n (numpy's ``matrix_rank``: σ_n above
    n·2⁻⁵²·σ₁) and numerical rank above r* at the same τ (its noise directions sit near τσ₁, some
    above it and some below, so it is not of rank r* to that level). Pass:
    P(criterion) ≥ 0.9 by the exact binomial test (``binomial``: at least 96 of 100; residual =
    the failing replicates). Control: α = 1, from
    which the noise directions are not suppressed: by T they approach (do not reach) the
    empirical minimiser's level ≈ 2σ√(n/(S d_v)) ≈ 0.008, well above τσ₁ = 0.002."""
    h, b, mixers, values = replicate_statistics(ctx.seed)
    init = CONTROL_INIT if wrong else INIT
    a = train(h, b, init, ctx.seed)
    misses, tails, ratios, ranks, erm_ranks, full_ranks = 0, [], [], [], [], 0
    for i in range(REPLICATES):
        sv = np.linalg.svd(a[i], compute_uv=False)
        erm = np.linalg.solve(h[i].T, b[i].T).T
        excess = capacity.static_excess_risk(a[i], mixers[i], values[i])
        floor = capacity.static_excess_risk(erm, mixers[i], values[i])
        rank = capacity.numerical_rank(sv, TAU)
        energy = [capacity.energy_threshold_rank(sv, eta) for eta in ETAS]
        erm_rank = capacity.numerical_rank(np.linalg.svd(erm, compute_uv=False), TAU)
        full = np.linalg.matrix_rank(erm) == N
        ok = (
            rank == RSTAR
            and all(e == RSTAR for e in energy)
            and excess <= floor
            and full
            and erm_rank > RSTAR
        )
        erm_ranks.append(erm_rank)
        full_ranks += full
        misses += not ok
        tails.append(sv[RSTAR] / sv[0])
        ratios.append(excess / floor)
        ranks.append(rank)
    outcome = binomial.at_least(
        REPLICATES - misses,
        f"recover r* = {RSTAR} (α = {CONTROL_INIT if wrong else INIT:g}; numerical ranks "
        f"{binomial.tally(ranks)}; of BH⁻¹ {binomial.tally(erm_ranks)}, of rank n in "
        f"{full_ranks}; "
        f"σ_(r*+1)/σ₁ ∈ [{min(tails):.1e}, {max(tails):.1e}] (τ = {TAU:g}); "
        f"ℰ(Â)/ℰ(BH⁻¹) ∈ [{min(ratios):.3f}, {max(ratios):.3f}] "
        f"; dof ratio r*(2n − r*)/n² = {RSTAR * (2 * N - RSTAR) / N**2:.3f})",
    )
    spec = ", ".join(f"{v:g}" for v in SPEC)
    # binomial.at_least builds the Outcome; what this run exercised is attached here.
    return dataclasses.replace(
        outcome,
        exercised={
            "sizes": (
                f"n = {N}, d = d_v = {D}, r* = {RSTAR}, σ(A*) = ({spec}), noise σ = {NOISE:g}, "
                f"S = {S}"
            ),
            "options": (
                f"width m = {WIDTH}, α = {init:g}, η = {LR:g}; τ = {TAU:g}, "
                f"η_E ∈ {{{', '.join(f'{e:g}' for e in ETAS)}}}"
            ),
            "steps": STEPS,
            "replicates": len(ranks),
            "dtypes": "float64",
            "seeds": (
                f"default_rng([{ctx.seed}, {TAG}, i]) for i = 0…{len(ranks) - 1}, "
                f"[{ctx.seed}, {TAG_INIT}] for the initial factors"
            ),
        },
    )


def symbolic_gradient(ctx: Context, wrong: bool) -> Outcome:
    """Exact check of the trainer's closed-form gradient: S = 2 sequences, n = d = d_v = 2,
    width m = 2, small integer X_s, Y_s (seed [ctx.seed, 303]; a draw whose closed-form gradient is
    symmetric is redrawn: ``common.asymmetric_draw``) and W = [[1, 1], [1, −1]] (so
    S‖W‖_F² = 8 and ``static_statistics`` is exact in float64). With symbolic U, V, SymPy
    differentiates the raw risk Σ_s ‖UVᵀX_sW − Y_s‖_F²/(2S‖W‖_F²); it must equal
    ``factor_gradients(static_gradient(UVᵀ, H, B), U, V)`` = (G V, Gᵀ U) entry by entry, and the
    risk must equal ½tr(AHAᵀ) − tr(BᵀA) + ½c (``common.factorised_gradient_check``). Residual:
    number of nonzero differences (0)."""
    s, n, m = 2, 2, 2
    w = np.array([[1.0, 1.0], [1.0, -1.0]])
    u, v = symbol_matrix("u", n, m), symbol_matrix("v", n, m)
    draws = []

    def draw(rng: np.random.Generator):
        draws.append(rng)
        x = rng.integers(-3, 4, (s, n, n)).astype(float)
        y = rng.integers(-3, 4, (s, n, n)).astype(float)
        stats = capacity.static_statistics(x, y, w)
        return x, y, stats, exact(stats.h), exact(stats.b)

    x, y, stats, h, b = asymmetric_draw(
        ctx.seed, TAG_SYM, draw, lambda data: capacity.static_gradient(u @ v.T, *data[3:])
    )
    scale = s * int(np.sum(w * w))

    def raw_risk(a: np.ndarray) -> sp.Expr:
        return sum(
            sp.Matrix(a @ exact(x[t]) @ exact(w) - exact(y[t])).norm() ** 2 for t in range(s)
        ) / (2 * scale)

    def closed_risk(a: np.ndarray) -> sp.Expr:
        quad = sp.Matrix(a @ h).multiply_elementwise(sp.Matrix(a))
        linear = sp.Matrix(b).multiply_elementwise(sp.Matrix(a))
        return sum(quad) / 2 - sum(linear) + sp.Rational(stats.c) / 2

    outcome = factorised_gradient_check(
        u,
        v,
        raw_risk,
        closed_risk,
        lambda a: capacity.static_gradient(a, h, b),
        wrong,
    )
    # common.factorised_gradient_check builds the Outcome; what it exercised is attached here.
    return dataclasses.replace(
        outcome,
        exercised={
            "sizes": f"S = {s}, n = d = d_v = {n}, width m = {m} (symbolic U, V)",
            "dtypes": "exact (SymPy)",
            "seeds": _draw_seeds(ctx.seed, TAG_SYM, len(draws)),
        },
    )


def _draw_seeds(seed: int, tag: int, draws: int) -> str:
    """The streams ``common.asymmetric_draw`` drew from: [seed, tag], then [seed, tag, a]."""
    text = f"default_rng([{seed}, {tag}])"
    if draws > 1:
        text += f", then [{seed}, {tag}, a] for a = 1…{draws - 1} (symmetric draws redrawn)"
    return text


register(
    Proposition(
        id="EB-3",
        title="Recovery of r* by gradient descent from small initialisation (static surrogate)",
        statement=(
            r"Let $Y_s=A^*X_sW^*+\sigma E_s$ ($s=1,\dots,S$) with $\operatorname{rank}A^*=r^*$, "
            r"$X_s,E_s$ with iid $\mathcal{N}(0,1)$ entries and $W^*$ orthogonal and known. The "
            r"full-width factorised student $A=UV^\top$, $U,V\in\mathbb{R}^{n\times n}$ (no rank "
            r"constraint), is trained by plain gradient descent "
            r"$(U,V)\leftarrow(U-\eta GV,\,V-\eta G^\top U)$, $G=UV^\top H-B$, on "
            r"$L(A)=\sum_s\|AX_sW^*-Y_s\|_F^2/(2S\|W^*\|_F^2)=\tfrac12\operatorname{tr}(AHA^\top)"
            r"-\operatorname{tr}(B^\top A)+\text{const}$ from $U_0,V_0$ with iid "
            r"$\mathcal{N}(0,\alpha^2/n)$ entries. Statistical claim (checked): at $n=12$, "
            r"$d=d_v=16$, $r^*=3$, $\sigma(A^*)=(2,1.5,1)$, $\sigma=0.1$, $S=500$, "
            r"$\alpha=10^{-3}$, $\eta=0.1$, $T=1000$, the learned $\hat A$ has numerical rank "
            r"($\tau=10^{-3}$) $=r_{0.9}=r_{0.99}=r^*$, although the empirical minimiser "
            r"$BH^{-1}$ has rank $n$ and numerical rank above $r^*$ at the same $\tau$, and "
            r"excess risk "
            r"$\mathcal{E}(\hat A)=\|W^*\|_F^2\|\hat A-A^*\|_F^2\le\mathcal{E}(BH^{-1})$, "
            + binomial.CLAIM
            + r"; from $\alpha=1$ (the check's control) the same test fails."
        ),
        remarks=(
            r"Why small initialisation: for $T$ between the two time scales, "
            r"$\log(\sigma_{r^*}(A^*)/\alpha^2)/(2\eta\sigma_{r^*}(A^*))\ll T$ and "
            r"$\alpha^2e^{2\eta\varepsilon T}\ll\tau\sigma_1(A^*)$ with "
            r"$\varepsilon\approx2\sigma\sqrt{n/(Sd_v)}$ the noise level of $B$, the signal "
            r"directions are learned and the noise directions not yet, so $\mathcal{E}(\hat A)$ "
            r"is about the fraction $r^*(2n-r^*)/n^2$ (the dimension of the rank-$r^*$ manifold) "
            r"of $\mathcal{E}(BH^{-1})$. From $\alpha=1$ the noise directions approach those of "
            r"$BH^{-1}$ by $T$.",
        ),
        hypotheses=(
            "tokens and noise iid N(0, 1), independent across sequences; W* known, orthogonal",
            "α, η and T as stated (the remark says why they lie between the two time scales)",
            "plain simultaneous GD, no momentum, no weight decay; step η·2σ₁(A*)·λ_max(H) < 1",
            binomial.HYPOTHESIS,
        ),
        checks=(
            Check(
                "symbolic",
                "closed-form gradient of the factorised trainer",
                symbolic_gradient,
                CONTROL_GRADIENT,
            ),
            Check("float64", "GD from α = 1e-3 recovers r*, P ≥ 0.9", gd_recovery, CONTROL),
        ),
        seeds=(
            "numpy default_rng([seed, 301, i]) for the planted task of replicate i = 0…99, "
            "[seed, 302] for the initial factors, [seed, 303] for the symbolic case; the "
            "certificate's seed defaults to 0"
        ),
    )
)
