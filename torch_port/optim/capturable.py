"""The Stiefel frame step of ``RiemannianAdam(capturable=True)``: no host synchronisation.

The eager step checks its input on the host (a non-finite gradient raises, the polar factor
picks its route from the measured Gram) and so cannot be traced by ``torch.compile`` as one
graph nor captured in a CUDA graph. This step takes every decision on the device:

- the polar factor polar(A) = A (AᵀA)^{-1/2} is a Taylor polynomial of (I + E)^{-1/2} of a
  degree fixed in advance, E = AᵀA/α − I with α = tr(AᵀA)/r: for A = W + ξ, ξ tangent with
  ‖ξ‖ ≤ Δ (the trust radius, which this step requires), the eigenvalues of AᵀA lie in
  [1, 1 + Δ²] up to the frame's drift, so ‖E‖₂ ≤ Δ² + η and the degree k with
  (Δ² + η)^{k+1}/(1 − Δ² − η) ≤ 1e-17 truncates below float64 rounding (``taylor_degree``;
  η = 1e-3 covers ‖WᵀW − I‖ and the tangency of ξ, both rounding-sized);
- RMS(g) is taken from a float64-accumulated norm (no overflow for float32/bfloat16/float16
  frames; float64 frames are divided by their largest entry first, as the reference does);
- a step with a non-finite gradient, or one that would make a non-finite frame, changes
  nothing: every new value is selected against the old one on the device (``torch.where``),
  and the optimizer counts the skipped steps in a device tensor.

Per frame, as the eager ``RiemannianAdam``: g = P_W(G); m ← β1·m + (1 − β1)g;
√v ← hypot(√β2·√v, √(1 − β2)·RMS(g)); ξ = −lr·(m/(1 − β1^t))/(√v/sqrt(1 − β2^t) + ε), capped at
‖ξ‖ ≤ Δ; W ← polar(W + ξ); m ← P_W(m). The state is the eager step's ("step", "exp_avg",
"sqrt_v"), "step" a device tensor, so state dicts move between the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from torch_port import linalg
from torch_port.linalg import Tensor, sym, transpose
from torch_port.optim import checks, sharding, transforms

#: Above this trust radius the fixed-degree series needs too many terms (Δ = 0.7: degree 55).
MAX_RADIUS = 0.7
#: The slack η added to Δ² in the bound on ‖E‖₂: ‖WᵀW − I‖ and the tangency error of ξ.
DRIFT_SLACK = 1e-3


def taylor_degree(radius: float) -> int:
    """The degree k of the Taylor polynomial of (1 + e)^{-1/2} whose tail over |e| ≤ δ,
    Σ_{j>k} |c_j| δ^j ≤ δ^{k+1}/(1 − δ) (|c_j| ≤ 1), is at most 1e-17, for δ = Δ² + η."""
    if not 0.0 < radius <= MAX_RADIUS:
        raise ValueError(
            f"capturable=True needs a trust radius 0 < Δ ≤ {MAX_RADIUS} (the polar factor's "
            f"series is then of a fixed degree), got {radius!r}"
        )
    return linalg._taylor_degree(radius**2 + DRIFT_SLACK)


def polar_fixed(a: Tensor, degree: int) -> Tensor:
    """A (AᵀA)^{-1/2} by the degree-``degree`` Taylor polynomial of (I + E)^{-1/2},
    E = AᵀA/α − I, α = tr(AᵀA)/r, the Gram and the polynomial in float64; a branch-free
    ``linalg.polar`` for matrices with ‖E‖₂ small (no check: the caller bounds it)."""
    gram = linalg.gram64(a)
    alpha = torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1) / a.shape[-1]
    e = linalg._plus_identity(gram / alpha[..., None, None], -1.0)
    h = linalg._inv_sqrt_taylor(e, degree) / torch.sqrt(alpha)[..., None, None]
    return a @ h.to(a.dtype)


def frame_rms(g: Tensor) -> Tensor:
    """RMS(g) = ‖g‖/sqrt(d·r) per frame, in float64: accumulated in float64 for a
    low-precision g, and as s·‖g/s‖, s = max|g|, for a float64 g (whose squares may overflow)."""
    n = g.shape[-2] * g.shape[-1]
    if g.dtype != torch.float64:
        return torch.linalg.vector_norm(g, dim=(-2, -1), dtype=torch.float64) / math.sqrt(n)
    s = linalg.max_abs(g)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    return s * (torch.linalg.vector_norm(g / safe[..., None, None], dim=(-2, -1)) / math.sqrt(n))


def adam_frames(
    w: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    sqrt_v: Tensor,
    t: Tensor,
    *,
    lr: float | Tensor,
    betas: tuple[float, float],
    eps: float,
    radius: float,
    degree: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step of frames w (..., d, r) at step numbers t (the new counts, one per frame, of
    the shape of ``sqrt_v``: parameters batched together may have taken different numbers of
    steps):
    (new frames, new exp_avg, new sqrt_v, finite) with ``finite`` a 0-d bool tensor, false
    when the new frames have a non-finite entry (as they do for a non-finite gradient, or one
    whose WᵀG overflows the dtype); the caller then keeps the old values. Nothing is written."""
    b1, b2 = betas
    x = w.detach()
    rgrad = torch.baddbmm(
        grad.reshape(-1, *w.shape[-2:]),
        x.reshape(-1, *w.shape[-2:]),
        sym(transpose(x) @ grad).reshape(-1, w.shape[-1], w.shape[-1]),
        alpha=-1.0,
    ).reshape(w.shape)
    m = torch.lerp(exp_avg, rgrad.to(exp_avg.dtype), 1.0 - b1)
    root = frame_rms(rgrad).to(sqrt_v.dtype)
    sv = torch.hypot(math.sqrt(b2) * sqrt_v, math.sqrt(1.0 - b2) * root)
    t64 = t.to(torch.float64)
    c1 = 1.0 - torch.pow(b1, t64)
    c2 = torch.sqrt(1.0 - torch.pow(b2, t64))
    den = (sv / c2 + eps).to(torch.float64)
    coef = (-lr / c1) / den  # ξ = coef·m per frame (den ≥ ε > 0)
    norm = torch.linalg.vector_norm(m, dim=(-2, -1), dtype=torch.float64) * coef.abs()
    coef = coef * torch.where(norm > radius, radius / norm, torch.ones_like(norm))
    if x.dtype.itemsize < 4:  # the factor may exceed a half-precision range where m ≈ 0
        a = torch.addcmul(x.float(), m.float(), coef[..., None, None].float()).to(x.dtype)
    else:
        a = torch.addcmul(x, m.to(x.dtype), coef[..., None, None].to(x.dtype))
    # lr = 0 (torch.distributed.checkpoint's state-making step, a schedule's end) does not
    # move: R_W(0) = W exactly, where the polar factor of W would re-form it by rounding
    if isinstance(lr, Tensor):  # decided on the device
        y = torch.where(lr == 0, x, polar_fixed(a, degree))
    else:
        y = x.clone() if lr == 0 else polar_fixed(a, degree)
    moved = m - (y @ sym(transpose(y) @ m.to(y.dtype))).to(m.dtype)
    return y, moved, sv, torch.isfinite(linalg.max_abs(y).amax())


