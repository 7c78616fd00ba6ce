"""The guard's checks of values: hyperparameters, layouts of parameters and gradients, the
capturable step's constraints, and the warnings the optimizers raise. Each raises naming the
value and what was measured; ``torch_port.optim.guard.Guard`` decides when each runs."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import torch

from torch_port.optim import sharding

#: Geometries whose points are frames (orthonormal factors): weight decay does nothing there.
FRAME_GEOMETRIES = frozenset(
    {"stiefel"}
    | {
        prefix + name
        for prefix in ("", "block_")
        for name in ("partial_isometry_embedded", "partial_isometry_quotient", "stiefel_pair")
    }
)


class FrameDecayWarning(UserWarning):
    """Weight decay was requested on a group of frames; it does nothing there (RA-5)."""


class NonFiniteGradientWarning(UserWarning):
    """A step was skipped because a gradient had NaN or inf entries (``skip_nonfinite=True``)."""


REPROJECT_HINT = (
    "if the parameters were cast or loaded (e.g. model.to(torch.float64) after building in "
    "float32), put them back on their manifold first with torch_port.nn.reproject(model) or "
    "torch_port.optim.reproject(param_groups)"
)

DECAY_MESSAGE = (
    "weight decay on frames does nothing: the Riemannian gradient of (λ/2)‖W‖² is P_W(λW) = 0 "
    "on St(d, r) (RA-5); weight_decay={wd} is ignored for this group of frames"
)


def caller_stacklevel() -> int:
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
def is_real(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


#: torch.optim's flags that this port does not implement: accepted as False (or None), as torch's
#: optimizers take them, and refused by name when set, never ignored.
NOT_IMPLEMENTED = ("amsgrad", "fused", "differentiable")


def torch_flags(group: dict[str, Any], capturable: bool = False) -> None:
    """torch.optim's own group keys: ``maximize`` a bool (honoured: the step ascends),
    ``foreach`` None or a bool (the plain groups' AdamW always takes torch's multi-tensor path,
    bitwise the single-tensor one), and ``NOT_IMPLEMENTED`` None or False, with
    ``capturable`` among them for an optimizer that has no capturable step."""
    for key in ("maximize", "foreach"):
        value = group.get(key)
        if not (isinstance(value, bool) or (key == "foreach" and value is None)):
            raise ValueError(f"{key} must be True or False, got {value!r}")
    for key in NOT_IMPLEMENTED + (() if capturable else ("capturable",)):
        if group.get(key) not in (None, False):
            raise ValueError(
                f"{key}={group[key]!r}: torch's {key} is not implemented by this optimizer; "
                "leave it False"
            )


def tensor_lr(lr: Any, read: bool = True) -> float | None:
    """A learning rate given as a tensor, as torch's optimizers take it: a 0-d floating tensor
    with a finite value ≥ 0 (a scheduler may take it to 0, and groups added then share it). The
    capturable step reads it on the device (a scheduler's in-place ``fill_`` changes it without
    a recompilation); the eager step reads its value where the guard validates its group,
    when it has changed. Its value is read here, once, with ``read`` (else only its layout
    is checked)."""
    if lr.ndim != 0 or not lr.is_floating_point():
        raise ValueError(
            f"a tensor lr must be a 0-d floating tensor, got shape {tuple(lr.shape)}, dtype "
            f"{lr.dtype}"
        )
    return nonnegative("lr", float(lr)) if read else None


def _python_number(name: str, v: Any) -> None:
    """A real number of another type (a NumPy scalar, a 0-d array or tensor) is refused as such:
    the group keeps the value it is given, and NumPy scalars in torch's arithmetic change its
    dtype."""
    import numbers

    other = isinstance(v, numbers.Real) or getattr(v, "ndim", None) == 0
    if not is_real(v) and other and not isinstance(v, bool):
        raise ValueError(
            f"{name} must be a Python int or float, got {type(v).__module__}.{type(v).__name__} "
            f"{v!r}; pass float({name})"
        )


def one_of(choices: tuple, note: str = "") -> Callable[[str, Any], Any]:
    """A check that a value is one of ``choices``."""

    def check(name: str, v: Any) -> Any:
        if v not in choices:
            raise ValueError(
                f"unknown {name} {v!r}; choose one of {choices}" + (f" {note}" if note else "")
            )
        return v

    return check


def optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """``check``, or None."""
    return lambda name, v: None if v is None else check(name, v)


def positive(name: str, v: Any) -> float:
    _python_number(name, v)
    if not (is_real(v) and math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    return float(v)


def nonnegative(name: str, v: Any) -> float:
    _python_number(name, v)
    if not (is_real(v) and math.isfinite(v) and v >= 0.0):
        raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
    return float(v)


def beta(name: str, v: Any) -> float:
    _python_number(name, v)
    if not (is_real(v) and 0.0 <= v < 1.0):
        raise ValueError(f"{name} must lie in [0, 1), got {v!r}")
    return float(v)


def betas(v: Any) -> tuple[float, float]:
    if not (isinstance(v, tuple | list) and len(v) == 2):
        raise ValueError(f"betas must be a pair of numbers (beta1, beta2), got {v!r}")
    return beta("beta1", v[0]), beta("beta2", v[1])


def plain_eps(group: dict[str, Any]) -> None:
    """AdamW's √v + ε in the dtype of each plain parameter: ε must be > 0 and must not round to
    0 there, else the update of an entry whose squared gradient is 0 or underflows is 0/0 (NaN)
    or x/0 (inf)."""
    eps = group["eps"]
    for p in group["params"]:
        info = torch.finfo(p.dtype)  # below half the smallest subnormal, eps rounds to 0
        if eps <= info.smallest_normal * info.eps / 2:
            raise ValueError(
                f"eps={eps:g} {'is' if eps == 0.0 else 'rounds to'} 0 in {p.dtype}, so AdamW's "
                "update of an entry whose squared gradient is 0 or underflows is 0/0 (NaN) or "
                f"x/0 (inf); use eps ≥ {torch.finfo(p.dtype).tiny:.1e} for {p.dtype} parameters, "
                "or keep float32 parameters and train under torch.autocast"
            )


def parameter_layouts(group: dict[str, Any], params: Any) -> None:
    """The parameters of a group can be stepped: a real floating dtype, values (not on the meta
    device), no two entries in one memory location (an expanded tensor, which torch refuses to
    write in place, after the step has written other parameters); and for a geometry group at
    least one entry and, for a Stiefel group, frames (..., d, r) with 1 ≤ r ≤ d."""
    for p in params:
        if not p.dtype.is_floating_point or p.is_complex():
            raise TypeError(f"parameters must have a real floating dtype, got {p.dtype}")
        local = sharding.local(p.detach())
        if local.device.type == "meta":
            raise ValueError(
                f"a parameter of shape {tuple(p.shape)} is on the meta device, which holds no "
                "values: build the optimizer after the model is materialised (to_empty and "
                "its initialisation)"
            )
        # torch has no public test of internal overlap; this one answers 1 for "overlaps"
        if torch._debug_has_internal_overlap(local) == 1:
            raise ValueError(
                f"a parameter of shape {tuple(p.shape)} with strides {local.stride()} has "
                "entries that share memory (an expanded tensor); the step writes parameters "
                "in place: give the optimizer a copy (.clone())"
            )
        if group.get("geometry") is None:
            continue
        if p.numel() == 0:
            raise ValueError(f"a parameter of shape {tuple(p.shape)} holds no point (no entries)")
        if group["geometry"] == "stiefel" and (
            p.ndim < 2 or p.shape[-1] > p.shape[-2] or p.shape[-1] < 1
        ):
            raise ValueError(
                "a Stiefel group holds frames of shape (..., d, r) with 1 ≤ r ≤ d, got a "
                f"parameter of shape {tuple(p.shape)}"
            )


def check_placements(name: str, p: torch.Tensor, rows: bool = False) -> None:
    """Refuse a DTensor parameter whose placements the optimizer cannot step: anything but
    Replicate and Shard(i) with i < ndim − 2 (or i = ndim − 2 with ``rows``, a Stiefel frame
    under the polar retraction and the embedded metric)."""
    if not sharding.is_sharded(p):
        return
    for placement in p.placements:
        if isinstance(placement, sharding.Replicate):
            continue
        if isinstance(placement, sharding.Shard) and (
            placement.dim < p.ndim - 2 or (rows and placement.dim == p.ndim - 2)
        ):
            continue
        allowed = "the leading (layer/head) dims" + (" or the rows" if rows else "")
        raise ValueError(
            f"{name} is a DTensor with placements {tuple(p.placements)} over shape "
            f"{tuple(p.shape)}: the optimizer steps it only when {allowed} are sharded (rows "
            "only for a Stiefel group with the polar retraction and the embedded metric; the "
            "factors of the ten design points need whole rows); keep it whole with "
            "fully_shard(..., ignored_params={p}) or shard a (heads, d, r) tensor along dim 0"
        )


def gradient_problem(p: Any) -> str | None:
    """What makes a gradient unusable as its parameter's, or None: not dense (sparse COO, CSR;
    the steps read gradients entry by entry), or of another shape, dtype or device than the
    parameter (torch lets ``grad_dtype = None`` or ``grad.data = ...`` set one; torch's AdamW
    would then fail after the frames were written). Metadata only: no host read."""
    g = p.grad
    if g.layout != torch.strided:
        return f"is {g.layout} (a dense gradient is needed)"
    if (g.shape, g.dtype, g.device) != (p.shape, p.dtype, p.device):
        return (
            f"has shape {tuple(g.shape)}, {g.dtype} on {g.device}, the parameter "
            f"{tuple(p.shape)}, {p.dtype} on {p.device}"
        )
    return None


def step_size(geometry: Any, x: Any, u: Any, c: Any) -> None:
    """After a retraction of x by ξ = c·u failed or made a non-finite point: when x and u are
    finite and ξ's largest entry (c·u formed frame by frame in float64; c may be infinite)
    reaches √(largest value) of the dtype, where the retractions' products of ξ (Grams, the
    factorisations of W + ξ) overflow, raise ValueError naming the step's size as the cause
    (a learning rate too large for the dtype). Else return, and the retraction's error
    stands."""
    if not all(bool(torch.isfinite(t).all()) for t in (*x, *u)):
        return
    xi = tuple(t.to(torch.float64) for t in u)
    if c is not None:
        xi = geometry.scale_frames(xi, c.to(torch.float64))
    # an infinite c times a zero entry of u is a zero entry of ξ (NaN only from a NaN c)
    top = max(float(torch.where(t.isnan(), 0.0, t).abs().max()) if t.numel() else 0.0 for t in xi)
    limit = math.sqrt(torch.finfo(u[0].dtype).max)
    if not math.isnan(top) and top >= limit:
        raise ValueError(
            f"the step c·ξ has entries up to {top:.3e}, beyond √(largest {u[0].dtype}) = "
            f"{limit:.3e}, where the retraction's products of it overflow: the learning rate "
            "is too large for this dtype"
        )


# -- the capturable step (``torch_port.optim.capturable``) ------------------------------------
#: Above this trust radius the capturable step's fixed-degree polar series needs too many
#: terms (Δ = 0.7: degree 55).
MAX_RADIUS = 0.7


def capturable_radius(radius: Any) -> float:
    """The capturable step's trust radius: 0 < Δ ≤ ``MAX_RADIUS``."""
    if not (is_real(radius) and 0.0 < radius <= MAX_RADIUS):
        raise ValueError(
            f"capturable=True needs a trust radius 0 < Δ ≤ {MAX_RADIUS} (the polar factor's "
            f"series is then of a fixed degree), got {radius!r}"
        )
    return float(radius)


