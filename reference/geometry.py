"""The protocol every geometry implements, and helpers for tangent vectors stored as tuples.

A point or a tangent vector is either one array (Stiefel, Euclidean), a tuple of arrays (the
factored geometries) or a tuple of such tuples (products, block variants). The helpers below treat
all of them uniformly through their *parts*: the arrays at the leaves, in depth-first order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

Array = np.ndarray
Point = Any  # an array or a tuple of arrays
Tangent = Any


@runtime_checkable
class Geometry(Protocol):
    """What the optimizers and the checks need from a geometry (DESIGN §4).

    ``moment_groups`` lists, for the optimizers, which parts of a tangent vector form one frame:
    each group receives one scalar second moment and its own trust-region cap.
    """

    dim: int
    moment_groups: tuple[tuple[int, ...], ...]

    def random_point(self, rng: np.random.Generator) -> Point: ...
    def random_tangent(self, x: Point, rng: np.random.Generator) -> Tangent: ...
    def zero_tangent(self, x: Point) -> Tangent: ...
    def inner(self, x: Point, u: Tangent, v: Tangent) -> float: ...
    def norm(self, x: Point, u: Tangent) -> float: ...
    def proj(self, x: Point, z: Tangent) -> Tangent: ...
    def proj_tangent(self, x: Point, u: Tangent) -> Tangent:
        """Orthogonal projection onto T_x of a vector already in the tangent layout (used after
        an entrywise operation on a tangent vector); the same as ``proj`` unless the geometry
        is ``embedded`` (whose ``proj`` takes a factor-space gradient)."""
        ...

    def egrad_to_rgrad(self, x: Point, egrad: Tangent) -> Tangent: ...
    def retract(self, x: Point, u: Tangent) -> Point: ...
    def transport(self, x: Point, y: Point, u: Tangent) -> Tangent: ...
    def to_matrix(self, x: Point) -> Array: ...
    def tangent_to_matrix(self, x: Point, u: Tangent) -> Array: ...
    def check_point(self, x: Point) -> None: ...


class FactoredGeometry(Geometry, Protocol):
    """The ten low-rank geometries (DESIGN §4.1–4.4) add what the checks and the block variants
    need. Every point represents W = A Bᵀ for a *pair* of factors (A ∈ R^{m×r}, B ∈ R^{n×r}); the
    Euclidean gradients taken by ``egrad_to_rgrad`` and ``proj`` are with respect to the stored
    factors, in the layout of the point. Nothing here forms an m×n matrix except ``to_matrix``,
    ``tangent_to_matrix`` and ``egrad_from_matrix``, which exist for checks only.

    name: the key in ``reference.GEOMETRIES``.
    embedded: True when tangent vectors are represented in the matrix space (R1, P1): ``proj``
        then maps a factor-space *gradient* to the tangent vector; False when tangent vectors live
        in factor space (R2, P2, P3): ``proj`` is then the metric-orthogonal projection of a
        factor-space vector onto the (horizontal) tangent space, idempotent on that space.
    quotient: True for R2 and P2 (points are equivalence classes of factors).
    retraction_order: 2 where a second-order retraction is claimed, else 1.
    """

    name: str
    embedded: bool
    quotient: bool
    retraction_order: int

    def pair(self, x: Point) -> tuple[Array, Array]:
        """(A, B) with to_matrix(x) = A Bᵀ (e.g. (U S, V) for (U, S, V))."""
        ...

    def egrad_from_pair(self, x: Point, g_pair: tuple[Array, Array]) -> Tangent:
        """Chain rule: the factor gradient of f(x) = F(A Bᵀ) from (∂F/∂A, ∂F/∂B) = (G B, Gᵀ A)."""
        ...

    def egrad_from_matrix(self, x: Point, g: Array) -> Tangent: ...


def parts(u: Tangent) -> tuple[Array, ...]:
    """The arrays making up a point or tangent vector (its leaves, depth first)."""
    if isinstance(u, tuple):
        return tuple(a for item in u for a in parts(item))
    return (u,)


def like(template: Tangent, arrays: Sequence[Array]) -> Tangent:
    """Pack arrays back into the (possibly nested) tuple structure of ``template``."""
    leaves = iter(arrays)

    def build(t: Tangent) -> Tangent:
        return tuple(build(item) for item in t) if isinstance(t, tuple) else next(leaves)

    return build(template)


def same_structure(a: Tangent, b: Tangent) -> bool:
    """Whether two points/tangents nest tuples the same way (shapes aside)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(map(same_structure, a, b))
    return not isinstance(a, tuple) and not isinstance(b, tuple)


