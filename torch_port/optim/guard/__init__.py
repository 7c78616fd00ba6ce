"""The one guard of the optimizers: every refusal of ``ChainOptimizer`` and its presets is made
here, at three entry points, each before anything is written.

- ``check_group(gi)``: a parameter group when it is added, and again only when its values
  change (its entries, compared with those last validated, and the identity and layout of its
  parameters), so a scheduler's new ``lr`` is checked before the step that reads it while a
  steady step checks nothing twice. It returns a ``GroupSpec``: the group as the step reads it.
- ``check_step(items, mode)``: the groups that step, every gradient (its layout; its
  finiteness, where the step is skipped or refused), every point that has no state yet (on its
  manifold), and the layout of every stored state the step touches.
- ``check_load(state_dict)``: everything a load would take (groups, ids, every state entry's
  keys, layout, values and tangency).

Every refusal names the input (as its user knows it: ``param_names`` where given), the problem
and the measured value. The checks themselves live beside this module: values
(``guard.values``), a group's structure and points (``guard.groups``), state entries
(``guard.entries``), stored and loaded state (``guard.states``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from torch_port.linalg import Tensor
from torch_port.optim import sharding
from torch_port.optim.guard import values
from torch_port.optim.guard.groups import GroupChecks
from torch_port.optim.guard.states import StateChecks
from torch_port.optim.points import Point

#: How a step is checked: "careful" (every check, reading the device where one needs it),
#: "speculative" (only what needs no read; the eager step reads its conditions itself, with
#: the gradients' finiteness, ``torch_port.deferred``), "capturable" (no read outside a load:
#: the capturable step decides finiteness and a tensor lr on the device).
MODES = ("careful", "speculative", "capturable")


@dataclass(frozen=True)
class GroupSpec:
    """A validated parameter group as the step reads it: ``values`` (a tensor lr as its value
    for the eager step, read once when the group was validated); ``signature`` and ``layout``
    tell when it must be validated again."""

    signature: list
    layout: list | None
    values: Mapping[str, Any]


@dataclass(frozen=True)
class CheckedStep:
    """What a step may use once ``check_step`` has passed: each stepping group's spec and the
    points of the geometry groups."""

    specs: dict[int, GroupSpec]
    points: list[Point]


class Guard(GroupChecks, StateChecks):
    """The guard of ``ChainOptimizer`` (a mixin of ``torch.optim.Optimizer``)."""

    def _forget_checks(self) -> None:
        """Drop what the guard remembers (after a load, or a copy): everything is checked
        anew."""
        self._specs: dict[int, GroupSpec] = {}

    # -- entry 1: a group ----------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, then ``check_group`` (hyperparameters, geometry,
        shapes, every point on its manifold); a refused group leaves the optimizer as it was."""
        super().add_param_group(param_group)
        try:
            self.check_group(len(self.param_groups) - 1, adding=True)
        except Exception:
            self.param_groups.pop()
            raise

    def check_group(self, gi: int, adding: bool = False) -> GroupSpec:
        """The spec of ``param_groups[gi]``, validated when the group is added and whenever
        its values (a tensor lr's, read at every eager step) or its parameters' layouts
        changed since the last validation. Errors of a group in use are prefixed with it and
        say that nothing was changed."""
        group = self.param_groups[gi]
        read = adding or not self.defaults.get("capturable")
        spec = self._specs.get(gi)
        try:
            # the group as the step reads it: the eager step takes a tensor lr's value, read
            # (and checked) at every step, as torch's optimizers read it; the capturable step
            # checks its layout here and its value on the device
            view = _in_force(group) if read else group
            if isinstance(view["lr"], Tensor):
                values.tensor_lr(view["lr"], read=False)
            signature = _signature(view)
            layout = _layout(group["params"])
            if not adding and spec is not None and spec.signature == signature:
                if spec.layout == layout:
                    return spec
            if adding:
                self._check_hyperparameters(view)
                self._check_structure(gi, group, adding=True)
                if group.get("geometry") is not None:
                    self._check_points(self._geometries.points(gi, group, all_=True))
            else:
                self._check_hyperparameters(self._in_use(view))
                if spec is None or spec.layout != layout:
                    self._check_structure(gi, self._in_use(group), adding=False)
                elif group.get("geometry") is None:
                    values.plain_eps(group)
        except (ValueError, TypeError) as err:
            if adding:
                raise
            raise type(err)(
                f"param_groups[{gi}]: {err}; no parameter or state was changed"
            ) from None
        spec = GroupSpec(signature, layout, view)
        self._specs[gi] = spec
        return spec

    # -- entry 2: a step -----------------------------------------------------------------------
    def check_step(
        self, items: list[tuple[int, int, Tensor]], mode: str = "careful"
    ) -> CheckedStep | None:
        """Before a step writes anything: the stepping groups (``check_group``), each
        gradient's layout, the moments a load left unverified, then (``mode``, see ``MODES``)
        each gradient's finiteness ("careful": None when the step is to be skipped, with a
        warning, else ValueError naming each non-finite gradient), each point without state
        on its manifold (not "speculative"), and the layout of every stored state."""
        # Traced by torch.compile, the capturable step checks metadata only: its graph cannot
        # raise on values, and relies on the checks made eagerly when a group was added.
        traced = mode == "capturable" and torch.compiler.is_compiling()
        specs = (
            {} if traced else {gi: self.check_group(gi) for gi in sorted({g for g, _, _ in items})}
        )
        points = [
            point
            for gi, group in enumerate(self.param_groups)
            if group.get("geometry") is not None and not traced
            for point in self._geometries.points(gi, group)
        ]
        for gi, pi, p in items:
            problem = values.gradient_problem(p)
            if problem is not None:
                name = self._param_name(gi, pi, p)
                raise ValueError(
                    f"the gradient of {name} {problem}; no parameter or state was changed"
                )
        if not traced:
            self.check_loaded_moments()
        elif self._unverified:  # a Python value: part of the traced graph's guards
            raise ValueError(
                "a loaded state holds moments not tangent at the points it saw, which a "
                "compiled step cannot check: call opt.check_loaded_moments() once the model's "
                "weights are loaded, before the compiled step; no parameter or state was changed"
            )
        if mode == "careful" and not self._gradients_finite(items):
            return None
        if mode != "speculative":
            self._check_points([point for point in points if not self.state.get(point.key)])
        if mode == "capturable":
            self._check_capturable(items)
        else:
            self._check_states(items, points)
        return CheckedStep(specs, points)

    def _check_capturable(self, items: list[tuple[int, int, Tensor]]) -> None:
        """One device for every parameter and tensor lr, and every existing state in the
        capturable step's layout."""
        devices = {p.device for _, _, p in items} | {
            g["lr"].device for g in self.param_groups if isinstance(g["lr"], Tensor)
        }
        if len(devices) > 1:
            raise ValueError(
                f"capturable=True needs every parameter (and a tensor lr) on one device, got "
                f"{devices}"
            )
        for gi, _, p in items:
            if self.state.get(p):
                frame = self.param_groups[gi].get("geometry") is not None
                values.capturable_state(p, self.state[p], frame)

    def _gradients_finite(self, items: list[tuple[int, int, Tensor]]) -> bool:
        """Whether every gradient is finite; False (with a warning) when the step is to be
        skipped, and ValueError naming each non-finite gradient otherwise. One reduction per
        gradient (its sum, finite unless an entry is NaN/inf or the sum overflows) and one
        read per device; the entries are counted only for a gradient whose sum is not
        finite. Sharded gradients: the local shards' sums and counts summed over the ranks,
        so that every rank decides alike."""
        counts: list[int] = [0] * len(items)
        by_device: dict[torch.device, list[int]] = {}
        for k, (_, _, p) in enumerate(items):
            by_device.setdefault(p.grad.device, []).append(k)
        sharded = any(sharding.is_sharded(p.grad) for _, _, p in items)
        for ks in by_device.values():
            grads = [sharding.local(items[k][2].grad) for k in ks]
            sums = torch.stack([g.sum().to(torch.float64) for g in grads])
            if sharded:
                sharding.all_reduce_sum(sums)
            if all(torch.isfinite(sums).tolist()):
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
                values.NonFiniteGradientWarning,
                stacklevel=values.caller_stacklevel(),
            )
            return False
        raise ValueError(
            message + "; no parameter or state was changed (pass skip_nonfinite=True to "
            "skip such steps with a warning instead)"
        )

    # -- entry 3: a load -----------------------------------------------------------------------
    # ``check_load`` is ``StateChecks.check_load`` (``guard.states``).


