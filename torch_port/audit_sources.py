"""Which optimizers ``torch_port.audit.record`` can record, and how it reads each one.

A source maps an optimizer to what the recorder keeps: its points (each a parameter or a batch
of factors, with the parameters that hold it), how each point's geometry is built, the number
of steps a point has taken (its state's count), the hyperparameters in force, and the name of
the rule a replay runs (``proofs_checks.reference_rules``' names: one of the library's presets,
or one of geoopt's rules).

- ``PortSource``: ``torch_port.optim``'s presets (and subclasses of them, audited as the preset
  they extend). The state is the port's (``step``, ``exp_avg``, ``sqrt_v``, ``momentum_buffer``).
- ``GeooptSource``: geoopt 0.5.1's ``RiemannianAdam`` and ``RiemannianSGD`` (and subclasses) on
  its Stiefel manifolds. The points are the parameters whose manifold (a ``ManifoldParameter``'s
  own, else the optimizer's default) is ``geoopt.Stiefel()`` (canonical) or
  ``geoopt.Stiefel(canonical=False)`` (euclidean), each a (…, d, r) batch of frames; parameters
  on geoopt's ``Euclidean`` manifold are not recorded. The state mapping to
  ``reference.field_rules``: ``state["step"]`` (Adam) or the group's ``"step"`` (SGD) is the
  count, ``exp_avg`` the first moment m, ``exp_avg_sq`` the second moment v (geoopt keeps one
  value per frame, broadcast over the frame's entries), ``max_exp_avg_sq`` amsgrad's v̄,
  ``momentum_buffer`` SGD's buffer. geoopt adds the decay λX to the gradient in place during its
  step, so the gradient read after the step holds it (the replay takes it off). ``stabilize``
  (a re-projection every k steps) has no reference and is refused.

- ``FramesSource``: any other ``torch.optim.Optimizer`` (another library's, a user's own), given
  which of its parameters are Stiefel frames (``record(..., points=[...])``); it names no rule,
  so its trace is replayed against the rule it claims (``rattn audit --rule NAME``), with what
  the claim needs and the optimizer does not keep (its state) listed as not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torch_port.optim.optimizer import ChainOptimizer
from torch_port.optim.presets import RSGD, NormalizedRSGD, RiemannianAdam, RiemannianMomentum

#: The optimizers whose rules have a reference (``proofs_checks.audit.replay``).
PRESETS = (RiemannianAdam, RiemannianMomentum, RSGD, NormalizedRSGD)

#: geoopt's optimizer classes -> the rule of ``proofs_checks.reference_rules`` they run.
GEOOPT_RULES = {
    "RiemannianAdam": "geoopt_riemannian_adam",
    "RiemannianSGD": "geoopt_riemannian_sgd",
}
#: geoopt's Stiefel manifold classes -> ``reference.field_rules``' name for them.
GEOOPT_STIEFELS = {"CanonicalStiefel": "canonical", "EuclideanStiefel": "euclidean"}


def preset_of(optimizer: Any) -> str:
    """The name of the preset whose rule ``optimizer`` runs: its class's nearest preset
    ancestor (a subclass is audited as the preset it extends); ValueError for an optimizer
    that is none of them, whose rule has no reference."""
    for cls in type(optimizer).__mro__:
        if cls in PRESETS:
            return cls.__name__
    raise ValueError(
        f"record() audits the rules of torch_port.optim's presets "
        f"({', '.join(c.__name__ for c in PRESETS)}); {type(optimizer).__name__} is none of "
        "them nor a subclass of one, so its rule has no reference to replay it through"
    )


class Source:
    """What every source shares: the state kept of a point (every entry but the count), and
    nothing to do when a step completes."""

    optimizer: torch.optim.Optimizer

    def state_of(self, point: Any) -> dict[str, Any]:
        state = self.optimizer.state.get(point.key) or {}
        return {k: v for k, v in state.items() if k != "step"}

    def stepped(self) -> None:
        """A step of the optimizer completed (``FramesSource`` counts them)."""


class PortSource(Source):
    """``torch_port.optim``'s optimizers: points from their geometry groups."""

    def __init__(self, optimizer: ChainOptimizer) -> None:
        self.optimizer = optimizer
        self.rule = preset_of(optimizer)

    def counts(self) -> list[int]:
        """The steps taken by each point, read cheaply (no point is built)."""
        state, out = self.optimizer.state, []
        for group in self.optimizer.param_groups:
            if group.get("geometry") is None:
                continue
            keys = group["params"] if group["geometry"] == "stiefel" else group["params"][:1]
            out += [int(state[p]["step"]) if "step" in state.get(p, {}) else 0 for p in keys]
        return out

    def points(self) -> list[Any]:
        opt = self.optimizer
        return [
            point
            for gi, group in enumerate(opt.param_groups)
            if group.get("geometry") is not None
            for point in opt._geometries.points(gi, group, all_=True)
        ]

    def taken(self, point: Any) -> int:
        state = self.optimizer.state.get(point.key) or {}
        return int(state["step"]) if "step" in state else 0

    def spec(self, point: Any) -> dict[str, Any]:
        group = self.optimizer.param_groups[point.gi]
        geometries = self.optimizer._geometries
        if group["geometry"] == "stiefel":
            return geometries.stiefel_spec(group, point.params[0])
        return geometries.factored_spec(group)

    def trailing(self, point: Any) -> tuple[int, ...]:
        """The trailing shape of a point's first part (what is not batch)."""
        geometry = getattr(point.geometry, "geometry", point.geometry)  # through an Ambient view
        shapes = getattr(geometry, "point_shapes", None)
        return tuple(shapes[0]) if shapes else tuple(point.params[0].shape[-2:])

    def hyperparameters(self, point: Any) -> dict[str, Any]:
        group = self.optimizer.param_groups[point.gi]
        return {k: v for k, v in group.items() if k not in ("params", "param_names")}


