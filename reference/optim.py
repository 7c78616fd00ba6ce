"""Riemannian update rules as chains of small transformations (DESIGN §5).

A transformation has three pure functions over tangent vectors:

    init(geometry, x) -> state
    update(geometry, x, g, state) -> (u, state)        g, u tangent at x
    transport(geometry, x, y, state) -> state          move stored tangent state from x to y

``chain`` composes them; an ``Optimizer`` turns a Euclidean (factor) gradient into the Riemannian
gradient, runs the chain, retracts, and transports the chain's state to the new point. States are
immutable tuples, so a step that raises leaves the caller's state untouched.

Second moments and trust regions act per *frame*: the parts of a tangent vector listed together in
``geometry.moment_groups`` (one Stiefel matrix, one factor of a pair, ...).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from reference import optim_checks as checks
from reference.euclidean import Ambient, Euclidean
from reference.geometry import (
    Geometry,
    Point,
    Tangent,
    check_finite,
    check_shapes,
    like,
    parts,
    same_structure,
    tree_map,
)
from reference.linalg import frobenius
from reference.product import Product

MOMENTS = ("frame", "elementwise")
REDUCTIONS = ("mean", "sum")
DECAY_MODES = ("coupled", "after", "fused")
GRADIENTS = ("riemannian", "euclidean")


class FrameDecayWarning(UserWarning):
    """Weight decay was requested on a geometry whose points are frames (see RA-5)."""


class Transform(NamedTuple):
    init: Callable[[Geometry, Point], Any]
    update: Callable[[Geometry, Point, Tangent, Any], tuple[Tangent, Any]]
    transport: Callable[[Geometry, Point, Point, Any], Any]


def _stateless(update: Callable[[Geometry, Point, Tangent], Tangent]) -> Transform:
    return Transform(
        init=lambda geometry, x: (),
        update=lambda geometry, x, g, state: (update(geometry, x, g), state),
        transport=lambda geometry, x, y, state: state,
    )


# -- per-frame helpers -------------------------------------------------------------------------
def _groups(geometry: Geometry, u: Tangent) -> list[list[np.ndarray]]:
    ps = parts(u)
    return [[ps[i] for i in group] for group in geometry.moment_groups]


def _map_groups(geometry: Geometry, u: Tangent, fs: list[Callable[[np.ndarray], Any]]) -> Tangent:
    """Apply to the parts of each frame that frame's function."""
    out = list(parts(u))
    for group, f in zip(geometry.moment_groups, fs, strict=True):
        for i in group:
            out[i] = f(out[i])
    return like(u, out)


def _ratio_scaler(num: float, den: float) -> Callable[[np.ndarray], np.ndarray]:
    """p ↦ p·(num/den), with 0/0 := 0 (a zero gradient gives a zero step).

    Where num/den overflows (den < num/max-float: √v̂ or RMS(g) of a subnormal gradient, ‖M‖ and
    c both subnormal), p ↦ (p/den)·num instead: the same value up to rounding, with p/den of the
    size of the step rather than 1/den's. Elsewhere the arithmetic is p·(num/den), unchanged."""
    with np.errstate(over="ignore"):
        q = _safe_ratio(num, den)
    if np.isfinite(q):
        return lambda p: p * q
    return lambda p: p / den * num


def _scale_groups(
    geometry: Geometry, u: Tangent, nums: list[float], dens: list[float] | None = None
) -> Tangent:
    """Multiply the parts of each frame by that frame's nums[k]/dens[k] (by nums[k] alone
    without ``dens``), through ``_ratio_scaler`` so no ratio overflows."""
    dens = [1.0] * len(nums) if dens is None else dens
    return _map_groups(geometry, u, [_ratio_scaler(n, d) for n, d in zip(nums, dens, strict=True)])


def _max_abs(u: Tangent) -> float:
    return max((float(np.max(np.abs(p))) for p in parts(u) if np.size(p)), default=0.0)


