"""Rank-r partial isometries PI_r(m, n) = {U Vᵀ : U ∈ St(m,r), V ∈ St(n,r)} (DESIGN §4.3).

The set of m×n matrices whose r nonzero singular values all equal 1 (equivalently W Wᵀ W = W,
rank W = r), of dimension (m+n)r − (3r² + r)/2. Three geometries on this one set:

- ``PartialIsometryEmbedded`` (P1): a submanifold of R^{m×n} with the Frobenius metric.
- ``PartialIsometryQuotient`` (P2): (St(m,r) × St(n,r))/O(r), O(r) acting by (U Q, V Q), with the
  product embedded metric on horizontal vectors.
- ``StiefelPair`` (P3): St(m,r) × St(n,r) itself, two independent frames (no quotient).

In all three a point is a tuple (U, V) of float64 arrays, U of shape (m, r) and V of shape (n, r),
with orthonormal columns; it represents W = U Vᵀ. Euclidean gradients are taken with respect to the
stored factors, (G_U, G_V); for a loss F(U Vᵀ) with G_W = ∇F they are (G_W V, G_Wᵀ U). No method
forms an m×n matrix except ``to_matrix``, ``tangent_to_matrix`` and ``egrad_from_matrix`` (checks
only); every other method costs O((m+n)r² + r³).

Tangent space of PI_r at W = U Vᵀ (from a curve U(t)V(t)ᵀ with U' = U A + U_⊥B, V' = V C + V_⊥D,
A and C skew): T_W = {U Ω Vᵀ + U_p Vᵀ + U V_pᵀ : Ω skew, UᵀU_p = 0, VᵀV_p = 0}, Ω = A − C. Its
dimension is r(r−1)/2 + (m−r)r + (n−r)r = (m+n)r − (3r² + r)/2. The three terms are mutually
Frobenius-orthogonal and ‖U Ω Vᵀ‖ = ‖Ω‖, so ‖ξ‖² = ‖Ω‖² + ‖U_p‖² + ‖V_p‖² in P1. The horizontal
lift of the same ξ in P2 is (U Ω/2 + U_p, −V Ω/2 + V_p) (horizontality forces A + C = 0), of norm²
½‖Ω‖² + ‖U_p‖² + ‖V_p‖²: P2 weighs the Ω part by ½ against P1's 1.
"""

from __future__ import annotations

import numpy as np

from reference import linalg
from reference.geometry import (
    PairMixin,
    Point,
    Tangent,
    check_finite,
    check_shapes,
    check_sizes,
    parts,
    same_structure,
)
from reference.linalg import Array, frobenius, skew, sym, transpose
from reference.product import Product
from reference.stiefel import DEFAULT_ATOL, Stiefel

#: Retractions of P1: the metric projection (nearest partial isometry, second order) and the
#: first-order per-factor QR used as a negative control.
EMBEDDED_RETRACTIONS = ("projection", "qr")
#: Retractions of P2 and P3, applied factor by factor (those of ``reference.stiefel.Stiefel``).
FACTOR_RETRACTIONS = ("polar", "polar_svd", "qr", "exp")


def _validate(cls_name: str, m: int, n: int, r: int, retraction: str, allowed: tuple) -> None:
    check_sizes(cls_name, m=m, n=n, r=r)
    if r > min(m, n):
        raise ValueError(
            f"{cls_name} needs r ≤ min(m, n) (a rank-r partial isometry of size m×n has r "
            f"orthonormal columns in each factor), got r={r} > min(m={m}, n={n}) = {min(m, n)}"
        )
    if retraction not in allowed:
        raise ValueError(
            f"unknown retraction {retraction!r} for {cls_name}; choose one of {allowed}"
        )


