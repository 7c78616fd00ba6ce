"""Cross-checks of the reference geometries against an independent implementation and against
independent numerical derivations.

1. R1 (``reference.FixedRankEmbedded``) against pymanopt 2.2.1's ``FixedRankEmbedded`` at
   (m, n, r) = (7, 5, 2): the same point, the Riemannian gradient of the same matrix function, the
   projection, the retraction and the transport, each also against a closed form on formed
   matrices. pymanopt stores (u, s, vt) with s a vector (diagonal S) and takes Euclidean gradients
   (du, ds, dvt) with respect to those factors; our (U, S, V) with a general invertible S is
   converted by the SVD S = Y diag(s) Zᵀ: (U Y, s, (V Z)ᵀ) is the same matrix. pymanopt's
   ``retraction`` is the truncated SVD of W + ξ (QR of U_p and V_p, then an SVD of a 2r×2r core),
   the metric projection onto the rank-r matrices: the same map as our default retraction, so the
   results are compared as matrices to rounding (not merely to second order).
2. ``reference.Stiefel`` against pymanopt's ``Stiefel``: projection,
   ``euclidean_to_riemannian_gradient``, ``exp``, the QR retraction (pymanopt's default; compared
   with ``Stiefel(retraction="qr")``) and the polar retraction (pymanopt's SVD polar against our
   Gram polar).
3. R2 (``reference.FixedRankQuotient``, both metrics), with no peer implementation: for
   f(A, B) = F(A Bᵀ), g(rgrad, η) equals a central finite difference of f along random horizontal
   η, within the bound derived in ``_fd_bound``; and rgrad is the unique horizontal vector with
   g(rgrad, η) = Df[η] for all horizontal η, found by solving the metric system on a basis of the
   horizontal space computed independently (the null space of the vertical constraints).

The pymanopt parts are skipped when pymanopt is not installed.

Rounding model (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §3.5): u is the
unit roundoff 2^-53 and γ_k = k·u/(1 − k·u); a product with inner dimension k has
‖fl(AB) − AB‖_F ≤ γ_k ‖A‖_F ‖B‖_F, and the errors of a chain of such steps add to first order.
Householder QR, the SVD and LU solves are normwise backward stable with constants of the same
form (γ_{ck} for a small c, Higham Thms 19.4, 9.4 and §20). Each tolerance below is such a bound,
evaluated on the actual data; none is tuned to the observed errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from conftest import U

import reference as ref
from proofs_checks.bounds import gamma

M, N, R = 7, 5, 2

#: Number of rounding steps (products, factorizations, solves) in the longest chain of any of the
#: computations compared below, each contributing ≤ γ_k·(its input norms) to first order; with the
#: constant c ≤ 3 of backward-stable factorizations this is a generous count (≤ 8 steps × 3).
CHAIN = 24


def fro(a) -> float:
    return float(np.linalg.norm(a))


# -- a smooth matrix function and its gradient --------------------------------------------------
def _function(c):
    """F(W) = Σ_ij sin(W_ij) + ⟨C, W⟩ and its gradient ∇F(W) = cos(W) + C (entrywise cos).

    Every derivative of the sine part is bounded by 1 entrywise, which ``_fd_bound`` uses."""

    def f(w):
        return float(np.sum(np.sin(w)) + np.vdot(c, w))

    def grad(w):
        return np.cos(w) + c

    return f, grad


# =================================================================================================
# 1. R1 against pymanopt's FixedRankEmbedded
# =================================================================================================
@pytest.fixture
def r1():
    """Our R1 at a random point with non-diagonal S, the same point in pymanopt's layout, and
    a smooth F with its gradient at W."""
    pm = pytest.importorskip("pymanopt.manifolds")
    rng = np.random.default_rng(20240)
    geo = ref.FixedRankEmbedded(M, N, R)
    x = geo.random_point(rng)
    u, s_mat, v = x
    assert fro(s_mat - np.diag(np.diag(s_mat))) > 0.1  # S is genuinely non-diagonal
    y, s, zt = np.linalg.svd(s_mat)
    xp = (u @ y, s, (v @ zt.T).T)
    _, grad = _function(rng.standard_normal((M, N)))
    w = geo.to_matrix(x)
    return {
        "rng": rng,
        "geo": geo,
        "x": x,
        "peer": pm.FixedRankEmbedded(M, N, R),
        "xp": xp,
        "yz": (y, zt.T),
        "w": w,
        "g": grad(w),
    }


def _peer_matrix(xp) -> np.ndarray:
    u, s, vt = xp
    return (u * s) @ vt


def _peer_tangent_matrix(xp, t) -> np.ndarray:
    """pymanopt's (Up, M, Vp) at (u, s, vt): u M vt + Up vt + u Vpᵀ."""
    u, _, vt = xp
    return (u @ t.M + t.Up) @ vt + u @ t.Vp.T


