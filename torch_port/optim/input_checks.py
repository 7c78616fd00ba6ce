"""The input of a ``ChainOptimizer``, checked before anything is written: each parameter group
when it is added and before each step, each gradient of a step, and each point that has no
state yet.

A group is refused before it changes anything: its hyperparameters, its geometry and the
options of that geometry, the layout of its parameters (no parameter listed twice, sharded
parameters placed as the geometry allows), and every point on its manifold. Before a step the
groups that step are checked again, since a scheduler or a user may have set their
hyperparameters (or appended parameters) since the last step; then every gradient (finite, or
the step skipped) and every point that has no state yet. Errors name the parameters as their
user knows them (``_param_name``). The state is checked by ``optim.state.StateChecks``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from torch_port.geometries import GEOMETRIES
from torch_port.linalg import Tensor
from torch_port.optim import checks, sharding
from torch_port.optim.points import GRADIENTS, Geometries, Point
from torch_port.stiefel import METRICS, RETRACTIONS


class InputChecks:
    """The input checks of ``ChainOptimizer`` (a mixin of ``torch.optim.Optimizer``)."""

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    _geometries: Geometries

    # -- groups ------------------------------------------------------------------------------
    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        """Validate the hyperparameters of one group (subclasses extend)."""
        if isinstance(group["lr"], torch.Tensor):
            checks.tensor_lr(group["lr"])
        else:
            checks.nonnegative("lr", group["lr"])  # 0: a warm-up from zero, as torch allows
        checks.torch_flags(group, capturable="capturable" in self.defaults)
        checks.betas(group["betas"])
        checks.nonnegative("eps", group["eps"])
        checks.nonnegative("weight_decay", group["weight_decay"])
        if group.get("trust_radius") is not None:
            checks.positive("trust_radius", group["trust_radius"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, then the group's checks (hyperparameters, geometry,
        shapes, every point on its manifold); a refused group leaves the optimizer as it was."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._check_group(group)
            if group.get("geometry") is not None:
                self._check_points(
                    self._geometries.points(len(self.param_groups) - 1, group, all_=True)
                )
        except Exception:
            self.param_groups.pop()
            raise

    def _check_points(self, points: Sequence[Point]) -> None:
        for point in points:
            try:
                point.geometry.check_point(point.value())
            except ValueError as err:
                hint = checks.REPROJECT_HINT
                raise ValueError(f"{self._point_name(point)}: {err}; {hint}") from None

    def _check_group(self, group: dict[str, Any]) -> None:
        self._check_hyperparameters(group)
        name = group.get("geometry")
        checks.parameter_layouts(group, group["params"])
        seen: dict[int, int] = {}
        for pi, p in enumerate(group["params"]):
            if id(p) in seen:  # torch only warns; the parameter would step twice per step
                raise ValueError(
                    f"a parameter group lists the same parameter twice (params[{seen[id(p)]}] "
                    f"and params[{pi}], shape {tuple(p.shape)})"
                )
            seen[id(p)] = pi
        if name is None:
            checks.plain_eps(group)
            return
        gi = len(self.param_groups) - 1  # the group being added
        rows = (
            name == "stiefel"
            and group.get("retraction", "polar") == "polar"
            and group.get("metric", "embedded") == "embedded"
            and group.get("gradient", "riemannian") == "riemannian"
        )
        for pi, p in enumerate(group["params"]):
            sharding.check_placements(self._param_name(gi, pi, p), p, rows=rows)
        self.rule(group)  # the group's chain can be built from its hyperparameters
        if name not in GEOMETRIES:
            raise ValueError(
                f"unknown geometry {name!r} for a parameter group; choose one of "
                f"{tuple(GEOMETRIES)} (or none, for plain parameters updated by AdamW)"
            )
        gradient = group.get("gradient", "riemannian")
        if gradient not in GRADIENTS:
            raise ValueError(f"unknown gradient {gradient!r}; choose one of {GRADIENTS}")
        if name == "stiefel":
            self._check_stiefel_group(group)
        else:
            geometry = self._geometries.factored(group)  # built from the shapes: validates them
            if gradient == "euclidean" and geometry.embedded:
                raise ValueError(
                    f"gradient='euclidean' needs tangent vectors in the layout of the point; "
                    f"{name} stores them in its own embedded layout"
                )
        if name in checks.FRAME_GEOMETRIES and group["weight_decay"] > 0.0:
            warnings.warn(
                checks.DECAY_MESSAGE.format(wd=group["weight_decay"]),
                checks.FrameDecayWarning,
                stacklevel=checks.caller_stacklevel(),
            )

    @staticmethod
    def _check_stiefel_group(group: dict[str, Any]) -> None:
        if group.get("retraction", "polar") not in RETRACTIONS:
            raise ValueError(
                f"unknown retraction {group['retraction']!r}; choose one of {RETRACTIONS}"
            )
        if group.get("metric", "embedded") not in METRICS:
            raise ValueError(f"unknown metric {group['metric']!r}; choose one of {METRICS}")

    def _check_step_groups(self, items: list[tuple[int, int, Tensor]]) -> None:
        """Before a step changes anything: the hyperparameters of every group that steps (a
        scheduler or a user may have set them since the last step), and the layout of every
        parameter that has no state yet (one appended to a group since the last step)."""
        for gi in sorted({gi for gi, _, _ in items}):
            group = self.param_groups[gi]
            try:
                self._check_current_hyperparameters(group)
                if group.get("geometry") is None:
                    checks.plain_eps(group)
                checks.parameter_layouts(
                    group, [p for p in group["params"] if not self.state.get(p)]
                )
            except (ValueError, TypeError) as err:
                raise type(err)(
                    f"param_groups[{gi}]: {err}; no parameter or state was changed"
                ) from None

    def _check_current_hyperparameters(self, group: dict[str, Any]) -> None:
        """``_check_hyperparameters`` of a group in use, where lr = 0 is a value it may hold:
        a schedule that ends at 0 leaves it there (and in its checkpoints), and
        torch.distributed.checkpoint makes a state with a step at lr = 0; such a step does
        not move. A new group still needs lr > 0. The optimizer's own entries are read from
        ``defaults`` (Dynamo sets ``capturable=True`` in the groups of a step it traces)."""
        own = {k: self.defaults[k] for k in self._OWN_ENTRIES}
        zero = checks.is_real(group["lr"]) and group["lr"] == 0
        self._check_hyperparameters({**group, **own, **({"lr": 1.0} if zero else {})})

    # -- the step ----------------------------------------------------------------------------
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

    def _validate(self, items: list[tuple[int, int, Tensor]], points: list[Point]) -> bool:
        """Check every gradient and every point that has no state yet. Returns False when the
        step is to be skipped; raises on bad input. Nothing has been changed when this raises or
        returns False.

        The gradient check costs one reduction per gradient (its sum, which is finite unless an
        entry is NaN/inf or the sum overflows) and one host synchronisation per device; the
        entries are counted only for a gradient whose sum is not finite."""
        self._check_layouts(items)
        if not self._gradients_finite(items):
            return False
        self._check_points([point for point in points if not self.state.get(point.key)])
        self._check_states(items, points)
        return True

    def _check_layouts(self, items: list[tuple[int, int, Tensor]]) -> None:
        """Each gradient's layout, and the moments a load left unverified (no read)."""
        for gi, pi, p in items:
            checks.gradient_layout(self._param_name(gi, pi, p), p)
        self.check_loaded_moments()

    def _check_states(self, items: list[tuple[int, int, Tensor]], points: list[Point]) -> None:
        """The layout of every stored state of the step (``deep=False``: no read)."""
        for point in points:
            if self.state.get(point.key):
                self._check_state(point, sharding.localize(self.state[point.key]), deep=False)
        for gi, pi, p in items:
            if self.param_groups[gi].get("geometry") is None and self.state.get(p):
                self._check_plain_state(gi, pi, p, self.state[p], deep=False)

    @staticmethod
    def _gradient_conditions(items: list[tuple[int, int, Tensor]]) -> list[Tensor]:
        """One condition per device, on the device: every gradient's sum is finite (no read;
        of the local shards of sharded gradients)."""
        by_device: dict[torch.device, list[Tensor]] = {}
        for _, _, p in items:  # a sharded gradient's local shard (the ranks agree later)
            grad = sharding.local(p.grad)
            by_device.setdefault(grad.device, []).append(grad.sum().to(torch.float64))
        return [torch.isfinite(torch.stack(sums)).all() for sums in by_device.values()]

    def _gradients_finite(self, items: list[tuple[int, int, Tensor]]) -> bool:
        """Whether every gradient is finite; False (with a warning) when the step is to be
        skipped, and ValueError naming each non-finite gradient otherwise."""
        counts: list[int] = [0] * len(items)
        by_device: dict[torch.device, list[int]] = {}
        for k, (_, _, p) in enumerate(items):
            by_device.setdefault(p.grad.device, []).append(k)
        # Sharded gradients (DTensors): the local shards' sums and counts, summed over the
        # ranks, so that every rank takes the same decision.
        sharded = any(sharding.is_sharded(p.grad) for _, _, p in items)
        for ks in by_device.values():
            grads = [sharding.local(items[k][2].grad) for k in ks]
            sums = torch.stack([g.sum().to(torch.float64) for g in grads])
            if sharded:
                sharding.all_reduce_sum(sums)
            finite = torch.isfinite(sums).tolist()
            if all(finite):
                continue
            bad = torch.stack([(~torch.isfinite(g)).sum() for g in grads])
            if sharded:
                sharding.all_reduce_sum(bad)
            for k, c in zip(ks, bad.tolist(), strict=True):
                counts[k] = int(c)
        bad = [(item, c) for item, c in zip(items, counts, strict=True) if c]
        if not bad:
            return True
        lines = [
            f"{self._param_name(gi, pi, p)}: {c} non-finite entries (NaN or inf) of "
            f"{p.grad.numel()}"
            for (gi, pi, p), c in bad
        ]
        message = "non-finite gradient for " + "; ".join(lines)
        if all(self.param_groups[gi].get("skip_nonfinite", False) for (gi, _, _), _ in bad):
            warnings.warn(
                message + "; the step was skipped (no parameter or state changed)",
                checks.NonFiniteGradientWarning,
                stacklevel=checks.caller_stacklevel(),
            )
            return False
        raise ValueError(
            message + "; no parameter or state was changed (pass skip_nonfinite=True to "
            "skip such steps with a warning instead)"
        )