class _FramePair(PairMixin):
    """What the three geometries share: points (U, V), their validation, and W = U Vᵀ."""

    name: str
    embedded: bool
    quotient: bool
    moment_groups: tuple[tuple[int, ...], ...]
    orthonormal_factors = (0, 1)  # U and V are frames
    _retractions: tuple[str, ...]
    _set_name: str  # how ``check_point`` names the set

    def __init__(self, m: int, n: int, r: int, retraction: str):
        _validate(type(self).__name__, m, n, r, retraction, self._retractions)
        self.m, self.n, self.r = int(m), int(n), int(r)
        self.retraction = retraction
        # QR per factor is first order for r ≥ 2 and coincides with polar for r = 1.
        self.retraction_order = 1 if retraction == "qr" and self.r > 1 else 2
        # The frames' own geometries (embedded metric); P2 and P3 retract with them factor by
        # factor, P1 uses them only for points and residuals.
        factor_retraction = retraction if retraction in FACTOR_RETRACTIONS else "polar"
        self.row_frames = Stiefel(self.m, self.r, retraction=factor_retraction)
        self.col_frames = Stiefel(self.n, self.r, retraction=factor_retraction)
        self.point_shapes = ((self.m, self.r), (self.n, self.r))
        self.dim = (self.m + self.n) * self.r - (3 * self.r**2 + self.r) // 2

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.m}, {self.n}, {self.r}, retraction={self.retraction!r})"
        )

    # -- points --------------------------------------------------------------------------------
    def random_point(self, rng: np.random.Generator) -> Point:
        """(U, V), each the sign-fixed QR factor of a Gaussian matrix (Haar on each Stiefel
        factor; U drawn first)."""
        return self.row_frames.random_point(rng), self.col_frames.random_point(rng)

    def pair(self, x: Point) -> tuple[Array, Array]:
        """(A, B) = (U, V): W = U Vᵀ."""
        return x[0], x[1]

    def egrad_from_pair(self, x: Point, g_pair: tuple[Array, Array]) -> Tangent:
        """The factor gradient (G_U, G_V) = (∂F/∂A, ∂F/∂B) = (G_W V, G_Wᵀ U): the identity."""
        return g_pair[0], g_pair[1]

    def project_point(self, a: Point) -> Point:
        """The nearest pair of frames to a pair of full-rank factors (A, B) in factor space:
        (polar(A), polar(B)). For (cU, cV) with c > 0 this is (U, V), so the optimizer treats
        weight decay on these points as what it is, a no-op on frames (RA-5)."""
        return linalg.polar(a[0]), linalg.polar(a[1])

    def residuals(self, x: Point) -> tuple[float, float]:
        """(‖UᵀU − I_r‖, ‖VᵀV − I_r‖)."""
        return linalg.orthonormality_residual(x[0]), linalg.orthonormality_residual(x[1])

    def check_point(self, x: Point, atol: float | None = None) -> None:
        """Raise ValueError unless x is a tuple (U, V) of finite arrays of shapes (m, r), (n, r)
        with ‖UᵀU − I‖ ≤ atol and ‖VᵀV − I‖ ≤ atol (default ``DEFAULT_ATOL`` = √ε; the message
        gives both residuals)."""
        atol = DEFAULT_ATOL if atol is None else atol  # read at call time
        label = f"{self.name} point"
        if not same_structure(x, (None, None)):
            raise ValueError(
                f"{label}: expected a tuple (U, V) of two arrays, got {type(x).__name__}"
                + (f" with {len(x)} items" if isinstance(x, tuple) else "")
            )
        check_shapes(label, self.point_shapes, x)
        check_finite(label, x)
        ru, rv = self.residuals(x)
        if max(ru, rv) > atol:
            raise ValueError(
                f"point is off {self._set_name}: ‖UᵀU − I‖ = {ru:.3e}, ‖VᵀV − I‖ = {rv:.3e} "
                f"(tolerance {atol:.1e})"
            )

    # -- metric --------------------------------------------------------------------------------
    def inner(self, x: Point, u: Tangent, v: Tangent) -> float:
        """Σ_i tr(u_iᵀ v_i) over the parts of the tangent representation (see the class)."""
        return float(sum(np.vdot(a, b) for a, b in zip(parts(u), parts(v), strict=True)))

    def norm(self, x: Point, u: Tangent) -> float:
        """sqrt(inner(x, u, u)), computed as the scaled Frobenius norm of all parts together, so
        no finite float64 tangent overflows or underflows it."""
        return frobenius(np.concatenate([np.ravel(p) for p in parts(u)]))

    def _unit(self, x: Point, u: Tangent) -> Tangent:
        n = self.norm(x, u)
        return u if n == 0.0 else tuple(p / n for p in u)  # n = 0 only where dim = 0

    def _gaussian_pair(self, rng: np.random.Generator) -> tuple[Array, Array]:
        return rng.standard_normal((self.m, self.r)), rng.standard_normal((self.n, self.r))


