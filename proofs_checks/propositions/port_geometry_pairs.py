"""The geometries PORT-5 compares, each built by the reference and by the port with the same
sizes and options (St(d, r), the five plain geometries and their block variants), and the arrays
passed between the two sides (float64 NumPy arrays and torch tensors).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases

NAMES = ("stiefel", *cases.ORTHONORMAL)


def default_sizes(name: str) -> tuple[int, ...]:
    return cases.STIEFEL if name == "stiefel" else cases.SIZES


def geometries(
    name: str, option: dict[str, str], sizes: tuple[int, ...] | None = None
) -> tuple[Any, Any]:
    from torch_port.geometries import GEOMETRIES

    make = ref.Stiefel if name == "stiefel" else ref.GEOMETRIES[name]
    sizes = default_sizes(name) if sizes is None else sizes
    return make(*sizes, **option), GEOMETRIES[name](*sizes, **option)


def to_torch(v: Any) -> Any:
    import torch

    if isinstance(v, tuple):
        return tuple(to_torch(p) for p in v)
    return torch.as_tensor(np.asarray(v, dtype=np.float64))


def to_numpy(v: Any) -> list[np.ndarray]:
    items = v if isinstance(v, tuple | list) else (v,)
    return [np.asarray(p.detach().numpy() if hasattr(p, "detach") else p) for p in items]


#: The block variants: with their defaults (two query heads sharing one key head: one group,
#: the rows stacked), and with blocks (0, 1), (1, 0) (two groups, the key heads reordered).
BLOCKS = tuple(f"block_{name}" for name in cases.ORTHONORMAL)
BLOCK_OPTIONS = ({}, {"pattern": [(0, 1), (1, 0)]})


def block_geometries(name: str, options: dict) -> tuple[Any, Any]:
    from torch_port.geometries import GEOMETRIES

    return (
        ref.GEOMETRIES[name](*cases.SIZES, **options),
        GEOMETRIES[name](*cases.SIZES, **options),
    )
