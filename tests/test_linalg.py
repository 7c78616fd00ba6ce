"""Unit tests of reference.linalg: sym/skew, norms, SPD inverse square root, polar, QR, Haar.

Expected values come from closed forms or from SciPy/NumPy computing the same quantity another
way; every tolerance is a rounding bound stated next to it. U is the unit roundoff 2^-53.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from conftest import U

from reference import linalg


def _with_singular_values(rng: np.random.Generator, d: int, r: int, sig: np.ndarray):
    """A = P diag(σ) Qᵀ with Haar P ∈ St(d, r), Q ∈ O(r): a matrix of known conditioning,
    returned with its exact-in-exact-arithmetic polar factor P Qᵀ."""
    p = np.linalg.qr(rng.standard_normal((d, r)))[0]
    q = np.linalg.qr(rng.standard_normal((r, r)))[0]
    return (p * sig) @ q.T, p @ q.T


# -- sym / skew / transpose --------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 4), (1, 1), (3, 5, 5)])
def test_sym_skew_structure_and_sum(shape):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape)
    s, k = linalg.sym(a), linalg.skew(a)
    at = np.swapaxes(a, -1, -2)
    # IEEE addition is commutative and subtraction antisymmetric, so these hold bit for bit.
    assert np.array_equal(s, np.swapaxes(s, -1, -2))
    assert np.array_equal(k, -np.swapaxes(k, -1, -2))
    # sym + skew = A: two rounded sums and one final sum, each ≤ U relative to |a_ij| + |a_ji|.
    bound = 3 * U * (np.abs(a) + np.abs(at))
    assert np.all(np.abs(s + k - a) <= bound)
    # Same matrices as NumPy's own symmetric/antisymmetric parts, entry by entry (exact ops).
    assert np.array_equal(s, (a + at) * 0.5)
    assert np.array_equal(linalg.transpose(a), at)


def test_sym_skew_are_orthogonal_projections():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 6, 6))
    # ⟨sym(A), skew(B)⟩ = 0 in exact arithmetic; the sum of 36 products has error
    # ≤ γ_36·‖sym A‖‖skew B‖ ≈ 36·U·36 (entries ≤ ~3) < 1e-12.
    assert abs(np.vdot(linalg.sym(a), linalg.skew(b))) < 1e-12
    # Idempotent: sym(sym(A)) = sym(A) exactly (the average of equal entries is exact).
    assert np.array_equal(linalg.sym(linalg.sym(a)), linalg.sym(a))
    assert np.array_equal(linalg.skew(linalg.skew(a)), linalg.skew(a))


# -- frobenius / rms ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 4), (7,), (2, 3, 5)])
def test_frobenius_matches_numpy(shape):
    a = np.random.default_rng(3).standard_normal(shape)
    expected = np.sqrt(np.sum(a * a))
    # Both sums of n = a.size squares carry relative error ≤ γ_n, plus the scaling's U per entry.
    n = a.size
    assert linalg.frobenius(a) == pytest.approx(expected, rel=4 * n * U)


@pytest.mark.parametrize("scale", [1e200, 1e-200, 1e300, 1e-300])
def test_frobenius_no_overflow_or_underflow_pythagorean(scale):
    # Closed form: ‖(3s, 4s)‖ = 5s. A plain sqrt(Σ a²) overflows to inf (1e200² > 1.8e308) or
    # flushes to 0 (1e-200² < 5e-324). Error: 3 roundings of the scaled form plus the three
    # roundings in forming 3s, 4s, 5s: ≤ 8·U relative.
    a = np.array([[3.0 * scale, 4.0 * scale]])
    assert linalg.frobenius(a) == pytest.approx(5.0 * scale, rel=8 * U)


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_frobenius_scale_equivariance(scale):
    a = np.random.default_rng(4).standard_normal((5, 3))
    # ‖sA‖ = s‖A‖; each side carries ≤ (n + 2)·U relative rounding with n = 15 entries.
    got = linalg.frobenius(scale * a)
    assert np.isfinite(got) and got > 0
    assert got == pytest.approx(scale * np.linalg.norm(a), rel=2 * 17 * U)


def test_frobenius_extremes():
    big = np.finfo(np.float64).max
    # √2·max/2 is finite and representable; the scaled computation never squares the max.
    assert linalg.frobenius(np.array([big / 2, big / 2])) == pytest.approx(
        big / np.sqrt(2), rel=4 * U
    )
    assert linalg.frobenius(np.zeros((3, 3))) == 0.0
    assert linalg.frobenius(np.zeros((0, 3))) == 0.0
    assert linalg.frobenius(np.array([[np.inf, 1.0]])) == np.inf
    assert np.isnan(linalg.frobenius(np.array([[np.nan, 1.0]])))


@pytest.mark.parametrize("scale", [1.0, 1e200, 1e-200])
def test_rms(scale):
    # RMS of a constant matrix c·1 is |c| (closed form): ≤ 4·U relative (scale, sqrt, divide).
    assert linalg.rms(np.full((4, 6), -3.0 * scale)) == pytest.approx(3.0 * scale, rel=6 * U)
    a = np.random.default_rng(5).standard_normal((4, 6)) * scale
    # RMS = ‖A‖/√(entries): same 24-term sum bound as the Frobenius test, plus two roundings.
    expected = scale * np.sqrt(np.mean((a / scale) ** 2))
    assert linalg.rms(a) == pytest.approx(expected, rel=4 * 26 * U)
    assert linalg.rms(np.zeros((0,))) == 0.0


# -- polar -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("d", "r"), [(8, 3), (5, 5), (6, 1)])
def test_polar_against_scipy_and_svd(d, r):
    rng = np.random.default_rng(8)
    a, exact = _with_singular_values(rng, d, r, rng.uniform(1.0, 2.0, r))  # κ(A) ≤ 2
    p_gram, p_svd = linalg.polar(a), linalg.polar_svd(a)
    p_scipy = scipy.linalg.polar(a)[0]
    # The Gram route's forward error is ≲ c·d·κ(A)²·U with c ≈ 10: 10·8·4·U ≈ 4e-14; the SVD
    # route's is smaller. Round up to 1e-13. The "exact" factor carries its own ~d·U rounding.
    tol = 1e-13
    for p in (p_gram, p_svd):
        assert np.max(np.abs(p - p_scipy)) < tol
        assert np.max(np.abs(p - exact)) < tol
        assert np.max(np.abs(p.T @ p - np.eye(r))) < tol
    # A = P H with H = PᵀA symmetric positive definite (the defining property of the factor).
    h = p_gram.T @ a
    assert np.max(np.abs(h - h.T)) < tol * 2  # ‖A‖ ≤ 2
    assert np.min(np.linalg.eigvalsh(linalg.sym(h))) > 0.9  # = min σ ≥ 1 up to rounding


def test_polar_corrects_drift():
    """The Gram actually formed is used: a point off the manifold is mapped back onto it."""
    rng = np.random.default_rng(9)
    w = scipy.linalg.polar(rng.standard_normal((7, 3)))[0]
    a = w + 1e-4 * rng.standard_normal((7, 3))
    p = linalg.polar(a)
    # κ(A) ≤ (1 + 1e-3)/(1 − 1e-3): orthonormality error ≲ 10·d·U ≈ 1e-14.
    assert np.max(np.abs(p.T @ p - np.eye(3))) < 1e-13
    assert np.max(np.abs(p - scipy.linalg.polar(a)[0])) < 1e-13


def test_polar_batched():
    rng = np.random.default_rng(10)
    a = rng.standard_normal((4, 6, 2)) + 2 * np.eye(6, 2)
    p = linalg.polar(a)
    for k in range(4):
        # Per-slice Gram polar: forward error ≲ c·d·κ(A)²·U with c ≈ 10.
        tol = 10 * 6 * np.linalg.cond(a[k]) ** 2 * U
        assert np.max(np.abs(p[k] - scipy.linalg.polar(a[k])[0])) < tol


@pytest.mark.parametrize(
    "scale",
    [
        1e-4,
        1e-9,
    ],
)
def test_polar_batched_slices_of_different_scale(scale):
    """Each slice is an independent matrix: polar(stack[A, sA]) = stack[polar A, polar A]."""
    rng = np.random.default_rng(10)
    a, exact = _with_singular_values(rng, 6, 3, rng.uniform(1.0, 2.0, 3))  # κ(A) ≤ 2
    p = linalg.polar(np.stack([a, scale * a]))
    # Per slice, the bound of test_polar_against_scipy_and_svd (scaling adds one rounding).
    assert np.max(np.abs(p[0] - exact)) < 1e-13
    assert np.max(np.abs(p[1] - exact)) < 1e-13


@pytest.mark.parametrize(
    "a",
    [np.zeros((4, 2)), np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])],
    ids=["zero", "equal-columns"],
)
def test_polar_rejects_rank_deficient(a):
    with pytest.raises(ValueError, match="rank-deficient"):
        linalg.polar(a)


@pytest.mark.parametrize("scale", [1e-170, 1e160])
def test_polar_scale_invariance(scale):
    rng = np.random.default_rng(11)
    a, exact = _with_singular_values(rng, 6, 3, rng.uniform(1.0, 2.0, 3))
    # Same bound as test_polar_against_scipy_and_svd; scaling by s adds one rounding per entry.
    assert np.max(np.abs(linalg.polar(scale * a) - exact)) < 1e-13


@pytest.mark.parametrize("scale", [1e-170, 1e160, 1e-300, 1e300])
def test_polar_svd_scale_invariance(scale):
    rng = np.random.default_rng(11)
    a, exact = _with_singular_values(rng, 6, 3, rng.uniform(1.0, 2.0, 3))
    # The SVD never squares A: same 1e-13 bound as the unscaled comparison.
    assert np.max(np.abs(linalg.polar_svd(scale * a) - exact)) < 1e-13


# -- qr_signfixed ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 3), (4, 4), (6, 1), (2, 5, 3)])
def test_qr_signfixed(shape):
    rng = np.random.default_rng(12)
    a = rng.standard_normal(shape)
    a[..., 0, 0] = -abs(a[..., 0, 0]) - 1.0  # LAPACK would give R_00 < 0 without the fix
    q, r = linalg.qr_signfixed(a)
    k = shape[-1]
    diag = np.diagonal(r, axis1=-2, axis2=-1)
    assert np.all(diag >= 0.0)
    assert np.array_equal(r, np.triu(r))  # exact zeros below the diagonal
    # Householder QR is backward stable: ‖QR − A‖ ≤ c·d·U‖A‖ and ‖QᵀQ − I‖ ≤ c·d·U, c ≈ 10;
    # with d ≤ 6 and ‖A‖ ≤ 5 that is ≤ 10·6·U·5 ≈ 7e-14, rounded up to 1e-13.
    assert np.max(np.abs(q @ r - a)) < 1e-13
    qtq = np.swapaxes(q, -1, -2) @ q
    assert np.max(np.abs(qtq - np.eye(k))) < 1e-13
    # Uniqueness: R is the Cholesky factor of AᵀA (positive diagonal), computed independently;
    # Cholesky of the Gram has forward error ≲ c·k·κ(A)²·U‖A‖ with c ≈ 10.
    chol = np.linalg.cholesky(np.swapaxes(a, -1, -2) @ a)
    kappa = np.max(np.linalg.cond(a))
    tol = 10 * k * kappa**2 * U * np.max(np.linalg.norm(a, axis=(-2, -1)))
    assert np.max(np.abs(r - np.swapaxes(chol, -1, -2))) < tol


def test_qr_signfixed_r1_is_normalisation():
    a = np.array([[3.0], [-4.0], [0.0]])
    q, r = linalg.qr_signfixed(a)
    # Closed form: Q = a/‖a‖ = (0.6, −0.8, 0), R = 5; a handful of roundings.
    assert np.allclose(q, a / 5.0, rtol=0, atol=4 * U)
    assert r[0, 0] == pytest.approx(5.0, rel=4 * U)


# -- haar_orthogonal / expm --------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 3, 10])
def test_haar_orthogonal_is_orthogonal(d):
    q = linalg.haar_orthogonal(d, np.random.default_rng(13))
    # QR of a d×d Gaussian: orthogonality error ≤ c·d·U with c ≈ 10: < 1e-13 for d ≤ 10.
    assert np.max(np.abs(q.T @ q - np.eye(d))) < 1e-13
    assert np.max(np.abs(q @ q.T - np.eye(d))) < 1e-13
    assert abs(abs(np.linalg.det(q)) - 1.0) < 1e-13
    # Reproducible from the seed.
    assert np.array_equal(q, linalg.haar_orthogonal(d, np.random.default_rng(13)))


def test_haar_orthogonal_moments():
    """Haar on O(3): E[Q11] = 0, E[Q11²] = 1/3, P(det Q = 1) = 1/2.

    Without the sign fix LAPACK's Q11 = −|a11|/‖a1‖ < 0 always, so E[Q11] ≈ −0.5 and the first
    check fails. Bounds are 5 standard errors with n = 4000 samples: sd(Q11) = √(1/3),
    sd(Q11²) = √(4/45) (Q11² ~ Beta(½, 1)), sd(1[det > 0]) = ½.
    """
    rng = np.random.default_rng(14)
    n = 4000
    qs = np.array([linalg.haar_orthogonal(3, rng) for _ in range(n)])
    q11 = qs[:, 0, 0]
    assert abs(np.mean(q11)) < 5 * np.sqrt(1 / 3) / np.sqrt(n)
    assert abs(np.mean(q11**2) - 1 / 3) < 5 * np.sqrt(4 / 45) / np.sqrt(n)
    assert abs(np.mean(np.linalg.det(qs) > 0) - 0.5) < 5 * 0.5 / np.sqrt(n)


@pytest.mark.parametrize("theta", [0.0, 0.3, 2.0])
def test_expm_rotation_closed_form(theta):
    a = np.array([[0.0, -theta], [theta, 0.0]])
    c, s = np.cos(theta), np.sin(theta)
    # Padé scaling and squaring: relative error ≲ 10·U·e^{‖A‖} ≤ 10·U·e² ≈ 1e-14.
    assert np.allclose(linalg.expm(a), [[c, -s], [s, c]], rtol=0, atol=1e-14)
    d = np.diag([0.5, -1.0, 2.0])
    assert np.allclose(linalg.expm(d), np.diag(np.exp([0.5, -1.0, 2.0])), rtol=1e-14, atol=0)


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_the_polar_rank_test_is_relative_to_the_largest_eigenvalue_times_d(factor):
    """``polar`` refuses A when λ_min(AᵀA) ≤ ε·λ_max·d (d = A's rows): a 10×2 A whose squared
    singular values are 1 and factor·ε·10 is refused at factor ½ and accepted at 2 (a threshold
    ε·λ_max/d, or without d, would accept both)."""
    d = 10
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((d, 2)))
    a = q * np.sqrt([1.0, factor * np.finfo(np.float64).eps * d])
    if factor < 1:
        with pytest.raises(ValueError, match="rank-deficient"):
            linalg.polar(a)
    else:
        from proofs_checks.bounds import frame_error

        p = linalg.polar(a)  # κ(A)² = 1/(2ε·10) > 10²: the SVD route, whose U Vᵀ is a frame
        assert np.linalg.norm(p.T @ p - np.eye(2)) <= frame_error(d, 2)