def _metric_norm(geometry: Geometry, x: Point, u: Tangent) -> float:
    """‖u‖_x in the geometry's metric, as s·‖u/s‖_x with s = max|u| (no overflow/underflow)."""
    s = _max_abs(u)
    return 0.0 if s == 0.0 else s * geometry.norm(x, tree_map(lambda p: p / s, u))


def _frame_norms(geometry: Geometry, x: Point, u: Tangent) -> list[float]:
    """The norm of each frame of u in the metric, so every scalar the rules compute from a
    frame (moment, cap, normalisation) is independent of how the point is represented (e.g.
    of the GL(r) representative of a quotient point). Frames of a product are its factors'
    frames; several frames of one plain geometry (a Stiefel pair) carry the Frobenius norm."""
    if len(geometry.moment_groups) == 1:
        return [_metric_norm(geometry, x, u)]
    if isinstance(geometry, Product):
        return [
            n
            for f, xi, ui in zip(geometry.factors, x, u, strict=True)
            for n in _frame_norms(f, xi, ui)
        ]
    return [frobenius(np.concatenate([np.ravel(p) for p in gs])) for gs in _groups(geometry, u)]


def _frame_sizes(geometry: Geometry, u: Tangent) -> list[int]:
    return [sum(np.size(p) for p in gs) for gs in _groups(geometry, u)]


def _frame_rms(geometry: Geometry, x: Point, u: Tangent) -> list[float]:
    """RMS(g) = ‖g‖/sqrt(entries) per frame, as s·RMS(g/s) with s = max|g| over the point:
    finite for every finite g (‖g‖ itself may exceed the largest float64). Where a nonzero
    frame's own max|g_k| is below s·2^-1022 (frames of very different scales), g_k/s would be
    subnormal or zero and lose its digits, so then each frame is divided by its own s_k = max|g_k|
    instead."""
    maxes = [_max_abs(tuple(gs)) for gs in _groups(geometry, u)]
    s = max(maxes, default=0.0)
    if s == 0.0:
        return [0.0] * len(maxes)
    if all(mk == 0.0 or mk / s >= np.finfo(np.float64).tiny for mk in maxes):
        scales = [s] * len(maxes)
    else:
        scales = [mk if mk > 0.0 else 1.0 for mk in maxes]
    v = _map_groups(geometry, u, [lambda p, sk=sk: p / sk for sk in scales])
    norms = _frame_norms(geometry, x, v)
    sizes = _frame_sizes(geometry, u)
    return [sk * (n / np.sqrt(k)) for sk, n, k in zip(scales, norms, sizes, strict=True)]


def _safe_ratio(num: float, den: float) -> float:
    """num/den with 0/0 := 0 (a zero gradient gives a zero step)."""
    return 0.0 if den == 0.0 else num / den


# -- transformations ---------------------------------------------------------------------------
class AdamState(NamedTuple):
    count: int
    m: Tangent  # first moment, a tangent vector at the current point
    sqrt_v: tuple  # √v: one float per frame ("frame") or one array per part ("elementwise")


