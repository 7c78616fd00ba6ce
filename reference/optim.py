"""Riemannian update rules as chains of small transformations (DESIGN §5).

A transformation has three pure functions over tangent vectors:

    init(geometry, x) -> state
    update(geometry, x, g, state) -> (u, state)        g, u tangent at x
    transport(geometry, x, y, state) -> state          move stored tangent state from x to y

``chain`` composes them; an ``Optimizer`` turns a Euclidean (factor) gradient into the Riemannian
gradient, runs the chain, retracts, and transports the chain's state to the new point. States are
immutable tuples, so a step that raises leaves the caller's state untouched.

Second moments and trust regions act per *frame*: the parts of a tangent vector listed together in
``geometry.moment_groups`` (one Stiefel matrix, one factor of a pair, ...). The transformations
and their per-frame helpers are in ``reference.optim_transforms``; this module imports them
back, and its presets look them up here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference import optim_checks as checks
from reference.euclidean import Ambient, Euclidean
from reference.geometry import (
    Geometry,
    Point,
    Tangent,
    check_finite,
    check_shapes,
    parts,
    same_structure,
    tree_map,
)
from reference.optim_transforms import (
    AdamState,
    TraceState,
    Transform,
    add_decayed_weights,
    chain,
    normalize_by_max,
    normalize_by_rms,
    scale,
    scale_by_adam,
    trace,
    trust_region,
)
from reference.product import Product

DECAY_MODES = ("coupled", "after", "fused")
GRADIENTS = ("riemannian", "euclidean")


class FrameDecayWarning(UserWarning):
    """Weight decay was requested on a geometry whose points are frames (see RA-5)."""


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


__all__ = [
    "DECAY_MODES",
    "GRADIENTS",
    "PRESET_CHAINS",
    "AdamState",
    "FrameDecayWarning",
    "Optimizer",
    "TraceState",
    "Transform",
    "adamw",
    "add_decayed_weights",
    "chain",
    "normalize_by_max",
    "normalize_by_rms",
    "normalized_rsgd",
    "normalized_rsgd_chain",
    "riemannian_adam",
    "riemannian_adam_chain",
    "riemannian_momentum",
    "riemannian_momentum_chain",
    "rsgd",
    "rsgd_chain",
    "scale",
    "scale_by_adam",
    "trace",
    "trust_region",
]
