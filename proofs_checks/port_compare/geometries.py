"""How ``rattn compare`` holds a point of each geometry on both sides (``GEOMETRY_ADAPTERS``).

The port keeps the parameters of one optimizer group as batched tensors (a Stiefel group: each
parameter a batch of frames (..., d, r); a group of one of the ten design points: the factors of
one batched point, per-head layout for the block variants). The reference keeps every element of
the batch as its own point with its own optimizer state. An adapter converts between the two:
``elements`` turns the parameters' arrays (float64, the port's layout) into the list of
reference points, ``assemble`` turns such a list back; both also convert factor gradients, which
have the layout of the points. ``compared`` is what is compared between the sides: the point
itself where both sides keep the same factors (a frame; the factors of P1, whose retraction
aligns the new factors to the old ones, and of P3), else the represented matrix W = A Bᵀ: for
the quotients R2 and P2, whose factors are defined up to the group, and for R1, whose factors
(U, S, V) represent W up to U ↦ UQ, S ↦ QᵀSP, V ↦ VP (a point made by ``random_point`` has a full
S; after one step both sides hold an SVD form, with column signs of LAPACK's choosing).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import reference as ref
from torch_port.geometries import GEOMETRIES
from torch_port.linalg import gram_dtype

Array = np.ndarray


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = ε/2 of a floating dtype (float64 2^-53, float32 2^-24, bfloat16 2^-8)."""
    return torch.finfo(dtype).eps / 2.0


def polar_drift_bound(
    d: int, r: int, dtype: torch.dtype, gram: torch.dtype = torch.float64
) -> float:
    """‖FᵀF − I‖_F after a step that ends in the polar factor of a d×r factor F = A·S,
    S = (AᵀA + E)^{-1/2}, with the Gram formed in the dtype ``gram`` (float64 for
    ``torch_port.linalg.polar``; the frames' own dtype for the Stiefel optimizer's retraction,
    ``linalg.gram_dtype``): 4r(r + 1)·u_w for the d×r product with inner length r and the cast
    of S to the dtype, plus 2(d + r)r·u_g for the Gram and the float64 inverse square root.
    The Gram's part: (AS)ᵀ(AS) − I = −S E S exactly, ‖E‖ ≤ γ_d(u_g)‖A‖_F², and for steps
    ‖ξ‖ ≤ 0.4√r off a point within sqrt(ε) of the manifold ‖A‖_F² ≤ 1.96·r(1 + 10⁻³) and
    ‖S‖₂² ≤ 1 + 10⁻³, so ≤ 2d·r·u_g; the r×r part adds ≤ 2r²·u₆₄ ≤ 2r²·u_g. Drift does not
    accumulate: the Gram is re-formed from the stored entries at every step."""
    u_w, u_g = unit_roundoff(dtype), unit_roundoff(gram)
    return 4.0 * r * (r + 1) * u_w + 2.0 * (d + r) * r * u_g


def _perturb(geometry: Any, x: Any, rng: np.random.Generator, size: float) -> Any:
    """A point ``size`` away from x along a random unit tangent vector."""
    u = geometry.random_tangent(x, rng)
    return geometry.retract(x, ref.geometry.tree_map(lambda p: size * p, u))


def _orthonormality(f: Array) -> float:
    return float(np.linalg.norm(f.T @ f - np.eye(f.shape[1])))


@dataclass(frozen=True)
class FrameAdapter:
    """Stiefel: every trailing d×r matrix of every parameter is one reference point."""

    name: str = "stiefel"
    retraction: str = "polar"
    metric: str = "embedded"

    def group(self, params: list[torch.Tensor]) -> dict[str, Any]:
        return {
            "params": params,
            "geometry": "stiefel",
            "retraction": self.retraction,
            "metric": self.metric,
        }

    def elements(self, arrays: Sequence[Array]) -> list[tuple[Any, Any]]:
        """(reference geometry, point) of every frame, parameter by parameter."""
        return [
            (ref.Stiefel(*a.shape[-2:], retraction=self.retraction, metric=self.metric), a[i])
            for a in arrays
            for i in np.ndindex(*a.shape[:-2])
        ]

    def assemble(self, points: Sequence[Any], like: Sequence[Array]) -> list[Array]:
        out, k = [], 0
        for a in like:
            q = np.empty_like(a)
            for i in np.ndindex(*a.shape[:-2]):
                q[i], k = points[k], k + 1
            out.append(q)
        return out

    compares_matrix = False

    def compared(self, point: Array) -> list[Array]:
        return [point]

    def residual(self, point: Array) -> float | None:
        return _orthonormality(point)

    def drift_bound(self, point: Array, dtype: torch.dtype) -> float | None:
        d, r = point.shape
        if self.retraction != "polar":
            return None
        return polar_drift_bound(d, r, dtype, gram_dtype(dtype))

    def diameter(self, point: Array) -> float:
        """No two frames of St(d, r) are farther apart than 2·sqrt(r)."""
        return 2.0 * math.sqrt(point.shape[-1])

    def scale(self, point: Array) -> float:
        """‖W‖_F/sqrt(r): 1 for a frame (the local error per step is C·u_w·scale)."""
        return 1.0

    def perturb(self, geometry: Any, point: Array, rng: np.random.Generator, size: float):
        """polar(W + size·Z/‖Z‖) for a Gaussian Z."""
        z = rng.standard_normal(point.shape)
        return ref.linalg.polar(point + size * z / np.linalg.norm(z))


