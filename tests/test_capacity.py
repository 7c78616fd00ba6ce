"""Unit tests of reference.capacity: spectrum estimators, Marchenko–Pastur count, planted tasks,
closed forms of the static surrogate and the pooled regression, pre-training estimators.

Expected values are closed forms derived independently of the implementation (stated next to
each test) or exact relations (an estimator applied to an exactly linear model returns the
model). Tolerances are rounding bounds: U = 2^-53 is the unit roundoff.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import U

from reference import capacity as cap


def entropy_rank_closed_form(weights: list[int]) -> float:
    """exp(H(p)) for p_i = w_i/Σw with integer weights: Π (Σw/w_i)^{w_i/Σw}, an independent
    product formula (no logarithms of the implementation's normalised weights)."""
    total = sum(weights)
    return math.prod((total / w) ** (w / total) for w in weights)


# -- flat spectra ------------------------------------------------------------------------------
@pytest.mark.parametrize("r", [1, 2, 3, 7, 10, 12])
def test_flat_spectrum_gives_the_rank_exactly(r):
    """r equal singular values and three zeros: erank_E = erank_RV = stable rank = r (the
    uniform distribution on r atoms has entropy log r); r_η = ⌈ηr⌉; the gap rank is r."""
    s = np.r_[np.full(r, 2.5), np.zeros(3)]
    # exp(log r) with the entropy summed over r terms: relative error ≤ (r + 2)·4U·log r + U.
    tol = (r + 2) * 4 * U * max(math.log(r), 1) * r + 4 * U * r
    assert abs(cap.energy_effective_rank(s) - r) <= tol
    assert abs(cap.roy_vetterli_rank(s) - r) <= tol
    assert abs(cap.stable_rank(s) - r) <= 2 * r * U * r
    assert cap.numerical_rank(s) == r
    assert cap.largest_gap_rank(s) == r
    for eta, expected in ((0.9, math.ceil(Fraction(9, 10) * r)), (0.5, math.ceil(r / 2))):
        assert cap.energy_threshold_rank(s, eta) == expected
    assert cap.energy_threshold_rank(s, 1.0) == r


def test_flat_r_eta_underestimates_from_ten_on():
    """⌈0.9·r⌉ < r once r ≥ 10 (the documented bias of r_0.9)."""
    assert cap.energy_threshold_rank(np.ones(9), 0.9) == 9
    assert cap.energy_threshold_rank(np.ones(10), 0.9) == 9
    assert cap.energy_threshold_rank(np.ones(20), 0.9) == 18


# -- the spectrum (3, 2.5, 2, 1.5) ---------------------------------------------------------------
def test_unequal_spectrum_values():
    """σ = (3, 2.5, 2, 1.5) = (6, 5, 4, 3)/2: energy weights σ² ∝ (36, 25, 16, 9) (sum 86), so
    erank_E = Π(86/w)^{w/86} = 3.5708; L1 weights ∝ (6, 5, 4, 3) (sum 18), so erank_RV =
    Π(18/w)^{w/18} = 3.8763 (< 4 = rank; the background's 4.06 needs a noise tail); stable rank
    = 86/36 = 2.3889; cumulative energies 36, 61, 77, 86 of 86 give r_0.8 = 3 (77/86 = .895)
    and r_0.9 = 4; gaps 1.2, 1.25, 4/3 give 3 without the zero tail and 4 with it."""
    s = [3.0, 2.5, 2.0, 1.5]
    e_expected = entropy_rank_closed_form([36, 25, 16, 9])
    rv_expected = entropy_rank_closed_form([6, 5, 4, 3])
    assert abs(e_expected - 3.5708) < 1e-4 and abs(rv_expected - 3.8763) < 1e-4
    assert abs(cap.energy_effective_rank(s) - e_expected) <= 1e-14 * 4
    assert abs(cap.roy_vetterli_rank(s) - rv_expected) <= 1e-14 * 4
    assert abs(cap.stable_rank(s) - 86 / 36) <= 8 * U * 3
    assert cap.energy_threshold_rank(s, 0.8) == 3
    assert cap.energy_threshold_rank(s, 0.9) == 4
    assert cap.largest_gap_rank(s) == 3
    assert cap.largest_gap_rank([*s, 0.0, 0.0]) == 4
    # Twenty tail values of 0.008 inflate erank_RV (to 4.356) much more than erank_E (+< 0.01).
    tail = [*s, *([0.008] * 20)]
    assert cap.roy_vetterli_rank(tail) > 4.3
    assert cap.energy_effective_rank(tail) - e_expected < 0.01


def test_two_value_spectrum():
    """σ = (2, 1): energy weights (4, 1)/5 give erank_E = 5^{1}/(4^{4/5}) = 1.6494; L1 weights
    (2, 1)/3 give erank_RV = 3/2^{2/3} = 1.8899."""
    assert abs(cap.energy_effective_rank([2, 1]) - 5 / 4**0.8) <= 1e-15 * 8
    assert abs(cap.roy_vetterli_rank([1, 2]) - 3 / 2 ** (2 / 3)) <= 1e-15 * 8


@pytest.mark.parametrize("scale", [1e-250, 1e-100, 1.0, 1e100, 1e250])
def test_estimators_are_scale_invariant_without_overflow(scale):
    """All estimators depend on σ/σ₁ only; the implementation normalises first, so even
    σ ≈ 1e250 (σ² overflows) and σ ≈ 1e-250 (σ² underflows) give the unit-scale values."""
    s = np.array([3.0, 2.5, 2.0, 1.5, 1e-3])
    ref = cap.estimate_all(s)
    got = cap.estimate_all(scale * s)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-13), key


def test_order_of_the_input_does_not_matter():
    s = np.array([0.1, 3.0, 0.0, 2.0, 1.0])
    assert cap.estimate_all(s) == cap.estimate_all(np.sort(s)[::-1])