class PartialIsometryEmbedded(_FramePair):
    """P1: PI_r(m, n) as a submanifold of R^{m×n} with the Frobenius metric.

    Point: (U, V), U ∈ St(m, r), V ∈ St(n, r), representing W = U Vᵀ (any (U Q, V Q), Q ∈ O(r),
    represents the same point).
    Tangent vector: (Ω, U_p, V_p) with Ω skew r×r, UᵀU_p = 0, VᵀV_p = 0, representing the matrix
    ξ = U Ω Vᵀ + U_p Vᵀ + U V_pᵀ (coordinates relative to the stored factors).
    Metric: Frobenius, ⟨ξ, η⟩ = tr(ξᵀη) = ⟨Ω, Ω'⟩ + ⟨U_p, U_p'⟩ + ⟨V_p, V_p'⟩ (the three terms
    are mutually orthogonal and U, V have orthonormal columns).

    Args:
        m, n: the matrix size; r: the rank, 1 ≤ r ≤ min(m, n).
        retraction: "projection" (default; the nearest partial isometry to W + ξ, second order)
            or "qr" (per-factor sign-fixed QR, first order; a negative control. It is second
            order in the two cases r = 1 and m = n = r, see ``retract``).
    """

    name = "partial_isometry_embedded"
    embedded = True
    quotient = False
    moment_groups = ((0, 1, 2),)  # the whole tangent (Ω, U_p, V_p) is one frame
    _retractions = EMBEDDED_RETRACTIONS
    _set_name = "PI_r(m, n)"

    def __init__(self, m: int, n: int, r: int, retraction: str = "projection"):
        super().__init__(m, n, r, retraction)
        self._set_name = f"PI_{self.r}({self.m}, {self.n})"
        self.tangent_shapes = ((self.r, self.r), (self.m, self.r), (self.n, self.r))

    # -- tangent vectors -----------------------------------------------------------------------
    def random_tangent(self, x: Point, rng: np.random.Generator) -> Tangent:
        """proj(x, (Z_U, Z_V)) for Gaussian Z_U (m×r), Z_V (n×r), scaled to unit norm."""
        return self._unit(x, self.proj(x, self._gaussian_pair(rng)))

    def zero_tangent(self, x: Point) -> Tangent:
        return tuple(np.zeros(s) for s in self.tangent_shapes)

    def tangent_to_matrix(self, x: Point, u: Tangent) -> Array:
        """ξ = U Ω Vᵀ + U_p Vᵀ + U V_pᵀ = (U Ω + U_p) Vᵀ + U V_pᵀ (checks only: m×n)."""
        uu, vv = x
        omega, up, vp = u
        return (uu @ omega + up) @ transpose(vv) + uu @ transpose(vp)

    def check_tangent(self, x: Point, u: Tangent, atol: float | None = None) -> None:
        """Raise ValueError unless ‖Ω + Ωᵀ‖, ‖UᵀU_p‖ and ‖VᵀV_p‖ are ≤ atol·max(1, ‖u‖)."""
        atol = DEFAULT_ATOL if atol is None else atol  # read at call time
        check_shapes(f"{self.name} tangent", self.tangent_shapes, u)
        check_finite(f"{self.name} tangent", u)
        omega, up, vp = u
        res = (
            frobenius(omega + transpose(omega)),
            frobenius(transpose(x[0]) @ up),
            frobenius(transpose(x[1]) @ vp),
        )
        if max(res) > atol * max(1.0, self.norm(x, u)):
            raise ValueError(
                "vector is not tangent at W: ‖Ω + Ωᵀ‖ = {:.3e}, ‖UᵀU_p‖ = {:.3e}, "
                "‖VᵀV_p‖ = {:.3e}".format(*res)
            )

    # -- projection and gradient ---------------------------------------------------------------
    def proj(self, x: Point, z: Tangent) -> Tangent:
        """Tangent vector from a factor-space vector z = (z_U, z_V) in the point's layout:

            Ω = skew(Uᵀz_U),  U_p = (I − UUᵀ) z_U,  V_p = (I − VVᵀ) z_V.

        For z = (Z V, Zᵀ U) (the factor gradient of ⟨Z, U Vᵀ⟩) this is the Frobenius-orthogonal
        projection of the m×n matrix Z onto T_W, whose matrix form is
        P_W(Z) = U skew(UᵀZV) Vᵀ + (I − UUᵀ) Z VVᵀ + UUᵀ Z (I − VVᵀ)
               = Z − (I − UUᵀ) Z (I − VVᵀ) − U sym(UᵀZV) Vᵀ.

        A tangent-layout vector (three parts) is refused: that is ``proj_tangent``'s job.
        """
        if not (isinstance(z, tuple) and len(z) == 2):
            raise ValueError(
                f"{self.name}.proj takes a factor-space vector (z_U, z_V) in the point's layout, "
                f"got {type(z).__name__}"
                + (
                    f" with {len(z)} parts (use proj_tangent for (Ω, U_p, V_p))"
                    if isinstance(z, tuple)
                    else ""
                )
            )
        uu, vv = x
        zu, zv = z
        a, b = transpose(uu) @ zu, transpose(vv) @ zv
        return skew(a), zu - uu @ a, zv - vv @ b

    def proj_tangent(self, x: Point, u: Tangent) -> Tangent:
        """Orthogonal projection of a tangent-layout (Ω̃, Ũ_p, Ṽ_p) (e.g. a tangent vector rescaled
        entrywise by the elementwise Adam ablation) onto the tangent space, in the layout's own
        metric ‖Ω‖² + ‖U_p‖² + ‖V_p‖²: part by part,

            Ω = skew(Ω̃),  U_p = (I − UUᵀ) Ũ_p,  V_p = (I − VVᵀ) Ṽ_p.

        The identity on tangent vectors (as ``FixedRankEmbedded.proj_tangent`` for R1)."""
        uu, vv = x
        omega, up, vp = u
        return skew(omega), up - uu @ (transpose(uu) @ up), vp - vv @ (transpose(vv) @ vp)

    def egrad_to_rgrad(self, x: Point, egrad: Tangent) -> Tangent:
        """proj(x, (G_U, G_V)): for G_U = G_W V, G_V = G_Wᵀ U it is P_W(G_W), the Riemannian
        gradient of F at W in the Frobenius metric."""
        return self.proj(x, egrad)

    # -- retraction and transport --------------------------------------------------------------
    def retract(self, x: Point, u: Tangent) -> Point:
        """R_W(ξ) by the retraction chosen at construction.

        "projection": the nearest rank-r partial isometry to W + ξ (metric projection onto PI_r,
        second order), without forming W + ξ. With Q_U R_U = U_p and Q_V R_V = V_p (thin,
        sign-fixed QR),

            W + ξ = [U, Q_U] K [V, Q_V]ᵀ,  K = [[I + Ω, R_Vᵀ], [R_U, 0]]  (2r×2r).

        With K = Y Σ Zᵀ (SVD), the new factors are U' = [U, Q_U] Y_r, V' = [V, Q_V] Z_r (the top
        r singular vectors; singular values set to 1). The point is unique when σ_r(K) > σ_{r+1}(K),
        which holds whenever min(‖U_p‖₂, ‖V_p‖₂) < 1, e.g. for ‖ξ‖ < √2: σ_r(K) ≥ σ_r(I + Ω) ≥ 1
        (I + Ω is a submatrix of K and (I + Ω)ᵀ(I + Ω) = I + ΩᵀΩ), while σ_{r+1}(K) ≤ ‖R_V‖₂
        and ≤ ‖R_U‖₂ (min-max over vectors supported on the second block). Two refinements leave
        the matrix U'V'ᵀ unchanged in exact arithmetic: the representative is the one nearest
        the old factors, (U'Q, V'Q) with Q = polar(U'ᵀU + V'ᵀV) (orthogonal Procrustes, which
        makes R_W(0) = (U, V) and the factors independent of the SVD's sign choices), and each
        factor is passed through ``linalg.polar`` (Gram formed as computed), so rounding drift
        in UᵀU and VᵀV is corrected at every step instead of accumulating.

        "qr": U' = qf(U + U_p + ½UΩ), V' = qf(V + V_p − ½VΩ), qf the sign-fixed QR factor. Then
        U'V'ᵀ = W + ξ + O(‖ξ‖²): first order. Two exceptions are second order: r = 1 (Ω = 0, so
        each factor is just normalised), and m = n = r (U_p = V_p = 0; I ± ½Ω have the same Gram
        I − ¼Ω², so U'V'ᵀ = U (I + ½Ω)(I − ½Ω)^{-1} Vᵀ, the Cayley transform).
        """
        uu, vv = x
        omega, up, vp = u
        if self.retraction == "qr":
            return (
                linalg.qr_signfixed(uu + up + 0.5 * (uu @ omega))[0],
                linalg.qr_signfixed(vv + vp - 0.5 * (vv @ omega))[0],
            )
        r = self.r
        qu, ru = linalg.qr_signfixed(up)
        qv, rv = linalg.qr_signfixed(vp)
        core = np.block([[np.eye(r) + omega, transpose(rv)], [ru, np.zeros((r, r))]])
        y, _, zt = np.linalg.svd(core)
        u_new = uu @ y[:r, :r] + qu @ y[r:, :r]
        v_new = vv @ transpose(zt[:r, :r]) + qv @ transpose(zt[:r, r:])
        q = linalg.polar_svd(transpose(u_new) @ uu + transpose(v_new) @ vv)
        return linalg.polar(u_new @ q), linalg.polar(v_new @ q)

    def transport(self, x: Point, y: Point, u: Tangent) -> Tangent:
        """Vector transport by projection: the old tangent matrix projected onto T_{W'}.

        ξ = L Rᵀ with L = [UΩ + U_p, U] (m×2r), R = [V, V_p] (n×2r); at y = (U', V'):
        Ω' = skew(U'ᵀ L (RᵀV')), U_p' = (I − U'U'ᵀ) L (RᵀV'), V_p' = (I − V'V'ᵀ) R (LᵀU'),
        i.e. proj(y, (ξV', ξᵀU')) with ξV' and ξᵀU' formed from the factors.
        """
        uu, vv = x
        omega, up, vp = u
        left = np.hstack([uu @ omega + up, uu])
        right = np.hstack([vv, vp])
        return self.proj(y, (left @ (transpose(right) @ y[1]), right @ (transpose(left) @ y[0])))


