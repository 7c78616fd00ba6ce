"""The QK and VO products of ``torch_port.nn.RiemannianMultiheadAttention``: the geometries a
product may take, the checks of the module's sizes against them, the draws that initialise a
product's factors, and those factors read back as a point of the product's geometry.

``AttentionProducts`` holds the methods (a mixin of ``RiemannianMultiheadAttention``); the
layout of the factors is described in ``torch_port.nn``'s docstring.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from torch_port import linalg
from torch_port.geometries import GEOMETRIES, PLAIN
from torch_port.linalg import Tensor
from torch_port.optim.groups import tag_frame

#: The five base geometries of DESIGN §4.1–4.3 (each also as ``"block_" + name``).
BASE_GEOMETRIES = tuple(PLAIN)

#: Geometries a product of ``RiemannianMultiheadAttention`` may take (None: plain projections).
ATTENTION_GEOMETRIES = (
    "stiefel",
    *BASE_GEOMETRIES,
    *(f"block_{name}" for name in BASE_GEOMETRIES),
)

#: Local parameter names of each product's factors, by factor kind.
_FACTOR_NAMES = {
    "qk": {"row": "w_q", "col": "w_k", "core": "s_qk"},
    "vo": {"row": "w_o", "col": "w_v", "core": "s_vo"},
}


def _stiefel_init(
    shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype, device: Any
) -> Tensor:
    """Frames of shape (..., d, r): Q of the sign-fixed QR of a float64 Gaussian, cast."""
    z = torch.randn(shape, generator=generator, dtype=torch.float64)
    return linalg.qr_signfixed(z)[0].to(dtype=dtype, device=device).contiguous()


def _plain_init(
    shape: tuple[int, ...],
    bound: float,
    generator: torch.Generator | None,
    dtype: torch.dtype,
    device: Any,
) -> Tensor:
    """Uniform in ±bound, drawn in float64 and cast."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return ((2.0 * u - 1.0) * bound).to(dtype=dtype, device=device)


def _resolve_geometry(what: str, name: str | None, block: bool) -> str | None:
    """The effective geometry of one product: None, "stiefel", a base name, or
    "block_" + base (a base name with ``block=True``); raises ValueError for other names."""
    if name is None or name == "stiefel":
        return name
    if name not in ATTENTION_GEOMETRIES:
        raise ValueError(
            f"unknown {what} {name!r}; choose one of {ATTENTION_GEOMETRIES} or None (plain "
            "projections); a base name with block=True selects its block_ variant"
        )
    return f"block_{name}" if block and not name.startswith("block_") else name


def geometry_of_product(
    name: str, d_model: int, head_dim: int, n_heads: int, n_kv_heads: int
) -> Any:
    """``GEOMETRIES[name](d_model, d_model, head_dim)``, with the GQA pattern (n_heads,
    n_kv_heads) for a block variant: the geometry of one product of the attention module."""
    if name.startswith("block_"):
        return GEOMETRIES[name](d_model, d_model, head_dim, n_heads=n_heads, n_kv_heads=n_kv_heads)
    return GEOMETRIES[name](d_model, d_model, head_dim)