def test_zero_and_empty_spectra():
    for s in ([], [0.0, 0.0]):
        values = cap.estimate_all(s)
        assert all(v == 0 for v in values.values())


def test_gap_rank_floor_removes_a_spurious_noise_gap():
    """(1, 1, 1, 1e-3, 1e-6, 1e-12): without a floor the ratio 1e-6/1e-12 = 1e6 beats the
    signal gap 1/1e-3 = 1e3 and the gap rank is 5; a floor of 1e-2 gives 3."""
    s = [1, 1, 1, 1e-3, 1e-6, 1e-12]
    assert cap.largest_gap_rank(s) == 5
    assert cap.largest_gap_rank(s, floor=1e-2) == 3
    assert cap.largest_gap_rank(s, floor=2.0) == 0  # everything below the floor
    assert cap.largest_gap_rank([5.0]) == 1


def test_values_below_the_floor_cannot_make_a_gap():
    """(1, 0.2, 0.1, 0.001) with floor 0.05: the ratios are 1/0.2 = 5, 0.2/0.1 = 2 and
    0.1/max(0.001, 0.05) = 2, so k̂ = 1. A denominator that ignored the floor would see
    0.1/0.001 = 100 and answer 3 (the negative control, computed here by hand)."""
    s = [1.0, 0.2, 0.1, 0.001]
    assert cap.largest_gap_rank(s, floor=0.05) == 1
    unfloored = [s[k] / s[k + 1] for k in range(3)]
    assert int(np.argmax(unfloored)) + 1 == 3  # what the wrong rule gives
    # a value at the floor is no candidate: σ₂ = 0.05 = floor cannot start a gap
    assert cap.largest_gap_rank([1.0, 0.05, 1e-9], floor=0.05) == 1
    # the floor scales with σ: the same answer for 10·s and 10·floor
    assert cap.largest_gap_rank([10 * v for v in s], floor=0.5) == 1


def test_numerical_rank_threshold():
    s = [1.0, 0.5, 2e-3, 5e-4]
    assert cap.numerical_rank(s, 1e-3) == 3
    assert cap.numerical_rank(s, 1e-2) == 2
    assert cap.numerical_rank(s, 0.0) == 4


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: cap.energy_effective_rank([[1.0, 2.0]]), "1-D"),
        (lambda: cap.stable_rank([1.0, -0.5]), "≥ 0"),
        (lambda: cap.roy_vetterli_rank([1.0, np.nan]), "non-finite"),
        (lambda: cap.numerical_rank([1.0], tau=1.5), "tau"),
        (lambda: cap.energy_threshold_rank([1.0], eta=0.0), "eta"),
        (lambda: cap.largest_gap_rank([1.0], floor=-1.0), "floor"),
    ],
)
def test_bad_spectra_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- Marchenko–Pastur and the token-Gram count ---------------------------------------------------
def test_mp_edge_and_tracy_widom_threshold():
    """Edge σ²(1 + √(p/N))²: p = 24, N = 6400 gives (1 + √0.00375)² = 1.12622·σ². The TW 99%
    threshold lies above the edge and approaches it as N grows: for fixed p the margin is
    TW₁(0.99)·σ_np/N ≈ 2.02·p^{-1/6}·N^{-1/2} (σ_np ≈ √N·p^{-1/6}), 1.2e-4 at N = 1e8."""
    assert cap.mp_edge(2.0, 24, 6400) == pytest.approx(2 * (1 + math.sqrt(24 / 6400)) ** 2)
    thr = cap.tracy_widom_threshold(1.0, 24, 6400)
    assert cap.mp_edge(1.0, 24, 6400) < thr < 1.2
    big = cap.tracy_widom_threshold(1.0, 24, 10**8)
    assert 0 < big - cap.mp_edge(1.0, 24, 10**8) < 2.1 * 24 ** (-1 / 6) * 1e-4
    with pytest.raises(ValueError, match="quantile"):
        cap.tracy_widom_threshold(1.0, 2, 3, quantile=0.5)


@pytest.mark.parametrize(("p", "dof"), [(2, 2), (5, 7), (16, 1600), (40, 45)])
def test_the_sturm_bisection_finds_the_largest_eigenvalue(p, dof):
    """λ₁ of Laguerre tridiagonals by bisection against LAPACK on the dense matrix: both are
    within a few ulps of λ₁ (bisection stops at 2^-40 of the Gershgorin bound ≤ 3·λ₁ here)."""
    from reference.capacity import largest_root

    diagonal, off2 = largest_root.laguerre_tridiagonal(p, dof, 50, np.random.default_rng(p))
    got = largest_root.tridiagonal_largest(diagonal, off2)
    off = np.sqrt(off2)
    dense = [
        np.linalg.eigvalsh(np.diag(d) + np.diag(e, 1) + np.diag(e, -1))[-1]
        for d, e in zip(diagonal, off, strict=True)
    ]
    assert np.max(np.abs(got - dense) / dense) < 4 * 2.0**-40


def test_the_laguerre_draws_have_the_wishart_law():
    """The Laguerre matrix BBᵀ has the eigenvalues of Wishart_p(N, I): its trace is χ²_{pN}
    (mean pN, variance 2pN) and E tr((BBᵀ)²) = pN(N + p + 1). Over m = 4,000 draws at p = 6,
    N = 9 the sample means lie within 5 standard errors of those values."""
    from reference.capacity import largest_root

    p, dof, m = 6, 9, 4000
    diagonal, off2 = largest_root.laguerre_tridiagonal(p, dof, m, np.random.default_rng(1))
    trace = diagonal.sum(axis=1)
    square = (diagonal**2).sum(axis=1) + 2 * off2.sum(axis=1)
    assert abs(trace.mean() - p * dof) < 5 * math.sqrt(2 * p * dof / m)
    assert abs(square.mean() - p * dof * (dof + p + 1)) < 5 * square.std() / math.sqrt(m)


