"""The Stiefel manifold St(d, r) = {W ∈ R^{d×r} : WᵀW = I_r} (DESIGN §4.0)."""

from __future__ import annotations

import numpy as np

from reference import linalg
from reference.geometry import check_finite, check_shapes, check_sizes
from reference.linalg import Array, frobenius, sym, transpose

RETRACTIONS = ("polar", "polar_svd", "qr", "exp")
METRICS = ("embedded", "canonical")

#: Default tolerance of ``check_point``/``check_tangent`` on ‖WᵀW − I‖: sqrt(float64 ε). Points made
#: by this library sit at O(r·ε) ≈ 1e-15, so this flags a real violation, never rounding.
DEFAULT_ATOL = float(np.sqrt(np.finfo(np.float64).eps))


def retraction_order(d: int, r: int, retraction: str, metric: str) -> int:
    """The order of a retraction against the geodesics of the chosen metric: 2 where
    ‖R_W(tξ) − γ(t)‖ = O(t³) for the metric's geodesic γ with γ(0) = W, γ'(0) = ξ, else 1.

    Embedded metric: polar, polar_svd and exp are second order, QR first order for r ≥ 2.
    Canonical metric: the embedded and canonical geodesics have the accelerations −W ξᵀξ and
    −ξξᵀW − W((Wᵀξ)² + ξᵀξ) at t = 0 (Edelman, Arias & Smith 1998, eqs. 2.7 and 2.41); for
    ξ = WA + W⊥B (A skew) they differ by W⊥BA, a tangent vector, so every map that is second
    order for the embedded metric (polar, polar_svd, exp) is only first order for the canonical
    one, unless BA = 0 for every ξ: r = 1 (A = 0; the two metrics coincide on St(d, 1)) or
    r = d (B = 0; on O(d) the two metrics have the same geodesics). QR is first order for r ≥ 2
    in both metrics and equals the polar map for r = 1.
    """
    if r == 1:
        return 2
    if retraction == "qr":
        return 1
    return 2 if metric == "embedded" or r == d else 1


