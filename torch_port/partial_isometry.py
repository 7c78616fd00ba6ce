"""Rank-r partial isometries PI_r(m, n) = {U Vᵀ} in torch, batched: P1, P2, P3 (DESIGN §4.3).

Mirrors ``reference/partial_isometry.py`` formula for formula. A point is a tuple
(U (..., m, r), V (..., n, r)) with orthonormal columns, W = U Vᵀ; the leading dimensions are the
batch. Euclidean gradients are (G_U, G_V) with respect to the stored factors. The 2r×2r SVD of
P1's retraction and every r×r inverse square root (``linalg.polar``) are float64; products with
the m×r and n×r factors stay in the factors' dtype.

- ``PartialIsometryEmbedded`` (P1): a submanifold of R^{m×n}, Frobenius metric; tangent
  (Ω, U_p, V_p), ξ = U Ω Vᵀ + U_p Vᵀ + U V_pᵀ with Ω skew.
- ``PartialIsometryQuotient`` (P2): (St(m,r) × St(n,r))/O(r), horizontal (ξ_U, ξ_V), product
  embedded metric; one moment for the pair.
- ``StiefelPair`` (P3): St(m,r) × St(n,r), two frames each with its own moment.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_port import linalg
from torch_port.geometry import Draw, FactoredGeometry, check_factor_shapes, finite_or_raise
from torch_port.linalg import Tensor, skew, transpose
from torch_port.stiefel import RETRACTIONS as FACTOR_RETRACTIONS
from torch_port.stiefel import Stiefel

EMBEDDED_RETRACTIONS = ("projection", "qr")
WIDE = torch.float64


def _validate(cls_name: str, m: int, n: int, r: int, retraction: str, allowed: tuple) -> None:
    for label, value in (("m", m), ("n", n), ("r", r)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{cls_name} needs integer m, n and r, got {label}={value!r}")
    if m < 1 or n < 1 or r < 1:
        raise ValueError(f"{cls_name} needs m ≥ 1, n ≥ 1 and r ≥ 1, got m={m}, n={n}, r={r}")
    if r > min(m, n):
        raise ValueError(f"{cls_name} needs r ≤ min(m, n), got r={r} > min(m={m}, n={n})")
    if retraction not in allowed:
        raise ValueError(
            f"unknown retraction {retraction!r} for {cls_name}; choose one of {allowed}"
        )


class _FramePair(FactoredGeometry):
    """Points (U, V) with orthonormal factors, their validation, and W = U Vᵀ."""

    _retractions: tuple[str, ...]
    point_kinds = ("row", "col")
    #: Point factors with orthonormal columns (``optim.reproject`` restores them).
    orthonormal_factors = (0, 1)

    def __init__(self, m: int, n: int, r: int, retraction: str):
        _validate(type(self).__name__, m, n, r, retraction, self._retractions)
        self.m, self.n, self.r = int(m), int(n), int(r)
        self.retraction = retraction
        self.retraction_order = 1 if retraction == "qr" and self.r > 1 else 2
        factor_retraction = retraction if retraction in FACTOR_RETRACTIONS else "polar"
        self.row_frames = Stiefel(self.m, self.r, retraction=factor_retraction)
        self.col_frames = Stiefel(self.n, self.r, retraction=factor_retraction)
        self.point_shapes = ((self.m, self.r), (self.n, self.r))
        self.dim = (self.m + self.n) * self.r - (3 * self.r**2 + self.r) // 2

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.m}, {self.n}, {self.r}, retraction={self.retraction!r})"
        )

    def draw_point(self, draw: Draw) -> tuple[Tensor, Tensor]:
        """(U, V), each the sign-fixed QR factor of a Gaussian (Haar on each factor)."""
        return (
            linalg.qr_signfixed(draw.normal(self.m, self.r))[0],
            linalg.qr_signfixed(draw.normal(self.n, self.r))[0],
        )

    def pair(self, x: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        return x[0], x[1]

    def egrad_from_pair(self, x: Sequence[Tensor], g_pair: Sequence[Tensor]) -> tuple:
        return g_pair[0], g_pair[1]

    def project_point(self, a: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(polar(A), polar(B)): the nearest pair of frames."""
        return linalg.polar(a[0]), linalg.polar(a[1])

    def residuals(self, x: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(‖UᵀU − I‖, ‖VᵀV − I‖) per point, measured in float64."""
        return linalg.orthonormality_residual(x[0]), linalg.orthonormality_residual(x[1])

    def check_point(self, x: Sequence[Tensor], atol: float | None = None) -> None:
        """Shapes, finiteness and orthonormal U and V (residual ≤ atol, default sqrt(ε) of the
        dtype), with the worst measured residual in the message."""
        check_factor_shapes(self, "point (U, V)", x, self.point_shapes)
        finite_or_raise(f"{self.name} point", x)
        self.check_orthonormal(x, {"U": x[0], "V": x[1]}, atol)


class PartialIsometryEmbedded(_FramePair):
    """P1: PI_r(m, n) as a submanifold of R^{m×n} with the Frobenius metric.

    Tangent vector (Ω (..., r, r) skew, U_p (..., m, r), V_p (..., n, r)), ξ = U Ω Vᵀ + U_p Vᵀ
    + U V_pᵀ; metric ‖Ω‖² + ‖U_p‖² + ‖V_p‖².

    Args:
        retraction: "projection" (default; the nearest partial isometry to W + ξ through a 2r×2r
            SVD, Procrustes-aligned to the old factors, each factor re-orthonormalised) or "qr".
    """

    name = "partial_isometry_embedded"
    embedded = True
    quotient = False
    moment_groups = ((0, 1, 2),)
    tangent_kinds = ("core", "row", "col")
    _retractions = EMBEDDED_RETRACTIONS

    def __init__(self, m: int, n: int, r: int, retraction: str = "projection"):
        super().__init__(m, n, r, retraction)
        self.tangent_shapes = ((self.r, self.r), (self.m, self.r), (self.n, self.r))

    def zero_tangent(self, x: Sequence[Tensor]) -> tuple[Tensor, ...]:
        u, v = x
        batch = u.shape[:-2]
        return (u.new_zeros((*batch, self.r, self.r)), torch.zeros_like(u), torch.zeros_like(v))

    def tangent_to_matrix(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> Tensor:
        uu, vv = x
        omega, up, vp = u
        return (uu @ omega + up) @ transpose(vv) + uu @ transpose(vp)

    def proj(self, x: Sequence[Tensor], z: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """From a factor-space z = (z_U, z_V): Ω = skew(Uᵀz_U), U_p = (I − UUᵀ)z_U,
        V_p = (I − VVᵀ)z_V."""
        if len(z) != 2:
            raise ValueError(
                f"{self.name}.proj takes a factor-space vector (z_U, z_V); use proj_tangent for "
                "(Ω, U_p, V_p)"
            )
        uu, vv = x
        zu, zv = z
        a, b = transpose(uu) @ zu, transpose(vv) @ zv
        return skew(a), zu - uu @ a, zv - vv @ b

    egrad_to_rgrad = proj

    def proj_tangent(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """(skew(Ω), (I − UUᵀ)U_p, (I − VVᵀ)V_p)."""
        uu, vv = x
        omega, up, vp = u
        return skew(omega), up - uu @ (transpose(uu) @ up), vp - vv @ (transpose(vv) @ vp)

    def retract(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """As ``reference.PartialIsometryEmbedded.retract``: Q_U R_U = U_p, Q_V R_V = V_p
        (sign-fixed QR), K = [[I + Ω, R_Vᵀ], [R_U, 0]] = Y Σ Zᵀ (float64), U' = [U, Q_U] Y_r,
        V' = [V, Q_V] Z_r, Q = polar(U'ᵀU + V'ᵀV), result (polar(U'Q), polar(V'Q)).
        "qr": (qf(U + U_p + ½UΩ), qf(V + V_p − ½VΩ))."""
        uu, vv = x
        omega, up, vp = u
        if self.retraction == "qr":
            return (
                linalg.qr_signfixed(uu + up + 0.5 * (uu @ omega))[0],
                linalg.qr_signfixed(vv + vp - 0.5 * (vv @ omega))[0],
            )
        r, dtype = self.r, uu.dtype
        qu, ru = linalg.qr_native(up, signfixed=True)
        qv, rv = linalg.qr_native(vp, signfixed=True)
        ru, rv = ru.to(WIDE), rv.to(WIDE)
        eye = torch.eye(r, dtype=WIDE, device=uu.device)
        top = torch.cat([eye + omega.to(WIDE), transpose(rv)], dim=-1)
        bottom = torch.cat([ru, torch.zeros_like(ru)], dim=-1)
        y, _, zt = torch.linalg.svd(torch.cat([top, bottom], dim=-2))
        u_new = torch.cat([uu, qu.to(dtype)], dim=-1) @ y[..., :, :r].to(dtype)
        v_new = torch.cat([vv, qv.to(dtype)], dim=-1) @ transpose(zt[..., :r, :]).to(dtype)
        align = transpose(u_new) @ uu + transpose(v_new) @ vv
        q = linalg.polar_svd(align.to(WIDE)).to(dtype)
        return linalg.polar(u_new @ q), linalg.polar(v_new @ q)

    def transport(
        self, x: Sequence[Tensor], y: Sequence[Tensor], u: Sequence[Tensor]
    ) -> tuple[Tensor, ...]:
        """Projection at y of ξ = L Rᵀ, L = [UΩ + U_p, U], R = [V, V_p]:
        proj(y, (L (RᵀV'), R (LᵀU')))."""
        uu, vv = x
        omega, up, vp = u
        left = torch.cat([uu @ omega + up, uu], dim=-1)
        right = torch.cat([vv, vp], dim=-1)
        return self.proj(y, (left @ (transpose(right) @ y[1]), right @ (transpose(left) @ y[0])))


class _FactorSpace(_FramePair):
    """Tangent vectors (ξ_U, ξ_V) in factor layout (P2 and P3)."""

    tangent_kinds = ("row", "col")

    def __init__(self, m: int, n: int, r: int, retraction: str = "polar"):
        super().__init__(m, n, r, retraction)
        self.tangent_shapes = self.point_shapes

    def zero_tangent(self, x: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        return torch.zeros_like(x[0]), torch.zeros_like(x[1])

    def tangent_to_matrix(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> Tensor:
        return u[0] @ transpose(x[1]) + x[0] @ transpose(u[1])

    def stiefel_proj(self, x: Sequence[Tensor], z: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(P_U(z_U), P_V(z_V)), P_W(Z) = Z − W sym(WᵀZ)."""
        return self.row_frames.proj(x[0], z[0]), self.col_frames.proj(x[1], z[1])

    def retract(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(R_U(ξ_U), R_V(ξ_V)) with the chosen Stiefel retraction, e.g. polar(U + ξ_U)."""
        return self.row_frames.retract(x[0], u[0]), self.col_frames.retract(x[1], u[1])

    def exp(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        return self.row_frames.exp(x[0], u[0]), self.col_frames.exp(x[1], u[1])


class PartialIsometryQuotient(_FactorSpace):
    """P2: (St(m,r) × St(n,r))/O(r), O(r) acting by (U Q, V Q), product embedded metric on
    horizontal vectors (skew(Uᵀξ_U + Vᵀξ_V) = 0). One scalar moment for the pair.

    Args:
        retraction: per factor, as ``Stiefel``: "polar" (default), "polar_svd", "exp", "qr".
    """

    name = "partial_isometry_quotient"
    embedded = False
    quotient = True
    moment_groups = ((0, 1),)
    _retractions = FACTOR_RETRACTIONS

    def proj(self, x: Sequence[Tensor], z: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(a − UΩ, b − VΩ) with (a, b) = (P_U(z_U), P_V(z_V)), Ω = ½ skew(Uᵀa + Vᵀb)."""
        uu, vv = x
        a, b = self.stiefel_proj(x, z)
        omega = 0.5 * skew(transpose(uu) @ a + transpose(vv) @ b)
        return a - uu @ omega, b - vv @ omega

    proj_tangent = proj

    def egrad_to_rgrad(self, x: Sequence[Tensor], egrad: Sequence[Tensor]) -> tuple:
        """(P_U(G_U), P_V(G_V)) (horizontal for a loss of U Vᵀ; not projected further)."""
        return self.stiefel_proj(x, egrad)

    def transport(self, x: Sequence[Tensor], y: Sequence[Tensor], u: Sequence[Tensor]) -> tuple:
        return self.proj(y, u)

    def vertical(self, x: Sequence[Tensor], omega: Tensor) -> tuple[Tensor, Tensor]:
        return x[0] @ omega, x[1] @ omega

    def act(self, x: Sequence[Tensor], q: Tensor) -> tuple[Tensor, Tensor]:
        return x[0] @ q, x[1] @ q

    def horizontal_residual(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> Tensor:
        """‖skew(Uᵀξ_U + Vᵀξ_V)‖ per point."""
        return linalg.frobenius(skew(transpose(x[0]) @ u[0] + transpose(x[1]) @ u[1]))


class StiefelPair(_FactorSpace):
    """P3: St(m,r) × St(n,r), no quotient: two frames, each with its own scalar moment and trust
    region (per-frame scalars of shape (..., 2)).

    Args:
        retraction: per factor, as ``Stiefel``: "polar" (default), "polar_svd", "exp", "qr".
    """

    name = "stiefel_pair"
    embedded = False
    quotient = False
    moment_groups = ((0,), (1,))
    _retractions = FACTOR_RETRACTIONS

    def __init__(self, m: int, n: int, r: int, retraction: str = "polar"):
        super().__init__(m, n, r, retraction)
        self.dim = self.row_frames.dim + self.col_frames.dim

    def proj(self, x: Sequence[Tensor], z: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        return self.stiefel_proj(x, z)

    proj_tangent = proj
    egrad_to_rgrad = proj

    def transport(self, x: Sequence[Tensor], y: Sequence[Tensor], u: Sequence[Tensor]) -> tuple:
        return self.stiefel_proj(y, u)
