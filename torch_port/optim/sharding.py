"""Parameters sharded as DTensors (FSDP2's ``fully_shard``): whole points on every rank.

A frame or a point is stepped where it lies when every rank holds whole frames: the parameter
is a ``DTensor`` whose every ``Shard(i)`` placement cuts a leading (batch: layer, head) dimension,
i < ndim − 2, never the rows or columns of a frame. The optimizer then works on the local
shards (``local``), which are points of the same geometry with a smaller batch, and keeps its
state as DTensors of the parameter's mesh and placements (``wrap``), so that
``torch.distributed.checkpoint`` saves every rank's part. A block variant's shards must hold
whole GQA groups (``local_heads``).

A frame sharded along its rows (``Shard(ndim − 2)``, what ``fully_shard`` does by default to a
single 2-D frame) would need every r×r product (WᵀG, the Gram of the retraction, the norms)
summed over the ranks; that is not done here, and such a parameter is refused with its
placement (keep it whole: ``fully_shard(..., ignored_params={p})`` or
``shard_placement_fn=lambda p: Shard(0)`` on a (heads, d, r) tensor).

This module imports torch only (DESIGN §2).
"""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor

try:  # torch.distributed is optional (some builds lack it)
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover - a build without torch.distributed
    DTensor = Replicate = Shard = None  # type: ignore[assignment,misc]


def is_sharded(t: Any) -> bool:
    """Whether t is a DTensor."""
    return DTensor is not None and isinstance(t, DTensor)


def local(t: Tensor) -> Tensor:
    """The rank's local shard of a DTensor (a view that writes through), else t itself."""
    return t.to_local() if is_sharded(t) else t


def check_whole_frames(name: str, p: Tensor, trailing: int = 2) -> None:
    """Refuse a DTensor parameter that does not hold whole frames on each rank: a placement
    other than Replicate or Shard(i) with i < ndim − ``trailing``."""
    if not is_sharded(p):
        return
    for placement in p.placements:
        if isinstance(placement, Replicate):
            continue
        if isinstance(placement, Shard) and placement.dim < p.ndim - trailing:
            continue
        raise ValueError(
            f"{name} is a DTensor with placements {tuple(p.placements)} over shape "
            f"{tuple(p.shape)}: the optimizer steps whole frames on each rank, so only the "
            f"leading (layer/head) dims 0…{p.ndim - trailing - 1} may be sharded (a frame cut "
            "along its rows would need its r×r products summed over ranks, which is not "
            "done); keep it whole with fully_shard(..., ignored_params={p}) or shard a "
            "(heads, d, r) tensor along dim 0"
        )


def local_heads(name: str, row: Tensor, col: Tensor, n_heads: int, n_kv_heads: int) -> tuple:
    """(n_heads, n_kv_heads) of a block point's local shards (row factors (…, h, m, r), column
    factors (…, g, n, r)); ValueError when a shard does not hold whole GQA groups."""
    lh, lg = int(local(row).shape[-3]), int(local(col).shape[-3])
    if not (is_sharded(row) or is_sharded(col)):
        return n_heads, n_kv_heads
    if lg == 0 or lh * n_kv_heads != lg * n_heads:
        raise ValueError(
            f"{name}: this rank holds {lh} query heads and {lg} key/value heads of "
            f"{n_heads} and {n_kv_heads}; a shard must hold whole groups (shard the heads in "
            "multiples of the group size)"
        )
    return lh, lg


def wrap(like: Tensor, value: Tensor) -> Tensor:
    """``value`` (a local tensor whose leading dims follow ``like``'s local shard) as a DTensor
    on ``like``'s mesh and placements; its global shape sums the shards' sizes over the mesh
    (one small all-reduce, made when a state entry is created)."""
    mesh, placements = like.device_mesh, like.placements
    shape = list(value.shape)
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            size = torch.tensor([shape[placement.dim]], dtype=torch.int64, device=value.device)
            torch.distributed.all_reduce(size, group=mesh.get_group(mesh_dim))
            shape[placement.dim] = int(size.item())
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        value.contiguous(),
        mesh,
        placements,
        run_check=False,
        shape=torch.Size(shape),
        stride=stride,
    )


def store(like: Tensor, old: Any, value: Any) -> Any:
    """A state entry for a sharded point: written into ``old``'s local shards when it is a
    DTensor (or a list of them) already, else wrapped like ``like``. The parts of a tangent
    vector (a tuple in a local state) are kept as a list, which
    ``torch.distributed.checkpoint`` walks into (it would store a tuple as one opaque object)."""
    if isinstance(value, tuple):
        olds = old if isinstance(old, list) and len(old) == len(value) else [None] * len(value)
        return [store(like, o, v) for o, v in zip(olds, value, strict=True)]
    if not isinstance(value, Tensor) or value.ndim == 0:
        return value  # the step count: the same on every rank
    if is_sharded(old) and old.to_local().shape == value.shape:
        old.to_local().copy_(value)
        return old
    return wrap(like, value)


def localize(state: Any) -> Any:
    """A state entry (or dict) with every DTensor replaced by its local shard, and the parts
    of a tangent vector (a list in a sharded state, ``store``) as a tuple."""
    if isinstance(state, dict):
        return {k: localize(v) for k, v in state.items()}
    if isinstance(state, tuple | list):
        return tuple(localize(v) for v in state)
    return local(state)


def all_reduce_sum(t: Tensor) -> Tensor:
    """t summed over all ranks (in place), when torch.distributed is initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return t