def check_group(group: dict[str, Any]) -> None:
    """A group the capturable step can take: plain parameters, or Stiefel frames with the
    polar retraction, the embedded metric, the frame moment with the mean, ε > 0 and a trust
    radius Δ ≤ ``MAX_RADIUS``, none of them sharded."""
    if group["eps"] <= 0.0:
        raise ValueError(
            f"capturable=True needs eps > 0 (with eps = 0 an underflowing √v has no step), got "
            f"{group['eps']!r}"
        )
    name = group.get("geometry")
    if name is None:
        return
    unsupported = {
        "geometry": (name, "stiefel"),
        "retraction": (group.get("retraction", "polar"), "polar"),
        "metric": (group.get("metric", "embedded"), "embedded"),
        "gradient": (group.get("gradient", "riemannian"), "riemannian"),
        "moment": (group["moment"], "frame"),
        "reduction": (group["reduction"], "mean"),
        "maximize": (bool(group.get("maximize", False)), False),
    }
    for key, (value, supported) in unsupported.items():
        if value != supported:
            raise ValueError(
                f"capturable=True supports {key}={supported!r} (and plain parameters), got "
                f"{key}={value!r}"
            )
    if group["trust_radius"] is None:
        raise ValueError(
            "capturable=True needs trust_radius (Δ ≤ 0.7): it bounds ‖ξ‖, so the polar "
            "factor's series has a degree fixed in advance"
        )
    taylor_degree(group["trust_radius"])
    for p in group["params"]:
        if sharding.is_sharded(p):
            raise ValueError("capturable=True does not take sharded (DTensor) frames")
    _check_step_factor(group)