def scale_by_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    moment: str = "frame",
    reduction: str = "mean",
) -> Transform:
    """Adam direction m̂/(√v̂ + ε) with a scalar second moment per frame.

    m ← β1·T(m) + (1 − β1)·g;  √v ← hypot(√β2·√v, √(1 − β2)·√s(g));
    s(g) = ‖g‖²/(entries) ("mean") or ‖g‖² ("sum");  m̂ = m/(1 − β1^t), √v̂ = √v/sqrt(1 − β2^t).

    √v is stored instead of v and √s(g) is computed scaled, so no gradient scale representable in
    float64 overflows or underflows it. A zero gradient gives a zero direction (0/0 := 0).
    ``moment="elementwise"`` keeps one √v per entry and projects the result back to the tangent
    space: the ablation arm that breaks O(d)-equivariance and steepest descent.
    """
    if moment not in MOMENTS:
        raise ValueError(f"unknown moment {moment!r}; choose one of {MOMENTS}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose one of {REDUCTIONS}")
    checks.beta("beta1", b1)
    checks.beta("beta2", b2)
    checks.nonnegative("eps", eps)
    root = _frame_rms if reduction == "mean" else _frame_norms
    rb2, r1mb2 = np.sqrt(b2), np.sqrt(1.0 - b2)

    def init(geometry: Geometry, x: Point) -> AdamState:
        zero = geometry.zero_tangent(x)
        if moment == "frame":
            sqrt_v: tuple = tuple(0.0 for _ in geometry.moment_groups)
        else:
            sqrt_v = tuple(np.zeros_like(p) for p in parts(zero))
        return AdamState(0, zero, sqrt_v)

    def update(geometry: Geometry, x: Point, g: Tangent, state: AdamState):
        t = state.count + 1
        m = tree_map(lambda mi, gi: b1 * mi + (1.0 - b1) * gi, state.m, g)
        c1, c2 = 1.0 - b1**t, np.sqrt(1.0 - b2**t)
        if moment == "frame":
            sqrt_v = tuple(
                float(np.hypot(rb2 * sv, r1mb2 * rg))
                for sv, rg in zip(state.sqrt_v, root(geometry, x, g), strict=True)
            )
            dens = [sv / c2 + eps for sv in sqrt_v]
            direction = _scale_groups(geometry, m, [1.0 / c1] * len(dens), dens)
        else:
            sqrt_v = tuple(
                np.hypot(rb2 * sv, r1mb2 * np.abs(gi))
                for sv, gi in zip(state.sqrt_v, parts(g), strict=True)
            )
            ratios = [
                np.divide(mi / c1, sv / c2 + eps, out=np.zeros_like(mi), where=(sv / c2 + eps) > 0)
                for mi, sv in zip(parts(m), sqrt_v, strict=True)
            ]
            direction = geometry.proj_tangent(x, like(m, ratios))
        return direction, AdamState(t, m, sqrt_v)

    def transport(geometry: Geometry, x: Point, y: Point, state: AdamState) -> AdamState:
        return state._replace(m=geometry.transport(x, y, state.m))

    return Transform(init, update, transport)


class TraceState(NamedTuple):
    m: Tangent


def trace(beta: float) -> Transform:
    """Damped momentum M ← β·T(M) + (1 − β)·g."""
    checks.beta("beta", beta)

    def update(geometry: Geometry, x: Point, g: Tangent, state: TraceState):
        m = tree_map(lambda mi, gi: beta * mi + (1.0 - beta) * gi, state.m, g)
        return m, TraceState(m)

    return Transform(
        init=lambda geometry, x: TraceState(geometry.zero_tangent(x)),
        update=update,
        transport=lambda geometry, x, y, s: TraceState(geometry.transport(x, y, s.m)),
    )


def scale(factor: float) -> Transform:
    """u ↦ factor·u."""
    checks.hyper("factor", factor, np.isfinite, "be a finite number")
    return _stateless(lambda geometry, x, u: tree_map(lambda p: factor * p, u))


def trust_region(radius: float) -> Transform:
    """Per frame, ξ ← ξ·min(1, Δ/‖ξ‖) with min(1, Δ/0) := 1."""
    checks.positive("trust_radius", radius, "be > 0 and finite")

    def update(geometry: Geometry, x: Point, u: Tangent) -> Tangent:
        # Δ/‖ξ‖ may overflow to inf for a subnormal ‖ξ‖ (then min(1, inf) = 1, as it should).
        with np.errstate(over="ignore"):
            caps = [min(1.0, radius / n) if n > 0 else 1.0 for n in _frame_norms(geometry, x, u)]
        return _scale_groups(geometry, u, caps)

    return _stateless(update)


def normalize_by_max(c: float) -> Transform:
    """Per frame, M ↦ M / max(‖M‖, c): a step of length min(1, ‖M‖/c)."""
    checks.positive("c", c)

    def update(geometry: Geometry, x: Point, u: Tangent) -> Tangent:
        dens = [max(n, c) for n in _frame_norms(geometry, x, u)]
        return _scale_groups(geometry, u, [1.0] * len(dens), dens)

    return _stateless(update)


