"""``RiemannianAdam(capturable=True)``: the same step as the eager one, with no host read.

The frames move by the eager step's own arithmetic (``torch_port.optim.update.move``: the
chain of ``rule(group)``, P_W(G), the retraction and the transport), run in the device mode of
``torch_port.deferred``, which reads nothing:

- a fast route of the eager step that common inputs leave (an unscaled norm at a zero
  gradient, an unscaled step factor where √v = 0) gives way to its branch-free route, right in
  every case; one that only values near the dtype's largest leave (an overflowing RMS, WᵀG or
  Yᵀm) is taken, and its failure skips the step; norms of float32 and half-precision frames
  are accumulated in float64, whose range holds their squares (``linalg.norm_of_parts``);
- the polar factor polar(A) = A (AᵀA)^{-1/2} is a Taylor polynomial of (I + E)^{-1/2} of a
  degree fixed in advance, E = AᵀA/α − I with α = tr(AᵀA)/r: for A = W + ξ, ξ tangent with
  ‖ξ‖ ≤ Δ (the trust radius, which this step requires), the eigenvalues of AᵀA lie in
  [1, 1 + Δ²] up to the frame's drift, so ‖E‖₂ ≤ Δ² + η (``series_bound``; η = 1e-3 covers
  ‖WᵀW − I‖ and the tangency of ξ, both rounding-sized) and ``linalg.polar_plan`` takes the
  degree whose tail bound at that δ is below its tolerance;
- what the eager step would refuse (a non-finite gradient, tensor lr, Gram or new frame, an
  unrepresentable moment) becomes a condition of the step, decided on the device: a step
  whose conditions fail changes nothing (every new value is selected against the old one by
  ``torch.where``), and the optimizer counts it in ``skipped_on_device``.

Frames of one group and one (d, r, dtype) step as one batch, each with its own step count.
Plain parameters take AdamW with its new values selected in the same way (``adamw``; torch's
fused AdamW, whose ``found_inf`` does the same, is not traced by ``torch.compile``, and its
capturable path refuses CPU tensors). The state is the eager step's ("step", "exp_avg",
"sqrt_v"), "step" a device tensor, so state dicts move between the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from torch_port import deferred, linalg
from torch_port.linalg import Tensor
from torch_port.optim import update
from torch_port.optim.guard.values import capturable_radius
from torch_port.optim.points import closure_loss, stepping
from torch_port.stiefel import Stiefel, StiefelFrames

#: The slack η added to Δ² in the bound on ‖E‖₂: ‖WᵀW − I‖ and the tangency error of ξ.
DRIFT_SLACK = 1e-3


def series_bound(radius: float) -> float:
    """δ = Δ² + η, the bound on ‖E‖₂ = ‖AᵀA/α − I‖₂ for A = W + ξ, ‖ξ‖ ≤ Δ (module
    docstring), for which the polar series' degree is chosen."""
    return capturable_radius(radius) ** 2 + DRIFT_SLACK


def polar_series(a: Tensor, radius: float) -> Tensor:
    """polar(A) as the capturable step forms it for a trust radius Δ: the series of the
    degree whose tail at ‖E‖₂ ≤ ``series_bound(Δ)`` is below ``linalg.series_tolerance``
    (from the float64 Gram of A: the step's own Gram for float64 frames)."""
    with deferred.speculate({}, "device", series_bound(radius)):
        inv_sqrt, _ = linalg.polar_plan(a)
    return a @ inv_sqrt


def step_numbers(states: list[dict[str, Any]], frames: list[tuple[int, ...]]) -> Tensor:
    """The new step count of every frame of a batch (its parameter's "step" + 1, one per
    frame: parameters batched together may have taken different numbers of steps)."""
    return _batched([(s["step"] + 1).expand(f) for s, f in zip(states, frames, strict=True)], 0)


def _batched(ts: list[Tensor], tail: int) -> Tensor:
    """The tensors as one batch over their leading dimensions, keeping the last ``tail``: a
    view for one tensor, a concatenation for several."""
    flat = [t.reshape(-1, *t.shape[t.ndim - tail :]) if tail else t.reshape(-1) for t in ts]
    return flat[0] if len(flat) == 1 else torch.cat(flat)


def _frame_state(opt: Any, p: Tensor, rule: Any, geometry: StiefelFrames) -> dict:
    """A frame's state, made by the rule's ``init`` on p's device when it has none (an
    existing one the guard has checked, ``check_step``)."""
    state = opt.state[p]
    if not state:
        fresh = rule.init(geometry, (p.detach(),))
        state.update({k: v[0] if k in rule.parts else v for k, v in fresh.items()})
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
    return state


def _plain_state(opt: Any, p: Tensor) -> dict:
    """A plain parameter's state (torch AdamW's), made on p's device when it has none."""
    state = opt.state[p]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
    return state


