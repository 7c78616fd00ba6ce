"""Products of geometries, e.g. a (W_Q, W_K) pair of frames or the groups of a block variant."""

from __future__ import annotations

import numpy as np

from reference.geometry import Geometry, Point, Tangent, tree_map


class Product:
    """M_1 × … × M_k with the product metric ⟨u, v⟩ = Σ_i ⟨u_i, v_i⟩_{M_i}.

    A point is the tuple (x_1, …, x_k) of the factors' points, a tangent vector the tuple of the
    factors' tangent vectors. Each factor keeps its own moment groups (a Stiefel factor is one
    frame) unless ``shared_moment`` is set, in which case one scalar moment (and one trust region)
    covers all.
    """

    def __init__(self, *factors: Geometry, shared_moment: bool = False):
        if len(factors) < 1:
            raise ValueError("a product needs at least one factor")
        self.factors = factors
        self.dim = sum(f.dim for f in factors)
        if all(hasattr(f, "project_point") for f in factors):  # a product of frames
            self.project_point = lambda a: self._each("project_point", a)
        groups, offset = [], 0
        for f in factors:
            groups += [tuple(offset + i for i in g) for g in f.moment_groups]
            offset += 1 + max(i for g in f.moment_groups for i in g)
        self.moment_groups = (tuple(range(offset)),) if shared_moment else tuple(groups)

    def __repr__(self) -> str:
        return " × ".join(map(repr, self.factors))

    def _each(self, method: str, *args: tuple) -> tuple:
        return tuple(getattr(f, method)(*a) for f, *a in zip(self.factors, *args, strict=True))

    def random_point(self, rng: np.random.Generator) -> Point:
        return tuple(f.random_point(rng) for f in self.factors)

    def random_tangent(self, x: Point, rng: np.random.Generator) -> Tangent:
        u = tuple(f.random_tangent(xi, rng) for f, xi in zip(self.factors, x, strict=True))
        n = self.norm(x, u)
        return tree_map(lambda p: p / n, u)

    def zero_tangent(self, x: Point) -> Tangent:
        return self._each("zero_tangent", x)

    def inner(self, x: Point, u: Tangent, v: Tangent) -> float:
        return float(sum(self._each("inner", x, u, v)))

    def norm(self, x: Point, u: Tangent) -> float:
        return float(np.sqrt(max(self.inner(x, u, u), 0.0)))

    def proj(self, x: Point, z: Tangent) -> Tangent:
        return self._each("proj", x, z)

    def proj_tangent(self, x: Point, u: Tangent) -> Tangent:
        return self._each("proj_tangent", x, u)

    def egrad_to_rgrad(self, x: Point, egrad: Tangent) -> Tangent:
        return self._each("egrad_to_rgrad", x, egrad)

    def retract(self, x: Point, u: Tangent) -> Point:
        return self._each("retract", x, u)

    def transport(self, x: Point, y: Point, u: Tangent) -> Tangent:
        return self._each("transport", x, y, u)

    def to_matrix(self, x: Point) -> tuple:
        return self._each("to_matrix", x)

    def tangent_to_matrix(self, x: Point, u: Tangent) -> tuple:
        return self._each("tangent_to_matrix", x, u)

    def check_point(self, x: Point) -> None:
        if not isinstance(x, tuple) or len(x) != len(self.factors):
            raise ValueError(f"a point of {self!r} is a tuple of {len(self.factors)} arrays")
        self._each("check_point", x)
