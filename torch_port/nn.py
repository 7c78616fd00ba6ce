"""Multi-head attention whose QK (and optionally VO) projections are frames (DESIGN §7, issue 4
item 3), and a helper that builds the optimizer for a whole model.

``RiemannianMultiheadAttention`` is batch first: inputs (B, T, d_model), output (B, T, d_model),
attention by ``torch.nn.functional.scaled_dot_product_attention``. Its projections are stored per
head, all in the layout (heads, d_model, head_dim):

==========  ===============================  ==============================================
parameter   shape                            use
==========  ===============================  ==============================================
``w_q``     (n_heads, d_model, head_dim)     q_h = x W_Q^h
``w_k``     (n_kv_heads, d_model, head_dim)  k_g = x W_K^g (shared by the heads of group g)
``w_v``     (n_kv_heads, d_model, head_dim)  v_g = x W_V^g
``w_o``     (n_heads, d_model, head_dim)     out = Σ_h o_h (W_O^h)ᵀ, i.e. W_O^hᵀ is stored
==========  ===============================  ==============================================

so that every stored d_model×head_dim matrix can be a frame on St(d_model, head_dim). Head h
uses key/value head g(h) = h // (n_heads // n_kv_heads) (GQA; MQA when n_kv_heads = 1).

Geometries. ``qk_geometry="stiefel"`` makes each W_Q^h and each W_K^g a frame (initialised on the
manifold: the sign-fixed QR factor of a Gaussian, drawn in float64); ``qk_geometry=None`` gives
plain projections (initialised as ``nn.Linear``: uniform in ±1/sqrt(fan-in)). ``vo_geometry``
does the same for W_V^g and W_O^hᵀ. A frame parameter is tagged ``param._rattn_geometry =
"stiefel"`` and the module also lists its frames in ``frame_geometries`` (the tag is lost by
``copy.deepcopy`` of a parameter; the module's list is not), so ``build_optimizer`` routes frames
to the Riemannian rule and everything else to AdamW.

Block variant (DESIGN §4.4). With ``block=True`` the query frames of one GQA group are stacked
into one frame on St(group_size·d_model, head_dim): ``w_q`` has shape (n_kv_heads,
group_size·d_model, head_dim) and Σ_i (W_Q^{g,i})ᵀ W_Q^{g,i} = I, while a single head's block is
not orthonormal; the group's key frame is shared as in the plain variant. Likewise ``w_o`` with
a VO geometry: the stacked W_O^hᵀ of a group form one frame and W_V^g is shared. Under MHA
(n_kv_heads = n_heads) a group is one head and the block variant equals the plain one. Block
needs a geometry on at least one product; only "stiefel" is available in this module (the
other geometries of DESIGN §4.5 come with the geometry modules).

This module imports torch and ``torch_port`` only (DESIGN §2).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from torch_port import linalg
from torch_port.optim import RiemannianAdam

Tensor = torch.Tensor

#: Geometries a projection of ``RiemannianMultiheadAttention`` may take (None: plain).
ATTENTION_GEOMETRIES = ("stiefel",)

#: The attribute that tags a parameter with its geometry (read by ``build_optimizer``).
GEOMETRY_ATTR = "_rattn_geometry"


def tag_frame(param: nn.Parameter, geometry: str = "stiefel") -> nn.Parameter:
    """Mark ``param`` as a (batch of) point(s) of ``geometry`` for ``build_optimizer``.

    The tag is an attribute of the parameter: ``torch.save``/``torch.load`` and ``module.to``
    keep it, ``copy.deepcopy`` does not (torch copies a parameter's data, not its attributes).
    A module that owns frames should also list them in a ``frame_geometries`` dict (local name
    -> geometry), as ``RiemannianMultiheadAttention`` does; that survives a deepcopy."""
    setattr(param, GEOMETRY_ATTR, geometry)
    return param


def frame_geometry(param: Tensor) -> str | None:
    """The geometry a parameter was tagged with by ``tag_frame`` (None for a plain one)."""
    return getattr(param, GEOMETRY_ATTR, None)


def _stiefel_init(
    shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype, device: Any
) -> Tensor:
    """Frames of shape (..., d, r): Q of the sign-fixed QR of a float64 Gaussian, cast."""
    z = torch.randn(shape, generator=generator, dtype=torch.float64)
    return linalg.qr_signfixed(z)[0].to(dtype=dtype, device=device)


def _plain_init(
    shape: tuple[int, ...],
    fan_in: int,
    generator: torch.Generator | None,
    dtype: torch.dtype,
    device: Any,
) -> Tensor:
    """Uniform in ±1/sqrt(fan_in), the scale of ``nn.Linear``'s default weights."""
    bound = 1.0 / math.sqrt(fan_in)
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return ((2.0 * u - 1.0) * bound).to(dtype=dtype, device=device)


class RiemannianMultiheadAttention(nn.Module):
    """Batch-first multi-head attention with QK (and optionally VO) projections on a geometry.

    Args:
        d_model: model (embedding) dimension.
        n_heads: number of query heads.
        n_kv_heads: number of key/value heads (default ``n_heads``); must divide ``n_heads``.
            Fewer than ``n_heads`` is GQA (1 is MQA): keys and values are repeated per group.
        head_dim: dimension per head (default d_model // n_heads, which must then divide
            exactly). With a Stiefel geometry, head_dim ≤ d_model.
        qk_geometry: "stiefel" (W_Q^h, W_K^g frames on St(d_model, head_dim)) or None (plain).
        vo_geometry: "stiefel" (W_V^g and W_O^hᵀ frames) or None (plain, the default).
        block: stack the query (and output) frames of each GQA group into one frame (module
            docstring); needs a geometry on QK or VO.
        bias: learnable biases on q and v (per head) and on the output (plain parameters).
            There is no key bias: it would add q·b to every logit of a row, which the softmax
            ignores, so its gradient is identically zero.
        dropout: attention dropout probability (training mode only).
        scale: the logit scale passed to ``scaled_dot_product_attention`` (default
            1/sqrt(head_dim)).
        generator, dtype, device: for the initialisation (default dtype: torch's default).

    ``forward(query, key=None, value=None, attn_mask=None, is_causal=False)`` maps (B, T,
    d_model) inputs to (B, T, d_model); key defaults to query and value to key; ``attn_mask``
    and ``is_causal`` are passed to ``scaled_dot_product_attention`` (a boolean mask marks the
    positions that may be attended).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        qk_geometry: str | None = "stiefel",
        vo_geometry: str | None = None,
        block: bool = False,
        bias: bool = False,
        dropout: float = 0.0,
        *,
        scale: float | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
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
        for name, geo in (("qk_geometry", qk_geometry), ("vo_geometry", vo_geometry)):
            if geo is not None and geo not in ATTENTION_GEOMETRIES:
                raise ValueError(
                    f"unknown {name} {geo!r}; choose one of {ATTENTION_GEOMETRIES} or None "
                    "(plain projections)"
                )
            if geo == "stiefel" and head_dim > d_model:
                raise ValueError(
                    f"{name}='stiefel' needs head_dim ≤ d_model (a frame on St(d_model, "
                    f"head_dim) has at most d_model orthonormal columns), got head_dim="
                    f"{head_dim} > d_model={d_model}"
                )
        if block and qk_geometry is None and vo_geometry is None:
            raise ValueError(
                "block=True stacks the frames of a GQA group into one frame; it needs "
                f"qk_geometry or vo_geometry in {ATTENTION_GEOMETRIES} (got both None)"
            )
        if not (isinstance(dropout, int | float) and 0.0 <= dropout < 1.0):
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")

        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim, self.group_size = head_dim, n_heads // n_kv_heads
        self.qk_geometry, self.vo_geometry = qk_geometry, vo_geometry
        self.block, self.dropout, self.scale = bool(block), float(dropout), scale
        #: Local parameter name -> geometry, for ``build_optimizer`` (survives deepcopy).
        self.frame_geometries: dict[str, str] = {}

        dtype = torch.get_default_dtype() if dtype is None else dtype
        h, g, p, d, k = n_heads, n_kv_heads, self.group_size, d_model, head_dim

        def make(name: str, shape: tuple[int, ...], geometry: str | None, fan_in: int) -> None:
            if geometry is None:
                data = _plain_init(shape, fan_in, generator, dtype, device)
            else:
                data = _stiefel_init(shape, generator, dtype, device)
            param = nn.Parameter(data)
            if geometry is not None:
                tag_frame(param, geometry)
                self.frame_geometries[name] = geometry
            self.register_parameter(name, param)

        stacked = self.block and p > 1
        make("w_q", (g, p * d, k) if stacked and qk_geometry else (h, d, k), qk_geometry, d)
        make("w_k", (g, d, k), qk_geometry, d)
        make("w_v", (g, d, k), vo_geometry, d)
        make("w_o", (g, p * d, k) if stacked and vo_geometry else (h, d, k), vo_geometry, h * k)
        if bias:
            self.b_q = nn.Parameter(torch.zeros(h, k, dtype=dtype, device=device))
            self.b_v = nn.Parameter(torch.zeros(g, k, dtype=dtype, device=device))
            self.b_o = nn.Parameter(torch.zeros(d, dtype=dtype, device=device))
        else:
            self.register_parameter("b_q", None)
            self.register_parameter("b_v", None)
            self.register_parameter("b_o", None)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"head_dim={self.head_dim}, qk_geometry={self.qk_geometry!r}, "
            f"vo_geometry={self.vo_geometry!r}, block={self.block}, "
            f"bias={self.b_q is not None}, dropout={self.dropout}"
        )

    # -- per-head views of the stored projections --------------------------------------------
    def _per_head(self, w: Tensor) -> Tensor:
        """(n_heads, d_model, head_dim) view of a query/output parameter (a stacked block
        (n_kv_heads, group_size·d_model, head_dim) is split into its heads, group-major)."""
        return w.reshape(self.n_heads, self.d_model, self.head_dim)

    def query_weights(self) -> Tensor:
        """W_Q^h for every head, shape (n_heads, d_model, head_dim)."""
        return self._per_head(self.w_q)

    def output_weights(self) -> Tensor:
        """W_O^hᵀ for every head, shape (n_heads, d_model, head_dim)."""
        return self._per_head(self.w_o)

    def kv_head_of(self, h: int) -> int:
        """The key/value head that query head h attends with."""
        return h // self.group_size

    # -- forward -------------------------------------------------------------------------------
    def heads(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """Per-head attention outputs o_h, shape (B, n_heads, T, head_dim), before W_O."""
        key = query if key is None else key
        value = key if value is None else value
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.ndim != 3 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must have shape (batch, length, d_model={self.d_model}), got "
                    f"{tuple(t.shape)}"
                )
        q = torch.einsum("btd,hdk->bhtk", query, self.query_weights())
        k = torch.einsum("bsd,gdk->bgsk", key, self.w_k)
        v = torch.einsum("bsd,gdk->bgsk", value, self.w_v)
        if self.b_q is not None:
            q = q + self.b_q[:, None, :]
            v = v + self.b_v[:, None, :]
        if self.group_size > 1:  # GQA: head h reads key/value head h // group_size
            k = k.repeat_interleave(self.group_size, dim=1)
            v = v.repeat_interleave(self.group_size, dim=1)
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
            scale=self.scale,
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        o = self.heads(query, key, value, attn_mask=attn_mask, is_causal=is_causal)
        out = torch.einsum("bhtk,hdk->btd", o, self.output_weights())
        if self.b_o is not None:
            out = out + self.b_o
        return out

    # -- checks --------------------------------------------------------------------------------
    def frame_residuals(self) -> dict[str, float]:
        """max over frames of ‖WᵀW − I‖ (measured in float64) for each frame parameter."""
        return {
            name: float(linalg.orthonormality_residual(getattr(self, name).detach()).max())
            for name in self.frame_geometries
        }


# -- the optimizer for a whole model ------------------------------------------------------------
def frame_parameters(model: nn.Module) -> dict[str, str]:
    """Full parameter name -> geometry for every frame of ``model``: the parameters listed in a
    submodule's ``frame_geometries`` and those tagged by ``tag_frame``."""
    found: dict[str, str] = {}
    for prefix, module in model.named_modules():
        for local, geometry in getattr(module, "frame_geometries", {}).items():
            found[f"{prefix}.{local}" if prefix else local] = geometry
    for name, param in model.named_parameters():
        tag = frame_geometry(param)
        if tag is not None:
            found.setdefault(name, tag)
    return found


def build_optimizer(
    model: nn.Module,
    optimizer_cls: type[torch.optim.Optimizer] = RiemannianAdam,
    *,
    frame_options: dict[str, Any] | None = None,
    plain_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """``optimizer_cls(groups, **kwargs)`` with one parameter group per geometry for the frames
    of ``model`` and one plain group (AdamW, decoupled decay) for the rest.

    Frames are found by ``frame_parameters``; parameters without ``requires_grad`` are left
    out, empty groups are not made. Frame groups get ``"geometry"`` and ``weight_decay=0``
    (decay does nothing on a frame, RA-5: asking for it would only warn), plus
    ``frame_options`` (e.g. ``{"retraction": "qr"}`` or ``{"trust_radius": 0.1}``); the plain
    group gets ``plain_options`` (e.g. its own ``lr``) and the optimizer's defaults from
    ``kwargs`` (e.g. ``weight_decay``). Every group carries ``"param_names"``, so error
    messages name the parameter.
    """
    frames = frame_parameters(model)
    by_geometry: dict[str, list[tuple[str, Tensor]]] = {}
    plain: list[tuple[str, Tensor]] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        geometry = frames.get(name)
        if geometry is None:
            plain.append((name, param))
        else:
            by_geometry.setdefault(geometry, []).append((name, param))
    groups: list[dict[str, Any]] = []
    for geometry, items in by_geometry.items():
        groups.append(
            {
                "params": [p for _, p in items],
                "param_names": [n for n, _ in items],
                "geometry": geometry,
                "weight_decay": 0.0,
                **(frame_options or {}),
            }
        )
    if plain:
        groups.append(
            {
                "params": [p for _, p in plain],
                "param_names": [n for n, _ in plain],
                **(plain_options or {}),
            }
        )
    if not groups:
        raise ValueError("the model has no trainable parameters")
    return optimizer_cls(groups, **kwargs)


def frame_groups(optimizer: torch.optim.Optimizer) -> Iterable[dict[str, Any]]:
    """The parameter groups of ``optimizer`` that hold frames."""
    return [g for g in optimizer.param_groups if g.get("geometry") is not None]


__all__ = [
    "ATTENTION_GEOMETRIES",
    "GEOMETRY_ATTR",
    "RiemannianMultiheadAttention",
    "build_optimizer",
    "frame_geometry",
    "frame_groups",
    "frame_parameters",
    "tag_frame",
]
