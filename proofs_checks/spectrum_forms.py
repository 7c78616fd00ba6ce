"""The spectrum estimators of ``reference.capacity`` against their definitions, transcribed here
in exact rational arithmetic (``fractions.Fraction``: every float is a rational) and in mpmath at
50 digits, independently of the library's code.

What is compared, for every spectrum of ``spectra(seed)`` (flat spectra of rank 1 … 100, exact
rank r with zeros, the docstrings' worked examples, a floor below which the values would make a
gap, unsorted input, scales 1e-200 … 1e200, and random spectra of m = 1 … 64 values):

- integers, exactly: the numerical rank #{σ_i > τσ₁} (τ as given), the energy-threshold rank
  min{k : Σ_{i≤k} σ_i² ≥ η(1 − m·ε)Σσ_i²} with η the decimal it is written as and the slack
  m·ε (ε = 2⁻⁵²) the docstring states (an exact tie ηr ∈ ℤ of a flat spectrum resolves to the
  smaller k; at η = 1 a tail of energy below m·ε of the total, which the float sums cannot
  see, does not count), and the largest-gap rank argmax_{σ_k > floor}
  σ_k / max(σ_{k+1}, floor) (the first maximiser; ∞ when a zero follows a positive value, 0 when
  σ₁ ≤ floor, 1 when m = 1). A random spectrum puts a value within one rounding of a threshold
  or two ratios within one rounding of each other with probability of order m·u ≈ 1e-14 per
  spectrum, so exact agreement is the claim;
- reals, within derived bounds (u = 2⁻⁵³, γ_k = ku/(1 − ku)):
  stable rank Σ(σ_i/σ₁)²: each term 3 roundings (a quotient, a square), the sum γ_{m−1}:
  relative error ≤ γ_{m+2};
  entropy ranks exp(−Σ p_i log p_i) (p_i = σ_i²/Σσ_j² or σ_i/Σσ_j): each p_i within γ_{m+3}
  relative, each log within 2u|log p_i| (libm, 1 ulp) plus the γ_{m+3} it inherits, the products
  and the sum γ_m·Σp_i|log p_i|: |ΔH| ≤ γ_{2m+8}(1 + L), L = max |log p_i| over p_i > 0; the
  exponential adds 2u: relative error ≤ 1.01·γ_{2m+8}(1 + L) + 2u ≤ γ_{2m+12}(1 + L);
  the attention floor max(SE, σ₁/n): one correctly rounded quotient, so the float of the exact
  value, bit for bit;
  the Marchenko–Pastur edge noise·(1 + √(p/N))²: p/N 1 rounding, √ halves it and adds one (1.5u),
  1 + x adds one (2.5u), the square doubles it and pow adds ≤ 2u (7u), × noise (8u): γ_8;
  the Tracy–Widom threshold noise·(μ + qσ)/N (Johnstone 2001): a, b = √(N − ½), √(p − ½) (u
  each), a + b (2u), μ = (a + b)² (6u), 1/a + 1/b (3u), its cube root (u + 2u + u·|log| of the
  rounded ⅓: 4.1u), σ (7.1u), qσ (8.1u, q the float of its decimal), μ + qσ (10.1u), × noise,
  / N (12.1u): γ_13. The Tracy–Widom quantiles q are the table of Tracy & Widom (1996) and
  Bejan (2005), written here again, not read from the library.

The token Gram and its count, on seeded static tasks (``GRAM_SIZES``): the Gram entrywise
against its exact rational value within γ_{S·d_v+3}·(Σ_s|Y_s||Y_s|ᵀ)/(S·d_v) (a sum of S·d_v
products, a quotient, the symmetrisation); the count's eigenvalues decreasing and summing to
tr G within that bound's trace plus n²·u·λ₁ (LAPACK's backward error ‖E‖₂ ≤ p(n)·u·‖G‖₂, p(n)
taken as n, summed over n eigenvalues); and its sequential rule, transcribed on those eigenvalues
(so that the solver's rounding is not in the comparison): the count exactly, the noise mean
within γ_n (a mean of at most n values) and the threshold within γ_{n+1} (a mean, then one
product with the null quantile, which is read from the library and judged by EB-4's null-law
check). The risk each student trainer reports, against its definition from the sufficient
statistics in exact rationals (``student_comparisons``); the planted tasks' decay spectrum
and attention maps against their definitions (``task_comparisons``). The estimators' defaults
are EB-4's domain check (``capacity_domains.DEFAULTS``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import mpmath
import numpy as np

from proofs_checks.bounds import FLOAT64_U, gamma
from reference import capacity

#: P(TW₁ ≤ q) = key: Tracy & Widom (1996), Bejan (2005).
TW1_QUANTILES = {0.90: 0.4501, 0.95: 0.9793, 0.99: 2.0234}
TAUS, ETAS, QUANTILES = (0.0, 1e-3, 1e-2, 0.5), (0.5, 0.9, 0.99, 1.0), (0.90, 0.95, 0.99)
#: Token Grams and counts at (S, n, d_v, r*, scale of Y): static tasks (noise 0.1, decaying
#: σ(A*)) where the count passes r* eigenvalues and stops, one at the scale 1e-100, r* = 0
#: (noise only), n = 1, and S·d_v = n (the fewest outputs the count accepts: the last null
#: law it reads is a Wishart_2(2)).
GRAM_SIZES = (
    (40, 8, 4, 2, 1.0),
    (60, 12, 3, 4, 1.0),
    (40, 8, 4, 2, 1e-100),
    (30, 6, 2, 0, 1.0),
    (20, 1, 3, 0, 1.0),
    (4, 8, 2, 0, 1.0),
)
#: Noise edges at (noise, p, N): the sizes of EB-4 (a) and (b), p = N, p = 1 and a large N.
EDGE_SIZES = ((0.01, 16, 1600), (0.01, 16, 3600), (2.5, 7, 7), (1.0, 1, 1), (1e-3, 64, 10**6))
TAG = 403


def _exact(s: np.ndarray) -> list[Fraction]:
    return sorted((Fraction(float(v)) for v in s), reverse=True)


def numerical_rank(s: np.ndarray, tau: float) -> int:
    """#{i : σ_i > τσ₁}, 0 for a zero spectrum."""
    f = _exact(s)
    if not f or f[0] == 0:
        return 0
    return sum(1 for v in f if v > Fraction(tau) * f[0])


