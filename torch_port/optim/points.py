"""The points of an optimizer's parameter groups, and putting them back on their manifolds.

One path for every geometry: a group names its geometry, ``Geometries.points`` gives the group's
points, each a ``Point`` (the parameters holding it and the ``PointGeometry`` that acts on it).
A Stiefel group holds one point per parameter (a batch of frames, ``StiefelFrames``); a group of
one of the ten design points holds one point whose factors are the group's parameters, in order.
A group with ``"gradient": "euclidean"`` sees its points through ``Ambient``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from torch_port import linalg
from torch_port.geometries import GEOMETRIES, PLAIN
from torch_port.geometry import Ambient, PointGeometry
from torch_port.linalg import Tensor
from torch_port.optim.sharding import RowShardedFrames, is_sharded, local, local_heads, row_group
from torch_port.stiefel import Stiefel, StiefelFrames

GRADIENTS = ("riemannian", "euclidean")


class Point:
    """One batched point of a parameter group: the parameters holding its factors, where they
    sit (group index, parameter indices), and the geometry acting on it."""

    def __init__(self, geometry: PointGeometry, params: Sequence[Tensor], gi: int, pis):
        self.geometry = geometry
        self.params = list(params)
        self.gi, self.pis = gi, list(pis)

    @property
    def key(self) -> Tensor:
        """The parameter whose ``state`` entry holds the point's state (its first factor)."""
        return self.params[0]

    @property
    def single(self) -> bool:
        """One parameter holds the point: its tangent state is stored as a tensor, not a tuple
        (torch's layout for a Stiefel parameter)."""
        return len(self.params) == 1

    @property
    def sharded(self) -> bool:
        """Its parameters are DTensors: the point is this rank's shard (``optim.sharding``)."""
        return is_sharded(self.params[0])

    def value(self) -> tuple[Tensor, ...]:
        return self.geometry.from_params(tuple(local(p.detach()) for p in self.params))

    def grad(self) -> tuple[Tensor, ...]:
        g = tuple(
            torch.zeros_like(local(p)) if p.grad is None else local(p.grad.detach())
            for p in self.params
        )
        return self.geometry.from_params(g)

    def write(self, values: Sequence[Any]) -> None:
        """Write new factors (in the parameters' layout) into the parameters (their local
        shards), in place."""
        for p, v in zip(self.params, values, strict=True):
            target = local(p)
            if hasattr(v, "write_into"):  # a lazy product (StiefelFrames.retract_scaled)
                v.write_into(target)
            else:
                target.copy_(v)

    def unpack(self, y: Sequence[Any]) -> tuple[Any, ...]:
        return self.geometry.to_params(tuple(y))


