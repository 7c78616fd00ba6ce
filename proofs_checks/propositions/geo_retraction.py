"""GEO's retraction checks: R_x(0) = x and the order each retraction claims, measured by its
slopes, for a geometry, for every Stiefel retraction in each metric, and for every
retraction option a geometry is built with."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases
from proofs_checks import geometry_laws as law
from proofs_checks import rigorous
from proofs_checks.propositions.geo_points import SLOPE_POINTS, _exercised, _points
from proofs_checks.propositions.geo_variants import PLAIN, STIEFEL, Case, _broken
from proofs_checks.registry import Context, Outcome
from reference.linalg import frobenius


def check_retraction(case: Case) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """R_x(0) = x (within ``law_tolerance``); D(t) = R_x(tξ) − x − tξ has slope ≥ 1.9 (first
        order) and, where second order is claimed, the order-defining error has slope ≥ 2.9
        (``law.SLOPE_TOL``), or sits at the rounding floor (an exact model), along each of three
        random ξ (``law.retraction_slopes``: the smallest slopes). The order-defining error is
        the distance to the metric's own geodesic for St(d, r) (``law.metric_geodesic``, by
        formulas independent of the reference's), else the tangential part of D(t). For
        St(d, r) the reference's own geodesic (``Stiefel.geodesic``) is also measured, as a
        retraction claiming order 2 (a positive control: it must sit at the floor). Residual:
        the worst shortfall, tolerance 0. Control: a first-order retraction where second order
        is claimed; for a first-order St(d, r) (canonical metric) the same retraction claiming
        order 2; else a map that is not a retraction. At ``SLOPE_POINTS`` random points."""
        geo, xs = _points(case, ctx, SLOPE_POINTS)
        order = geo.retraction_order
        claims = [(geo, order, "")]
        if law.metric_geodesic(geo) is not None:
            own = law.patched(geo, retract=lambda self, x, u: self.geodesic(x, u))
            claims.append((own, 2, "its geodesic: "))
        if wrong:
            held = 2 if law.metric_geodesic(geo) is not None else order
            claims = [(_wrong_retraction(case, geo), held, "control: ")]
        worst, details = 0.0, []
        for g, claimed, label in claims:
            for i, x in enumerate(xs):
                shortfall, detail = _retraction_shortfall(g, x, claimed, ctx.seed)
                worst = max(worst, shortfall)
                details.append(f"{label}point {i}, claimed order {claimed}; {detail}")
                if worst > 0.0:  # one point short decides
                    break
        exercised = _exercised(geo, ctx, len(xs), tangents="3 random per point")
        return Outcome.bound(worst, 0.0, " | ".join(details), exercised)

    return run


def _wrong_retraction(case: Case, geo: Any) -> Any:
    """The control of ``check_retraction``: QR where second order is claimed; the geometry
    itself (then held to order 2) for a first-order St(d, r); else a map that is not a
    retraction."""
    if geo.retraction_order == 2:
        return case.make(retraction="qr")
    if law.metric_geodesic(geo) is not None:
        return geo
    return _broken(case, "retract", "not_a_retraction")


def _retraction_shortfall(geo: Any, x: Any, order: int, seed: int) -> tuple[float, str]:
    """How far the measured slopes fall short of a retraction of ``order`` (0: none short; inf
    when R_x(0) ≠ x beyond ``law_tolerance``)."""
    s1, s2, zero, detail = law.retraction_slopes(geo, x, seed)
    shortfall = max(0.0, 2.0 - law.SLOPE_TOL - s1) if s1 is not None else 0.0
    if order == 2:
        shortfall = max(shortfall, law.order_shortfall(s2, order))
    if zero > law.law_tolerance(geo, x):
        shortfall = np.inf
    return shortfall, detail


def _exp_with_plus_s(self, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Edelman–Arias–Smith's geodesic with +S where −S belongs: R(0) = x and first order hold,
    second order does not."""
    a, s = x.T @ u, u.T @ u
    block = np.block([[a, s], [np.eye(self.r), a]])
    return np.hstack([x, u]) @ ref.linalg.expm(block)[:, : self.r] @ ref.linalg.expm(-a)


