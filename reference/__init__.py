"""The float64 (and mpmath) reference: geometries, update rules and their building blocks.

Pure NumPy/SciPy/mpmath; the ground truth the torch port is validated against.
"""

from functools import partial

from reference import geometry, linalg, mp, optim
from reference.blocks import BlockGeometry
from reference.euclidean import Euclidean
from reference.fixed_rank import FixedRankEmbedded, FixedRankQuotient
from reference.geometry import Geometry
from reference.partial_isometry import (
    PartialIsometryEmbedded,
    PartialIsometryQuotient,
    StiefelPair,
)
from reference.product import Product
from reference.stiefel import Stiefel

_PLAIN = {
    "fixed_rank_embedded": FixedRankEmbedded,
    "fixed_rank_quotient": FixedRankQuotient,
    "partial_isometry_embedded": PartialIsometryEmbedded,
    "partial_isometry_quotient": PartialIsometryQuotient,
    "stiefel_pair": StiefelPair,
}

#: The ten design points (DESIGN §4.5): ``GEOMETRIES[name](m, n, r, **options)``. Block variants
#: also take ``n_heads``, ``n_kv_heads`` (default 2 and 1: two query heads sharing one key
#: factor), ``pattern`` and ``groups``; other options go to the base geometry.
GEOMETRIES = {
    **_PLAIN,
    **{f"block_{name}": partial(BlockGeometry, cls) for name, cls in _PLAIN.items()},
}

__all__ = [
    "GEOMETRIES",
    "BlockGeometry",
    "Euclidean",
    "FixedRankEmbedded",
    "FixedRankQuotient",
    "Geometry",
    "PartialIsometryEmbedded",
    "PartialIsometryQuotient",
    "Product",
    "Stiefel",
    "StiefelPair",
    "geometry",
    "linalg",
    "mp",
    "optim",
]