def energy_threshold_rank(s: np.ndarray, eta: float) -> int:
    """min{k : Σ_{i≤k} σ_i² ≥ η(1 − m·ε)Σσ_i²} with η the decimal ``repr(eta)`` names and the
    relative slack m·ε (ε = 2⁻⁵²) of the docstring, 0 for a zero spectrum."""
    f = _exact(s)
    if not f or f[0] == 0:
        return 0
    total, cum = sum(v * v for v in f), Fraction(0)
    target = Fraction(repr(eta)) * (1 - len(f) * Fraction(1, 2**52)) * total
    for k, v in enumerate(f, start=1):
        cum += v * v
        if cum >= target:
            return k
    raise AssertionError("unreachable: the whole sum reaches η·total for η ≤ 1")


def largest_gap_rank(s: np.ndarray, floor: float) -> int:
    """argmax_{1≤k<m, σ_k > floor} σ_k / max(σ_{k+1}, floor), the first maximiser (∞ for a zero
    after a positive value); 0 when σ₁ ≤ floor or σ₁ = 0, 1 when m = 1."""
    f, lo = _exact(s), Fraction(floor)
    if not f or f[0] == 0 or f[0] <= lo:
        return 0
    if len(f) == 1:
        return 1
    best, best_k = None, 0
    for k in range(1, len(f)):
        num, den = f[k - 1], max(f[k], lo)
        if num <= lo:
            continue
        ratio = float("inf") if den == 0 else num / den
        if best is None or ratio > best:
            best, best_k = ratio, k
    return best_k