def capturable_group(group: dict[str, Any]) -> None:
    """A group the capturable step can take: plain parameters, or Stiefel frames with the
    polar retraction, the embedded metric, the frame moment with the mean, ε > 0 and a trust
    radius Δ ≤ ``MAX_RADIUS``, none of them sharded, and a finite step factor."""
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
    capturable_radius(group["trust_radius"])
    for p in group["params"]:
        if sharding.is_sharded(p):
            raise ValueError("capturable=True does not take sharded (DTensor) frames")
    if not isinstance(group["lr"], torch.Tensor):  # a tensor lr: checked on the device
        capturable_step_factor(group)


def capturable_step_factor(group: dict[str, Any]) -> None:
    """The largest step factor, lr/((1 − β1)·ε) (√v = 0 at the first step), is finite in the
    dtype the capturable step forms W + c·m in (float32 for half-precision frames)."""
    top = group["lr"] / ((1.0 - group["betas"][0]) * group["eps"])
    for p in group["params"]:
        dtype = torch.promote_types(p.dtype, torch.float32)
        if not top < torch.finfo(dtype).max:
            raise ValueError(
                f"capturable=True: the step factor lr/((1 − β1)·eps) = {top:.3e} overflows "
                f"{dtype} (largest {torch.finfo(dtype).max:.3e}); use a larger eps"
            )


def capturable_state(p: torch.Tensor, state: dict[str, Any], frame: bool) -> None:
    """The state of a parameter as the capturable step holds it (a frame's: "step",
    "exp_avg", "sqrt_v"; a plain parameter's: torch AdamW's), contiguous, on p's device
    (shapes and devices: metadata, read with no synchronisation)."""
    layout = {"step": (), "exp_avg": tuple(p.shape)}
    layout.update({"sqrt_v": tuple(p.shape[:-2])} if frame else {"exp_avg_sq": tuple(p.shape)})
    got = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
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
