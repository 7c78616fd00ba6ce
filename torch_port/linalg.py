"""Small dense linear algebra for the torch port, mirroring ``reference/linalg.py``.

Everything acts on the last two axes, so a tensor of shape (..., m, n) is a batch of matrices and
every per-matrix quantity (a norm, a residual, a scale) is a tensor of shape (...,). Nothing here
imports ``reference``: the two sides are compared from outside (``tests/test_torch_port.py``).

Precision. The polar factor of a float32, bfloat16 or float16 matrix forms its r×r Gram and the
inverse square root of that Gram in float64 (``compute_dtype``), then casts back; the d×r products
stay in the working dtype. This is what keeps float32 training on the manifold (see
``docs/torch_port.md`` for the measured drift).
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor

#: Above this condition number ``polar`` switches from the Gram route to the SVD (as reference).
POLAR_GRAM_MAX_COND = 10.0


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the small (r×r) computations for a working dtype: float64 for every real
    floating dtype (float64 stays float64; float32, bfloat16 and float16 are upcast)."""
    if not dtype.is_floating_point or dtype.is_complex:
        raise TypeError(f"expected a real floating dtype, got {dtype}")
    return torch.float64


def transpose(a: Tensor) -> Tensor:
    """Aᵀ over the last two axes."""
    return a.transpose(-1, -2)


def sym(a: Tensor) -> Tensor:
    """sym(A) = (A + Aᵀ)/2."""
    return 0.5 * (a + transpose(a))


def skew(a: Tensor) -> Tensor:
    """skew(A) = (A − Aᵀ)/2."""
    return 0.5 * (a - transpose(a))


def max_abs(a: Tensor, dims: tuple[int, ...] = (-2, -1)) -> Tensor:
    """max |A_ij| over ``dims`` (0 for an empty slice), one value per matrix."""
    if a.numel() == 0:
        shape = [s for i, s in enumerate(a.shape) if i - a.ndim not in dims and i not in dims]
        return a.new_zeros(shape)
    return a.abs().amax(dim=dims)


def _scaled_sqrt_sum(a: Tensor, s: Tensor, dims: tuple[int, ...]) -> Tensor:
    """sqrt(Σ (A_ij/s)²) per matrix, with s = 0 treated as 1 (the caller masks those)."""
    safe = torch.where(s == 0, torch.ones_like(s), s)
    for _ in dims:
        safe = safe.unsqueeze(-1)
    return torch.sqrt(torch.sum(torch.square(a / safe), dim=dims))


def frobenius(a: Tensor, dims: tuple[int, ...] = (-2, -1)) -> Tensor:
    """‖A‖ = s·sqrt(Σ (A_ij/s)²) with s = max|A_ij|, per matrix (no overflow or underflow for
    finite input; 0 for a zero matrix; s itself, inf or NaN, for non-finite input), as
    ``reference.linalg.frobenius``."""
    s = max_abs(a, dims)
    n = s * _scaled_sqrt_sum(a, s, dims)
    return torch.where((s == 0) | ~torch.isfinite(s), s, n)


def rms(a: Tensor, dims: tuple[int, ...] = (-2, -1)) -> Tensor:
    """RMS(A) = s·(sqrt(Σ (A_ij/s)²)/sqrt(entries)) per matrix: finite for every finite A.

    The division by sqrt(entries) comes before the multiplication by s, so a matrix whose
    entries all lie near the largest float does not overflow (``reference.linalg.rms`` takes the
    mean inside the square root instead; both are within an ulp of each other)."""
    s = max_abs(a, dims)
    k = 1
    for d in dims:
        k *= a.shape[d]
    n = s * (_scaled_sqrt_sum(a, s, dims) / math.sqrt(k))
    return torch.where((s == 0) | ~torch.isfinite(s), s, n)


def eye_like(a: Tensor, rows: int | None = None) -> Tensor:
    """I_n for a (..., m, n) tensor A, or the rows×n matrix [I; 0] (A's dtype and device)."""
    n = a.shape[-1]
    return torch.eye(n if rows is None else rows, n, dtype=a.dtype, device=a.device)


def orthonormality_residual(a: Tensor) -> Tensor:
    """‖AᵀA − I_r‖ (Frobenius) per matrix, measured in float64 whatever the dtype of A (a
    float32 frame is judged by the Gram of its stored entries, not by a float32 Gram)."""
    a64 = a.to(torch.float64)
    return frobenius(transpose(a64) @ a64 - eye_like(a64))


