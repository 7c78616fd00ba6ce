"""The geometries ``rattn conform`` drives an optimizer on: Stiefel frames, the ten design points.

A space says how the optimizer's parameters hold points, what the factory is given, and how a
point is seen by the properties. Points are numbered; each point is held by one or more
parameters and is a batch of elements, each element one reference point:

- ``stiefel``: each parameter is one point, a frame (d, r) or a batch of frames (..., d, r); the
  factory is given the list of parameters.
- one of the ten (``--geometry NAME``): each point is one parameter group whose parameters are
  its factors, in the port's layout (``torch_port.geometries``; block variants per head); the
  factory is given the list of groups ``{"params": [...], "geometry": NAME, **options}``, as the
  port's optimizers take them.

What the properties see of an element (``view``): the represented matrix W where the set is a
set of matrices (R1 and R2: rank-r matrices, W = U S Vᵀ or A Bᵀ; P1 and P2: rank-r partial
isometries, W = U Vᵀ), so that factors defined up to a group action (R1's SVD, the quotients)
compare as the point they represent; the frames themselves for Stiefel and for the Stiefel pair
P3, whose points are the pairs. ``normal`` is the part of a vector of that view normal to the
set's tangent space at the element in the Frobenius metric: sym(WᵀD) of each frame, or for W of
rank r with column and row spaces U, V, (I − UUᵀ)D(I − VVᵀ), plus U·sym(UᵀDV)·Vᵀ for a partial
isometry W = UVᵀ (whose tangent vectors have UᵀDV skew; DESIGN §4.1, §4.3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import reference as ref
from proofs_checks.audit.elements import gram_condition
from proofs_checks.port_compare.geometries import PointAdapter, polar_drift_bound
from reference.linalg import sym, transpose

Array = np.ndarray

#: The Stiefel problem's parameters: one frame and a batch of two frames.
FRAME_SHAPES: tuple[tuple[int, ...], ...] = ((8, 3), (2, 6, 2))
#: The ten's problem: a point of m×n, rank r, and a batch of two of (m', n', r') (block
#: variants: two query heads sharing one key factor, as ``rattn compare``).
POINT_SIZES: tuple[tuple[tuple[int, ...], int, int, int], ...] = (((), 6, 5, 2), ((2,), 5, 4, 2))
BLOCK_DEFAULTS = {"n_heads": 2, "n_kv_heads": 1}


def _orthonormality(f: Array) -> float:
    return float(np.linalg.norm(transpose(f) @ f - np.eye(f.shape[-1])))


class FrameSpace:
    """Stiefel St(d, r) with the embedded metric: points (d, r) arrays, tangent vectors (d, r)
    arrays with WᵀD + DᵀW = 0."""

    name = "stiefel"

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = dict(options or {})
        self.shapes = FRAME_SHAPES

    def __len__(self) -> int:
        return len(self.shapes)

    def params_of(self, i: int) -> list[int]:
        return [i]

    def argument(self, params: Sequence[torch.nn.Parameter]) -> list:
        return list(params)

    def geometry(self, i: int) -> Any:
        return ref.Stiefel(*self.shapes[i][-2:], **self.options)

    def elements(self, i: int, arrays: Sequence[Array]) -> list[Array]:
        a = arrays[0]
        return list(a.reshape(-1, *a.shape[-2:]))

    def assemble(self, i: int, elements: Sequence[Array]) -> list[Array]:
        return [np.stack(elements).reshape(self.shapes[i])]

    def count(self, i: int) -> int:
        return int(np.prod(self.shapes[i][:-2], dtype=int))

    def rows(self, i: int) -> int:
        return self.shapes[i][-2]

    def cols(self, i: int) -> int:
        return self.shapes[i][-1]

    def matrices(self, i: int, x: Array) -> list[Array]:
        return [x]

    def pullback(self, i: int, x: Array, g: Sequence[Array]) -> Array:
        return g[0]

    def rotate(self, qp: tuple[Array, Array | None], x: Array) -> Array:
        """Q·W (left equivariance, RA-4)."""
        return qp[0] @ x

    def view(self, i: int, x: Array) -> list[Array]:
        return [x]

    def normal(self, i: int, x: Array, parts: Sequence[Array]) -> list[Array]:
        return [x @ sym(transpose(x) @ parts[0])]

    def view_gradient(self, i: int, x: Array, g: Sequence[Array], egrad: Array) -> list[Array]:
        """The gradient of the loss with respect to the view (the frame's own)."""
        return [egrad]

    def view_tangent(self, i: int, x: Array, xi: Array) -> list[Array]:
        """The view's velocity along the tangent vector xi."""
        return [xi]

    def rgrad(self, i: int, x: Array, egrad: Array, metric: str | None = None) -> Array:
        """The Riemannian gradient in the claimed metric (the space's own when None)."""
        options = {**self.options, **({"metric": metric} if metric else {})}
        return ref.Stiefel(*x.shape, **options).egrad_to_rgrad(x, egrad)

    def order_gap(
        self, i: int, x: Array, d: Sequence[Array], c: Sequence[Array], metric: str | None = None
    ) -> list[Array] | None:
        """C − ½γ''(0), γ the metric's geodesic with γ(0) = W, γ'(0) = D (Edelman, Arias & Smith
        1998, eqs. 2.7 and 2.41): γ'' = −W DᵀD (embedded), −D DᵀW − W((WᵀD)² + DᵀD)
        (canonical); zero to second order for a retraction of order 2."""
        dd = d[0]
        dtd = transpose(dd) @ dd
        if (metric or self.options.get("metric", "embedded")) == "canonical":
            wtd = transpose(x) @ dd
            return [c[0] - 0.5 * (-dd @ transpose(dd) @ x - x @ (wtd @ wtd + dtd))]
        return [c[0] + 0.5 * x @ dtd]

    def project(self, i: int, x: Array) -> Array:
        """The nearest point of the manifold (the polar factor), in float64."""
        return ref.linalg.polar(x)

    def representative(self, i: int, ybar: Array, y: Array) -> None:
        """A frame is its own point: no group to align."""
        return None

    def residual(self, i: int, x: Array) -> float:
        return _orthonormality(x) if np.isfinite(x).all() else math.inf

    def drift_bound(self, dtype: torch.dtype) -> float:
        """One orthonormalisation's rounding, the Gram in the frames' dtype (the port's Stiefel
        retraction)."""
        return max(polar_drift_bound(d, r, dtype, gram=dtype) for d, r in self.sizes())

    def conditioning(self, x: Array) -> float:
        return 1.0

    def sizes(self) -> list[tuple[int, int]]:
        """(largest matrix dimension, rank) of each point."""
        return [tuple(s[-2:]) for s in self.shapes]


@dataclass(frozen=True)
class _Point:
    adapter: PointAdapter
    batch: tuple[int, ...]


class FactorSpace:
    """One of the ten design points (``reference.GEOMETRIES[name]``, the geometry's own metric):
    a point is a tuple of factors (block variants: a tuple over block groups of such tuples),
    tangent vectors are the geometry's tangent tuples."""

    def __init__(self, name: str, options: dict[str, Any] | None = None):
        if name not in ref.GEOMETRIES or name == "stiefel":
            raise ValueError(
                f"--geometry {name!r}: choose stiefel or one of "
                f"{', '.join(n for n in ref.GEOMETRIES if n != 'stiefel')}"
            )
        self.name = name
        self.options = dict(options or {})
        opts = {**(BLOCK_DEFAULTS if name.startswith("block_") else {}), **(options or {})}
        self.points = [
            _Point(PointAdapter(name, m, n, r, tuple(sorted(opts.items()))), batch)
            for batch, m, n, r in POINT_SIZES
        ]
        for p in self.points:
            try:  # refuses a bad option now, with the geometry's own message
                p.adapter.geometries()
            except TypeError as err:
                raise ValueError(f"--geometry {name}: {err}") from None
        self.pairs = name.endswith("stiefel_pair")
        self.partial_isometry = "partial_isometry" in name
        self._layout = []
        k = 0
        for p in self.points:
            n_params = len(self._like(p))
            self._layout.append(list(range(k, k + n_params)))
            k += n_params

    def __len__(self) -> int:
        return len(self.points)

    def params_of(self, i: int) -> list[int]:
        return self._layout[i]

    def argument(self, params: Sequence[torch.nn.Parameter]) -> list[dict[str, Any]]:
        return [
            p.adapter.group([params[k] for k in self._layout[i]]) for i, p in enumerate(self.points)
        ]

    def geometry(self, i: int) -> Any:
        return self.points[i].adapter.geometries()[0]

    def _like(self, p: _Point) -> list[Array]:
        _, tg = p.adapter.geometries()
        shapes = tg.head_shapes() if hasattr(tg, "head_shapes") else tg.point_shapes
        return [np.zeros((*p.batch, *s)) for s in shapes]

    def elements(self, i: int, arrays: Sequence[Array]) -> list[Any]:
        return [x for _, x in self.points[i].adapter.elements(arrays)]

    def assemble(self, i: int, elements: Sequence[Any]) -> list[Array]:
        p = self.points[i]
        return p.adapter.assemble(elements, self._like(p))

    def count(self, i: int) -> int:
        return int(np.prod(self.points[i].batch, dtype=int))

    def rows(self, i: int) -> int:
        return self._example(i)[0].shape[0]

    def cols(self, i: int) -> int:
        return self._example(i)[0].shape[1]

    def _example(self, i: int) -> list[Array]:
        """The represented matrices of a point of point i's sizes."""
        return self.matrices(i, self.geometry(i).random_point(np.random.default_rng(0)))

    def _sets(self, x: Any) -> list[tuple[Array, ...]]:
        return list(x) if self.name.startswith("block_") else [x]

    def matrices(self, i: int, x: Any) -> list[Array]:
        """The represented matrix of each block group (one for a plain point)."""
        w = self.geometry(i).to_matrix(x)
        return list(w) if isinstance(w, tuple) else [w]

    def pullback(self, i: int, x: Any, g: Sequence[Array]) -> Any:
        """The factor gradients of a loss whose gradient in W is g (one per block group)."""
        block = self.name.startswith("block_")
        return self.geometry(i).egrad_from_matrix(x, tuple(g) if block else g[0])

    def rotate(self, qp: tuple[Array, Array], x: Any) -> Any:
        """W ↦ Q·W·Pᵀ: Q on the row factor (U or A), P on the column factor (V or B), stacked
        for a block group; a core S is unchanged."""
        q, p = qp
        turned = [(q @ s[0], *s[1:-1], p @ s[-1]) for s in self._sets(x)]
        return tuple(turned) if self.name.startswith("block_") else turned[0]

    def view(self, i: int, x: Any) -> list[Array]:
        if self.pairs:
            return [np.asarray(f) for s in self._sets(x) for f in s]
        return self.matrices(i, x)

    def normal(self, i: int, x: Any, parts: Sequence[Array]) -> list[Array]:
        if self.pairs:
            frames = [np.asarray(f) for s in self._sets(x) for f in s]
            return [f @ sym(transpose(f) @ d) for f, d in zip(frames, parts, strict=True)]
        out = []
        r = self.points[i].adapter.r
        for w, d in zip(self.matrices(i, x), parts, strict=True):
            u, _, vt = np.linalg.svd(w)
            u, v = u[:, :r], vt[:r].T
            pu, pv = np.eye(w.shape[0]) - u @ u.T, np.eye(w.shape[1]) - v @ v.T
            n = pu @ d @ pv
            if self.partial_isometry:
                n = n + u @ sym(u.T @ d @ v) @ v.T
            out.append(n)
        return out

    def view_gradient(self, i: int, x: Any, g: Sequence[Array], egrad: Any) -> list[Array]:
        """The gradient of the loss with respect to the view: G_W, or the frames' own."""
        return [np.asarray(f) for s in self._sets(egrad) for f in s] if self.pairs else list(g)

    def view_tangent(self, i: int, x: Any, xi: Any) -> list[Array]:
        """The view's velocity along the tangent vector xi: the tangent matrix, or xi itself."""
        if self.pairs:
            return [np.asarray(f) for s in self._sets(xi) for f in s]
        w = self.geometry(i).tangent_to_matrix(x, xi)
        return list(w) if isinstance(w, tuple) else [w]

    def rgrad(self, i: int, x: Any, egrad: Any, metric: str | None = None) -> Any:
        """The Riemannian gradient in the geometry's own metric."""
        return self.geometry(i).egrad_to_rgrad(x, egrad)

    def order_gap(
        self, i: int, x: Any, d: Sequence[Array], c: Sequence[Array], metric: str | None = None
    ) -> list[Array] | None:
        """The tangential part of the second-order term C. On R1, P1 and P3, embedded in
        Frobenius spaces, a curve on the set with velocity D has the normal part of its
        acceleration forced (the second fundamental form II(D, D), the geodesic's whole
        acceleration), so order 2 means C − ½γ'' = C − normal(C) = 0. On a quotient (R2, P2)
        the geodesics are horizontal lifts, not read from W: None (not measured)."""
        if self.name.endswith("_quotient"):
            return None
        return [ci - ni for ci, ni in zip(c, self.normal(i, x, c), strict=True)]

    def project(self, i: int, x: Any) -> Any:
        """x with each frame among its factors replaced by its polar factor (float64)."""
        _, tg = self.points[i].adapter.geometries()

        def one(factors: tuple) -> tuple:
            return tuple(
                ref.linalg.polar(f) if k in tg.orthonormal_factors else f
                for k, f in enumerate(factors)
            )

        sets = [one(s) for s in self._sets(x)]
        return tuple(sets) if self.name.startswith("block_") else sets[0]

    def representative(self, i: int, ybar: Any, y: Any) -> Any:
        """On a quotient, the group element g with act(ȳ, g) the representative of ȳ's point
        nearest the factors y: R2, M ∈ GL(r) with A_ȳM = A_y in least squares; P2, the Q ∈ O(r)
        nearest to U_ȳᵀU_y + V_ȳᵀV_y (its polar factor, Procrustes); a tuple over block groups.
        None where the factors are the point or a transport reads only W (R1, P1, P3)."""
        if not self.name.endswith("_quotient"):
            return None
        gs = []
        for sb, sy in zip(self._sets(ybar), self._sets(y), strict=True):
            if "fixed_rank" in self.name:
                gs.append(np.linalg.lstsq(sb[0], sy[0], rcond=None)[0])
            else:
                gs.append(ref.linalg.polar(transpose(sb[0]) @ sy[0] + transpose(sb[1]) @ sy[1]))
        return tuple(gs) if self.name.startswith("block_") else gs[0]

    def residual(self, i: int, x: Any) -> float:
        """max ‖FᵀF − I‖ over the frames among the factors; inf for a factor that is not finite
        or, where no factor is a frame (R2), for a rank-deficient one."""
        if not all(np.isfinite(f).all() for s in self._sets(x) for f in s):
            return math.inf
        frames = self._frames(x)
        if frames:
            return max(_orthonormality(f) for f in frames)
        smallest = min(np.linalg.svd(f, compute_uv=False)[-1] for s in self._sets(x) for f in s)
        return 0.0 if smallest > 0 else math.inf

    def _frames(self, x: Any) -> list[Array]:
        _, tg = self.points[0].adapter.geometries()
        return [s[i] for s in self._sets(x) for i in tg.orthonormal_factors]

    def drift_bound(self, dtype: torch.dtype) -> float:
        """One orthonormalisation's rounding of the largest frame (the ten's retractions end in
        a float64-Gram polar factor of each frame; 0 where no factor is a frame)."""
        bounds = [0.0]
        for p in self.points:
            rg, tg = p.adapter.geometries()
            for s in self._sets(rg.random_point(np.random.default_rng(0))):
                bounds += [polar_drift_bound(*s[i].shape, dtype) for i in tg.orthonormal_factors]
        return max(bounds)

    def conditioning(self, x: Any) -> float:
        """max cond(F)² over the factors that are not frames (1 for frames only)."""
        _, tg = self.points[0].adapter.geometries()
        return gram_condition(self._sets(x), tg.orthonormal_factors)

    def sizes(self) -> list[tuple[int, int]]:
        return [(max(self._example(i)[0].shape), p.adapter.r) for i, p in enumerate(self.points)]


def space(geometry: str, options: dict[str, Any] | None = None) -> FrameSpace | FactorSpace:
    """The space of ``--geometry NAME`` with the geometry's options (retraction, metric)."""
    return FrameSpace(options) if geometry == "stiefel" else FactorSpace(geometry, options)