#: Retractions of the ten whose last operation is ``linalg.polar`` of each orthonormal factor.
_POLAR_ENDED = ("projection", "polar")


@dataclass(frozen=True)
class PointAdapter:
    """One of the ten design points: a group's parameters are the factors of one batched point,
    each element of the batch one reference point (block variants: a tuple over the groups)."""

    name: str
    m: int
    n: int
    r: int
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def block(self) -> bool:
        return self.name.startswith("block_")

    @property
    def compares_matrix(self) -> bool:
        """Compare W = A Bᵀ rather than the factors (module docstring)."""
        return self.name.endswith(("_quotient", "fixed_rank_embedded"))

    def geometries(self) -> tuple[Any, Any]:
        """(reference geometry, torch geometry) of one point."""
        return _geometries(self.name, self.m, self.n, self.r, self.options)

    def group(self, params: list[torch.Tensor]) -> dict[str, Any]:
        return {"params": params, "geometry": self.name, **dict(self.options)}

    def elements(self, arrays: Sequence[Array]) -> list[tuple[Any, Any]]:
        rg, tg = self.geometries()
        x = tg.from_params(tuple(torch.from_numpy(np.asarray(a)) for a in arrays))
        batch = tuple(x[0].shape[: x[0].ndim - 2 - (1 if self.block else 0)])
        out = []
        for e in np.ndindex(*batch):
            if self.block:
                point = tuple(
                    tuple(t[(*e, c)].numpy().copy() for t in x) for c in range(tg.n_groups)
                )
            else:
                point = tuple(t[e].numpy().copy() for t in x)
            out.append((rg, point))
        return out

    def assemble(self, points: Sequence[Any], like: Sequence[Array]) -> list[Array]:
        _, tg = self.geometries()
        x = tg.from_params(tuple(torch.from_numpy(np.array(a, copy=True)) for a in like))
        batch = tuple(x[0].shape[: x[0].ndim - 2 - (1 if self.block else 0)])
        for k, e in enumerate(np.ndindex(*batch)):
            if self.block:
                for c in range(tg.n_groups):
                    for t, part in zip(x, points[k][c], strict=True):
                        t[(*e, c)] = torch.from_numpy(np.asarray(part))
            else:
                for t, part in zip(x, points[k], strict=True):
                    t[e] = torch.from_numpy(np.asarray(part))
        return [t.numpy() for t in tg.to_params(x)]

    def _factor_sets(self, point: Any) -> list[tuple[Array, ...]]:
        return list(point) if self.block else [point]

    def compared(self, point: Any) -> list[Array]:
        """W of every group, or the factors (module docstring)."""
        rg, _ = self.geometries()
        if self.compares_matrix:
            w = rg.to_matrix(point)
            return list(w) if isinstance(w, tuple) else [w]
        return [np.asarray(p) for s in self._factor_sets(point) for p in s]

    def _orthonormal(self, point: Any) -> list[Array]:
        _, tg = self.geometries()
        return [s[i] for s in self._factor_sets(point) for i in tg.orthonormal_factors]

    def residual(self, point: Any) -> float | None:
        frames = self._orthonormal(point)
        return max(_orthonormality(f) for f in frames) if frames else None

    def drift_bound(self, point: Any, dtype: torch.dtype) -> float | None:
        frames = self._orthonormal(point)
        retraction = dict(self.options).get("retraction", "projection")
        if not frames or retraction not in _POLAR_ENDED:
            return None
        return max(polar_drift_bound(f.shape[0], f.shape[1], dtype) for f in frames)

    def diameter(self, point: Any) -> float:
        """2·‖x‖_F of what is compared: the diameter where that is a set of frames (P1, P3:
        2·sqrt(2r)) or of partial isometries (P2: 2·sqrt(r)); for R1 and R2, whose W is
        unbounded, the size of the point itself: a deviation bound as large says nothing."""
        return 2.0 * math.sqrt(sum(float(np.sum(p * p)) for p in self.compared(point)))

    def scale(self, point: Any) -> float:
        """max(1, ‖W‖_F/sqrt(r)): the size of the represented matrix against a frame's."""
        rg, _ = self.geometries()
        w = rg.to_matrix(point)
        mats = list(w) if isinstance(w, tuple) else [w]
        return max(1.0, max(float(np.linalg.norm(a)) for a in mats) / math.sqrt(self.r))

    def perturb(self, geometry: Any, point: Any, rng: np.random.Generator, size: float):
        return _perturb(geometry, point, rng, size)


@functools.cache
def _geometries(name: str, m: int, n: int, r: int, options: tuple) -> tuple[Any, Any]:
    opts = dict(options)
    return ref.GEOMETRIES[name](m, n, r, **opts), GEOMETRIES[name](m, n, r, **opts)


#: Sizes of the ten's problems: m×n blocks of rank r (as the agreement tests of the port).
M, N, R = 6, 5, 2


def point_adapter(name: str, **options: Any) -> PointAdapter:
    """The adapter of one of the ten at the problems' sizes; block variants default to two query
    heads sharing one key factor (MQA), as the reference."""
    if name.startswith("block_"):
        options = {"n_heads": 2, "n_kv_heads": 1, **options}
    return PointAdapter(name, M, N, R, tuple(sorted(options.items())))


#: Geometry name -> its adapter (default options).
GEOMETRY_ADAPTERS: dict[str, Any] = {
    "stiefel": FrameAdapter(),
    **{name: point_adapter(name) for name in ref.GEOMETRIES},
}