def stable_rank(s: np.ndarray) -> Fraction:
    """Σσ_i²/σ₁², 0 for a zero spectrum."""
    f = _exact(s)
    if not f or f[0] == 0:
        return Fraction(0)
    return sum(v * v for v in f) / (f[0] * f[0])


def entropy_rank(s: np.ndarray, power: int) -> tuple[mpmath.mpf, float]:
    """exp(−Σ p_i log p_i), p_i = σ_i^power / Σσ_j^power (0 log 0 := 0; 0 for a zero spectrum),
    at 50 digits, with L = max |log p_i| over p_i > 0 (the bound's factor)."""
    with mpmath.workdps(50):
        w = [mpmath.mpf(float(v)) ** power for v in s]
        total = mpmath.fsum(w)
        if total == 0:
            return mpmath.mpf(0), 0.0
        p = [x / total for x in w if x > 0]
        h = -mpmath.fsum(x * mpmath.log(x) for x in p)
        return mpmath.exp(h), float(max(abs(mpmath.log(x)) for x in p))


def mp_edge(noise: float, p: int, dof: int) -> mpmath.mpf:
    """noise·(1 + √(p/N))²."""
    with mpmath.workdps(50):
        return mpmath.mpf(noise) * (1 + mpmath.sqrt(mpmath.mpf(p) / dof)) ** 2


def tracy_widom_threshold(noise: float, p: int, dof: int, quantile: float) -> mpmath.mpf:
    """noise·(μ + qσ)/N with μ = (a + b)², σ = (a + b)(1/a + 1/b)^{1/3}, a = √(N − ½),
    b = √(p − ½) (Johnstone 2001), q the TW₁ quantile."""
    with mpmath.workdps(50):
        a, b = mpmath.sqrt(mpmath.mpf(dof) - 0.5), mpmath.sqrt(mpmath.mpf(p) - 0.5)
        mu = (a + b) ** 2
        sigma = (a + b) * mpmath.cbrt(1 / a + 1 / b)
        q = mpmath.mpf(repr(TW1_QUANTILES[quantile]))
        return mpmath.mpf(noise) * (mu + q * sigma) / dof


def token_gram(y: np.ndarray) -> list[list[Fraction]]:
    """G_ij = Σ_s Σ_c Y_s[i, c]·Y_s[j, c] / (S·d_v), exactly."""
    s, n, dv = y.shape
    f = [[[Fraction(float(v)) for v in row] for row in ys] for ys in y]
    return [
        [
            sum(a * b for ys in f for a, b in zip(ys[i], ys[j], strict=True)) / (s * dv)
            for j in range(n)
        ]
        for i in range(n)
    ]


def gram_bound(y: np.ndarray) -> np.ndarray:
    """|Ĝ − G| entrywise: γ_{S·d_v+3}·(Σ|Y_s||Y_s|ᵀ)/(S·d_v) (a sum of S·d_v products, a
    quotient, the symmetrisation's sum and halving)."""
    s, _, dv = y.shape
    a = np.abs(y)
    return gamma(s * dv + 3) * np.einsum("sic,sjc->ij", a, a) / (s * dv)