class _FactorSpaceMixin:
    """Tangent vectors (ξ_U, ξ_V) in factor layout (P2 and P3)."""

    def zero_tangent(self, x: Point) -> Tangent:
        return np.zeros(self.point_shapes[0]), np.zeros(self.point_shapes[1])

    def random_tangent(self, x: Point, rng: np.random.Generator) -> Tangent:
        """proj(x, (Z_U, Z_V)) for Gaussian Z_U (m×r), Z_V (n×r), scaled to unit norm."""
        return self._unit(x, self.proj(x, self._gaussian_pair(rng)))

    def tangent_to_matrix(self, x: Point, u: Tangent) -> Array:
        """The differential of (U, V) ↦ U Vᵀ: ξ_U Vᵀ + U ξ_Vᵀ (checks only: m×n)."""
        return u[0] @ transpose(x[1]) + x[0] @ transpose(u[1])

    def exp(self, x: Point, u: Tangent) -> Point:
        """(Exp_U(ξ_U), Exp_V(ξ_V)), the Stiefel exponential map of each factor
        (``Stiefel.exp``): the geodesic of St(m,r) × St(n,r) in the product embedded metric."""
        return self.row_frames.exp(x[0], u[0]), self.col_frames.exp(x[1], u[1])

    def stiefel_proj(self, x: Point, z: Tangent) -> Tangent:
        """(P_U(z_U), P_V(z_V)), P_W(Z) = Z − W sym(WᵀZ): the tangent projection of St × St."""
        return self.row_frames.proj(x[0], z[0]), self.col_frames.proj(x[1], z[1])