#: The order of each Stiefel retraction against its metric's geodesics, by (retraction, r = 1)
#: at St(7, 3) and St(7, 1) (``reference.stiefel.retraction_order``): embedded metric: polar
#: and exp second order, QR first order for r ≥ 2 and the polar map itself for r = 1;
#: canonical metric: every retraction first order for 2 ≤ r < d (the polar map leaves the
#: canonical geodesic at O(t²)), all second order for r = 1, where the metrics coincide.
STIEFEL_ORDERS = {
    "embedded": {
        ("polar", False): 2,
        ("polar_svd", False): 2,
        ("qr", False): 1,
        ("exp", False): 2,
        ("qr", True): 2,
    },
    "canonical": {
        ("polar", False): 1,
        ("polar_svd", False): 1,
        ("qr", False): 1,
        ("exp", False): 1,
        ("polar", True): 2,
        ("qr", True): 2,
    },
}


def every_stiefel_retraction(metric: str) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """Each retraction of ``reference.stiefel.RETRACTIONS`` (polar, its SVD route,
        sign-fixed QR, the exponential map of the embedded metric) at St(7, 3), and QR (and,
        canonical, polar) at St(7, 1), in this metric: the geometry claims the order of
        ``STIEFEL_ORDERS`` (``retraction_order``), and R_x(0) = x and the slopes of that order
        against the metric's own geodesic hold, as in the retraction check; R_{−x}(0) = −x;
        and R_x(ξ) is on St(d, r) for a unit ξ (‖RᵀR − I‖ ≤ ``law_tolerance``: each map ends
        in an orthonormal factor or, for exp, a product of an orthonormal [W, ξ]-basis map and
        orthogonal exponentials). Residual: the worst shortfall, or inf for a wrong claim or a
        point off the manifold, tolerance 0. Control (embedded): the exponential map with +S
        in its block matrix (first order, but off the manifold at second order); (canonical):
        every retraction claims second order, the order it has in the embedded metric."""
        worst, details = 0.0, []
        for (name, single), order in STIEFEL_ORDERS[metric].items():
            shape = (STIEFEL[0], 1) if single else STIEFEL
            geo = ref.Stiefel(*shape, retraction=name, metric=metric)
            claimed = geo.retraction_order
            if wrong and metric == "embedded" and name == "exp":
                geo = law.patched(geo, exp=_exp_with_plus_s)
            if wrong and metric == "canonical":
                order = claimed = 2
            rng = np.random.default_rng(ctx.seed)
            x = geo.random_point(rng)
            shortfall, _ = _retraction_shortfall(geo, x, claimed, ctx.seed)
            off = geo.residual(geo.retract(x, geo.random_tangent(x, rng)))
            # R(0) = x at −x too: the Householder QR of x or of −x has a negative diagonal
            # entry (their signs are opposite), which only the sign fix undoes.
            zero = frobenius(geo.retract(-x, np.zeros_like(x)) + x)
            if max(off, zero) > law.law_tolerance(geo, x) or claimed != order:
                shortfall = np.inf
            worst = max(worst, shortfall)
            details.append(f"{name} {shape} (order {claimed}): {shortfall:.2f}, off {off:.1e}")
        retractions = [
            f"{name} at St{(STIEFEL[0], 1) if one else STIEFEL}"
            for name, one in STIEFEL_ORDERS[metric]
        ]
        exercised = {
            "sizes": f"St{STIEFEL}, St{(STIEFEL[0], 1)}",
            "options": ", ".join(retractions),
            "metrics": metric,
            "points": "1 random",
            "tangents": "3 random",
            "seeds": ctx.seed,
            "dtypes": "float64",
        }
        return Outcome.bound(worst, 0.0, "shortfalls: " + ", ".join(details), exercised)

    return run


