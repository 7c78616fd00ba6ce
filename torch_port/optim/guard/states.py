"""The guard's checks of a ``ChainOptimizer``'s state: before each step and when a state dict is
loaded.

Nothing is loaded or stepped from a state that does not fit: the optimizer's entries with their
exact shapes, real floating dtypes, finite values, √v and exp_avg_sq ≥ 0, integer step counts,
and moments tangent at the current points within sqrt(ε)·‖m‖ (``guard.entries``;
for a load, at the points of the first step after it, since torch's ``set_state_dict`` loads the
optimizer before the model).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torch_port.geometries import PLAIN
from torch_port.linalg import Tensor
from torch_port.optim import sharding
from torch_port.optim.guard import entries, values
from torch_port.optim.points import Point
from torch_port.optim.transforms import sqrt_v_dtype
from torch_port.stiefel import Stiefel


def _step_as_tensor(entry: dict[str, Any]) -> dict[str, Any]:
    """A state entry whose step count was saved as a Python number (as some optimizers and
    older checkpoints keep it) with the count as torch's optimizers hold it, a float32 0-d
    tensor (a copy of the entry; the count's value is checked as any other)."""
    step = entry.get("step")
    if isinstance(step, int | float) and not isinstance(step, bool):
        return {**entry, "step": torch.tensor(float(step), dtype=torch.float32)}
    return entry


def structure_value(group: dict[str, Any], key: str) -> Any:
    """A structural group option as in force: the group's value, else its default ("gradient":
    "riemannian"; "retraction", "metric": the default of the group's geometry), so that a group
    that spells out a default matches one that leaves it out. A plain group (no geometry) has
    only its geometry: the others are options of geometry groups (e.g. ``moment``, which
    torch.optim.AdamW's state dict does not have)."""
    if key != "geometry" and group.get("geometry") is None:
        return None
    if key in group:
        return group[key]
    if key == "gradient" and group.get("geometry") is not None:
        return "riemannian"
    name = group.get("geometry")
    if key in ("retraction", "metric") and name is not None:
        cls = Stiefel if name == "stiefel" else PLAIN.get(name.removeprefix("block_"))
        parameter = inspect.signature(cls).parameters.get(key) if cls else None
        return None if parameter is None else parameter.default
    return None


def _given(entry: Any) -> bool:
    """A saved state entry to check: anything but None or an empty dict (an entry that is not a
    dict, e.g. a bare tensor, is given, and refused by the checks with its type)."""
    return entry is not None and not (isinstance(entry, dict) and not entry)


def _same_step(entry: Any, step: Any) -> bool:
    """Whether a factor's state entry is exactly {"step": step} (the point's step)."""
    if not (isinstance(entry, dict) and set(entry) == {"step"} and step is not None):
        return False
    a, b = entry["step"], step
    a = float(a.item()) if isinstance(a, Tensor) and a.numel() == 1 else a
    b = float(b.item()) if isinstance(b, Tensor) and b.numel() == 1 else b
    return isinstance(a, int | float) and a == b


def _to_device(entry: Any, device: torch.device) -> Any:
    """A saved state entry with every plain tensor but the step count moved to ``device``
    (torch's load moves them there too; it leaves a non-capturable step count where it is, and
    a sharded entry is ``torch.distributed.checkpoint``'s to place)."""
    if isinstance(entry, dict):
        return {k: v if k == "step" else _to_device(v, device) for k, v in entry.items()}
    if isinstance(entry, tuple | list):
        return type(entry)(_to_device(v, device) for v in entry)
    if isinstance(entry, torch.Tensor) and not (sharding.is_sharded(entry) or entry.is_meta):
        return entry.to(device)  # a meta tensor is left for the checks to refuse by name
    return entry


@dataclass(frozen=True)
class LoadPlan:
    """A checked state dict (``check_load``): what torch's load takes, the points whose
    moments the first step checks again, and the saved √v of each (group, parameter)."""

    state_dict: dict[str, Any]
    unverified: set[tuple[int, int]]
    sqrt_v: dict[tuple[int, int], Tensor]


class StateChecks:
    """The state checks of ``ChainOptimizer`` (a mixin of ``torch.optim.Optimizer``)."""

    state: Any
    param_groups: list[dict[str, Any]]
    _layouts: dict[tuple, dict[str, Any]]
    #: Points whose loaded moments await the tangency check of the next step.
    _unverified: set[tuple[int, int]] | frozenset = frozenset()

    def _expected_state(self, point: Point) -> dict[str, Any]:
        """The layout (key -> shape, or tuple of shapes) of the state of ``point``, from the
        state this optimizer would create for it (computed once per layout)."""
        group = self.param_groups[point.gi]
        key = (
            point.gi,
            point.geometry.name,
            tuple(tuple(sharding.local(p).shape) for p in point.params),  # a rank's shards
            group.get("moment"),
            group.get("gradient"),
        )
        if key not in self._layouts:
            fresh = self._init_point_state(group, point)
            del fresh["step"]
            self._layouts[key] = {k: entries.shape_of(v) for k, v in fresh.items()}
        return self._layouts[key]

    def _check_state(self, point: Point, state: Any, deep: bool) -> None:
        """The stored state of ``point`` has this optimizer's keys and layout; with ``deep``
        also finite entries, √v ≥ 0 and an integer step (``entries``), and moments tangent
        at the point (``_check_moments``)."""
        where = f"state of {self._point_name(point)}"
        expected = self._expected_state(point)
        if not isinstance(state, dict) or set(state) != {"step", *expected}:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"{where}: expected the entries {sorted({'step', *expected})} of "
                f"{type(self).__name__}, got {got}"
            )
        for k, shape in expected.items():
            entries.check_layout(f"{where}['{k}']", state[k], shape)
        if not deep:
            entries.check_step_layout(f"{where}['step']", state["step"])
            return
        entries.check_step(f"{where}['step']", state["step"], self._step_dtype())
        held = point.params[0].dtype  # a load casts the entries to it (√v: ``_sqrt_v_dtype``)
        for k in expected:
            dtype = self._sqrt_v_dtype(point.gi, held) if k == "sqrt_v" else held
            entries.check_values(f"{where}['{k}']", state[k], k == "sqrt_v", dtype)
        self._check_moments(point, state)

    def _check_states(self, items: list[tuple[int, int, Tensor]], points: list[Point]) -> None:
        """The layout of every stored state of the step (``deep=False``: no read)."""
        for point in points:
            if self.state.get(point.key):
                self._check_state(point, sharding.localize(self.state[point.key]), deep=False)
        for gi, pi, p in items:
            if self.param_groups[gi].get("geometry") is None and self.state.get(p):
                self._check_plain_state(gi, pi, p, self.state[p], deep=False)

    def _check_moments(self, point: Point, state: dict[str, Any]) -> None:
        """The transported entries of the state (moments) are tangent at the point as it is."""
        where = f"state of {self._point_name(point)}"
        for k in self.rule(self.param_groups[point.gi]).transported:
            u = (state[k],) if point.single else tuple(state[k])
            entries.check_tangent(f"{where}['{k}']", point.geometry, point.value(), u)

    def check_loaded_moments(self) -> None:
        """The moments that were not tangent at the points a load saw (``load_state_dict``
        defers them, since torch's ``set_state_dict`` loads the optimizer before the model)
        must be tangent at the points now. The first eager step after the load calls it; call
        it before a compiled capturable step, which cannot. Raises ValueError, changing
        nothing; nothing to do when every moment was tangent."""
        if not self._unverified:
            return
        for gi, group in enumerate(self.param_groups):
            if group.get("geometry") is None:
                continue
            for point in self._geometries.points(gi, group, all_=True):
                if (gi, point.pis[0]) in self._unverified and self.state.get(point.key):
                    try:
                        self._check_moments(point, sharding.localize(self.state[point.key]))
                    except ValueError as err:
                        raise ValueError(
                            f"{err}, after the state was loaded: the model's weights are not "
                            "those the state was saved with; no parameter or state was changed"
                        ) from None
        self._unverified = set()

    def _check_plain_state(self, gi: int, pi: int, p: Tensor, state: Any, deep: bool) -> None:
        """The AdamW state of a plain parameter: step, exp_avg and exp_avg_sq of p's shape
        (with ``deep``: finite, exp_avg_sq ≥ 0, an integer step)."""
        where = f"state of {self._param_name(gi, pi, p)}"
        keys = {"step", "exp_avg", "exp_avg_sq"}
        if not isinstance(state, dict) or set(state) != keys:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{where}: expected the AdamW entries {sorted(keys)}, got {got}")
        for k in ("exp_avg", "exp_avg_sq"):
            entries.check_layout(f"{where}['{k}']", state[k], tuple(p.shape))
            if deep:  # a load: torch casts the entry to the parameter's dtype and device
                entries.check_values(
                    f"{where}['{k}']", sharding.local(state[k]), k == "exp_avg_sq", p.dtype
                )
            elif (state[k].dtype, state[k].device) != (p.dtype, p.device):  # foreach AdamW's
                raise ValueError(
                    f"{where}['{k}']: held in {state[k].dtype} on {state[k].device}, the "
                    f"parameter in {p.dtype} on {p.device}; AdamW keeps its state in the "
                    "parameter's dtype and device"
                )
        if deep:
            entries.check_step(f"{where}['step']", state["step"], self._step_dtype())
        else:  # torch's foreach AdamW would fail on it after the frames were written
            entries.check_step_layout(f"{where}['step']", state["step"])

    # -- loading state -------------------------------------------------------------------------
    #: Group entries that fix the geometry of a group's points and the layout of their state.
    _STRUCTURE = (
        "geometry",
        "gradient",
        "retraction",
        "metric",
        "moment",
        "n_heads",
        "n_kv_heads",
        "pattern",
        "groups",
    )

    def check_load(self, state_dict: Any) -> LoadPlan:
        """Everything a load would take, checked before anything changes: the groups (same
        geometry and options as this optimizer's, valid hyperparameters), the parameter ids,
        and the state of every parameter (this optimizer's entries and shapes, finite values,
        √v ≥ 0, integer steps; moments tangent at the points within sqrt(ε) of the coarser
        dtype, or, where they are not tangent at the points as they are now, left for the
        first step after the load, ``check_loaded_moments``). Returns what the load takes:
        the state dict with the optimizer's own entries, its state on the parameters'
        devices."""
        if not (
            isinstance(state_dict, dict)
            and isinstance(state_dict.get("state"), dict)
            and isinstance(state_dict.get("param_groups"), list | tuple)
        ):
            raise ValueError(
                "not an optimizer state dict: expected {'state': ..., 'param_groups': [...]}"
            )
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the state dict has {len(saved_groups)} parameter groups, this optimizer "
                f"{len(self.param_groups)}"
            )
        saved_groups = [  # a copy: the caller's state dict is not changed
            {**saved, **{k: self.defaults[k] for k in self._OWN_ENTRIES}}
            if isinstance(saved, dict)
            else saved
            for saved in saved_groups
        ]
        state_dict = {**state_dict, "param_groups": saved_groups}
        ids: dict[Any, tuple[int, int]] = {}
        for gi, (saved, group) in enumerate(zip(saved_groups, self.param_groups, strict=True)):
            self._check_saved_group(gi, saved, group)
            for pi, sid in enumerate(saved["params"]):
                if not isinstance(sid, int | str) or isinstance(sid, bool):
                    raise ValueError(
                        f"param_groups[{gi}] of the state dict: params[{pi}] is {sid!r}, not a "
                        "parameter id (an int, or a name)"
                    )
                ids[sid] = (gi, pi)
        bad = {
            k: type(v).__name__ for k, v in state_dict["state"].items() if not isinstance(v, dict)
        }
        if bad:
            raise ValueError(
                f"the state dict's state entries must be dicts; got {bad} (parameter id: type)"
            )
        unknown = [k for k in state_dict["state"] if k not in ids]
        if unknown:
            raise ValueError(
                f"the state dict has state for parameter ids {unknown} that no group lists"
            )
        saved = {  # on the parameters' devices first, as torch's load puts them (the checks
            # compare moments with points; a checkpoint loaded with map_location="cpu" resumes)
            sid: _to_device(
                _step_as_tensor(entry), self.param_groups[ids[sid][0]]["params"][ids[sid][1]].device
            )
            for sid, entry in state_dict["state"].items()
        }
        unverified = self._check_saved_state(saved, ids, saved_groups)
        sqrt_v = {ids[sid]: entry["sqrt_v"] for sid, entry in saved.items() if "sqrt_v" in entry}
        return LoadPlan({**state_dict, "state": saved}, unverified, sqrt_v)

    def _sqrt_v_dtype(self, gi: int, dtype: torch.dtype) -> torch.dtype:
        """The dtype a loaded √v is held in: ``sqrt_v_dtype`` for the frame moment (at least
        float32), the parameter's own for the elementwise one (as torch casts it)."""
        frame = self.param_groups[gi].get("moment", "frame") == "frame"
        return sqrt_v_dtype(dtype) if frame else dtype

    def _step_dtype(self) -> torch.dtype | None:
        """The dtype torch's load casts step counts to: float32 for a capturable optimizer
        (as for torch's own), else None (kept as saved)."""
        return torch.float32 if self.defaults.get("capturable") else None

    def _check_saved_group(self, gi: int, saved: Any, group: dict[str, Any]) -> None:
        where = f"param_groups[{gi}] of the state dict"
        if not isinstance(saved, dict) or not isinstance(saved.get("params"), list | tuple):
            raise ValueError(f"{where}: expected a dict with a 'params' list")
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(
                f"{where}: {len(saved['params'])} parameters, this optimizer's group "
                f"{len(group['params'])}"
            )
        for k in self._STRUCTURE:
            if structure_value(saved, k) != structure_value(group, k):
                raise ValueError(
                    f"{where}: {k}={saved.get(k)!r}, but this optimizer's group has "
                    f"{k}={group.get(k)!r} (a state dict of another optimizer or another "
                    "model layout; e.g. loading torch.optim.AdamW's would train frames as plain "
                    "parameters)"
                )
        merged = {**group, **{k: v for k, v in saved.items() if k != "params"}}
        try:
            if isinstance(merged["lr"], Tensor):  # its layout and value, read
                merged = {**merged, "lr": values.tensor_lr(merged["lr"])}
            self._check_hyperparameters(self._in_use(merged))
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{where}: {err}") from None

    def _check_saved_state(
        self, saved: dict[Any, Any], ids: dict[Any, tuple[int, int]], saved_groups: Sequence
    ) -> set[tuple[int, int]]:
        """Every saved state entry against the current parameters (``_check_state``); returns
        the points (group, first parameter) whose moments are not tangent at the current
        points, which the first step after the load checks again (``check_loaded_moments``)."""
        unverified: set[tuple[int, int]] = set()
        for gi, group in enumerate(self.param_groups):
            sids = list(saved_groups[gi]["params"])
            if group.get("geometry") is None:
                for pi, p in enumerate(group["params"]):
                    entry = saved.get(sids[pi])
                    if _given(entry):
                        self._check_plain_state(gi, pi, p, entry, deep=True)
                continue
            for point in self._geometries.points(gi, group, all_=True):
                owners = [sids[pi] for pi in point.pis]
                entry = saved.get(owners[0])
                step = entry.get("step") if isinstance(entry, dict) else None
                stray = [
                    sid
                    for sid in owners[1:]
                    if _given(saved.get(sid)) and not _same_step(saved[sid], step)
                ]
                if stray:
                    raise ValueError(
                        f"state of {self._point_name(point)}: a point's state lives with its "
                        "first factor, its other factors holding only the same 'step'; got "
                        f"other state for parameter ids {stray}"
                    )
                if _given(entry):
                    try:
                        self._check_state(point, sharding.localize(entry), deep=True)
                    except entries.NotTangentError:
                        unverified.add((gi, point.pis[0]))
        return unverified
