"""Parameters sharded as DTensors (FSDP2's ``fully_shard``): frames stepped where they lie.

Two layouts are stepped without gathering a frame. (1) Every ``Shard(i)`` placement cuts a
leading (batch: layer, head) dimension, i < ndim − 2: each rank holds whole frames and whole
points, which are points of the same geometry with a smaller batch (``local``); a block
variant's shards must hold whole GQA groups (``local_heads``). (2) A Stiefel frame whose rows
are sharded, ``Shard(ndim − 2)`` (what ``fully_shard`` does to a single (d, r) frame): each rank
holds some rows of every frame, and ``RowShardedFrames`` sums every r×r product WᵀZ and every
squared norm over the ranks of that mesh dimension, one all-reduce of r×r matrices (or of
scalars) each, so that all ranks take the same step on their rows. In both the optimizer keeps
its state as DTensors on the parameter's mesh (``wrap``, ``store``), so that
``torch.distributed.checkpoint`` saves every rank's part.

Refused with the placement: columns sharded (dim −1), rows of the factors of the ten design
points (their QR and SVD of d×2r matrices are not distributed here), and row-sharded frames
under a retraction other than "polar" or the canonical metric.

This module imports torch and ``torch_port`` only (DESIGN §2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_port import deferred, linalg
from torch_port.geometry import default_atol
from torch_port.linalg import sym, transpose
from torch_port.stiefel import LazyProduct, StiefelFrames

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


def row_group(p: Tensor) -> Any:
    """The process group over which the rows of p's frames are sharded (``Shard(ndim − 2)``),
    or None."""
    if not is_sharded(p):
        return None
    for mesh_dim, placement in enumerate(p.placements):
        if isinstance(placement, Shard) and placement.dim == p.ndim - 2:
            return p.device_mesh.get_group(mesh_dim)
    return None


class RowShardedFrames(StiefelFrames):
    """St(d, r) for frames (..., d, r) whose rows are sharded over a process group (each rank
    holds rows of every frame, the embedded metric, the polar retraction): the operations of
    ``StiefelFrames`` with every r×r product WᵀZ and every squared Frobenius norm summed over
    the group (``torch.distributed.all_reduce``, r×r matrices or scalars, never a frame).

    P_W(G) = G − W sym(Σ_ranks W_iᵀG_i); ‖u‖² = Σ_ranks ‖u_i‖²; polar(A) = A (Σ_ranks
    A_iᵀA_i)^{-1/2} (the Gram routes of ``linalg.polar_plan``); P_Y(m) likewise."""

    def __init__(self, st: Any, group: Any, all_reduce: Callable[[Tensor], Any] | None = None):
        """``all_reduce(t)`` sums t over the group in place: ``torch.distributed.all_reduce``
        over ``group`` unless given (a simulation of the ranks in one process)."""
        super().__init__(st)
        self.group = group
        self._all_reduce = all_reduce
        self.reduce = self._sum
        self.retraction_checks_finite = True  # polar_plan refuses non-finite Grams

    def _sum(self, t: Tensor) -> Tensor:
        if self._all_reduce is None:  # looked up at each call, as torch.distributed's hooks are
            torch.distributed.all_reduce(t, group=self.group)
        else:
            self._all_reduce(t)
        return t

    def _inner(self, a: Tensor, b: Tensor) -> Tensor:
        """Σ_ranks a_iᵀ b_i, r×r per frame, of (n, d_i, r) batches."""
        return self._sum(transpose(a) @ b)

    def check_point(self, x: Sequence[Tensor], atol: float | None = None) -> None:
        w = x[0]
        atol = default_atol(w.dtype) if atol is None else float(atol)
        gram = self._sum(linalg.gram64(w))
        res = linalg.frobenius(gram - linalg.eye_like(gram))
        off = ~(res <= atol)  # NaN counts as off
        if bool(off.any()):
            raise ValueError(
                f"point is off St({self.st.d}, {self.st.r}) (rows sharded): ‖WᵀW − I‖ = "
                f"{float(res.max()):.3e} > {atol:.1e} ({int(off.sum())} of {res.numel()} "
                "frames off)"
            )

    def _projected(self, w: Tensor, z: Tensor, out: Tensor | None = None) -> Tensor:
        """Z − W sym(Σ_ranks W_iᵀZ_i), into ``out`` (contiguous, Z's shape) when given."""
        w3, z3 = self._flat(w), self._flat(z)
        s = sym(self._inner(w3, z3))
        if not deferred.holds(torch.isfinite(s).all()):
            raise ValueError(f"WᵀZ of a row-sharded frame is not finite in {z.dtype}")
        if out is None:
            return torch.baddbmm(z3, w3, s, alpha=-1.0).reshape(z.shape)
        torch.baddbmm(z3, w3, s, alpha=-1.0, out=self._flat(out))
        return out

    def egrad_to_rgrad(self, x: Sequence[Tensor], g: Sequence[Tensor]) -> tuple[Tensor]:
        out = self._rgrad_buffer(x[0], g[0])
        return (self._projected(x[0], g[0], out),)

    def proj_tangent(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor]:
        return (self._projected(x[0], u[0]),)

    def transport(self, x: Sequence[Tensor], y: Sequence[Tensor], u: Sequence[Tensor]) -> tuple:
        return (self._projected(y[0], u[0]),)

    def frame_norms(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> Tensor:
        squares = torch.sum(u[0].to(torch.float64) ** 2, dim=(-2, -1))
        return torch.sqrt(self._sum(squares)).to(u[0].dtype)

    def retract(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor]:
        return self.retract_scaled(x, u, torch.ones(x[0].shape[:-2], dtype=x[0].dtype))

    def transport_owned(self, x: Sequence[Tensor], y: Sequence[Any], u: Sequence[Tensor]) -> tuple:
        """P_Y(m) = m − Y sym(Σ_ranks Y_iᵀm_i) into m; for a lazy Y = A H, YᵀM = H (AᵀM)."""
        m, yy = u[0].contiguous(), y[0]
        m3 = self._flat(m)
        if isinstance(yy, LazyProduct):
            basis, h3 = self._flat(yy.a), self._flat(yy.h)
            c = h3 @ sym(h3 @ self._inner(basis, m3))
        else:
            basis = self._flat(yy)
            c = sym(self._inner(basis, m3))
        if not deferred.holds(torch.isfinite(c).all()):
            raise ValueError(f"Yᵀm of a row-sharded frame is not finite in {m.dtype}")
        m3.baddbmm_(basis, c, alpha=-1.0)
        return (m,)


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
    mesh = like.device_mesh
    # A per-frame scalar (no row or column dims) of a row-sharded frame is the same on every
    # rank: replicated over that mesh dimension.
    placements = [
        Replicate()
        if isinstance(pl, Shard) and pl.dim >= like.ndim - 2 and value.ndim < like.ndim
        else pl
        for pl in like.placements
    ]
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
