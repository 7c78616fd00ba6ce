"""The guard's checks of a parameter group: its hyperparameters, its structure (geometry,
options, the layout of its parameters) and its points, each with the names its user knows."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from torch_port.geometries import GEOMETRIES
from torch_port.linalg import Tensor
from torch_port.optim.guard import values
from torch_port.optim.points import GRADIENTS, Geometries, Point
from torch_port.stiefel import METRICS, RETRACTIONS


class GroupChecks:
    """A part of the guard (``torch_port.optim.guard.Guard``): the checks of one group."""

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    _geometries: Geometries
    rule: Callable[[dict[str, Any]], Any]

    #: The hyperparameters of this optimizer beyond ``ChainOptimizer``'s, each with its check
    #: (``values.one_of``, ``values.optional`` build them), run in this order.
    HYPERPARAMETERS: ClassVar[dict[str, Callable[[str, Any], Any]]] = {}

    #: Group entries that belong to the optimizer, not the group: how its step runs, fixed at
    #: construction and the same in every group. A load and the step take them from
    #: ``defaults`` (Dynamo sets ``capturable=True`` in the groups of a step it traces).
    _OWN_ENTRIES: tuple[str, ...] = ()

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        """ChainOptimizer's hyperparameters, the capturable step's constraints where it is on,
        then ``HYPERPARAMETERS``. lr = 0 is a value a group may hold: a warm-up from zero, a
        schedule that ends there, torch.distributed.checkpoint's state-making step. A tensor
        lr is here where its value is not read on the host (the capturable step checks it on
        the device): only its layout is checked."""
        if isinstance(group["lr"], torch.Tensor):
            values.tensor_lr(group["lr"], read=False)
        else:
            values.nonnegative("lr", group["lr"])
        values.torch_flags(group, capturable="capturable" in self.defaults)
        values.betas(group["betas"])
        values.nonnegative("eps", group["eps"])
        values.nonnegative("weight_decay", group["weight_decay"])
        values.optional(values.positive)("trust_radius", group.get("trust_radius"))
        if self.defaults.get("capturable"):
            values.capturable_group(group)
        for key, check in self.HYPERPARAMETERS.items():
            check(key, group[key])

    def _in_use(self, group: dict[str, Any]) -> dict[str, Any]:
        """The group with the optimizer's own entries taken from ``defaults``."""
        return {**group, **{k: self.defaults[k] for k in self._OWN_ENTRIES}}

    def _check_structure(self, gi: int, group: dict[str, Any], adding: bool) -> None:
        """The group's own entries (when it is added), the layout of its parameters, its
        geometry and that geometry's options, and that its chain can be built; warns, when
        the group is added, of weight decay on frames."""
        if adding:
            for key in self._OWN_ENTRIES:
                if group[key] != self.defaults[key]:
                    raise ValueError(f"{key} must be the same for every parameter group")
        values.parameter_layouts(group, group["params"])
        seen: dict[int, int] = {}
        for pi, p in enumerate(group["params"]):
            if id(p) in seen:  # torch only warns; the parameter would step twice per step
                raise ValueError(
                    f"a parameter group lists the same parameter twice (params[{seen[id(p)]}] "
                    f"and params[{pi}], shape {tuple(p.shape)})"
                )
            seen[id(p)] = pi
        name = group.get("geometry")
        if name is None:
            values.plain_eps(group)
            return
        rows = (
            name == "stiefel"
            and group.get("retraction", "polar") == "polar"
            and group.get("metric", "embedded") == "embedded"
            and group.get("gradient", "riemannian") == "riemannian"
        )
        for pi, p in enumerate(group["params"]):
            values.check_placements(self._param_name(gi, pi, p), p, rows=rows)
        self.rule(group)  # the group's chain can be built from its hyperparameters
        values.one_of(tuple(GEOMETRIES), "(or none, for plain parameters updated by AdamW)")(
            "geometry", name
        )
        gradient = group.get("gradient", "riemannian")
        values.one_of(GRADIENTS)("gradient", gradient)
        if name == "stiefel":
            values.one_of(RETRACTIONS)("retraction", group.get("retraction", "polar"))
            values.one_of(METRICS)("metric", group.get("metric", "embedded"))
        else:
            geometry = self._geometries.factored(group)  # built from the shapes: validates them
            if gradient == "euclidean" and geometry.embedded:
                raise ValueError(
                    f"gradient='euclidean' needs tangent vectors in the layout of the point; "
                    f"{name} stores them in its own embedded layout"
                )
        if adding and name in values.FRAME_GEOMETRIES and group["weight_decay"] > 0.0:
            warnings.warn(
                values.DECAY_MESSAGE.format(wd=group["weight_decay"]),
                values.FrameDecayWarning,
                stacklevel=values.caller_stacklevel(),
            )

    def _check_points(self, points: Sequence[Point]) -> None:
        """Each point on its manifold (``check_point``, with its residual). A point is checked
        when its group is added and again at its first step: what changed it in between need
        not be seen by torch (a write through ``.data`` or NumPy moves no version counter)."""
        for point in points:
            try:
                point.geometry.check_point(point.value())
            except ValueError as err:
                hint = values.REPROJECT_HINT
                raise ValueError(f"{self._point_name(point)}: {err}; {hint}") from None

    # -- names -------------------------------------------------------------------------------
    def _param_name(self, gi: int, pi: int, p: Tensor) -> str:
        names = self.param_groups[gi].get("param_names")
        if names is not None and pi < len(names):
            return f"{names[pi]!r} (param_groups[{gi}], shape {tuple(p.shape)})"
        return f"param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)})"

    def _point_name(self, point: Point) -> str:
        if len(point.params) == 1:
            return self._param_name(point.gi, point.pis[0], point.params[0])
        names = [
            self._param_name(point.gi, pi, p) for pi, p in zip(point.pis, point.params, strict=True)
        ]
        return f"the {point.geometry.name} point of " + ", ".join(names)
