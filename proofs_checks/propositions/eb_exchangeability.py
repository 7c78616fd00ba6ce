"""EB-5: the exchangeability lemma, why a naive static rank cannot see the kernel's rank.

With exchangeable token rows (no positional signal, no mask) and a permutation-equivariant mixer
F(PX) = P F(X) (linear and softmax attention both are), every permutation-equivariant functional
of the data law commutes with all permutation matrices, so it lies in the commutant of S_n on ℝⁿ,
span{I, 11ᵀ}. Its rank is then 0, 1, n − 1 or n whatever r* = rank K is (background §4).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator

import numpy as np
import sympy as sp
from hypothesis import strategies as st

from proofs_checks.bounds import FLOAT64_U, gamma
from proofs_checks.harness import property_check, seeds, substituted
from proofs_checks.propositions.common import CHI2_CUT, root_chi2
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import capacity
from reference.linalg import frobenius

#: Exact check: n = 5 tokens (all 120 permutations), d = d_v = 4, m = 3 base sequences,
#: kernel of rank 2, β = 2.
N, D, M, RSTAR, BETA = 5, 4, 3, 2, 2.0
#: Monte Carlo: n = 6, d = d_v = 8, r* = 3, β = 2, S = 20000 iid N(0, I) sequences.
MC_N, MC_D, MC_RSTAR, MC_S = 6, 8, 3, 20_000
TAG_EXACT, TAG_MC = 501, 502
#: Sizes of the symbolic commutant check.
COMMUTANT_SIZES = tuple(range(2, 9))
#: Permutations sampled per instance by ``exact_case`` (besides the transposition of the first
#: and last tokens).
SAMPLED_PERMS = 10
#: The attention kinds of the float64 and property checks.
KINDS = ("linear", "softmax")
#: Property check: 2 ≤ n ≤ 5, 1 ≤ d ≤ 4 (d_v = d), β in PROP_BETA, m = PROP_M base sequences.
PROP_N, PROP_D, PROP_BETA, PROP_M = (2, 5), (1, 4), (0.1, 4.0), 2
CONTROL = (
    "a relative-position bias B_ij = (j − i)/n in both mixings of reference.capacity (added to "
    "softmax's logits, and as B/n to linear attention's A(X))"
)
_LINEAR, _SOFTMAX = capacity.linear_attention_mixing, capacity.softmax_attention_mixing


def relative_positions(n: int) -> np.ndarray:
    """B_ij = (j − i)/n: the bias of the control, a Toeplitz matrix with zero diagonal, which no
    permutation-equivariant mixer can produce (PBPᵀ ≠ B for the transposition of 1 and n)."""
    i = np.arange(n)
    return (i[None, :] - i[:, None]) / n


def _biased_linear(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(XKXᵀ + B)/n."""
    return _LINEAR(x, k) + relative_positions(np.shape(x)[-2]) / np.shape(x)[-2]


def _biased_softmax(x: np.ndarray, k: np.ndarray, beta: float = 1.0) -> np.ndarray:
    """rowsoftmax(βXKXᵀ/√d + B): rowsoftmax(L) with each entry of row i multiplied by e^{B_ij}
    and the row renormalised."""
    a = _SOFTMAX(x, k, beta) * np.exp(relative_positions(np.shape(x)[-2]))
    return a / a.sum(axis=-1, keepdims=True)


@contextlib.contextmanager
def positional_bias(wrong: bool) -> Iterator[None]:
    """The control: both mixings of ``reference.capacity`` (the package namespace, which the
    checks call) with the bias B, in the logits of softmax and added as B/n to linear A(X)."""
    if not wrong:
        yield
        return
    with (
        substituted(capacity, "linear_attention_mixing", _biased_linear),
        substituted(capacity, "softmax_attention_mixing", _biased_softmax),
    ):
        yield


