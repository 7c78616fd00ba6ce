"""The transformations of ``reference.optim`` (DESIGN §5) and the per-frame helpers they share.

A transformation has three pure functions over tangent vectors (``Transform``); ``chain``
composes them. Second moments and trust regions act per *frame*: the parts of a tangent vector
listed together in ``geometry.moment_groups`` (one Stiefel matrix, one factor of a pair, ...).

``reference.optim`` imports the transformations back and its presets look them up there, so a
control that substitutes a transformation does so in ``reference.optim``; one that substitutes a
per-frame helper (``_frame_rms``, ``_ratio_scaler``) does so here, where the transformations
look it up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from reference import optim_checks as checks
from reference.geometry import Geometry, Point, Tangent, like, parts, tree_map
from reference.linalg import frobenius
from reference.product import Product

MOMENTS = ("frame", "elementwise")
REDUCTIONS = ("mean", "sum")


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