def _tangent_projection(u, v, z) -> np.ndarray:
    """P_W(Z) = UUᵀZ + ZVVᵀ − UUᵀZVVᵀ on formed matrices (the closed form, not the code)."""
    pu, pv = u @ u.T, v @ v.T
    return pu @ z + z @ pv - pu @ z @ pv


def _to_peer_tangent(d, xi):
    """Our (M, U_p, V_p) at (U, S, V) as pymanopt's (Up', M', Vp') at (U Y, s, (V Z)ᵀ):
    U M Vᵀ + U_p Vᵀ + U V_pᵀ = (UY)(YᵀMZ)(VZ)ᵀ + (U_p Z)(VZ)ᵀ + (UY)(V_p Y)ᵀ."""
    y, z = d["yz"]
    m_, u_p, v_p = xi
    vector_type = type(d["peer"].zero_vector(d["xp"]))  # pymanopt's (Up, M, Vp) named tuple
    return vector_type(u_p @ z, y.T @ m_ @ z, v_p @ y)


def _r1_tol(d, amplification: float = 0.0) -> float:
    """CHAIN·γ_max(m,n)·‖G‖_F·r·(κ(S) + amplification): each step of the chains below multiplies
    by U, V (‖·‖_F = √r each, two of them give r), by S^{-1} (κ(S)·‖S‖^{-1}·‖S‖), or, in pymanopt's
    M, divides by s_j² − s_i² after cancelling terms of size s²·|A_ij| (``amplification``)."""
    s = d["xp"][1]
    return CHAIN * gamma(max(M, N)) * fro(d["g"]) * R * (s[0] / s[-1] + amplification)


def _peer_amplification(s) -> float:
    """max s² / min_{i≠j} |s_i² − s_j²|: pymanopt's M = f ∘ (…) with f_ij = 1/(s_j² − s_i²)
    recovers A_ij from A_ij(s_j² − s_i²) plus rounding of size u·s²·|A|."""
    gaps = np.abs(s[:, None] ** 2 - s[None, :] ** 2)[~np.eye(len(s), dtype=bool)]
    return float(s[0] ** 2 / np.min(gaps))


def test_r1_same_point(r1) -> None:
    d = r1
    # ‖U S Vᵀ − (UY) diag(s) (VZ)ᵀ‖ ≤ (SVD backward error + products) ≤ CHAIN·γ_r·‖S‖·r.
    tol = CHAIN * gamma(R) * fro(d["x"][1]) * R
    assert fro(d["w"] - _peer_matrix(d["xp"])) <= tol
    d["geo"].check_point(d["x"])


def test_r1_riemannian_gradient_matches_pymanopt(r1) -> None:
    """The rgrad of the same F: ours from (G_U, G_S, G_V), pymanopt's from (du, ds, dvt), both
    factor gradients (no m×n input), against the closed form P_W(∇F)."""
    d = r1
    geo, x, g = d["geo"], d["x"], d["g"]
    u, s, vt = d["xp"]
    ours = geo.tangent_to_matrix(x, geo.egrad_to_rgrad(x, geo.egrad_from_matrix(x, g)))
    # pymanopt's Euclidean gradient of f(u, s, vt) = F(u diag(s) vt), s a vector:
    # ∂f/∂u = G vtᵀ diag(s), ∂f/∂s = diag(uᵀ G vtᵀ), ∂f/∂vt = diag(s) uᵀ G.
    egrad = ((g @ vt.T) * s, np.diag(u.T @ g @ vt.T).copy(), s[:, None] * (u.T @ g))
    theirs = _peer_tangent_matrix(
        d["xp"], d["peer"].euclidean_to_riemannian_gradient(d["xp"], egrad)
    )
    truth = _tangent_projection(x[0], x[2], g)
    assert fro(ours - truth) <= _r1_tol(d)
    amp = _peer_amplification(s)
    assert fro(theirs - truth) <= _r1_tol(d, amp)
    assert fro(ours - theirs) <= _r1_tol(d) + _r1_tol(d, amp)