def gram_count(
    lam: list[float], dof: int, quantile: float
) -> tuple[int, float, float, list[float]]:
    """The sequential count on eigenvalues λ₁ ≥ … ≥ λ_n (N = S·d_v): from k = 0, λ_{k+1}
    counts while λ_{k+1} > max(c_k·mean(λ_{k+2…n}), n·ε·λ₁) and k < n − 1, with c_k the null
    quantile ``capacity.largest_root_quantile(n − k, N − k, q)`` (a Monte Carlo constant, read
    from the library: this transcribes the rule, EB-4's null-law check judges the constant);
    (k, the noise mean of λ_{k+1…n}, the last threshold (n·ε·λ₁ when n = 1: no test), each
    tested eigenvalue's threshold), the means in mpmath."""
    n = len(lam)
    tiny = n * 2.0**-52 * max(lam[0], 0.0)
    k, thresholds = 0, []
    with mpmath.workdps(50):
        while k < n - 1:
            root = capacity.largest_root_quantile(n - k, dof - k, quantile)
            rest = mpmath.fsum(lam[k + 1 :]) / (n - k - 1)
            thresholds.append(max(mpmath.mpf(root) * rest, tiny))
            if not lam[k] > thresholds[-1]:
                break
            k += 1
        last = float(thresholds[-1]) if thresholds else tiny
        return k, float(mpmath.fsum(lam[k:]) / (n - k)), last, [float(t) for t in thresholds]


def spectra(seed: int) -> list[tuple[str, np.ndarray, float]]:
    """(label, spectrum, floor) cases: named ones, then 24 random spectra of
    default_rng([seed, 403]) (m from 1 to 64, log-uniform values over 4 decades, shuffled,
    scaled by 10^k for k in −200 … 200, a floor at a random fraction of σ₁ or 0)."""
    named = [
        *((f"flat rank {r}", np.ones(r), 0.0) for r in (1, 2, 3, 10, 20, 100)),
        ("rank 3 of 5, zeros after", np.array([1.0, 0.5, 0.25, 0.0, 0.0]), 0.0),
        ("zero spectrum", np.zeros(3), 0.0),
        ("one value", np.array([2.0]), 0.0),
        ("one value at its floor", np.array([2.0]), 2.0),
        ("docstring example", np.array([3.0, 2.5, 2.0, 1.5]), 0.0),
        ("with twenty 0.008", np.array([3.0, 2.5, 2.0, 1.5] + [0.008] * 20), 0.0),
        ("below the floor, no gap", np.array([1.0, 0.2, 0.1, 0.001]), 0.05),
        ("below the floor, floor 0", np.array([1.0, 0.2, 0.1, 0.001]), 0.0),
        ("unsorted", np.array([0.1, 3.0, 0.001, 0.7, 0.7]), 0.0),
        ("tiny scale", 1e-200 * np.array([1.0, 0.9, 0.05, 0.04]), 1e-202),
        ("huge scale", 1e200 * np.array([1.0, 0.9, 0.05, 0.04]), 0.0),
    ]
    rng = np.random.default_rng([seed, TAG])
    drawn = []
    for i, m in enumerate(np.resize([1, 2, 3, 5, 8, 17, 33, 64], 24)):
        values = rng.permutation(10.0 ** rng.uniform(-4, 0, int(m)))
        scale = 10.0 ** int(rng.integers(-200, 201))
        floor = float(rng.uniform(0, 0.5)) * float(values.max()) * scale if i % 2 else 0.0
        drawn.append((f"random {i} (m = {m})", values * scale, floor))
    return named + drawn


@dataclass(frozen=True)
class Comparison:
    label: str
    wrong: bool
    ratio: float  #: error / bound for reals (0 for integers)


def _over(ratio: float) -> bool:
    """An error beyond its bound: ratio > 1, or NaN (a value that is not a number is never
    within a bound; ``nan > 1`` alone would pass it)."""
    return not ratio <= 1.0


def _gap(got: float, want: Fraction | mpmath.mpf) -> float:
    """|got − want| for an exact rational or a multi-precision want; inf when got is not
    finite (so that no NaN enters the arithmetic of a bound)."""
    if not np.isfinite(got):
        return np.inf
    if isinstance(want, Fraction):
        return float(abs(Fraction(float(got)) - want))
    return float(abs(mpmath.mpf(float(got)) - want))