def normalize_by_rms() -> Transform:
    """Per frame, g ↦ g / RMS(g), with 0/0 := 0."""

    def update(geometry: Geometry, x: Point, u: Tangent) -> Tangent:
        dens = _frame_rms(geometry, x, u)
        return _scale_groups(geometry, u, [1.0] * len(dens), dens)

    return _stateless(update)


def add_decayed_weights(weight_decay: float) -> Transform:
    """u ↦ u + λ·x on plain arrays (decoupled decay once scaled by −lr)."""
    checks.nonnegative("weight_decay", weight_decay)
    return _stateless(lambda geometry, x, u: tree_map(lambda ui, xi: ui + weight_decay * xi, u, x))


def chain(*transforms: Transform) -> Transform:
    """Apply the transformations in order; the state is the tuple of their states."""

    def init(geometry: Geometry, x: Point) -> tuple:
        return tuple(t.init(geometry, x) for t in transforms)

    def update(geometry: Geometry, x: Point, g: Tangent, state: tuple):
        new_state = []
        for t, s in zip(transforms, state, strict=True):
            g, s = t.update(geometry, x, g, s)
            new_state.append(s)
        return g, tuple(new_state)

    def transport(geometry: Geometry, x: Point, y: Point, state: tuple) -> tuple:
        return tuple(t.transport(geometry, x, y, s) for t, s in zip(transforms, state, strict=True))

    return Transform(init, update, transport)


# -- the optimizer -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Optimizer:
    """A chain of transformations applied to the Riemannian gradient, then a retraction.

    ``weight_decay`` (λ) acts as ``decay`` says: "coupled" adds λ·x to the Euclidean gradient,
    "after" scales the retracted point by (1 − lr·λ) (and re-projects a frame, which undoes it),
    "fused" retracts from (1 − lr·λ)·x, i.e. returns the nearest point to (1 − lr·λ)x + ξ. On
    frames (geometries with a ``project_point``) none of them shrinks anything (RA-5), so asking
    for decay there raises a ``FrameDecayWarning``.

    ``gradient="euclidean"`` runs the chain on the Euclidean gradient in the ambient space of
    the points (``euclidean.Ambient``: no projection, no transport, the Frobenius metric per
    frame) and retracts with the geometry's retraction; e.g. on St(d, r) with the polar
    retraction, W ← polar(W + ξ) for a step ξ that was never projected (ablation arms E, H).
    """

    transform: Transform
    lr: float
    weight_decay: float = 0.0
    decay: str = "coupled"
    gradient: str = "riemannian"

    def __post_init__(self) -> None:
        checks.check_lr(self.lr)
        if self.decay not in DECAY_MODES:
            raise ValueError(f"unknown decay mode {self.decay!r}; choose one of {DECAY_MODES}")
        if self.gradient not in GRADIENTS:
            raise ValueError(f"unknown gradient {self.gradient!r}; choose one of {GRADIENTS}")
        checks.nonnegative("weight_decay", self.weight_decay)
        if self.decay == "fused" and self.lr * self.weight_decay >= 1.0:
            raise ValueError(f"fused decay needs lr·λ < 1, got {self.lr * self.weight_decay}")

    def view(self, geometry: Geometry) -> Geometry:
        """The geometry the chain sees: the geometry, or its ambient space for
        ``gradient="euclidean"``."""
        return Ambient(geometry) if self.gradient == "euclidean" else geometry

    def init(self, geometry: Geometry, x: Point) -> Any:
        """Validate the starting point (and the decay mode for this geometry); initial state."""
        geometry.check_point(x)
        if self.weight_decay > 0.0 and self.decay != "coupled":
            _check_decay_mode(self.decay, geometry)
        if self.weight_decay > 0.0 and hasattr(geometry, "project_point"):
            warnings.warn(_DECAY_MESSAGES[self.decay], FrameDecayWarning, stacklevel=2)
        return self.transform.init(self.view(geometry), x)

    def update(self, geometry: Geometry, x: Point, egrad: Tangent, state: Any):
        """The tangent step ξ at x and the chain's new state (before transport).

        First checks the point (``check_point``), the gradient (real, finite, of the point's
        shapes and structure) and the state (``check_state``: the layout ``init`` makes at x)."""
        geometry.check_point(x)
        check_shapes("gradient", [np.shape(p) for p in parts(x)], egrad)
        if not same_structure(x, egrad):
            raise ValueError("gradient: its tuple structure differs from the point's")
        check_finite("gradient", egrad)
        view = self.view(geometry)
        checks.check_state(self.transform.init(view, x), state)
        if self.weight_decay > 0.0 and self.decay == "coupled":
            egrad = tree_map(lambda gi, xi: gi + self.weight_decay * xi, egrad, x)
        return self.transform.update(view, x, view.egrad_to_rgrad(x, egrad), state)

    def step(self, geometry: Geometry, x: Point, egrad: Tangent, state: Any):
        """One update from a Euclidean (factor) gradient: returns (new point, new state).

        Raises ValueError or TypeError (and returns nothing, so the caller's state stays as it
        was) when the point, the gradient or the state is bad (see ``update``), or when the step
        ξ or the point it leads to is not finite."""
        xi, new_state = self.update(geometry, x, egrad, state)
        check_finite("the step ξ (e.g. lr·g overflowed)", xi)
        y = self.move(geometry, x, xi)
        check_finite("the point after this step", y)
        return y, self.transform.transport(self.view(geometry), x, y, new_state)

    def move(self, geometry: Geometry, x: Point, xi: Tangent) -> Point:
        """Retract along ξ, with decay applied as ``decay`` says."""
        shrink = 1.0 - self.lr * self.weight_decay
        if self.weight_decay == 0.0 or self.decay == "coupled":
            return geometry.retract(x, xi)
        nearest = getattr(geometry, "project_point", lambda y: y)  # plain arrays stay as they are
        if self.decay == "after":
            return nearest(tree_map(lambda p: shrink * p, geometry.retract(x, xi)))
        return nearest(tree_map(lambda p, u: shrink * p + u, x, xi))


