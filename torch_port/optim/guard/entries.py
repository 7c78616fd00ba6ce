"""Checks of optimizer state before an optimizer uses it: layout, finiteness, ranges, tangency.

``torch_port.optim`` runs the layout checks (``check_layout``) on every state a step will touch,
before it writes anything, and the full checks (``check_values``, ``check_tangent``) on every
state ``load_state_dict`` is given, before it changes anything. Each raises ValueError naming
the state entry (``where``) and the measured value.

Tangency tolerance. A stored moment m is tangent at the point x up to rounding: the library
writes m = P_x(m') (the transport) in the state's dtype, with x itself within sqrt(ε) of its
manifold (``check_point``'s rule). The defect ‖P_x(m) − m‖_x, measured in float64 from the
stored entries, is refused above sqrt(ε)·‖m‖_x per frame (ε of the state's dtype; 1.5e-8 in
float64, 3.5e-4 in float32, 0.088 in bfloat16), plus the smallest normal number of the dtype
(for m at zero). That is the rule ``check_point`` uses for points: states written by this
library sit orders of magnitude below it (tests/test_reliability_torch.py measures them after
training in each dtype), while a moment that is not tangent has a defect of order ‖m‖ (for a
random m on St(d, r): about sqrt((r + 1)/(2d))·‖m‖).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

Tensor = torch.Tensor


def tangent_tolerance(dtype: torch.dtype) -> float:
    """sqrt(ε) of ``dtype``: the relative tangency defect a stored moment may have."""
    return math.sqrt(torch.finfo(dtype).eps)


def shape_of(value: Any) -> Any:
    """The shape of a tensor, or the tuple of the shapes of a tuple of tensors."""
    if isinstance(value, tuple | list):
        return tuple(shape_of(v) for v in value)
    return tuple(value.shape)


def check_layout(where: str, value: Any, expected: Any) -> None:
    """``value`` is a floating tensor (or a tuple of them) of the ``expected`` shapes (a shape
    tuple, or a tuple of them for a tangent vector with several parts), not on the meta
    device."""
    parts = isinstance(expected, tuple) and bool(expected) and isinstance(expected[0], tuple)
    if parts:
        if not isinstance(value, tuple | list) or len(value) != len(expected):
            got = f"{len(value)} parts" if isinstance(value, tuple | list) else type(value).__name__
            raise ValueError(f"{where}: expected a tuple of {len(expected)} tensors, got {got}")
        for k, (v, e) in enumerate(zip(value, expected, strict=True)):
            check_layout(f"{where}[{k}]", v, e)
        return
    if not isinstance(value, torch.Tensor):
        raise ValueError(
            f"{where}: expected a tensor of shape {expected}, got {type(value).__name__}"
        )
    if not value.dtype.is_floating_point:
        raise ValueError(f"{where}: expected a real floating tensor, got dtype {value.dtype}")
    if value.layout != torch.strided:
        raise ValueError(f"{where}: a {value.layout} tensor, where the state is held dense")
    _check_not_meta(where, value)
    if tuple(value.shape) != tuple(expected):
        raise ValueError(f"{where}: expected shape {tuple(expected)}, got {tuple(value.shape)}")


def _check_not_meta(where: str, value: torch.Tensor) -> None:
    if value.device.type == "meta":
        raise ValueError(f"{where}: a tensor on the meta device, which holds no values")


def check_step_layout(where: str, value: Any) -> None:
    """The step count is a one-entry floating tensor (as torch's optimizers store it) with
    values (not on the meta device). Metadata only: no host read."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(
            f"{where}: expected the step count as a floating tensor, got {type(value).__name__}"
        )
    if value.numel() != 1 or not value.dtype.is_floating_point:
        raise ValueError(
            f"{where}: expected a one-entry floating tensor, got shape {tuple(value.shape)}, "
            f"dtype {value.dtype}"
        )
    _check_not_meta(where, value)


def check_step(where: str, value: Any, held: torch.dtype | None = None) -> None:
    """The step count: ``check_step_layout``, holding an integer 0 ≤ t < 2/ε of its dtype, or
    of ``held`` when it will be cast to that (beyond, t + 1 rounds back to t and the count
    stops)."""
    check_step_layout(where, value)
    dtype = value.dtype if held is None else held
    t, top = float(value.item()), 2.0 / torch.finfo(dtype).eps
    if not (math.isfinite(t) and 0 <= t < top and t == int(t)):
        raise ValueError(
            f"{where}: the step count must be an integer in [0, {top:.0f}) for {dtype}, got {t!r}"
        )


def check_values(
    where: str, value: Any, nonnegative: bool = False, dtype: torch.dtype | None = None
) -> None:
    """Every entry finite (and ≥ 0 when ``nonnegative``, e.g. √v or Adam's v); with ``dtype``,
    as the entries will be held once cast to it (float64 values beyond float32's range become
    inf in a float32 state)."""
    for k, t in enumerate(value if isinstance(value, tuple | list) else (value,)):
        label = f"{where}[{k}]" if isinstance(value, tuple | list) else where
        held = ""
        if dtype is not None and dtype != t.dtype:
            t, held = t.to(dtype), f" once cast to {dtype}"
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise ValueError(f"{label}: {bad} non-finite entries (NaN or inf) of {t.numel()}{held}")
        if nonnegative and t.numel() and bool((t < 0).any()):
            raise ValueError(
                f"{label}: {int((t < 0).sum())} negative entries (smallest {float(t.min()):.3e}); "
                "a second moment is ≥ 0"
            )


class NotTangentError(ValueError):
    """A vector (a stored moment) that is not tangent at its point (``check_tangent``)."""


def check_tangent(where: str, geometry: Any, x: Sequence[Tensor], u: Sequence[Tensor]) -> None:
    """‖P_x(u) − u‖_x ≤ sqrt(ε)·‖u‖_x + tiny per frame, measured in float64 (module docstring);
    ``geometry`` is the optimizer's view of the point's geometry (``proj_tangent``,
    ``frame_norms``). ε is that of the coarser of u's and x's dtypes: a moment saved in
    float64 is tangent at a float32 point only to float32's rounding of it."""
    dtype = max(u[0].dtype, x[0].dtype, key=lambda d: torch.finfo(d).eps)
    x64 = tuple(t.to(torch.float64) for t in x)
    u64 = tuple(t.to(torch.float64) for t in u)
    p64 = geometry.proj_tangent(x64, u64)
    defect = geometry.frame_norms(x64, tuple(a - b for a, b in zip(p64, u64, strict=True)))
    size = geometry.frame_norms(x64, u64)
    bound = tangent_tolerance(dtype) * size + torch.finfo(dtype).tiny
    off = defect > bound
    if bool(off.any()):
        worst = int(torch.argmax((defect / bound).reshape(-1)))
        raise NotTangentError(
            f"{where} is not tangent at the point: ‖P(m) − m‖ = "
            f"{float(defect.reshape(-1)[worst]):.3e} against ‖m‖ = "
            f"{float(size.reshape(-1)[worst]):.3e} (tolerance sqrt(ε) = "
            f"{tangent_tolerance(dtype):.1e} relative, {int(off.sum())} of {off.numel()} frames "
            "off)"
        )