# ---------------------------------------------------------------------------------------------
# The commutant span{I, 11ᵀ}
# ---------------------------------------------------------------------------------------------
def commutant_projection(m: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Π(M) = aI + b·11ᵀ, the Frobenius-orthogonal projection onto span{I, 11ᵀ}, and (a, b):
    the normal equations [[n, n], [n, n²]]·(a, b) = (tr M, 1ᵀM1) give
    a = (n·tr M − 1ᵀM1)/(n(n − 1)), b = (1ᵀM1 − tr M)/(n(n − 1)) (n ≥ 2)."""
    n = m.shape[0]
    tr, tot = float(np.trace(m)), float(np.sum(m))
    a = (n * tr - tot) / (n * (n - 1))
    b = (tot - tr) / (n * (n - 1))
    return a * np.eye(n) + b * np.ones((n, n)), a, b


def static_rank(a: float, b: float, n: int, threshold: float) -> int:
    """Rank of aI + b·11ᵀ, whose eigenvalues are a + nb (once) and a (n − 1 times), counting
    only eigenvalues above ``threshold`` in modulus: always one of 0, 1, n − 1, n."""
    return (n - 1) * int(abs(a) > threshold) + int(abs(a + n * b) > threshold)


# ---------------------------------------------------------------------------------------------
# Functionals of a finite (exactly exchangeable) law, with their rounding bounds
# ---------------------------------------------------------------------------------------------
def symmetrized(xs: np.ndarray) -> np.ndarray:
    """All n! row permutations of each of the m sequences xs (m, n, d): a law that is exactly
    exchangeable (uniform over m·n! sequences)."""
    perms = np.array(list(itertools.permutations(range(xs.shape[1]))))
    return xs[:, perms].reshape(-1, *xs.shape[1:])


def mixing(x: np.ndarray, k: np.ndarray, kind: str, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """A(X) for a batch, and a componentwise bound E ≥ |fl(A) − A| (Higham §3.5):
    linear: A = XKXᵀ/n through two products of inner dimension d, E = γ_{2d+1}|X||K||X|ᵀ/n;
    softmax: logits ℓ = β·XKXᵀ/√d err by ≤ δ = γ_{2d+2}·β|X||K||X|ᵀ/√d, shifting by the row max
    and exponentiating give a relative error ≤ 2max δ + u(1 + max|ℓ − ℓ_max|) and normalising
    γ_{n+2}: E = ε·A with that ε per sequence."""
    n, d = x.shape[1], x.shape[2]
    ax = np.abs(x)
    chain = ax @ np.abs(k) @ np.swapaxes(ax, 1, 2)
    if kind == "linear":
        return capacity.linear_attention_mixing(x, k), gamma(2 * d + 1) * chain / n
    a = capacity.softmax_attention_mixing(x, k, beta)
    logits = beta * (x @ k @ np.swapaxes(x, 1, 2)) / math.sqrt(d)
    spread = np.max(logits, axis=(1, 2)) - np.min(logits, axis=(1, 2))
    delta = gamma(2 * d + 2) * abs(beta) * np.max(chain, axis=(1, 2)) / math.sqrt(d)
    eps = 2 * delta + FLOAT64_U * (1 + spread) + gamma(n + 2)
    return a, eps[:, None, None] * a


def functionals(
    x: np.ndarray, k: np.ndarray, w: np.ndarray, kind: str, beta: float
) -> dict[str, tuple[np.ndarray, float]]:
    """The functionals of the uniform law on the batch x and their absolute rounding bounds τ
    (Frobenius): E[A], E[F Xᵀ], E[F Fᵀ] (the token Gram) and the least-squares static mixer
    Â = E[FXᵀ]E[XXᵀ]^{-1}, with F = A X W.

    Each term G = chain of products: |fl(G) − G| ≤ γ_q·(chain of |·|) + (δA propagated), q the
    sum of inner dimensions; the mean of N terms adds γ_{N+1}·mean|G|. For Â:
    τ_Â = (τ_FX + ‖Â‖τ_XX)‖E[XXᵀ]^{-1}‖₂ + 2γ_n κ(E[XXᵀ])‖Â‖ (perturbed solve; LU growth ≤ 2)."""
    big_n, n, d = x.shape
    dv = w.shape[1]
    gsum = gamma(big_n + 1)
    a, err = mixing(x, k, kind, beta)
    ax, aw, xt = np.abs(x), np.abs(w), np.swapaxes(x, 1, 2)
    axt = np.abs(xt)
    abar = np.abs(a) + err
    f = a @ x @ w
    out = {}

    def mean_and_tol(terms, bound):
        mean = terms.mean(axis=0)
        return mean, frobenius(bound.mean(axis=0) + gsum * np.abs(terms).mean(axis=0))

    out["E[A]"] = mean_and_tol(a, err)
    xwx = ax @ aw @ axt
    out["E[F Xᵀ]"] = mean_and_tol(f @ xt, (gamma(n + 2 * d) * np.abs(a) + err) @ xwx)
    xwwx = ax @ aw @ aw.T @ axt
    gram_bound = gamma(2 * n + 2 * d + dv) * np.abs(a) @ xwwx @ np.swapaxes(np.abs(a), 1, 2)
    gram_bound = gram_bound + err @ xwwx @ np.swapaxes(abar, 1, 2)
    gram_bound = gram_bound + abar @ xwwx @ np.swapaxes(err, 1, 2)
    out["E[F Fᵀ]"] = mean_and_tol(f @ np.swapaxes(f, 1, 2), gram_bound)
    mxx, txx = mean_and_tol(x @ xt, gamma(d) * ax @ axt)
    mfx, tfx = out["E[F Xᵀ]"]
    mixer = np.linalg.solve(mxx.T, mfx.T).T
    sv = np.linalg.svd(mxx, compute_uv=False)
    norm_mixer = frobenius(mixer)
    tol = (tfx + norm_mixer * txx) / sv[-1] + 2 * gamma(n) * (sv[0] / sv[-1]) * norm_mixer
    out["Â = E[FXᵀ]E[XXᵀ]⁻¹"] = (mixer, tol)
    return out


def structure_ratio(
    funcs: dict[str, tuple[np.ndarray, float]], perms: np.ndarray
) -> tuple[float, list[str]]:
    """Worst ratio over the functionals of ‖(I − Π)M̂‖/τ and of ‖PM̂Pᵀ − M̂‖/(2τ) over the
    sampled permutations (M = PMPᵀ exactly, so each side is within τ of the same M); the rank
    of M̂ counted above τ + n·u‖M̂‖₂ must be one of 0, 1, n − 1, n (else the ratio is ∞)."""
    worst, rows = 0.0, []
    for name, (m, tol) in funcs.items():
        n = m.shape[0]
        proj, a, b = commutant_projection(m)
        ratio = frobenius(m - proj) / tol
        for p in perms:
            ratio = max(ratio, frobenius(m[np.ix_(p, p)] - m) / (2 * tol))
        sv = np.linalg.svd(m, compute_uv=False)
        rank = int(np.sum(sv > tol + n * FLOAT64_U * sv[0]))
        if rank not in (0, 1, n - 1, n):
            ratio = np.inf
        worst = max(worst, ratio)
        rows.append(f"{name}: a = {a:.3g}, b = {b:.3g}, rank {rank}, ratio {ratio:.1e}")
    return worst, rows


def exact_case(
    n: int, d: int, m: int, rstar: int, kind: str, beta: float, seed: int, wrong: bool, tag: int
) -> tuple[float, list[str]]:
    """One seeded instance: m Gaussian sequences, symmetrized over S_n, kernel
    ``planted_kernel(d, r*)``, W_V = ``orthonormal(d, d)``, 10 sampled permutations (and the
    transposition of the first and last tokens); the mixings biased under the control."""
    rng = np.random.default_rng([seed, tag])
    k = capacity.planted_kernel(d, rstar, rng)
    w = capacity.orthonormal(d, d, rng)
    x = symmetrized(rng.standard_normal((m, n, d)))
    perms = [rng.permutation(n) for _ in range(SAMPLED_PERMS)]
    perms.append(np.r_[n - 1, np.arange(1, n - 1), 0])
    with positional_bias(wrong):
        return structure_ratio(functionals(x, k, w, kind, beta), np.array(perms))


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------
def symbolic_commutant(ctx: Context, wrong: bool) -> Outcome:
    """SymPy, n = 2…8: the n×n matrices M with PM = MP for the generators of S_n (the
    transposition (1 2) and the n-cycle) form exactly span{I, 11ᵀ} (nullspace of dimension 2
    containing vec I and vec 11ᵀ); and det(λI − aI − b·11ᵀ) = (λ − a)^{n−1}(λ − a − nb), so the
    rank is 0, 1, n − 1 or n. Control: only the n-cycle (a relative positional signal keeps
    just the shifts): the commutant is the n-dimensional circulant algebra."""
    failures = []
    a, b, lam = sp.symbols("a b lambda")
    sizes = COMMUTANT_SIZES
    for n in sizes:
        cycle = sp.Matrix(n, n, lambda i, j, n=n: 1 if j == (i + 1) % n else 0)
        swap = sp.eye(n)
        swap[0, 0] = swap[1, 1] = 0
        swap[0, 1] = swap[1, 0] = 1
        gens = [cycle] if wrong else [swap, cycle]
        # vec(PM − MP) = (I ⊗ P − Pᵀ ⊗ I) vec(M) (column-major vec); stack the generators.
        coeffs = sp.Matrix.vstack(
            *(
                sp.kronecker_product(sp.eye(n), g) - sp.kronecker_product(g.T, sp.eye(n))
                for g in gens
            )
        )
        null = coeffs.nullspace()
        basis = sp.Matrix.hstack(*null)
        spans = all(
            sp.Matrix.hstack(basis, v).rank() == len(null)
            for v in (sp.eye(n).reshape(n * n, 1), sp.ones(n * n, 1))
        )
        if len(null) != 2 or not spans:
            failures.append(f"n = {n}: commutant of dimension {len(null)}")
        poly = (lam * sp.eye(n) - a * sp.eye(n) - b * sp.ones(n, n)).det(method="berkowitz")
        if sp.expand(poly - (lam - a) ** (n - 1) * (lam - a - n * b)) != 0:
            failures.append(f"n = {n}: characteristic polynomial")
    return Outcome(
        not failures,
        float(len(failures)),
        0.0,
        "; ".join(failures) or "commutant = span{I, 11ᵀ}",
        exercised={
            "sizes": f"n = {sizes[0]}…{sizes[-1]}",
            "options": "generators: " + ("the n-cycle" if wrong else "(1 2) and the n-cycle"),
            "dtypes": "exact (SymPy)",
            "seeds": "none (deterministic)",
        },
    )


def float64_exact(ctx: Context, wrong: bool) -> Outcome:
    """An exactly exchangeable law: m = 3 Gaussian sequences (n = 5, d = d_v = 4) and all their
    120 row permutations, kernel of rank 2, β = 2, seed [ctx.seed, 501], for linear and softmax
    attention: E[A], E[FXᵀ], E[FFᵀ] and Â lie in span{I, 11ᵀ} within their rounding bounds τ
    (``functionals``), commute with 10 sampled permutations and the transposition of the
    first and last tokens within 2τ, and have rank in
    {0, 1, n − 1, n}. Residual: worst ratio to the bound."""
    worst, rows = 0.0, []
    for kind in KINDS:
        ratio, lines = exact_case(N, D, M, RSTAR, kind, BETA, ctx.seed, wrong, TAG_EXACT)
        worst = max(worst, ratio)
        rows.append(f"{kind}: " + "; ".join(lines))
    return Outcome.bound(
        worst,
        1.0,
        " | ".join(rows),
        {
            "sizes": (
                f"n = {N}, d = d_v = {D}, kernel rank {RSTAR}; m = {M} sequences × all "
                f"{math.factorial(N)} row permutations"
            ),
            "options": f"{' and '.join(KINDS)} attention, β = {BETA:g}",
            "points": f"{SAMPLED_PERMS} sampled permutations and the transposition (1 n)",
            "dtypes": "float64",
            "seeds": f"default_rng([{ctx.seed}, {TAG_EXACT}])",
        },
    )


def monte_carlo(ctx: Context, wrong: bool) -> Outcome:
    """Monte Carlo with iid N(0, I_8) tokens (truly exchangeable): S = 20000 sequences of
    n = 6, kernel of rank 3 (flat, not symmetric), W_V orthogonal, seed [ctx.seed, 502];
    functionals E[A] of softmax attention (β = 2) and E[FXᵀ] of linear attention. For each,
    M̂ = mean of the S per-sequence matrices Z_s, v̂ = Σ_s‖(I − Π)(Z_s − Z̄)‖²/(S(S − 1)) and
    T = ‖(I − Π)M̂‖²/v̂. Under the lemma (I − Π)M̂ is a mean of iid zero-mean matrices, so by the
    CLT T ≈ Σ w_j χ²₁ with Σ w_j = 1, and P(T > 30) ≤ P(χ²₁ > 30) ≈ 4e-8 (Székely & Bakirov
    2003, for thresholds ≥ 1.54). Pass: √T ≤ √30 for both. Reported: (â, b̂) and the naive
    static rank of âI + b̂11ᵀ, counting eigenvalues above √30·√v̂_total."""
    rng = np.random.default_rng([ctx.seed, TAG_MC])
    k = capacity.planted_kernel(MC_D, MC_RSTAR, rng)
    w = capacity.orthonormal(MC_D, MC_D, rng)
    x = rng.standard_normal((MC_S, MC_N, MC_D))
    with positional_bias(wrong):
        lin = capacity.linear_attention_mixing(x, k)
        samples = {
            "softmax E[A]": capacity.softmax_attention_mixing(x, k, BETA),
            "linear E[FXᵀ]": lin @ x @ w @ np.swapaxes(x, 1, 2),
        }
    worst, rows = 0.0, []
    for name, z in samples.items():
        n = MC_N
        _, a, b = commutant_projection(z.mean(axis=0))
        # (I − Π)Z_s per sample: Π(Z) = αI + β11ᵀ, β the mean off-diagonal entry, α + β the
        # mean diagonal one
        tr, tot = np.trace(z, axis1=1, axis2=2), z.sum(axis=(1, 2))
        off = z - ((n * tr - tot) / (n * (n - 1)))[:, None, None] * np.eye(n)
        off = off - ((tot - tr) / (n * (n - 1)))[:, None, None]
        root_t, _ = root_chi2(off, np.zeros((n, n)))
        _, se_total = root_chi2(z, np.zeros((n, n)))
        rank = static_rank(a, b, n, math.sqrt(CHI2_CUT) * se_total)
        worst = max(worst, root_t)
        rows.append(
            f"{name}: T = {root_t**2:.2f}, a = {a:.3g}, b = {b:.3g}, eigenvalues significantly "
            f"≠ 0: {rank}"
        )
    return Outcome.bound(
        worst,
        math.sqrt(CHI2_CUT),
        "; ".join(rows),
        {
            "sizes": f"n = {MC_N}, d = d_v = {MC_D}, r* = {MC_RSTAR}",
            "samples": f"S = {x.shape[0]} iid N(0, I_{MC_D}) sequences",
            "options": f"{', '.join(samples)} (β = {BETA:g})",
            "dtypes": "float64",
            "seeds": f"default_rng([{ctx.seed}, {TAG_MC}])",
        },
    )


def property_exact(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 2 ≤ n ≤ 5, 1 ≤ d ≤ 4 (d_v = d), linear or softmax attention,
    β ∈ [0.1, 4] and seeds: the functionals of m = 2 sequences symmetrized over S_n lie in
    span{I, 11ᵀ}, commute with sampled permutations and have rank in {0, 1, n − 1, n}, within
    their rounding bounds (ratio ≤ 1)."""

    def measure(example) -> tuple[float, float]:
        (n, d), kind, beta, seed = example
        ratio, _ = exact_case(n, d, PROP_M, max(1, d // 2), kind, beta, seed, wrong, TAG_EXACT)
        return ratio, 1.0

    strategy = st.tuples(
        st.tuples(st.integers(*PROP_N), st.integers(*PROP_D)),
        st.sampled_from(KINDS),
        st.floats(*PROP_BETA),
        seeds(),
    )
    return property_check(
        ctx,
        strategy,
        measure,
        "distance to span{I, 11ᵀ} / rounding bound",
        exercised={
            "sizes": (
                f"{PROP_N[0]} ≤ n ≤ {PROP_N[1]}, {PROP_D[0]} ≤ d ≤ {PROP_D[1]} (d_v = d), "
                f"kernel rank max(1, ⌊d/2⌋), m = {PROP_M} sequences × n! row permutations"
            ),
            "options": f"{' or '.join(KINDS)} attention, β ∈ [{PROP_BETA[0]:g}, {PROP_BETA[1]:g}]",
            "dtypes": "float64",
        },
    )


register(
    Proposition(
        id="EB-5",
        title="Exchangeability: static summaries of attention are aI + b11ᵀ",
        statement=(
            r"Let $2\le n\le8$ and let the rows of $X\in\mathbb{R}^{n\times d}$ be "
            r"exchangeable ($PX\overset{d}{=}X$ "
            r"for every permutation matrix $P$) and $F$ permutation-equivariant "
            r"($F(PX)=PF(X)$, e.g. $F(X)=A(X)XW_V$ with $A(PX)=PA(X)P^\top$ for linear and "
            r"softmax attention). Then $\mathbb{E}[A(X)]$, $\mathbb{E}[F(X)X^\top]$, "
            r"$\mathbb{E}[F(X)F(X)^\top]$ and the least-squares static mixer "
            r"$\hat A=\mathbb{E}[F(X)X^\top]\,\mathbb{E}[XX^\top]^{-1}$ (when "
            r"$\mathbb{E}[XX^\top]$ is invertible) commute with every $P$, hence equal "
            r"$aI+b\mathbf{1}\mathbf{1}^\top$ for some $a,b$; their eigenvalues are $a+nb$ and "
            r"$a$ ($n-1$ times), so their rank is $0$, $1$, $n-1$ or $n$ whatever "
            r"$\operatorname{rank}K$ is."
        ),
        hypotheses=(
            "token rows exchangeable: no positional signal, no mask",
            "F permutation-equivariant (linear and softmax attention)",
            "the expectations exist (Gaussian tokens: all moments)",
            "checked: the commutant and its characteristic polynomial for n = 2…8 (exact); the "
            "functionals of linear and softmax attention at n = 5 (every permutation of 3 "
            "Gaussian sequences), n = 6 (Monte Carlo) and 2 ≤ n ≤ 5 (property)",
        ),
        remarks=(
            r"The statement holds for every $n\ge2$: $S_n$ acts 2-transitively on the "
            r"positions, so the permutation matrices' commutant is span$\{I,\mathbf{1}"
            r"\mathbf{1}^\top\}$ (the permutation representation is the trivial plus one "
            r"irreducible one); the certificate checks $n\le8$.",
        ),
        checks=(
            Check(
                "symbolic",
                "commutant of S_n is span{I, 11ᵀ}",
                symbolic_commutant,
                "only the cyclic shifts (relative positions) imposed",
            ),
            Check("float64", "exactly exchangeable law, sampled P", float64_exact, CONTROL),
            Check("float64", "Monte Carlo, S = 20000, χ² criterion", monte_carlo, CONTROL),
            Check("property", "over n, d, attention kind, β", property_exact, CONTROL),
        ),
        seeds=(
            "numpy default_rng([seed, 501]) (exact and property cases, Hypothesis drawing the "
            "seed), [seed, 502] (Monte Carlo: S = 20000 sequences); the certificate's seed "
            "defaults to 0"
        ),
    )
)
