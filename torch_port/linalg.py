"""Small dense linear algebra for the torch port, mirroring ``reference/linalg.py``.

Everything acts on the last two axes, so a tensor of shape (..., m, n) is a batch of matrices and
every per-matrix quantity (a norm, a residual, a scale) is a tensor of shape (...,). Nothing here
imports ``reference``: the two sides are compared from outside (``tests/test_torch_port.py``).

Precision. ``polar`` of a float32, bfloat16 or float16 matrix forms its r×r Gram and the
inverse square root of that Gram in float64 (``compute_dtype``), then casts back; the d×r products
stay in the working dtype. The optimizer's retraction of frames passes ``polar_plan`` a Gram
formed in the frames' own dtype instead (``working_gram``): its error is the step's drift, and
does not add up over steps (see ``docs/torch_port.md`` for the bound and the measured drift).
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Sequence

import torch

from torch_port import deferred

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
    """sym(A) = (A + Aᵀ)/2 (the halving in place: one new tensor)."""
    return torch.add(a, transpose(a)).mul_(0.5)


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


#: Below these norms (float64, float32) an unscaled sum of squares may have lost entries to
#: underflow (entries below sqrt(smallest normal)); ``frobenius_fast`` then recomputes scaled.
_TINY_NORM = {torch.float64: 1e-140, torch.float32: 1e-11}


def _norm_dtype(a: Tensor) -> Tensor:
    """float64 and float32 stay; bfloat16 and float16 are upcast to float32 for reductions."""
    return a if a.dtype in (torch.float64, torch.float32) else a.float()


def _needs_scaling(n: Tensor) -> Tensor:
    """Per-matrix flag: an unscaled norm n is not trustworthy (zero, below the underflow
    threshold, inf or NaN)."""
    return ~((n >= _TINY_NORM[n.dtype]) & (n < math.inf))


def binary_exponent(a: Tensor) -> Tensor:
    """The exponent e of a = f·2^e with f ∈ [½, 1) (``torch.frexp``'s) for positive finite
    entries, 0 elsewhere, as a tensor of a's dtype: ⌊log2 a⌋ + 1, corrected by one where log2
    rounded across a power of two (so exact for every float, subnormals included).
    ``torch.frexp`` itself is not compiled by ``torch.compile`` for float64 on the CPU."""
    usable = (a > 0) & torch.isfinite(a)
    d = torch.where(usable, a, torch.ones_like(a))
    one = torch.ones_like(d)
    e = torch.floor(torch.log2(d)) + 1
    e = e - (torch.ldexp(one, e - 1) > d).to(d.dtype)
    e = e + (torch.ldexp(one, e) <= d).to(d.dtype)
    return torch.where(usable, e, torch.zeros_like(e))


def norm_of_parts(parts: Sequence[Tensor]) -> Tensor:
    """‖(P_1, …, P_k)‖ = sqrt(Σ_i ‖P_i‖²) per batch element, for tensors (..., a_i, b_i) with a
    common batch shape: the Frobenius norm of all parts together, free of overflow and
    underflow like ``frobenius`` but fast.

    Fast path: one fused reduction per part (``torch.linalg.vector_norm``, no temporary).
    Where the result is zero, below the underflow threshold, inf or NaN, it is recomputed as
    s·‖P/s‖ with s the largest entry over the parts (reference ``linalg.frobenius``); deciding
    that costs one host synchronisation, deferred while a step speculates (``deferred``). In
    the capturable step the norms of float32 and half-precision parts are accumulated in
    float64, whose range holds their squares, so no route is chosen.
    Returns float64 for float64 parts, float32 otherwise.
    """
    if deferred.on_device() and all(p.dtype != torch.float64 for p in parts):
        # accumulated in float64, whose range holds every square of a float32 entry: no
        # route to choose (the capturable step)
        each = [torch.linalg.vector_norm(p, dim=(-2, -1), dtype=torch.float64) for p in parts]
        n64 = each[0] if len(each) == 1 else torch.linalg.vector_norm(torch.stack(each), dim=0)
        return n64.to(torch.float32)
    parts = [_norm_dtype(p) for p in parts]
    if len(parts) == 1:
        n = torch.linalg.vector_norm(parts[0], dim=(-2, -1))
    else:
        each = torch.stack([torch.linalg.vector_norm(p, dim=(-2, -1)) for p in parts])
        n = torch.linalg.vector_norm(each, dim=0)
    bad = _needs_scaling(n)
    if deferred.fast(~bad.any()):
        return n
    s = torch.stack([max_abs(p) for p in parts]).amax(dim=0)
    safe = torch.where((s == 0) | ~torch.isfinite(s), torch.ones_like(s), s)[..., None, None]
    each = torch.stack([_scaled_sqrt_sum(p / safe, torch.ones_like(s), (-2, -1)) for p in parts])
    scaled = s * torch.linalg.vector_norm(each, dim=0)
    scaled = torch.where((s == 0) | ~torch.isfinite(s), s, scaled)
    return torch.where(bad, scaled, n)


def frobenius_fast(a: Tensor) -> Tensor:
    """``frobenius`` computed by ``norm_of_parts`` (a fused reduction, scaled only where it
    must be); within a few ulps of ``frobenius``."""
    return norm_of_parts([a])


def eye_like(a: Tensor, rows: int | None = None) -> Tensor:
    """I_n for a (..., m, n) tensor A, or the rows×n matrix [I; 0] (A's dtype and device)."""
    n = a.shape[-1]
    return torch.eye(n if rows is None else rows, n, dtype=a.dtype, device=a.device)


def orthonormality_residual(a: Tensor) -> Tensor:
    """‖AᵀA − I_r‖ (Frobenius) per matrix, measured in float64 whatever the dtype of A (a
    float32 frame is judged by the Gram of its stored entries, not by a float32 Gram)."""
    a64 = a.to(torch.float64)
    return frobenius(transpose(a64) @ a64 - eye_like(a64))


def gram64(a: Tensor, buffer: Tensor | None = None) -> Tensor:
    """AᵀA in float64 (low-precision A is upcast entry by entry first, into ``buffer`` when one
    of A's shape is given), one r×r per matrix."""
    if a.dtype == torch.float64:
        a_hi = a
    elif buffer is not None and buffer.shape == a.shape:
        a_hi = buffer.copy_(a)
    else:
        a_hi = a.to(torch.float64)
    return transpose(a_hi) @ a_hi


#: Above this Frobenius deviation ‖AᵀA/α − I‖ (α the mean eigenvalue) of some Gram of the
#: batch, ``polar`` takes the eigendecomposition route (δ ≤ 0.5 certifies κ(AᵀA) ≤ 3).
POLAR_ITERATIVE_MAX_DEVIATION = 0.5
#: Cost of one batched r×r ``eigh`` in units of one batched r×r product (measured on CPU for
#: r = 64: ~13); the polynomial route is taken when it needs fewer products.
EIGH_COST_IN_PRODUCTS = 12


def series_tolerance(dtype: torch.dtype) -> float:
    """How far the Taylor polynomial of (I + E)^{-1/2} may be from its limit (Frobenius) for
    an inverse square root that is cast to ``dtype``: 1e-17 for float64, ε/16 of a lower
    precision (7.5e-9 for float32), below the cast's own rounding of the entries near 1."""
    return 1e-17 if dtype == torch.float64 else torch.finfo(dtype).eps / 16


def _taylor_degree(delta: float, tol: float = 1e-17) -> int:
    """Degree k of the Taylor polynomial of (1 + e)^{-1/2} whose tail bound
    Σ_{j>k} |c_j| δ^j ≤ δ^{k+1}/(1 − δ) is below ``tol`` (|c_j| ≤ 1)."""
    k = 0
    while delta ** (k + 1) / (1.0 - delta) > tol:
        k += 1
    return k


def _paterson_stockmeyer_cost(k: int) -> tuple[int, int]:
    """(products, s) of evaluating a degree-k polynomial with the powers E … E^s and Horner's
    rule in E^s (Paterson & Stockmeyer 1973), as ``_inv_sqrt_taylor`` does: s − 1 powers, one
    product per block below the top one, less one when the top block is a constant (k ≡ 0
    mod s, added as c·E^s)."""
    if k <= 1:
        return 0, 1
    s = max(1, math.isqrt(k))
    s = s if s * s >= k else s + 1
    blocks = -(-(k + 1) // s)
    return (s - 1) + (blocks - 1) - (1 if k % s == 0 else 0), s


def _plus_identity(t: Tensor, c: float) -> Tensor:
    """t + c·I in place (on the diagonal of each matrix)."""
    torch.diagonal(t, dim1=-2, dim2=-1).add_(c)
    return t


def _inv_sqrt_taylor(e: Tensor, degree: int) -> Tensor:
    """(I + E)^{-1/2} = Σ_j binom(−1/2, j) E^j for small symmetric E, evaluated by
    Paterson–Stockmeyer (powers E … E^s, then Horner's rule in E^s), accumulating in place."""
    coef = [1.0]
    for j in range(1, degree + 1):
        coef.append(coef[-1] * (-0.5 - (j - 1)) / j)
    _, s = _paterson_stockmeyer_cost(degree)
    shape = e.shape
    e3 = e.reshape(-1, *shape[-2:])
    powers = [None, e3]
    for _ in range(2, s + 1):
        powers.append(torch.bmm(powers[-1], e3))

    def block(cs: list[float]) -> Tensor:
        if len(cs) == 1:
            return _plus_identity(torch.zeros_like(e3), cs[0])
        acc = powers[1] * cs[1]
        for i in range(2, len(cs)):
            acc.add_(powers[i], alpha=cs[i])
        return _plus_identity(acc, cs[0])

    chunks = [coef[i : i + s] for i in range(0, degree + 1, s)]
    top = chunks.pop()
    if len(top) == 1 and chunks:  # the top block is c·I, and c·I·E^s = c·E^s: no product
        out = block(chunks.pop()).add_(powers[s], alpha=top[0])
    else:
        out = block(top)
    for cs in reversed(chunks):
        out = block(cs).baddbmm_(out, powers[s])  # block + out·E^s
    return sym(out).reshape(shape)


def _series_degree(delta: float, tol: float) -> int | None:
    """The degree of the Taylor polynomial that ``polar_plan`` evaluates for (I + E)^{-1/2}
    with ‖E‖_F ≤ delta (``_taylor_degree``); None when ``eigh`` would be cheaper. (The coupled
    Newton–Schulz iteration, e ↦ (3e² + e³)/4 per step of three products, never needs fewer
    products than this polynomial for δ ≤ 0.5, so it is not offered.)"""
    if not delta <= POLAR_ITERATIVE_MAX_DEVIATION:
        return None
    degree = _taylor_degree(delta, tol)
    if _paterson_stockmeyer_cost(degree)[0] > EIGH_COST_IN_PRODUCTS:
        return None
    return degree


@functools.cache
def taylor_degree_interval(degree: int, tol: float) -> tuple[float, float]:
    """(lo, hi) with ``_taylor_degree(δ, tol) == degree`` exactly when lo < δ ≤ hi, for the
    floats δ in [0, 1) (lo = −inf for degree 0).

    The loop's test δ^{k+1}/(1 − δ) > tol is monotone in δ (pow, subtraction and division
    round monotonically), so hi is the largest float at which the test for k = degree fails,
    found by bisection on the floats' bit patterns (ordered as integers for δ ≥ 0)."""

    def fails(k: int, bits: int) -> bool:
        d = struct.unpack("<d", struct.pack("<q", bits))[0]
        return not d ** (k + 1) / (1.0 - d) > tol

    def largest_failing(k: int) -> float:
        lo, hi = 0, struct.unpack("<q", struct.pack("<d", math.nextafter(1.0, 0.0)))[0]
        while hi - lo > 1:  # fails at lo, holds at hi
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fails(k, mid) else (lo, mid)
        return struct.unpack("<d", struct.pack("<q", lo))[0]

    low = -math.inf if degree == 0 else largest_failing(degree - 1)
    return low, largest_failing(degree)


def polar(a: Tensor) -> Tensor:
    """Orthonormal polar factor A (AᵀA)^{-1/2} of each full-column-rank matrix of a batch.

    As ``reference.linalg.polar``: the Gram actually formed is used (so rounding drift in A is
    corrected, not assumed away), frames with κ(A) > ``POLAR_GRAM_MAX_COND`` go through the SVD
    instead, and a rank-deficient matrix raises ValueError. The Gram is formed in float64 (a
    low-precision A is upcast first) and its inverse square root is computed in float64; only
    the final d×r product A·(AᵀA)^{-1/2} is done in A's dtype.

    Speed (``docs/torch_port.md``): A is not divided by its largest entry first (polar(sA) =
    polar(A)); a float64 Gram cannot overflow or underflow for float32/bfloat16/float16
    entries, and for float64 A the rare matrices whose Gram overflows or underflows are redone
    scaled. The inverse square root of the normalised Gram X = AᵀA/α (α its mean eigenvalue)
    comes from a few batched r×r products when every X of the batch is near I (a retraction
    step: AᵀA = I + ξᵀξ): a Taylor polynomial of (I + E)^{-1/2} (Paterson–Stockmeyer) whose
    error bound on δ = max ‖X − I‖_F is below 1e-17; else (δ > 0.5, or more products than
    an ``eigh``)
    from ``eigh``, with the reference's rank and conditioning checks (δ ≤ 0.5 certifies
    κ(AᵀA) ≤ 3, so those checks cannot fail there). One host synchronisation for all checks.
    """
    inv_sqrt, full = polar_plan(a)
    return full if inv_sqrt is None else a @ inv_sqrt


def polar_plan(
    a: Tensor,
    buffer: Tensor | None = None,
    reduce: Callable[[Tensor], Tensor] | None = None,
    gram: Tensor | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """``polar`` in two parts: (H, None) with polar(A) = A @ H (H r×r in A's dtype), or
    (None, polar(A)) when the result had to be formed another way (SVD route, rescaling). All
    checks are done here, so an optimizer can form A @ H later, straight into the parameter.
    ``buffer``: a float64 tensor of A's shape for the upcast of a low-precision A (reused).
    ``reduce``: for A whose rows are spread over processes, the sum of the ranks' Grams (then
    only the Gram's routes are taken: a matrix that needs rescaling or the SVD is refused).
    ``gram``: AᵀA formed by the caller (float64, e.g. ``working_gram``), used on the Taylor
    route only and for tr(AᵀA) in (1e-30, 1e30), where a float32 product of A's entries
    neither underflows nor overflows; any other route forms the float64 Gram from A's entries
    again."""
    if a.ndim < 2:
        raise ValueError(f"polar factor needs a matrix (..., m, n), got shape {tuple(a.shape)}")
    given = gram is not None
    if gram is None:
        gram = gram64(a, buffer)
        if reduce is not None:
            gram = reduce(gram)
    r = a.shape[-1]
    trace = torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1)
    # float64 entries above ~1e150 overflow the Gram, below ~1e-150 they underflow in it (a
    # given Gram may have been formed in float32: ~1e±15)
    low, high = (1e-30, 1e30) if given else (1e-270, math.inf)
    off_scale = ~(torch.isfinite(trace) & (trace > low) & (trace < high))
    alpha = torch.where(off_scale, torch.ones_like(trace), trace / r)
    e = _plus_identity(gram / alpha[..., None, None], -1.0)  # X − I, X = AᵀA/α
    delta = frobenius_fast(e)
    delta = torch.where(off_scale, torch.full_like(delta, math.inf), delta)
    tol = series_tolerance(a.dtype)
    site = deferred.site("polar_degree")
    degree = deferred.hint(site)
    bound = deferred.series_bound()
    if bound is not None:
        # the capturable step: ‖E‖₂ ≤ bound by its trust radius, so this degree truncates
        # below tol; a frame off the scale or not finite (δ = inf or NaN) skips the step
        degree = _taylor_degree(bound, tol)
        deferred.holds(torch.isfinite(delta).all())
    elif degree is not None:  # the degree of the last step, if the careful code would take it
        # δ is inf where off the scale; NaN fails both tests; compared in float64, exactly
        lo, hi = taylor_degree_interval(degree, tol)
        worst = delta.max()
        worst = worst if worst.dtype == torch.float64 else worst.double()
        deferred.holds(worst <= hi if degree == 0 else (worst > lo) & (worst <= hi))
    else:
        worst, any_off = torch.stack([delta.max(), off_scale.any().to(delta.dtype)]).tolist()
        degree = None if any_off else _series_degree(worst, tol)
        deferred.remember(site, degree)
    if degree is not None:
        inv_sqrt = _inv_sqrt_taylor(e, degree)
        return (inv_sqrt / torch.sqrt(alpha)[..., None, None]).to(a.dtype), None
    if given:  # the other routes start from the float64 Gram of A's entries
        return polar_plan(a, buffer, reduce)
    if any_off:  # rare: redo the off-scale matrices as the reference does, divided by max|A|
        if reduce is not None:
            raise ValueError(
                "polar factor of a row-sharded matrix whose Gram is off the float64 scale "
                "(non-finite, zero or with entries beyond ~1e±150)"
            )
        return None, _polar_scaled(a, off_scale)
    return None, _polar_eigh(a, gram, sharded=reduce is not None)


def gram_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ``working_gram`` forms AᵀA in: float32 and float64 their own, float64 for the
    half-precision dtypes (whose unit roundoff would be the frames' drift)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float64


def working_gram(a: Tensor) -> Tensor:
    """AᵀA formed in ``gram_dtype(A.dtype)`` (no upcast copy of a float32 A), returned in
    float64, one r×r per matrix.

    Its error E is ≤ γ_d(u)·‖A‖_F² with u the unit roundoff of that dtype (Higham, *Accuracy
    and Stability of Numerical Algorithms*, §3.5), and it is the polar retraction's drift
    after a step, not a drift that adds up: Y = A(AᵀA + E)^{-1/2} = A H has
    YᵀY − I = −H E H exactly, whatever A's own drift (PORT-2, ``docs/torch_port.md``)."""
    if gram_dtype(a.dtype) == a.dtype:
        return (transpose(a) @ a).to(torch.float64)
    return gram64(a)


def polar_rank_floor(dtype: torch.dtype, rows: int) -> float:
    """ε·d: the polar factor refuses A (d rows) when λ_min(AᵀA) ≤ ε·d·λ_max, as the reference
    (ε of A's dtype; ε·d is exact, so ε·d·λ_max rounds once, as ε·λ_max·d did)."""
    return torch.finfo(dtype).eps * rows


def _polar_eigh(a: Tensor, gram: Tensor, sharded: bool = False) -> Tensor:
    """The polar factor from the eigendecomposition of the Gram (reference's route); the
    ill-conditioned matrices of the batch take the SVD route, which a row-sharded A cannot."""
    lam, q = torch.linalg.eigh(sym(gram))
    lo, hi = lam[..., 0], lam[..., -1]  # ascending
    deficient = ~(lo > polar_rank_floor(a.dtype, a.shape[-2]) * hi)  # NaN counts as deficient
    ill = hi > POLAR_GRAM_MAX_COND**2 * lo
    flags = torch.stack([deficient.any(), ill.any()]).tolist()
    if flags[0]:
        worst = float(torch.min(lo / hi))
        raise ValueError(
            "polar factor of a rank-deficient matrix: smallest squared singular value "
            f"{worst:.3e} relative to the largest"
        )
    inv_sqrt = (q / torch.sqrt(lam)[..., None, :]) @ transpose(q)
    out = a @ inv_sqrt.to(a.dtype)
    if flags[1] and sharded:
        raise ValueError(
            "polar factor of a row-sharded matrix with κ(AᵀA) above "
            f"{POLAR_GRAM_MAX_COND:g}², which needs the SVD of the whole matrix"
        )
    if flags[1]:  # only the ill-conditioned frames of the batch take the SVD route
        out = torch.where(ill[..., None, None], polar_svd(a), out)
    return out


def _polar_scaled(a: Tensor, off_scale: Tensor) -> Tensor:
    """The slow path: every matrix divided by its largest entry (reference's order), with the
    checks for non-finite and zero matrices."""
    scale = max_abs(a)[..., None, None]
    finite, nonzero = torch.isfinite(scale), scale != 0
    good = finite & nonzero
    flags = torch.stack([(~finite).any(), (~nonzero).any()]).tolist()
    if flags[0]:
        raise ValueError("polar factor of a matrix with non-finite entries")
    if flags[1]:
        raise ValueError("polar factor of a rank-deficient matrix: the matrix is zero")
    a = a / torch.where(good, scale, torch.ones_like(scale))
    return _polar_eigh(a, gram64(a))


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


def qr_native(a: Tensor, signfixed: bool = False) -> tuple[Tensor, Tensor]:
    """Thin QR in A's dtype when it is float32 or float64 (upcast to float32 otherwise: LAPACK
    has no half precision), optionally sign-fixed (diag(R) ≥ 0). For the m×r QRs of the
    retractions, whose Q only has to span the same space as A (the new factors are then passed
    through ``polar``): no float64 copy of an m×r float32 matrix."""
    work = a if a.dtype in (torch.float32, torch.float64) else a.float()
    q, r = torch.linalg.qr(work)
    if signfixed:
        signs = torch.where(torch.diagonal(r, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(r.dtype)
        q, r = q * signs[..., None, :], r * signs[..., :, None]
    return q, r


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