def _check_step_factor(group: dict[str, Any]) -> None:
    """The largest step factor, lr/((1 − β1)·ε) (√v = 0 at the first step), is finite in the
    dtype ``adam_frames`` forms W + c·m in (float32 for half-precision frames); a tensor lr's
    value is read only where the group is checked on the host."""
    lr = float(group["lr"]) if isinstance(group["lr"], Tensor) else group["lr"]
    top = lr / ((1.0 - group["betas"][0]) * group["eps"])
    for p in group["params"]:
        limit = torch.finfo(torch.promote_types(p.dtype, torch.float32)).max
        if not top < limit:
            raise ValueError(
                f"capturable=True: the step factor lr/((1 − β1)·eps) = {top:.3e} overflows "
                f"{torch.promote_types(p.dtype, torch.float32)} (largest {limit:.3e}); use a "
                "larger eps"
            )


def check_step_group(opt: Any, gi: int, group: dict[str, Any], new: list[Tensor]) -> None:
    """Before a capturable step changes anything: the group's hyperparameters as Python values
    (no device read: a tensor lr's value is checked on the device, ``step``), and for each
    parameter without state yet its layout and, outside ``torch.compile``, its point on
    St(d, r) (the eager step's check of a new point). Under ``torch.compile`` nothing is
    checked here (the traced graph cannot raise on Python values): a compiled step relies on the
    checks made when the group was added or loaded, and on the device check of a tensor lr."""
    if torch.compiler.is_compiling():
        return
    where = f"param_groups[{gi}]"
    try:
        lr = group["lr"]
        if isinstance(lr, Tensor):
            if lr.ndim != 0 or not lr.is_floating_point():
                raise ValueError(
                    f"a tensor lr must be a 0-d floating tensor, got shape {tuple(lr.shape)}"
                )
        else:  # lr = 0: a warm-up, or torch.distributed.checkpoint's state-making step
            checks.nonnegative("lr", lr)
        checks.betas(group["betas"])
        checks.positive("eps", group["eps"])
        checks.nonnegative("weight_decay", group["weight_decay"])
        checks.parameter_layouts(group, new)
        if group.get("geometry") is None:
            checks.plain_eps(group)
            return
        taylor_degree(group["trust_radius"])
        if not isinstance(lr, Tensor) and lr != 0:
            _check_step_factor(group)
    except (ValueError, TypeError) as err:
        raise type(err)(f"{where}: {err}; no parameter or state was changed") from None
    if new:
        fresh = {id(p) for p in new}
        opt._check_points(
            [pt for pt in opt._geometries.points(gi, group) if id(pt.params[0]) in fresh]
        )


