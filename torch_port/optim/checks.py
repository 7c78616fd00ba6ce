"""What the optimizers check and warn about: hyperparameters, and the warnings they raise."""

from __future__ import annotations

import math
import sys
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


def tensor_lr(lr: Any) -> float:
    """A learning rate given as a tensor, as torch's optimizers take it: a 0-d floating tensor
    with a finite value ≥ 0 (a scheduler may take it to 0, and groups added then share it). The
    capturable step reads it on the device (a scheduler's in-place ``fill_`` changes it without
    a recompilation); the eager step reads its value once per step, as torch's does. Its value
    is read here, once."""
    if lr.ndim != 0 or not lr.is_floating_point():
        raise ValueError(
            f"a tensor lr must be a 0-d floating tensor, got shape {tuple(lr.shape)}, dtype "
            f"{lr.dtype}"
        )
    return nonnegative("lr", float(lr))


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
    import torch

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


def gradient_layout(name: str, p: Any) -> None:
    """Refuse a gradient the step cannot use as its parameter's: not dense (sparse COO, CSR;
    the steps read gradients entry by entry), or of another shape, dtype or device than the
    parameter (torch lets ``grad_dtype = None`` or ``grad.data = ...`` set one; torch's AdamW
    would then fail after the frames were written). Metadata only: no host read."""
    g = p.grad
    if g.layout != torch.strided:
        problem = f"is {g.layout} (a dense gradient is needed)"
    elif (tuple(g.shape), g.dtype, g.device) != (tuple(p.shape), p.dtype, p.device):
        problem = (
            f"has shape {tuple(g.shape)}, {g.dtype} on {g.device}, the parameter "
            f"{tuple(p.shape)}, {p.dtype} on {p.device}"
        )
    else:
        return
    raise ValueError(f"the gradient of {name} {problem}; no parameter or state was changed")


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
