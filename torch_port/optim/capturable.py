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
from torch_port.optim import transforms
from torch_port.optim.guard.values import capturable_radius
from torch_port.optim.points import stepping

#: The slack η added to Δ² in the bound on ‖E‖₂: ‖WᵀW − I‖ and the tangency error of ξ.
DRIFT_SLACK = 1e-3


def taylor_degree(radius: float) -> int:
    """The degree k of the Taylor polynomial of (1 + e)^{-1/2} whose tail over |e| ≤ δ,
    Σ_{j>k} |c_j| δ^j ≤ δ^{k+1}/(1 − δ) (|c_j| ≤ 1), is at most 1e-17, for δ = Δ² + η."""
    return linalg._taylor_degree(capturable_radius(radius) ** 2 + DRIFT_SLACK)


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


def _state(opt: Any, p: Tensor, frame: bool) -> dict:
    """The parameter's state, created on its device when it has none (a frame's: "step",
    "exp_avg", "sqrt_v"; a plain parameter's: torch AdamW's); an existing one the guard has
    checked (``check_step``)."""
    state = opt.state[p]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        if frame:
            state["sqrt_v"] = p.new_zeros(p.shape[:-2], dtype=transforms.sqrt_v_dtype(p.dtype))
        else:
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
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
    items = stepping(opt.param_groups)
    if not items:
        return loss
    opt.check_step(items, "capturable")  # before any state is made or anything written
    frames: dict[tuple, list[Tensor]] = {}
    plain: dict[int, list[Tensor]] = {}
    for gi, _, p in items:
        group = opt.param_groups[gi]
        if group.get("geometry") is None:
            plain.setdefault(gi, []).append(p)
        else:
            frames.setdefault(_bucket_key(group, p), []).append(p)
    frame_states = {key: [_state(opt, p, frame=True) for p in ps] for key, ps in frames.items()}
    for ps in plain.values():
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
    ok = proceeds([p.grad for _, _, p in items], lrs, frames_finite)
    skip = (~ok).to(torch.float32)
    for gi, ps in plain.items():
        _adamw(opt, opt.param_groups[gi], ps, ok)
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