class Stiefel:
    """St(d, r) with 1 ≤ r ≤ d.

    A point is one float64 array W of shape (d, r) with WᵀW = I_r. A tangent vector at W is an
    array ξ of the same shape with Wᵀξ + ξᵀW = 0. The metric is the embedded (Euclidean) one,
    ⟨ξ, η⟩ = tr(ξᵀη), or optionally the canonical one, ⟨ξ, η⟩ = tr(ξᵀ(I − ½WWᵀ)η).

    ``exp`` is always the exponential map of the embedded metric (the map the "exp" retraction
    uses), ``canonical_exp`` that of the canonical metric, and ``geodesic`` that of the metric
    chosen here; ``retraction_order`` is measured against the chosen metric's geodesics (see
    ``retraction_order``): with the canonical metric every retraction is first order for
    2 ≤ r < d.

    Args:
        d: ambient dimension (rows).
        r: number of orthonormal columns, 1 ≤ r ≤ d.
        retraction: "polar" (default; (W + ξ)(Gram)^{-1/2} with the Gram actually formed, second
            order in the embedded metric), "polar_svd" (the same map through the SVD), "qr"
            (sign-fixed QR, first order for r ≥ 2) or "exp" (the exponential map of the
            embedded metric).
        metric: "embedded" (default) or "canonical".
    """

    name = "stiefel"
    embedded = False  # tangent vectors live in R^{d×r}, the same space as points and gradients
    quotient = False
    moment_groups = ((0,),)

    def __init__(self, d: int, r: int, retraction: str = "polar", metric: str = "embedded"):
        check_sizes("St(d, r)", d=d, r=r)
        if r > d:
            raise ValueError(
                f"St(d, r) needs r ≤ d (at most d orthonormal columns), got r={r} > d={d}"
            )
        if retraction not in RETRACTIONS:
            raise ValueError(f"unknown retraction {retraction!r}; choose one of {RETRACTIONS}")
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; choose one of {METRICS}")
        self.d, self.r = int(d), int(r)
        self.retraction, self.metric = retraction, metric
        #: Against the chosen metric's geodesics (``retraction_order``): 2 for polar and exp in
        #: the embedded metric, 1 for QR (r ≥ 2) and, in the canonical metric, for 2 ≤ r < d.
        self.retraction_order = retraction_order(self.d, self.r, retraction, metric)
        self.dim = self.d * self.r - self.r * (self.r + 1) // 2
        self.shape = (self.d, self.r)

    def __repr__(self) -> str:
        return (
            f"Stiefel({self.d}, {self.r}, retraction={self.retraction!r}, metric={self.metric!r})"
        )

    # -- points and tangent vectors ------------------------------------------------------------
    def random_point(self, rng: np.random.Generator) -> Array:
        """Q of the sign-fixed QR of a Gaussian Z: the uniform (Haar) distribution on St(d, r)."""
        return linalg.qr_signfixed(rng.standard_normal(self.shape))[0]

    def random_tangent(self, x: Array, rng: np.random.Generator) -> Array:
        """A unit-norm tangent vector: P_W(P_W(Z))/‖·‖ for a Gaussian Z. Projected twice: the
        first projection's tangency error is u·‖Z‖, far above u·‖P_W(Z)‖ when Z is nearly normal
        (d close to r); the second brings it to the rounding of the tangent vector itself."""
        u = self.proj(x, self.proj(x, rng.standard_normal(self.shape)))
        return u / self.norm(x, u)

    def zero_tangent(self, x: Array) -> Array:
        return np.zeros(self.shape)

    def inner(self, x: Array, u: Array, v: Array) -> float:
        """tr(uᵀv) (embedded) or tr(uᵀv) − ½ tr((Wᵀu)ᵀ(Wᵀv)) (canonical)."""
        value = float(np.vdot(u, v))
        if self.metric == "canonical":
            value -= 0.5 * float(np.vdot(transpose(x) @ u, transpose(x) @ v))
        return value

    def norm(self, x: Array, u: Array) -> float:
        if self.metric == "embedded":
            return frobenius(u)
        return float(np.sqrt(max(self.inner(x, u, u), 0.0)))

    # -- projections and gradients -------------------------------------------------------------
    def proj(self, x: Array, z: Array) -> Array:
        """P_W(Z) = Z − W sym(WᵀZ), the orthogonal projection onto T_W St.

        It is orthogonal in both metrics: the normal space {WS : S = Sᵀ} is the same for both.
        """
        return z - x @ sym(transpose(x) @ z)

    proj_tangent = proj

    def egrad_to_rgrad(self, x: Array, egrad: Array) -> Array:
        """P_W(G) (embedded metric) or G − W Gᵀ W (canonical metric)."""
        if self.metric == "canonical":
            return egrad - x @ transpose(egrad) @ x
        return self.proj(x, egrad)

    # -- retractions and transport -------------------------------------------------------------
    def retract(self, x: Array, u: Array) -> Array:
        """R_W(ξ) by the retraction chosen at construction (see the class docstring)."""
        if self.retraction == "polar":
            return linalg.polar(x + u)
        if self.retraction == "polar_svd":
            return linalg.polar_svd(x + u)
        if self.retraction == "qr":
            return linalg.qr_signfixed(x + u)[0]
        return self.exp(x, u)

    def exp(self, x: Array, u: Array) -> Array:
        """Geodesic of the embedded metric at t = 1 (Edelman, Arias & Smith 1998, eq. 2.45):

        Exp_W(ξ) = [W, ξ] expm([[A, −S], [I, A]]) [I; 0] expm(−A),  A = Wᵀξ, S = ξᵀξ.
        """
        a, s = transpose(x) @ u, transpose(u) @ u
        eye = np.eye(self.r)
        block = np.block([[a, -s], [eye, a]])
        return np.hstack([x, u]) @ linalg.expm(block)[:, : self.r] @ linalg.expm(-a)

    def canonical_exp(self, x: Array, u: Array) -> Array:
        """Geodesic of the canonical metric at t = 1 (Edelman, Arias & Smith 1998, eq. 2.42):

        Exp_W(ξ) = [W, Q] expm([[A, −Rᵀ], [R, 0]]) [I_r; 0],  A = Wᵀξ,  QR = (I − WWᵀ)ξ,

        with Q (d×q, q = min(r, d − r)) orthonormal and orthogonal to W. Q is taken from the QR
        of [W, (I − WWᵀ)ξ] (its last q columns) and R = Qᵀ(I − WWᵀ)ξ, so that Q stays
        orthogonal to W when (I − WWᵀ)ξ is rank deficient (always when d < 2r), where the QR of
        (I − WWᵀ)ξ alone would return columns that are not. Cost O(dr² + r³).
        """
        a = transpose(x) @ u
        k = u - x @ a
        q = min(self.r, self.d - self.r)
        basis = np.linalg.qr(np.hstack([x, k]))[0][:, self.r : self.r + q]
        rr = transpose(basis) @ k
        block = np.block([[a, -transpose(rr)], [rr, np.zeros((q, q))]])
        return np.hstack([x, basis]) @ linalg.expm(block)[:, : self.r]

    def geodesic(self, x: Array, u: Array) -> Array:
        """The geodesic of the chosen metric at t = 1: ``exp`` (embedded) or ``canonical_exp``
        (canonical); the curve t ↦ geodesic(W, tξ) is the one ``retraction_order`` refers to."""
        return self.exp(x, u) if self.metric == "embedded" else self.canonical_exp(x, u)

    def transport(self, x: Array, y: Array, u: Array) -> Array:
        """Vector transport by projection: P_Y(ξ)."""
        return self.proj(y, u)

    def project_point(self, a: Array) -> Array:
        """The nearest point of St(d, r) to a full-rank A in Frobenius norm: polar(A)."""
        return linalg.polar(a)

    # -- matrices and validation ---------------------------------------------------------------
    def to_matrix(self, x: Array) -> Array:
        return x

    def tangent_to_matrix(self, x: Array, u: Array) -> Array:
        return u

    def egrad_from_matrix(self, x: Array, g: Array) -> Array:
        """The point is its own matrix, so the Euclidean gradient is G itself."""
        return g

    def residual(self, x: Array) -> float:
        """‖WᵀW − I_r‖, the distance of the Gram from the identity."""
        return linalg.orthonormality_residual(x)

    def check_point(self, x: Array, atol: float | None = None) -> None:
        """Raise ValueError unless x has shape (d, r), is finite and ‖xᵀx − I‖ ≤ atol
        (default ``DEFAULT_ATOL`` = √ε)."""
        atol = DEFAULT_ATOL if atol is None else atol  # read at call time
        check_shapes("Stiefel point", [self.shape], x)
        check_finite("Stiefel point", x)
        res = self.residual(x)
        if res > atol:
            raise ValueError(
                f"point is off St({self.d}, {self.r}): ‖WᵀW − I‖ = {res:.3e} > {atol:.1e}"
            )

    def check_tangent(self, x: Array, u: Array, atol: float | None = None) -> None:
        """Raise ValueError unless ‖Wᵀξ + ξᵀW‖ ≤ atol·max(1, ‖ξ‖) (default atol √ε)."""
        atol = DEFAULT_ATOL if atol is None else atol  # read at call time
        check_shapes("Stiefel tangent", [self.shape], u)
        check_finite("Stiefel tangent", u)
        res = frobenius(2.0 * sym(transpose(x) @ u))
        if res > atol * max(1.0, frobenius(u)):
            raise ValueError(f"vector is not tangent at W: ‖Wᵀξ + ξᵀW‖ = {res:.3e}")
