"""Put the attention of an existing model on a geometry in one call (DESIGN §7).

``riemannian_attention(model, qk_geometry, vo_geometry, init)`` finds the attention modules of a
model by their structure and re-expresses their query/key (and, when asked, value/output)
projections as points of a geometry, leaving everything else of the module as it was: its
forward, masks, rotary embeddings, caches and signature. Recognised structures:

==============================  ===============================================================
``nn.MultiheadAttention``       ``in_proj_weight`` (3d, d), ``in_proj_bias``, ``out_proj``
fused ``c_attn``                Hugging Face GPT-2 ``Conv1D`` (weight (d, 3d)) or a nanoGPT
                                ``nn.Linear(d, 3d)``, with ``c_proj``; heads from ``num_heads``,
                                ``n_head``, ``n_heads`` or ``config``
separate projections            ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``/``out_proj``
                                ``nn.Linear`` (LLaMA, Mistral, Qwen2, OPT), grouped key heads
                                (GQA) read from the shapes
==============================  ===============================================================

How. Each weight that holds a projection becomes a ``torch.nn.utils.parametrize``
parametrization: the model still reads ``c_attn.weight`` (or ``in_proj_weight``, ``q_proj.weight``)
as before, and that tensor is now assembled on every access from the factors of the points,
which are the parameters the optimizer steps. Head h of the query projection is the d×k matrix
W_Q^h with q_h = x W_Q^h (columns h·k…(h+1)·k of the query block), likewise W_K^g, W_V^g, and
the output projection's rows for head h give A_h = W_O^hᵀ (d×k), as in
``torch_port.nn.RiemannianMultiheadAttention``. The QK product of head h is QK_h = W_Q^h W_K^gᵀ
with g = h // (n_heads / n_kv_heads), the VO point's matrix A_h W_V^gᵀ = VO_hᵀ.

Initialisation (``init="nearest"``, in float64, then cast to the weight's dtype):

- ``"stiefel"``: each W_Q^h and W_K^g is replaced by its polar factor W (WᵀW)^{-1/2}, the
  nearest frame in Frobenius norm (with ``block=True`` the query frames of a GQA group are
  stacked into one frame first).
- R1 ``fixed_rank_embedded``: (U, S, V) with U S Vᵀ = QK_h, from the thin QR of both factors
  and the SVD of the k×k core; exact.
- R2 ``fixed_rank_quotient``: the factors themselves, (A, B) = (W_Q^h, W_K^g); exact, also when
  the model rotates q and k between projection and product (rotary embeddings).
- P1, P2, P3: U Vᵀ from that SVD, the nearest rank-k partial isometry (the singular values
  are dropped).
- Block variants (chosen automatically under GQA unless ``block=False``): the same for the
  stacked matrix of a group [QK_h]_h in the group.

``init="random"`` draws a fresh point (the geometry's ``random_point``, or sign-fixed QR frames).
Biases follow the factors so that an exact conversion stays exact: with new factors (A', B')
of a head, the query bias b_q becomes B'⁺ B b_q (what multiplies the keys is kept) and a key or
value bias b becomes A'⁺ A b over the heads of its group (least squares when the conversion is
not exact). A factor of rank below k cannot be put on a fixed-rank or partial-isometry
geometry; it is refused with its measured σ_min/σ_max (use ``init="random"``).

What moved. For every converted module, ``Conversion.qk_change`` is max_h ‖QK_h' − QK_h‖₂ /
‖QK_h‖₂ measured in float64 on the cast factors (``vo_change`` the same for VO): every logit
x QK_h yᵀ moved by at most that fraction of ‖QK_h‖₂ ‖x‖ ‖y‖. For a model with rotary
embeddings this is the change of the content product (at relative distance 0).

Optimizer routing. The attention module records its frames in ``frame_geometries`` and its
points in ``point_groups`` (names relative to it, e.g.
``c_attn.parametrizations.weight.original0``), as ``RiemannianMultiheadAttention`` does, so
``build_optimizer`` and ``parameter_groups`` find them under any prefix (``torch.compile``'s
``_orig_mod.``, DDP's ``module.``). The assembled weight itself is not a parameter.
``plain_attention(model)`` undoes a conversion: every assembled weight becomes a plain
parameter again (e.g. before ``save_pretrained``) and the declarations are dropped.

Refused, before anything changes, with a ValueError naming the module: weights already
parametrized (a weight that holds q, k and v together is converted once: give QK and VO in one
call), shared or tied projections, non-finite or meta tensors, projections of mixed dtypes or
devices, sizes that do not split into heads, products of rank below k for the fixed-rank and
partial-isometry geometries, heads with no nearest frame. A model with rotary embeddings
converted by a geometry that changes the factors (all but R2) gets a ``RotaryWarning``.

This module imports torch and ``torch_port`` only (DESIGN §2).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from torch_port import linalg
from torch_port.nn import (
    RiemannianMultiheadAttention,
    _resolve_geometry,
    geometry_of_product,
)
from torch_port.optim.groups import _join, tag_frame
from torch_port.stiefel import Stiefel

Tensor = torch.Tensor

#: The two products: (row role, column role). The row role of VO is the output projection.
PRODUCTS = {"qk": ("q", "k"), "vo": ("o", "v")}
INITS = ("nearest", "random")
_WIDE = torch.float64


@dataclass(frozen=True)
class _Slot:
    """One weight or bias of an attention module and the roles it holds, in order.

    The weight is read in nn.Linear's convention (out_features, in_features); a Hugging Face
    ``Conv1D`` stores its transpose (``conv1d``). ``local`` is the holder's path relative to the
    attention module ("" for the module itself)."""

    holder: nn.Module
    attr: str
    roles: tuple[str, ...]
    local: str
    conv1d: bool = False


@dataclass
class _Attention:
    """A recognised attention module: its sizes and where its projections live."""

    kind: str
    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    weights: list[_Slot]
    biases: list[_Slot]
    rotary: bool = field(default=False)

    def count(self, role: str) -> int:
        """Heads of a role: n_heads for q and o, n_kv_heads for k and v."""
        return self.n_heads if role in "qo" else self.n_kv_heads


@dataclass(frozen=True)
class Conversion:
    """One converted attention module (``riemannian_attention`` returns one per module).

    ``name`` is its path in the model, ``module`` the module, ``kind`` its structure ("nn.
    MultiheadAttention", "fused Conv1D", "fused Linear", "separate projections"); the geometries
    are the resolved names (a block variant under GQA); ``qk_change``/``vo_change`` are
    max_h ‖M_h' − M_h‖₂ / ‖M_h‖₂ of the product (None when it was not converted; inf when the
    original product is zero); ``rotary`` says whether the module rotates q and k (then
    ``qk_change`` is the content product's change only)."""

    name: str
    module: nn.Module
    kind: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    qk_geometry: str | None
    vo_geometry: str | None
    qk_change: float | None
    vo_change: float | None
    rotary: bool


class RotaryWarning(UserWarning):
    """A conversion changed the factors of a model with rotary embeddings: its logits moved
    although the content product did not (module docstring)."""


def _has_rotary(m: nn.Module) -> bool:
    """Whether the module rotates q and k between projection and product: a rotary module of
    its own, or a config with rotary parameters (LLaMA-family)."""
    if any(hasattr(m, a) for a in ("rotary_emb", "rotary_fn")):
        return True
    config = getattr(m, "config", None)
    return any(getattr(config, a, None) is not None for a in ("rope_parameters", "rope_theta"))


# -- recognition ------------------------------------------------------------------------------
def _heads_attribute(module: nn.Module) -> int | None:
    for name in ("num_heads", "n_head", "n_heads", "num_attention_heads"):
        v = getattr(module, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    config = getattr(module, "config", None)
    for name in ("num_attention_heads", "n_head"):
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _is_conv1d(m: Any) -> bool:
    """Hugging Face's Conv1D by structure: nf, nx and a weight (nx, nf)."""
    w = getattr(m, "weight", None)
    nf, nx = getattr(m, "nf", None), getattr(m, "nx", None)
    return isinstance(w, Tensor) and w.ndim == 2 and tuple(w.shape) == (nx, nf)


def _sizes(name: str, d: int, n_heads: int | None, head_dim: int | None) -> tuple[int, int]:
    """(heads, head_dim) of d features from either attribute; ValueError when they do not
    split d exactly."""
    if n_heads is None and head_dim is None:
        raise ValueError(
            f"{name}: cannot tell its number of heads (no num_heads, n_head, n_heads, "
            "num_attention_heads or head_dim attribute, nor a config with them)"
        )
    if head_dim is None:
        head_dim = d // n_heads if n_heads > 0 and d % n_heads == 0 else 0
    if n_heads is None:
        n_heads = d // head_dim if head_dim > 0 and d % head_dim == 0 else 0
    if n_heads < 1 or head_dim < 1 or n_heads * head_dim != d:
        raise ValueError(
            f"{name}: {d} features do not split into {n_heads} heads of size {head_dim}"
        )
    return n_heads, head_dim


def _recognise(name: str, m: nn.Module) -> _Attention | None:
    """The structure of ``m`` if it is an attention module this converter knows, else None."""
    if isinstance(m, nn.MultiheadAttention):
        if not m._qkv_same_embed_dim or m.bias_k is not None:
            raise ValueError(
                f"{name}: nn.MultiheadAttention with kdim/vdim ≠ embed_dim or add_bias_kv=True "
                "is not supported (its projections are not one fused in_proj_weight)"
            )
        d, h = m.embed_dim, m.num_heads
        biases = (
            [_Slot(m, "in_proj_bias", ("q", "k", "v"), "")] if m.in_proj_bias is not None else []
        )
        return _Attention(
            "nn.MultiheadAttention",
            d,
            h,
            h,
            m.head_dim,
            [
                _Slot(m, "in_proj_weight", ("q", "k", "v"), ""),
                _Slot(m.out_proj, "weight", ("o",), "out_proj"),
            ],
            biases,
        )
    c_attn, c_proj = getattr(m, "c_attn", None), getattr(m, "c_proj", None)
    if c_attn is not None and c_proj is not None and getattr(m, "q_attn", None) is None:
        conv = _is_conv1d(c_attn) and _is_conv1d(c_proj)
        linear = isinstance(c_attn, nn.Linear) and isinstance(c_proj, nn.Linear)
        if conv or linear:
            w = c_attn.weight.T if conv else c_attn.weight
            if w.shape[0] == 3 * w.shape[1]:
                d = int(w.shape[1])
                head_dim = getattr(m, "head_dim", None)
                head_dim = head_dim if isinstance(head_dim, int) else None
                h, k = _sizes(name, d, _heads_attribute(m), head_dim)
                if tuple(c_proj.weight.shape) != (d, d):
                    raise ValueError(
                        f"{name}: c_proj's weight has shape {tuple(c_proj.weight.shape)}, "
                        f"expected ({d}, {d}) after a fused c_attn over {d} features"
                    )
                kind = "fused Conv1D" if conv else "fused Linear"
                slots = [
                    _Slot(c_attn, "weight", ("q", "k", "v"), "c_attn", conv),
                    _Slot(c_proj, "weight", ("o",), "c_proj", conv),
                ]
                biases = (
                    []
                    if c_attn.bias is None
                    else [_Slot(c_attn, "bias", ("q", "k", "v"), "c_attn")]
                )
                return _Attention(kind, d, h, h, k, slots, biases)
    proj = {r: getattr(m, f"{r}_proj", None) for r in "qkv"}
    proj["o"] = getattr(m, "o_proj", None) or getattr(m, "out_proj", None)
    if all(isinstance(p, nn.Linear) for p in proj.values()):
        d = proj["q"].in_features
        head_dim = getattr(m, "head_dim", None)
        n_heads = None if isinstance(head_dim, int) else _heads_attribute(m)
        _, k = _sizes(name, proj["q"].out_features, n_heads, head_dim)
        h = proj["q"].out_features // k
        g = proj["k"].out_features // k
        out = "o_proj" if getattr(m, "o_proj", None) is not None else "out_proj"
        shapes = {r: tuple(p.weight.shape) for r, p in proj.items()}
        if shapes != {"q": (h * k, d), "k": (g * k, d), "v": (g * k, d), "o": (d, h * k)} or h % g:
            raise ValueError(
                f"{name}: projections of shapes {shapes} do not form {h} query heads and {g} "
                f"key/value heads of size {k} over {d} features"
            )
        local = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": out}
        slots = [_Slot(proj[r], "weight", (r,), local[r]) for r in "qkvo"]
        biases = [_Slot(proj[r], "bias", (r,), local[r]) for r in "qkv" if proj[r].bias is not None]
        return _Attention("separate projections", d, h, g, k, slots, biases, _has_rotary(m))
    return None


# -- reading and writing heads ----------------------------------------------------------------
def _linear_view(slot: _Slot) -> Tensor:
    t = getattr(slot.holder, slot.attr).detach()
    return t.T if slot.conv1d else t


def _split(att: _Attention, slot: _Slot, t: Tensor) -> dict[str, Tensor]:
    """A weight (Linear convention) or bias as per-role blocks: input roles stacked along the
    rows, (n·k, d) each (a bias: (n·k,)); the output role is the whole (d, h·k)."""
    if slot.roles == ("o",):
        return {"o": t}
    sizes = [att.count(r) * att.head_dim for r in slot.roles]
    return dict(zip(slot.roles, torch.split(t, sizes, dim=0), strict=True))


def _to_heads(role: str, block: Tensor, n: int, d: int, k: int) -> Tensor:
    """Per-head factors (n, d, k) of a role's block: q_h = x W^h for an input role (W^h = rows
    h·k…(h+1)·k, transposed); A_h = W_O^hᵀ (columns h·k…(h+1)·k) for the output role."""
    if role == "o":
        return block.reshape(d, n, k).permute(1, 0, 2)
    return block.reshape(n, k, d).transpose(-1, -2)


def _from_heads(role: str, heads: Tensor, n: int, d: int, k: int) -> Tensor:
    """The inverse of ``_to_heads``: per-head factors (n, d, k) to the role's block."""
    if role == "o":
        return heads.permute(1, 0, 2).reshape(d, n * k)
    return heads.transpose(-1, -2).reshape(n * k, d)


class AssembledWeight(nn.Module):
    """Parametrization: a projection weight assembled from the factors that the optimizer steps.

    ``pieces`` lists, per role in the weight's order, (role, source, heads): source "raw" takes
    one original, the role's block as it was (Linear convention); "heads" one original of
    per-head factors (n, d, k), or stacked per GQA group (g, p·d, k); "heads_core" two,
    the factors and the R1 cores (c, k, k): A_h = W^h S_{h // (n/c)}. The weight is the
    concatenation of the blocks (transposed for a Conv1D). The first ``right_inverse`` call
    (made by ``register_parametrization``) returns the initial factors; assigning a new weight
    afterwards is refused, since a weight does not determine a point (assign the factors)."""

    def __init__(
        self,
        pieces: list[tuple[str, str, int]],
        d: int,
        k: int,
        conv1d: bool,
        initial: tuple[Tensor, ...],
    ):
        super().__init__()
        self.pieces, self.d, self.k, self.conv1d = pieces, d, k, conv1d
        self._initial: tuple[Tensor, ...] | None = initial

    def forward(self, *originals: Tensor) -> Tensor:
        blocks, i = [], 0
        for role, source, n in self.pieces:
            if source == "raw":
                blocks.append(originals[i])
                i += 1
                continue
            heads = originals[i].reshape(n, self.d, self.k)
            if source == "heads_core":
                core = originals[i + 1]
                heads = heads @ core.repeat_interleave(n // core.shape[0], dim=0)
                i += 1
            i += 1
            blocks.append(_from_heads(role, heads, n, self.d, self.k))
        w = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=0)
        return w.T if self.conv1d else w

    def right_inverse(self, weight: Tensor) -> tuple[Tensor, ...]:
        if self._initial is None:
            raise ValueError(
                "a converted attention weight is assembled from its factors; assign the "
                "factors (module.parametrizations.<name>.original<i>), not the weight"
            )
        initial, self._initial = self._initial, None
        return initial


# -- the points -------------------------------------------------------------------------------
def _factor_svd(label: str, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(U, s, V) with A Bᵀ = U diag(s) Vᵀ, from the thin QR of A and B and the SVD of the k×k
    core R_A R_Bᵀ; refuses a product of rank < k (σ_min/σ_max ≤ k·ε of float64)."""
    qa, ra = torch.linalg.qr(a)
    qb, rb = torch.linalg.qr(b)
    u, s, vh = torch.linalg.svd(ra @ rb.mT)
    ratio = s[..., -1] / s[..., 0]
    k = a.shape[-1]
    if bool((~(ratio > k * torch.finfo(_WIDE).eps)).any()):
        raise ValueError(
            f"{label}: a product W_Q W_Kᵀ (or its block) has rank below {k}: σ_min/σ_max = "
            f"{float(ratio.min()):.3e}; it is no point of a rank-{k} geometry (use init='random')"
        )
    return qa @ u, s, qb @ vh.mT


def _nearest(label: str, base: Any, a: Tensor, b: Tensor) -> tuple[Tensor, ...]:
    """The point of a base geometry nearest to the product A Bᵀ (module docstring)."""
    u, s, v = _factor_svd(label, a, b)
    if base.name == "fixed_rank_embedded":
        return u, torch.diag_embed(s), v
    if base.name == "fixed_rank_quotient":
        return a, b
    return u, v


def _frames(t: Tensor, init: str, generator: torch.Generator | None) -> Tensor:
    """Stiefel frames of t's shape: polar(t), the nearest in Frobenius norm, or (``"random"``)
    the sign-fixed QR factor of a float64 Gaussian."""
    if init == "random":
        z = torch.randn(t.shape, generator=generator, dtype=_WIDE)
        return linalg.qr_signfixed(z)[0].to(t.device)
    return linalg.polar(t)


def _check_cast(label: str, geo: Any, x: tuple[Tensor, ...], dtype: torch.dtype) -> None:
    """The geometry's ``check_point`` of x cast to ``dtype``, its message prefixed by label."""
    try:
        geo.check_point(x[0].to(dtype) if len(x) == 1 else tuple(t.to(dtype) for t in x))
    except ValueError as e:
        raise ValueError(f"{label}: {e}") from None


def _product_point(
    label: str,
    geometry: str,
    block: bool,
    att: _Attention,
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
            row = _frames(a.reshape(g, (h // g) * d, k) if block else a, init, generator)
            col = _frames(b, init, generator)
        except ValueError as e:
            raise ValueError(
                f"{label}: a head's weight has no nearest frame ({e}); use init='random'"
            ) from None
        for f in (row, col):
            _check_cast(label, Stiefel(f.shape[-2], k), (f,), dtype)
        return {"row": row, "col": col}, ("row", "col"), row.reshape(h, d, k), col
    geo = geometry_of_product(geometry, d, k, h, g)
    stacked = geometry.startswith("block_")
    base = geo.base if stacked else geo
    if init == "random":
        x = geo.random_point(generator, () if stacked else (h,), dtype=_WIDE)
        x = tuple(t.to(a.device) for t in x)
    else:
        x = _nearest(label, base, *(geo.from_heads((a, b), ("row", "col")) if stacked else (a, b)))
    _check_cast(label, geo, x, dtype)
    a_new, b_new = geo.head_factors(x) if stacked else base.pair(x)
    kinds = base.point_kinds
    stored = geo.to_heads(x) if stacked else x
    return dict(zip(kinds, stored, strict=True)), kinds, a_new, b_new


def _per_query(t: Tensor, p: int) -> Tensor:
    """Key/value-head tensors (g, ...) repeated to the query heads (h, ...)."""
    return t.repeat_interleave(p, dim=0) if p > 1 else t


def _spectral_product(a: Tensor, b: Tensor) -> Tensor:
    """‖A Bᵀ‖₂ per head from the thin factors: ‖R_A R_Bᵀ‖₂ for A = Q_A R_A, B = Q_B R_B."""
    return torch.linalg.matrix_norm(torch.linalg.qr(a)[1] @ torch.linalg.qr(b)[1].mT, ord=2)


def _change(a: Tensor, b: Tensor, a_new: Tensor, b_new: Tensor) -> float:
    """max_h ‖A'_h B'_hᵀ − A_h B_hᵀ‖₂ / ‖A_h B_hᵀ‖₂, all per query head."""
    diff = _spectral_product(torch.cat([a_new, -a], dim=-1), torch.cat([b_new, b], dim=-1))
    return float((diff / _spectral_product(a, b)).max())


def _map_bias(b: Tensor, old: Tensor, new: Tensor) -> Tensor:
    """b' = new⁺ (old b) per head: the bias's contribution old·b, kept (least squares)."""
    return (torch.linalg.pinv(new) @ (old @ b[..., None]))[..., 0]


@dataclass
class _Plan:
    """Everything one module's conversion writes, computed before anything is written."""

    name: str
    module: nn.Module
    att: _Attention
    dtype: torch.dtype
    old: dict[str, Tensor]  # role -> float64 per-head factors before
    sources: dict[str, tuple[str, tuple[Tensor, ...]]]  # role -> (source, originals, float64)
    kinds: dict[str, tuple[str, ...]]  # product -> factor kinds
    biases: dict[str, tuple[_Slot, Tensor]]  # role -> (slot, its new float64 bias (n, k))
    geometries: dict[str, str | None]
    block: dict[str, bool]


def _check_tensors(name: str, att: _Attention, roles: set[str]) -> None:
    """The weights and biases of one module can be converted: those holding a role to convert
    not parametrized already, all real (not meta), finite, and of one dtype and device (the
    factors of a point share them)."""
    kinds = set()
    for slot in att.weights + att.biases:
        where = f"{name}: {_join(slot.local, slot.attr)}"
        if roles & set(slot.roles) and parametrize.is_parametrized(slot.holder, slot.attr):
            raise ValueError(
                f"{where} is already parametrized (converted before, or by another "
                "parametrization such as weight_norm); convert a model once, QK and VO together"
            )
        t = getattr(slot.holder, slot.attr)
        if t.is_meta:
            raise ValueError(f"{where} is on the meta device: materialise the model first")
        bad = int((~torch.isfinite(t.detach())).sum())
        if bad:
            raise ValueError(f"{where} has {bad} non-finite entries (NaN or inf) of {t.numel()}")
        kinds.add((t.dtype, t.device))
    if len(kinds) > 1:
        found = ", ".join(f"{dt} on {dev}" for dt, dev in sorted(kinds, key=str))
        raise ValueError(
            f"{name}: its projections must share one dtype and device to form points, got {found}"
        )


def _plan(
    name: str,
    module: nn.Module,
    att: _Attention,
    geometries: dict[str, str | None],
    block: dict[str, bool],
    init: str,
    generator: torch.Generator | None,
) -> _Plan:
    h, g, d, k = att.n_heads, att.n_kv_heads, att.d, att.head_dim
    p = h // g
    _check_tensors(
        name, att, {role for prod, geo in geometries.items() if geo for role in PRODUCTS[prod]}
    )
    for product, geo in geometries.items():
        RiemannianMultiheadAttention._check_geometry(f"{name}: {product}_geometry", geo, d, h, g, k)
    dtype = getattr(att.weights[0].holder, att.weights[0].attr).dtype
    old, sources = {}, {}
    for slot in att.weights:
        for role, blk in _split(att, slot, _linear_view(slot)).items():
            old[role] = _to_heads(role, blk.to(_WIDE), att.count(role), d, k)
            sources[role] = ("raw", (blk.clone(),))
    biases = {}
    for slot in att.biases:
        for role, v in _split(att, slot, getattr(slot.holder, slot.attr).detach()).items():
            biases[role] = (slot, v.to(_WIDE).reshape(att.count(role), k))
    new, kinds = {}, {}
    for product, (row, col) in PRODUCTS.items():
        if geometries[product] is None:
            continue
        stored, kinds[product], new[row], new[col] = _product_point(
            f"{name} ({product})",
            geometries[product],
            block[product],
            att,
            old[row],
            old[col],
            init,
            generator,
            dtype,
        )
        core = stored.get("core")
        sources[row] = (
            ("heads", (stored["row"],)) if core is None else ("heads_core", (stored["row"], core))
        )
        sources[col] = ("heads", (stored["col"],))
    # The query bias multiplies the keys through B_g; a key/value bias meets the row factors of
    # its group's heads (module docstring).
    mapped = {}
    for role, factor in (("q", "k"), ("k", "q"), ("v", "o")):
        if role not in biases or factor not in new:
            continue
        slot, b = biases[role]
        if role == "q":
            b = _map_bias(b, _per_query(old[factor], p), _per_query(new[factor], p))
        else:
            b = _map_bias(b, old[factor].reshape(g, p * d, k), new[factor].reshape(g, p * d, k))
        mapped[role] = (slot, b)
    return _Plan(name, module, att, dtype, old, sources, kinds, mapped, geometries, block)


def _check_unshared(found: list[tuple[str, nn.Module, _Attention]]) -> None:
    """No projection weight held twice (a Linear shared between roles or modules, or a weight
    tied across layers): each would get its own factors and the tie would break."""
    seen: dict[int, str] = {}
    for name, _, att in found:
        for slot in att.weights:
            t = getattr(slot.holder, slot.attr)
            where = f"{name or '<model>'}: {_join(slot.local, slot.attr)}"
            if id(t) in seen:
                raise ValueError(
                    f"{where} is the same tensor as {seen[id(t)]} (a shared or tied "
                    "projection); the converter gives every projection its own factors, which "
                    "would untie them"
                )
            seen[id(t)] = where


def _apply(plan: _Plan) -> Conversion:
    """Register the parametrizations, write the biases, record the frames and points."""
    att, module = plan.att, plan.module
    h, g, k = att.n_heads, att.n_kv_heads, att.head_dim
    names: dict[str, list[str]] = {}  # role -> its originals' names, relative to the module
    with torch.no_grad():
        for slot in att.weights:
            if all(plan.sources[role][0] == "raw" for role in slot.roles):
                continue  # nothing of it is on a geometry: left as it is
            stem = _join(slot.local, f"parametrizations.{slot.attr}.original")
            pieces, initial = [], []
            for role in slot.roles:
                source, tensors = plan.sources[role]
                pieces.append((role, source, att.count(role)))
                names[role] = [f"{stem}{len(initial) + i}" for i in range(len(tensors))]
                initial.extend(t.to(plan.dtype).contiguous() for t in tensors)
            weight = AssembledWeight(pieces, att.d, k, slot.conv1d, tuple(initial))
            parametrize.register_parametrization(slot.holder, slot.attr, weight)
        for role, (slot, b) in plan.biases.items():
            target = getattr(slot.holder, slot.attr)
            offset = sum(att.count(r) * k for r in slot.roles[: slot.roles.index(role)])
            target[offset : offset + att.count(role) * k] = b.reshape(-1).to(target.dtype)
    frames = module.__dict__.setdefault("frame_geometries", {})
    points = module.__dict__.setdefault("point_groups", {})
    for product, kinds in plan.kinds.items():
        row, col = PRODUCTS[product]
        by_kind = {"row": names[row][0], "core": names[row][-1], "col": names[col][0]}
        geometry = plan.geometries[product]
        if geometry == "stiefel":
            for local in (by_kind["row"], by_kind["col"]):
                frames[local] = geometry
                tag_frame(module.get_parameter(local), geometry)
            continue
        spec: dict[str, Any] = {"geometry": geometry, "params": [by_kind[c] for c in kinds]}
        if geometry.startswith("block_"):
            spec.update(n_heads=h, n_kv_heads=g)
        points[product] = spec
    now = {}
    for slot in att.weights:
        for role, blk in _split(att, slot, _linear_view(slot)).items():
            now[role] = _to_heads(role, blk.to(_WIDE), att.count(role), att.d, k)
    p = h // g
    changes = {
        product: _change(
            plan.old[row], _per_query(plan.old[col], p), now[row], _per_query(now[col], p)
        )
        for product, (row, col) in PRODUCTS.items()
        if plan.geometries[product] is not None
    }
    return Conversion(
        plan.name,
        module,
        att.kind,
        h,
        g,
        k,
        plan.geometries["qk"],
        plan.geometries["vo"],
        changes.get("qk"),
        changes.get("vo"),
        att.rotary,
    )


def riemannian_attention(
    model: nn.Module,
    qk_geometry: str | None = "stiefel",
    vo_geometry: str | None = None,
    init: str = "nearest",
    *,
    block: bool | None = None,
    generator: torch.Generator | None = None,
) -> list[Conversion]:
    """Put the QK (and VO) products of every attention module of ``model`` on a geometry, in
    place (module docstring); returns one ``Conversion`` per converted module.

    Args:
        model: any ``nn.Module``; its attention modules are found by structure.
        qk_geometry, vo_geometry: ``"stiefel"`` (frames per head), one of the ten design points
            of DESIGN §4.5 (a base name or its ``"block_"`` variant), or None (left as it is).
        init: ``"nearest"`` (from the existing weights) or ``"random"``.
        block: block variants; None (default) chooses them for the five base geometries under
            GQA/MQA and per-head frames for "stiefel"; True also stacks the query (and output)
            frames of a GQA group; False asks for the plain variants.
        generator: for ``init="random"``.

    Every module is checked (sizes, geometry, rank, the cast point on its manifold) before any
    is changed; ValueError names the module and the measured value otherwise.
    """
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; choose one of {INITS}")
    if block is not None and not isinstance(block, bool):
        raise ValueError(f"block must be True, False or None, got {block!r}")
    for what, geo in (("qk_geometry", qk_geometry), ("vo_geometry", vo_geometry)):
        _resolve_geometry(what, geo, False)
    if qk_geometry is None and vo_geometry is None:
        raise ValueError("nothing to convert: qk_geometry and vo_geometry are both None")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")
    found: list[tuple[str, nn.Module, _Attention]] = []
    for name, m in model.named_modules():
        if any(name.startswith(f"{done}.") or not done for done, _, _ in found):
            continue  # inside an attention module already found
        if isinstance(getattr(m, "_orig_mod", None), nn.Module):
            continue  # torch.compile's wrapper: convert the module it wraps (_orig_mod)
        att = _recognise(name or type(m).__name__, m)
        if att is not None:
            found.append((name, m, att))
    _check_unshared(found)
    if not found:
        raise ValueError(
            f"no attention module found in {type(model).__name__}: recognised are "
            "nn.MultiheadAttention, a fused c_attn/c_proj (GPT-2 Conv1D or nn.Linear) and "
            "q_proj/k_proj/v_proj with o_proj or out_proj (nn.Linear)"
        )
    plans = []
    for name, m, att in found:
        gqa = att.n_kv_heads < att.n_heads
        geometries, blocks = {}, {}
        for product, geo in (("qk", qk_geometry), ("vo", vo_geometry)):
            flag = (gqa and geo != "stiefel") if block is None else block
            geometries[product] = _resolve_geometry(f"{product}_geometry", geo, flag)
            blocks[product] = flag
        plans.append(_plan(name or type(m).__name__, m, att, geometries, blocks, init, generator))
    done = [_apply(plan) for plan in plans]
    moved = [
        c.name
        for c in done
        if c.rotary
        and c.qk_geometry not in (None, "fixed_rank_quotient", "block_fixed_rank_quotient")
    ]
    if moved:
        warnings.warn(
            f"{', '.join(moved)}: the model rotates q and k between projection and product "
            "(rotary embeddings), so the new factors change its logits at every relative "
            "distance ≠ 0 although qk_change, the change of the content product, is "
            f"{max(c.qk_change for c in done if c.name in moved):.1e}; fixed_rank_quotient "
            "keeps the factors and is exact",
            RotaryWarning,
            stacklevel=2,
        )
    return done


def plain_attention(model: nn.Module) -> list[str]:
    """Undo ``riemannian_attention``: every assembled weight becomes a plain parameter again,
    equal to the weight the model read (``remove_parametrizations(..., leave_parametrized=True)``),
    and the frames and points the conversion declared are dropped from ``frame_geometries`` and
    ``point_groups``. Returns the names of the weights made plain."""
    made = []
    for prefix, module in model.named_modules():
        for attr, chain in list(getattr(module, "parametrizations", {}).items()):
            if any(isinstance(p, AssembledWeight) for p in chain):
                parametrize.remove_parametrizations(module, attr, leave_parametrized=True)
                made.append(_join(prefix, attr))
    for module in model.modules():
        for where in ("frame_geometries", "point_groups"):
            declared = module.__dict__.get(where)
            if not declared:
                continue
            for key in list(declared):
                names = [key] if where == "frame_geometries" else declared[key]["params"]
                if "parametrizations." in " ".join(names) and not _all_params(module, names):
                    del declared[key]
    return made


def _all_params(module: nn.Module, names: list[str]) -> bool:
    try:
        return all(module.get_parameter(n) is not None for n in names)
    except AttributeError:
        return False


__all__ = [
    "INITS",
    "PRODUCTS",
    "AssembledWeight",
    "Conversion",
    "RotaryWarning",
    "plain_attention",
    "riemannian_attention",
]