def test_the_null_law_draws_in_blocks_of_bounded_memory(monkeypatch):
    """At p = 256 and 10,000 draws each draws × p array is 20 MB, and made at once the peak
    is ~100 MB; in blocks of 2^16 entries (256 draws) the traced peak stays under 10 blocks'
    bytes (5 MB), and the quantile is a draw of the same law: within 0.05 of the one-block
    value (measured 7e-4 apart at BLOCK 2^21; the sampling sd of a 0.99 quantile of 10,000
    draws is ~0.01 here)."""
    import tracemalloc

    from reference.capacity import largest_root

    def quantile(block: int) -> tuple[float, int]:
        monkeypatch.setattr(largest_root, "BLOCK", block)
        largest_root.largest_root_quantile.cache_clear()
        tracemalloc.start()
        try:
            q = largest_root.largest_root_quantile(256, 1000, 0.99)
            return q, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            largest_root.largest_root_quantile.cache_clear()

    whole, whole_peak = quantile(2**40)
    blocked, blocked_peak = quantile(2**16)
    assert blocked_peak < 10 * 2**16 * 8 < whole_peak / 10
    assert abs(blocked - whole) < 0.05


def test_one_block_is_the_draw_the_stored_quantiles_were_made_with():
    """Below BLOCK/p draws the null law is one block from default_rng([p, dof, draws]), the
    draw it was made with before blocks: its quantile at (16, 1600) is still 1.2564, the value
    EB-4's null-law check held to dense Wishart draws (44 of 5,000 above it)."""
    assert round(cap.largest_root_quantile(16, 1600, 0.99), 4) == 1.2564


@pytest.mark.parametrize(
    ("args", "says"),
    [((1, 5), "p ≥ 2"), ((4, 3), "dof = 3"), ((4, 5, 1.0), "quantile"), ((4, 5, 0.9, 0), "draws")],
)
def test_the_null_law_refuses_what_it_cannot_draw(args, says):
    with pytest.raises(ValueError, match=says):
        cap.largest_root_quantile(*args)


def test_the_token_gram_count_goes_past_a_true_rank_at_its_level():
    """Noise only (r* = 0), n = 8, S·d_v = 40: the count answers ≥ 1 when λ₁/mean(λ₂…) exceeds
    the 0.99 null quantile, so over 1,000 data sets the false counts are Binomial(1000, α),
    α = 0.01 ± 0.001 (the quantile's Monte Carlo error): 10 ± 3.3, accepted within 5 standard
    deviations (9 measured); the count at the 0.95 quantile (37 measured) falls outside. At the
    0.9 quantile, 100 ± 9.9: a count that never detects fails there."""
    for quantile in (0.99, 0.9):  # at 0.9: 100 ± 9.9, accepted within 50 … 150
        rng = np.random.default_rng(7)
        data = [rng.standard_normal((20, 8, 2)) for _ in range(1000)]
        false = sum(cap.token_gram_count(y, quantile).rank > 0 for y in data)
        alpha = 1 - quantile
        sd = math.sqrt(1000 * alpha * quantile * (1 + 1000 / 10_000))
        assert abs(false - 1000 * alpha) <= 5 * sd, (quantile, false)


def test_token_gram_closed_form():
    """One sequence Y = [[1, 0], [0, 2], [1, 1]] (n = 3, d_v = 2): G = YYᵀ/2."""
    y = np.array([[[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]])
    expected = np.array([[1, 0, 1], [0, 4, 2], [1, 2, 2]]) / 2
    assert np.array_equal(cap.token_gram(y), expected)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("rank", "spec"), [(0, "flat"), (1, "flat"), (3, "decay"), (6, "flat")])
def test_token_gram_count_recovers_the_planted_rank(seed, rank, spec):
    """Static task, n = 20, S = 300, d = 12, d_v = 6, noise 0.1: signal eigenvalues are
    σ_i²(A*)·(d_v/d_v) ≥ 0.25 against a noise edge ≈ 0.01·(1 + √(20/1800))² ≈ 0.0122."""
    task = cap.static_task(300, 20, 12, 6, rank, seed=seed, noise=0.1, spec=spec)
    gc = cap.token_gram_count(task.y)
    assert gc.rank == rank
    assert gc.noise == pytest.approx(0.01, rel=0.1)


def test_token_gram_count_without_noise():
    """Noise 0: the trailing eigenvalues are rounding; the n·ε·λ₁ floor keeps them out."""
    task = cap.static_task(50, 10, 8, 8, 3, seed=3, noise=0.0)
    assert cap.token_gram_count(task.y).rank == 3


# -- planted tasks -------------------------------------------------------------------------------
def test_planted_objects():
    rng = np.random.default_rng(0)
    k = cap.planted_kernel(12, 3, rng, "decay")
    assert np.allclose(np.linalg.svd(k, compute_uv=False)[:4], [1.0, 0.75, 0.5, 0.0], atol=1e-14)
    kp = cap.planted_kernel(12, 3, rng, psd=True)
    assert np.allclose(kp, kp.T, atol=1e-15)
    assert np.all(np.linalg.eigvalsh(kp) > -1e-14) and np.trace(kp) == pytest.approx(3.0)
    a = cap.planted_mixer(8, 2, rng, [3.0, 1.5])
    assert np.allclose(np.linalg.svd(a, compute_uv=False)[:3], [3.0, 1.5, 0.0], atol=1e-14)
    for m, k_ in ((6, 4), (4, 6)):
        w = cap.orthonormal(m, k_, rng)
        small = w.T @ w if k_ <= m else w @ w.T
        assert np.allclose(small, np.eye(min(m, k_)), atol=1e-14)


