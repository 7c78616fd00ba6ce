"""The PyTorch mirror of ``reference`` for GPU training (DESIGN §7).

Its core modules import torch only; they never import ``reference`` or ``proofs_checks``.
Present so far (the Stiefel slice of issue 4): ``Stiefel`` (batched over leading dimensions) and
the optimizers ``RiemannianAdam``, ``RiemannianMomentum``, ``RSGD`` and ``NormalizedRSGD``.
See ``docs/torch_port.md``.
"""

from torch_port import linalg, optim
from torch_port.optim import (
    RSGD,
    FrameDecayWarning,
    NonFiniteGradientWarning,
    NormalizedRSGD,
    RiemannianAdam,
    RiemannianMomentum,
)
from torch_port.stiefel import Stiefel

__all__ = [
    "RSGD",
    "FrameDecayWarning",
    "NonFiniteGradientWarning",
    "NormalizedRSGD",
    "RiemannianAdam",
    "RiemannianMomentum",
    "Stiefel",
    "linalg",
    "optim",
]