def test_r1_projection_matches_pymanopt(r1) -> None:
    """pymanopt's ``projection`` of the m×n ambient G against our ``proj`` of G's factor
    gradient (its only input format) and the closed form."""
    d = r1
    geo, x, g = d["geo"], d["x"], d["g"]
    ours = geo.tangent_to_matrix(x, geo.proj(x, geo.egrad_from_matrix(x, g)))
    theirs = _peer_tangent_matrix(d["xp"], d["peer"].projection(d["xp"], g))
    truth = _tangent_projection(x[0], x[2], g)
    assert fro(ours - truth) <= _r1_tol(d)
    assert fro(theirs - truth) <= _r1_tol(d)


def _truncated_svd(a, r):
    yy, ss, zz = np.linalg.svd(a)
    return (yy[:, :r] * ss[:r]) @ zz[:r], ss


@pytest.mark.parametrize("step", [1e-3, 0.3, 1.0])
def test_r1_retraction_matches_pymanopt(r1, step) -> None:
    """Both retractions are the rank-r truncated SVD of W + ξ; compared with each other and with a
    full SVD of the formed W + ξ. Perturbation bound: each computed result is T_r(W + ξ + E) with
    ‖E‖_F ≤ CHAIN·γ_max(m,n)·‖W + ξ‖_F (backward stable QR, SVD and products), and
    ‖T_r(A + E) − T_r(A)‖_F ≤ ‖E‖_F (1 + 2σ_1/δ), δ = σ_r − σ_{r+1} (Wedin's sin θ theorem for the
    two singular subspaces, each rotated by ≤ ‖E‖/δ, applied to A of norm σ_1). pymanopt adds
    np.spacing(1) to each kept singular value: a further √r·2u."""
    d = r1
    geo, x = d["geo"], d["x"]
    xi = d["geo"].random_tangent(x, d["rng"])
    xi = tuple(step * p for p in xi)
    ours = geo.to_matrix(geo.retract(x, xi))
    theirs = _peer_matrix(d["peer"].retraction(d["xp"], _to_peer_tangent(d, xi)))
    a = d["w"] + geo.tangent_to_matrix(x, xi)
    truth, sig = _truncated_svd(a, R)
    bound = CHAIN * gamma(max(M, N)) * fro(a) * (1 + 2 * sig[0] / (sig[R - 1] - sig[R]))
    assert fro(ours - truth) <= bound
    assert fro(theirs - truth) <= bound + np.sqrt(R) * 2 * U
    assert fro(ours - theirs) <= 2 * bound + np.sqrt(R) * 2 * U


def test_r1_transport_matches_pymanopt(r1) -> None:
    """Both transports project the old tangent matrix at the new point: against each other and
    the closed form P_{W'}(ξ) with W' = our retracted point (its singular subspaces agree with
    pymanopt's to the retraction bound, which enters multiplied by ‖ξ‖)."""
    d = r1
    geo, x = d["geo"], d["x"]
    xi = geo.random_tangent(x, d["rng"])
    y = geo.retract(x, tuple(0.3 * p for p in xi))
    xi_p = _to_peer_tangent(d, xi)
    yp = d["peer"].retraction(d["xp"], 0.3 * xi_p)
    ours = geo.tangent_to_matrix(y, geo.transport(x, y, xi))
    theirs = _peer_tangent_matrix(yp, d["peer"].transport(d["xp"], yp, xi_p))
    xi_mat = geo.tangent_to_matrix(x, xi)
    truth = _tangent_projection(y[0], y[2], xi_mat)
    a = d["w"] + 0.3 * xi_mat
    sig = np.linalg.svd(a, compute_uv=False)
    subspace = CHAIN * gamma(max(M, N)) * fro(a) * 2 / (sig[R - 1] - sig[R])  # rotation ≤ ‖E‖/δ
    tol = CHAIN * gamma(max(M, N)) * fro(xi_mat) * R
    assert fro(ours - truth) <= tol
    assert fro(theirs - truth) <= tol + 2 * subspace * fro(xi_mat)


