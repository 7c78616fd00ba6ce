"""Fixed-rank matrices M_r = {W ∈ R^{m×n} : rank W = r}: embedded (R1) and quotient (R2) geometries.

Both work from the stored factors only: no method forms an m×n matrix except the checks-only
``to_matrix``, ``tangent_to_matrix`` and ``egrad_from_matrix``; each call costs O((m+n)r² + r³).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from reference.geometry import PairMixin, Point, Tangent, check_finite, check_shapes, check_sizes
from reference.linalg import Array, orthonormality_residual, polar, qr_signfixed, transpose
from reference.stiefel import DEFAULT_ATOL

#: Retractions of R1: the rank-r truncated SVD of W + ξ (second order) and a first-order QR.
RETRACTIONS = ("projection", "qr")
#: R2 refuses points with κ(A)²κ(B)²·u above this: its r×r solves would lose more than 8 digits.
CONDITION_LIMIT = 1e-8


def _check_sizes(owner: str, m: int, n: int, r: int) -> None:
    check_sizes(owner, m=m, n=n, r=r)
    if r > min(m, n):
        raise ValueError(f"rank r must satisfy r ≤ min(m, n), got r={r} > min({m}, {n})")


#: The rank test of ``_rank_check`` refuses σ_r/σ_1 ≤ r·RANK_EPS (ε of float64); read at call
#: time, so a check can move the threshold (a near-miss control).
RANK_EPS = float(np.finfo(np.float64).eps)


def _rank_check(name: str, a: Array) -> None:
    """Raise ValueError unless the m×r factor is finite and has full column rank, σ_r/σ_1 > r·ε;
    the message gives the measured σ_r and σ_1 (a zero factor is said to be zero, a non-finite
    one to have non-finite entries: never σ_r/σ_1 = nan)."""
    check_finite(f"factor {name}", a)
    s = np.linalg.svd(a, compute_uv=False)
    r, tol = a.shape[1], a.shape[1] * RANK_EPS
    if s[0] == 0.0:
        raise ValueError(f"rank-deficient factor {name}: it is zero, σ_1 = σ_r = 0 (rank 0 < {r})")
    if s[-1] <= tol * s[0]:
        raise ValueError(
            f"rank-deficient factor {name}: σ_r/σ_1 = {s[-1] / s[0]:.3e} ≤ r·ε = {tol:.1e} "
            f"(σ_r = {s[-1]:.3e}, σ_1 = {s[0]:.3e}): its rank is below r = {r}"
        )


def _check_retracted(r: int, factors: dict[str, Array]) -> None:
    """``_rank_check`` of the named factors of a retracted point, the message saying that the
    step left the rank-r manifold (and what to do about it)."""
    for name, f in factors.items():
        try:
            _rank_check(f"{name} of the retracted point", f)
        except ValueError as exc:
            raise ValueError(
                f"the step leaves the rank-{r} manifold: {exc} (step too long; use a trust region)"
            ) from None


class FixedRankEmbedded(PairMixin):
    """R1: rank-r matrices as a submanifold of R^{m×n} with the Frobenius metric (Vandereycken).

    A point is (U, S, V) with U ∈ St(m, r), V ∈ St(n, r) and S an invertible r×r matrix (not
    necessarily diagonal): W = U S Vᵀ. A tangent vector is (M, U_p, V_p) with UᵀU_p = 0, VᵀV_p = 0,
    representing ξ = U M Vᵀ + U_p Vᵀ + U V_pᵀ; the metric ‖M‖² + ‖U_p‖² + ‖V_p‖² is the Frobenius
    norm of ξ. Euclidean gradients are (G_U, G_S, G_V) with respect to the stored factors.

    Args:
        retraction: "projection" (default; the rank-r truncated SVD of W + ξ, second order) or
            "qr" (a first-order retraction by QR of the updated factors, kept as a control).
    """

    name = "fixed_rank_embedded"
    embedded = True
    quotient = False
    moment_groups = ((0, 1, 2),)
    orthonormal_factors = (0, 2)  # U and V are frames; S is any invertible matrix

    def __init__(self, m: int, n: int, r: int, retraction: str = "projection"):
        _check_sizes(type(self).__name__, m, n, r)
        if retraction not in RETRACTIONS:
            raise ValueError(f"unknown retraction {retraction!r}; choose 'projection' or 'qr'")
        self.m, self.n, self.r = int(m), int(n), int(r)
        self.retraction = retraction
        self.retraction_order = 2 if retraction == "projection" else 1
        self.point_shapes = ((self.m, self.r), (self.r, self.r), (self.n, self.r))
        self.dim = (self.m + self.n - self.r) * self.r

    def __repr__(self) -> str:
        return f"FixedRankEmbedded({self.m}, {self.n}, {self.r}, retraction={self.retraction!r})"

    def random_point(self, rng: np.random.Generator) -> Point:
        """Haar U, V and S = Q1 diag(s) Q2ᵀ with s log-uniform in [1, e] (κ(S) ≤ e)."""
        u = qr_signfixed(rng.standard_normal((self.m, self.r)))[0]
        v = qr_signfixed(rng.standard_normal((self.n, self.r)))[0]
        q1 = qr_signfixed(rng.standard_normal((self.r, self.r)))[0]
        q2 = qr_signfixed(rng.standard_normal((self.r, self.r)))[0]
        s = (q1 * np.exp(rng.uniform(0.0, 1.0, self.r))) @ q2.T
        return (u, s, v)

    def random_tangent(self, x: Point, rng: np.random.Generator) -> Tangent:
        z = tuple(rng.standard_normal(np.shape(p)) for p in x)
        t = self.proj(x, z)
        return tuple(p / self.norm(x, t) for p in t)

    def zero_tangent(self, x: Point) -> Tangent:
        u, _, v = x
        return (np.zeros((self.r, self.r)), np.zeros_like(u), np.zeros_like(v))

    def inner(self, x: Point, a: Tangent, b: Tangent) -> float:
        """⟨ξ, η⟩ = tr(M_ξᵀM_η) + tr(U_pξᵀU_pη) + tr(V_pξᵀV_pη) (the three terms are orthogonal)."""
        return float(sum(np.vdot(p, q) for p, q in zip(a, b, strict=True)))

    def proj(self, x: Point, z: Tangent) -> Tangent:
        """From a factor-space vector z = (z_U, z_S, z_V) (a gradient layout):
        M = z_S, U_p = (I − UUᵀ) z_U S^{-ᵀ}, V_p = (I − VVᵀ) z_V S^{-1}.

        For the factor gradient of F(U S Vᵀ) this is the orthogonal projection of G_W onto T_W.
        """
        u, s, v = x
        z_u, z_s, z_v = z
        s_inv = np.linalg.inv(s)  # r×r once, then two m×r·r×r products (forward error κ(S)·u)
        a, b = z_u @ transpose(s_inv), z_v @ s_inv
        return (z_s, a - u @ (transpose(u) @ a), b - v @ (transpose(v) @ b))

    egrad_to_rgrad = proj

    def proj_tangent(self, x: Point, xi: Tangent) -> Tangent:
        """(M, U_p, V_p) ↦ (M, (I − UUᵀ)U_p, (I − VVᵀ)V_p): the orthogonal projection in the
        tangent layout (the three parts are orthogonal components of ξ)."""
        u, _, v = x
        m_, u_p, v_p = xi
        return (m_, u_p - u @ (transpose(u) @ u_p), v_p - v @ (transpose(v) @ v_p))

    def retract(self, x: Point, xi: Tangent) -> Point:
        """R_W(ξ) by the retraction chosen at construction.

        "projection": with U_p = Q_U R_U and V_p = Q_V R_V (thin QR; Q_U ⊥ U as U_p ⊥ U),
        W + ξ = [U, Q_U] K [V, Q_V]ᵀ with K = [[S + M, R_Vᵀ], [R_U, 0]]; K = Y Σ Zᵀ truncated to r
        gives ([U, Q_U] Y_r, Σ_r, [V, Q_V] Z_r), the best rank-r approximation. Each new factor
        then goes through ``linalg.polar`` (Gram formed as computed), which changes W only at the
        rounding level but removes orthonormality drift instead of letting it accumulate.
        "qr": A = U(S + M) + U_p = Q_A R_A, B = V + V_p S^{-ᵀ} = Q_B R_B, (Q_A, R_A R_Bᵀ, Q_B);
        A Bᵀ = W + ξ + O(‖ξ‖²).
        """
        check_finite("the step ξ = (M, U_p, V_p)", xi)
        u, s, v = x
        m_, u_p, v_p = xi
        if self.retraction == "qr":
            qa, ra = qr_signfixed(u @ (s + m_) + u_p)
            qb, rb = qr_signfixed(v + np.linalg.solve(s, transpose(v_p)).T)
            y = (qa, ra @ transpose(rb), qb)
        else:
            qu, ru = np.linalg.qr(u_p)
            qv, rv = np.linalg.qr(v_p)
            core = np.block([[s + m_, transpose(rv)], [ru, np.zeros((ru.shape[0], rv.shape[0]))]])
            # A core that overflowed (huge U_p or V_p) would otherwise give σ = nan from the SVD.
            check_finite("the retraction's core [[S + M, R_Vᵀ], [R_U, 0]]", core)
            yk, sig, zkt = np.linalg.svd(core)
            r = self.r
            y = (
                polar(u @ yk[:r, :r] + qu @ yk[r:, :r]),
                np.diag(sig[:r]),
                polar(v @ transpose(zkt[:r, :r]) + qv @ transpose(zkt[:r, r:])),
            )
        _check_retracted(self.r, {"S": y[1]})
        return y

    def transport(self, x: Point, y: Point, xi: Tangent) -> Tangent:
        """Projection at y of the old tangent matrix ξ = L Rᵀ, L = [U M + U_p, U], R = [V, V_p]:
        M' = U'ᵀ L (Rᵀ V'), U_p' = L (Rᵀ V') − U' M', V_p' = R (Lᵀ U') − V' M'ᵀ."""
        u, _, v = x
        m_, u_p, v_p = xi
        u2, _, v2 = y
        left, right = np.hstack([u @ m_ + u_p, u]), np.hstack([v, v_p])
        zv, ztu = left @ (transpose(right) @ v2), right @ (transpose(left) @ u2)
        m2 = transpose(u2) @ zv
        return (m2, zv - u2 @ m2, ztu - v2 @ transpose(m2))

    def pair(self, x: Point) -> tuple[Array, Array]:
        """(A, B) = (U S, V)."""
        u, s, v = x
        return u @ s, v

    def egrad_from_pair(self, x: Point, g_pair: tuple[Array, Array]) -> Tangent:
        """For f(U, S, V) = F(A = U S, B = V): (G_U, G_S, G_V) = (G_A Sᵀ, Uᵀ G_A, G_B)."""
        u, s, _ = x
        g_a, g_b = g_pair
        return (g_a @ transpose(s), transpose(u) @ g_a, g_b)

    def tangent_to_matrix(self, x: Point, xi: Tangent) -> Array:
        """U M Vᵀ + U_p Vᵀ + U V_pᵀ (checks only)."""
        u, _, v = x
        m_, u_p, v_p = xi
        return (u @ m_ + u_p) @ transpose(v) + u @ transpose(v_p)

    def check_point(self, x: Point) -> None:
        """Shapes, finiteness, orthonormal U and V (residual ≤ √ε), invertible S."""
        if not isinstance(x, tuple) or len(x) != 3:
            raise ValueError("a fixed-rank embedded point is a tuple (U, S, V)")
        check_shapes("point (U, S, V)", [(self.m, self.r), (self.r, self.r), (self.n, self.r)], x)
        check_finite("point (U, S, V)", x)
        for name, f in (("U", x[0]), ("V", x[2])):
            res = orthonormality_residual(f)
            if res > DEFAULT_ATOL:
                raise ValueError(
                    f"factor {name} is not orthonormal: ‖{name}ᵀ{name} − I‖ = {res:.3e}"
                )
        _rank_check("S", x[1])


class FixedRankQuotient(PairMixin):
    """R2: rank-r matrices as the quotient (R_*^{m×r} × R_*^{n×r}) / GL(r), W = A Bᵀ.

    A point is (A, B), both of full column rank, standing for its class {(AM, BM^{-ᵀ})}. A
    tangent vector is a horizontal (ξ_A, ξ_B) in factor layout. Metrics (both GL(r)-invariant):
    "preconditioned" (default) g = tr(BᵀB ξ_Aᵀη_A) + tr(AᵀA ξ_Bᵀη_B), and "balanced"
    g = tr((AᵀA)^{-1}ξ_Aᵀη_A) + tr((BᵀB)^{-1}ξ_Bᵀη_B). The vertical space is {(AΩ, −BΩᵀ)}.
    Rounding grows like κ(A)²κ(B)², so points with κ(A)²κ(B)²·u > 1e-8 are refused.

    Args:
        metric: "preconditioned" or "balanced".
    """

    name = "fixed_rank_quotient"
    embedded = False
    quotient = True
    retraction_order = 1
    moment_groups = ((0, 1),)
    orthonormal_factors = ()  # any full-rank pair (A, B) is a point

    def __init__(self, m: int, n: int, r: int, metric: str = "preconditioned"):
        _check_sizes(type(self).__name__, m, n, r)
        if metric not in ("preconditioned", "balanced"):
            raise ValueError(f"unknown metric {metric!r}; choose 'preconditioned' or 'balanced'")
        self.m, self.n, self.r = int(m), int(n), int(r)
        self.metric = metric
        self.point_shapes = ((self.m, self.r), (self.n, self.r))
        self.dim = (self.m + self.n - self.r) * self.r

    def __repr__(self) -> str:
        return f"FixedRankQuotient({self.m}, {self.n}, {self.r}, metric={self.metric!r})"

    def random_point(self, rng: np.random.Generator) -> Point:
        """Gaussian A, B scaled by 1/√m and 1/√n (full rank almost surely)."""
        return (
            rng.standard_normal((self.m, self.r)) / np.sqrt(self.m),
            rng.standard_normal((self.n, self.r)) / np.sqrt(self.n),
        )

    def random_tangent(self, x: Point, rng: np.random.Generator) -> Tangent:
        t = self.proj(x, tuple(rng.standard_normal(np.shape(p)) for p in x))
        return tuple(p / self.norm(x, t) for p in t)

    def zero_tangent(self, x: Point) -> Tangent:
        return tuple(np.zeros_like(p) for p in x)

    def _weights(self, x: Point) -> tuple[Array, Array]:
        """The r×r matrices (W_A, W_B) with g = tr(W_A ξ_Aᵀη_A) + tr(W_B ξ_Bᵀη_B)."""
        a, b = x
        if self.metric == "preconditioned":
            return transpose(b) @ b, transpose(a) @ a
        return np.linalg.inv(transpose(a) @ a), np.linalg.inv(transpose(b) @ b)

    def inner(self, x: Point, xi: Tangent, eta: Tangent) -> float:
        """g = tr(W_A ξ_Aᵀη_A) + tr(W_B ξ_Bᵀη_B) with the metric's weights (class docstring)."""
        wa, wb = self._weights(x)
        return float(np.vdot(xi[0] @ wa, eta[0]) + np.vdot(xi[1] @ wb, eta[1]))

    def proj(self, x: Point, eta: Tangent) -> Tangent:
        """Metric-orthogonal projection onto the horizontal space: (η_A + AΩ, η_B − BΩᵀ) with
        preconditioned: Ω = ½(η_BᵀB (BᵀB)^{-1} − (AᵀA)^{-1}Aᵀη_A);
        balanced: PΩ + ΩP = BᵀB C AᵀA, P = BᵀB AᵀA, C = (BᵀB)^{-1}η_BᵀB − Aᵀη_A(AᵀA)^{-1}."""
        a, b = x
        e_a, e_b = eta
        ata, btb = transpose(a) @ a, transpose(b) @ b
        if self.metric == "preconditioned":
            omega = 0.5 * (
                np.linalg.solve(btb, transpose(b) @ e_b).T
                - np.linalg.solve(ata, transpose(a) @ e_a)
            )
        else:
            c = (
                np.linalg.solve(btb, transpose(e_b) @ b)
                - np.linalg.solve(ata, transpose(e_a) @ a).T
            )
            p = btb @ ata
            omega = scipy.linalg.solve_sylvester(p, p, btb @ c @ ata)
        return (e_a + a @ omega, e_b - b @ transpose(omega))

    def proj_tangent(self, x: Point, xi: Tangent) -> Tangent:
        return self.proj(x, xi)

    def egrad_to_rgrad(self, x: Point, egrad: Tangent) -> Tangent:
        """preconditioned: (G_A (BᵀB)^{-1}, G_B (AᵀA)^{-1}); balanced: (G_A AᵀA, G_B BᵀB).
        Both are horizontal for a loss of A Bᵀ; the horizontal projection that follows only
        matters for a loss that is not constant on the fibres (e.g. coupled decay of A and B)."""
        a, b = x
        g_a, g_b = egrad
        ata, btb = transpose(a) @ a, transpose(b) @ b
        if self.metric == "preconditioned":
            raw = (np.linalg.solve(btb, transpose(g_a)).T, np.linalg.solve(ata, transpose(g_b)).T)
        else:
            raw = (g_a @ ata, g_b @ btb)
        return self.proj(x, raw)

    def retract(self, x: Point, xi: Tangent) -> Point:
        """(A + ξ_A, B + ξ_B). No rebalancing: the optimizer's stored tangent state would have to
        be mapped by the same GL(r) element, which the transport cannot see."""
        y = (x[0] + xi[0], x[1] + xi[1])
        _check_retracted(self.r, {"A": y[0], "B": y[1]})
        return y

    def transport(self, x: Point, y: Point, xi: Tangent) -> Tangent:
        """Horizontal projection at y of the factor-space vector ξ (DESIGN §4.2)."""
        return self.proj(y, xi)

    def pair(self, x: Point) -> tuple[Array, Array]:
        return x

    def egrad_from_pair(self, x: Point, g_pair: tuple[Array, Array]) -> Tangent:
        return tuple(g_pair)

    def tangent_to_matrix(self, x: Point, xi: Tangent) -> Array:
        """ξ_A Bᵀ + A ξ_Bᵀ (checks only)."""
        return xi[0] @ transpose(x[1]) + x[0] @ transpose(xi[1])

    def vertical(self, x: Point, omega: Array) -> Tangent:
        """The vertical vector (AΩ, −BΩᵀ) for an r×r Ω."""
        return (x[0] @ omega, -x[1] @ transpose(omega))

    def act(self, x: Point, g: Array) -> Point:
        """The group action (A, B)·M = (A M, B M^{-ᵀ}) of M ∈ GL(r)."""
        return (x[0] @ g, np.linalg.solve(g, transpose(x[1])).T)

    def check_point(self, x: Point) -> None:
        """Shapes, finiteness, full column rank, and κ(A)²κ(B)²·u ≤ 1e-8: beyond it the
        metric's r×r solves would lose more than 8 digits."""
        if not isinstance(x, tuple) or len(x) != 2:
            raise ValueError("a fixed-rank quotient point is a tuple (A, B)")
        check_shapes("point (A, B)", [(self.m, self.r), (self.n, self.r)], x)
        check_finite("point (A, B)", x)
        _rank_check("A", x[0])
        _rank_check("B", x[1])
        ka, kb = np.linalg.cond(x[0]), np.linalg.cond(x[1])
        scale = (ka * kb) ** 2 * np.finfo(np.float64).eps / 2
        if scale > CONDITION_LIMIT:
            raise ValueError(
                f"ill-conditioned factors: κ(A) = {ka:.3e}, κ(B) = {kb:.3e}, so κ(A)²κ(B)²·u "
                f"= {scale:.1e} > {CONDITION_LIMIT:.0e}"
            )