def tree_map(f: Callable[..., Array], u: Tangent, *rest: Tangent) -> Tangent:
    """Apply ``f`` part by part to tangent vectors of the same structure."""
    return like(u, [f(*ps) for ps in zip(parts(u), *map(parts, rest), strict=True)])


def is_integer(v: Any) -> bool:
    """Whether v is an integer (Python's or NumPy's) and not a bool: True is not a size."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _listing(items: Sequence[str]) -> str:
    return " and ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else items[0]


def check_sizes(owner: str, **sizes: Any) -> None:
    """Raise TypeError unless every size is an integer (not a bool, a float or a string), and
    ValueError unless every size is ≥ 1; the message names ``owner``, the size and its value."""
    for label, v in sizes.items():
        if not is_integer(v):
            raise TypeError(f"{owner} needs integer {_listing(list(sizes))}, got {label}={v!r}")
    if any(v < 1 for v in sizes.values()):
        raise ValueError(
            f"{owner} needs {_listing([f'{k} ≥ 1' for k in sizes])}, got "
            + ", ".join(f"{k}={v}" for k, v in sizes.items())
        )


def check_real(name: str, value: Tangent) -> None:
    """Raise TypeError naming ``name`` unless every part holds real numbers (a floating-point or
    integer dtype): complex parts would make complex points (NumPy only warns when it drops the
    imaginary part), and bool, string or object parts are not numbers."""
    ps = parts(value)
    for i, p in enumerate(ps):
        where = f" (part {i} of {len(ps)})" if len(ps) > 1 else ""
        try:
            dtype = np.asarray(p).dtype
        except ValueError as exc:  # a ragged nested list
            raise ValueError(f"{name}: not an array{where}: {exc}") from None
        if dtype.kind not in "fiu":
            raise TypeError(
                f"{name}: entries must be real numbers (a float or integer dtype), got dtype "
                f"{dtype}{where}"
            )


def check_shapes(name: str, expected: Sequence[tuple[int, ...]], value: Tangent) -> None:
    """Raise ValueError naming ``name`` when ``value``'s parts do not have the expected shapes
    (TypeError, from ``check_real``, when they do not hold real numbers)."""
    check_real(name, value)
    got = [np.shape(p) for p in parts(value)]
    if [tuple(e) for e in expected] != got:
        raise ValueError(f"{name}: expected shapes {list(expected)}, got {got}")


def check_finite(name: str, value: Tangent) -> None:
    """Raise ValueError when ``value`` has a NaN or an infinite entry, with the count (TypeError,
    from ``check_real``, when it does not hold real numbers)."""
    check_real(name, value)
    bad = sum(int(np.size(p) - np.count_nonzero(np.isfinite(p))) for p in parts(value))
    if bad:
        raise ValueError(f"{name}: {bad} non-finite entries (NaN or inf)")


class PairMixin:
    """What every factored geometry derives from ``pair`` and ``egrad_from_pair``."""

    def to_matrix(self, x: Point) -> Array:
        """W = A Bᵀ (checks only: forms an m×n matrix)."""
        a, b = self.pair(x)
        return a @ b.T

    def egrad_from_matrix(self, x: Point, g: Array) -> Tangent:
        """The factor gradient of F(A Bᵀ) for G = ∇F (checks only: takes an m×n matrix)."""
        a, b = self.pair(x)
        return self.egrad_from_pair(x, (g @ b, g.T @ a))

    def norm(self, x: Point, u: Tangent) -> float:
        return float(np.sqrt(max(self.inner(x, u, u), 0.0)))