def _check_decay_mode(decay: str, geometry: Geometry) -> None:
    """ "after" and "fused" scale the stored point, which means decay only for plain arrays and
    frames (points whose factors are orthonormal); "fused" also adds ξ to the point, so tangent
    vectors must live in the point's space (not the ``embedded`` layouts of R1/P1)."""
    plain = isinstance(geometry, Euclidean) or (
        isinstance(geometry, Product) and all(isinstance(f, Euclidean) for f in geometry.factors)
    )
    frames = hasattr(geometry, "project_point")
    if not (plain or frames) or (decay == "fused" and getattr(geometry, "embedded", False)):
        raise ValueError(
            f"decay={decay!r} is not defined on {geometry!r}: scaling its stored factors is not "
            "scaling W; use decay='coupled' (decay of the factors through the gradient)"
        )


_DECAY_MESSAGES = {
    "coupled": "weight decay on frames does nothing: the Riemannian gradient of (λ/2)‖W‖² is "
    "P_W(λW) = 0 on St(d, r) (RA-5)",
    "after": "weight decay on frames applied after the retraction is undone by the re-projection "
    "onto the manifold: polar(cW) = W for c > 0 (RA-5)",
    "fused": "weight decay on frames fused before the retraction does not shrink them: "
    "polar((1 − lr·λ)W + ξ) = polar(W + ξ/(1 − lr·λ)) only inflates the step (RA-5)",
}