# =================================================================================================
# 2. Stiefel against pymanopt's Stiefel
# =================================================================================================
D, P = 7, 3


@pytest.fixture
def stiefel():
    pm = pytest.importorskip("pymanopt.manifolds")
    rng = np.random.default_rng(77)
    st = ref.Stiefel(D, P)
    w = st.random_point(rng)
    return pm, st, w, rng


def _st_tol(*norms: float) -> float:
    """CHAIN·γ_d·(product of the norms entering the chain), W contributing ‖W‖_F = √p."""
    return CHAIN * gamma(D) * float(np.prod(norms)) * P


def test_stiefel_projection_and_rgrad_match_pymanopt(stiefel) -> None:
    pm, st, w, rng = stiefel
    peer = pm.Stiefel(D, P)
    z = rng.standard_normal((D, P))
    truth = z - w @ (w.T @ z + z.T @ w) / 2
    for ours, theirs in (
        (st.proj(w, z), peer.projection(w, z)),
        (st.egrad_to_rgrad(w, z), peer.euclidean_to_riemannian_gradient(w, z)),
    ):
        assert fro(ours - theirs) <= 2 * _st_tol(fro(z))
        assert fro(ours - truth) <= _st_tol(fro(z))


@pytest.mark.parametrize("size", [1e-2, 0.5, 2.0])
def test_stiefel_exp_matches_pymanopt(stiefel, size) -> None:
    """Both evaluate Exp_W(ξ) = [W, ξ] expm([[A, −S], [I, A]])[:, :p] expm(−A). SciPy's expm has
    backward error ≤ u·‖X‖ (Al-Mohy & Higham 2009), so its forward error is ≤ u·‖X‖·e^{‖X‖}
    (the condition number of expm is ≤ e^{‖X‖}‖X‖/‖e^X‖); the products add CHAIN·γ_2p times the
    norms of the factors, ‖[W, ξ]‖·e^{‖X‖}·e^{‖A‖}."""
    pm, st, w, rng = stiefel
    peer = pm.Stiefel(D, P)
    xi = size * st.random_tangent(w, rng)
    a, s = w.T @ xi, xi.T @ xi
    x_norm = np.linalg.norm(np.block([[a, -s], [np.eye(P), a]]), 2)
    scale = fro(np.hstack([w, xi])) * np.exp(x_norm) * np.exp(np.linalg.norm(a, 2))
    tol = (CHAIN * gamma(2 * P) + 2 * U * x_norm) * scale
    assert fro(st.exp(w, xi) - peer.exp(w, xi)) <= 2 * tol


def test_stiefel_qr_retraction_matches_pymanopt(stiefel) -> None:
    """pymanopt's default retraction is the QR factor of W + ξ with diag(R) made positive; ours
    with retraction="qr" is the same. Householder QR is backward stable (‖E‖_F ≤ CHAIN·γ_d‖A‖_F
    for A = W + ξ), and the Q factor of a full-rank A moves by ≤ √2·κ₂(A)·‖E‖_F/‖A‖₂ to first
    order (Sun 1991); ‖A‖_F/‖A‖₂ ≤ √p. Two implementations: twice that."""
    pm, st, w, rng = stiefel
    peer = pm.Stiefel(D, P)
    ours_geo = ref.Stiefel(D, P, retraction="qr")
    for size in (1e-2, 0.5, 2.0):
        xi = size * st.random_tangent(w, rng)
        kappa = np.linalg.cond(w + xi)
        tol = 2 * np.sqrt(2) * kappa * CHAIN * gamma(D) * np.sqrt(P)
        assert fro(ours_geo.retract(w, xi) - peer.retraction(w, xi)) <= tol


def test_stiefel_polar_retraction_matches_pymanopt(stiefel) -> None:
    """pymanopt's "polar" option is the SVD polar factor of A = W + ξ, ours the Gram polar
    A (AᵀA)^{-1/2}. The polar factor of a full-column-rank A moves by ≤ 2‖E‖_F/σ_min(A) under a
    perturbation E (Higham, Functions of Matrices, 2008, Thm 8.9), so the backward-stable SVD
    route is within CHAIN·γ_d·√p·2κ(A); the Gram route squares the condition number (AᵀA is
    formed), adding CHAIN·γ_d·√p·κ(A)²."""
    pm, st, w, rng = stiefel
    peer = pm.Stiefel(D, P, retraction="polar")
    for size in (1e-2, 0.5, 2.0):
        xi = size * st.random_tangent(w, rng)
        kappa = np.linalg.cond(w + xi)
        tol = CHAIN * gamma(D) * np.sqrt(P) * (2 * kappa + kappa**2)
        assert fro(st.retract(w, xi) - peer.retraction(w, xi)) <= tol


