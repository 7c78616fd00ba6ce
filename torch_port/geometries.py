"""The geometries of the torch port by name (DESIGN §4.5, §7), as ``reference.GEOMETRIES``.

``GEOMETRIES[name](m, n, r, **options)`` builds each of the ten design points, batched over
leading dimensions; block variants also take ``n_heads``, ``n_kv_heads`` (default 2 and 1, as the
reference), ``pattern`` and ``groups``, other options going to the base geometry.
``GEOMETRIES["stiefel"](d, r, retraction=..., metric=...)`` is the building block.

The protocols they implement are typed in ``torch_port/geometry.py`` (``Geometry``, mirroring
``reference/geometry.py``, and ``PointGeometry``, what the optimizers need).
"""

from __future__ import annotations

from functools import partial

from torch_port.blocks import BlockGeometry
from torch_port.fixed_rank import FixedRankEmbedded, FixedRankQuotient
from torch_port.partial_isometry import (
    PartialIsometryEmbedded,
    PartialIsometryQuotient,
    StiefelPair,
)
from torch_port.stiefel import Stiefel

PLAIN = {
    "fixed_rank_embedded": FixedRankEmbedded,
    "fixed_rank_quotient": FixedRankQuotient,
    "partial_isometry_embedded": PartialIsometryEmbedded,
    "partial_isometry_quotient": PartialIsometryQuotient,
    "stiefel_pair": StiefelPair,
}

#: The ten design points and the Stiefel building block.
GEOMETRIES = {
    **PLAIN,
    **{f"block_{name}": partial(BlockGeometry, cls) for name, cls in PLAIN.items()},
    "stiefel": Stiefel,
}

__all__ = [
    "GEOMETRIES",
    "PLAIN",
    "BlockGeometry",
    "FixedRankEmbedded",
    "FixedRankQuotient",
    "PartialIsometryEmbedded",
    "PartialIsometryQuotient",
    "Stiefel",
    "StiefelPair",
]
