"""``ChainOptimizer``: a ``torch.optim.Optimizer`` that runs a chain of transformations per group.

Every geometry takes one path (``torch_port.optim.points``): the group's points, their
Riemannian gradients (or the gradients themselves, for ``"gradient": "euclidean"``), the group's
chain (``rule(group)``, a ``torch_port.optim.transforms.Transform``), the step ξ = c·u frame by
frame, the retraction, and the transport of the chain's tangent state. Groups without a
geometry hold plain parameters, updated in the same optimizer by AdamW with decoupled decay in
torch's convention and torch's arithmetic (``torch.optim.adamw.adamw``, foreach, whose
results equal the single-tensor path's bitwise).

Every step is checked before it writes, by the one guard (``torch_port.optim.guard``: the
groups, each gradient finite or the whole step skipped with ``skip_nonfinite=True``, each new
point on its manifold, each stored state of the layout the chain makes); then all new points
and states are computed, and only then written, so an error raised while computing one leaves
every parameter and every state as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.optim.adamw import adamw as torch_adamw

from torch_port import deferred
from torch_port.linalg import Tensor
from torch_port.optim import sharding, update
from torch_port.optim.guard import CheckedStep, GroupSpec, Guard
from torch_port.optim.loading import Loading
from torch_port.optim.points import Geometries, Point, closure_loss, stepping
from torch_port.optim.transforms import Transform


class ChainOptimizer(Loading, Guard, torch.optim.Optimizer):
    """Riemannian optimization by a chain of transformations, with AdamW for plain groups.

    Args:
        params: parameters or parameter groups; a group with ``"geometry": "stiefel"`` holds
            frames (..., d, r), one naming one of the ten design points holds the factors of
            one batched point (``torch_port.optim``), a group without one plain parameters.
            A geometry group may set ``"gradient": "euclidean"``: the chain then acts on the
            gradient itself in the ambient space, with no projection and no transport, and
            only the retraction puts the point back (arms E and H of the ablation).
        rule: the chain of a group, ``rule(group) -> Transform``, built from the group's
            hyperparameters at every step (so schedulers that set ``lr`` take effect); the
            presets define it as a method.
        lr, betas, eps, weight_decay: the plain groups' AdamW, and defaults the rule may read.
        skip_nonfinite: skip a step whose gradients have NaN/inf entries (with a warning)
            instead of raising ValueError.
        maximize: ascend (the step of −G), as torch's ``maximize``, on frames and points too.
        foreach, amsgrad, fused, differentiable: torch's flags; ``foreach`` is accepted either
            way (the plain groups' AdamW is torch's multi-tensor path, bitwise the
            single-tensor one), the others only False (``guard.values.torch_flags``).
        **options: further defaults of every group (e.g. ``trust_radius``).

    The state of a point holds "step" and the chain's entries (a Stiefel parameter's under its
    own key; a factored point's under its first factor, tangent vectors as tuples, its other
    factors holding only the point's "step", so that every parameter with a gradient has an
    entry, as ``torch.distributed.checkpoint`` expects).
    """

    #: The chain of a geometry group, built from its hyperparameters at every step (the presets
    #: define it as a method; else it is the ``rule`` argument).
    rule: Callable[[dict[str, Any]], Transform]

    def __init__(
        self,
        params: Iterable,
        rule: Callable[[dict[str, Any]], Transform] | None = None,
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        skip_nonfinite: bool = False,
        maximize: bool = False,
        foreach: bool | None = None,
        amsgrad: bool = False,
        fused: bool | None = None,
        differentiable: bool = False,
        **options: Any,
    ):
        if rule is not None:
            self.rule = rule
        elif not hasattr(self, "rule"):
            raise TypeError(
                f"{type(self).__name__} needs a rule: ChainOptimizer(params, rule, ...)"
            )
        self._geometries = Geometries()
        self._layouts: dict[tuple, dict[str, Any]] = {}
        self._hints: dict[Tensor, dict[str, Any]] = {}
        self._counts: dict[Tensor, tuple[Tensor, tuple[int, int], int]] = {}
        self._forget_checks()
        #: How many steps were skipped for non-finite gradients (``skip_nonfinite=True``).
        self.skipped_steps = 0
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            skip_nonfinite=skip_nonfinite,
            maximize=maximize,
            foreach=foreach,
            amsgrad=amsgrad,
            fused=fused,
            differentiable=differentiable,
            **options,
        )
        super().__init__(params, defaults)

    #: Attributes of this optimizer kept by ``copy.deepcopy`` and pickling, beside torch's
    #: defaults, state and param_groups (torch's ``__getstate__`` keeps only those three).
    _KEPT_ATTRIBUTES = ("rule", "skipped_steps", "skipped_on_device", "_unverified")

    def __getstate__(self) -> dict[str, Any]:
        """torch's state and the attributes in ``_KEPT_ATTRIBUTES``; the per-point caches
        (geometries, buffers, layouts) are not copied but rebuilt by ``__setstate__``."""
        state = super().__getstate__()
        state.update({k: self.__dict__[k] for k in self._KEPT_ATTRIBUTES if k in self.__dict__})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._geometries = Geometries()
        self._layouts = {}
        self._hints = {}
        self._counts = {}
        self._forget_checks()
        self.__dict__.setdefault("skipped_steps", 0)

    @staticmethod
    def _new_step() -> Tensor:
        dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        return torch.tensor(0.0, dtype=dtype)

    # -- the step ----------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient (see the module docstring).
        Under ``torch.compile`` it runs eagerly, so a compiled step is the eager step."""
        return self._chain_step(closure)

    # torch.compile(optimizer.step) runs the step eagerly: traced, its data-dependent checks
    # and Python-number state recompile at every step and the AdamW path drifted from eager.
    # Not named ``step``: torch wraps every class's ``step`` with its hook runner, so a
    # subclass's ``step`` calling ``super().step`` would run the step hooks twice.
    @torch.compiler.disable
    @torch.no_grad()
    def _chain_step(self, closure: Callable[[], Any] | None) -> Any:
        loss = closure_loss(closure)
        items = stepping(self.param_groups)
        if not items:
            return loss
        # Points: compute every new point and state first, then write them all.
        pending = self._speculative_updates(items)
        if pending is None:
            checked = self.check_step(items)
            if checked is None:
                self.skipped_steps += 1
                return loss
            counts = self._next_counts(checked.points)
            pending = [
                self._careful_update(point, t, checked.specs[point.gi])
                for point, t in zip(checked.points, counts, strict=True)
            ]
        for pending_update in pending:
            self._commit(*pending_update)
        # Plain parameters: AdamW, in place, with torch's arithmetic, one group at a time.
        for gi in sorted({g for g, _, _ in items}):
            group = self._specs[gi].values  # as the guard has just checked it
            if group.get("geometry") is None:
                self._adamw(group, [p for g, _, p in items if g == gi])
        return loss

    def _speculative_updates(
        self, items: list[tuple[int, int, Tensor]]
    ) -> list[tuple[Point, tuple, dict, int]] | None:
        """Every point's update with the host decisions deferred (``torch_port.deferred``) and
        read at the end, together with the gradients' finiteness, in one read of the device.
        A point whose conditions fail is computed again by ``_careful_update``. None (the
        careful step decides, as it would have) when a gradient is not finite, a check or an
        update raises, or a point has no state yet.

        Sharded (FSDP2) parameters: every rank must take the same branches, whose collectives
        pair up, so the conditions are agreed by one all-reduce before the read (a condition
        that fails on one rank fails on all), and an error is raised where it happens, as the
        careful step raises it, rather than retried by a careful step the other ranks would
        not take."""
        shared = any(sharding.is_sharded(p) for _, _, p in items)
        try:
            checked: CheckedStep = self.check_step(items, "speculative")
        except (ValueError, TypeError):
            if shared:
                raise
            return None
        points = checked.points
        if any(not self.state.get(point.key) for point in points):
            return None
        gradients = _gradient_conditions(items)
        pending, conditions = [], []
        for point, t in zip(points, self._next_counts(points), strict=True):
            try:
                with deferred.speculate(self._hints.setdefault(point.key, {})) as speculation:
                    spec = checked.specs[point.gi]
                    pending.append((point, *self._point_update(point, t, spec), t))
            except (ValueError, torch.linalg.LinAlgError) as err:
                if shared:
                    raise self._point_error(point, err) from err
                return None
            conditions.append(speculation.conditions)
        agree = sharding.all_reduce_sum if shared else None
        held = deferred.which_hold([gradients, *conditions], agree=agree)
        if not held[0]:
            return None
        for k, ok in enumerate(held[1:]):
            if not ok:
                point, new, t = pending[k][0], pending[k][2], pending[k][3]
                pending[k] = None  # frees the work buffer its lazy new point holds
                self._recycle(point, new.values())
                pending[k] = self._careful_update(point, t, checked.specs[point.gi])
        return pending

    def _careful_update(
        self, point: Point, t: int, spec: GroupSpec
    ) -> tuple[Point, tuple, dict, int]:
        """A point's update with every host decision read where it is made (and remembered
        for the next step's speculation), as ``_commit``'s arguments; its errors named
        (``_point_error``)."""
        try:
            with deferred.speculate(self._hints.setdefault(point.key, {}), "read"):
                return (point, *self._point_update(point, t, spec), t)
        except (ValueError, torch.linalg.LinAlgError) as err:
            raise self._point_error(point, err) from err

    def _commit(self, point: Point, values: tuple[Any, ...], new: dict, t: int) -> None:
        """Write a point's new factors and state (``_point_update``'s result, of step count
        ``t``), in place."""
        point.write(values)
        state = self.state[point.key]
        if point.sharded:  # DTensor state on the parameter's mesh (optim.sharding)
            new = {k: sharding.store(point.key, state.get(k), v) for k, v in new.items()}
        dropped = dict(state)
        state.update(new)
        if not point.sharded:
            self._recycle(point, [old for k, old in dropped.items() if old is not state[k]])
        for p in point.params[1:]:  # the other factors carry the point's step only
            self.state[p] = {"step": state["step"]}
        step = state["step"]
        self._counts[point.key] = (step, _unchanged(step), t)

    @staticmethod
    def _recycle(point: Point, dropped: Iterable[Any]) -> None:
        """Give the point's geometry the state tensors no state holds any more, as buffers of
        its next step (where it reuses buffers)."""
        recycle = getattr(point.geometry, "recycle", None)
        if recycle is not None:
            x = point.value()
            for old in dropped:
                recycle(x, old)

    def _point_error(self, point: Point, err: Exception) -> ValueError:
        """The error of a point's update, named, and blamed on the point when the point itself
        has non-finite entries (changed outside the optimizer since its last step)."""
        bad = sum(int((~torch.isfinite(sharding.local(p.detach()))).sum()) for p in point.params)
        cause = (
            f"the point has {bad} non-finite entries (NaN or inf), set outside the optimizer"
            if bad
            else str(err)
        )
        return ValueError(f"{self._point_name(point)}: {cause}; no parameter or state was changed")

    def _next_counts(self, points: Sequence[Point]) -> list[int]:
        """The step count t = (stored count) + 1 of every point (1 without a state): known
        without a read when the stored count is the tensor the last step wrote, unchanged
        (``_unchanged``); else read in one transfer per device."""
        stored = [sharding.localize(self.state.get(point.key)) for point in points]
        counts = [0] * len(points)
        by_device: dict[torch.device, list[int]] = {}
        for k, state in enumerate(stored):
            if state:
                step, known = state["step"], self._counts.get(points[k].key)
                if known is not None and known[0] is step and known[1] == _unchanged(step):
                    counts[k] = known[2]  # the tensor this optimizer wrote, unchanged since
                else:
                    by_device.setdefault(step.device, []).append(k)
        for ks in by_device.values():
            read = torch.stack([stored[k]["step"].reshape(()) for k in ks]).tolist()
            for k, v in zip(ks, read, strict=True):
                counts[k] = int(v)
        return [c + 1 for c in counts]

    def _point_update(
        self, point: Point, t: int | None = None, spec: GroupSpec | None = None
    ) -> tuple[tuple[Any, ...], dict]:
        """The new factors (in the parameters' layout) and the new state of one point, computed
        without writing anything: g = grad f (plus coupled decay), the chain's step ξ = c·u,
        y = R_x(ξ), and the chain's tangent state transported to y. ``t`` is the new step count
        (``_next_counts``; read from the point's state when not given), ``spec`` its group as
        the step reads it (``check_group``'s; the guard's when not given)."""
        if spec is None:
            spec = self.check_group(point.gi)
        group = spec.values
        geometry, rule = point.geometry, self.rule(group)
        stored = sharding.localize(self.state.get(point.key)) or self._init_point_state(
            group, point
        )
        state = {k: ((v,) if point.single and k in rule.parts else v) for k, v in stored.items()}
        x = point.value()
        if t is None:
            t = int(stored["step"].item()) + 1
        if any(part.numel() == 0 for part in x):
            # an FSDP2 shard that holds no element of the point (a tensor of fewer heads than
            # ranks): nothing moves, and the step count advances with the other ranks'
            return point.unpack(x), {**stored, "step": torch.full_like(stored["step"], t)}
        y, new = update.move(geometry, rule, group, x, point.grad(), state, t)
        new = {k: (v[0] if point.single and k in rule.parts else v) for k, v in new.items()}
        new["step"] = torch.full_like(stored["step"], t)
        return point.unpack(y), new

    # -- AdamW (torch.optim.AdamW's functional form, foreach, decoupled decay) -----------------
    def _adamw(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """torch's AdamW on the plain parameters of a group that have a gradient, by
        ``torch.optim.adamw.adamw`` with ``foreach=True`` (its arithmetic equals the
        single-tensor path's bitwise; sharded and plain tensors in separate calls). ``group``
        as the step reads it (``GroupSpec.values``)."""
        for part in (
            [p for p in params if sharding.is_sharded(p)],
            [p for p in params if not sharding.is_sharded(p)],
        ):
            if not part:
                continue
            for p in part:
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = self._new_step()
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            states = [self.state[p] for p in part]
            beta1, beta2 = group["betas"]
            torch_adamw(
                part,
                [p.grad for p in part],
                [st["exp_avg"] for st in states],
                [st["exp_avg_sq"] for st in states],
                [],
                [st["step"] for st in states],
                foreach=True,
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=bool(group.get("maximize", False)),
            )

    # -- state ---------------------------------------------------------------------------------
    def _init_point_state(self, group: dict[str, Any], point: Point) -> dict:
        """ "step" and the chain's entries at the point (per-part entries of a one-parameter
        point stored as its tensor)."""
        rule = self.rule(group)
        fresh = rule.init(point.geometry, point.value())
        state = {k: (v[0] if point.single and k in rule.parts else v) for k, v in fresh.items()}
        return {"step": self._new_step(), **state}


def _gradient_conditions(items: list[tuple[int, int, Tensor]]) -> list[Tensor]:
    """One condition per device, on the device: every gradient's sum is finite (no read; of
    the local shards of sharded gradients, which the ranks agree on later)."""
    by_device: dict[torch.device, list[Tensor]] = {}
    for _, _, p in items:
        grad = sharding.local(p.grad)
        by_device.setdefault(grad.device, []).append(grad.sum().to(torch.float64))
    return [torch.isfinite(torch.stack(sums)).all() for sums in by_device.values()]


def _unchanged(t: Tensor) -> tuple[int, int]:
    """What changes when a tensor's value is changed through torch: its version counter
    (every in-place operation) and its data pointer (``t.data = ...``). As for autograd's
    saved tensors, a write that bypasses torch (through ``t.numpy()``) is not seen."""
    return t._version, t.data_ptr()