@dataclass(frozen=True)
class FramePoint:
    """One parameter of frames (…, d, r) stepped on its own (geoopt's layout)."""

    param: torch.Tensor
    gi: int
    pi: int

    @property
    def key(self) -> torch.Tensor:
        return self.param

    @property
    def params(self) -> list[torch.Tensor]:
        return [self.param]

    @property
    def pis(self) -> list[int]:
        return [self.pi]

    def value(self) -> tuple[torch.Tensor, ...]:
        return (self.param.detach().as_subclass(torch.Tensor),)

    def grad(self) -> tuple[torch.Tensor, ...]:
        g = self.param.grad
        return (torch.zeros_like(self.value()[0]) if g is None else g.detach(),)

    def spec(self) -> dict[str, Any]:
        d, r = self.param.shape[-2:]
        return {"name": "stiefel", "sizes": {"d": int(d), "r": int(r)}, "options": {}}

    @property
    def trailing(self) -> tuple[int, ...]:
        return tuple(self.param.shape[-2:])


def _frames_shape(p: torch.Tensor, where: str) -> None:
    if p.ndim < 2 or p.shape[-2] < p.shape[-1]:
        raise ValueError(f"{where}: shape {tuple(p.shape)} is not a batch of d×r frames, d ≥ r")


def _geoopt_class(optimizer: Any) -> str | None:
    """The name of geoopt's optimizer class that ``optimizer`` is or extends, else None."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.split(".")[0] == "geoopt" and issubclass(cls, torch.optim.Optimizer):
            return cls.__name__
    return None


class FrameParamsSource(Source):
    """A source whose points are parameters of frames, each stepped on its own."""

    _points: list[FramePoint]

    def points(self) -> list[FramePoint]:
        return list(self._points)

    def spec(self, point: FramePoint) -> dict[str, Any]:
        return point.spec()

    def trailing(self, point: FramePoint) -> tuple[int, ...]:
        return point.trailing


class GeooptSource(FrameParamsSource):
    """geoopt's ``RiemannianAdam`` and ``RiemannianSGD`` on its Stiefel manifolds (module
    docstring: which parameters are points, and the state mapping)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        name = _geoopt_class(optimizer)
        if name not in GEOOPT_RULES:
            raise ValueError(
                f"record() audits geoopt's {' and '.join(GEOOPT_RULES)}; {name} has no "
                "reference rule"
            )
        self.optimizer, self.rule = optimizer, GEOOPT_RULES[name]
        self._points: list[FramePoint] = []
        for gi, group in enumerate(optimizer.param_groups):
            if group.get("stabilize") is not None:
                raise ValueError(
                    f"group {gi}: stabilize={group['stabilize']!r} re-projects the point and "
                    "the state every few steps, which no reference rule states; record a run "
                    "with stabilize=None"
                )
            for pi, p in enumerate(group["params"]):
                kind = self.manifold(p)
                if kind == "Euclidean":
                    continue  # a plain parameter: not a point
                if kind not in GEOOPT_STIEFELS:
                    raise ValueError(
                        f"group {gi}, parameter {pi}: its manifold {kind} has no reference "
                        f"rule; record() audits geoopt's Stiefel manifolds "
                        f"({', '.join(GEOOPT_STIEFELS)})"
                    )
                _frames_shape(p, f"group {gi}, parameter {pi}")
                self._points.append(FramePoint(p, gi, pi))
        if not self._points:
            raise ValueError("the optimizer has no parameter on geoopt's Stiefel: nothing to audit")

    def manifold(self, p: torch.Tensor) -> str:
        """The class name of the manifold geoopt steps ``p`` on."""
        manifold = getattr(p, "manifold", None) or self.optimizer._default_manifold
        return type(manifold).__name__

    def _count(self, point: FramePoint) -> int:
        if self.rule == "geoopt_riemannian_sgd":  # geoopt counts SGD's steps per group
            return int(self.optimizer.param_groups[point.gi].get("step", 0))
        return int((self.optimizer.state.get(point.param) or {}).get("step", 0))

    def counts(self) -> list[int]:
        return [self._count(point) for point in self._points]

    def taken(self, point: FramePoint) -> int:
        return self._count(point)

    def hyperparameters(self, point: FramePoint) -> dict[str, Any]:
        group = self.optimizer.param_groups[point.gi]
        hyper = {k: v for k, v in group.items() if k not in ("params", "step", "stabilize")}
        return {**hyper, "stiefel": GEOOPT_STIEFELS[self.manifold(point.param)]}