def check_options(name: str) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """Each retraction the geometry is built with (``geometry_cases.OPTIONS``): R_x(0) = x,
        the slopes of the order it claims (``retraction_order``, as in the retraction check),
        and R_x(ξ) satisfies the constraints for a unit ξ (``law.constraints`` ≤
        ``law_tolerance``). Residual: the worst shortfall, inf for a point off the manifold,
        tolerance 0. Control: every retraction claims second order (the first-order QR then
        falls short)."""
        worst, details = 0.0, []
        for option in cases.OPTIONS[name]:
            geo = ref.GEOMETRIES[name](*PLAIN, **option)
            if wrong:
                geo = copy.copy(geo)
                geo.retraction_order = 2
            rng = np.random.default_rng(ctx.seed)
            x = geo.random_point(rng)
            xi = geo.random_tangent(x, rng)
            xi = law.times(1.0 / geo.norm(x, xi), xi)
            shortfall, _ = _retraction_shortfall(geo, x, geo.retraction_order, ctx.seed)
            off = law.constraints(geo, geo.retract(x, xi))
            if off > law.law_tolerance(geo, x):
                shortfall = np.inf
            worst = max(worst, shortfall)
            order = geo.retraction_order
            details.append(f"{option['retraction']} (order {order}): {shortfall:.2f}")
        options = ", ".join(o["retraction"] for o in cases.OPTIONS[name])
        exercised = _exercised(ref.GEOMETRIES[name](*PLAIN), ctx, 1, options=options)
        return Outcome.bound(worst, 0.0, "shortfalls: " + ", ".join(details), exercised)

    return run


def _retraction_control_text(geo: Any) -> str:
    if geo.retraction_order == 2:
        return "QR retraction (first order)"
    if law.metric_geodesic(geo) is not None:
        return "the same retraction claiming order 2"
    return "(A + ξ_A, B): not a retraction"


#: The sizes of the exponential map's enclosure: the law tests' St(7, 3) and a head's St(64, 16).
EXP_SIZES = (STIEFEL, (64, 16))


def exp_enclosure(ctx: Context, wrong: bool) -> Outcome:
    """The exponential map of the embedded metric (``Stiefel.exp``), rigorously: at each of
    ``EXP_SIZES``, for a random point and a random unit tangent, the float64 output Y as the
    reference computes it and the upper end of a ball enclosing ‖YᵀY − I‖_F for its entries
    (``rigorous.orthonormality_upper``, 256 bits), held to ``law.law_tolerance``, the float
    checks' bound. Residual: the largest ratio, tolerance 1. Control: the exponential map with
    +S in its block matrix (off the manifold at second order)."""
    worst, details = 0.0, []
    for shape in EXP_SIZES:
        geo = ref.Stiefel(*shape, retraction="exp")
        rng = np.random.default_rng(ctx.seed)
        x = geo.random_point(rng)
        xi = geo.random_tangent(x, rng)
        y = law.patched(geo, exp=_exp_with_plus_s).retract(x, xi) if wrong else geo.retract(x, xi)
        ratio = rigorous.orthonormality_upper(y) / law.law_tolerance(geo, x)
        worst = max(worst, ratio)
        details.append(f"St{shape}: {ratio:.3g}")
    return Outcome.bound(
        worst,
        1.0,
        "enclosed ‖YᵀY − I‖_F / law_tolerance: " + ", ".join(details),
        {
            "sizes": ", ".join(f"St{shape}" for shape in EXP_SIZES),
            "points": "1 random",
            "tangents": "1 random, unit norm",
            "dtypes": f"float64 outputs enclosed in Arb balls at {rigorous.PRECISION} bits",
            "seeds": ctx.seed,
        },
    )