class PartialIsometryQuotient(_FactorSpaceMixin, _FramePair):
    """P2: PI_r(m, n) as the quotient (St(m,r) × St(n,r))/O(r), Q ∈ O(r) acting by (U Q, V Q).

    Point: (U, V), U ∈ St(m, r), V ∈ St(n, r); the equivalence class {(UQ, VQ)} is the point
    W = U Vᵀ.
    Tangent vector: a horizontal lift (ξ_U, ξ_V) in factor layout: Uᵀξ_U and Vᵀξ_V skew
    (tangent to St × St) and skew(Uᵀξ_U + Vᵀξ_V) = 0 (orthogonal to the vertical space
    {(UΩ, VΩ) : Ω skew}, the tangent space of the fibre).
    Metric: the product embedded metric ⟨ξ, η⟩ = tr(ξ_Uᵀη_U) + tr(ξ_Vᵀη_V) on horizontal lifts
    (right-O(r)-invariant, so it descends to the quotient). In matrix terms
    ‖U Ω Vᵀ + U_p Vᵀ + U V_pᵀ‖² = ½‖Ω‖² + ‖U_p‖² + ‖V_p‖², unlike P1.

    Args:
        m, n: the matrix size; r: the rank, 1 ≤ r ≤ min(m, n).
        retraction: applied to each factor as in ``Stiefel``: "polar" (default, second order,
            right-O(r)-equivariant, so well defined on the quotient), "polar_svd" (the same map),
            "exp" (the Stiefel exponential; horizontal geodesics project to geodesics) or "qr"
            (first order for r ≥ 2 and not O(r)-equivariant: on the quotient its result depends on
            the representative; a negative control).
    """

    name = "partial_isometry_quotient"
    embedded = False
    quotient = True
    moment_groups = ((0, 1),)  # one moment for the pair: separate ones leave the horizontal space
    _retractions = FACTOR_RETRACTIONS
    _set_name = "PI_r(m, n)"

    def __init__(self, m: int, n: int, r: int, retraction: str = "polar"):
        super().__init__(m, n, r, retraction)
        self._set_name = f"PI_{self.r}({self.m}, {self.n})"

    def vertical(self, x: Point, omega: Array) -> Tangent:
        """The vertical vector (UΩ, VΩ) for a skew r×r Ω (tangent to the fibre {(UQ, VQ)})."""
        return x[0] @ omega, x[1] @ omega

    def act(self, x: Point, q: Array) -> Point:
        """The group action (U q, V q) of q ∈ O(r): another representative of the same point."""
        return x[0] @ q, x[1] @ q

    def horizontal_residual(self, x: Point, u: Tangent) -> float:
        """‖skew(Uᵀξ_U + Vᵀξ_V)‖: zero exactly for horizontal (ξ_U, ξ_V)."""
        return frobenius(skew(transpose(x[0]) @ u[0] + transpose(x[1]) @ u[1]))

    def check_tangent(self, x: Point, u: Tangent, atol: float | None = None) -> None:
        """Raise ValueError unless ‖sym(Uᵀξ_U)‖, ‖sym(Vᵀξ_V)‖ (tangency to St × St) and
        ‖skew(Uᵀξ_U + Vᵀξ_V)‖ (horizontality) are ≤ atol·max(1, ‖u‖)."""
        atol = DEFAULT_ATOL if atol is None else atol  # read at call time
        check_shapes(f"{self.name} tangent", self.point_shapes, u)
        check_finite(f"{self.name} tangent", u)
        res = (
            frobenius(sym(transpose(x[0]) @ u[0])),
            frobenius(sym(transpose(x[1]) @ u[1])),
            self.horizontal_residual(x, u),
        )
        if max(res) > atol * max(1.0, self.norm(x, u)):
            raise ValueError(
                "vector is not horizontal-tangent at (U, V): ‖sym(Uᵀξ_U)‖ = {:.3e}, "
                "‖sym(Vᵀξ_V)‖ = {:.3e}, ‖skew(Uᵀξ_U + Vᵀξ_V)‖ = {:.3e}".format(*res)
            )

    def proj(self, x: Point, z: Tangent) -> Tangent:
        """Orthogonal projection of a factor-space z = (z_U, z_V) onto the horizontal space:

            (a, b) = (P_U(z_U), P_V(z_V)),  P_W(Z) = Z − W sym(WᵀZ)   (tangent to St × St),
            Ω = ½ skew(Uᵀa + Vᵀb),  result (a − UΩ, b − VΩ)            (vertical part removed).

        Ω is the one making ⟨(a − UΩ, b − VΩ), (UΨ, VΨ)⟩ = ⟨Uᵀa + Vᵀb − 2Ω, Ψ⟩ vanish for every
        skew Ψ. The vertical space lies in the tangent space, so the composition is the
        orthogonal projection onto the horizontal space (idempotent, self-adjoint).
        """
        uu, vv = x
        a, b = self.stiefel_proj(x, z)
        omega = 0.5 * skew(transpose(uu) @ a + transpose(vv) @ b)
        return a - uu @ omega, b - vv @ omega

    def proj_tangent(self, x: Point, u: Tangent) -> Tangent:
        """Tangent vectors live in factor space, so this is ``proj``."""
        return self.proj(x, u)

    def egrad_to_rgrad(self, x: Point, egrad: Tangent) -> Tangent:
        """(P_U(G_U), P_V(G_V)). For a loss F(U Vᵀ) this is horizontal with no further projection:
        skew(UᵀP_U(G_U) + VᵀP_V(G_V)) = skew(UᵀG_W V) + skew(VᵀG_WᵀU) = 0. (For a loss that is
        not a function of U Vᵀ it is not, and the loss is not a function on the quotient.)"""
        return self.stiefel_proj(x, egrad)

    def retract(self, x: Point, u: Tangent) -> Point:
        """(R_U(ξ_U), R_V(ξ_V)) with the chosen Stiefel retraction, e.g. polar(U + ξ_U)."""
        return self.row_frames.retract(x[0], u[0]), self.col_frames.retract(x[1], u[1])

    def transport(self, x: Point, y: Point, u: Tangent) -> Tangent:
        """Vector transport by horizontal projection at the new point: proj(y, u)."""
        return self.proj(y, u)


