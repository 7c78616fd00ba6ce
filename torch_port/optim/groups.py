"""Parameter groups of a whole model: which parameters lie on which geometry (DESIGN §7).

A module declares its manifold parameters (``torch_port.nn.RiemannianMultiheadAttention``
does): frames in a ``frame_geometries`` dict (local name -> geometry), the factors of one point
of a factored geometry in a ``point_groups`` dict, or a parameter tagged by ``tag_frame``.
``parameter_groups`` turns those declarations into optimizer parameter groups (one per point,
one per geometry for the other frames, one plain group), the role of optax's ``partition``;
``build_optimizer`` makes the optimizer of a model from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from torch_port.linalg import Tensor
from torch_port.optim.presets import RiemannianAdam

#: The attribute that tags a parameter with its geometry (read by ``build_optimizer``).
GEOMETRY_ATTR = "_rattn_geometry"
#: The attribute that names a parameter as its user knows it (``tag_label``).
LABEL_ATTR = "_rattn_label"


def tag_frame(param: nn.Parameter, geometry: str = "stiefel") -> nn.Parameter:
    """Mark ``param`` as a (batch of) point(s) of ``geometry`` for ``build_optimizer``.

    The tag is an attribute of the parameter: ``torch.save``/``torch.load`` and ``module.to``
    keep it, ``copy.deepcopy`` does not (torch copies a parameter's data, not its attributes).
    A module that owns frames should also list them in a ``frame_geometries`` dict (local name
    -> geometry), as ``RiemannianMultiheadAttention`` does; that survives a deepcopy. The
    factors of one point of a factored geometry are declared in a ``point_groups`` dict
    instead (module docstring)."""
    setattr(param, GEOMETRY_ATTR, geometry)
    return param


def tag_label(param: nn.Parameter, label: str) -> nn.Parameter:
    """Name ``param`` as its user knows it (e.g. ``"transformer.h.0.attn W_Q"`` for the query
    factor a conversion made), for reports such as ``rattn audit``'s rows; an attribute, kept
    as ``tag_frame``'s is."""
    setattr(param, LABEL_ATTR, label)
    return param


def label_of(param: Tensor) -> str | None:
    """The label ``tag_label`` gave ``param`` (None without one)."""
    return getattr(param, LABEL_ATTR, None)


def frame_geometry(param: Tensor) -> str | None:
    """The geometry a parameter was tagged with by ``tag_frame`` (None for a plain one)."""
    return getattr(param, GEOMETRY_ATTR, None)


def _join(prefix: str, local: str) -> str:
    return f"{prefix}.{local}" if prefix else local


def _declared(module: nn.Module, prefix: str, local: str, where: str) -> None:
    """A name a module declares in ``frame_geometries`` or ``point_groups`` is one of its
    parameters; ValueError otherwise (e.g. left behind by ``remove_parametrizations``)."""
    try:
        module.get_parameter(local)
    except AttributeError:
        raise ValueError(
            f"{_join(prefix, local) or local!r} is declared in {where} of "
            f"{prefix or type(module).__name__!r} but is no parameter of it (a declaration left "
            "behind, e.g. by remove_parametrizations: use torch_port.convert.plain_attention)"
        ) from None


def manifold_points(model: nn.Module) -> list[dict[str, Any]]:
    """Every point declared in a submodule's ``point_groups``, as the optimizer group without its
    tensors: ``{"geometry", "param_names" (full names, factor order), options...}``."""
    found = []
    for prefix, module in model.named_modules():
        for spec in getattr(module, "point_groups", {}).values():
            for local in spec["params"]:
                _declared(module, prefix, local, "point_groups")
            entry = {k: v for k, v in spec.items() if k != "params"}
            entry["param_names"] = [_join(prefix, n) for n in spec["params"]]
            found.append(entry)
    return found


def frame_parameters(model: nn.Module) -> dict[str, str]:
    """Full parameter name -> geometry for every parameter on a manifold: the frames listed in
    a submodule's ``frame_geometries``, the factors of the points in its ``point_groups`` (with
    the point's geometry) and the parameters tagged by ``tag_frame``."""
    found: dict[str, str] = {}
    for prefix, module in model.named_modules():
        for local, geometry in getattr(module, "frame_geometries", {}).items():
            _declared(module, prefix, local, "frame_geometries")
            found[_join(prefix, local)] = geometry
    for point in manifold_points(model):
        for name in point["param_names"]:
            found[name] = point["geometry"]
    for name, param in model.named_parameters():
        tag = frame_geometry(param)
        if tag is not None:
            found.setdefault(name, tag)
    return found


#: Module types whose parameters the usual rule keeps out of weight decay (with every parameter
#: of fewer than 2 dimensions: biases, gains). A class whose name ends in "Norm" (e.g. a
#: model's own RMSNorm) counts as a norm.
NO_DECAY_MODULES: tuple[type[nn.Module], ...] = (
    nn.Embedding,
    nn.EmbeddingBag,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.LocalResponseNorm,
    nn.modules.batchnorm._NormBase,
)

NoDecay = bool | Iterable[str] | Callable[[str, Tensor], bool]


def usual_no_decay(model: nn.Module) -> set[str]:
    """The names of the parameters that GPT-style training keeps out of weight decay: every
    parameter with ndim < 2 (biases, norm gains), every parameter of an embedding or norm
    module (``NO_DECAY_MODULES``, or a class named ``*Norm``) and those a module lists in its
    ``no_decay_parameters`` (local names; e.g. the per-head biases of
    ``RiemannianMultiheadAttention``, of shape (heads, head_dim))."""
    names = set()
    for prefix, module in model.named_modules():
        owned = isinstance(module, NO_DECAY_MODULES) or type(module).__name__.endswith("Norm")
        listed = getattr(module, "no_decay_parameters", ())
        for local, param in module.named_parameters(recurse=False):
            if owned or param.ndim < 2 or local in listed:
                names.add(_join(prefix, local))
    return names


def _no_decay_rule(model: nn.Module, no_decay: NoDecay) -> Callable[[str, Tensor], bool]:
    """``no_decay`` as a predicate on (full name, parameter)."""
    if no_decay is True:
        names = usual_no_decay(model)
        return lambda name, _: name in names
    if no_decay is False or no_decay is None:
        return lambda name, _: False
    if callable(no_decay):
        return no_decay
    if isinstance(no_decay, str) or not isinstance(no_decay, Iterable):
        raise ValueError(
            "no_decay must be True, False, parameter names or a predicate (name, param) -> "
            f"bool, got {no_decay!r}"
        )
    names = set(no_decay)
    every = dict(model.named_parameters(remove_duplicate=False))  # tied aliases too
    unknown = names - set(every)
    if unknown:
        raise ValueError(f"no_decay names parameters the model does not have: {sorted(unknown)}")
    chosen = {id(every[n]) for n in names}
    return lambda _, param: id(param) in chosen


def _point_group(model: nn.Module, point: dict[str, Any]) -> dict[str, Any] | None:
    """The optimizer group of one declared point (params resolved in factor order), or None when
    none of its factors requires a gradient; a partly frozen point is refused."""
    params = [model.get_parameter(n) for n in point["param_names"]]
    frozen = [n for n, p in zip(point["param_names"], params, strict=True) if not p.requires_grad]
    if len(frozen) == len(params):
        return None
    if frozen:
        raise ValueError(
            f"the {point['geometry']} point {point['param_names']} is partly frozen ({frozen} "
            "do not require grad); a point is updated as a whole: freeze all of its factors or "
            "none"
        )
    return {**point, "params": params}


def build_optimizer(
    model: nn.Module,
    optimizer_cls: type[torch.optim.Optimizer] = RiemannianAdam,
    *,
    frame_options: dict[str, Any] | None = None,
    plain_options: dict[str, Any] | None = None,
    geometry_options: dict[str, dict[str, Any]] | None = None,
    no_decay: NoDecay = True,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """``optimizer_cls(parameter_groups(model, ...), **kwargs)``: the optimizer of ``model``
    with the groups of ``parameter_groups`` and the optimizer's defaults from ``kwargs`` (e.g.
    ``lr``, ``weight_decay`` of the plain group)."""
    groups = parameter_groups(
        model,
        frame_options=frame_options,
        plain_options=plain_options,
        geometry_options=geometry_options,
        no_decay=no_decay,
    )
    return optimizer_cls(groups, **kwargs)


def parameter_groups(
    model: nn.Module,
    *,
    frame_options: dict[str, Any] | None = None,
    plain_options: dict[str, Any] | None = None,
    geometry_options: dict[str, dict[str, Any]] | None = None,
    no_decay: NoDecay = True,
) -> list[dict[str, Any]]:
    """The optimizer groups of ``model``: one parameter group per declared point, one per
    geometry for the other frames of ``model``, and one plain group (AdamW, decoupled decay) for
    the rest, split in two by ``no_decay``.

    A point declared in a submodule's ``point_groups`` (the ten design points of the attention
    module) gets ONE group: its factors in factor order, ``"geometry"``, the block options
    (``"n_heads"``, ``"n_kv_heads"``). Frames listed in ``frame_geometries`` or tagged by
    ``tag_frame`` are grouped by geometry as before. Groups come in the order of their first
    parameter in ``named_parameters``, the plain group last. Parameters without
    ``requires_grad`` are left out (a point only as a whole), empty groups are not made.
    Geometry groups get ``weight_decay=0``: on frames (Stiefel, P1, P2, P3 and their block
    variants) decay does nothing (RA-5; asking for it would only warn), and on the fixed-rank
    factors (R1, R2) it would scale the stored factors, which is not decay of the product W;
    ``geometry_options={"fixed_rank_embedded": {"weight_decay": λ}}`` asks for that coupled
    factor decay explicitly. Then ``frame_options`` (e.g. ``{"trust_radius": 0.1}``), then
    ``geometry_options[name]`` for that geometry (e.g. ``{"fixed_rank_quotient": {"metric":
    "balanced"}}`` or ``{"stiefel": {"retraction": "qr"}}``); the plain group gets
    ``plain_options`` (e.g. its own ``lr``); the optimizer's defaults fill the rest. Every
    group carries ``"param_names"``, so error messages name the parameter.

    ``no_decay`` picks the plain parameters that get ``weight_decay=0`` in a second plain group
    (last): True (default) the usual rule of GPT training (``usual_no_decay``: biases, norms,
    embeddings, ndim < 2), False none, or the full names, or a predicate ``(name, param) ->
    bool``.
    """
    frames = frame_parameters(model)
    owner: dict[int, dict[str, Any]] = {}
    for point in manifold_points(model):
        group = _point_group(model, point)
        for p in [] if group is None else group["params"]:
            owner[id(p)] = group
    ordered: list[dict[str, Any]] = []  # geometry groups, by first parameter
    by_geometry: dict[str, dict[str, Any]] = {}
    plain: dict[str, Any] = {"params": [], "param_names": []}
    undecayed: dict[str, Any] = {"params": [], "param_names": []}
    excluded = _no_decay_rule(model, no_decay)
    for name, param in model.named_parameters():
        if id(param) in owner:
            group = owner[id(param)]
            if not any(group is g for g in ordered):
                ordered.append(group)
            continue
        if not param.requires_grad:
            continue
        geometry = frames.get(name)
        if geometry is None:
            target = undecayed if excluded(name, param) else plain
        else:
            if geometry not in by_geometry:
                by_geometry[geometry] = {"params": [], "param_names": [], "geometry": geometry}
                ordered.append(by_geometry[geometry])
            target = by_geometry[geometry]
        target["params"].append(param)
        target["param_names"].append(name)
    groups = [
        {
            **g,
            "weight_decay": 0.0,
            **(frame_options or {}),
            **(geometry_options or {}).get(g["geometry"], {}),
        }
        for g in ordered
    ]
    if plain["params"]:
        groups.append({**plain, **(plain_options or {})})
    if undecayed["params"]:
        groups.append({**undecayed, **(plain_options or {}), "weight_decay": 0.0})
    if not groups:
        raise ValueError("the model has no trainable parameters")
    return groups


def frame_groups(optimizer: torch.optim.Optimizer) -> Iterable[dict[str, Any]]:
    """The parameter groups of ``optimizer`` that hold frames or points (a ``"geometry"``)."""
    return [g for g in optimizer.param_groups if g.get("geometry") is not None]