def _integer(label: str, got: int, want: int) -> Comparison:
    return Comparison(f"{label}: {got} ≠ {want}", got != want, 0.0)


def _real(label: str, got: float, want: object, bound: float) -> Comparison:
    want = float(want)
    err = abs(got - want) / abs(want) if want else abs(got)
    ratio = err / bound if bound else (0.0 if err == 0 else float("inf"))
    return Comparison(f"{label}: {got!r} against {want!r}", _over(ratio), ratio)


def comparisons(seed: int) -> Iterator[Comparison]:
    """Every value of the library's estimators (called through ``reference.capacity``) against
    its transcription, at every τ, η and the spectrum's floor; then the noise edges."""
    u = FLOAT64_U
    for label, s, floor in spectra(seed):
        m = s.size
        for tau in TAUS:
            got = capacity.numerical_rank(s, tau)
            yield _integer(f"{label}, numerical rank τ = {tau:g}", got, numerical_rank(s, tau))
        for eta in ETAS:
            got = capacity.energy_threshold_rank(s, eta)
            want = energy_threshold_rank(s, eta)
            yield _integer(f"{label}, energy rank η = {eta:g}", got, want)
        for f in {0.0, floor}:
            got = capacity.largest_gap_rank(s, f)
            yield _integer(f"{label}, largest gap, floor {f:g}", got, largest_gap_rank(s, f))
        yield _real(f"{label}, stable rank", capacity.stable_rank(s), stable_rank(s), gamma(m + 2))
        for name, power in (("energy_effective_rank", 2), ("roy_vetterli_rank", 1)):
            want, big_l = entropy_rank(s, power)
            bound = gamma(2 * m + 12) * (1 + big_l)
            yield _real(f"{label}, {name}", getattr(capacity, name)(s), want, bound)
        every = capacity.estimate_all(s, 1e-3, floor)
        expected = {
            "numerical_rank(tau=0.001)": numerical_rank(s, 1e-3),
            "numerical_rank(tau=0.01)": numerical_rank(s, 1e-2),
            "energy_threshold_rank(eta=0.9)": energy_threshold_rank(s, 0.9),
            "energy_threshold_rank(eta=0.99)": energy_threshold_rank(s, 0.99),
            "largest_gap_rank": largest_gap_rank(s, floor),
        }
        for key, want in expected.items():
            yield _integer(f"{label}, estimate_all[{key}]", every.get(key, -1), want)
        for se, n in ((0.0, 16), (floor, 3), (1e-3 * float(s.max(initial=0.0)), 1)):
            got = capacity.attention_gap_floor(s, se, n)
            top = max(_exact(s), default=Fraction(0))
            yield _real(
                f"{label}, gap floor SE = {se:g}, n = {n}", got, max(Fraction(se), top / n), 0.0
            )
    for noise, p, dof in EDGE_SIZES:
        got = capacity.mp_edge(noise, p, dof)
        yield _real(f"MP edge ({noise:g}, {p}, {dof})", got, mp_edge(noise, p, dof), gamma(8, u))
        for q in QUANTILES:
            got = capacity.tracy_widom_threshold(noise, p, dof, q)
            want = tracy_widom_threshold(noise, p, dof, q)
            yield _real(f"TW{q:g} ({noise:g}, {p}, {dof})", got, want, gamma(13, u))
    yield from gram_comparisons(seed)
    yield from student_comparisons(seed)
    yield from task_comparisons(seed)


