"""What the tests share: the unit roundoff, named once.

The rounding bounds themselves (γ_k, ``frame_error``, …) and the geometry laws with their
Taylor-slope rule are owned by ``proofs_checks.bounds`` and ``proofs_checks.geometry_laws``; tests
import them from there rather than copying them, so that a bound derived once reaches every test.
Import from here with ``from conftest import U, unit_roundoff``; ``train_mse`` is the short
training loop the attention-module tests share.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from proofs_checks.bounds import FLOAT64_U

#: The float64 unit roundoff u = 2^-53 ≈ 1.1e-16 (Higham §2.1): ``proofs_checks.bounds``' value.
U = FLOAT64_U


def unit_roundoff(dtype: Any = np.float64) -> float:
    """u = eps/2 of a floating dtype: a NumPy dtype (or type), or a ``torch.dtype``."""
    if type(dtype).__module__ == "torch":  # a torch.dtype, which NumPy does not know
        import torch

        return float(torch.finfo(dtype).eps) / 2
    return float(np.finfo(dtype).eps) / 2


def train_mse(model: Any, opt: Any, x: Any, y: Any, steps: int = 20, **forward: Any) -> list:
    """``steps`` optimizer steps on mean((model(x, **forward) − y)²); the losses before each."""
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x, **forward) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
