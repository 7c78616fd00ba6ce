"""The protocol of the torch geometries, and the base of the factored ones (DESIGN §4, §7).

``Geometry`` mirrors ``reference.geometry.Geometry``: the same methods with batched tensors of
shape (..., *trailing) in place of arrays, per-point scalars of shape (...,). ``PointGeometry``
is what the optimizers of ``torch_port.optim`` need on top: a point is a tuple of tensors (one
per factor; a Stiefel frame is the 1-tuple (W,)), and the per-frame operations act on the
frames of a point (a *frame* is a moment group of the reference: one scalar second moment, one
trust region). ``FactoredGeometry`` is the base of the ten design points and implements the
per-frame operations once; ``torch_port.stiefel.StiefelFrames`` is Stiefel's implementation,
with the fused hot path; ``Ambient`` is the ambient Euclidean view of either (the optimizers'
``gradient="euclidean"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from torch_port import deferred, linalg
from torch_port.linalg import Tensor

Parts = Sequence[Tensor]


@runtime_checkable
class Geometry(Protocol):
    """The geometry protocol of ``reference/geometry.py``, batched (tensors (..., *trailing))."""

    name: str
    dim: int
    moment_groups: tuple[tuple[int, ...], ...]
    retraction_order: int

    #: random_point(generator=None, batch_shape=(), dtype=torch.float64, device=None)
    random_point: Callable[..., Any]

    def random_tangent(self, x: Any, generator: torch.Generator | None = None) -> Any: ...
    def zero_tangent(self, x: Any) -> Any: ...
    def inner(self, x: Any, u: Any, v: Any) -> Tensor: ...
    def norm(self, x: Any, u: Any) -> Tensor: ...
    def proj(self, x: Any, z: Any) -> Any: ...
    def proj_tangent(self, x: Any, u: Any) -> Any: ...
    def egrad_to_rgrad(self, x: Any, g: Any) -> Any: ...
    def retract(self, x: Any, u: Any) -> Any: ...
    def transport(self, x: Any, y: Any, u: Any) -> Any: ...
    def check_point(self, x: Any, atol: float | None = None) -> None: ...


@runtime_checkable
class PointGeometry(Protocol):
    """A geometry as the optimizers see it: points and tangent vectors are tuples of tensors.

    ``frame_shape`` is the trailing shape of per-frame scalars (() for one frame per point);
    ``frame_batch(x)`` the whole shape of x's per-frame scalars; ``frame_norms(x, u)`` the
    metric norm of each frame of u; ``frame_sizes()`` the entries of each frame;
    ``scale_frames(u, c)`` u frame by frame times c; ``retract_scaled(x, u, c)`` =
    retract(x, scale_frames(u, c)), which a geometry may fuse (and may return a lazy value with
    ``write_into(param)``); ``transport_owned(x, y, u)`` = transport(x, y, u), which may
    overwrite u. ``rgrad_is_fresh``: ``egrad_to_rgrad`` returns new tensors that a rule may
    overwrite. ``retraction_checks_finite``: the retraction raises on non-finite input itself.
    ``orthonormal_factors``: the factors that are frames (``reproject``). ``from_params`` and
    ``to_params`` map the parameters holding a point to the point and back."""

    name: str
    moment_groups: tuple[tuple[int, ...], ...]
    frame_shape: tuple[int, ...]
    rgrad_is_fresh: bool
    retraction_checks_finite: bool
    orthonormal_factors: tuple[int, ...]

    def frame_batch(self, x: Parts) -> tuple[int, ...]: ...
    def frame_norms(self, x: Parts, u: Parts) -> Tensor: ...
    def frame_sizes(self) -> tuple[int, ...]: ...
    def scale_frames(self, u: Parts, c: Tensor) -> tuple: ...
    def retract_scaled(self, x: Parts, u: Parts, c: Tensor) -> tuple: ...
    def transport_owned(self, x: Parts, y: Parts, u: Parts) -> tuple: ...
    def from_params(self, params: Parts) -> tuple: ...
    def to_params(self, x: Parts) -> tuple: ...
    def zero_tangent(self, x: Parts) -> tuple: ...
    def egrad_to_rgrad(self, x: Parts, g: Parts) -> tuple: ...
    def proj_tangent(self, x: Parts, u: Parts) -> tuple: ...
    def retract(self, x: Parts, u: Parts) -> tuple: ...
    def transport(self, x: Parts, y: Parts, u: Parts) -> tuple: ...
    def check_point(self, x: Parts, atol: float | None = None) -> None: ...


# -- validation helpers --------------------------------------------------------------------------
def check_factor_shapes(geometry, what: str, x: Parts, shapes: Sequence[tuple[int, ...]]) -> None:
    """Raise ValueError unless x is a tuple of tensors with the given trailing shapes and one
    common batch shape, all of one real floating dtype."""
    if not isinstance(x, tuple | list) or len(x) != len(shapes):
        raise ValueError(f"{geometry.name} {what}: expected a tuple of {len(shapes)} tensors")
    batch = None
    for t, shape in zip(x, shapes, strict=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{geometry.name} {what}: expected tensors, got {type(t).__name__}")
        if not t.dtype.is_floating_point or t.is_complex():
            raise TypeError(
                f"{geometry.name} {what}: expected a real floating dtype, got {t.dtype}"
            )
        if t.ndim < len(shape) or tuple(t.shape[t.ndim - len(shape) :]) != tuple(shape):
            raise ValueError(
                f"{geometry.name} {what}: expected trailing shapes {list(shapes)}, got "
                f"{[tuple(p.shape) for p in x]}"
            )
        b = tuple(t.shape[: t.ndim - len(shape)])
        if batch is not None and b != batch:
            raise ValueError(
                f"{geometry.name} {what}: the factors' batch shapes differ: "
                f"{[tuple(p.shape) for p in x]}"
            )
        batch = b
    if len({t.dtype for t in x}) > 1:
        raise TypeError(
            f"{geometry.name} {what}: factors of different dtypes {[t.dtype for t in x]}"
        )


class Draw:
    """float64 random draws of a batch shape: ``normal(*s)`` Gaussian, ``uniform(*s)`` on [0, 1),
    of shape (*batch, *s), from one generator in call order."""

    def __init__(self, generator: torch.Generator | None, batch: tuple[int, ...], device: Any):
        self.generator, self.batch, self.device = generator, batch, device

    def normal(self, *shape: int) -> Tensor:
        return torch.randn(
            (*self.batch, *shape), generator=self.generator, dtype=torch.float64, device=self.device
        )

    def uniform(self, *shape: int) -> Tensor:
        return torch.rand(
            (*self.batch, *shape), generator=self.generator, dtype=torch.float64, device=self.device
        )


def finite_or_raise(what: str, x: Parts) -> None:
    """Raise ValueError with the count of NaN/inf entries, if any."""
    bad = int(sum((~torch.isfinite(t)).sum() for t in x))
    if bad:
        raise ValueError(f"{what}: {bad} non-finite entries (NaN or inf)")


def default_atol(dtype: torch.dtype) -> float:
    """sqrt(ε) of the dtype (1.5e-8 for float64, as the reference; 3.5e-4 for float32)."""
    return math.sqrt(torch.finfo(dtype).eps)


# -- the base class -------------------------------------------------------------------------------
class FactoredGeometry:
    """Base of the torch geometries whose points are tuples of batched tensors.

    Subclasses set ``name``, ``moment_groups`` (the reference's: which tangent parts form one
    frame), ``point_shapes``/``tangent_shapes`` (trailing shapes of the parts) and
    ``point_kinds``/``tangent_kinds`` ("row": stacked by the block variants from row factors,
    "col": from column factors, "core": one r×r per group), ``draw_point(draw)`` (the parts of
    random points from the float64 draws of ``Draw``), and implement the protocol of
    ``reference/geometry.py``. The defaults here: the Frobenius metric of all parts together
    (R1, P1, P2; R2 overrides ``inner`` and ``norm``).
    """

    name: str
    draw_point: Callable[[Draw], tuple]
    moment_groups: tuple[tuple[int, ...], ...]
    point_shapes: tuple[tuple[int, ...], ...]
    tangent_shapes: tuple[tuple[int, ...], ...]
    point_kinds: tuple[str, ...]
    tangent_kinds: tuple[str, ...]

    # -- points --------------------------------------------------------------------------------
    def random_point(
        self,
        generator: torch.Generator | None = None,
        batch_shape: Sequence[int] = (),
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> tuple:
        """A random point per element of the batch (``draw_point``), drawn and factorised in
        float64 as the reference, then cast to ``dtype``; its tensors are contiguous."""
        draw = Draw(generator, tuple(batch_shape), device)
        return tuple(t.to(dtype).contiguous() for t in self.draw_point(draw))

    # -- metric --------------------------------------------------------------------------------
    def inner(self, x: Parts, u: Parts, v: Parts) -> Tensor:
        """Σ_i tr(u_iᵀ v_i) over the parts, per point."""
        return sum(torch.sum(a * b, dim=(-2, -1)) for a, b in zip(u, v, strict=True))

    def norm(self, x: Parts, u: Parts) -> Tensor:
        """The metric norm per point, free of overflow and underflow (``linalg.norm_of_parts``)."""
        return linalg.norm_of_parts(list(u))

    def scaled_norm(self, fn: Callable[[Parts], Tensor], u: Parts) -> Tensor:
        """fn(u) for a norm fn homogeneous of degree 1, computed unscaled where that is safe and
        as s·fn(u/s), s = max|u| over the parts, where the unscaled value is zero, tiny, inf or
        NaN (reference ``optim_transforms._metric_norm``). One host synchronisation (deferred
        while a step speculates, ``torch_port.deferred``)."""
        n = fn(u)
        bad = linalg._needs_scaling(linalg._norm_dtype(n))
        if deferred.fast(~bad.any()):
            return n
        s = torch.stack([linalg.max_abs(p) for p in u]).amax(dim=0)
        odd = (s == 0) | ~torch.isfinite(s)
        safe = torch.where(odd, torch.ones_like(s), s)[..., None, None]
        scaled = torch.where(odd, s, s * fn(tuple(p / safe for p in u)))
        return torch.where(bad, scaled, n)

    def random_tangent(self, x: Parts, generator: torch.Generator | None = None) -> tuple:
        """proj(x, Z) for a Gaussian factor-space Z, scaled to unit norm per point."""
        z = tuple(
            torch.randn(p.shape, generator=generator, dtype=p.dtype, device=p.device) for p in x
        )
        t = self.proj(x, z)
        n = self.norm(x, t)
        return tuple(p / n[..., None, None] for p in t)

    def to_matrix(self, x: Parts) -> Tensor:
        """W = A Bᵀ per point (checks only: forms m×n matrices)."""
        a, b = self.pair(x)
        return a @ linalg.transpose(b)

    def egrad_from_matrix(self, x: Parts, g: Tensor) -> tuple:
        """The factor gradient of F(A Bᵀ) for G = ∇F (checks only: takes m×n matrices)."""
        a, b = self.pair(x)
        return self.egrad_from_pair(x, (g @ b, linalg.transpose(g) @ a))

    def check_orthonormal(self, x: Parts, factors: dict[str, Tensor], atol) -> None:
        """Raise ValueError when a factor's ‖FᵀF − I‖ exceeds atol (default sqrt(ε) of its
        dtype) in some point of the batch, with the worst residual."""
        for label, f in factors.items():
            tol = default_atol(f.dtype) if atol is None else float(atol)
            res = linalg.orthonormality_residual(f)
            if bool((res > tol).any()):
                raise ValueError(
                    f"{self.name}: factor {label} is not orthonormal: ‖{label}ᵀ{label} − I‖ = "
                    f"{float(res.max()):.3e} > {tol:.1e} (worst of {res.numel()} points)"
                )

    # -- per-frame operations (the optimizers) --------------------------------------------------
    @property
    def frame_shape(self) -> tuple[int, ...]:
        """Trailing shape of per-frame scalars: () for one frame per point, (k,) for k."""
        k = len(self.moment_groups)
        return () if k == 1 else (k,)

    def frame_norms(self, x: Parts, u: Parts) -> Tensor:
        """The metric norm of each frame of u (reference ``optim_transforms._frame_norms``): the
        geometry's norm when the point is one frame, else the Frobenius norm of each frame's
        parts; shape (..., *frame_shape)."""
        if len(self.moment_groups) == 1:
            return self.norm(x, u)
        return torch.stack(
            [linalg.norm_of_parts([u[i] for i in g]) for g in self.moment_groups], dim=-1
        )

    def frame_sizes(self) -> tuple[int, ...]:
        """Number of entries of each frame of a tangent vector (reference ``_frame_sizes``)."""
        return tuple(sum(math.prod(self.tangent_shapes[i]) for i in g) for g in self.moment_groups)

    def scale_frames(self, u: Parts, c: Tensor) -> tuple:
        """Multiply the parts of each frame by that frame's scalar, c of shape
        (..., *frame_shape)."""
        if len(self.moment_groups) == 1:
            return tuple(p * c.to(p.dtype)[..., None, None] for p in u)
        owner = {i: k for k, g in enumerate(self.moment_groups) for i in g}
        return tuple(p * c[..., owner[i]].to(p.dtype)[..., None, None] for i, p in enumerate(u))

    def retract_scaled(self, x: Parts, u: Parts, c: Tensor) -> tuple:
        """retract(x, scale_frames(u, c)): the step ξ = c·u frame by frame (an optimizer hook that
        a geometry may fuse)."""
        return self.retract(x, self.scale_frames(u, c))

    # -- the optimizers' view (``PointGeometry``) ------------------------------------------------
    rgrad_is_fresh = False  # e.g. R1's rgrad returns the gradient's S part itself
    retraction_checks_finite = False

    def frame_batch(self, x: Parts) -> tuple[int, ...]:
        """The shape (..., *frame_shape) of x's per-frame scalars."""
        return (*x[0].shape[:-2], *self.frame_shape)

    def transport_owned(self, x: Parts, y: Parts, u: Parts) -> tuple:
        return self.transport(x, y, u)

    def from_params(self, params: Parts) -> tuple:
        return tuple(params)

    def to_params(self, x: Parts) -> tuple:
        return tuple(x)