def gram_comparisons(seed: int) -> Iterator[Comparison]:
    """The token Gram against its exact value, entrywise within ``gram_bound``; its count
    (at the quantiles 0.99 and 0.95) against ``gram_count`` on the library's eigenvalues,
    which must be decreasing and sum to the Gram's trace within the bound's trace: the rank
    exactly, the noise mean within γ_n and the threshold within γ_{n+1}, relative."""
    for i, (s, n, dv, r, scale) in enumerate(GRAM_SIZES):
        rng = np.random.default_rng([seed, TAG, 1, i])
        if r:
            y = scale * capacity.static_task(s, n, n, dv, r, rng, noise=0.1, spec="decay").y
        else:  # noise only
            y = scale * rng.standard_normal((s, n, dv))
        label = f"token Gram (S, n, d_v, r*, scale) = {(s, n, dv, r, scale)}"
        exact, bound = token_gram(y), gram_bound(y)
        got = capacity.token_gram(y)
        errors = [
            float(abs(Fraction(float(got[a, b])) - exact[a][b])) / bound[a, b]
            for a in range(n)
            for b in range(n)
        ]
        worst = max(errors)
        yield Comparison(f"{label}: entry error {worst:.2g} of its bound", _over(worst), worst)
        counts = {q: capacity.token_gram_count(y, q) for q in (0.99, 0.95)}
        for q, count in counts.items():
            lam = [float(v) for v in count.eigenvalues]
            trace = float(sum(exact[a][a] for a in range(n)))
            # the Gram's rounding, and LAPACK's backward error ‖E‖₂ ≤ p(n)·u·λ₁ (p(n) = n) n times
            slack = float(np.trace(bound)) + n * n * FLOAT64_U * abs(lam[0])
            ordered = (
                all(a >= b for a, b in itertools.pairwise(lam)) and abs(sum(lam) - trace) <= slack
            )
            yield Comparison(f"{label}: eigenvalues decreasing, summing to tr G", not ordered, 0.0)
            k, noise, last, thresholds = gram_count(lam, s * dv, q)
            yield _integer(f"{label}, count at q = {q:g}", count.rank, k)
            yield _integer(f"{label}, tests at q = {q:g}", len(count.thresholds), len(thresholds))
            yield _real(f"{label}, noise at q = {q:g}", count.noise, noise, gamma(n))
            # each: the mean of at most n − 1 values, then one product
            for i, (got, want) in enumerate(zip(count.thresholds, thresholds, strict=False)):
                yield _real(f"{label}, threshold {i + 1} at q = {q:g}", got, want, gamma(n + 1))
            what = f"{label}, last threshold at q = {q:g}"
            yield _real(what, count.threshold, last, gamma(n + 1))


#: Students at (S, n, d, d_v, r*): a static one of full width and a linear-QK one of rank r*,
#: 100 steps from the default initialisation at lr = 0.25/λ_max of the risk's Hessian (the
#: trainers' safe step, lr·2‖M‖₂·λ_max < 1, while ‖M‖₂ < 2, with ‖M*‖₂ = 1; their default lr
#: diverges on some draws of so few tokens). The static student learns its direction (≈ 28
#: steps where λ_max ≈ 1); the linear-QK one, whose λ_max(𝓗) is 3 … 13 here, may have moved
#: little, but its quadratic term still stands far above the rounding the bound allows.
STUDENT_SIZES = (6, 3, 2, 2, 1), (8, 4, 3, 3, 1)
STUDENT_STEPS, STUDENT_LR = 100, 0.25


def _fractions(a: np.ndarray) -> np.ndarray:
    return np.vectorize(Fraction, otypes=[object])(np.asarray(a, dtype=np.float64))