def test_planted_tasks_shapes_and_exact_models():
    """With noise 0 the outputs are exactly the planted models (same operations)."""
    t = cap.static_task(5, 6, 4, 3, 2, seed=1, noise=0.0)
    assert t.x.shape == (5, 6, 4) and t.y.shape == (5, 6, 3) and t.rank == 2
    assert np.allclose(t.y, t.mixer @ t.x @ t.value, atol=1e-14)
    t = cap.linear_qk_task(5, 6, 4, 3, 2, seed=1, noise=0.0)
    expected = np.einsum("sia,ab,sjb,sjc,cv->siv", t.x, t.kernel, t.x, t.x, t.value) / 6
    assert np.allclose(t.y, expected, atol=1e-13)
    t = cap.softmax_task(5, 6, 4, 3, 2, beta=1.5, seed=1, noise=0.0)
    logits = 1.5 * np.einsum("sia,ab,sjb->sij", t.x, t.kernel, t.x) / 2.0
    a = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    assert np.allclose(a.sum(axis=2), 1.0)
    assert np.allclose(t.y, a @ t.x @ t.value, atol=1e-13)
    # Seeded: the same seed gives the same task.
    assert np.array_equal(
        cap.softmax_task(3, 4, 2, 2, 1, seed=7).y, cap.softmax_task(3, 4, 2, 2, 1, seed=7).y
    )


def test_static_task_with_a_token_covariance():
    """X = L Z with LLᵀ = C: the empirical token covariance Σ_s X_sX_sᵀ/(S d) ≈ C."""
    c = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 0.5]])
    t = cap.static_task(20000, 3, 5, 2, 1, seed=0, covariance=c)
    emp = np.einsum("sia,sja->ij", t.x, t.x) / (20000 * 5)
    assert np.allclose(emp, c, atol=0.02)  # ≈ 6 standard errors of √(2/100000)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: cap.planted_kernel(4, 5, 0), "1 ≤ r ≤ d"),
        (lambda: cap.planted_mixer(4, -1, 0), "0 ≤ r ≤ n"),
        (lambda: cap.planted_spectrum(3, "steep"), "spectrum"),
        (lambda: cap.planted_spectrum(2, [1.0, 0.0]), "positive"),
        (lambda: cap.planted_spectrum(3, [1.0, 0.5, 0.0]), "positive"),
        (lambda: cap.cholesky(np.array([[2.0, 1.0], [0.0, 2.0]]), 2), "symmetric"),
        (lambda: cap.static_task(0, 4, 3, 3, 1), "S, n, d, d_v"),
        (lambda: cap.linear_qk_task(3, 4, 3, 3, 1, noise=-1.0), "noise"),
        (lambda: cap.static_task(3, 3, 2, 2, 1, covariance=-np.eye(3)), "positive definite"),
        (lambda: cap.static_task(3, 3, 2, 2, 1, covariance=np.eye(2)), "3×3"),
    ],
)
def test_bad_task_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- closed forms of the static surrogate ------------------------------------------------------
def test_excess_risk_bound_and_truncation():
    """C = I, W* with orthonormal columns (‖W*‖² = d_v = 3): ℰ(A) = 3‖A − A*‖²; the bound is
    3·Σ_{i>r}σ_i²(A*) = 3·(2² + 1²) = 15 for σ(A*) = (3, 2, 1), r = 1; A_1 attains it, and any
    other rank-1 mixer does worse (Eckart–Young)."""
    rng = np.random.default_rng(4)
    a_star = cap.planted_mixer(6, 3, rng, [3.0, 2.0, 1.0])
    w = cap.orthonormal(5, 3, rng)
    assert cap.deficiency_bound(a_star, w, 1) == pytest.approx(15.0, rel=1e-13)
    a1 = cap.truncated_mixer(a_star, 1)
    assert np.linalg.matrix_rank(a1) == 1
    assert cap.static_excess_risk(a1, a_star, w) == pytest.approx(15.0, rel=1e-12)
    other = a1 + 0.01 * np.outer(rng.standard_normal(6), rng.standard_normal(6))
    assert cap.static_excess_risk(other, a_star, w) > 15.0
    assert np.allclose(cap.truncated_mixer(a_star, 3), a_star, atol=1e-14)
    assert cap.deficiency_bound(a_star, w, 3) < 1e-28


def test_excess_risk_with_covariance_matches_monte_carlo():
    """ℰ(A) = ‖W‖²‖(A − A*)C^{1/2}‖² against the sample mean of ‖(A − A*)XW‖² over 40000 draws
    (relative standard error ≈ √(2/(40000·d_v)) ≈ 0.4%; asserted at 3%)."""
    rng = np.random.default_rng(5)
    n, d, dv = 4, 3, 2
    c = np.array([[1.0, 0.3, 0, 0], [0.3, 0.8, 0.1, 0], [0, 0.1, 0.6, 0], [0, 0, 0, 0.4]])
    a_star, a = rng.standard_normal((2, n, n))
    w = rng.standard_normal((d, dv))
    x = np.linalg.cholesky(c) @ rng.standard_normal((40000, n, d))
    sample = np.mean(np.sum(((a - a_star) @ x @ w) ** 2, axis=(1, 2)))
    assert cap.static_excess_risk(a, a_star, w, c) == pytest.approx(sample, rel=0.03)


def test_pooled_population_scalar_closed_form():
    """d = 1: y_i = w Σ_j (k x_i x_j/n) x_j, so E[y_i x_i] = (wk/n)[(n − 1)E x² E x² + E x⁴]
    = wk(n + 2)/n (E x⁴ = 3), which the formula W_Vᵀ[Kᵀ + (K + tr K)/n] gives as wk(1 + 2/n)."""
    for n in (1, 2, 5):
        got = cap.pooled_population(np.array([[1.5]]), np.array([[-2.0]]), n)
        assert got[0, 0] == pytest.approx(-2.0 * 1.5 * (n + 2) / n, rel=1e-15)