# -- presets ---------------------------------------------------------------------------------
def riemannian_adam_chain(
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    trust_radius: float | None = None,
    moment: str = "frame",
    reduction: str = "mean",
) -> Transform:
    """ξ = −lr·m̂/(√v̂ + ε), capped at ‖ξ‖ ≤ Δ per frame when a trust radius Δ is given."""
    b1, b2 = checks.two_betas(betas)
    steps = [scale_by_adam(b1, b2, eps, moment, reduction), scale(-lr)]
    if trust_radius is not None:
        steps.append(trust_region(trust_radius))
    return chain(*steps)


def riemannian_momentum_chain(lr: float, beta: float = 0.9, c: float = 1.0) -> Transform:
    """M ← β·T(M) + (1 − β)·g, ξ = −lr·M/max(‖M‖, c)."""
    return chain(trace(beta), normalize_by_max(c), scale(-lr))


def rsgd_chain(lr: float, trust_radius: float | None = None) -> Transform:
    """ξ = −lr·g, capped at ‖ξ‖ ≤ Δ per frame when a trust radius Δ is given."""
    steps = [scale(-lr)] + ([trust_region(trust_radius)] if trust_radius is not None else [])
    return chain(*steps)


def normalized_rsgd_chain(lr: float) -> Transform:
    """ξ = −lr·g/RMS(g) per frame."""
    return chain(normalize_by_rms(), scale(-lr))


#: The four presets of DESIGN §5 as chains of their hyperparameters (the names of the presets'
#: arguments, which are torch's): the presets below, the audit's replay of a recorded group and
#: the rules ``rattn conform`` names are all built from this table.
PRESET_CHAINS: dict[str, Callable[..., Transform]] = {
    "riemannian_adam": riemannian_adam_chain,
    "riemannian_momentum": riemannian_momentum_chain,
    "rsgd": rsgd_chain,
    "normalized_rsgd": normalized_rsgd_chain,
}


def riemannian_adam(
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    trust_radius: float | None = None,
    moment: str = "frame",
    reduction: str = "mean",
    weight_decay: float = 0.0,
    decay: str = "coupled",
) -> Optimizer:
    """Riemannian Adam of Stiefel attention: ξ = −lr·m̂/(√v̂ + ε), capped at ‖ξ‖ ≤ Δ per frame."""
    checks.check_lr(lr)
    adam = riemannian_adam_chain(lr, betas, eps, trust_radius, moment, reduction)
    return Optimizer(adam, lr, weight_decay, decay)


def riemannian_momentum(lr: float, beta: float = 0.9, c: float = 1.0) -> Optimizer:
    """The low-rank template: M ← β·T(M) + (1 − β)·g, ξ = −lr·M/max(‖M‖, c)."""
    checks.check_lr(lr)
    return Optimizer(riemannian_momentum_chain(lr, beta, c), lr)


def rsgd(lr: float, trust_radius: float | None = None) -> Optimizer:
    """Fixed-step Riemannian gradient descent ξ = −lr·g (degree one in the gradient)."""
    checks.check_lr(lr)
    return Optimizer(rsgd_chain(lr, trust_radius), lr)


def normalized_rsgd(lr: float) -> Optimizer:
    """ξ = −lr·g/RMS(g) per frame (degree zero in the gradient)."""
    checks.check_lr(lr)
    return Optimizer(normalized_rsgd_chain(lr), lr)


@dataclass(frozen=True)
class _EuclideanOptimizer(Optimizer):
    def init(self, geometry: Geometry, x: Point) -> Any:
        if not isinstance(geometry, Euclidean):
            raise TypeError(f"adamw acts on plain arrays (reference.Euclidean), got {geometry!r}")
        return super().init(geometry, x)


def adamw(
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
) -> Optimizer:
    """AdamW on plain arrays (torch's convention): x ← x − lr·(m̂/(√v̂ + ε) + λ·x), per entry."""
    checks.check_lr(lr)
    b1, b2 = checks.two_betas(betas)
    return _EuclideanOptimizer(
        chain(
            scale_by_adam(b1, b2, eps, moment="elementwise"),
            add_decayed_weights(weight_decay),
            scale(-lr),
        ),
        lr,
    )
