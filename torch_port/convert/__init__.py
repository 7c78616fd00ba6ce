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

The package: ``structures`` (what is recognised, by attributes and shapes), ``weights`` (per-head
factors in and out of a weight; the parametrization ``AssembledWeight``), ``points`` (the
nearest points, the changes, the biases). It imports torch and ``torch_port`` only (DESIGN §2).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from torch_port.attention_products import _resolve_geometry
from torch_port.convert.points import WIDE, change, map_bias, per_query, product_point
from torch_port.convert.structures import Attention, Slot, check_unshared, recognise
from torch_port.convert.weights import AssembledWeight, linear_view, split, to_heads
from torch_port.nn import RiemannianMultiheadAttention
from torch_port.optim.groups import _join, tag_frame, tag_label
from torch_port.optim.sharding import is_sharded

Tensor = torch.Tensor

#: The two products: (row role, column role). The row role of VO is the output projection.
PRODUCTS = {"qk": ("q", "k"), "vo": ("o", "v")}
INITS = ("nearest", "random")


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


@dataclass
class _Plan:
    """Everything one module's conversion writes, computed before anything is written."""

    name: str
    module: nn.Module
    att: Attention
    dtype: torch.dtype
    old: dict[str, Tensor]  # role -> float64 per-head factors before
    sources: dict[str, tuple[str, tuple[Tensor, ...]]]  # role -> (source, originals, float64)
    kinds: dict[str, tuple[str, ...]]  # product -> factor kinds
    biases: dict[str, tuple[Slot, Tensor]]  # role -> (slot, its new float64 bias (n, k))
    geometries: dict[str, str | None]


def _check_tensors(name: str, att: Attention, roles: set[str]) -> None:
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
    att: Attention,
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
        for role, blk in split(att, slot, linear_view(slot)).items():
            old[role] = to_heads(role, blk.to(WIDE), att.count(role), d, k)
            sources[role] = ("raw", (blk.clone(),))
    biases = {}
    for slot in att.biases:
        for role, v in split(att, slot, getattr(slot.holder, slot.attr).detach()).items():
            biases[role] = (slot, v.to(WIDE).reshape(att.count(role), k))
    new, kinds = {}, {}
    for product, (row, col) in PRODUCTS.items():
        if geometries[product] is None:
            continue
        stored, kinds[product], new[row], new[col] = product_point(
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
            b = map_bias(b, per_query(old[factor], p), per_query(new[factor], p))
        else:
            b = map_bias(b, old[factor].reshape(g, p * d, k), new[factor].reshape(g, p * d, k))
        mapped[role] = (slot, b)
    return _Plan(name, module, att, dtype, old, sources, kinds, mapped, geometries)


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
        labels = {"row": f"W_{row.upper()}", "core": f"S_{product.upper()}"}
        labels["col"] = f"W_{col.upper()}"
        for kind in kinds:  # the names a reader knows, for reports
            tag_label(module.get_parameter(by_kind[kind]), f"{plan.name} {labels[kind]}".strip())
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
        for role, blk in split(att, slot, linear_view(slot)).items():
            now[role] = to_heads(role, blk.to(WIDE), att.count(role), att.d, k)
    p = h // g
    changes = {
        product: change(
            plan.old[row], per_query(plan.old[col], p), now[row], per_query(now[col], p)
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
    _check_unwrapped(model)
    if block is not None and not isinstance(block, bool):
        raise ValueError(f"block must be True, False or None, got {block!r}")
    for what, geo in (("qk_geometry", qk_geometry), ("vo_geometry", vo_geometry)):
        _resolve_geometry(what, geo, False)
    if qk_geometry is None and vo_geometry is None:
        raise ValueError("nothing to convert: qk_geometry and vo_geometry are both None")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")
    found: list[tuple[str, nn.Module, Attention]] = []
    for name, m in model.named_modules():
        if any(name.startswith(f"{done}.") or not done for done, _, _ in found):
            continue  # inside an attention module already found
        if isinstance(getattr(m, "_orig_mod", None), nn.Module):
            continue  # torch.compile's wrapper: convert the module it wraps (_orig_mod)
        att = recognise(name or type(m).__name__, m)
        if att is not None:
            found.append((name, m, att))
    check_unshared(found)
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


def _check_unwrapped(model: nn.Module) -> None:
    """Refuse a model already wrapped for data parallelism: DistributedDataParallel holds the
    parameters it reduces (a weight replaced after wrapping is never reduced: DDP fails at the
    second step), and fully_shard (FSDP2) has made its parameters DTensors (the conversion's
    polar factors and SVDs would run on one rank's shard). Convert first, then wrap."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        wrapper = "DistributedDataParallel"
    else:
        sharded = [n for n, p in model.named_parameters() if is_sharded(p)]
        wrapper = f"fully_shard (parameter {sharded[0]!r} is a DTensor)" if sharded else None
    if wrapper is not None:
        raise ValueError(
            f"{type(model).__name__} is already wrapped by {wrapper}: convert before wrapping, "
            "riemannian_attention(model, ...) and then DistributedDataParallel(model) or "
            "fully_shard(...) (docs/models.md)"
        )


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


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of a converted model in the layout of the model before conversion: each
    assembled weight under its own name (``….c_attn.weight``), equal to the weight the model
    reads, and none of the factors (``….parametrizations.<name>.original<i>``). This is what a
    plain copy of the model loads (``save_pretrained(path, state_dict=plain_state_dict(model))``,
    then ``from_pretrained(path)``); the model itself is not changed and still resumes from its
    own ``state_dict()``."""
    assembled = {}
    for prefix, module in model.named_modules():
        for attr, chain in getattr(module, "parametrizations", {}).items():
            if any(isinstance(p, AssembledWeight) for p in chain):
                assembled[_join(prefix, f"parametrizations.{attr}.")] = (module, attr, prefix)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, value in model.state_dict().items():
            owner = next((v for k, v in assembled.items() if key.startswith(k)), None)
            if owner is None:
                out[key] = value
                continue
            module, attr, prefix = owner
            name = _join(prefix, attr)
            if name not in out:  # in the place of the weight's first factor
                out[name] = getattr(module, attr).detach().clone()
    return out


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
    "plain_state_dict",
    "riemannian_attention",
]
