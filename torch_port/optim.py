"""Riemannian optimizers as ``torch.optim.Optimizer`` subclasses (DESIGN §5, §7; issue 4 item 2).

Each class mirrors a preset of ``reference/optim.py`` with the same arithmetic, in the same order
where torch allows it, so that float64 trajectories agree with the reference to rounding:

========================  =====================================================================
``RiemannianAdam``        ``reference.optim.riemannian_adam`` (moment "frame" or "elementwise")
``RiemannianMomentum``    ``reference.optim.riemannian_momentum``
``RSGD``                  ``reference.optim.rsgd``
``NormalizedRSGD``        ``reference.optim.normalized_rsgd``
========================  =====================================================================

A parameter group names its geometry: ``{"params": [W], "geometry": "stiefel"}`` where W holds a
batch of frames of shape (..., d, r), one frame per trailing d×r matrix. Optional group keys
"retraction" ("polar", default; "polar_svd", "qr", "exp") and "metric" ("embedded", default;
"canonical") choose the Stiefel variant. Groups without a geometry hold plain parameters and are
updated, in the same optimizer, by AdamW with decoupled decay in torch's convention and torch's
arithmetic (``torch.optim.AdamW``, single-tensor path), with that group's lr, betas, eps and
weight_decay.

State (per parameter): frames of ``RiemannianAdam`` keep "step", "exp_avg" (the first moment, a
tangent vector at the current frame, transported by projection at every step) and "sqrt_v" (√v,
one scalar per frame: shape (...,) for a batch (..., d, r); full size only for the
``moment="elementwise"`` ablation); ``RiemannianMomentum`` keeps "step" and "momentum_buffer";
``RSGD`` and ``NormalizedRSGD`` keep "step"; plain parameters keep torch's "step", "exp_avg" and
"exp_avg_sq".

Weight decay on frames does nothing: the Riemannian gradient of (λ/2)‖W‖² on St(d, r) is
P_W(λW) = 0 (RA-5). Asking for it on a frame group raises a ``FrameDecayWarning`` and the decay is
not applied.

Bad input. Before any parameter or state changes, every gradient of the step is checked: a
non-finite gradient raises ValueError naming the parameter and the count of bad entries, or, for
groups built with ``skip_nonfinite=True``, skips the whole step with a
``NonFiniteGradientWarning``. A frame is checked to lie on its manifold when its state is created
(the first step), with the measured residual in the error. All frame updates are computed before
any is written, so an error raised while computing one (e.g. a step that overflows) leaves every
parameter and every state as it was.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torch_port.stiefel import METRICS, RETRACTIONS, Stiefel

Tensor = torch.Tensor

#: Geometries a parameter group may name (the other nine come with the rest of issue 4).
GEOMETRIES: dict[str, type] = {"stiefel": Stiefel}
MOMENTS = ("frame", "elementwise")
REDUCTIONS = ("mean", "sum")


class FrameDecayWarning(UserWarning):
    """Weight decay was requested on a group of frames; it does nothing there (RA-5)."""


class NonFiniteGradientWarning(UserWarning):
    """A step was skipped because a gradient had NaN or inf entries (``skip_nonfinite=True``)."""


_DECAY_MESSAGE = (
    "weight decay on frames does nothing: the Riemannian gradient of (λ/2)‖W‖² is P_W(λW) = 0 "
    "on St(d, r) (RA-5); weight_decay={wd} is ignored for this group of frames"
)


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the first frame outside torch_port and
    torch (the user's line), whatever path led here."""
    frame, level = sys._getframe(1), 1
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        if "/torch_port/" not in filename and "/torch/" not in filename:
            return level
        frame, level = frame.f_back, level + 1
    return 1


