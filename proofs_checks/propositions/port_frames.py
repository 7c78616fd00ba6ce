"""The float frame stacks and Brockett costs that the PORT runs step on (PORT-6 … PORT-9): random
points of St(d, r) drawn by the port, and a smooth cost whose gradient never vanishes there.
"""

from __future__ import annotations

import math
from typing import Any


def brockett(ws: list[Any], costs: list[Any]) -> Any:
    """Σ_k Σ_frames tr(W_kᵀ A_k W_k) (A_k symmetric): a smooth cost whose Riemannian gradient
    never vanishes at a random frame."""
    import torch

    return sum(torch.einsum("...dr,de,...er->", w, a, w) for w, a in zip(ws, costs, strict=True))


def frames_and_costs(gen: Any, shapes: tuple[tuple[int, ...], ...], dtype: Any) -> list[Any]:
    """Frame stacks of the given (batch..., d, r) shapes and a symmetric cost per stack."""
    import torch

    import torch_port as tp

    ws, costs = [], []
    for *batch, d, r in shapes:
        ws.append(torch.nn.Parameter(tp.Stiefel(d, r).random_point(gen, tuple(batch)).to(dtype)))
        a = torch.randn(d, d, generator=gen, dtype=torch.float64)
        costs.append(((a + a.T) / (2 * math.sqrt(d))).to(dtype))
    return ws, costs