def _in_force(group: dict[str, Any]) -> dict[str, Any]:
    """The group as the eager step reads it: a tensor lr as its value (torch's ``_to_scalar``),
    checked and read once, here."""
    if isinstance(group["lr"], Tensor):
        return {**group, "lr": values.tensor_lr(group["lr"])}
    return group


def _layout(params: list[Tensor]) -> list | None:
    """What ``check_group`` checks of each parameter: identity, dtype, device, shape, strides;
    None (equal to no layout: the parameters are checked) where a parameter has no strides (a
    lazy module's, not yet materialised)."""
    try:
        return [(id(p), p.dtype, p.device, p.shape, p.stride()) for p in params]
    except RuntimeError:
        return None


#: Values compared as they are (with their type: ``0.0 == False``).
_PLAIN = frozenset({type(None), bool, int, float, str})


class _Same:
    """An object in a signature, equal only to itself: kept alive by the signature, so its
    identity is never another object's."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    __hash__ = None  # type: ignore[assignment]


def _signature(group: dict[str, Any]) -> list:
    """A group's entries but its parameters, as a list that compares equal exactly when they
    are unchanged: numbers and strings with their type, lists and dicts copied, any other
    object (a tensor lr of the capturable step, whose value the device checks) by identity."""
    return [
        (k, type(v), v) if type(v) in _PLAIN else (k, _frozen(v))
        for k, v in group.items()
        if k != "params"
    ]


def _frozen(value: Any) -> Any:
    """``_signature`` of one value that is not a number or a string."""
    if isinstance(value, dict):
        return ("dict", *((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value), *(_frozen(v) for v in value))
    if type(value) in _PLAIN:
        return (type(value), value)
    return _Same(value)
