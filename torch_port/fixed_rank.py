"""Fixed-rank matrices in torch, batched: embedded (R1) and quotient (R2) (DESIGN §4.1, §4.2).

Mirrors ``reference/fixed_rank.py`` formula for formula. A point is a tuple of tensors whose
leading dimensions are the batch (e.g. layers × heads): R1 (U (..., m, r), S (..., r, r),
V (..., n, r)), R2 (A (..., m, r), B (..., n, r)); every per-point scalar (inner product, norm)
is a tensor of shape (...,). The r×r and 2r×2r work (inverses, solves, SVDs, eigendecompositions)
is done in float64 whatever the factors' dtype; products with the m×r and n×r factors stay in
the factors' dtype. No method forms an m×n matrix except ``to_matrix``/``tangent_to_matrix``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_port import deferred, linalg
from torch_port.geometry import Draw, FactoredGeometry, check_factor_shapes, finite_or_raise
from torch_port.linalg import Tensor, transpose

#: R2 refuses points with κ(A)²κ(B)²·u above this (u of float64), as the reference does.
CONDITION_LIMIT = 1e-8

WIDE = torch.float64
#: R1 refuses a core S with σ_r/σ_1 ≤ r·RANK_EPS (ε of float64), as the reference; read at
#: call time, so a check can move the threshold (a near-miss control).
RANK_EPS = torch.finfo(WIDE).eps


def _wide(a: Tensor) -> Tensor:
    return a if a.dtype == WIDE else a.to(WIDE)


def _check_sizes(m: int, n: int, r: int) -> None:
    for name, v in (("m", m), ("n", n), ("r", r)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if r > min(m, n):
        raise ValueError(f"rank r must satisfy r ≤ min(m, n), got r={r} > min({m}, {n})")


def _set_sizes(geometry: FactoredGeometry, m: int, n: int, r: int) -> None:
    """Check the sizes (``_check_sizes``), then set ``geometry.m``, ``.n``, ``.r`` and its
    dimension (m + n − r)·r, that of the rank-r m×n matrices."""
    _check_sizes(m, n, r)
    geometry.m, geometry.n, geometry.r = int(m), int(n), int(r)
    geometry.dim = (geometry.m + geometry.n - geometry.r) * geometry.r


def _raise_if(flag: Tensor, message) -> None:
    """ValueError(message()) where any entry of ``flag`` is set (the read is deferred while a
    step speculates, ``torch_port.deferred``: the careful recomputation raises)."""
    if not deferred.holds(~flag.any()):
        raise ValueError(message())


def singular_value_ratio(a: Tensor) -> Tensor:
    """σ_min/σ_max of each matrix of a batch (float64 SVD; 0 for a zero matrix)."""
    s = torch.linalg.svdvals(_wide(a))
    top = s[..., 0]
    return torch.where(top > 0, s[..., -1] / torch.where(top > 0, top, 1.0), 0.0)


def _gram_ratio(a: Tensor) -> Tensor:
    """λ_min/λ_max of AᵀA per matrix (float64), i.e. (σ_min/σ_max)² of A, from the r×r Gram."""
    lam = torch.linalg.eigvalsh(linalg.gram64(a))
    top = lam[..., -1]
    return torch.where(top > 0, lam[..., 0] / torch.where(top > 0, top, 1.0), 0.0)


class FixedRankEmbedded(FactoredGeometry):
    """R1: rank-r matrices as a submanifold of R^{m×n} with the Frobenius metric (Vandereycken).

    A point is (U, S, V), U (..., m, r) and V (..., n, r) with orthonormal columns and S
    (..., r, r) invertible (not necessarily diagonal): W = U S Vᵀ. A tangent vector is
    (M, U_p, V_p) with UᵀU_p = 0, VᵀV_p = 0, standing for ξ = U M Vᵀ + U_p Vᵀ + U V_pᵀ; the
    metric ‖M‖² + ‖U_p‖² + ‖V_p‖² is the Frobenius norm of ξ. Euclidean gradients are
    (G_U, G_S, G_V) with respect to the stored factors.

    Args:
        m, n, r: sizes, 1 ≤ r ≤ min(m, n).
        retraction: "projection" (default; the rank-r truncated SVD of W + ξ through QR of U_p
            and V_p and the SVD of a 2r×2r core, each new factor then passed through
            ``linalg.polar``; second order) or "qr" (first order, a control).
    """

    name = "fixed_rank_embedded"
    embedded = True
    quotient = False
    moment_groups = ((0, 1, 2),)
    point_kinds = ("row", "core", "col")
    tangent_kinds = ("core", "row", "col")
    #: Point factors with orthonormal columns (``optim.reproject`` restores them).
    orthonormal_factors = (0, 2)

    def __init__(self, m: int, n: int, r: int, retraction: str = "projection"):
        _set_sizes(self, m, n, r)
        if retraction not in ("projection", "qr"):
            raise ValueError(f"unknown retraction {retraction!r}; choose 'projection' or 'qr'")
        self.retraction = retraction
        self.retraction_order = 2 if retraction == "projection" else 1
        self.point_shapes = ((self.m, self.r), (self.r, self.r), (self.n, self.r))
        self.tangent_shapes = ((self.r, self.r), (self.m, self.r), (self.n, self.r))

    def __repr__(self) -> str:
        return f"FixedRankEmbedded({self.m}, {self.n}, {self.r}, retraction={self.retraction!r})"

    # -- points and tangent vectors ------------------------------------------------------------
    def draw_point(self, draw: Draw) -> tuple[Tensor, ...]:
        """Haar U, V and S = Q1 diag(s) Q2ᵀ with s log-uniform in [1, e] (κ(S) ≤ e), as the
        reference."""
        u = linalg.qr_signfixed(draw.normal(self.m, self.r))[0]
        v = linalg.qr_signfixed(draw.normal(self.n, self.r))[0]
        q1 = linalg.qr_signfixed(draw.normal(self.r, self.r))[0]
        q2 = linalg.qr_signfixed(draw.normal(self.r, self.r))[0]
        sv = torch.exp(draw.uniform(self.r))
        return u, (q1 * sv[..., None, :]) @ transpose(q2), v

    def zero_tangent(self, x: Sequence[Tensor]) -> tuple[Tensor, ...]:
        u, s, v = x
        return torch.zeros_like(s), torch.zeros_like(u), torch.zeros_like(v)

    # -- projections and gradients -------------------------------------------------------------
    def proj(self, x: Sequence[Tensor], z: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """From a factor-space vector z = (z_U, z_S, z_V) (a gradient layout):
        M = z_S, U_p = (I − UUᵀ) z_U S^{-ᵀ}, V_p = (I − VVᵀ) z_V S^{-1} (S^{-1} in float64)."""
        u, s, v = x
        z_u, z_s, z_v = z
        s_inv = torch.linalg.inv(_wide(s)).to(u.dtype)
        a, b = z_u @ transpose(s_inv), z_v @ s_inv
        return z_s, a - u @ (transpose(u) @ a), b - v @ (transpose(v) @ b)

    egrad_to_rgrad = proj

    def proj_tangent(self, x: Sequence[Tensor], xi: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """(M, U_p, V_p) ↦ (M, (I − UUᵀ)U_p, (I − VVᵀ)V_p)."""
        u, _, v = x
        m_, u_p, v_p = xi
        return m_, u_p - u @ (transpose(u) @ u_p), v_p - v @ (transpose(v) @ v_p)

    # -- retraction and transport --------------------------------------------------------------
    def retract(self, x: Sequence[Tensor], xi: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """R_W(ξ) as ``reference.FixedRankEmbedded.retract``.

        "projection": U_p = Q_U R_U, V_p = Q_V R_V (thin QR, in the factors' dtype),
        K = [[S + M, R_Vᵀ], [R_U, 0]] = Y Σ Zᵀ (2r×2r SVD in float64), new point
        (polar([U, Q_U] Y_r), Σ_r, polar([V, Q_V] Z_r)).
        "qr": (Q_A, R_A R_Bᵀ, Q_B) with A = U(S + M) + U_p = Q_A R_A, B = V + V_p S^{-ᵀ} = Q_B R_B.
        Raises ValueError when the new S is numerically singular (σ_r/σ_1 ≤ r·ε).
        """
        u, s, v = x
        m_, u_p, v_p = xi
        r, dtype = self.r, u.dtype
        if self.retraction == "qr":
            s_inv = torch.linalg.inv(_wide(s)).to(dtype)
            qa, ra = linalg.qr_signfixed(u @ (s + m_) + u_p)
            qb, rb = linalg.qr_signfixed(v + v_p @ transpose(s_inv))
            s_new = ra @ transpose(rb)
            self._check_rank(singular_value_ratio(s_new))
            return qa, s_new, qb
        qu, ru = linalg.qr_native(u_p)
        qv, rv = linalg.qr_native(v_p)
        ru, rv = _wide(ru), _wide(rv)
        top = torch.cat([_wide(s + m_), transpose(rv)], dim=-1)
        bottom = torch.cat([ru, torch.zeros_like(ru)], dim=-1)
        yk, sig, zkt = torch.linalg.svd(torch.cat([top, bottom], dim=-2))
        self._check_rank(sig[..., r - 1] / sig[..., 0])
        u_new = torch.cat([u, qu.to(dtype)], dim=-1) @ yk[..., :, :r].to(dtype)
        v_new = torch.cat([v, qv.to(dtype)], dim=-1) @ transpose(zkt[..., :r, :]).to(dtype)
        s_new = torch.diag_embed(sig[..., :r]).to(dtype)
        return linalg.polar(u_new), s_new, linalg.polar(v_new)

    def _check_rank(self, ratio: Tensor) -> None:
        bad = ~(ratio > self.r * RANK_EPS)
        _raise_if(
            bad,
            lambda: (
                f"the step leaves the rank-{self.r} manifold: σ_r/σ_1 = "
                f"{float(ratio.min()):.3e} (step too long; use a trust region)"
            ),
        )

    def transport(
        self, x: Sequence[Tensor], y: Sequence[Tensor], xi: Sequence[Tensor]
    ) -> tuple[Tensor, ...]:
        """Projection at y of the old tangent matrix ξ = L Rᵀ, L = [U M + U_p, U], R = [V, V_p]:
        M' = U'ᵀ L (Rᵀ V'), U_p' = L (Rᵀ V') − U' M', V_p' = R (Lᵀ U') − V' M'ᵀ."""
        u, _, v = x
        m_, u_p, v_p = xi
        u2, _, v2 = y
        left = torch.cat([u @ m_ + u_p, u], dim=-1)
        right = torch.cat([v, v_p], dim=-1)
        zv = left @ (transpose(right) @ v2)
        ztu = right @ (transpose(left) @ u2)
        m2 = transpose(u2) @ zv
        return m2, zv - u2 @ m2, ztu - v2 @ transpose(m2)

    # -- matrices ------------------------------------------------------------------------------
    def pair(self, x: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(A, B) = (U S, V)."""
        u, s, v = x
        return u @ s, v

    def egrad_from_pair(self, x: Sequence[Tensor], g_pair: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """(G_U, G_S, G_V) = (G_A Sᵀ, Uᵀ G_A, G_B) for f(U, S, V) = F(A = U S, B = V)."""
        u, s, _ = x
        g_a, g_b = g_pair
        return g_a @ transpose(s), transpose(u) @ g_a, g_b

    def tangent_to_matrix(self, x: Sequence[Tensor], xi: Sequence[Tensor]) -> Tensor:
        """U M Vᵀ + U_p Vᵀ + U V_pᵀ (checks only: forms m×n matrices)."""
        u, _, v = x
        m_, u_p, v_p = xi
        return (u @ m_ + u_p) @ transpose(v) + u @ transpose(v_p)

    # -- validation ----------------------------------------------------------------------------
    def check_point(self, x: Sequence[Tensor], atol: float | None = None) -> None:
        """Shapes, finiteness, orthonormal U and V (residual ≤ atol, default sqrt(ε) of the
        dtype) and invertible S (σ_min/σ_max > r·ε); the message gives the measured values."""
        check_factor_shapes(self, "point (U, S, V)", x, self.point_shapes)
        finite_or_raise("point (U, S, V)", x)
        self.check_orthonormal(x, {"U": x[0], "V": x[2]}, atol)
        ratio = singular_value_ratio(x[1])
        _raise_if(
            ~(ratio > self.r * RANK_EPS),
            lambda: f"rank-deficient factor S: σ_min/σ_max = {float(ratio.min()):.3e}",
        )


class FixedRankQuotient(FactoredGeometry):
    """R2: rank-r matrices as the quotient (R_*^{m×r} × R_*^{n×r}) / GL(r), W = A Bᵀ.

    A point is (A (..., m, r), B (..., n, r)) of full column rank, standing for its class
    {(AM, BM^{-ᵀ})}. A tangent vector is a horizontal (ξ_A, ξ_B) in factor layout. Metrics:
    "preconditioned" (default) g = tr(BᵀB ξ_Aᵀη_A) + tr(AᵀA ξ_Bᵀη_B), and "balanced"
    g = tr((AᵀA)^{-1}ξ_Aᵀη_A) + tr((BᵀB)^{-1}ξ_Bᵀη_B). The vertical space is {(AΩ, −BΩᵀ)}.
    The r×r Grams, their inverses and the balanced metric's Sylvester solve are float64.

    Args:
        metric: "preconditioned" or "balanced".
    """

    name = "fixed_rank_quotient"
    embedded = False
    quotient = True
    retraction_order = 1
    moment_groups = ((0, 1),)
    point_kinds = ("row", "col")
    tangent_kinds = ("row", "col")
    orthonormal_factors = ()  # any full-rank pair (A, B) is a point

    def __init__(self, m: int, n: int, r: int, metric: str = "preconditioned"):
        _set_sizes(self, m, n, r)
        if metric not in ("preconditioned", "balanced"):
            raise ValueError(f"unknown metric {metric!r}; choose 'preconditioned' or 'balanced'")
        self.metric = metric
        self.point_shapes = ((self.m, self.r), (self.n, self.r))
        self.tangent_shapes = self.point_shapes

    def __repr__(self) -> str:
        return f"FixedRankQuotient({self.m}, {self.n}, {self.r}, metric={self.metric!r})"

    def draw_point(self, draw: Draw) -> tuple[Tensor, ...]:
        """Gaussian A, B scaled by 1/√m and 1/√n (full rank almost surely)."""
        return draw.normal(self.m, self.r) / self.m**0.5, draw.normal(self.n, self.r) / self.n**0.5

    def zero_tangent(self, x: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return tuple(torch.zeros_like(p) for p in x)

    # -- metric ----------------------------------------------------------------------------------
    def _grams(self, x: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(AᵀA, BᵀB) in float64."""
        return linalg.gram64(x[0]), linalg.gram64(x[1])

    def _weights(self, x: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(W_A, W_B) with g = tr(W_A ξ_Aᵀη_A) + tr(W_B ξ_Bᵀη_B), in the factors' dtype."""
        ata, btb = self._grams(x)
        if self.metric == "preconditioned":
            wa, wb = btb, ata
        else:
            wa, wb = torch.linalg.inv(ata), torch.linalg.inv(btb)
        return wa.to(x[0].dtype), wb.to(x[0].dtype)

    def inner(self, x: Sequence[Tensor], xi: Sequence[Tensor], eta: Sequence[Tensor]) -> Tensor:
        """g = tr(W_A ξ_Aᵀη_A) + tr(W_B ξ_Bᵀη_B) per point."""
        wa, wb = self._weights(x)
        return torch.sum((xi[0] @ wa) * eta[0], dim=(-2, -1)) + torch.sum(
            (xi[1] @ wb) * eta[1], dim=(-2, -1)
        )

    def norm(self, x: Sequence[Tensor], xi: Sequence[Tensor]) -> Tensor:
        """sqrt(max(g(ξ, ξ), 0)) per point, unscaled where safe and as s·‖ξ/s‖ otherwise."""
        return self.scaled_norm(
            lambda parts: torch.sqrt(torch.clamp(self.inner(x, parts, parts), min=0.0)), xi
        )

    # -- projections and gradients -------------------------------------------------------------
    def proj(self, x: Sequence[Tensor], eta: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """Metric-orthogonal projection onto the horizontal space: (η_A + AΩ, η_B − BΩᵀ) with
        preconditioned: Ω = ½(η_BᵀB (BᵀB)^{-1} − (AᵀA)^{-1}Aᵀη_A);
        balanced: PΩ + ΩP = BᵀB C AᵀA, P = BᵀB AᵀA, C = (BᵀB)^{-1}η_BᵀB − Aᵀη_A(AᵀA)^{-1}."""
        return self._proj(x, eta, self._grams(x))

    def _proj(self, x, eta, grams) -> tuple[Tensor, ...]:
        a, b = x
        e_a, e_b = eta
        ata, btb = grams
        bte = _wide(transpose(b) @ e_b)  # Bᵀη_B (r×r)
        ate = _wide(transpose(a) @ e_a)  # Aᵀη_A
        if self.metric == "preconditioned":
            omega = 0.5 * (transpose(torch.linalg.solve(btb, bte)) - torch.linalg.solve(ata, ate))
        else:
            c = torch.linalg.solve(btb, transpose(bte)) - transpose(
                torch.linalg.solve(ata, transpose(ate))
            )
            omega = _sylvester_product(btb, ata, btb @ c @ ata)
        omega = omega.to(a.dtype)
        return e_a + a @ omega, e_b - b @ transpose(omega)

    def proj_tangent(self, x: Sequence[Tensor], xi: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return self.proj(x, xi)

    def egrad_to_rgrad(self, x: Sequence[Tensor], egrad: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """preconditioned: (G_A (BᵀB)^{-1}, G_B (AᵀA)^{-1}); balanced: (G_A AᵀA, G_B BᵀB); then
        the horizontal projection (which only matters for a loss not constant on the fibres)."""
        g_a, g_b = egrad
        grams = self._grams(x)
        ata, btb = grams
        dtype = g_a.dtype
        if self.metric == "preconditioned":
            raw = (g_a @ torch.linalg.inv(btb).to(dtype), g_b @ torch.linalg.inv(ata).to(dtype))
        else:
            raw = (g_a @ ata.to(dtype), g_b @ btb.to(dtype))
        return self._proj(x, raw, grams)

    # -- retraction and transport --------------------------------------------------------------
    def retract(self, x: Sequence[Tensor], xi: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """(A + ξ_A, B + ξ_B), no rebalancing (as the reference). Raises ValueError when a new
        factor is numerically rank deficient: its Gram has λ_min/λ_max ≤ ε (σ_min/σ_max ≤ 1.5e-8;
        the reference tests σ_min/σ_max ≤ r·ε with an SVD of the m×r factor)."""
        y = (x[0] + xi[0], x[1] + xi[1])
        for label, f in zip("AB", y, strict=True):
            ratio = _gram_ratio(f)
            _raise_if(
                ~(ratio > torch.finfo(WIDE).eps),
                lambda label=label, ratio=ratio: (
                    f"the step leaves the rank-{self.r} manifold: "
                    f"rank-deficient factor {label}: σ_min/σ_max = "
                    f"{float(ratio.clamp(min=0).min()) ** 0.5:.3e}"
                ),
            )
        return y

    def transport(
        self, x: Sequence[Tensor], y: Sequence[Tensor], xi: Sequence[Tensor]
    ) -> tuple[Tensor, ...]:
        """Horizontal projection at y of the factor-space vector ξ."""
        return self.proj(y, xi)

    # -- matrices and the group ----------------------------------------------------------------
    def pair(self, x: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        return x[0], x[1]

    def egrad_from_pair(self, x: Sequence[Tensor], g_pair: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return g_pair[0], g_pair[1]

    def tangent_to_matrix(self, x: Sequence[Tensor], xi: Sequence[Tensor]) -> Tensor:
        """ξ_A Bᵀ + A ξ_Bᵀ (checks only)."""
        return xi[0] @ transpose(x[1]) + x[0] @ transpose(xi[1])

    def vertical(self, x: Sequence[Tensor], omega: Tensor) -> tuple[Tensor, ...]:
        """The vertical vector (AΩ, −BΩᵀ) for r×r Ω (batched)."""
        return x[0] @ omega, -x[1] @ transpose(omega)

    def act(self, x: Sequence[Tensor], g: Tensor) -> tuple[Tensor, ...]:
        """The group action (A, B)·M = (A M, B M^{-ᵀ}) of M ∈ GL(r) (batched)."""
        m_inv = torch.linalg.inv(_wide(g)).to(x[1].dtype)
        return x[0] @ g, x[1] @ transpose(m_inv)

    def check_point(self, x: Sequence[Tensor], atol: float | None = None) -> None:
        """Shapes, finiteness, full column rank, and κ(A)²κ(B)²·u ≤ 1e-8 (u of float64, the
        precision of the r×r work), as the reference; κ² from the float64 Grams."""
        check_factor_shapes(self, "point (A, B)", x, self.point_shapes)
        finite_or_raise("point (A, B)", x)
        ra, rb = _gram_ratio(x[0]), _gram_ratio(x[1])
        eps = torch.finfo(WIDE).eps
        for label, ratio in (("A", ra), ("B", rb)):
            _raise_if(
                ~(ratio > (self.r * eps) ** 2),
                lambda label=label, ratio=ratio: (
                    f"rank-deficient factor {label}: σ_min/σ_max "
                    f"= {float(ratio.clamp(min=0).min()) ** 0.5:.3e}"
                ),
            )
        amplification = 1.0 / (ra * rb) * eps / 2  # κ(A)²κ(B)²·u
        _raise_if(
            amplification > CONDITION_LIMIT,
            lambda: (
                f"ill-conditioned factors: κ(A)²κ(B)²·u = {float(amplification.max()):.1e} "
                f"> {CONDITION_LIMIT:.0e}"
            ),
        )


def _sylvester_product(m: Tensor, n: Tensor, c: Tensor) -> Tensor:
    """Ω with PΩ + ΩP = C for P = M N, M and N symmetric positive definite (batched, float64).

    With M = L Lᵀ (Cholesky) and Lᵀ N L = Q Λ Qᵀ, P = X Λ X^{-1} for X = L Q, so
    Ω = X [(X^{-1} C X) / (λ_i + λ_j)] X^{-1}: one Cholesky, one eigh, triangular solves, batched
    (the reference uses SciPy's Bartels–Stewart ``solve_sylvester``). The two differ by rounding
    amplified by κ(X)² ≤ κ(BᵀB)·κ(AᵀA)·…, within the κ(A)²κ(B)² scaling of R2's tolerances."""
    chol = torch.linalg.cholesky(m)
    lam, q = torch.linalg.eigh(linalg.sym(transpose(chol) @ n @ chol))
    x = chol @ q

    rhs = transpose(q) @ torch.linalg.solve_triangular(chol, c @ x, upper=False)  # X^{-1}CX
    tilde = rhs / (lam[..., :, None] + lam[..., None, :])
    # Ω = X Ω̃ X^{-1} = (X Ω̃ Qᵀ) L^{-1}: a right triangular solve.
    return torch.linalg.solve_triangular(chol, x @ tilde @ transpose(q), upper=False, left=False)