# =================================================================================================
# 3. R2: finite differences and the metric system on an independent horizontal basis
# =================================================================================================
METRICS = ["preconditioned", "balanced"]


@pytest.fixture(params=METRICS)
def r2(request):
    rng = np.random.default_rng(31 + METRICS.index(request.param))
    geo = ref.FixedRankQuotient(M, N, R, metric=request.param)
    x = geo.random_point(rng)
    c = rng.standard_normal((M, N))
    f, grad = _function(c)
    a, b = x
    g = grad(a @ b.T)
    egrad = (g @ b, g.T @ a)  # chain rule for f(A, B) = F(A Bᵀ), independent of the code
    basis = _horizontal_basis(geo, x)
    return {"geo": geo, "x": x, "rng": rng, "c": c, "f": f, "egrad": egrad, "basis": basis}


def _metric_weights(metric: str, a, b):
    """(W_A, W_B) with g = tr(W_A ξ_Aᵀη_A) + tr(W_B ξ_Bᵀη_B), from DESIGN §4.2."""
    ata, btb = a.T @ a, b.T @ b
    if metric == "preconditioned":
        return btb, ata
    return np.linalg.inv(ata), np.linalg.inv(btb)


def _metric_matrix(metric: str, x) -> np.ndarray:
    """The metric on factor space as a matrix on vec(ξ) = [ravel(ξ_A); ravel(ξ_B)] (row-major):
    tr(W ξᵀη) = Σ_i ξ[i, :] W η[i, :]ᵀ, i.e. blockdiag(I_m ⊗ W_A, I_n ⊗ W_B)."""
    wa, wb = _metric_weights(metric, *x)
    return scipy.linalg.block_diag(np.kron(np.eye(M), wa), np.kron(np.eye(N), wb))


def _vec(t) -> np.ndarray:
    return np.concatenate([np.ravel(t[0]), np.ravel(t[1])])


def _unvec(v):
    return v[: M * R].reshape(M, R), v[M * R :].reshape(N, R)


def _horizontal_basis(geo, x) -> np.ndarray:
    """A Euclidean-orthonormal basis (columns) of the horizontal space at x: the null space of
    η ↦ (g(V_kj, η))_kj for the vertical vectors V_kj = (A E_kj, −B E_jk) of the GL(r) action
    (A M, B M^{-ᵀ}), differentiated at M = I along E_kj. Built from the metric's formula and the
    group action alone (no method of the code under test)."""
    a, b = x
    vertical = []
    for k in range(R):
        for j in range(R):
            e = np.zeros((R, R))
            e[k, j] = 1.0
            vertical.append(_vec((a @ e, -b @ e.T)))
    constraints = np.array(vertical) @ _metric_matrix(geo.metric, x)
    basis = scipy.linalg.null_space(constraints)
    assert basis.shape[1] == geo.dim == (M + N - R) * R
    return basis


def test_r2_inner_is_the_metric_formula(r2) -> None:
    """``inner`` against vec(ξ)ᵀ G vec(η) with G built from the formula: a sum of ≤ (m+n)r² terms
    of size ≤ ‖W_A‖‖ξ‖‖η‖, so |Δ| ≤ γ_{(m+n)r+r}·(‖W_A‖_F + ‖W_B‖_F)‖ξ‖‖η‖."""
    geo, x, rng = r2["geo"], r2["x"], r2["rng"]
    gmat = _metric_matrix(geo.metric, x)
    wa, wb = _metric_weights(geo.metric, *x)
    for _ in range(5):
        xi = (rng.standard_normal((M, R)), rng.standard_normal((N, R)))
        eta = (rng.standard_normal((M, R)), rng.standard_normal((N, R)))
        expected = _vec(xi) @ gmat @ _vec(eta)
        tol = 2 * gamma((M + N) * R + R) * (fro(wa) + fro(wb)) * fro(_vec(xi)) * fro(_vec(eta))
        assert abs(geo.inner(x, xi, eta) - expected) <= tol