def student_comparisons(seed: int) -> Iterator[Comparison]:
    """The risk each trainer reports for its student against its definition from the
    sufficient statistics, ½tr(AHAᵀ) − tr(BᵀA) + ½c (static) or ½kᵀ𝓗k − ⟨B, K⟩ + ½c (linear
    QK), evaluated in exact rationals on the library's A (or K), H, B and c. With a = vec_row(A)
    (m = n² entries) or vec_row(K) (m = d²), the float evaluation rounds sums of at most m terms
    twice over (A H then ⟨·, A⟩, or 𝓗k then kᵀ·), the products, ⟨B, A⟩ (m terms) and two
    additions: within γ_{2m + 3}·(½|a|ᵀ|𝓗||a| + ⟨|B|, |A|⟩ + ½c), the same sum with every
    term in absolute value (𝓗 = I ⊗ H for the static student)."""
    (s, n, d, dv, r), (s2, n2, d2, dv2, r2) = STUDENT_SIZES
    rng = np.random.default_rng([seed, TAG, 2])
    task = capacity.static_task(s, n, d, dv, r, rng, noise=0.1)
    stats = capacity.static_statistics(task.x, task.y, task.value)
    lr = STUDENT_LR / np.linalg.eigvalsh(stats.h)[-1]
    fit = capacity.train_static_student(
        task.x, task.y, task.value, steps=STUDENT_STEPS, lr=lr, seed=rng
    )
    flat, hess = fit.operator.reshape(-1), np.kron(np.eye(n), stats.h)  # vec_row(A H) = (I ⊗ H)a
    yield _risk("static student", fit.loss, flat, hess, stats.b, stats.c)
    task = capacity.linear_qk_task(s2, n2, d2, dv2, r2, rng, noise=0.1)
    stats = capacity.linear_qk_statistics(task.x, task.y, task.value)
    lr = STUDENT_LR / np.linalg.eigvalsh(stats.hess)[-1]
    fit = capacity.train_linear_qk_student(
        task.x, task.y, task.value, r2, steps=STUDENT_STEPS, lr=lr, seed=rng
    )
    yield _risk(
        "linear-QK student", fit.loss, fit.operator.reshape(-1), stats.hess, stats.b, stats.c
    )


def _risk(
    label: str, got: float, a: np.ndarray, hess: np.ndarray, b: np.ndarray, c: float
) -> Comparison:
    """``student_comparisons``'s comparison of one reported risk (a = vec_row of the student;
    the envelope, itself a float sum of non-negative terms, is taken 1% larger)."""
    fa, fh, fb = _fractions(a), _fractions(hess), _fractions(b.reshape(-1))
    exact = (fa @ fh @ fa) / 2 - fb @ fa + Fraction(c) / 2
    envelope = np.abs(a) @ np.abs(hess) @ np.abs(a) / 2 + np.abs(b.reshape(-1)) @ np.abs(a) + c / 2
    ratio = _gap(got, exact) / (1.01 * gamma(2 * a.size + 3) * envelope)
    return Comparison(f"{label}: {got!r} against {float(exact)!r}", _over(ratio), ratio)


#: ``task_comparisons``' mixing maps at (S, n, d, β): a batch (n ≠ d, so that a swapped axis
#: shows), one sequence, and (β = None) a PSD K with β set so that the largest logit is
#: ``LARGEST_LOGIT``, where exp of the unshifted logits overflows (exp(709.8) is float64's
#: largest).
MIXING_SIZES = ((2, 3, 4, 2.0), (0, 3, 4, 0.5), (2, 4, 3, None))
LARGEST_LOGIT = 1000.0
#: The smallest normal float64.
TINY = 2.0**-1022