class Ambient:
    """The ambient Euclidean space of a point geometry's points, with the same frames.

    Points are the geometry's; tangent vectors are any tensors of the point's layout (the
    gradient itself: ``egrad_to_rgrad`` and ``proj_tangent`` are the identity, ``transport`` too);
    the metric is the Frobenius one, frame by frame; ``retract_scaled`` is the geometry's own
    (e.g. polar(W + c·u) for Stiefel). The view of an optimizer group with
    ``gradient="euclidean"`` (arms E and H of the step-rule ablation): a rule that never projects,
    followed by the manifold's retraction. Mirrors ``reference.euclidean.Ambient``."""

    rgrad_is_fresh = False  # the gradient itself: never overwritten
    retraction_checks_finite = False

    def __init__(self, geometry: PointGeometry):
        self.geometry = geometry
        self.name = geometry.name
        self.moment_groups = geometry.moment_groups
        self.frame_shape = geometry.frame_shape
        self.orthonormal_factors = geometry.orthonormal_factors
        self.retraction_checks_finite = geometry.retraction_checks_finite

    def __repr__(self) -> str:
        return f"Ambient({self.geometry!r})"

    def frame_batch(self, x: Parts) -> tuple[int, ...]:
        return self.geometry.frame_batch(x)

    def frame_norms(self, x: Parts, u: Parts) -> Tensor:
        """The Frobenius norm of each frame of u (shape (..., *frame_shape))."""
        if len(self.moment_groups) == 1:
            return linalg.norm_of_parts(list(u))
        return torch.stack(
            [linalg.norm_of_parts([u[i] for i in g]) for g in self.moment_groups], dim=-1
        )

    def frame_sizes(self) -> tuple[int, ...]:
        return self.geometry.frame_sizes()

    def scale_frames(self, u: Parts, c: Tensor) -> tuple:
        return self.geometry.scale_frames(u, c)

    def zero_tangent(self, x: Parts) -> tuple:
        return tuple(torch.zeros_like(p, memory_format=torch.contiguous_format) for p in x)

    def egrad_to_rgrad(self, x: Parts, g: Parts) -> tuple:
        return tuple(g)

    def proj_tangent(self, x: Parts, u: Parts) -> tuple:
        return tuple(u)

    def transport(self, x: Parts, y: Parts, u: Parts) -> tuple:
        return tuple(u)

    transport_owned = transport

    def retract(self, x: Parts, u: Parts) -> tuple:
        return self.geometry.retract(x, u)

    def retract_scaled(self, x: Parts, u: Parts, c: Tensor) -> tuple:
        return self.geometry.retract_scaled(x, u, c)

    def check_point(self, x: Parts, atol: float | None = None) -> None:
        self.geometry.check_point(x, atol)

    def from_params(self, params: Parts) -> tuple:
        return self.geometry.from_params(params)

    def to_params(self, x: Parts) -> tuple:
        return self.geometry.to_params(x)