def _state(opt: Any, p: Tensor, frame: bool) -> dict:
    """The parameter's state, created on its device when it has none (a frame's: "step",
    "exp_avg", "sqrt_v"; a plain parameter's: torch AdamW's). An existing state must have that
    layout (shapes and devices: metadata, read with no synchronisation); else ValueError,
    raised before the step writes anything."""
    state = opt.state[p]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        if frame:
            state["sqrt_v"] = p.new_zeros(p.shape[:-2], dtype=transforms.sqrt_v_dtype(p.dtype))
        else:
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
    layout = {"step": (), "exp_avg": tuple(p.shape)}
    layout.update({"sqrt_v": tuple(p.shape[:-2])} if frame else {"exp_avg_sq": tuple(p.shape)})
    got = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, Tensor)}
    if (
        got != layout
        or any(v.device != p.device for v in state.values())
        or not all(v.is_contiguous() for v in state.values())  # written in place by copy_
    ):
        raise ValueError(
            f"the state of a parameter of shape {tuple(p.shape)} has entries {got} (devices "
            f"{sorted({str(v.device) for v in state.values()})}); capturable=True expects "
            f"{layout} on {p.device}; no parameter or state was changed"
        )
    return state


def _batched(ts: list[Tensor], tail: int) -> Tensor:
    """The tensors as one batch over their leading dimensions, keeping the last ``tail``: a
    view for one tensor, a concatenation for several."""
    flat = [t.reshape(-1, *t.shape[t.ndim - tail :]) if tail else t.reshape(-1) for t in ts]
    return flat[0] if len(flat) == 1 else torch.cat(flat)


def _bucket_key(group: dict, p: Tensor) -> tuple:
    b1, b2 = group["betas"]
    return (tuple(p.shape[-2:]), p.dtype, group["lr"], b1, b2, group["eps"], group["trust_radius"])


