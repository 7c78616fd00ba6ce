"""Multi-head attention whose QK (and optionally VO) products live on a geometry (DESIGN §4, §7),
and the helpers that build the optimizer for a whole model (from ``torch_port.optim.groups``).

``RiemannianMultiheadAttention`` is batch first: inputs (B, T, d_model), output (B, T, d_model),
attention by ``torch.nn.functional.scaled_dot_product_attention``. Its projections are stored per
head, all in the layout (heads, d_model, head_dim):

==========  ==================================  ===========================================
parameter   shape                               use
==========  ==================================  ===========================================
``w_q``     (n_heads, d_model, head_dim)        q_h = x W_Q^h (x U_h S_h for R1)
``w_k``     (n_kv_heads, d_model, head_dim)     k_g = x W_K^g (shared by the heads of group g)
``w_v``     (n_kv_heads, d_model, head_dim)     v_g = x W_V^g
``w_o``     (n_heads, d_model, head_dim)        out = Σ_h o_h (W_O^h)ᵀ, i.e. W_O^hᵀ is stored
``s_qk``    (n_heads or G, head_dim, head_dim)  R1 core S of the QK product (else None)
``s_vo``    (n_heads or G, head_dim, head_dim)  R1 core S of the VO product (else None)
==========  ==================================  ===========================================

Head h uses key/value head g(h) = h // (n_heads // n_kv_heads) (GQA; MQA when n_kv_heads = 1).

Products as points. Write A_h (n_heads row factors) and B_g (n_kv_heads column factors). The QK
product of head h is the d_model×d_model matrix QK_h = A_h B_{g(h)}ᵀ with A_h = W_Q^h (times the
R1 core of its point) and B_g = W_K^g, so logits_h = scale · (x A_h)(x B_g)ᵀ = scale · x QK_h xᵀ.
With ``qk_geometry`` one of the ten design points (m = n = d_model, r = head_dim), QK_h is the
``to_matrix`` of a point of that geometry:

- R1 ``fixed_rank_embedded`` (U, S, V): ``w_q`` = U, ``s_qk`` = S, ``w_k`` = V; q_h = x U_h S_h.
- R2 ``fixed_rank_quotient`` (A, B): ``w_q`` = A, ``w_k`` = B.
- P1 ``partial_isometry_embedded``, P2 ``partial_isometry_quotient``, P3 ``stiefel_pair`` (U, V):
  ``w_q`` = U, ``w_k`` = V.

The VO product uses the same layout with the output side as row factor: ``w_o`` holds the row
factors A_h (with ``s_vo`` for R1: A_h = U_h S_h), ``w_v`` the column factors B_g; v_g = x B_g and
out = Σ_h o_h A_hᵀ, so head h maps x to P_h x VO_h with VO_h = W_V^g W_O^h = B_g A_hᵀ, the
TRANSPOSE of the point's matrix A_h B_gᵀ. ``qk_matrices()`` and ``vo_matrices()`` return QK_h and
VO_h, shape (n_heads, d_model, d_model) (checks and rank estimators only).

Plain and block variants (DESIGN §4.4). A plain variant treats each head as its own point, which
needs a one-to-one pattern: under GQA/MQA it is refused (use ``block=True``). It is stored with
batch shape (n_heads,). A block variant (``block=True``, or the name ``"block_<base>"`` directly:
the two are equivalent) stacks the row factors of each GQA group with the group's one column
factor; it is stored in the per-head layout of an optimizer group naming a block geometry: row
factors (n_heads, d_model, head_dim), column factors (n_kv_heads, d_model, head_dim), cores (G,
head_dim, head_dim) with G = n_kv_heads groups (``BlockGeometry.from_heads``/``to_heads``); head h
uses core g(h). Under MHA a group is one head and the block variant equals the plain one (the
same draws, the same parameters). Each point is initialised by the geometry's ``random_point``
(drawn in float64 with the module's ``generator``, then cast).

``"stiefel"`` keeps the per-frame geometry: each W_Q^h and each W_K^g is a frame on St(d_model,
head_dim) (also under GQA), initialised as the sign-fixed QR factor of a float64 Gaussian; with
``block=True`` the query frames of a GQA group are stacked into one frame on St(group_size·d_model,
head_dim): ``w_q`` of shape (n_kv_heads, group_size·d_model, head_dim), Σ_i (W_Q^{g,i})ᵀ W_Q^{g,i}
= I; likewise ``w_o`` with a VO geometry. ``None`` gives plain projections, initialised as
``nn.MultiheadAttention``'s: W_Q, W_K, W_V Xavier-uniform as one fused in-projection, W_O
uniform in ±1/sqrt(n_heads·head_dim), biases zero.

Decoding. ``forward(..., past_key_value=(k, v), use_cache=True)`` attends over the cached keys
and values (after their biases, before the GQA repeat: shape (B, n_kv_heads, L, head_dim)) and
the new ones, and returns ``(out, (k, v))`` with the extended cache; with ``is_causal`` the new
queries follow the cached keys (query i sees the keys up to position L_past + i; without a cache
this is SDPA's top-left alignment), so decoding token by token equals the full causal forward.
``key_padding_mask`` (B, L), L counting the cached keys, marks padded keys with True, as
``nn.MultiheadAttention``'s; a query row left with no key to attend gives a zero output (not the
NaN of an empty softmax).

Optimizer routing. A Stiefel frame is tagged ``param._rattn_geometry = "stiefel"`` and listed in
the module's ``frame_geometries`` (local name -> geometry; the tag is lost by ``copy.deepcopy``
of a parameter, the module's dict is not). The factors of a point of the other geometries are
listed in the module's ``point_groups`` (label "qk"/"vo" -> ``{"geometry": name, "params":
[local names in factor order], "n_heads", "n_kv_heads" (block only)}``), which is an optimizer
parameter group without its tensors. ``build_optimizer`` makes one group per such point, one
group per geometry for tagged frames, and plain (AdamW) groups for the rest: one decayed, one
without decay for biases, norms and embeddings (``no_decay``). Any module may
declare ``frame_geometries`` or ``point_groups`` the same way.

The products' geometries, the draws of their factors and their points are
``torch_port.attention_products``'s (``AttentionProducts``, a mixin of the module).

This module imports torch and ``torch_port`` only (DESIGN §2).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from torch_port import linalg
from torch_port.attention_products import (
    ATTENTION_GEOMETRIES,
    BASE_GEOMETRIES,
    AttentionProducts,
    _resolve_geometry,
    geometry_of_product,
)
from torch_port.optim.groups import (
    GEOMETRY_ATTR,
    build_optimizer,
    frame_geometry,
    frame_groups,
    frame_parameters,
    manifold_points,
    parameter_groups,
    tag_frame,
    usual_no_decay,
)
from torch_port.reprojection import AVERAGED_GEOMETRIES, projected_average, reproject

Tensor = torch.Tensor


class RiemannianMultiheadAttention(AttentionProducts, nn.Module):
    """Batch-first multi-head attention with QK (and optionally VO) products on a geometry.

    Args:
        d_model: model (embedding) dimension.
        n_heads: number of query heads.
        n_kv_heads: number of key/value heads (default ``n_heads``); must divide ``n_heads``.
            Fewer than ``n_heads`` is GQA (1 is MQA): keys and values are repeated per group.
        head_dim: dimension per head (default d_model // n_heads, which must then divide
            exactly). With a geometry on a product, head_dim ≤ d_model.
        qk_geometry: the geometry of QK_h = W_Q^h (S_h) W_K^gᵀ: one of ``ATTENTION_GEOMETRIES``
            ("stiefel": per-frame W_Q^h, W_K^g; the five base names of DESIGN §4.5 and their
            "block_" variants: one point per head or per GQA group) or None (plain).
        vo_geometry: the same for the VO product VO_h = W_V^g W_O^h, whose transpose is the
            point's matrix (module docstring); default None (plain).
        block: block variants (DESIGN §4.4): a base name selects its "block_" variant, and
            "stiefel" stacks the query (and output) frames of each GQA group into one frame;
            needs a geometry on QK or VO. The plain variants of the five base geometries need
            n_kv_heads = n_heads.
        bias: learnable biases on q and v (per head) and on the output (plain parameters,
            zero at initialisation, as ``nn.MultiheadAttention``'s).
        key_bias: a learnable key bias b_k (per key head) too. It adds q·b_k to every logit of
            a row, which the softmax ignores: it changes no output and its gradient is zero up
            to rounding (which Adam's normalisation would magnify into steps of size ~lr, so it
            is off by default); it gives a converted model's key bias a place.
        plain_init: the plain projections' initialisation, "multihead" (default:
            ``nn.MultiheadAttention``'s) or "linear" (``nn.Linear``'s bound for each).
        dropout: attention dropout probability (training mode only).
        scale: the logit scale passed to ``scaled_dot_product_attention`` (default
            1/sqrt(head_dim)).
        generator, dtype, device: for the initialisation (default dtype: torch's default).

    ``forward(query, key=None, value=None, attn_mask=None, is_causal=False,
    key_padding_mask=None, past_key_value=None, use_cache=False)`` maps (B, T, d_model) inputs
    to (B, T, d_model); key defaults to query and value to key; a boolean ``attn_mask`` marks
    the positions that may be attended (a float one is added to the logits);
    ``key_padding_mask`` (B, keys) is True at padded keys; with ``use_cache`` it returns
    ``(out, (k, v))`` (module docstring, "Decoding").
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
        key_bias: bool = False,
        plain_init: str = "multihead",
        scale: float | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        n_kv_heads, head_dim = self._check_sizes(d_model, n_heads, n_kv_heads, head_dim)
        qk_geometry = _resolve_geometry("qk_geometry", qk_geometry, block)
        vo_geometry = _resolve_geometry("vo_geometry", vo_geometry, block)
        for what, geo in (("qk_geometry", qk_geometry), ("vo_geometry", vo_geometry)):
            self._check_geometry(what, geo, d_model, n_heads, n_kv_heads, head_dim)
        if block and qk_geometry is None and vo_geometry is None:
            raise ValueError(
                "block=True stacks the factors of a GQA group into one point; it needs "
                f"qk_geometry or vo_geometry in {ATTENTION_GEOMETRIES} (got both None)"
            )
        if not (isinstance(dropout, int | float) and 0.0 <= dropout < 1.0):
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        if plain_init not in ("multihead", "linear"):
            raise ValueError(f"plain_init must be 'multihead' or 'linear', got {plain_init!r}")
        self.plain_init = plain_init

        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim, self.group_size = head_dim, n_heads // n_kv_heads
        self.qk_geometry, self.vo_geometry = qk_geometry, vo_geometry
        self.block, self.dropout, self.scale = bool(block), float(dropout), scale
        #: Local parameter name -> geometry of the Stiefel frames (survives deepcopy).
        self.frame_geometries: dict[str, str] = {}
        #: "qk"/"vo" -> the optimizer group of that product's point, without its tensors:
        #: {"geometry", "params" (local names, factor order), "n_heads", "n_kv_heads" (block)}.
        self.point_groups: dict[str, dict[str, Any]] = {}

        dtype = torch.get_default_dtype() if dtype is None else dtype
        init = (generator, dtype, device)
        factors = {
            **self._product("qk", qk_geometry, init),
            **self._product("vo", vo_geometry, init),
        }
        for name in ("w_q", "w_k", "w_v", "w_o", "s_qk", "s_vo"):
            self.register_parameter(name, factors.get(name))
        h, g, k, d = n_heads, n_kv_heads, head_dim, d_model
        #: Local names that ``build_optimizer``'s usual rule keeps out of weight decay.
        self.no_decay_parameters = ("b_q", "b_k", "b_v", "b_o")
        shapes = {"b_q": (h, k), "b_k": (g, k), "b_v": (g, k), "b_o": (d,)}
        for name, shape in shapes.items():  # zeros, as nn.MultiheadAttention's
            wanted = key_bias if name == "b_k" else bias
            b = nn.Parameter(torch.zeros(shape, dtype=dtype, device=device)) if wanted else None
            self.register_parameter(name, b)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"head_dim={self.head_dim}, qk_geometry={self.qk_geometry!r}, "
            f"vo_geometry={self.vo_geometry!r}, block={self.block}, "
            f"bias={self.b_q is not None}, key_bias={self.b_k is not None}, "
            f"dropout={self.dropout}"
        )

    # -- per-head views of the stored projections --------------------------------------------
    def _per_head(self, w: Tensor) -> Tensor:
        """(n_heads, d_model, head_dim) view of a query/output parameter (a stacked block
        (n_kv_heads, group_size·d_model, head_dim) is split into its heads, group-major)."""
        return w.reshape(self.n_heads, self.d_model, self.head_dim)

    def _row_factors(self, w: Tensor, core: Tensor | None) -> Tensor:
        """A_h = W^h S_{c(h)} per head, (n_heads, d_model, head_dim): the stored row factor
        times the R1 core of its point, c(h) = h // group_size (head h for a plain variant,
        its group for a block variant); W^h itself without a core."""
        w = self._per_head(w)
        if core is None:
            return w
        if self.group_size > 1:
            core = core.repeat_interleave(self.group_size, dim=0)
        return w @ core

    def _per_query_head(self, w: Tensor) -> Tensor:
        """A key/value parameter (n_kv_heads, ...) repeated to (n_heads, ...): head h gets g(h)."""
        return w.repeat_interleave(self.group_size, dim=0) if self.group_size > 1 else w

    def query_weights(self) -> Tensor:
        """A_h = W_Q^h (S_h for R1) for every head, shape (n_heads, d_model, head_dim):
        q_h = x A_h."""
        return self._row_factors(self.w_q, self.s_qk)

    def output_weights(self) -> Tensor:
        """A_h = W_O^hᵀ (U_h S_h for R1) for every head, shape (n_heads, d_model, head_dim):
        out = Σ_h o_h A_hᵀ."""
        return self._row_factors(self.w_o, self.s_vo)

    def qk_matrices(self) -> Tensor:
        """QK_h = A_h B_{g(h)}ᵀ, shape (n_heads, d_model, d_model): logits_h = scale·x QK_h xᵀ
        (without biases). For a point geometry, the ``to_matrix`` of the point (checks and rank
        estimators only: forms d_model×d_model matrices)."""
        return self.query_weights() @ self._per_query_head(self.w_k).transpose(-1, -2)

    def vo_matrices(self) -> Tensor:
        """VO_h = W_V^g W_O^h = B_{g(h)} A_hᵀ, shape (n_heads, d_model, d_model): head h adds
        P_h x VO_h to the output (without biases). For a point geometry, the TRANSPOSE of the
        point's ``to_matrix`` (checks and rank estimators only)."""
        return self._per_query_head(self.w_v) @ self.output_weights().transpose(-1, -2)

    def kv_head_of(self, h: int) -> int:
        """The key/value head that query head h attends with."""
        return h // self.group_size

    # -- forward -------------------------------------------------------------------------------
    def _check_input(self, name: str, t: Tensor) -> None:
        if t.ndim != 3 or t.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} must have shape (batch, length, d_model={self.d_model}), got "
                f"{tuple(t.shape)}"
            )

    def _mask(
        self,
        batch: int,
        t: int,
        length: int,
        past: int,
        attn_mask: Tensor | None,
        is_causal: bool,
        key_padding_mask: Tensor | None,
        device: Any,
    ) -> tuple[Tensor | None, Tensor | None]:
        """(mask for SDPA, rows with no key or None). Causal: query i of the t new ones, after
        ``past`` cached keys, sees the keys j ≤ past + i (SDPA's top-left alignment when there
        is no cache). A boolean mask marks what may be attended."""
        if is_causal and attn_mask is not None and attn_mask.dtype != torch.bool:
            raise ValueError("pass either a float attn_mask or is_causal, not both")
        if key_padding_mask is not None:
            want = (batch, length)
            if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != want:
                raise ValueError(
                    f"key_padding_mask must be a boolean tensor of shape (batch, keys) = {want} "
                    f"(cached keys included), True at padded keys; got {key_padding_mask.dtype} "
                    f"of shape {tuple(key_padding_mask.shape)}"
                )
        bool_mask = attn_mask is not None and attn_mask.dtype == torch.bool
        if key_padding_mask is None and not bool_mask and (not is_causal or past == 0):
            return attn_mask, None  # SDPA's own causal path, or a float mask
        allowed = torch.ones(t, length, dtype=torch.bool, device=device)
        if is_causal:
            allowed = allowed.tril(past)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, None, None, :]
        if attn_mask is not None:
            if attn_mask.dtype != torch.bool:  # additive float mask
                return attn_mask.masked_fill(~allowed, float("-inf")), None
            allowed = allowed & attn_mask
        empty = ~allowed.any(dim=-1, keepdim=True)
        return allowed | empty, empty

    def heads(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        key_padding_mask: Tensor | None = None,
        past_key_value: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Per-head attention outputs o_h, shape (B, n_heads, T, head_dim), before W_O:
        q_h = x A_h (+ b_q), k_g = x B_g (+ b_k), v_g = x W_V^g (+ b_v),
        o_h = softmax(scale·q kᵀ) v (arguments as ``forward``'s)."""
        return self._attend(
            query, key, value, attn_mask, is_causal, key_padding_mask, past_key_value
        )[0]

    def _attend(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        key_padding_mask: Tensor | None = None,
        past_key_value: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """(o, (k, v)): ``heads`` and the keys and values attended (the cache)."""
        key = query if key is None else key
        value = key if value is None else value
        for name, t in (("query", query), ("key", key), ("value", value)):
            self._check_input(name, t)
        q = torch.einsum("btd,hdk->bhtk", query, self.query_weights())
        k = torch.einsum("bsd,gdk->bgsk", key, self.w_k)
        v = torch.einsum("bsd,gdk->bgsk", value, self.w_v)
        if self.b_q is not None:
            q = q + self.b_q[:, None, :]
            v = v + self.b_v[:, None, :]
        if self.b_k is not None:
            k = k + self.b_k[:, None, :]
        if past_key_value is not None:
            past_k, past_v = past_key_value
            want = (k.shape[0], self.n_kv_heads, past_k.shape[-2], self.head_dim)
            if past_k.shape != want or past_v.shape != want:
                raise ValueError(
                    f"past_key_value must be two tensors of shape (batch, n_kv_heads, length, "
                    f"head_dim) = {want}, got {tuple(past_k.shape)} and {tuple(past_v.shape)}"
                )
            k, v = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)
        cache = (k, v)
        if self.group_size > 1:  # GQA: head h reads key/value head h // group_size
            k = k.repeat_interleave(self.group_size, dim=1)
            v = v.repeat_interleave(self.group_size, dim=1)
        past = 0 if past_key_value is None else past_key_value[0].shape[-2]
        mask, empty = self._mask(
            q.shape[0], q.shape[-2], k.shape[-2], past, attn_mask, is_causal, key_padding_mask,
            q.device,
        )  # fmt: skip
        o = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal and mask is None,
            scale=self.scale,
        )
        if empty is not None:
            o = o.masked_fill(empty, 0.0)
        return o, cache

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        key_padding_mask: Tensor | None = None,
        past_key_value: tuple[Tensor, Tensor] | None = None,
        use_cache: bool = False,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """out = Σ_h o_h A_hᵀ (+ b_o), A_h the output row factors (``output_weights``); with
        ``use_cache``, (out, (k, v)) where (k, v) are the keys and values attended, to pass as
        ``past_key_value`` with the next tokens."""
        o, cache = self._attend(
            query, key, value, attn_mask, is_causal, key_padding_mask, past_key_value
        )
        out = torch.einsum("bhtk,hdk->btd", o, self.output_weights())
        if self.b_o is not None:
            out = out + self.b_o
        return (out, cache) if use_cache else out

    # -- checks --------------------------------------------------------------------------------
    def frame_residuals(self) -> dict[str, float]:
        """max over frames of ‖WᵀW − I‖ (measured in float64) for each Stiefel frame parameter."""
        return {
            name: float(linalg.orthonormality_residual(getattr(self, name).detach()).max())
            for name in self.frame_geometries
        }


__all__ = [
    "ATTENTION_GEOMETRIES",
    "AVERAGED_GEOMETRIES",
    "BASE_GEOMETRIES",
    "GEOMETRY_ATTR",
    "RiemannianMultiheadAttention",
    "build_optimizer",
    "frame_geometry",
    "frame_groups",
    "frame_parameters",
    "geometry_of_product",
    "manifold_points",
    "parameter_groups",
    "projected_average",
    "reproject",
    "tag_frame",
    "usual_no_decay",
]