class FramesSource(FrameParamsSource):
    """Any other ``torch.optim.Optimizer``, given which of its parameters are frames: each a
    (…, d, r) batch of points of St(d, r). It runs no rule a trace can name (the trace records
    its class's name), so ``rattn audit --rule NAME`` replays it against the rule it claims.
    Its counts are the steps the recorder saw (from 1 at ``record()``). Its state is every entry
    of a frame's shape, under the optimizer's own keys: a claimed rule reads what it needs under
    the library's names (``exp_avg``, ``sqrt_v``, ``momentum_buffer``), and a state the claim
    needs and the optimizer does not keep is listed as not checked."""

    def __init__(self, optimizer: torch.optim.Optimizer, points: Any) -> None:
        self.optimizer, self.rule, self.completed = optimizer, type(optimizer).__name__, 0
        where = {
            id(p): (gi, pi)
            for gi, group in enumerate(optimizer.param_groups)
            for pi, p in enumerate(group["params"])
        }
        points = list(points)
        if not points or len({id(p) for p in points}) != len(points):
            raise ValueError("points= must name the optimizer's frames, each once")
        self._points = []
        for i, p in enumerate(points):
            if id(p) not in where:
                raise ValueError(f"points[{i}] is not a parameter of the optimizer")
            _frames_shape(p, f"points[{i}]")
            self._points.append(FramePoint(p, *where[id(p)]))

    def counts(self) -> list[int]:
        return [self.completed]

    def taken(self, point: FramePoint) -> int:
        return self.completed

    def stepped(self) -> None:
        self.completed += 1

    def hyperparameters(self, point: FramePoint) -> dict[str, Any]:
        group = self.optimizer.param_groups[point.gi]
        return {k: v for k, v in group.items() if k not in ("params", "param_names")}

    def state_of(self, point: FramePoint) -> dict[str, Any]:
        state = self.optimizer.state.get(point.key) or {}
        shape = point.param.shape
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.shape == shape}


def source_of(optimizer: Any, points: Any = None) -> Source:
    """The source that reads ``optimizer`` (``points``: the frames of an optimizer that is
    neither the library's nor geoopt's); TypeError or ValueError, with the reason, for what
    cannot be recorded."""
    known = isinstance(optimizer, ChainOptimizer) or _geoopt_class(optimizer) is not None
    if known and points is not None:
        raise ValueError(
            f"points= names the frames of another optimizer; {type(optimizer).__name__}'s "
            "points are read from its parameter groups"
        )
    if isinstance(optimizer, ChainOptimizer):
        return PortSource(optimizer)
    if known:
        return GeooptSource(optimizer)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"record() needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if points is None:
        raise ValueError(
            f"{type(optimizer).__name__} is neither torch_port.optim's nor geoopt's: give "
            "record(..., points=[...]) the parameters it steps as Stiefel frames, and audit "
            "the trace with rattn audit --rule NAME, the rule it claims"
        )
    return FramesSource(optimizer, points)