class Geometries:
    """The geometries of parameter groups, built from the groups' shapes and options and
    cached, and the points of a group."""

    def __init__(self) -> None:
        self._cache: dict[tuple, Any] = {}

    def forget(self) -> None:
        """Drop the cached geometries, and with them the d×r buffers they keep between steps
        (``StiefelFrames``): after a state is loaded, a buffer kept for the next gradient may be
        a tensor the loaded state holds."""
        self._cache.clear()

    def stiefel_spec(self, group: dict[str, Any], p: Tensor) -> dict[str, Any]:
        """How the Stiefel geometry of a parameter of a group is built: its name, sizes and
        options (``spec``)."""
        return {
            "name": "stiefel",
            "sizes": {"d": int(p.shape[-2]), "r": int(p.shape[-1])},
            "options": {
                "retraction": group.get("retraction", "polar"),
                "metric": group.get("metric", "embedded"),
            },
        }

    def stiefel(self, group: dict[str, Any], p: Tensor) -> StiefelFrames:
        """The frames' geometry of p; ``RowShardedFrames`` when p's rows are sharded."""
        spec = self.stiefel_spec(group, p)
        rows = row_group(p)
        key = ("stiefel", *spec["sizes"].values(), *spec["options"].values(), id(rows))
        if key not in self._cache:
            st = Stiefel(*spec["sizes"].values(), **spec["options"])
            self._cache[key] = StiefelFrames(st) if rows is None else RowShardedFrames(st, rows)
        return self._cache[key]

    def factored_spec(self, group: dict[str, Any]) -> dict[str, Any]:
        """How the geometry of a group of factors is built, from the parameters' shapes and the
        group's options: its name, sizes (m, n, r) and options; ValueError on a group whose
        parameters do not fit one."""
        name = group["geometry"]
        params = [local(p) for p in group["params"]]
        block = name.startswith("block_")
        kinds = PLAIN[name.removeprefix("block_")].point_kinds
        label = f"a {name!r} group"
        if len(params) != len(kinds):
            raise ValueError(
                f"{label} holds the factors of one point, in order ({len(kinds)} parameters: "
                f"{', '.join(kinds)} factors), got {len(params)} parameters"
            )
        lead = 3 if block else 2
        for p in params:
            if p.ndim < lead:
                raise ValueError(f"{label}: a factor of shape {tuple(p.shape)} has too few dims")
        if len({p.dtype for p in params}) > 1 or len({p.device for p in params}) > 1:
            raise ValueError(f"{label}: the factors must share one dtype and one device")
        row = params[kinds.index("row")]
        col = params[kinds.index("col")]
        sizes = {"m": int(row.shape[-2]), "n": int(col.shape[-2]), "r": int(row.shape[-1])}
        for k, v in sizes.items():
            if k in group and group[k] != v:
                raise ValueError(f"{label}: {k}={group[k]!r} given, but the shapes say {k}={v}")
        options: dict[str, Any] = {}
        for k in ("retraction", "metric"):
            if k in group:
                options[k] = group[k]
        if block:
            whole = group["params"]
            n_heads = int(group.get("n_heads", whole[kinds.index("row")].shape[-3]))
            n_kv_heads = int(group.get("n_kv_heads", whole[kinds.index("col")].shape[-3]))
            options["n_heads"], options["n_kv_heads"] = local_heads(
                label, whole[kinds.index("row")], whole[kinds.index("col")], n_heads, n_kv_heads
            )
            if group.get("pattern") is not None:
                if any(is_sharded(p) for p in whole):
                    raise ValueError(f"{label}: an explicit pattern cannot be sharded")
                options["pattern"] = tuple(tuple(int(i) for i in e) for e in group["pattern"])
            options["groups"] = group.get("groups", "components")
        return {"name": name, "sizes": sizes, "options": options}

    def factored(self, group: dict[str, Any]) -> PointGeometry:
        """The geometry of a group of factors (``factored_spec``), cached; raises ValueError on a
        group that does not fit it."""
        spec = self.factored_spec(group)
        name, sizes, options = spec["name"], spec["sizes"], spec["options"]
        params = [local(p) for p in group["params"]]
        block = name.startswith("block_")
        label = f"a {name!r} group"
        key = (name, tuple(tuple(p.shape) for p in params), tuple(sorted(options.items())))
        if key in self._cache:
            return self._cache[key]
        try:
            geometry = GEOMETRIES[name](sizes["m"], sizes["n"], sizes["r"], **options)
        except TypeError as err:
            raise ValueError(f"{label}: {err}") from None
        expected = geometry.head_shapes() if block else geometry.point_shapes
        batches = set()
        for p, shape in zip(params, expected, strict=True):
            k = len(shape)
            if tuple(p.shape[p.ndim - k :]) != tuple(shape):
                raise ValueError(
                    f"{label}: expected factors of trailing shapes {list(expected)}, got "
                    f"{[tuple(q.shape) for q in params]}"
                )
            batches.add(tuple(p.shape[: p.ndim - k]))
        if len(batches) > 1:
            raise ValueError(
                f"{label}: the factors' batch shapes differ: {[tuple(q.shape) for q in params]}"
            )
        self._cache[key] = geometry
        return geometry

    def points(self, gi: int, group: dict[str, Any], all_: bool = False) -> list[Point]:
        """The points of a geometry group that have a gradient (every point with ``all_``):
        each parameter of a Stiefel group, or the group's one point when any of its factors has
        a gradient (a factor without one counts as zero)."""
        params = group["params"]
        ambient = group.get("gradient", "riemannian") == "euclidean"

        def view(geometry: PointGeometry) -> PointGeometry:
            return Ambient(geometry) if ambient else geometry

        if group["geometry"] == "stiefel":
            return [
                Point(view(self.stiefel(group, p)), [p], gi, [pi])
                for pi, p in enumerate(params)
                if all_ or p.grad is not None
            ]
        if not all_ and all(p.grad is None for p in params):
            return []
        return [Point(view(self.factored(group)), params, gi, range(len(params)))]


def closure_loss(closure: Any) -> Any:
    """The loss a step's closure returns, evaluated with gradients enabled (None without one),
    as torch's optimizers evaluate it."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def stepping(param_groups: list[dict[str, Any]]) -> list[tuple[int, int, Tensor]]:
    """What a step updates: (group index, index in the group, parameter) of every parameter
    that has a gradient, in the groups' order."""
    return [
        (gi, pi, p)
        for gi, group in enumerate(param_groups)
        for pi, p in enumerate(group["params"])
        if p.grad is not None
    ]


@torch.no_grad()
def reproject(param_groups: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Put every point of the geometry groups back on its manifold, in place, and return the
    largest orthonormality residual ‖FᵀF − I‖ found before, per group (``"param_groups[i]"``).

    Each orthonormal factor F (a Stiefel frame; U and V of R1, P1, P2, P3; the stacked factors
    of a block variant) becomes polar(F) = F(FᵀF)^{-1/2}, the nearest frame in Frobenius norm,
    computed in float64 and cast back to F's dtype; the other factors (S of R1, R2's A and B)
    are left as they are. Use it after a dtype cast (``model.to(torch.float64)`` of a model
    built in float32 leaves frames off St by float32 rounding, which the optimizer refuses) or
    after loading weights made elsewhere; ``param_groups`` are those given to an optimizer (or
    ``torch_port.nn.parameter_groups(model)``). Groups without a geometry are skipped."""
    geometries = Geometries()
    worst: dict[str, float] = {}
    for gi, group in enumerate(param_groups):
        if group.get("geometry") is None:
            continue
        group = {**group, "params": list(group["params"])}
        for point in geometries.points(gi, group, all_=True):
            x = list(point.value())
            for i in point.geometry.orthonormal_factors:
                res = float(linalg.orthonormality_residual(x[i]).max()) if x[i].numel() else 0.0
                worst[f"param_groups[{gi}]"] = max(worst.get(f"param_groups[{gi}]", 0.0), res)
                x[i] = linalg.polar(x[i].to(torch.float64)).to(x[i].dtype)
            point.write(point.unpack(tuple(x)))
    return worst
