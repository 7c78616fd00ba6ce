"""The points of the QK and VO products made from a model's weights (``torch_port.convert``):
the nearest point of each geometry (module docstring of ``torch_port.convert``), the change of
the products, and the biases carried over.

This module imports torch and ``torch_port`` only (DESIGN §2).
"""

from __future__ import annotations

from typing import Any

import torch

from torch_port import linalg
from torch_port.attention_products import geometry_of_product
from torch_port.convert.structures import Attention
from torch_port.stiefel import Stiefel

Tensor = torch.Tensor
WIDE = torch.float64


def rank_tolerance(k: int) -> float:
    """k·ε of float64: a product of k directions whose σ_min/σ_max is at most this has fewer
    than k that are not rounding (``factor_svd`` refuses it)."""
    return k * torch.finfo(WIDE).eps


def factor_svd(label: str, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(U, s, V) with A Bᵀ = U diag(s) Vᵀ, from the thin QR of A and B and the SVD of the k×k
    core R_A R_Bᵀ; refuses a product of rank < k (σ_min/σ_max ≤ ``rank_tolerance(k)``)."""
    qa, ra = torch.linalg.qr(a)
    qb, rb = torch.linalg.qr(b)
    u, s, vh = torch.linalg.svd(ra @ rb.mT)
    ratio = s[..., -1] / s[..., 0]
    k = a.shape[-1]
    if bool((~(ratio > rank_tolerance(k))).any()):
        raise ValueError(
            f"{label}: a product W_Q W_Kᵀ (or its block) has rank below {k}: σ_min/σ_max = "
            f"{float(ratio.min()):.3e}; it is no point of a rank-{k} geometry (use init='random')"
        )
    return qa @ u, s, qb @ vh.mT


def nearest(label: str, base: Any, a: Tensor, b: Tensor) -> tuple[Tensor, ...]:
    """The point of a base geometry nearest to the product A Bᵀ (module docstring)."""
    u, s, v = factor_svd(label, a, b)
    if base.name == "fixed_rank_embedded":
        return u, torch.diag_embed(s), v
    if base.name == "fixed_rank_quotient":
        return a, b
    return u, v


def frames(t: Tensor, init: str, generator: torch.Generator | None) -> Tensor:
    """Stiefel frames of t's shape: polar(t), the nearest in Frobenius norm, or (``"random"``)
    the sign-fixed QR factor of a float64 Gaussian."""
    if init == "random":
        z = torch.randn(t.shape, generator=generator, dtype=WIDE)
        return linalg.qr_signfixed(z)[0].to(t.device)
    return linalg.polar(t)


def check_cast(label: str, geo: Any, x: tuple[Tensor, ...], dtype: torch.dtype) -> None:
    """The geometry's ``check_point`` of x cast to ``dtype``, its message prefixed by label."""
    try:
        geo.check_point(x[0].to(dtype) if len(x) == 1 else tuple(t.to(dtype) for t in x))
    except ValueError as e:
        raise ValueError(f"{label}: {e}") from None


def product_point(
    label: str,
    geometry: str,
    block: bool,
    att: Attention,
    a: Tensor,
    b: Tensor,
    init: str,
    generator: torch.Generator | None,
    dtype: torch.dtype,
) -> tuple[dict[str, Tensor], tuple[str, ...], Tensor, Tensor]:
    """The point of one product from its float64 per-head factors A (h, d, k), B (g, d, k):
    (stored factors by kind, the kinds in factor order, new A (h, d, k), new B (g, d, k)).
    The point cast to ``dtype`` is checked on its manifold (the optimizer's own check)."""
    h, g, d, k = att.n_heads, att.n_kv_heads, att.d, att.head_dim
    if geometry == "stiefel":
        try:
            row = frames(a.reshape(g, (h // g) * d, k) if block else a, init, generator)
            col = frames(b, init, generator)
        except ValueError as e:
            raise ValueError(
                f"{label}: a head's weight has no nearest frame ({e}); use init='random'"
            ) from None
        for f in (row, col):
            check_cast(label, Stiefel(f.shape[-2], k), (f,), dtype)
        return {"row": row, "col": col}, ("row", "col"), row.reshape(h, d, k), col
    geo = geometry_of_product(geometry, d, k, h, g)
    stacked = geometry.startswith("block_")
    base = geo.base if stacked else geo
    if init == "random":
        x = geo.random_point(generator, () if stacked else (h,), dtype=WIDE)
        x = tuple(t.to(a.device) for t in x)
    else:
        x = nearest(label, base, *(geo.from_heads((a, b), ("row", "col")) if stacked else (a, b)))
    check_cast(label, geo, x, dtype)
    a_new, b_new = geo.head_factors(x) if stacked else base.pair(x)
    kinds = base.point_kinds
    stored = geo.to_heads(x) if stacked else x
    return dict(zip(kinds, stored, strict=True)), kinds, a_new, b_new


def per_query(t: Tensor, p: int) -> Tensor:
    """Key/value-head tensors (g, ...) repeated to the query heads (h, ...)."""
    return t.repeat_interleave(p, dim=0) if p > 1 else t


def spectral_product(a: Tensor, b: Tensor) -> Tensor:
    """‖A Bᵀ‖₂ per head from the thin factors: ‖R_A R_Bᵀ‖₂ for A = Q_A R_A, B = Q_B R_B."""
    return torch.linalg.matrix_norm(torch.linalg.qr(a)[1] @ torch.linalg.qr(b)[1].mT, ord=2)


def change(a: Tensor, b: Tensor, a_new: Tensor, b_new: Tensor) -> float:
    """max_h ‖A'_h B'_hᵀ − A_h B_hᵀ‖₂ / ‖A_h B_hᵀ‖₂, all per query head."""
    diff = spectral_product(torch.cat([a_new, -a], dim=-1), torch.cat([b_new, b], dim=-1))
    return float((diff / spectral_product(a, b)).max())


def map_bias(b: Tensor, old: Tensor, new: Tensor) -> Tensor:
    """b' = new⁺ (old b) per head: the bias's contribution old·b, kept (least squares)."""
    return (torch.linalg.pinv(new) @ (old @ b[..., None]))[..., 0]
