"""The PyTorch mirror of ``reference`` for GPU training (DESIGN §7).

Its core modules import torch only; they never import ``reference`` or ``proofs_checks``.
Geometries, batched over leading dimensions (layers × heads): ``Stiefel`` and the ten design
points of DESIGN §4.5 by name in ``GEOMETRIES`` (``FixedRankEmbedded``, ``FixedRankQuotient``,
``PartialIsometryEmbedded``, ``PartialIsometryQuotient``, ``StiefelPair`` and their block
variants, ``BlockGeometry``); the optimizers ``RiemannianAdam``, ``RiemannianMomentum``, ``RSGD``
and ``NormalizedRSGD``, whose parameter groups may name any of them. See ``docs/torch_port.md``.
"""

from torch_port import geometries, linalg, optim
from torch_port.blocks import BlockGeometry
from torch_port.fixed_rank import FixedRankEmbedded, FixedRankQuotient
from torch_port.geometries import GEOMETRIES
from torch_port.optim import (
    RSGD,
    FrameDecayWarning,
    NonFiniteGradientWarning,
    NormalizedRSGD,
    RiemannianAdam,
    RiemannianMomentum,
)
from torch_port.partial_isometry import (
    PartialIsometryEmbedded,
    PartialIsometryQuotient,
    StiefelPair,
)
from torch_port.stiefel import Stiefel

__all__ = [
    "GEOMETRIES",
    "RSGD",
    "BlockGeometry",
    "FixedRankEmbedded",
    "FixedRankQuotient",
    "FrameDecayWarning",
    "NonFiniteGradientWarning",
    "NormalizedRSGD",
    "PartialIsometryEmbedded",
    "PartialIsometryQuotient",
    "RiemannianAdam",
    "RiemannianMomentum",
    "Stiefel",
    "StiefelPair",
    "geometries",
    "linalg",
    "optim",
]