class StiefelPair(_FactorSpaceMixin, _FramePair):
    """P3: the pair of frames St(m,r) × St(n,r), no quotient (the Stiefel-attention geometry).

    Point: (U, V), U ∈ St(m, r), V ∈ St(n, r); it represents W = U Vᵀ, but (U, V) and (UQ, VQ)
    are different points here.
    Tangent vector: (ξ_U, ξ_V) in factor layout, Uᵀξ_U and Vᵀξ_V skew.
    Metric: the product embedded metric ⟨ξ, η⟩ = tr(ξ_Uᵀη_U) + tr(ξ_Vᵀη_V).
    Built as ``reference.product.Product(Stiefel(m, r), Stiefel(n, r))`` (attribute ``product``):
    two independent frames, each with its own scalar second moment and trust region.
    dim = mr − r(r+1)/2 + nr − r(r+1)/2, r(r−1)/2 more than PI_r (the O(r) fibre).

    Args:
        m, n: the factor heights; r: the number of columns, 1 ≤ r ≤ min(m, n).
        retraction: per factor as in ``Stiefel``: "polar" (default), "polar_svd", "exp" or "qr"
            (first order for r ≥ 2).
    """

    name = "stiefel_pair"
    embedded = False
    quotient = False
    moment_groups = ((0,), (1,))  # each frame its own scalar moment (set from ``product`` too)
    _retractions = FACTOR_RETRACTIONS

    def __init__(self, m: int, n: int, r: int, retraction: str = "polar"):
        super().__init__(m, n, r, retraction)
        self._set_name = f"St({self.m}, {self.r}) × St({self.n}, {self.r})"
        self.product = Product(self.row_frames, self.col_frames)
        self.moment_groups = self.product.moment_groups  # ((0,), (1,)): one per frame
        self.dim = self.product.dim

    def check_tangent(self, x: Point, u: Tangent, atol: float | None = None) -> None:
        """Raise ValueError unless each factor is Stiefel-tangent (``Stiefel.check_tangent``)."""
        atol = DEFAULT_ATOL if atol is None else atol  # read at call time
        check_shapes(f"{self.name} tangent", self.point_shapes, u)
        self.row_frames.check_tangent(x[0], u[0], atol)
        self.col_frames.check_tangent(x[1], u[1], atol)

    def proj(self, x: Point, z: Tangent) -> Tangent:
        """(P_U(z_U), P_V(z_V)), P_W(Z) = Z − W sym(WᵀZ): per-factor Stiefel projection."""
        return self.product.proj(x, z)

    def proj_tangent(self, x: Point, u: Tangent) -> Tangent:
        """Tangent vectors live in factor space, so this is ``proj``."""
        return self.product.proj(x, u)

    def egrad_to_rgrad(self, x: Point, egrad: Tangent) -> Tangent:
        """(P_U(G_U), P_V(G_V)), the Riemannian gradient of each frame (embedded metric)."""
        return self.product.egrad_to_rgrad(x, egrad)

    def retract(self, x: Point, u: Tangent) -> Point:
        """(R_U(ξ_U), R_V(ξ_V)) with the chosen Stiefel retraction, e.g. polar(U + ξ_U)."""
        return self.product.retract(x, u)

    def transport(self, x: Point, y: Point, u: Tangent) -> Tangent:
        """Vector transport by projection, per factor: (P_{U'}(ξ_U), P_{V'}(ξ_V))."""
        return self.product.transport(x, y, u)