def _frames(opt: Any, gi: int, ps: list[Tensor]) -> tuple[Callable[[Tensor], None], list]:
    """The move of a batch of frames of group ``gi`` (``update.move`` in the device mode),
    and the conditions it recorded; the move is returned as its commit, which writes each
    new value where a 0-d ``ok`` holds."""
    group = opt.param_groups[gi]
    rule = opt.rule(group)
    d, r = ps[0].shape[-2:]
    geometry = StiefelFrames(Stiefel(d, r))  # polar, embedded: the guard's capturable_group
    states = [_frame_state(opt, p, rule, geometry) for p in ps]
    lead = ps[0].ndim - 2  # an entry keeps its dimensions after the frames' batch ones
    stored = {
        k: _batched([s[k] for s in states], states[0][k].ndim - lead)
        for k in states[0]
        if k != "step"
    }
    state = {k: (v,) if k in rule.parts else v for k, v in stored.items()}
    x = (_batched([p.detach() for p in ps], 2),)
    egrad = (_batched([p.grad for p in ps], 2),)
    t = step_numbers(states, [tuple(p.shape[:-2]) for p in ps])
    with deferred.speculate({}, "device", series_bound(group["trust_radius"])) as spec:
        y, new = update.move(geometry, rule, group, x, egrad, state, t)
    new = {k: v[0] if k in rule.parts else v for k, v in new.items()}
    sizes = [math.prod(p.shape[:-2]) for p in ps]

    def commit(ok: Tensor) -> None:
        for p, yi in zip(ps, y[0].split(sizes), strict=True):
            p.copy_(torch.where(ok, yi.reshape(p.shape), p))
        for k, v in new.items():
            for st, vi in zip(states, v.split(sizes), strict=True):
                st[k].copy_(torch.where(ok, vi.reshape(st[k].shape), st[k]))
        for st in states:
            st["step"].add_(ok.to(st["step"].dtype))

    return commit, spec.conditions


@torch.no_grad()
def step(opt: Any, closure: Callable[[], Any] | None = None) -> Any:
    """The capturable step of ``RiemannianAdam`` (module docstring): every frame of one group
    and one (d, r, dtype) in one batch, the plain parameters by ``adamw``, every new value
    selected against the old one by the step's conditions."""
    loss = closure_loss(closure)
    items = stepping(opt.param_groups)
    if not items:
        return loss
    opt.check_step(items, "capturable")  # before any state is made or anything written
    frames: dict[tuple, list[Tensor]] = {}
    plain: dict[int, list[Tensor]] = {}
    for gi, _, p in items:
        if opt.param_groups[gi].get("geometry") is None:
            plain.setdefault(gi, []).append(p)
        else:
            frames.setdefault((gi, tuple(p.shape[-2:]), p.dtype), []).append(p)
    commits, conditions = [], []
    for (gi, _, _), ps in frames.items():
        commit, recorded = _frames(opt, gi, ps)
        commits.append(commit)
        conditions += recorded
    lrs = [g["lr"] for g in opt.param_groups if isinstance(g["lr"], Tensor)]
    ok = proceeds([p.grad for _, _, p in items], lrs, conditions)
    for gi, ps in plain.items():
        adamw(opt.param_groups[gi], ps, [_plain_state(opt, p) for p in ps], ok)
    for commit in commits:
        commit(ok)
    if opt.skipped_on_device is None:
        opt.skipped_on_device = torch.zeros((), dtype=torch.float32, device=ok.device)
    opt.skipped_on_device.add_((~ok).to(torch.float32))  # in place: counted at every replay
    return loss


def proceeds(grads: list[Tensor], lrs: list[Tensor], conditions: list[Tensor]) -> Tensor:
    """Whether the step is taken, a 0-d bool decided on the device: every gradient finite (its
    float64 sum finite), the tensor lr of every group finite and ≥ 0 (a negative or NaN lr,
    of a group that steps or not, skips the step; lr = 0 takes it without moving), every
    condition the frames' moves recorded."""
    verdicts = [
        # float64 sums (fused with the gradients' other readers) hold any count of finite
        # float32 or half-precision entries
        torch.isfinite(torch.stack([g.sum(dtype=torch.float64) for g in grads])).all(),
        *(torch.isfinite(lr) & (lr >= 0) for lr in lrs),
        *conditions,
    ]
    return deferred.all_hold(verdicts)


def adamw(group: dict, params: list[Tensor], states: list[dict], ok: Tensor) -> None:
    """torch's AdamW (decoupled decay) on plain parameters, each new value selected against
    the old one by ``ok``: p ← p(1 − lr·λ) − (lr/(1 − β1^t))·m/(√v/sqrt(1 − β2^t) + ε), with
    m ← β1·m + (1 − β1)g, v ← β2·v + (1 − β2)g², g the gradient (−gradient with
    ``maximize``). A tensor lr is taken in float64, as the eager step takes its value."""
    b1, b2 = group["betas"]
    lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
    if isinstance(lr, Tensor):
        lr = lr.to(torch.float64)
    for p, st in zip(params, states, strict=True):
        t = (st["step"] + 1).to(torch.float64)
        c1, c2 = 1.0 - torch.pow(b1, t), torch.sqrt(1.0 - torch.pow(b2, t))
        g = -p.grad if group.get("maximize", False) else p.grad
        m = torch.lerp(st["exp_avg"], g, 1.0 - b1)
        v = st["exp_avg_sq"] * b2 + (1.0 - b2) * g * g
        new = p * (1.0 - lr * wd) - (lr / c1) * m / (torch.sqrt(v) / c2 + eps)
        p.copy_(torch.where(ok, new, p))
        st["exp_avg"].copy_(torch.where(ok, m, st["exp_avg"]))
        st["exp_avg_sq"].copy_(torch.where(ok, v, st["exp_avg_sq"]))
        st["step"].add_(ok.to(st["step"].dtype))
