"""Which elements of a point the recorder keeps, and how it reads them whole, also under FSDP2.

A point is a batch of elements (frames, or points of a factored geometry) over its leading
``batch`` dims; the recorder keeps ``frames`` of them, evenly spaced, each whole. Under
``fully_shard`` a parameter is a DTensor, and how an element is read depends on its sharding:

- along the batch (heads, layers): this rank holds whole elements. It keeps its own (the
  evenly spaced ones of its shard), numbered by their place in the whole batch, so that the
  files of all ranks together name every frame once;
- inside a block point (its heads): refused (``check_recordable``);
- along the rows d of a frame: each rank holds a slice of every frame. The kept frames are
  gathered, slice by slice, and nothing else: never the whole parameter. Every rank must then
  take part (a collective), so such frames are recorded on every rank;
- a tensor of the whole batch's shape (a replicated per-frame √v) is read by the global indices,
  one of this rank's shard's shape (its local parts) by the local ones.

Only one-dimensional device meshes are read; anything else is refused when recording starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torch_port.optim.sharding import is_sharded, local


def elements_kept(count: int, frames: int | None) -> list[int]:
    """The indices of the elements kept: all, or ``frames`` of them evenly spaced."""
    if frames is None or frames >= count:
        return list(range(count))
    return sorted({round(i * (count - 1) / max(frames - 1, 1)) for i in range(frames)})


def _shard_dims(t: torch.Tensor) -> list[int]:
    return [p.dim for p in t.placements if p.is_shard()]


@dataclass(frozen=True)
class Layout:
    """How one point's tensors are read: its ``batch`` dims (their global shape), the local
    indices of the kept elements on this rank (``local``), their global indices
    (``elements``) and whether they are gathered from slices (``gather``)."""

    n_batch: int
    batch: list[int]
    local: list[int]
    elements: list[int]
    gather: bool

    @classmethod
    def of(cls, point: Any, trailing: int, frames: int | None) -> Layout:
        p = point.params[0]
        x = point.value()[0]  # this rank's parts, as the geometry reads them
        n_batch = x.ndim - trailing
        own = list(x.shape[:n_batch])
        dims = _shard_dims(p) if is_sharded(p) else []
        if len(point.params) == 1 and any(d >= p.ndim - 2 for d in dims):  # a frame's rows
            shape = list(p.shape[:n_batch])  # a DTensor's shape is the global one
            kept = elements_kept(math.prod(shape), frames)
            return cls(n_batch, shape, kept, kept, True)
        kept = elements_kept(math.prod(own), frames) if math.prod(own) else []
        if not any(d < n_batch for d in dims):  # the batch is whole on this rank
            return cls(n_batch, own, kept, kept, False)
        # whole elements of a shard of the batch (heads, layers): numbered in the whole batch
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        shape = [int(p.shape[i]) if i in dims else own[i] for i in range(n_batch)]
        where = np.unravel_index(kept, own) if kept else ()
        moved = tuple(w + o for w, o in zip(where, offset[:n_batch], strict=False))
        glob = np.ravel_multi_index(moved, shape).tolist() if kept else []
        return cls(n_batch, shape, kept, [int(e) for e in glob], False)

    def value(self, point: Any) -> tuple[torch.Tensor, ...]:
        """The point's parts (the DTensors themselves when slices are gathered)."""
        return tuple(q.detach() for q in point.params) if self.gather else point.value()

    def grad(self, point: Any) -> tuple[torch.Tensor, ...]:
        if not self.gather:
            return point.grad()
        return tuple(
            torch.zeros_like(q) if q.grad is None else q.grad.detach() for q in point.params
        )

    def kept_of(self, t: torch.Tensor) -> torch.Tensor:
        """The kept elements of t, whole: (elements, *trailing)."""
        if is_sharded(t) and any(d >= self.n_batch for d in _shard_dims(t)):
            return self._gathered(t)
        t = local(t)
        whole = list(t.shape[: self.n_batch]) == self.batch  # replicated, or not sharded
        flat = t.reshape(-1, *t.shape[self.n_batch :]) if self.n_batch else t[None]
        index = self.elements if whole else self.local
        # every element: the tensor itself (a view; the recorder's ``_array`` makes the copy)
        return flat if index == list(range(len(flat))) else flat[index]

    def _gathered(self, t: Any) -> torch.Tensor:
        """The kept elements of a DTensor sliced along a trailing dim: this rank's slices of
        them, gathered from every rank (padded to the largest slice: torch.chunk's sizes, as
        ``Shard`` splits) and joined."""
        sharded = _shard_dims(t)[0]
        dim = sharded - self.n_batch + 1  # in (elements, *trailing)
        group = t.device_mesh.get_group(0)
        world = torch.distributed.get_world_size(group)
        sizes = [len(c) for c in torch.empty(t.shape[sharded], device="meta").chunk(world)]
        sizes += [0] * (world - len(sizes))
        mine = local(t)
        mine = mine.reshape(-1, *mine.shape[self.n_batch :]) if self.n_batch else mine[None]
        mine = mine[self.local]
        padded = mine.new_zeros((*mine.shape[:dim], max(sizes), *mine.shape[dim + 1 :]))
        padded.narrow(dim, 0, mine.shape[dim]).copy_(mine)
        pieces = [torch.empty_like(padded) for _ in range(world)]
        torch.distributed.all_gather(pieces, padded, group=group)
        return torch.cat([q.narrow(dim, 0, n) for q, n in zip(pieces, sizes, strict=True)], dim)


def check_recordable(point: Any, geometry: str, layout: Layout, ranks: Any) -> None:
    """ValueError when a point's sharding is one the recorder cannot read: a device mesh of
    more than one dimension, a block point whose heads are sharded (each rank's shard is a
    point of a smaller block geometry, whose state the recorder does not yet map), or frames
    sliced along their rows, which every rank gathers, recorded on some ranks only."""
    if layout.gather and ranks is not None:
        raise ValueError(
            "frames sharded along their rows are gathered by every rank (a collective): "
            "record them on every rank (ranks=None)"
        )
    for p in point.params:
        if not is_sharded(p):
            continue
        if p.device_mesh.ndim != 1:
            raise ValueError(
                f"a parameter on a {p.device_mesh.ndim}-dimensional device mesh: the recorder "
                "reads shards of one-dimensional meshes"
            )
        if geometry.startswith("block_"):
            raise ValueError(
                f"a {geometry!r} point sharded along its heads: the recorder keeps whole "
                "points, and does not yet read a block point's shards (record the frames, "
                "or keep block points unsharded)"
            )
