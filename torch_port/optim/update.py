"""One point's move, the arithmetic both steps share (the eager step of ``ChainOptimizer`` and
the capturable one, ``torch_port.optim.capturable``): nothing is written.

    g = grad f (+ λ·x, coupled decay), −g when maximizing;  ξ = c·u from the chain (Step);
    y = R_x(ξ) (x itself for lr = 0);  the chain's tangent state transported to y.

How a host decision is taken (read, deferred, or kept on the device) is the caller's choice,
made through ``torch_port.deferred``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_port import deferred
from torch_port.geometry import PointGeometry
from torch_port.linalg import Tensor
from torch_port.optim.guard import values
from torch_port.optim.transforms import Step, Transform


def move(
    geometry: PointGeometry,
    rule: Transform,
    group: dict[str, Any],
    x: Sequence[Tensor],
    egrad: Sequence[Tensor],
    state: dict[str, Any],
    t: int | Tensor,
) -> tuple[tuple, dict[str, Any]]:
    """(y, new state entries of the chain) of the point x with Euclidean gradient ``egrad`` at
    step number t (a tensor of counts per frame on the device). A tensor lr (the capturable
    step's) is compared with 0 on the device."""
    if group.get("maximize", False):
        egrad = tuple(-g for g in egrad)
    wd = group["weight_decay"]
    if wd > 0.0 and group["geometry"] not in values.FRAME_GEOMETRIES:  # decay="coupled"
        egrad = tuple(gi + wd * xi for gi, xi in zip(egrad, x, strict=True))
    g = Step(tuple(geometry.egrad_to_rgrad(x, egrad)), fresh=geometry.rgrad_is_fresh)
    step, new = rule.update(geometry, x, g, state, t)
    u, c = step.resolve(geometry, x)
    lr = group["lr"]
    try:
        if values.is_real(lr) and lr == 0:
            # R_x(0) = x exactly (torch.distributed.checkpoint's state-making step, a
            # schedule at 0), where a retraction would re-form x by its rounding
            y = tuple(p.clone() for p in x)
        else:
            y = geometry.retract(x, u) if c is None else geometry.retract_scaled(x, u, c)
    except (ValueError, torch.linalg.LinAlgError):
        values.step_size(geometry, x, u, c)  # names a step too large for the dtype
        raise
    if isinstance(lr, Tensor):
        y = tuple(torch.where(lr == 0, p, q) for p, q in zip(x, y, strict=True))
    if not geometry.retraction_checks_finite:
        sums = torch.stack([p.sum().to(torch.float64) for p in y])
        if not deferred.holds(torch.isfinite(sums).all()):
            bad = int(sum((~torch.isfinite(p)).sum() for p in y))
            if bad:
                values.step_size(geometry, x, u, c)
                raise ValueError(f"the point after this step has {bad} non-finite entries")
    for key in rule.transported:
        new[key] = geometry.transport_owned(x, y, new[key])
    return y, new