# -- validation of hyperparameters -------------------------------------------------------------
def _is_real(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _positive(name: str, v: Any) -> float:
    if not (_is_real(v) and math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    return float(v)


def _nonnegative(name: str, v: Any) -> float:
    if not (_is_real(v) and math.isfinite(v) and v >= 0.0):
        raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
    return float(v)


def _beta(name: str, v: Any) -> float:
    if not (_is_real(v) and 0.0 <= v < 1.0):
        raise ValueError(f"{name} must lie in [0, 1), got {v!r}")
    return float(v)


def _betas(v: Any) -> tuple[float, float]:
    if not (isinstance(v, tuple | list) and len(v) == 2):
        raise ValueError(f"betas must be a pair of numbers (beta1, beta2), got {v!r}")
    return _beta("beta1", v[0]), _beta("beta2", v[1])


# -- per-frame helpers (shapes: a frame batch (..., d, r) -> per-frame scalars (...,)) ----------
def _col(s: Tensor) -> Tensor:
    """Per-frame scalars (...,) broadcast against frames (..., d, r)."""
    return s[..., None, None]


def _rdiv(num: float, den: Tensor) -> Tensor:
    """num/den for a Python number over a tensor, as one IEEE division (``num / tensor`` in torch
    is reciprocal-then-multiply: two roundings)."""
    return torch.full_like(den, num) / den


def _safe_ratio(num: float, den: Tensor) -> Tensor:
    """num/den with 0/0 := 0 (a zero gradient gives a zero step)."""
    return torch.where(den == 0, torch.zeros_like(den), _rdiv(num, den))


def _frame_rms(geometry: Stiefel, x: Tensor, g: Tensor) -> Tensor:
    """RMS(g) = ‖g‖/sqrt(entries) per frame, as s·(‖g/s‖/sqrt(entries)) with s = max|g|
    (reference ``optim._frame_rms`` computes (s·‖g/s‖)/sqrt(entries); the port divides first,
    so that gradients with every entry near the largest float do not overflow)."""
    s = g.abs().amax(dim=(-2, -1))
    safe = torch.where(s == 0, torch.ones_like(s), s)
    n = geometry.frame_norm(x, g / _col(safe))
    return torch.where(s == 0, s, s * (n / math.sqrt(g.shape[-2] * g.shape[-1])))


def _trust_region(geometry: Stiefel, x: Tensor, u: Tensor, radius: float) -> Tensor:
    """Per frame, ξ ← ξ·min(1, Δ/‖ξ‖) with min(1, Δ/0) := 1."""
    n = geometry.frame_norm(x, u)
    factor = torch.where(n > 0, torch.clamp(_rdiv(radius, n), max=1.0), torch.ones_like(n))
    return u * _col(factor)


# -- the base class ----------------------------------------------------------------------------
class _RiemannianOptimizer(torch.optim.Optimizer):
    """Shared machinery: group validation, the bad-gradient check, AdamW for plain groups, and
    the compute-all-then-commit frame step. Subclasses define ``_init_frame_state`` and
    ``_frame_step`` (the tangent step ξ at x and the new state, before transport) and list the
    state entries that are tangent vectors in ``_transported``."""

    _transported: tuple[str, ...] = ()

    def __init__(self, params: Iterable, defaults: dict[str, Any]):
        self._geometries: dict[tuple, Stiefel] = {}
        #: How many steps were skipped for non-finite gradients (``skip_nonfinite=True``).
        self.skipped_steps = 0
        super().__init__(params, defaults)

    # -- groups ------------------------------------------------------------------------------
    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        """Validate the hyperparameters of one group (subclasses extend)."""
        _positive("lr", group["lr"])
        _betas(group["betas"])
        _nonnegative("eps", group["eps"])
        _nonnegative("weight_decay", group["weight_decay"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._check_group(group)
        except Exception:
            self.param_groups.pop()
            raise

    def _check_group(self, group: dict[str, Any]) -> None:
        self._check_hyperparameters(group)
        name = group.get("geometry")
        for p in group["params"]:
            if not p.dtype.is_floating_point or p.is_complex():
                raise TypeError(f"parameters must have a real floating dtype, got {p.dtype}")
        if name is None:
            return
        if name not in GEOMETRIES:
            raise ValueError(
                f"unknown geometry {name!r} for a parameter group; choose one of "
                f"{tuple(GEOMETRIES)} (or none, for plain parameters updated by AdamW)"
            )
        if group.get("retraction", "polar") not in RETRACTIONS:
            raise ValueError(
                f"unknown retraction {group['retraction']!r}; choose one of {RETRACTIONS}"
            )
        if group.get("metric", "embedded") not in METRICS:
            raise ValueError(f"unknown metric {group['metric']!r}; choose one of {METRICS}")
        for p in group["params"]:
            if p.ndim < 2 or p.shape[-1] > p.shape[-2] or p.shape[-1] < 1:
                raise ValueError(
                    "a Stiefel group holds frames of shape (..., d, r) with 1 ≤ r ≤ d, got a "
                    f"parameter of shape {tuple(p.shape)}"
                )
        if group["weight_decay"] > 0.0:
            warnings.warn(
                _DECAY_MESSAGE.format(wd=group["weight_decay"]),
                FrameDecayWarning,
                stacklevel=_caller_stacklevel(),
            )

    def _geometry(self, group: dict[str, Any], p: Tensor) -> Stiefel:
        key = (
            group["geometry"],
            int(p.shape[-2]),
            int(p.shape[-1]),
            group.get("retraction", "polar"),
            group.get("metric", "embedded"),
        )
        if key not in self._geometries:
            name, d, r, retraction, metric = key
            self._geometries[key] = GEOMETRIES[name](d, r, retraction=retraction, metric=metric)
        return self._geometries[key]

    @staticmethod
    def _new_step() -> Tensor:
        dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        return torch.tensor(0.0, dtype=dtype)

    # -- the step ----------------------------------------------------------------------------
    def _param_name(self, gi: int, pi: int, p: Tensor) -> str:
        names = self.param_groups[gi].get("param_names")
        if names is not None and pi < len(names):
            return f"{names[pi]!r} (param_groups[{gi}], shape {tuple(p.shape)})"
        return f"param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)})"

    def _validate(self, items: list[tuple[int, int, Tensor]]) -> bool:
        """Check every gradient (one host synchronisation per device) and every frame that has
        no state yet. Returns False when the step is to be skipped; raises on bad input. Nothing
        has been changed when this raises or returns False."""
        for gi, pi, p in items:
            if p.grad.is_sparse:
                raise ValueError(
                    f"sparse gradient for {self._param_name(gi, pi, p)}: not supported"
                )
        counts: list[int] = [0] * len(items)
        by_device: dict[torch.device, list[int]] = {}
        for k, (_, _, p) in enumerate(items):
            by_device.setdefault(p.grad.device, []).append(k)
        for ks in by_device.values():
            stacked = torch.stack([(~torch.isfinite(items[k][2].grad)).sum() for k in ks])
            for k, c in zip(ks, stacked.tolist(), strict=True):
                counts[k] = int(c)
        bad = [(item, c) for item, c in zip(items, counts, strict=True) if c]
        if bad:
            lines = [
                f"{self._param_name(gi, pi, p)}: {c} non-finite entries (NaN or inf) of "
                f"{p.grad.numel()}"
                for (gi, pi, p), c in bad
            ]
            message = "non-finite gradient for " + "; ".join(lines)
            if all(self.param_groups[gi].get("skip_nonfinite", False) for (gi, _, _), _ in bad):
                warnings.warn(
                    message + "; the step was skipped (no parameter or state changed)",
                    NonFiniteGradientWarning,
                    stacklevel=_caller_stacklevel(),
                )
                return False
            raise ValueError(
                message + "; no parameter or state was changed (pass skip_nonfinite=True to "
                "skip such steps with a warning instead)"
            )
        for gi, pi, p in items:
            group = self.param_groups[gi]
            if group.get("geometry") is not None and not self.state.get(p):
                try:
                    self._geometry(group, p).check_point(p.detach())
                except ValueError as err:
                    raise ValueError(f"{self._param_name(gi, pi, p)}: {err}") from None
        return True

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient (see the module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        items = [
            (gi, pi, p)
            for gi, group in enumerate(self.param_groups)
            for pi, p in enumerate(group["params"])
            if p.grad is not None
        ]
        if not items:
            return loss
        if not self._validate(items):
            self.skipped_steps += 1
            return loss
        # Frames: compute every new point and state first, then write them all.
        pending = []
        for gi, pi, p in items:
            group = self.param_groups[gi]
            if group.get("geometry") is None:
                continue
            try:
                pending.append((p, *self._frame_update(group, p)))
            except ValueError as err:
                raise ValueError(
                    f"{self._param_name(gi, pi, p)}: {err}; no parameter or state was changed"
                ) from err
        for p, y, new in pending:
            p.copy_(y)
            self.state[p].update(new)
        # Plain parameters: AdamW, in place, with torch's arithmetic.
        for gi, _, p in items:
            group = self.param_groups[gi]
            if group.get("geometry") is None:
                self._adamw(group, p)
        return loss

    def _frame_update(self, group: dict[str, Any], p: Tensor) -> tuple[Tensor, dict]:
        """The new frame and its new state, computed without writing anything."""
        geometry = self._geometry(group, p)
        state = self.state.get(p) or self._init_frame_state(group, p)  # stored at commit
        x = p.detach()
        g = geometry.egrad_to_rgrad(x, p.grad)
        xi, new = self._frame_step(group, geometry, x, g, state)
        y = geometry.retract(x, xi)  # polar raises on a non-finite or rank-deficient W + ξ
        if geometry.retraction != "polar":
            bad = int((~torch.isfinite(y)).sum())
            if bad:
                raise ValueError(f"the point after this step has {bad} non-finite entries")
        for key in self._transported:
            new[key] = geometry.transport(x, y, new[key])
        return y, new

    # -- AdamW (torch.optim.AdamW, single-tensor path, decoupled decay) -----------------------
    def _adamw(self, group: dict[str, Any], p: Tensor) -> None:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = self._new_step()
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        grad, exp_avg, exp_avg_sq = p.grad, state["exp_avg"], state["exp_avg_sq"]
        lr, (beta1, beta2) = group["lr"], group["betas"]
        eps, weight_decay = group["eps"], group["weight_decay"]
        state["step"] += 1
        if weight_decay != 0:
            p.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = state["step"].item()
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-step_size)

    # -- what subclasses define ---------------------------------------------------------------
    def _init_frame_state(self, group: dict[str, Any], p: Tensor) -> dict[str, Tensor]:
        return {"step": self._new_step()}

    def _frame_step(
        self,
        group: dict[str, Any],
        geometry: Stiefel,
        x: Tensor,
        g: Tensor,
        state: dict[str, Tensor],
    ) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError


# -- the four presets ----------------------------------------------------------------------------
class RiemannianAdam(_RiemannianOptimizer):
    """Riemannian Adam of Stiefel attention (``reference.optim.riemannian_adam``).

    On a frame (per trailing d×r matrix): g = P_W(G); m ← β1·m + (1 − β1)g;
    √v ← hypot(√β2·√v, √(1 − β2)·RMS(g)) (one scalar per frame; RMS computed scaled);
    m̂ = m/(1 − β1^t), √v̂ = √v/sqrt(1 − β2^t); ξ = −lr·m̂/(√v̂ + ε) with 0/0 := 0;
    ξ ← ξ·min(1, Δ/‖ξ‖) when ``trust_radius`` Δ is given; W ← polar(W + ξ); m ← P_W(m).
    ``moment="elementwise"`` keeps one √v per entry and projects the direction back to the
    tangent space (the ablation arm). ``reduction="sum"`` uses ‖g‖ instead of RMS(g).
    Plain groups: AdamW with the group's lr, betas, eps and weight_decay (torch's convention).

    Args:
        params: parameters or parameter groups; a group with ``"geometry": "stiefel"`` holds
            frames (..., d, r).
        lr, betas, eps: as ``torch.optim.AdamW``.
        trust_radius: Δ, the cap on ‖ξ‖ per frame (None: no cap).
        weight_decay: decoupled decay of plain parameters; on frames it warns and does nothing.
        moment: "frame" (one scalar √v per frame) or "elementwise".
        reduction: "mean" (RMS, default) or "sum" (‖g‖) for the frame moment.
        skip_nonfinite: skip a step whose gradients have NaN/inf entries (with a warning)
            instead of raising ValueError.
    """

    _transported = ("exp_avg",)

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        trust_radius: float | None = None,
        weight_decay: float = 0.0,
        moment: str = "frame",
        reduction: str = "mean",
        skip_nonfinite: bool = False,
    ):
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            trust_radius=trust_radius,
            weight_decay=weight_decay,
            moment=moment,
            reduction=reduction,
            skip_nonfinite=skip_nonfinite,
        )
        super().__init__(params, defaults)

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        super()._check_hyperparameters(group)
        if group["trust_radius"] is not None:
            _positive("trust_radius", group["trust_radius"])
        if group["moment"] not in MOMENTS:
            raise ValueError(f"unknown moment {group['moment']!r}; choose one of {MOMENTS}")
        if group["reduction"] not in REDUCTIONS:
            raise ValueError(
                f"unknown reduction {group['reduction']!r}; choose one of {REDUCTIONS}"
            )

    def _init_frame_state(self, group: dict[str, Any], p: Tensor) -> dict[str, Tensor]:
        if group["moment"] == "frame":
            sqrt_v = p.new_zeros(p.shape[:-2])
        else:
            sqrt_v = torch.zeros_like(p, memory_format=torch.preserve_format)
        return {
            "step": self._new_step(),
            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "sqrt_v": sqrt_v,
        }

    def _frame_step(self, group, geometry, x, g, state):
        lr, (b1, b2), eps = group["lr"], _betas(group["betas"]), group["eps"]
        t = int(state["step"].item()) + 1
        m = b1 * state["exp_avg"] + (1.0 - b1) * g
        c1, c2 = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
        rb2, r1mb2 = math.sqrt(b2), math.sqrt(1.0 - b2)
        sv = state["sqrt_v"]
        if group["moment"] == "frame":
            if group["reduction"] == "mean":
                root = _frame_rms(geometry, x, g)
            else:
                root = geometry.frame_norm(x, g)
            sqrt_v = torch.hypot(rb2 * sv, r1mb2 * root)
            scales = _safe_ratio(1.0 / c1, sqrt_v / c2 + eps)
            direction = m * _col(scales)
        else:
            sqrt_v = torch.hypot(rb2 * sv, r1mb2 * torch.abs(g))
            den = sqrt_v / c2 + eps
            ratios = torch.where(den > 0, (m / c1) / den, torch.zeros_like(m))
            direction = geometry.proj_tangent(x, ratios)
        xi = -lr * direction
        if group["trust_radius"] is not None:
            xi = _trust_region(geometry, x, xi, group["trust_radius"])
        step = torch.full_like(state["step"], t)
        return xi, {"step": step, "exp_avg": m, "sqrt_v": sqrt_v}


class RiemannianMomentum(_RiemannianOptimizer):
    """The low-rank template (``reference.optim.riemannian_momentum``): on a frame,
    M ← β·M + (1 − β)·P_W(G); ξ = −lr·M/max(‖M‖, c) per frame; W ← polar(W + ξ); M ← P_W(M).
    Plain groups: AdamW with the group's lr, betas, eps and weight_decay."""

    _transported = ("momentum_buffer",)

    def __init__(
        self,
        params: Iterable,
        lr: float,
        beta: float = 0.9,
        c: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        skip_nonfinite: bool = False,
    ):
        defaults = dict(
            lr=lr,
            beta=beta,
            c=c,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            skip_nonfinite=skip_nonfinite,
        )
        super().__init__(params, defaults)

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        super()._check_hyperparameters(group)
        _beta("beta", group["beta"])
        _positive("c", group["c"])

    def _init_frame_state(self, group: dict[str, Any], p: Tensor) -> dict[str, Tensor]:
        return {
            "step": self._new_step(),
            "momentum_buffer": torch.zeros_like(p, memory_format=torch.preserve_format),
        }

    def _frame_step(self, group, geometry, x, g, state):
        lr, beta, c = group["lr"], group["beta"], group["c"]
        m = beta * state["momentum_buffer"] + (1.0 - beta) * g
        n = geometry.frame_norm(x, m)
        u = m * _col(_rdiv(1.0, torch.clamp(n, min=c)))
        step = state["step"] + 1
        return -lr * u, {"step": step, "momentum_buffer": m}


class RSGD(_RiemannianOptimizer):
    """Fixed-step Riemannian gradient descent (``reference.optim.rsgd``): ξ = −lr·P_W(G), capped
    per frame at ‖ξ‖ ≤ Δ when ``trust_radius`` is given. Plain groups: AdamW."""

    def __init__(
        self,
        params: Iterable,
        lr: float,
        trust_radius: float | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        skip_nonfinite: bool = False,
    ):
        defaults = dict(
            lr=lr,
            trust_radius=trust_radius,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            skip_nonfinite=skip_nonfinite,
        )
        super().__init__(params, defaults)

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        super()._check_hyperparameters(group)
        if group["trust_radius"] is not None:
            _positive("trust_radius", group["trust_radius"])

    def _frame_step(self, group, geometry, x, g, state):
        xi = -group["lr"] * g
        if group["trust_radius"] is not None:
            xi = _trust_region(geometry, x, xi, group["trust_radius"])
        return xi, {"step": state["step"] + 1}


class NormalizedRSGD(_RiemannianOptimizer):
    """ξ = −lr·P_W(G)/RMS(P_W(G)) per frame, 0/0 := 0 (``reference.optim.normalized_rsgd``).
    Plain groups: AdamW."""

    def __init__(
        self,
        params: Iterable,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        skip_nonfinite: bool = False,
    ):
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, skip_nonfinite=skip_nonfinite
        )
        super().__init__(params, defaults)

    def _frame_step(self, group, geometry, x, g, state):
        u = g * _col(_safe_ratio(1.0, _frame_rms(geometry, x, g)))
        return -group["lr"] * u, {"step": state["step"] + 1}


__all__ = [
    "GEOMETRIES",
    "RSGD",
    "FrameDecayWarning",
    "NonFiniteGradientWarning",
    "NormalizedRSGD",
    "RiemannianAdam",
    "RiemannianMomentum",
]