@torch.no_grad()
def step(opt: Any, closure: Callable[[], Any] | None = None) -> Any:
    """The capturable step of ``RiemannianAdam``: every frame of one (d, r, dtype) and one set
    of hyperparameters in one batch (``adam_frames``), the plain parameters by AdamW
    (``_adamw``); every new value selected against the old one by the step's finiteness, so a
    non-finite gradient or frame changes nothing."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    frames: dict[tuple, list[Tensor]] = {}
    plain: list[tuple[dict, list[Tensor]]] = []
    for gi, group in enumerate(opt.param_groups):
        params = [p for p in group["params"] if p.grad is not None]
        for pi, p in enumerate(group["params"]):
            if p.grad is not None:
                checks.gradient_layout(opt._param_name(gi, pi, p), p)
        if params:
            check_step_group(opt, gi, group, [p for p in params if not opt.state.get(p)])
        if group.get("geometry") is None:
            plain.append((group, params))
        for p in params if group.get("geometry") is not None else ():
            frames.setdefault(_bucket_key(group, p), []).append(p)
    every = [p for ps in frames.values() for p in ps] + [p for _, ps in plain for p in ps]
    if not every:
        return loss
    if not torch.compiler.is_compiling():  # after a load, once (a host check)
        opt.check_loaded_moments()
    elif opt._unverified:  # a Python value: part of the traced graph's guards
        raise ValueError(
            "a loaded state holds moments not tangent at the points it saw, which a compiled "
            "step cannot check: call opt.check_loaded_moments() once the model's weights are "
            "loaded, before the compiled step; no parameter or state was changed"
        )
    devices = {p.device for p in every} | {
        g["lr"].device for g in opt.param_groups if isinstance(g["lr"], Tensor)
    }
    if len(devices) > 1:
        raise ValueError(
            f"capturable=True needs every parameter (and a tensor lr) on one device, got {devices}"
        )
    # every existing state's layout is checked before any state is made or anything written
    for ps, frame in [*((ps, True) for ps in frames.values()), *((ps, False) for _, ps in plain)]:
        for p in ps:
            if opt.state.get(p):
                _state(opt, p, frame)
    frame_states = {key: [_state(opt, p, frame=True) for p in ps] for key, ps in frames.items()}
    for _, ps in plain:
        for p in ps:
            _state(opt, p, frame=False)
    updates, frames_finite = [], []
    for key, ps in frames.items():
        _, _, lr, b1, b2, eps, radius = key
        states = frame_states[key]
        y, m, sv, ok = adam_frames(
            _batched(ps, 2),
            _batched([p.grad for p in ps], 2),
            _batched([s["exp_avg"] for s in states], 2),
            _batched([s["sqrt_v"] for s in states], 0),
            _batched([(s["step"] + 1).expand(s["sqrt_v"].shape) for s in states], 0),
            lr=lr,
            betas=(b1, b2),
            eps=eps,
            radius=radius,
            degree=taylor_degree(radius),
        )
        frames_finite.append(ok)
        updates.append((ps, states, y, m, sv))
    lrs = [g["lr"] for g in opt.param_groups if isinstance(g["lr"], Tensor)]
    ok = proceeds([p.grad for p in every], lrs, frames_finite)
    skip = (~ok).to(torch.float32)
    for group, ps in plain:
        _adamw(opt, group, ps, ok)
    for ps, states, y, m, sv in updates:
        sizes = [s["sqrt_v"].numel() for s in states]  # frames per parameter
        for p, st, yi, mi, svi in zip(
            ps, states, y.split(sizes), m.split(sizes), sv.split(sizes), strict=True
        ):
            p.copy_(torch.where(ok, yi.reshape(p.shape), p))
            st["exp_avg"].copy_(torch.where(ok, mi.reshape(p.shape), st["exp_avg"]))
            st["sqrt_v"].copy_(torch.where(ok, svi.reshape(st["sqrt_v"].shape), st["sqrt_v"]))
            st["step"].add_(ok.to(st["step"].dtype))
    if opt.skipped_on_device is None:
        opt.skipped_on_device = torch.zeros((), dtype=torch.float32, device=skip.device)
    opt.skipped_on_device.add_(skip)  # in place: a captured step counts at every replay
    return loss


def proceeds(grads: list[Tensor], lrs: list[Tensor], frames_finite: list[Tensor]) -> Tensor:
    """Whether the step is taken, a 0-d bool decided on the device: every gradient finite,
    every tensor lr finite and ≥ 0 (a negative or NaN lr skips the step; lr = 0 takes it
    without moving), every new frame finite."""
    verdicts = [
        torch.isfinite(torch.stack(torch._foreach_norm(grads, math.inf))),
        *((torch.isfinite(lr) & (lr >= 0)).reshape(1) for lr in lrs),
        *(f.reshape(1) for f in frames_finite),
    ]
    return torch.cat(verdicts).all()


def _adamw(opt: Any, group: dict, params: list[Tensor], ok: Tensor) -> None:
    """torch's AdamW (decoupled decay) on plain parameters, each new value selected against
    the old one by ``ok``: p ← p(1 − lr·λ) − (lr/(1 − β1^t))·m/(√v/sqrt(1 − β2^t) + ε), with
    m ← β1·m + (1 − β1)g, v ← β2·v + (1 − β2)g² (torch's fused AdamW, whose ``found_inf`` does
    the same, is not traced by ``torch.compile``)."""
    b1, b2 = group["betas"]
    lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
    for p in params:
        st = _state(opt, p, frame=False)
        t = (st["step"] + 1).to(torch.float64)
        c1, c2 = 1.0 - torch.pow(b1, t), torch.sqrt(1.0 - torch.pow(b2, t))
        g = p.grad
        m = torch.lerp(st["exp_avg"], g, 1.0 - b1)
        v = st["exp_avg_sq"] * b2 + (1.0 - b2) * g * g
        new = p * (1.0 - lr * wd) - (lr / c1) * m / (torch.sqrt(v) / c2 + eps)
        p.copy_(torch.where(ok, new, p))
        st["exp_avg"].copy_(torch.where(ok, m, st["exp_avg"]))
        st["exp_avg_sq"].copy_(torch.where(ok, v, st["exp_avg_sq"]))
        st["step"].add_(ok.to(st["step"].dtype))