def task_comparisons(seed: int) -> Iterator[Comparison]:
    """The "decay" spectrum of the planted tasks, linspace(1, ½, r), against 1 − k/(2(r − 1))
    within γ₄ relative (the step, its multiple and the sum each rounded once, on values ≥ ½);
    and the attention maps of the planted tasks against their definitions on the library's
    float X and K, entry by entry. Linear, X K Xᵀ/n in exact rationals: two products of d-term
    sums and a division, within γ_{2d+1}·(|X||K||X|ᵀ)_ij/n. Softmax, rowsoftmax(βXKXᵀ/√d) in
    mpmath at 40 digits: each logit within γ_{2d+3}·M_i of its exact value (M_i = β/√d·max_k
    (|X||K||X|ᵀ)_ik), so a shifted logit ℓ_ij − max_k ℓ_ik within δ_i = 2γ_{2d+4}·M_i; exp (one
    ulp, 2u, in the numerator and in each term of the row sum), the sum of n positive terms and
    the division then give a relative error at most e^{2δ_i}·(1 + γ_{n+4}) − 1, plus 1e-30 for
    the 40-digit reference; and an absolute 2⁻¹⁰²² for the entries whose exp leaves the normal
    range (the row sum is ≥ 1, its maximum's term being exp(0)). The envelopes |X||K||X|ᵀ,
    computed in float (within γ_{2d} below their exact value), are taken 1% larger."""
    for r in (1, 2, 4, 5):
        got = capacity.planted_spectrum(r, "decay")
        want = [Fraction(1) - Fraction(k, 2 * (r - 1)) for k in range(r)] if r > 1 else [1]
        ok = got.shape == (r,) and all(
            _gap(g, w) <= gamma(4) * w for g, w in zip(got, want, strict=True)
        )
        yield Comparison(f"decay spectrum of {r} values: {got}", not ok, 0.0)
    rng = np.random.default_rng([seed, TAG, 3])
    for s, n, d, beta in MIXING_SIZES:
        x = rng.standard_normal((s, n, d) if s else (n, d))
        k = rng.standard_normal((d, d))
        if beta is None:  # x_i K x_iᵀ ≥ 0 for a PSD K: the largest logit is positive
            k = k @ k.T
            beta = LARGEST_LOGIT * np.sqrt(d) / np.max(x @ k @ np.swapaxes(x, -1, -2))
        label = f"mixing at (S, n, d, β) = {(s, n, d, round(float(beta), 3))}"
        envelope = 1.01 * np.abs(x) @ np.abs(k) @ np.swapaxes(np.abs(x), -1, -2)
        exact = _fractions(x) @ _fractions(k) @ np.swapaxes(_fractions(x), -1, -2)
        got = capacity.linear_attention_mixing(x, k)
        error = np.vectorize(_gap)(got, exact / n)
        worst = float(np.max(error / (gamma(2 * d + 1) * envelope / n)))
        yield Comparison(f"linear {label}: {worst:.2g} of its bound", _over(worst), worst)
        got = capacity.softmax_attention_mixing(x, k, beta)
        with mpmath.workdps(40):
            scale = mpmath.mpf(beta) / mpmath.sqrt(d)
            logits = scale * np.vectorize(lambda e: mpmath.mpf(e.numerator) / e.denominator)(exact)
            rows = np.vectorize(mpmath.exp)(logits - logits.max(axis=-1, keepdims=True))
            want = rows / rows.sum(axis=-1, keepdims=True)
            error = np.vectorize(_gap)(got, want)
            size = np.vectorize(float)(want)
        delta = 2 * gamma(2 * d + 4) * beta / np.sqrt(d) * envelope.max(axis=-1, keepdims=True)
        relative = np.expm1(2 * delta) + gamma(n + 4) * np.exp(2 * delta) + 1e-30
        worst = float(np.max(error / (relative * size + TINY)))
        yield Comparison(f"softmax {label}: {worst:.2g} of its bound", _over(worst), worst)


def unfloored_gap(s: np.ndarray, floor: float = 0.0) -> int:
    """The near miss of the estimators' check: the largest-gap rank with denominators that
    ignore the floor (σ_k/σ_{k+1}, candidates still σ_k > floor), so values below the floor make
    a gap: (1, 0.2, 0.1, 0.001) at floor 0.05 gives 3 for the true 1."""
    s = np.sort(np.asarray(s, dtype=np.float64))[::-1]
    if s.size == 0 or s[0] == 0.0 or s[0] <= floor:
        return 0
    num, den = s[:-1], s[1:]
    ratio = np.full(num.shape, np.inf)
    np.divide(num, den, out=ratio, where=den > 0)
    return int(np.argmax(np.where(num > floor, ratio, 0.0))) + 1 if s.size > 1 else 1