def _fd_terms(c, x, eta, h: float) -> tuple[float, float]:
    """(T, e): T bounds |φ‴| on [−h, h] and e the rounding of f(x + hη) plus that of f(x − hη),
    for f(A, B) = F(A Bᵀ), F(W) = Σ sin(W_ij) + ⟨C, W⟩ and φ(t) = f(A + tη_A, B + tη_B). Then
    |(f(x + hη) − f(x − hη))/(2h) − Df(x)[η]| ≤ h²/6·T + e/(2h)·(1 + 2u) (``_fd_bound``).

    Truncation. W(t) = W + tΔ₁ + t²Δ₂ with Δ₁ = η_A Bᵀ + A η_Bᵀ, Δ₂ = η_A η_Bᵀ. Taylor with
    remainder: (φ(h) − φ(−h))/(2h) − φ′(0) = h²/12·(φ‴(τ₁) + φ‴(τ₂)) for some τ₁, τ₂ ∈ (−h, h),
    of size ≤ h²/6·max|φ‴|. ⟨C, W(t)⟩ is quadratic in t, and
    (sin w)‴ = −cos(w) w′³ − 3 sin(w) w′ w″ + cos(w) w‴ with w‴ = 0, w″ = 2Δ₂,
    |w′(t)| ≤ |Δ₁| + 2h|Δ₂| entrywise: T = Σ_ij (|Δ₁| + 2h|Δ₂|)³ + 6(|Δ₁| + 2h|Δ₂|)|Δ₂|.

    Rounding of one evaluation of f at (A_h, B_h) = (A ± hη_A, B ± hη_B): forming the factors
    (relative u per entry), W_h (inner dimension r: γ_{r+2} (|A_h||B_h|ᵀ)_ij per entry with the
    factors' rounding, moved ≤ that much by sin, which is 1-Lipschitz, and by |C_ij| in the linear
    term), sin itself (≤ u per entry), the products C_ij W_ij (u) and the sum of 2mn terms
    (γ_{2mn}·Σ|terms|): ≤ γ_{r+2}·Σ(1 + |C|)(|A_h||B_h|ᵀ) + γ_{2mn+2}·Σ(1 + |C ∘ W_h|).
    """
    a, b = x
    e_a, e_b = eta
    d1 = e_a @ b.T + a @ e_b.T
    d2 = e_a @ e_b.T
    wprime = np.abs(d1) + 2 * h * np.abs(d2)
    third = float(np.sum(wprime**3 + 6 * wprime * np.abs(d2)))
    rounding = 0.0
    for sign in (1.0, -1.0):
        ah, bh = a + sign * h * e_a, b + sign * h * e_b
        wh = ah @ bh.T
        rounding += gamma(R + 2) * float(np.sum((1 + np.abs(c)) * (np.abs(ah) @ np.abs(bh).T)))
        rounding += gamma(2 * M * N + 2) * float(np.sum(1 + np.abs(c * wh)))
    return third, rounding


def _fd_bound(c, x, eta, h: float) -> float:
    third, rounding = _fd_terms(c, x, eta, h)
    return h**2 / 6 * third + rounding / (2 * h) * (1 + 2 * U)


def _rgrad_error_bound(geo, x, rgrad) -> float:
    """A bound on ‖fl(rgrad) − rgrad‖_g: the rgrad formulas are products with inner dimension
    ≤ max(m, n) and r×r solves with BᵀB or AᵀA (or products with them); first-order error
    ≤ CHAIN·γ_max(m,n)·κ(AᵀA)·κ(BᵀB)·‖rgrad‖_g (the κ(A)²κ(B)² growth of DESIGN §4.2). Here the
    egrad is also computed in floating point, within the same bound."""
    a, b = x
    kappa = np.linalg.cond(a.T @ a) * np.linalg.cond(b.T @ b)
    return CHAIN * gamma(max(M, N)) * kappa * geo.norm(x, rgrad)