class AttentionProducts:
    """Construction and points of the products of ``RiemannianMultiheadAttention`` (a mixin of
    ``nn.Module``)."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    group_size: int
    block: bool
    plain_init: str
    qk_geometry: str | None
    vo_geometry: str | None
    frame_geometries: dict[str, str]
    point_groups: dict[str, dict[str, Any]]

    # -- construction -------------------------------------------------------------------------
    @staticmethod
    def _check_sizes(
        d_model: int, n_heads: int, n_kv_heads: int | None, head_dim: int | None
    ) -> tuple[int, int]:
        """Validate the sizes; returns (n_kv_heads, head_dim) with their defaults filled in."""
        for name, v in (("d_model", d_model), ("n_heads", n_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1:
            raise ValueError(f"n_kv_heads must be a positive integer, got {n_kv_heads!r}")
        if n_heads % n_kv_heads:
            raise ValueError(
                f"n_kv_heads must divide n_heads (GQA groups of equal size), got "
                f"n_heads={n_heads}, n_kv_heads={n_kv_heads}"
            )
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(
                    f"d_model={d_model} is not divisible by n_heads={n_heads}; pass head_dim"
                )
            head_dim = d_model // n_heads
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"head_dim must be a positive integer, got {head_dim!r}")
        return n_kv_heads, head_dim

    @staticmethod
    def _check_geometry(
        what: str, geo: str | None, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int
    ) -> None:
        """A product's geometry needs head_dim ≤ d_model (rank ≤ size); a plain variant of a
        base geometry needs one key/value head per query head (a one-to-one pattern)."""
        if geo is None:
            return
        if head_dim > d_model:
            raise ValueError(
                f"{what}={geo!r} needs head_dim ≤ d_model (a rank-head_dim point of d_model×"
                f"d_model matrices, or a frame with at most d_model orthonormal columns), got "
                f"head_dim={head_dim} > d_model={d_model}"
            )
        if geo in BASE_GEOMETRIES and n_kv_heads != n_heads:
            raise ValueError(
                f"{what}={geo!r} (plain variant) treats each head as its own point and needs "
                f"one key/value head per query head, got n_heads={n_heads}, "
                f"n_kv_heads={n_kv_heads}; use block=True (or {what}='block_{geo}') for "
                "GQA/MQA"
            )

    def _product(self, product: str, geometry: str | None, init: tuple) -> dict[str, nn.Parameter]:
        """The parameters of one product ("qk" or "vo") by local name, initialised on its
        geometry; records the product's frames (``frame_geometries``) or point
        (``point_groups``)."""
        if geometry is None or geometry == "stiefel":
            return self._register_frames(self._frames(product, geometry, init), geometry)
        return self._point(product, geometry, init)

    def _frames(self, product: str, geometry: str | None, init: tuple) -> dict[str, nn.Parameter]:
        """Stiefel frames (sign-fixed QR of a float64 Gaussian) or plain projections (uniform in
        ±``_plain_bound``), drawn in the order w_q,
        w_k, w_v, w_o; a "stiefel" row factor is stacked per GQA group with ``block=True``."""
        names = _FACTOR_NAMES[product]
        h, g, p, d, k = self.n_heads, self.n_kv_heads, self.group_size, self.d_model, self.head_dim
        stacked = geometry == "stiefel" and self.block and p > 1
        row_shape = (g, p * d, k) if stacked else (h, d, k)
        out = {}
        for kind in ("row", "col") if product == "qk" else ("col", "row"):
            shape = row_shape if kind == "row" else (g, d, k)
            if geometry is None:
                data = _plain_init(shape, self._plain_bound(product, kind), *init)
            else:
                data = _stiefel_init(shape, *init)
            out[names[kind]] = nn.Parameter(data)
        return out

    def _plain_bound(self, product: str, kind: str) -> float:
        """The bound of a plain projection's uniform draw. ``plain_init="multihead"``:
        ``nn.MultiheadAttention``'s, its fused in-projection (q, k, v: (h + 2g)·k × d)
        Xavier-uniform, bound sqrt(6 / (d + (h + 2g)·k)), its out-projection ``nn.Linear``'s
        default, bound 1/sqrt(h·k). ``"linear"``: 1/sqrt(fan-in) for all four (fan-in d, or
        h·k for W_O), as separate ``nn.Linear`` layers."""
        h, g, d, k = self.n_heads, self.n_kv_heads, self.d_model, self.head_dim
        if (product, kind) == ("vo", "row"):
            return 1.0 / math.sqrt(h * k)
        if self.plain_init == "linear":
            return 1.0 / math.sqrt(d)
        return math.sqrt(6.0 / (d + (h + 2 * g) * k))

    def _point(self, product: str, geometry: str, init: tuple) -> dict[str, nn.Parameter]:
        """One point of ``geometry`` by its ``random_point`` (float64, then cast): batch
        (n_heads,) for a plain variant, the per-head layout (``to_heads``) for a block variant;
        recorded in ``point_groups`` with its factors' local names in factor order."""
        generator, dtype, device = init
        names = _FACTOR_NAMES[product]
        h, g = self.n_heads, self.n_kv_heads
        geo = geometry_of_product(geometry, self.d_model, self.head_dim, h, g)
        block = geometry.startswith("block_")
        x = geo.random_point(generator, () if block else (h,), dtype=torch.float64)
        if block:
            x = geo.to_heads(x)
        kinds = geo.base.point_kinds if block else geo.point_kinds
        out = {
            names[kind]: nn.Parameter(t.to(dtype=dtype, device=device, copy=True).contiguous())
            for kind, t in zip(kinds, x, strict=True)
        }
        spec: dict[str, Any] = {"geometry": geometry, "params": [names[c] for c in kinds]}
        if block:
            spec.update(n_heads=h, n_kv_heads=g)
        self.point_groups[product] = spec
        return out

    def _register_frames(self, out: dict[str, nn.Parameter], geometry: str | None) -> dict:
        """Tag the parameters of a "stiefel" product as frames and list them in
        ``frame_geometries``; plain parameters are returned untouched."""
        if geometry == "stiefel":
            for name, param in out.items():
                tag_frame(param, geometry)
                self.frame_geometries[name] = geometry
        return out

    # -- points --------------------------------------------------------------------------------
    def _point_spec(self, product: str) -> dict[str, Any]:
        if product not in self.point_groups:
            raise ValueError(
                f"no point for product {product!r}: this module's points are "
                f"{sorted(self.point_groups)} (qk_geometry={self.qk_geometry!r}, "
                f"vo_geometry={self.vo_geometry!r}; 'stiefel' and None have no point)"
            )
        return self.point_groups[product]

    def point_geometry(self, product: str) -> Any:
        """The torch geometry of the point of ``product`` ("qk" or "vo"):
        ``GEOMETRIES[name](d_model, d_model, head_dim)`` (block: with n_heads, n_kv_heads)."""
        name = self._point_spec(product)["geometry"]
        return geometry_of_product(name, self.d_model, self.head_dim, self.n_heads, self.n_kv_heads)

    def point(self, product: str) -> tuple[Tensor, ...]:
        """The (detached) point of ``product`` in the geometry's layout: the stored factors in
        factor order, batch (n_heads,) for a plain variant, stacked per group
        (``from_heads``) for a block variant."""
        spec = self._point_spec(product)
        x = tuple(getattr(self, n).detach() for n in spec["params"])
        if spec["geometry"].startswith("block_"):
            return self.point_geometry(product).from_heads(x)
        return x

    def check_points(self, atol: float | None = None) -> None:
        """``check_point`` of every point (ValueError with the measured residual when one is
        off its manifold; atol as the geometry's, default sqrt(ε) of the dtype)."""
        for product in self.point_groups:
            self.point_geometry(product).check_point(self.point(product), atol=atol)