# -- pre-training estimators -----------------------------------------------------------------------
def test_regressions_recover_exact_linear_models():
    """y_i = C x_i exactly: OLS returns C to rounding and a zero standard error (zero
    residuals); y_i = B x_i + D x̄: the first-order regression returns B and D."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 5, 3))
    c = rng.standard_normal((2, 3))
    reg = cap.pooled_regression(x, x @ c.T)
    assert np.allclose(reg.coef, c, atol=1e-13) and reg.stderr < 1e-12
    b, dm = rng.standard_normal((2, 4, 3))
    y = x @ b.T + x.mean(axis=1, keepdims=True) @ dm.T
    fo = cap.first_order_softmax(x, y)
    assert np.allclose(fo.coef, b, atol=1e-12) and np.allclose(fo.mean_coef, dm, atol=1e-12)


def test_ols_static_mixer_recovers_an_exact_mixer():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4, 4))
    x = rng.standard_normal((10, 4, 3))
    assert np.allclose(cap.ols_static_mixer(x, a @ x), a, atol=1e-12)
    with pytest.raises(ValueError, match="d_v = d"):
        cap.ols_static_mixer(x, rng.standard_normal((10, 4, 2)))


def test_pooled_regression_approaches_the_population_coefficient():
    """Linear QK task, n = 8, d = d_v = 4, S = 20000: Ĉ − C_n within 6 cluster-robust standard
    errors (the standard error estimates ‖Ĉ − C‖_F)."""
    t = cap.linear_qk_task(20000, 8, 4, 4, 2, seed=8, noise=0.01)
    reg = cap.pooled_regression(t.x, t.y)
    pop = cap.pooled_population(t.kernel, t.value, 8)
    assert np.linalg.norm(reg.coef - pop) <= 6 * reg.stderr


def test_inversion_estimator_is_exact_without_noise():
    """n = 6 ≤ d = d_v = 8, noise 0: Â_s = A_s exactly, so K̂ = K up to the conditioning of the
    stacked least-squares problem (asserted at 1e-8 relative)."""
    t = cap.softmax_task(40, 6, 8, 8, 2, beta=2.0, seed=9, noise=0.0)
    k_hat = cap.inversion_estimator(t.x, t.y, t.value, beta=2.0)
    assert np.linalg.norm(k_hat - t.kernel) <= 1e-8 * np.linalg.norm(t.kernel)


def test_inversion_estimator_refuses_unidentified_input():
    t = cap.softmax_task(40, 10, 4, 8, 2, seed=9)
    with pytest.raises(ValueError, match=r"n ≤ d_v .* n = 10 > d_v = 8"):
        cap.inversion_estimator(t.x, t.y, t.value)
    t = cap.softmax_task(40, 6, 4, 8, 2, seed=9)
    with pytest.raises(ValueError, match="n = 6 > d = 4"):
        cap.inversion_estimator(t.x, t.y, t.value)
    t = cap.softmax_task(2, 3, 4, 8, 2, seed=9)
    with pytest.raises(ValueError, match="not identified"):
        cap.inversion_estimator(t.x, t.y, t.value)


@pytest.mark.parametrize(
    ("x", "y", "match"),
    [
        (np.zeros((3, 4)), np.zeros((3, 4, 2)), "shape"),
        (np.zeros((3, 4, 2)), np.zeros((2, 4, 2)), "share"),
        (np.full((3, 4, 2), np.nan), np.zeros((3, 4, 2)), "non-finite"),
        (np.zeros((3, 4, 2)), np.zeros((3, 4, 2)), "rank deficient"),
    ],
)
def test_estimators_reject_bad_input(x, y, match):
    with pytest.raises(ValueError, match=match):
        cap.pooled_regression(x, y)


# -- trainers (EB-3, EB-6) -------------------------------------------------------------------
def _static_risk(a, t):
    """The raw empirical risk Σ_s ‖A X_s W − Y_s‖²/(2S‖W‖²), computed directly."""
    r = a @ t.x @ t.value - t.y
    return float(np.sum(r * r)) / (2 * t.x.shape[0] * np.sum(t.value**2))


def _qk_risk(k, x, y, w):
    """The raw empirical risk Σ_s ‖(X_sKX_sᵀ/n)X_sW_V − Y_s‖²/(2Sn), computed directly."""
    n = x.shape[1]
    r = x @ k @ np.swapaxes(x, 1, 2) @ x @ w / n - y
    return float(np.sum(r * r)) / (2 * x.shape[0] * n)


def test_static_statistics_give_the_risk_and_its_gradient():
    """L(A) = ½tr(AHAᵀ) − tr(BᵀA) + ½c against the direct sum (rounding: relative 1e-12), and the
    factor gradients against central differences: L(U + tE, V) is exactly quadratic in t (A is
    linear in U, L quadratic in A), so (L(t) − L(−t))/(2t) is the directional derivative up to
    rounding, ≈ u·|L|/t ≈ 1e-13·|L| at t = 1e-3 (asserted at 1e-7 relative)."""
    rng = np.random.default_rng(3)
    t = cap.static_task(30, 5, 4, 3, 2, rng, noise=0.1)
    st = cap.static_statistics(t.x, t.y, t.value)
    u, v = rng.standard_normal((2, 5, 4))
    a = u @ v.T
    closed = 0.5 * np.sum((a @ st.h) * a) - np.sum(st.b * a) + 0.5 * st.c
    assert abs(closed - _static_risk(a, t)) <= 1e-12 * _static_risk(a, t)
    gu, gv = cap.factor_gradients(cap.static_gradient(a, st.h, st.b), u, v)
    h = 1e-3
    for which, g in ((0, gu), (1, gv)):
        e = rng.standard_normal(u.shape)
        e_u, e_v = (e, 0) if which == 0 else (0, e)
        plus = _static_risk((u + h * e_u) @ (v + h * e_v).T, t)
        minus = _static_risk((u - h * e_u) @ (v - h * e_v).T, t)
        assert abs((plus - minus) / (2 * h) - np.sum(g * e)) <= 1e-7 * max(abs(plus), 1.0)


def test_linear_qk_statistics_give_the_risk_and_its_gradient():
    """The same two identities for the linear-QK student (L(W_Q + tE, W_K) is exactly quadratic
    in t), and the quadratic form q(Δ) = vec(Δ)ᵀ𝓗vec(Δ) = Σ_s‖X_sΔP_s‖²/(Sn)."""
    rng = np.random.default_rng(4)
    t = cap.linear_qk_task(30, 6, 4, 4, 2, rng, noise=0.1)
    st = cap.linear_qk_statistics(t.x, t.y, t.value)
    wq, wk = rng.standard_normal((2, 4, 2))
    k = wq @ wk.T
    direct = _qk_risk(k, t.x, t.y, t.value)
    closed = 0.5 * cap.quadratic_form(k, st.hess) - np.sum(st.b * k) + 0.5 * st.c
    assert abs(closed - direct) <= 1e-12 * direct
    noiseless = t.x @ k @ np.swapaxes(t.x, 1, 2) @ t.x @ t.value / 6
    q = 2 * _qk_risk(k, t.x, np.zeros_like(noiseless), t.value)
    assert abs(cap.quadratic_form(k, st.hess) - q) <= 1e-12 * q
    gq, gk = cap.factor_gradients(cap.linear_qk_gradient(k, st.hess, st.b), wq, wk)
    h = 1e-3
    for which in (0, 1):
        e = rng.standard_normal(wq.shape)
        dq, dk = (e, 0) if which == 0 else (0, e)
        plus = _qk_risk((wq + h * dq) @ (wk + h * dk).T, t.x, t.y, t.value)
        minus = _qk_risk((wq - h * dq) @ (wk - h * dk).T, t.x, t.y, t.value)
        g = gq if which == 0 else gk
        assert abs((plus - minus) / (2 * h) - np.sum(g * e)) <= 1e-7 * max(abs(plus), 1.0)


def test_trainers_accept_batches():
    """factorised_gd and the gradients broadcast over a leading batch axis: a batch of two equals
    the two problems run separately (exactly: the same floating-point operations)."""
    rng = np.random.default_rng(5)
    stats = [
        cap.static_statistics(t.x, t.y, t.value)
        for t in (cap.static_task(20, 4, 4, 4, 1, s, noise=0.1) for s in (1, 2))
    ]
    h, b = np.array([s.h for s in stats]), np.array([s.b for s in stats])
    u0, v0 = rng.standard_normal((2, 2, 4, 4)) * 0.1
    u, v = cap.factorised_gd(lambda a: cap.static_gradient(a, h, b), u0, v0, 0.1, 20)
    for i in range(2):
        ui, vi = cap.factorised_gd(
            lambda a, i=i: cap.static_gradient(a, h[i], b[i]), u0[i], v0[i], 0.1, 20
        )
        assert np.array_equal(ui, u[i]) and np.array_equal(vi, v[i])


def test_static_student_recovers_a_noiseless_mixer():
    """Without noise B = A*H exactly, so the empirical minimiser is A*; GD from α = 1e-3 for
    2000 steps with η = 0.1 reaches it (contraction ≥ 1 − 2ησ_min λ_min(H) per step on the
    learned directions) and the remaining directions stay at ≈ α² = 1e-6."""
    t = cap.static_task(200, 8, 12, 12, 2, seed=6, noise=0.0, spec=(1.5, 1.0))
    fit = cap.train_static_student(t.x, t.y, t.value, steps=2000, seed=1)
    sv = np.linalg.svd(fit.operator, compute_uv=False)
    assert np.linalg.norm(fit.operator - t.mixer) <= 1e-4
    assert cap.numerical_rank(sv, 1e-3) == 2
    # the closed-form risk cancels ½c: rounding ≈ u·c, so it may be −1e-16
    assert fit.left.shape == fit.right.shape == (8, 8) and abs(fit.loss) <= 1e-8


def test_linear_qk_student_recovers_a_noiseless_kernel():
    """Without noise the quadratic in K is minimised at K* (𝓗 ≻ 0 with S·n ≫ d²); the rank-r*
    student trained by GD reaches it; a rank-1 student cannot (its error is at least the
    Eckart–Young value √(Σ_{i>1}σ_i²) = 1 for a flat rank-2 K*)."""
    t = cap.linear_qk_task(200, 16, 6, 6, 2, seed=7, noise=0.0)
    fit = cap.train_linear_qk_student(t.x, t.y, t.value, rank=2, steps=1000, seed=1)
    assert np.linalg.norm(fit.operator - t.kernel) <= 1e-4
    assert fit.left.shape == (6, 2) and abs(fit.loss) <= 1e-8
    low = cap.train_linear_qk_student(t.x, t.y, t.value, rank=1, steps=300, seed=1)
    assert np.linalg.norm(low.operator - t.kernel) >= 1.0 - 1e-9


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"width": 0}, "student width"),
        ({"width": 9}, "student width"),
        ({"steps": -1}, "steps"),
        ({"lr": 0.0}, "lr"),
        ({"init": float("nan")}, "init"),
    ],
)
def test_static_trainer_rejects_bad_arguments(kwargs, match):
    t = cap.static_task(10, 8, 4, 4, 2, seed=1)
    with pytest.raises(ValueError, match=match):
        cap.train_static_student(t.x, t.y, t.value, **kwargs)


def test_trainers_reject_bad_shapes():
    t = cap.linear_qk_task(10, 5, 4, 3, 2, seed=1)
    with pytest.raises(ValueError, match="W_V must be d×d_v"):
        cap.linear_qk_statistics(t.x, t.y, np.eye(4))
    with pytest.raises(ValueError, match="QK rank"):
        cap.train_linear_qk_student(t.x, t.y, t.value, rank=5)
    with pytest.raises(ValueError, match="W must be d×d_v"):
        cap.static_statistics(t.x, t.y, np.eye(4))
    with pytest.raises(ValueError, match="W is zero"):
        cap.static_statistics(t.x, t.y, np.zeros((4, 3)))


# -- the floor of the largest-gap rank under attention (the rule of ``rattn rank``) -------------
def test_attention_gap_floor_is_the_larger_of_the_standard_error_and_sigma1_over_n():
    assert cap.attention_gap_floor([2.0, 1.0, 0.1], 0.05, 16) == 2.0 / 16
    assert cap.attention_gap_floor([2.0, 1.0, 0.1], 0.5, 16) == 0.5
    # σ₁ is the largest value whatever the order; an empty or zero spectrum leaves the SE
    assert cap.attention_gap_floor(np.array([0.1, 3.0, 1.0]), 0.0, 3) == 1.0
    assert cap.attention_gap_floor([], 0.25, 4) == 0.25
    assert cap.attention_gap_floor([0.0, 0.0], 0.0, 1) == 0.0
    assert cap.attention_gap_floor([4.0], 0.0, np.int64(2)) == 2.0


def test_attention_gap_floor_makes_the_finite_n_tail_no_gap():
    """A rank-2 coefficient with an O(σ₁/n) tail (EB-7): without the floor the tail's own ratios
    can win; with max(SE, σ₁/n) the gap after σ₂ is the answer."""
    s = np.array([1.0, 0.9, 0.05, 0.049, 0.001])
    assert cap.largest_gap_rank(s, 0.0) == 4
    assert cap.largest_gap_rank(s, cap.attention_gap_floor(s, 1e-3, 16)) == 2


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([1.0, np.nan], 0.1, 4), "non-finite"),
        (([1.0, -1.0], 0.1, 4), "≥ 0"),
        (([[1.0]], 0.1, 4), "1-D"),
        (([1.0], -0.1, 4), "noise must"),
        (([1.0], np.inf, 4), "noise must"),
        (([1.0], np.nan, 4), "noise must"),
        (([1.0], 0.1, 0), "n"),
        (([1.0], 0.1, 2.5), "n"),
        (([1.0], 0.1, True), "n"),
    ],
)
def test_attention_gap_floor_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        cap.attention_gap_floor(*args)


# -- trainers: argument checks and divergence --------------------------------------------------
@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 3, 0.1), "rows"),
        ((3, 0, 0.1), "width"),
        ((2.5, 3, 0.1), "rows"),
        ((3, 3, -1.0), "init"),
        ((3, 3, np.nan), "init"),
    ],
)
def test_small_init_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        cap.small_init(*args, rng=0)


def _quadratic_gradient(m):
    return m - np.eye(m.shape[-1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr": 0.0}, "lr"),
        ({"lr": np.nan}, "lr"),
        ({"steps": -1}, "steps"),
        ({"steps": 2.5}, "steps"),
        ({"v0": np.zeros((3, 2))}, "width"),
        ({"v0": np.zeros((2, 3, 3))}, "batch"),
        ({"u0": np.full((3, 3), np.nan)}, "non-finite"),
        ({"u0": np.zeros(3)}, "matrices"),
        ({"gradient": None}, "callable"),
    ],
)
def test_factorised_gd_rejects_bad_arguments(kwargs, match):
    args = {
        "gradient": _quadratic_gradient,
        "u0": np.eye(3) * 0.1,
        "v0": np.eye(3) * 0.1,
        "lr": 0.1,
        "steps": 5,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        cap.factorised_gd(**args)


def test_factorised_gd_raises_on_divergence_naming_lr_and_step():
    """A step far too large for ½‖UVᵀ − I‖² overflows; the error names lr and the step, and no
    NaN is returned (nor a RuntimeWarning raised: the overflow is expected and handled)."""
    with pytest.raises(ValueError, match=r"diverged at step \d+ of 200 with lr = 50"):
        cap.factorised_gd(_quadratic_gradient, np.eye(3), np.eye(3) * 0.5, 50.0, 200)
    u, v = cap.factorised_gd(_quadratic_gradient, np.eye(3) * 0.1, np.eye(3) * 0.1, 0.2, 200)
    assert np.allclose(u @ v.T, np.eye(3), atol=1e-6)


def test_trainers_raise_on_divergence_naming_lr():
    t = cap.static_task(50, 6, 6, 6, 2, seed=3, noise=0.1)
    with pytest.raises(ValueError, match=r"diverged at step \d+ of 300 with lr = 1000"):
        cap.train_static_student(t.x, t.y, t.value, steps=300, lr=1e3, init=1.0)
    q = cap.linear_qk_task(50, 8, 4, 4, 2, seed=3, noise=0.1)
    with pytest.raises(ValueError, match=r"diverged at step \d+ of 300 with lr = 1000"):
        cap.train_linear_qk_student(q.x, q.y, q.value, rank=2, steps=300, lr=1e3, init=1.0)
    # finite factors whose risk overflows: the final loss is checked too (never inf or NaN)
    with pytest.raises(ValueError, match=r"risk is not finite .* after 0 steps with lr = 0\.1"):
        cap.train_static_student(t.x, t.y, t.value, steps=0, lr=0.1, init=1e80)
    with pytest.raises(ValueError, match=r"risk is not finite .* after 0 steps with lr = 0\.2"):
        cap.train_linear_qk_student(q.x, q.y, q.value, rank=2, steps=0, lr=0.2, init=1e80)


def test_trainers_reject_non_integer_sizes():
    t = cap.static_task(10, 8, 4, 4, 2, seed=1)
    with pytest.raises(ValueError, match="student width"):
        cap.train_static_student(t.x, t.y, t.value, width=2.5)
    with pytest.raises(ValueError, match="steps"):
        cap.train_static_student(t.x, t.y, t.value, steps=10.0)
    q = cap.linear_qk_task(10, 5, 4, 4, 2, seed=1)
    with pytest.raises(ValueError, match="QK rank"):
        cap.train_linear_qk_student(q.x, q.y, q.value, rank=1.0)


def test_softmax_mixing_does_not_overflow_at_large_logits():
    """Logits up to ~1e3 (β = 300 on unit tokens): exp of the raw logits overflows float64
    (exp(710) = inf), the row-max-shifted softmax does not; each row is scipy's softmax to
    a few units of roundoff (n = 4 terms: relative error ≤ 8u per entry, 1e-14 taken)."""
    from scipy.special import softmax

    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3))
    k = 300.0 * np.eye(3)
    a = cap.softmax_attention_mixing(x, k)
    logits = x @ k @ x.T / np.sqrt(3)
    assert np.max(np.abs(logits)) > 710  # the unshifted exp would overflow
    assert np.allclose(a, softmax(logits, axis=-1), rtol=1e-14, atol=1e-300)


def test_attention_mixing_validates_its_input():
    x = np.random.default_rng(0).standard_normal((2, 4, 3))
    with pytest.raises(ValueError, match="K must be d×d"):
        cap.linear_attention_mixing(x, np.eye(4))
    with pytest.raises(ValueError, match="non-finite"):
        cap.softmax_attention_mixing(np.full((4, 3), np.nan), np.eye(3))
    with pytest.raises(ValueError, match="beta"):
        cap.softmax_attention_mixing(x, np.eye(3), np.inf)


def _documented_defaults() -> dict[str, dict]:
    """The table "Defaults" of docs/entropic_bound.md: module.function -> {argument: value}."""
    import ast
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "entropic_bound.md").read_text()
    section = text.split("### Defaults", 1)[1].split("###", 1)[0]
    table = {}
    for name, args in re.findall(r"^\| `([a-z_.]+)` \| (.+?) \|$", section, flags=re.M):
        table[name] = {
            k.strip(): ast.literal_eval(v.strip())
            for k, v in (item.split("=") for item in args.split(", "))
        }
    return table


def test_the_capacity_defaults_are_the_documented_ones() -> None:
    """Every public function of the capacity modules that has defaults is in the table, with
    the table's values (a changed default changes every run that leaves it out, which no check
    with explicit arguments sees); a default changed in the table is caught too."""
    import inspect

    from reference.capacity import largest_root, pretraining, spectra, tasks, trainers

    found = {}
    for module in (tasks, spectra, trainers, pretraining, largest_root):
        short = module.__name__.rpartition(".")[2]
        for name, wrapped in vars(module).items():
            fn = inspect.unwrap(wrapped)  # a cached function's own signature
            if (
                name.startswith("_")
                or not inspect.isfunction(fn)
                or fn.__module__ != module.__name__
            ):
                continue
            params = inspect.signature(fn).parameters.items()
            given = {k: p.default for k, p in params if p.default is not inspect.Parameter.empty}
            if given:
                found[f"{short}.{name}"] = given
    documented = _documented_defaults()
    assert found == documented
    documented["tasks.softmax_task"]["noise"] = 0.02
    assert found != documented


def test_the_token_gram_count_is_scale_free() -> None:
    """The count, its noise level and threshold are homogeneous in Y: G(cY) = c²G(Y) for an
    exact power of two c, so the count is the same and the noise and threshold scale by c²
    (the rounding floor n·ε·λ₁ scales with λ₁); a floor taken in absolute terms would count
    nothing for c = 2⁻⁴⁰ or everything for 2⁴⁰."""
    from reference.capacity import spectra, tasks

    task = tasks.static_task(200, 16, 16, 8, 3, seed=1, noise=0.1)
    base = spectra.token_gram_count(task.y)
    assert base.rank == 3
    for c in (2.0**-40, 2.0**40):
        got = spectra.token_gram_count(c * task.y)
        assert got.rank == base.rank
        assert got.noise == pytest.approx(c * c * base.noise, rel=1e-12)
        assert got.threshold == pytest.approx(c * c * base.threshold, rel=1e-12)


def test_gram_population_is_the_expected_token_gram_by_hand() -> None:
    """E[YYᵀ]/d_v = (‖W‖²/d_v)·A*CA*ᵀ + σ²I worked by hand: A* = I, C = diag(4, 1), W = (1, 1)ᵀ
    (‖W‖² = 2, d_v = 1), σ = 0.5: 2·diag(4, 1) + 0.25·I; refusals name the bad value."""
    got = cap.gram_population(np.eye(2), np.ones((2, 1)), 0.5, np.diag([4.0, 1.0]))
    assert np.array_equal(got, np.diag([8.25, 2.25]))
    with pytest.raises(ValueError, match=r"σ must be finite and ≥ 0, got -0\.1"):
        cap.gram_population(np.eye(2), np.ones((2, 1)), -0.1)
    with pytest.raises(ValueError, match="A\\* must be n×n, got \\(2, 3\\)"):
        cap.gram_population(np.ones((2, 3)), np.ones((2, 1)), 0.1)
