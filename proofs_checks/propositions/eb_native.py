"""EB-6: attention-native deficiency and achievability of the QK rank for linear QK attention.

Background §5 II-D/II-A. Teacher y = (XK*Xᵀ/n)XW_V + σE with rank K* = r*; students of QK rank r,
K = W_QW_Kᵀ (W_Q, W_K ∈ ℝ^{d×r}), with the value map fixed to the teacher's W_V (known,
orthogonal): a clean reduced-rank regression in K. With P_s = X_sᵀX_sW_V/n the prediction is
X_sKP_s, so the risk is a quadratic in K: for any sequences, Σ_s‖X_sΔP_s‖²/(Sn) = vec(Δ)ᵀ𝓗vec(Δ)
with 𝓗 = Σ_s X_sᵀX_s ⊗ P_sP_sᵀ/(Sn) (``capacity.linear_qk_statistics``), and 𝓗 → I_{d²} as
n → ∞. Hence, on held-out sequences with Gram 𝓗', for every K of rank ≤ r (Eckart–Young–Mirsky):
  ℰ_rel(K) := q'(K − K*)/q'(K*) ≥ (λ_min(𝓗')/λ_max(𝓗'))·Σ_{i>r}σ_i²(K*)/‖K*‖_F²,
the n → ∞ prediction Σ_{i>r}σ_i²/‖K*‖² corrected by the finite-n condition number κ(𝓗') → 1.
The truncation [K*]_r attains it within the same factor: ℰ_rel([K*]_r) ≤ κ(𝓗')·Σ_{i>r}σ_i²/‖K*‖²
(q'(K* − [K*]_r) ≤ λ_max Σ_{i>r}σ_i² and q'(K*) ≥ λ_min‖K*‖²).
The trainer is ``reference.capacity.train_linear_qk_student`` (closed-form gradients, checked
exactly against SymPy below).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import sympy as sp

from proofs_checks.bounds import FLOAT64_U
from proofs_checks.propositions import binomial
from proofs_checks.propositions.common import (
    asymmetric_draw,
    exact,
    factorised_gradient_check,
    symbol_matrix,
)
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import capacity

#: Teacher: d = d_v = 8, n = 32 tokens, r* = 3, flat K* = UVᵀ (Haar U, V), W_V orthogonal,
#: noise σ = 0.1; S = 400 training and S' = 400 held-out sequences.
D, N, RSTAR, NOISE, S_TRAIN, S_TEST = 8, 32, 3, 0.1, 400, 400
#: Gradient descent on (W_Q, W_K): init α = 1e-2 (iid N(0, α²/d)), step η = 0.2 (λ_max(𝓗) ≈ 2 and
#: ‖K*‖₂ = 1, so η·2‖K*‖₂·λ_max < 1), T = 500 steps (a direction of value 1 is learned after
#: ≈ log(1/α²)/(2η) ≈ 23 steps).
INIT, LR, STEPS = 1e-2, 0.2, 500
#: Deficiency: every r < r*. Achievability: r = r* and r* + 1.
DEFICIENT = tuple(range(1, RSTAR))
ACHIEVING = (RSTAR, RSTAR + 1)
#: Replicates: numpy default_rng([seed, 601, i]), i = 0…k − 1; achievability is judged for each
#: r in ACHIEVING by the exact binomial test of ``binomial``.
REPLICATES = binomial.REPLICATES
TAG, TAG_INIT, TAG_SYM = 601, 602, 603

CONTROL_DEFICIENCY = (
    "the rank hypothesis violated: the trained student of rank r + 1 held to the rank-r bound"
)
CONTROL_ACHIEVABILITY = "a student of QK rank r* − 1 claimed to reach the floor"
CONTROL_GRADIENT = "the transpose dropped in the chain rule: ∇_{W_K} = G W_Q instead of Gᵀ W_Q"


@functools.lru_cache(maxsize=4)
def replicates(seed: int) -> tuple[np.ndarray, ...]:
    """Stacked over the replicates: the training 𝓗 and B, the held-out 𝓗', the planted K*.
    Cached per seed (the data are a deterministic function of the seed; arrays are read-only)."""
    hess, b, hess_test, kernels = [], [], [], []
    for i in range(REPLICATES):
        task = capacity.linear_qk_task(
            S_TRAIN + S_TEST, N, D, D, RSTAR, np.random.default_rng([seed, TAG, i]), noise=NOISE
        )
        train = capacity.linear_qk_statistics(task.x[:S_TRAIN], task.y[:S_TRAIN], task.value)
        test = capacity.linear_qk_statistics(task.x[S_TRAIN:], task.y[S_TRAIN:], task.value)
        hess.append(train.hess)
        b.append(train.b)
        hess_test.append(test.hess)
        kernels.append(task.kernel)
    out = tuple(np.array(a) for a in (hess, b, hess_test, kernels))
    for a in out:
        a.setflags(write=False)
    return out


def students(seed: int, rank: int) -> np.ndarray:
    """The GD-trained rank-r students K̂_r of all replicates (``capacity.factorised_gd`` batched
    over replicates; the same update as ``capacity.train_linear_qk_student``)."""
    hess, b, _, _ = replicates(seed)
    rng = np.random.default_rng([seed, TAG_INIT, rank])
    u0 = np.array([capacity.small_init(D, rank, INIT, rng) for _ in range(REPLICATES)])
    v0 = np.array([capacity.small_init(D, rank, INIT, rng) for _ in range(REPLICATES)])
    u, v = capacity.factorised_gd(
        lambda k: capacity.linear_qk_gradient(k, hess, b), u0, v0, LR, STEPS
    )
    return u @ np.swapaxes(v, 1, 2)


def eckart_young(kernels: np.ndarray, r: int) -> np.ndarray:
    """Σ_{i>r}σ_i²(K*)/‖K*‖_F² per replicate (the n → ∞ relative excess of the best rank r)."""
    sv2 = np.square(np.linalg.svd(kernels, compute_uv=False))
    return sv2[:, r:].sum(axis=1) / sv2.sum(axis=1)


def rounding_allowance(kappa: float) -> float:
    """5·d⁴·u·κ: a first-order bound on the relative rounding error of every ratio of the
    deficiency check, with N = d² = 64 the dimension of 𝓗' (PSD) and u = 2⁻⁵³. A quadratic form
    q'(Δ) = vᵀ𝓗'v is two rounds of inner products of length N: its error is ≤ γ_{2N}|v|ᵀ|𝓗'||v|,
    and |v|ᵀ|𝓗'||v| ≤ tr(𝓗')‖v‖² ≤ Nλ_max‖v‖² (|𝓗'_ij| ≤ √(𝓗'_ii𝓗'_jj) for PSD 𝓗') against
    q'(Δ) ≥ λ_min‖v‖²: relatively ≤ 2N²uκ, twice (q'(K − K*) and q'(K*)). κ from the backward
    stable ``eigvalsh`` (|δλ| ≤ N·u·λ_max per eigenvalue) errs relatively by ≤ 2Nuκ, and the sums
    of σ_i²(K*) by ≤ 4du. Total ≤ 4N²uκ + 2Nuκ + 4du ≤ 5N²uκ = 5d⁴uκ (≈ 4e-12 at κ ≈ 1.9)."""
    return 5 * D**4 * FLOAT64_U * kappa


def _exercised(ctx: Context, replicates: int, options: str) -> dict[str, object]:
    """What a float64 check of EB-6 ran: the teacher's sizes, the ranks and students
    (``options``), the GD steps, and the replicate streams it read."""
    return {
        "sizes": (
            f"d = d_v = {D}, n = {N}, r* = {RSTAR}, noise σ = {NOISE:g}, S = {S_TRAIN} training "
            f"+ S' = {S_TEST} held-out sequences"
        ),
        "options": options,
        "steps": STEPS,
        "replicates": replicates,
        "dtypes": "float64",
        "seeds": (
            f"default_rng([{ctx.seed}, {TAG}, i]) for i = 0…{replicates - 1}, "
            f"[{ctx.seed}, {TAG_INIT}, r] for the initial factors"
        ),
    }


def _ranks(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


#: The other rank-r kernels of ``deficiency``: the truncation's factors moved by this fraction of
#: their norm, and a random kernel; seed [seed, TAG_OTHERS, r].
PERTURBATION, TAG_OTHERS = 0.1, 604


def others(
    seed: int, r: int, left: np.ndarray, right: np.ndarray, kernels: np.ndarray
) -> dict[str, np.ndarray]:
    """Two more rank-r kernels per replicate: ``perturbed`` = (L + δ‖L‖G₁)(R + δ‖R‖G₂) with
    [K*]_r = LR, δ = PERTURBATION, G₁, G₂ Gaussian of unit Frobenius norm; and ``random`` = AB
    (A, B Gaussian) scaled to ‖K*‖_F."""
    rng = np.random.default_rng([seed, TAG_OTHERS, r])

    def unit(shape: tuple[int, ...]) -> np.ndarray:
        g = rng.standard_normal(shape)
        return g / np.linalg.norm(g, axis=(-2, -1), keepdims=True)

    def moved(f: np.ndarray) -> np.ndarray:
        return f + PERTURBATION * np.linalg.norm(f, axis=(-2, -1), keepdims=True) * unit(f.shape)

    product = unit(left.shape) @ unit(right.shape)
    scale = np.linalg.norm(kernels, axis=(-2, -1)) / np.linalg.norm(product, axis=(-2, -1))
    return {"perturbed": moved(left) @ moved(right), "random": product * scale[:, None, None]}


def deficiency(ctx: Context, wrong: bool) -> Outcome:
    """A theorem checked on data: on the 100 replicates (default_rng([seed, 601, i])) of d = d_v =
    8, n = 32, r* = 3 (flat K* = UVᵀ), noise 0.1, S = 400 training and 400 held-out sequences, every
    r < r* and four rank-r kernels (GD-trained K̂_r, α = 1e-2, η = 0.2, T = 500; the truncation
    [K*]_r; ``perturbed``: [K*]_r with its factors moved by 10%; and a random rank-r kernel of K*'s
    norm, seed [seed, 604, r]): the lower bound (D) ℰ_rel(K) = q'(K − K*)/q'(K*) ≥ EY_r/κ(𝓗'), EY_r
    = Σ_{i>r}σ_i²/‖K*‖²; and, for the truncation, the upper bound ℰ_rel([K*]_r) ≤ κ·EY_r (q'(K* −
    [K*]_r) ≤ λ_max·Σ_{i>r}σ_i² and q'(K*) ≥ λ_min‖K*‖²). The two-sided sandwich pins EY_r, κ and
    the truncation: an EY_r too small (e.g. EY_{r+1}) passes the lower bound and fails the upper
    one. Both bounds hold for every PSD 𝓗', so neither can see a wrong Kronecker order or scale of
    𝓗' (the ratios are scale free); that is caught exactly by the symbolic check's risk identity
    ½vec(K)ᵀ𝓗vec(K) − ⟨B, K⟩ + ½c (all 9 entries differ when the order is swapped). Residual: the
    largest of (EY_r/κ)/ℰ_rel over all kernels and ℰ_rel/(κ·EY_r) over the truncations, each ≤ 1 by
    the theorem, collected in one array so that a NaN anywhere fails the check; tolerance 1 +
    ``rounding_allowance``(κ_max) = 1 + 5d⁴uκ_max (the derived first-order rounding bound). Control:
    the trained student of rank r + 1 held to the rank-r bound."""
    _, _, hess_test, kernels = replicates(ctx.seed)
    lam = np.linalg.eigvalsh(hess_test)
    kappa = lam[:, -1] / lam[:, 0]
    q0 = capacity.quadratic_form(kernels, hess_test)
    u, s, vt = np.linalg.svd(kernels)
    lower, upper, rows = [], [], []
    for r in DEFICIENT:
        trained = students(ctx.seed, r + 1 if wrong else r)
        truncated = (u[:, :, :r] * s[:, None, :r]) @ vt[:, :r]
        ey = eckart_young(kernels, r)
        candidates = {"trained": trained, "[K*]_r": truncated}
        candidates.update(others(ctx.seed, r, u[:, :, :r] * s[:, None, :r], vt[:, :r], kernels))
        for name, k in candidates.items():
            if wrong and name != "trained":
                continue
            rel = capacity.quadratic_form(k - kernels, hess_test) / q0
            lower.append(ey / kappa / rel)
            if name == "[K*]_r":
                upper.append(rel / (kappa * ey))
            rows.append(
                f"r = {r}, {name}{' (rank r + 1)' if wrong else ''}: ℰ_rel/EY_r ∈ "
                f"[{np.min(rel / ey):.3f}, {np.max(rel / ey):.3f}]"
            )
    lower_worst = float(np.max(np.concatenate(lower)))
    upper_worst = float(np.max(np.concatenate(upper))) if upper else float("-inf")
    worst = float(np.max(np.concatenate(lower + upper)))  # np.max propagates NaN; max() does not
    tol = 1.0 + rounding_allowance(float(kappa.max()))
    return Outcome.bound(
        worst,
        tol,
        f"max (EY_r/κ)/ℰ_rel = {lower_worst:.3g}"
        + (f", max ℰ_rel([K*]_r)/(κ·EY_r) = {upper_worst:.3g}" if upper else "")
        + f"; κ(𝓗') ∈ [{kappa.min():.3f}, {kappa.max():.3f}]; "
        + "; ".join(rows)
        + f"; rounding allowance 5d⁴uκ_max = {tol - 1.0:.1e} (d⁴ = {D**4})",
        _exercised(
            ctx,
            len(kernels),
            f"r ∈ {{{_ranks(DEFICIENT)}}}: GD-trained K̂_r (α = {INIT:g}, η = {LR:g}), [K*]_r, "
            f"[K*]_r with its factors moved by {PERTURBATION:g}, a random rank-r kernel "
            f"(seed [{ctx.seed}, {TAG_OTHERS}, r])",
        ),
    )


def achievability(ctx: Context, wrong: bool) -> Outcome:
    """Statistical criterion on the 100 replicates of the deficiency check: for r = r* and
    r* + 1, the GD-trained K̂_r (α = 1e-2, η = 0.2, T = 500) reaches the estimation floor,
    q'(K̂_r − K*) ≤ q'(K_LS − K*) with K_LS = 𝓗⁻¹B the unconstrained (full-rank) least-squares
    kernel, whose expected in-sample excess per token is σ²d²/(Sn): the test risk is then within
    a factor ≈ 1 + d²/(S n d_v) = 1.0006 of the noise floor σ²d_v. Pass: P(criterion) ≥ 0.9
    for each r by the exact binomial test (``binomial``; residual = the larger number of
    misses). Control: r = r* − 1."""
    hess, b, hess_test, kernels = replicates(ctx.seed)
    flat = np.linalg.solve(hess, b.reshape(REPLICATES, D * D, 1))
    floor = capacity.quadratic_form(flat.reshape(REPLICATES, D, D) - kernels, hess_test)
    q0 = capacity.quadratic_form(kernels, hess_test)
    fewest, rows = REPLICATES, []
    ranks = (RSTAR - 1,) if wrong else ACHIEVING
    for r in ranks:
        excess = capacity.quadratic_form(students(ctx.seed, r) - kernels, hess_test)
        ratio = excess / floor
        hits = int(np.sum(ratio <= 1.0))
        fewest = min(fewest, hits)
        rows.append(
            f"r = {r}: {hits} at the floor, "
            f"ℰ(K̂_r)/ℰ(K_LS) ∈ [{ratio.min():.3g}, {ratio.max():.3g}], "
            f"ℰ_rel(K̂_r) ≤ {np.max(excess / q0):.2e}"
        )
    outcome = binomial.at_least(
        fewest,
        "; ".join(rows) + f"; ℰ_rel(K_LS) ≤ {np.max(floor / q0):.2e}; dof ratio r*(2d − r*)/d² = "
        f"{RSTAR * (2 * D - RSTAR) / D**2:.3f}; the fewest",
    )
    # binomial.at_least builds the Outcome; what this run exercised is attached here.
    options = f"r ∈ {{{_ranks(ranks)}}}: GD-trained K̂_r (α = {INIT:g}, η = {LR:g}) against K_LS"
    return dataclasses.replace(outcome, exercised=_exercised(ctx, len(kernels), options))


def symbolic_gradient(ctx: Context, wrong: bool) -> Outcome:
    """Exact check of the trainer's closed-form gradient: S = 2 sequences, n = d = d_v = 2,
    QK rank r = 2, small integer X_s, Y_s, W_V (seed [ctx.seed, 603]; n = 2 and S·n = 4 make
    ``linear_qk_statistics`` exact in float64; a draw whose closed-form gradient is symmetric,
    where the control could not show, is redrawn: ``common.asymmetric_draw``). With symbolic
    W_Q, W_K, SymPy differentiates the raw risk Σ_s ‖(X_sKX_sᵀ/n)X_sW_V − Y_s‖_F²/(2Sn),
    K = W_QW_Kᵀ; it must equal ``factor_gradients(linear_qk_gradient(K, 𝓗, B), W_Q, W_K)``
    entry by entry, and the risk must equal ½vec(K)ᵀ𝓗vec(K) − ⟨B, K⟩ + ½c
    (``common.factorised_gradient_check``). Residual: number of nonzero differences (0)."""
    s, n, d, r = 2, 2, 2, 2
    q, k = symbol_matrix("q", d, r), symbol_matrix("k", d, r)
    draws = []

    def draw(rng: np.random.Generator):
        draws.append(rng)
        x = rng.integers(-2, 3, (s, n, d)).astype(float)
        y = rng.integers(-2, 3, (s, n, d)).astype(float)
        w = rng.integers(-2, 3, (d, d)).astype(float)
        stats = capacity.linear_qk_statistics(x, y, w)
        return x, y, w, stats, exact(stats.hess), exact(stats.b)

    x, y, w, stats, hess, b = asymmetric_draw(
        ctx.seed, TAG_SYM, draw, lambda data: capacity.linear_qk_gradient(q @ k.T, *data[4:])
    )

    def raw_risk(k: np.ndarray) -> sp.Expr:
        risk = 0
        for t in range(s):
            xt = exact(x[t])
            pred = xt @ k @ xt.T @ xt @ exact(w) / n
            risk += sp.Matrix(pred - exact(y[t])).norm() ** 2
        return risk / (2 * s * n)

    def closed_risk(k: np.ndarray) -> sp.Expr:
        linear = sum(sp.Matrix(b).multiply_elementwise(sp.Matrix(k)))
        return capacity.quadratic_form(k, hess) / 2 - linear + sp.Rational(stats.c) / 2

    outcome = factorised_gradient_check(
        q,
        k,
        raw_risk,
        closed_risk,
        lambda k: capacity.linear_qk_gradient(k, hess, b),
        wrong,
    )
    # common.factorised_gradient_check builds the Outcome; what it exercised is attached here.
    seeds = f"default_rng([{ctx.seed}, {TAG_SYM}])"
    if len(draws) > 1:
        seeds += (
            f", then [{ctx.seed}, {TAG_SYM}, a] for a = 1…{len(draws) - 1} "
            "(symmetric draws redrawn)"
        )
    return dataclasses.replace(
        outcome,
        exercised={
            "sizes": f"S = {s}, n = {n}, d = d_v = {d}, QK rank r = {r} (symbolic W_Q, W_K)",
            "dtypes": "exact (SymPy)",
            "seeds": seeds,
        },
    )


register(
    Proposition(
        id="EB-6",
        title="Attention-native deficiency and achievability of the QK rank (linear QK)",
        statement=(
            r"Let $Y_s=(X_sK^*X_s^\top/n)X_sW_V+\sigma E_s$ with tokens iid "
            r"$\mathcal{N}(0,I_d)$, $\operatorname{rank}K^*=r^*$, $W_V$ orthogonal, and let the "
            r"student of QK rank $r$ be $K=W_QW_K^\top$, $W_Q,W_K\in\mathbb{R}^{d\times r}$, "
            r"with the value map fixed to $W_V$ (known): with $P_s=X_s^\top X_sW_V/n$ it "
            r"predicts $X_sKP_s$, a reduced-rank regression in $K$. On held-out sequences let "
            r"$q'(\Delta)=\sum_s\|X_s\Delta P_s\|_F^2/(S'n)=\operatorname{vec}(\Delta)^\top"
            r"\mathcal{H}'\operatorname{vec}(\Delta)$, "
            r"$\mathcal{H}'=\sum_sX_s^\top X_s\otimes P_sP_s^\top/(S'n)$, and $\mathcal{E}_{\rm "
            r"rel}(K)=q'(K-K^*)/q'(K^*)$, the "
            r"relative excess test risk against noiseless targets. (D) Every $K$ of rank "
            r"$\le r$ has $\mathcal{E}_{\rm rel}(K)\ge\kappa(\mathcal{H}')^{-1}\sum_{i>r}"
            r"\sigma_i^2(K^*)/\|K^*\|_F^2$ (Eckart--Young--Mirsky; "
            r"$\kappa(\mathcal{H}')=\lambda_{\max}/\lambda_{\min}$), positive for $r<r^*$; the "
            r"truncation attains it within $\kappa$: "
            r"$\mathcal{E}_{\rm rel}([K^*]_r)\le\kappa(\mathcal{H}')\sum_{i>r}\sigma_i^2(K^*)/"
            r"\|K^*\|_F^2$. (A) Students of rank $r\in\{r^*,r^*+1\}$ trained by plain "
            r"gradient descent from a small initialisation reach the estimation floor: "
            r"$q'(\hat K_r-K^*)\le q'(K_{\rm LS}-K^*)$, $K_{\rm LS}=\mathcal{H}^{-1}B$ the "
            r"unconstrained least-squares kernel. Statistical claim (checked): at $d=d_v=8$, "
            r"$n=32$, $r^*=3$, flat "
            r"$K^*=UV^\top$, $\sigma=0.1$, $S=S'=400$, $\alpha=10^{-2}$, $\eta=0.2$, $T=500$, "
            r"(A) holds for $r=r^*$ and for $r^*+1$, each "
            + binomial.CLAIM
            + r"; for $r=r^*-1$ (the check's control) the same test fails."
        ),
        remarks=(
            r"As $n\to\infty$, $\mathcal{H}'\to I_{d^2}$ and $\kappa(\mathcal{H}')\to1$, so "
            r"(D) tends to the Eckart--Young prediction $\sum_{i>r}\sigma_i^2/\|K^*\|_F^2$, "
            r"$(r^*-r)/r^*$ for a flat spectrum. The least-squares kernel's expected in-sample "
            r"excess is $\sigma^2d^2/(Sn)$ per token, so at the floor the test risk is within a "
            r"factor $\approx1+d^2/(Snd_v)$ of the noise floor.",
        ),
        hypotheses=(
            "tokens iid N(0, I_d), noise iid N(0, σ²), independent across sequences",
            "the value map fixed to the teacher's W_V (known, orthogonal, d_v = d)",
            "(D) for every rank-r K and every held-out design with 𝓗' ≻ 0 (both bounds); "
            "checked on the 100 held-out designs of the stated sizes at r = 1, 2, with four "
            "rank-r kernels each (the trained student, the truncation, a perturbed truncation, a "
            "random kernel)",
            "(A) " + binomial.HYPOTHESIS,
        ),
        checks=(
            Check(
                "symbolic",
                "closed-form gradient of the QK trainer",
                symbolic_gradient,
                CONTROL_GRADIENT,
            ),
            Check(
                "float64",
                "deficiency below r*, EY/κ bound (and κ·EY for [K*]_r)",
                deficiency,
                CONTROL_DEFICIENCY,
            ),
            Check(
                "float64",
                "achievability at r*, r* + 1, P ≥ 0.9",
                achievability,
                CONTROL_ACHIEVABILITY,
            ),
        ),
        seeds=(
            "numpy default_rng([seed, 601, i]) for the data of replicate i = 0…99 (400 "
            "training and 400 held-out sequences), [seed, 602, r] for the initial factors of "
            "the rank-r students, [seed, 603] for the symbolic case; the certificate's seed "
            "defaults to 0"
        ),
    )
)
