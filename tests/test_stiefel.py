"""Unit tests of reference.Stiefel (DESIGN §4.0), and the basics of Euclidean and Product.

Expected values come from closed forms (tangent-space dimension, the canonical metric in the
W/W⊥ decomposition, the gradients and projections written out), from an independent numerical
solution of the geodesic ODE, or from SciPy. U is the unit roundoff 2^-53 (tests/conftest.py).
The generic laws (projector, tangent vectors, gradient, retraction order, transport) are tested
once for every geometry, Stiefel with each retraction and metric included, in
test_geometry_laws.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
from conftest import U

import reference as ref

SHAPES = [(5, 1), (6, 3), (4, 4), (10, 4)]
METRICS = ["embedded", "canonical"]


def _point(d, r, seed=0, **kw):
    st = ref.Stiefel(d, r, **kw)
    return st, st.random_point(np.random.default_rng(seed))


def _tangent(w, rng):
    """A tangent vector built without the code under test: W A + W⊥ B with A skew."""
    d, r = w.shape
    a = rng.standard_normal((r, r))
    a = (a - a.T) / 2
    xi = w @ a
    if d > r:
        wperp = scipy.linalg.null_space(w.T)
        xi = xi + wperp @ rng.standard_normal((d - r, r))
    return xi


# -- construction and dimension ----------------------------------------------------------------
@pytest.mark.parametrize(("d", "r"), [(1, 1), *SHAPES, (7, 2)])
def test_dim_formula(d, r):
    """dim = d·r − r(r + 1)/2 (that it is the rank of P_W is the range law of
    test_geometry_laws.py)."""
    st = ref.Stiefel(d, r)
    assert st.dim == d * r - r * (r + 1) // 2
    # Closed forms: the sphere S^{d−1} (r = 1) and O(d) (r = d).
    if r == 1:
        assert st.dim == d - 1
    if r == d:
        assert st.dim == d * (d - 1) // 2


def test_repr_and_shape():
    st = ref.Stiefel(6, 3, retraction="qr", metric="canonical")
    assert st.shape == (6, 3) and (st.d, st.r) == (6, 3)
    assert repr(st) == "Stiefel(6, 3, retraction='qr', metric='canonical')"
    assert isinstance(st, ref.Geometry)


# -- points ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("d", "r"), SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_point_is_orthonormal_basis_of_gaussian(d, r, seed):
    """An orthonormal basis of the range of the Gaussian draw (polar or QR factor alike)."""
    st, w = _point(d, r, seed)
    z = np.random.default_rng(seed).standard_normal((d, r))  # the draw random_point consumes
    # Gram-route polar is accurate to ≲ c·d·κ(Z)²·U, Householder QR to ≲ c·d·U (c ≈ 10);
    # the larger bound covers both constructions.
    tol = 10 * d * np.linalg.cond(z) ** 2 * U
    assert np.linalg.norm(w.T @ w - np.eye(r)) < tol
    assert st.residual(w) < tol
    assert np.linalg.norm(z - w @ (w.T @ z)) < tol * np.linalg.norm(z)  # same column space
    st.check_point(w)
    assert np.array_equal(w, _point(d, r, seed)[1])  # reproducible from the seed


def test_random_point_haar_moments():
    """Haar on St(3, 2): E[W11] = 0 and E[W11²] = 1/3 (W11 is a coordinate of a uniform unit
    vector in R³, so W11² ~ Beta(½, 1), sd √(4/45)); 5 standard errors over n = 3000 draws."""
    st, n = ref.Stiefel(3, 2), 3000
    rng = np.random.default_rng(22)
    w11 = np.array([st.random_point(rng)[0, 0] for _ in range(n)])
    assert abs(np.mean(w11)) < 5 * np.sqrt(1 / 3) / np.sqrt(n)
    assert abs(np.mean(w11**2) - 1 / 3) < 5 * np.sqrt(4 / 45) / np.sqrt(n)


# -- metric ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("d", "r"), SHAPES)
def test_metrics_closed_form(d, r):
    """For ξ = W A + W⊥ B (A skew): embedded ‖A‖² + ‖B‖², canonical ½‖A‖² + ‖B‖²."""
    rng = np.random.default_rng(4)
    _, w = _point(d, r)
    a = rng.standard_normal((r, r))
    a = (a - a.T) / 2
    b = rng.standard_normal((d - r, r))
    xi = w @ a + (scipy.linalg.null_space(w.T) @ b if d > r else 0.0)
    na, nb = np.sum(a * a), np.sum(b * b)
    # Sums of ≤ d·r products of O(1) numbers plus the rounding in forming ξ: ≤ 10·d·r·U·‖ξ‖².
    tol = 10 * d * r * U * (na + nb + 1)
    emb, can = ref.Stiefel(d, r), ref.Stiefel(d, r, metric="canonical")
    assert emb.inner(w, xi, xi) == pytest.approx(na + nb, abs=tol)
    assert can.inner(w, xi, xi) == pytest.approx(0.5 * na + nb, abs=tol)
    assert emb.norm(w, xi) == pytest.approx(np.sqrt(na + nb), abs=tol)
    assert can.norm(w, xi) == pytest.approx(np.sqrt(0.5 * na + nb), abs=tol)


@pytest.mark.parametrize("metric", METRICS)
def test_inner_is_symmetric_bilinear(metric):
    st, w = _point(6, 3, metric=metric)
    rng = np.random.default_rng(5)
    u, v = _tangent(w, rng), _tangent(w, rng)
    g = np.eye(6) - (0.5 * w @ w.T if metric == "canonical" else 0.0)
    # tr(uᵀ G v) with the metric tensor G written out: ≤ 10·d·r·U·‖u‖‖v‖ apart.
    tol = 10 * 18 * U * np.linalg.norm(u) * np.linalg.norm(v)
    assert st.inner(w, u, v) == pytest.approx(np.trace(u.T @ g @ v), abs=tol)
    assert st.inner(w, u, v) == pytest.approx(st.inner(w, v, u), abs=tol)
    assert st.inner(w, 2.0 * u, v) == pytest.approx(2.0 * st.inner(w, u, v), abs=2 * tol)


# -- projection and gradients ------------------------------------------------------------------
@pytest.mark.parametrize(("d", "r"), SHAPES)
def test_proj_closed_form_and_normal_part(d, r):
    """(Idempotence, tangency and self-adjointness in both metrics: test_geometry_laws.py.)"""
    st, w = _point(d, r)
    z = np.random.default_rng(6).standard_normal((d, r))
    p = st.proj(w, z)
    # P_W(Z) involves two products of length ≤ d: error ≲ 10·d·U·‖Z‖ per application.
    tol = 10 * d * U * np.linalg.norm(z)
    # Z − P_W(Z) is normal: W S with S symmetric, i.e. (I − WWᵀ)(Z − PZ) = 0, Wᵀ(Z − PZ) = Sᵀ.
    n = z - p
    assert np.max(np.abs(n - w @ (w.T @ n))) < tol
    s = w.T @ n
    assert np.max(np.abs(s - s.T)) < tol
    # Closed form with NumPy: Z − W (WᵀZ + ZᵀW)/2.
    assert np.max(np.abs(p - (z - w @ (w.T @ z + z.T @ w) / 2))) < tol


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize(("d", "r"), SHAPES)
def test_rgrad_closed_forms(d, r, metric):
    """The Riemannian gradient of each metric in closed form (that g(rgrad, ξ) = ⟨G, ξ⟩ and rgrad
    is tangent: test_geometry_laws.py)."""
    st, w = _point(d, r, metric=metric)
    rng = np.random.default_rng(8)
    g = rng.standard_normal((d, r))
    rg = st.egrad_to_rgrad(w, g)
    tol = 20 * d * r * U * np.linalg.norm(g)
    if metric == "canonical":
        # Edelman, Arias & Smith (1998) eq. 2.53: G − W Gᵀ W.
        assert np.max(np.abs(rg - (g - w @ g.T @ w))) < tol
    else:
        assert np.max(np.abs(rg - (g - w @ (w.T @ g + g.T @ w) / 2))) < tol


# -- retractions and the exponential map -------------------------------------------------------
@pytest.mark.parametrize(("d", "r"), SHAPES)
def test_polar_retractions_match_scipy(d, r):
    w = _point(d, r)[1]
    xi = 0.7 * _tangent(w, np.random.default_rng(10))
    expected = scipy.linalg.polar(w + xi)[0]
    # Polar forward error ≲ 10·d·κ²·U with κ(W + ξ) ≤ 3 (see above): < 1e-13.
    for retraction in ("polar", "polar_svd"):
        st = ref.Stiefel(d, r, retraction=retraction)
        assert np.max(np.abs(st.retract(w, xi) - expected)) < 1e-13
    # project_point is the nearest point, i.e. the same polar factor.
    assert np.max(np.abs(ref.Stiefel(d, r).project_point(w + xi) - expected)) < 1e-13


@pytest.mark.parametrize(("d", "r"), SHAPES)
def test_qr_retraction_closed_form(d, r):
    """Q = (W + ξ) R⁻¹ with R the Cholesky factor of the Gram (the unique positive-diagonal QR)."""
    st, w = _point(d, r, retraction="qr")
    xi = 0.7 * _tangent(w, np.random.default_rng(11))
    a = w + xi
    chol = np.linalg.cholesky(a.T @ a)  # lower, Gram = L Lᵀ, R = Lᵀ
    expected = scipy.linalg.solve_triangular(chol, a.T, lower=True).T
    # Cholesky-QR forward error ≲ 10·d·κ(A)²·U with κ ≤ 3: < 1e-13.
    assert np.max(np.abs(st.retract(w, xi) - expected)) < 1e-13


@pytest.mark.parametrize("d", [1, 3, 7])
def test_qr_equals_polar_for_r1(d):
    """For r = 1 both retractions are the normalisation (w + ξ)/‖w + ξ‖."""
    w = _point(d, 1)[1]
    xi = 0.9 * (_tangent(w, np.random.default_rng(12)) if d > 1 else np.zeros((1, 1)))
    a = w + xi
    expected = a / np.linalg.norm(a)
    # One norm and one division per entry: ≤ (d + 3)·U relative, entries ≤ 1; ×10 for the
    # Gram/SVD/Householder routes. (Exp is a different curve: the great circle, tested below.)
    for retraction in ("polar", "polar_svd", "qr"):
        y = ref.Stiefel(d, 1, retraction=retraction).retract(w, xi)
        assert np.max(np.abs(y - expected)) < 10 * (d + 3) * U


@pytest.mark.parametrize("d", [2, 5])
def test_exp_on_sphere_is_great_circle(d):
    """St(d, 1) is the sphere: Exp_w(ξ) = cos(‖ξ‖) w + sin(‖ξ‖) ξ/‖ξ‖."""
    st, w = _point(d, 1, retraction="exp")
    xi = 1.3 * st.random_tangent(w, np.random.default_rng(13))
    n = np.linalg.norm(xi)
    expected = np.cos(n) * w + np.sin(n) * xi / n
    # Two 2×2 matrix exponentials (Padé, ≲ 10·U·e^{‖block‖}, ‖block‖ ≤ 2) and a few products.
    assert np.max(np.abs(st.exp(w, xi) - expected)) < 10 * U * np.e**2 * 4


def _integrate_geodesic(w, xi, acceleration):
    """Y(1) from Ÿ = acceleration(Y, Ẏ), Y(0) = W, Ẏ(0) = ξ, integrated by DOP853 at
    rtol = atol = 1e-13."""
    d, r = w.shape

    def rhs(_t, state):
        y, v = state[: d * r].reshape(d, r), state[d * r :].reshape(d, r)
        return np.concatenate([v.ravel(), acceleration(y, v).ravel()])

    sol = scipy.integrate.solve_ivp(
        rhs, (0.0, 1.0), np.concatenate([w.ravel(), xi.ravel()]), method="DOP853",
        rtol=1e-13, atol=1e-13,
    )  # fmt: skip
    assert sol.success
    return sol.y[: d * r, -1].reshape(d, r)


def _geodesic_ode(w, xi):
    """Y(1) from Ÿ = −Y(ẎᵀẎ), Y(0) = W, Ẏ(0) = ξ (the embedded-metric geodesic equation,
    Edelman, Arias & Smith 1998 eq. 2.7), integrated by DOP853 at rtol = atol = 1e-13."""
    return _integrate_geodesic(w, xi, lambda y, v: -y @ (v.T @ v))


@pytest.mark.parametrize(("d", "r"), SHAPES)
def test_exp_solves_geodesic_equation(d, r):
    st, w = _point(d, r)
    xi = 1.2 * st.random_tangent(w, np.random.default_rng(14))
    y = st.exp(w, xi)
    # DOP853's local error per step is ≤ 1e-13 (rtol = atol); over ≲ 100 steps on [0, 1] with a
    # Lipschitz constant ≲ 2‖ξ‖² < 3 the global error stays ≤ 100·1e-13·e³ ≈ 2e-10: use 1e-9.
    assert np.max(np.abs(y - _geodesic_ode(w, xi))) < 1e-9
    assert np.linalg.norm(y.T @ y - np.eye(r)) < 1e-13  # see the retraction bound above
    assert np.array_equal(ref.Stiefel(d, r, retraction="exp").retract(w, xi), y)


def _canonical_ode(w, xi):
    """Y(1) from Ÿ + ẎẎᵀY + Y((YᵀẎ)² + ẎᵀẎ) = 0, Y(0) = W, Ẏ(0) = ξ (the canonical-metric
    geodesic equation, Edelman, Arias & Smith 1998 eq. 2.41), by DOP853 at rtol = atol = 1e-13."""

    def acceleration(y, v):
        a = y.T @ v
        return -v @ (v.T @ y) - y @ (a @ a + v.T @ v)

    return _integrate_geodesic(w, xi, acceleration)


@pytest.mark.parametrize(("d", "r"), [*SHAPES, (5, 4), (7, 3)])
def test_canonical_exp_solves_the_canonical_geodesic_equation(d, r):
    """``canonical_exp`` (EAS eq. 2.42 through the QR of [W, (I − WWᵀ)ξ]) against the ODE of
    eq. 2.41, integrated independently, including d < 2r (5, 4), where (I − WWᵀ)ξ is rank
    deficient; on the manifold; ``geodesic`` is it for the canonical metric and ``exp`` for the
    embedded one. Tolerance as for ``exp`` above (global ODE error ≤ 2e-10: 1e-9)."""
    st, w = _point(d, r, metric="canonical")
    xi = 1.2 * st.random_tangent(w, np.random.default_rng(15))
    y = st.canonical_exp(w, xi)
    assert np.max(np.abs(y - _canonical_ode(w, xi))) < 1e-9
    assert np.linalg.norm(y.T @ y - np.eye(r)) < 1e-13
    assert np.array_equal(st.geodesic(w, xi), y)
    assert np.array_equal(ref.Stiefel(d, r).geodesic(w, xi), st.exp(w, xi))


@pytest.mark.parametrize(("d", "r"), [(7, 3), (6, 2)])
def test_canonical_and_embedded_geodesics_part_at_second_order(d, r):
    """For ξ = WA + W⊥B the two geodesics' accelerations at 0 differ by W⊥BA (EAS eqs. 2.7,
    2.41), so ‖Exp^can(tξ) − Exp^emb(tξ)‖ = (t²/2)‖BA‖ + O(t³): the ratio to t²‖BA‖/2 is 1 within
    O(t) = 1e-3 at t = 1e-3; and the polar map, second order for the embedded metric, is
    therefore first order for the canonical one (``retraction_order``)."""
    st, w = _point(d, r, metric="canonical")
    rng = np.random.default_rng(17)
    a = rng.standard_normal((r, r))
    a = (a - a.T) / 2
    perp = scipy.linalg.null_space(w.T)
    b = rng.standard_normal((d - r, r))
    xi = w @ a + perp @ b
    t = 1e-3
    gap = np.linalg.norm(st.canonical_exp(w, t * xi) - st.exp(w, t * xi))
    assert abs(gap / (0.5 * t**2 * np.linalg.norm(b @ a)) - 1.0) < 1e-2
    orders = {
        rt: ref.Stiefel(d, r, rt, "canonical").retraction_order for rt in ref.stiefel.RETRACTIONS
    }
    assert orders == dict.fromkeys(ref.stiefel.RETRACTIONS, 1)
    assert ref.Stiefel(d, r, "polar").retraction_order == 2


@pytest.mark.parametrize(
    ("d", "r", "retraction", "metric", "order"),
    [
        (7, 3, "polar", "embedded", 2),
        (7, 3, "qr", "embedded", 1),
        (7, 3, "polar", "canonical", 1),
        (7, 3, "exp", "canonical", 1),
        (7, 1, "polar", "canonical", 2),  # r = 1: the two metrics coincide
        (7, 1, "qr", "canonical", 2),  # r = 1: QR is the polar map
        (4, 4, "polar", "canonical", 2),  # O(4): the canonical geodesics are the embedded ones
        (4, 4, "qr", "canonical", 1),
    ],
)
def test_retraction_order_depends_on_the_metric(d, r, retraction, metric, order):
    assert ref.Stiefel(d, r, retraction, metric).retraction_order == order


@pytest.mark.parametrize(("d", "r"), SHAPES)
def test_transport_is_projection_at_the_new_point(d, r):
    """(That it lands in the tangent space: test_geometry_laws.py.)"""
    st, w = _point(d, r)
    rng = np.random.default_rng(16)
    y = st.retract(w, 0.5 * _tangent(w, rng))
    u = _tangent(w, rng)
    tu = st.transport(w, y, u)
    tol = 10 * d * U * np.linalg.norm(u)  # one projection, as in test_proj_closed_form
    assert np.max(np.abs(tu - (u - y @ (y.T @ u + u.T @ y) / 2))) < tol
    # A vector already tangent at y is left alone.
    v = _tangent(y, rng)
    assert np.max(np.abs(st.transport(w, y, v) - v)) < 10 * d * U * np.linalg.norm(v)


def test_to_matrix_identity():
    st, w = _point(5, 2)
    u = _tangent(w, np.random.default_rng(17))
    assert st.to_matrix(w) is w and st.tangent_to_matrix(w, u) is u


# -- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize("delta", [1e-3, 0.5])
def test_check_point_reports_residual(delta):
    st, w = _point(6, 3)
    bad = w + delta * np.random.default_rng(18).standard_normal((6, 3))
    expected = np.linalg.norm(bad.T @ bad - np.eye(3))
    with pytest.raises(ValueError, match=r"off St\(6, 3\)") as info:
        st.check_point(bad)
    got = float(re.search(r"= ([0-9.]+e[-+][0-9]+) >", str(info.value)).group(1))
    # Printed with 4 significant digits: relative error ≤ 5e-4.
    assert got == pytest.approx(expected, rel=5e-4)
    # Both are norms of the same 3×3 matrix (9 squares): ≤ 20·9·U relative apart.
    assert st.residual(bad) == pytest.approx(expected, rel=20 * 9 * U)
    # With a loose enough tolerance it passes.
    st.check_point(bad, atol=2 * expected)


def test_check_point_shape_and_finite():
    st, w = _point(6, 3)
    st.check_point(w)
    with pytest.raises(ValueError, match=r"\(6, 3\).*\(3, 6\)"):
        st.check_point(w.T)
    bad = w.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="1 non-finite"):
        st.check_point(bad)


def test_check_tangent():
    st, w = _point(6, 3)
    xi = _tangent(w, np.random.default_rng(19))
    st.check_tangent(w, xi)
    st.check_tangent(w, 1e6 * xi)  # the tolerance is relative to ‖ξ‖
    # W itself is normal: Wᵀξ + ξᵀW = 2I, residual 2√3.
    with pytest.raises(ValueError, match=r"not tangent.*3\.464e\+00"):
        st.check_tangent(w, w)
    with pytest.raises(ValueError, match="non-finite"):
        st.check_tangent(w, np.full((6, 3), np.inf))
    with pytest.raises(ValueError, match="expected shapes"):
        st.check_tangent(w, xi[:, :2])


# -- Euclidean and Product (no separate file was asked for) ------------------------------------
def test_euclidean_basics():
    e = ref.Euclidean(3, 2)
    assert e.shape == (3, 2) and e.dim == 6 and repr(e) == "Euclidean(3, 2)"
    rng = np.random.default_rng(20)
    x, u, v = e.random_point(rng), rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    assert x.shape == (3, 2)
    assert np.array_equal(e.proj(x, u), u) and np.array_equal(e.egrad_to_rgrad(x, u), u)
    assert np.array_equal(e.retract(x, u), x + u)
    assert np.array_equal(e.transport(x, x + u, v), v)
    # Sums of 6 products with |u_i v_i| < 10: ≤ 10·6·U·10 apart; the norm ≤ 10·6·U relative.
    assert e.inner(x, u, v) == pytest.approx(np.sum(u * v), abs=10 * 6 * U * 10)
    assert e.norm(x, u) == pytest.approx(np.sqrt(np.sum(u * u)), rel=10 * 6 * U)
    assert e.norm(x, e.random_tangent(x, rng)) == pytest.approx(1.0, abs=10 * 6 * U)
    assert not np.any(e.zero_tangent(x))
    e.check_point(x)
    with pytest.raises(ValueError, match="expected shapes"):
        e.check_point(x.T)
    with pytest.raises(ValueError, match="non-finite"):
        e.check_point(np.full((3, 2), np.nan))
    assert isinstance(e, ref.Geometry)


def test_product_basics():
    f = (ref.Stiefel(5, 2), ref.Euclidean(3), ref.Stiefel(4, 4))
    p = ref.Product(*f)
    assert p.dim == 5 * 2 - 3 + 3 + 6
    assert p.moment_groups == ((0,), (1,), (2,))
    assert ref.Product(*f, shared_moment=True).moment_groups == ((0, 1, 2),)
    rng = np.random.default_rng(21)
    x = p.random_point(rng)
    p.check_point(x)
    u, v = p.random_tangent(x, rng), p.random_tangent(x, rng)
    # Product metric: the sum of the factors' inner products; unit norm of random_tangent.
    # Sums of 10 + 3 + 16 products of entries ≤ 1 (‖u‖ = ‖v‖ = 1): ≤ 10·29·U ≈ 3e-14.
    tol = 10 * 29 * U
    expected = sum(np.vdot(a, b) for a, b in zip(u, v, strict=True))
    assert p.inner(x, u, v) == pytest.approx(expected, abs=tol)
    assert p.norm(x, u) == pytest.approx(1.0, abs=tol)
    # Factor-wise operations.
    y = p.retract(x, u)
    for fi, xi, ui, yi in zip(f, x, u, y, strict=True):
        assert np.array_equal(yi, fi.retract(xi, ui))
    z = tuple(rng.standard_normal(np.shape(xi)) for xi in x)
    for fi, xi, zi, pi in zip(f, x, z, p.proj(x, z), strict=True):
        assert np.array_equal(pi, fi.proj(xi, zi))
    for zt in p.zero_tangent(x):
        assert not np.any(zt)
    with pytest.raises(ValueError, match="tuple of 3 arrays"):
        p.check_point(x[:2])
    with pytest.raises(ValueError, match="off St"):
        p.check_point((2 * x[0], x[1], x[2]))
    assert "Stiefel(5, 2" in repr(p) and "Euclidean(3,)" in repr(p)


def test_the_qr_retraction_is_second_order_for_one_column() -> None:
    """For r = 1, qf(W + ξ) = (W + ξ)/‖W + ξ‖ is the polar retraction, so St(d, 1) with QR
    claims order 2 (order 1 for r > 1); the Taylor slopes agree: the distance of R(tξ) to the
    geodesic has slope ≥ 2.9 (the GEO retraction law)."""
    from proofs_checks import geometry_laws as law

    one, two = ref.Stiefel(6, 1, retraction="qr"), ref.Stiefel(6, 2, retraction="qr")
    assert (one.retraction_order, two.retraction_order) == (2, 1)
    x = one.random_point(np.random.default_rng(0))
    _, tangential, _, detail = law.retraction_slopes(one, x, 0)
    assert tangential is None or tangential >= 2.9, detail
