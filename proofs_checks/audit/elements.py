"""How the elements of one record are read: the layout of a recorded geometry's points in
the port's arrays, their projection to the manifold in float64, what is compared (the
factors, or W = A Bᵀ) and their conditioning (``Elements``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import reference as ref
from proofs_checks.audit.errors import TraceError

Array = np.ndarray


@dataclass(frozen=True)
class Elements:
    """How the elements of one record are read, from the reference geometry of one element:
    the number of block groups (0 for a plain point), the factors that are frames, the trailing
    shapes of the point's parts in the port's layout (a block point's groups first: the port
    keeps the ``reference.blocks`` groups stacked), whether the point is a single frame
    (Stiefel), and what is compared: the factors where both sides keep the same ones (a frame;
    P1, whose retraction aligns the new factors to the old; P3), else W = A Bᵀ (the quotients
    R2 and P2, whose factors are defined up to a group action, and R1, whose (U, S, V) represent
    W up to U ↦ UQ, S ↦ QᵀSP, V ↦ VP)."""

    geometry: Any
    n_groups: int
    orthonormal: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    frame: bool
    compares_matrix: bool

    def _sets(self, x: Any) -> list[tuple[Array, ...]]:
        """The factor tuples of x: one per block group; (x,) for a frame."""
        if self.frame:
            return [(x,)]
        return list(x) if self.n_groups else [x]

    def residual(self, x: Any) -> float:
        """max ‖FᵀF − I‖_F over the orthonormal factors F of x (0 when it has none)."""
        frames = [f for s in self._sets(x) for i, f in enumerate(s) if i in self.orthonormal]
        return max(
            (float(np.linalg.norm(f.T @ f - np.eye(f.shape[1]))) for f in frames), default=0.0
        )

    def point(self, arrays: Sequence[Array], e: int) -> Any:
        """Element e of parts kept as (elements, *trailing): a frame, a tuple of factors, or a
        tuple over the block groups of tuples of factors."""
        if self.frame:
            return arrays[0][e]
        if self.n_groups:
            return tuple(tuple(a[e][c] for a in arrays) for c in range(self.n_groups))
        return tuple(a[e] for a in arrays)

    def project(self, x: Any) -> Any:
        """x with each orthonormal factor replaced by its polar factor (float64)."""
        if self.frame:
            return ref.linalg.polar(x)

        def one(factors: tuple) -> tuple:
            return tuple(
                ref.linalg.polar(f) if i in self.orthonormal else f for i, f in enumerate(factors)
            )

        return tuple(one(s) for s in x) if self.n_groups else one(x)

    def compared(self, x: Any) -> Array:
        """C(x): W of every group, or the factors, as one vector (class docstring)."""
        if self.compares_matrix:
            w = self.geometry.to_matrix(x)
            return np.concatenate([np.ravel(a) for a in (w if isinstance(w, tuple) else (w,))])
        return np.concatenate([np.ravel(f) for s in self._sets(x) for f in s])

    def conditioning(self, x: Any) -> float:
        """κ = max over the factors that are not frames (S of R1, A and B of R2) of cond(F)²,
        the condition number of their Gram matrices FᵀF, which the Riemannian gradient, the
        projections and the transports solve with (1 for points made of frames only)."""
        return gram_condition(self._sets(x), self.orthonormal)


def gram_condition(factor_sets: Sequence[Sequence[Array]], orthonormal: Sequence[int]) -> float:
    """κ = max cond(F)² = max σ_max(F)²/σ_min(F)² over the factors F of each set whose index
    is not in ``orthonormal`` (1 when every factor is a frame; ∞ for a singular one)."""
    kappa = 1.0
    for factors in factor_sets:
        for i, f in enumerate(factors):
            if i not in orthonormal:
                sv = np.linalg.svd(f, compute_uv=False)
                kappa = max(kappa, float(sv[0] / sv[-1]) ** 2 if sv[-1] > 0 else math.inf)
    return kappa


def elements(spec: dict[str, Any]) -> Elements:
    """The ``Elements`` of a recorded geometry (name, sizes, options), read from the reference
    geometry of one element (``tests/test_audit.py`` checks that the port's layout is the
    reference's for each of the ten)."""
    name, sizes, options = spec["name"], spec["sizes"], dict(spec["options"])
    if name == "stiefel":
        geometry = ref.Stiefel(sizes["d"], sizes["r"], **options)
        return Elements(geometry, 0, (0,), ((sizes["d"], sizes["r"]),), True, False)
    if name not in ref.GEOMETRIES:
        raise TraceError(f"unknown geometry {name!r} in the trace")
    if options.get("pattern") is not None:
        options["pattern"] = tuple(tuple(e) for e in options["pattern"])
    geometry = ref.GEOMETRIES[name](sizes["m"], sizes["n"], sizes["r"], **options)
    compares_matrix = name.endswith(("_quotient", "fixed_rank_embedded"))
    if not name.startswith("block_"):
        shapes = tuple(geometry.point_shapes)
        return Elements(geometry, 0, geometry.orthonormal_factors, shapes, False, compares_matrix)
    bases = geometry.factors
    if len({b.point_shapes for b in bases}) != 1:
        raise TraceError(f"{name}: its groups differ in shape, which the port does not stack")
    shapes = tuple((len(bases), *s) for s in bases[0].point_shapes)
    return Elements(
        geometry, len(bases), bases[0].orthonormal_factors, shapes, False, compares_matrix
    )
