"""Small dense linear algebra shared by the geometries.

Everything here acts on the last two axes, so a stack of matrices is handled like one matrix.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

Array = np.ndarray

#: Above this condition number ``polar`` switches from the Gram route to the SVD.
POLAR_GRAM_MAX_COND = 10.0


def transpose(a: Array) -> Array:
    """Aᵀ over the last two axes."""
    return np.swapaxes(a, -1, -2)


def sym(a: Array) -> Array:
    """sym(A) = (A + Aᵀ)/2."""
    return 0.5 * (a + transpose(a))


def skew(a: Array) -> Array:
    """skew(A) = (A − Aᵀ)/2."""
    return 0.5 * (a - transpose(a))


def frobenius(a: Array) -> float:
    """‖A‖ = sqrt(tr(AᵀA)), computed as s·‖A/s‖ with s = max|A_ij|.

    The scaling keeps every squared entry in [0, 1], so no finite float64 input overflows or
    underflows (a plain sqrt(Σ A_ij²) overflows for entries near 1e155 and flushes near 1e-162).
    """
    return _scaled_root(a, np.sum)


def rms(a: Array) -> float:
    """RMS(A) = sqrt(mean A_ij²), as s·sqrt(mean (A_ij/s)²) with s = max|A_ij|: no finite
    float64 input overflows (unlike ‖A‖/sqrt(n), whose ‖A‖ can exceed the largest float)."""
    return _scaled_root(a, np.mean)


def _scaled_root(a: Array, reduce) -> float:
    """s·sqrt(reduce((A/s)²)), s = max|A_ij| (s itself for a zero or non-finite A)."""
    a = np.ravel(a)
    s = float(np.max(np.abs(a))) if a.size else 0.0
    if s == 0.0 or not np.isfinite(s):
        return s
    return s * float(np.sqrt(reduce(np.square(a / s))))


def orthonormality_residual(a: Array) -> float:
    """‖AᵀA − I_r‖ (Frobenius): how far the columns of A are from orthonormal."""
    return frobenius(transpose(a) @ a - np.eye(a.shape[-1]))


def polar(a: Array) -> Array:
    """Orthonormal polar factor of a full-column-rank A: A (AᵀA)^{-1/2}.

    The Gram AᵀA is the one actually formed, so rounding drift in A is corrected: the result is
    the nearest matrix with orthonormal columns, not a closed form that assumes structure of A.
    Only an r×r eigendecomposition is needed. A is first divided by its largest entry
    (polar(sA) = polar(A) for s > 0), so the Gram neither overflows nor underflows. The rounding
    error grows like κ(A)²·u, so for κ(A) > ``POLAR_GRAM_MAX_COND`` the thin SVD is used instead
    (a retraction step has κ(W + ξ) ≤ sqrt(1 + ‖ξ‖₂²) and always takes the Gram route). Raises
    ValueError when A is rank deficient. Stacks of matrices are handled slice by slice.
    """
    scale = np.max(np.abs(a), axis=(-2, -1), keepdims=True)
    if not np.all(np.isfinite(scale)):
        raise ValueError("polar factor of a matrix with non-finite entries")
    if np.any(scale == 0.0):
        raise ValueError("polar factor of a rank-deficient matrix: the matrix is zero")
    a = a / scale
    lam, q = np.linalg.eigh(sym(transpose(a) @ a))
    lo, hi = lam[..., 0], lam[..., -1]  # eigh sorts ascending
    # A column-rank test relative to the largest eigenvalue: κ(A)² must stay below 1/ε.
    deficient = lo <= np.finfo(np.float64).eps * hi * a.shape[-2]
    if np.any(deficient):
        raise ValueError(
            "polar factor of a rank-deficient matrix: smallest squared singular value "
            f"{float(np.min(lo / hi)):.3e} relative to the largest"
        )
    if np.any(hi > POLAR_GRAM_MAX_COND**2 * lo):
        return polar_svd(a)
    return a @ ((q / np.sqrt(lam)[..., None, :]) @ transpose(q))


def polar_svd(a: Array) -> Array:
    """Orthonormal polar factor through the thin SVD A = U Σ Vᵀ: U Vᵀ."""
    u, _, vt = np.linalg.svd(a, full_matrices=False)
    return u @ vt


def qr_signfixed(a: Array) -> tuple[Array, Array]:
    """Thin QR with diag(R) ≥ 0, so the factorisation of a full-rank A is unique."""
    q, r = np.linalg.qr(a)
    signs = np.where(np.diagonal(r, axis1=-2, axis2=-1) < 0.0, -1.0, 1.0)
    return q * signs[..., None, :], r * signs[..., :, None]


def expm(a: Array) -> Array:
    """Matrix exponential (SciPy's scaling and squaring with Padé approximants)."""
    return scipy.linalg.expm(a)


def haar_orthogonal(d: int, rng: np.random.Generator) -> Array:
    """A Haar-distributed Q ∈ O(d): the sign-fixed QR factor of a Gaussian matrix."""
    q, _ = qr_signfixed(rng.standard_normal((d, d)))
    return q