def test_r2_rgrad_matches_finite_differences_along_horizontal_directions(r2) -> None:
    """g(rgrad, η) = Df[η] for random unit horizontal η (drawn from the independent basis),
    against the central difference, with h chosen to minimise ``_fd_bound``."""
    geo, x, rng, f = r2["geo"], r2["x"], r2["rng"], r2["f"]
    rgrad = geo.egrad_to_rgrad(x, r2["egrad"])
    a, b = x

    def fab(ah, bh):
        return f(ah @ bh.T)

    for _ in range(8):
        eta = _unvec(r2["basis"] @ rng.standard_normal(r2["basis"].shape[1]))
        scale = geo.norm(x, eta)
        eta = (eta[0] / scale, eta[1] / scale)
        # h minimising h²T/6 + e/(2h), with T and e taken at a trial h (both vary slowly with h);
        # the bound is then evaluated at the chosen h.
        third, rounding = _fd_terms(r2["c"], x, eta, 1e-4)
        h = float(np.cbrt(1.5 * rounding / third))
        fd = (fab(a + h * eta[0], b + h * eta[1]) - fab(a - h * eta[0], b - h * eta[1])) / (2 * h)
        tol = _fd_bound(r2["c"], x, eta, h) + _rgrad_error_bound(geo, x, rgrad)
        assert abs(geo.inner(x, rgrad, eta) - fd) <= tol, (h, tol)


def test_r2_rgrad_is_the_unique_horizontal_solution_of_the_metric_system(r2) -> None:
    """With H an orthonormal basis of the horizontal space (``_horizontal_basis``) and
    Gram_ij = inner(H_i, H_j), the horizontal h = H c with g(h, η) = Df[η] = ⟨∇f, η⟩ for every
    horizontal η solves Gram c = Hᵀ vec(∇f); Gram is symmetric positive definite, so h is unique.
    A backward-stable solve gives ‖δc‖ ≤ γ_{3k}·κ(Gram)·‖c‖·(a small constant) with k = dim, and
    the Gram entries carry the ``inner`` rounding; our rgrad carries ``_rgrad_error_bound``."""
    geo, x, basis = r2["geo"], r2["x"], r2["basis"]
    k = basis.shape[1]
    cols = [_unvec(basis[:, i]) for i in range(k)]
    gram = np.array([[geo.inner(x, ci, cj) for cj in cols] for ci in cols])
    eig = np.linalg.eigvalsh(gram)
    assert eig[0] > 0  # positive definite: the solution is unique
    coeff = np.linalg.solve(gram, basis.T @ _vec(r2["egrad"]))
    expected = basis @ coeff
    rgrad = geo.egrad_to_rgrad(x, r2["egrad"])
    kappa_gram = eig[-1] / eig[0]
    # ‖·‖_g ≤ √λ_max(G)·‖·‖₂ for the factor-space metric matrix G; compare in the 2-norm.
    solve_err = CHAIN * gamma(3 * k) * kappa_gram * fro(expected)
    lam = np.linalg.eigvalsh(_metric_matrix(geo.metric, x))
    rgrad_err = _rgrad_error_bound(geo, x, rgrad) / np.sqrt(lam[0])
    assert fro(_vec(rgrad) - expected) <= solve_err + rgrad_err


def test_r2_projection_is_the_metric_orthogonal_projection_onto_the_basis(r2) -> None:
    """``proj`` against H (Hᵀ G H)^{-1} Hᵀ G vec(z) on the independent basis (G the metric
    matrix): the g-orthogonal projection onto the horizontal space, for both metrics (the balanced
    one through a Sylvester equation in the code). Error: as in the metric-system test, with
    κ(HᵀGH) and the κ(A)²κ(B)² growth of the code's r×r solves."""
    geo, x, basis, rng = r2["geo"], r2["x"], r2["basis"], r2["rng"]
    gmat = _metric_matrix(geo.metric, x)
    gram = basis.T @ gmat @ basis
    eig = np.linalg.eigvalsh(gram)
    a, b = x
    kappa = np.linalg.cond(a.T @ a) * np.linalg.cond(b.T @ b)
    for _ in range(3):
        z = (rng.standard_normal((M, R)), rng.standard_normal((N, R)))
        expected = basis @ np.linalg.solve(gram, basis.T @ gmat @ _vec(z))
        ours = _vec(geo.proj(x, z))
        tol = CHAIN * gamma(3 * basis.shape[1]) * (eig[-1] / eig[0] + kappa) * fro(_vec(z))
        assert fro(ours - expected) <= tol
