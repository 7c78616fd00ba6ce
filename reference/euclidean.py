"""Plain arrays: the Euclidean space R^{shape}, for baselines (AdamW) and movement ratios; and
the ambient Euclidean space of a geometry's points (``Ambient``), for rules that never project."""

from __future__ import annotations

import numpy as np

from reference.geometry import (
    Geometry,
    Point,
    Tangent,
    check_finite,
    check_shapes,
    is_integer,
    parts,
    tree_map,
)
from reference.linalg import Array, frobenius


class Euclidean:
    """R^{shape} with the Frobenius metric ⟨u, v⟩ = Σ u_ij v_ij.

    A point and a tangent vector are each one float64 array of the given shape; the projection is
    the identity and the retraction is x + u.
    """

    moment_groups = ((0,),)

    def __init__(self, *shape: int):
        bad = [s for s in shape if not is_integer(s)]
        if bad:
            raise TypeError(f"Euclidean space needs integer dimensions, got {bad[0]!r} in {shape}")
        if not shape or not all(s >= 1 for s in shape):
            raise ValueError(f"Euclidean space needs positive integer dimensions, got {shape}")
        self.shape = tuple(int(s) for s in shape)
        self.dim = int(np.prod(self.shape))

    def __repr__(self) -> str:
        return f"Euclidean{self.shape}"

    def random_point(self, rng: np.random.Generator) -> Array:
        return rng.standard_normal(self.shape)

    def random_tangent(self, x: Array, rng: np.random.Generator) -> Array:
        u = rng.standard_normal(self.shape)
        return u / frobenius(u)

    def zero_tangent(self, x: Array) -> Array:
        return np.zeros(self.shape)

    def inner(self, x: Array, u: Array, v: Array) -> float:
        return float(np.vdot(u, v))

    def norm(self, x: Array, u: Array) -> float:
        return frobenius(u)

    def proj(self, x: Array, z: Array) -> Array:
        return z

    proj_tangent = proj

    def egrad_to_rgrad(self, x: Array, egrad: Array) -> Array:
        return egrad

    def retract(self, x: Array, u: Array) -> Array:
        return x + u

    def transport(self, x: Array, y: Array, u: Array) -> Array:
        return u

    def to_matrix(self, x: Array) -> Array:
        return x

    def tangent_to_matrix(self, x: Array, u: Array) -> Array:
        return u

    def check_point(self, x: Array) -> None:
        check_shapes("Euclidean point", [self.shape], x)
        check_finite("Euclidean point", x)


class Ambient:
    """The ambient Euclidean space of a geometry's points, with the geometry's frames.

    Points are the geometry's points; a tangent vector is any array structure of the point's
    layout (a Euclidean gradient itself), so the projection, the Riemannian gradient and the
    transport are the identity, and the metric is the Frobenius one, ⟨u, v⟩ = Σ_parts Σ u_ij v_ij.
    ``moment_groups`` are the geometry's, so per-frame rules (a scalar second moment, a trust
    region) act on the same frames. An ``Optimizer`` with ``gradient="euclidean"`` runs its chain
    here and retracts with the geometry's own retraction: a rule that never projects, followed by
    the manifold's retraction (arms E and H of the step-rule ablation: polar(W + ξ)). Defined for
    geometries whose tangent vectors have the layout of their points (not R1 or P1)."""

    def __init__(self, geometry: Geometry):
        if getattr(geometry, "embedded", False):
            raise ValueError(
                f"the ambient space of {geometry!r} is not its tangent layout: its tangent vectors "
                "have their own embedded layout, so gradient='euclidean' is not defined there"
            )
        self.geometry = geometry
        self.moment_groups = geometry.moment_groups

    def __repr__(self) -> str:
        return f"Ambient({self.geometry!r})"

    def zero_tangent(self, x: Point) -> Tangent:
        return tree_map(np.zeros_like, x)

    def inner(self, x: Point, u: Tangent, v: Tangent) -> float:
        return float(sum(np.vdot(a, b) for a, b in zip(parts(u), parts(v), strict=True)))

    def norm(self, x: Point, u: Tangent) -> float:
        return frobenius(np.concatenate([np.ravel(p) for p in parts(u)]))

    def proj_tangent(self, x: Point, u: Tangent) -> Tangent:
        return u

    proj = proj_tangent

    def egrad_to_rgrad(self, x: Point, egrad: Tangent) -> Tangent:
        return egrad

    def transport(self, x: Point, y: Point, u: Tangent) -> Tangent:
        return u