def polar(a: Tensor) -> Tensor:
    """Orthonormal polar factor A (AᵀA)^{-1/2} of each full-column-rank matrix of a batch.

    As ``reference.linalg.polar``: A is divided by its largest entry, the Gram actually formed
    is eigendecomposed (so rounding drift in A is corrected, not assumed away), frames with
    κ(A) > ``POLAR_GRAM_MAX_COND`` go through the SVD instead, and a rank-deficient matrix
    raises ValueError. For a low-precision A the Gram is formed from the stored entries in
    float64 and its inverse square root is computed in float64; only the final d×r product
    A·(AᵀA)^{-1/2} is done in A's dtype.
    """
    if a.ndim < 2:
        raise ValueError(f"polar factor needs a matrix (..., m, n), got shape {tuple(a.shape)}")
    wide = compute_dtype(a.dtype)
    scale = max_abs(a)[..., None, None]
    finite, nonzero = torch.isfinite(scale), scale != 0
    good = finite & nonzero
    # Bad matrices are replaced by [I; 0] before the eigendecomposition (which may refuse
    # non-finite input) and reported after it, with all checks in one synchronisation.
    a = torch.where(
        good, a / torch.where(good, scale, torch.ones_like(scale)), eye_like(a, a.shape[-2])
    )
    a_hi = a.to(wide)
    lam, q = torch.linalg.eigh(sym(transpose(a_hi) @ a_hi))
    lo, hi = lam[..., 0], lam[..., -1]  # ascending
    deficient = lo <= torch.finfo(a.dtype).eps * hi * a.shape[-2]
    ill = hi > POLAR_GRAM_MAX_COND**2 * lo
    flags = torch.stack(
        [(~finite).any(), (~nonzero).any(), deficient.any(), ill.any()]
    ).tolist()  # one host synchronisation for all checks
    if flags[0]:
        raise ValueError("polar factor of a matrix with non-finite entries")
    if flags[1]:
        raise ValueError("polar factor of a rank-deficient matrix: the matrix is zero")
    if flags[2]:
        worst = float(torch.min(lo / hi))
        raise ValueError(
            "polar factor of a rank-deficient matrix: smallest squared singular value "
            f"{worst:.3e} relative to the largest"
        )
    inv_sqrt = (q / torch.sqrt(lam)[..., None, :]) @ transpose(q)
    out = a @ inv_sqrt.to(a.dtype)
    if flags[3]:  # only the ill-conditioned frames of the batch take the SVD route
        out = torch.where(ill[..., None, None], polar_svd(a), out)
    return out


def polar_svd(a: Tensor) -> Tensor:
    """Orthonormal polar factor through the thin SVD A = U Σ Vᵀ: U Vᵀ (in float64 for a
    low-precision A, then cast back)."""
    wide = compute_dtype(a.dtype)
    u, _, vh = torch.linalg.svd(a.to(wide), full_matrices=False)
    return (u @ vh).to(a.dtype)


def qr_signfixed(a: Tensor) -> tuple[Tensor, Tensor]:
    """Thin QR with diag(R) ≥ 0, so the factorisation of a full-rank A is unique."""
    wide = compute_dtype(a.dtype)
    q, r = torch.linalg.qr(a.to(wide))
    signs = torch.where(torch.diagonal(r, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(wide)
    return (q * signs[..., None, :]).to(a.dtype), (r * signs[..., :, None]).to(a.dtype)


def expm(a: Tensor) -> Tensor:
    """Matrix exponential (torch's scaling and squaring), for a matrix or a batch.

    A batch of one matrix is padded with a zero matrix: with torch 2.14 the unbatched path was
    measured ~3e-11 away from scipy.linalg.expm in float64 for norms near 0.01, the batched path
    ≤ 1e-15 (torch 2.13 is accurate on both paths; the padding costs one extra r×r exponential)."""
    flat = a.reshape(-1, *a.shape[-2:])
    if flat.shape[0] == 1:
        padded = torch.cat([flat, torch.zeros_like(flat)])
        return torch.linalg.matrix_exp(padded)[:1].reshape(a.shape)
    return torch.linalg.matrix_exp(flat).reshape(a.shape)
