"""Plain arrays: the Euclidean space R^{shape}, for baselines (AdamW) and movement ratios."""

from __future__ import annotations

import numpy as np

from reference.geometry import check_finite, check_shapes, is_integer
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
