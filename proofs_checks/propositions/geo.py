"""GEO-stiefel and GEO-<name> for the ten geometries: DESIGN §6's laws with negative controls."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases
from proofs_checks import geometry_laws as law
from proofs_checks.bounds import frame_error
from proofs_checks.harness import substituted
from proofs_checks.machine_checked import machine_check
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference.linalg import frobenius

#: Sizes: St(7, 3); plain (m, n, r) = (6, 5, 2); block variants (3, 4, 2) with two query heads
#: sharing one key head (stacked 6×4), so that the block variant differs from the plain one.
STIEFEL = (7, 3)
PLAIN = (6, 5, 2)
BLOCK = (3, 4, 2)
LONG_STEPS, QUICK_STEPS = 1000, 200


def _eye_minus(f: np.ndarray, z: np.ndarray) -> np.ndarray:
    return z - f @ (f.T @ z)


def _stiefel_proj(f: np.ndarray, z: np.ndarray) -> np.ndarray:
    return z - f @ ref.linalg.sym(f.T @ z)


def _canonical(f: np.ndarray, g: np.ndarray) -> np.ndarray:
    return g - f @ g.T @ f


# Each geometry's deliberately wrong variants, as replacement methods (self, …).
BROKEN: dict[str, dict[str, Callable]] = {
    "stiefel": {
        "proj": lambda self, x, z: _eye_minus(x, z),
        "egrad_to_rgrad": lambda self, x, g: _canonical(x, g),
        "retract": lambda self, x, u: x + u,
    },
    "fixed_rank_embedded": {
        "proj": lambda self, x, z: (np.zeros_like(z[1]), *type(self).proj(self, x, z)[1:]),
        "egrad_to_rgrad": lambda self, x, z: (z[1], _eye_minus(x[0], z[0]), _eye_minus(x[2], z[2])),
        "retract": lambda self, x, u: (
            x[0] + u[1] @ np.linalg.inv(x[1]),
            x[1] + u[0],
            x[2] + u[2] @ np.linalg.inv(x[1]).T,
        ),
    },
    "fixed_rank_quotient": {
        "proj": lambda self, x, z: z,
        "egrad_to_rgrad": lambda self, x, g: self.proj(x, g),
        "retract": lambda self, x, u: (
            x[0] + u[0],
            np.hstack([(x[1] + u[1])[:, :-1], np.zeros((x[1].shape[0], 1))]),
        ),
        "not_a_retraction": lambda self, x, u: (x[0] + u[0], x[1]),
        "inner": lambda self, x, a, b: float(np.vdot(a[0], b[0]) + np.vdot(a[1], b[1])),
    },
    "partial_isometry_embedded": {
        "proj": lambda self, x, z: (x[0].T @ z[0], _eye_minus(x[0], z[0]), _eye_minus(x[1], z[1])),
        "egrad_to_rgrad": lambda self, x, z: (
            x[0].T @ z[0] - z[0].T @ x[0],
            _eye_minus(x[0], z[0]),
            _eye_minus(x[1], z[1]),
        ),
        "retract": lambda self, x, u: (
            x[0] + u[1] + 0.5 * x[0] @ u[0],
            x[1] + u[2] - 0.5 * x[1] @ u[0],
        ),
    },
    "partial_isometry_quotient": {
        "proj": lambda self, x, z: (_stiefel_proj(x[0], z[0]), _stiefel_proj(x[1], z[1])),
        "egrad_to_rgrad": lambda self, x, g: (_canonical(x[0], g[0]), _canonical(x[1], g[1])),
        "retract": lambda self, x, u: (x[0] + u[0], x[1] + u[1]),
        "inner": lambda self, x, a, b: float(
            sum(np.vdot(p * np.arange(1, p.shape[1] + 1), q) for p, q in zip(a, b, strict=True))
        ),
    },
    "stiefel_pair": {
        "proj": lambda self, x, z: (_eye_minus(x[0], z[0]), _eye_minus(x[1], z[1])),
        "egrad_to_rgrad": lambda self, x, g: (_canonical(x[0], g[0]), _canonical(x[1], g[1])),
        "retract": lambda self, x, u: (x[0] + u[0], x[1] + u[1]),
    },
}

# The optional metrics are certified too, under their own ids; only their wrong gradients differ.
BROKEN["stiefel-canonical"] = {
    **BROKEN["stiefel"],
    "egrad_to_rgrad": lambda self, x, g: _stiefel_proj(x, g),
}
BROKEN["fixed_rank_quotient-balanced"] = BROKEN["fixed_rank_quotient"]
VARIANTS = {
    "stiefel-canonical": lambda **kw: ref.Stiefel(*STIEFEL, metric="canonical", **kw),
    "fixed_rank_quotient-balanced": lambda **kw: ref.GEOMETRIES["fixed_rank_quotient"](
        *PLAIN, metric="balanced", **kw
    ),
}

CONTROL_TEXT = {
    "stiefel": "P_W(Z) = Z − W WᵀZ (no sym)",
    "fixed_rank_embedded": "M dropped from the projection",
    "fixed_rank_quotient": "no horizontal correction (identity)",
    "partial_isometry_embedded": "Ω = UᵀZ_U (no skew)",
    "partial_isometry_quotient": "no vertical correction (Stiefel projections only)",
    "stiefel_pair": "P_U(Z) = Z − U UᵀZ (no sym)",
}
CONTROL_TEXT["stiefel-canonical"] = CONTROL_TEXT["stiefel"]
CONTROL_TEXT["fixed_rank_quotient-balanced"] = CONTROL_TEXT["fixed_rank_quotient"]
RGRAD_TEXT = {
    "stiefel": "the canonical-metric formula G − WGᵀW",
    "fixed_rank_embedded": "U_p, V_p without the S^{-ᵀ}, S^{-1} weights",
    "fixed_rank_quotient": "the metric forgotten (horizontal projection of G)",
    "partial_isometry_embedded": "Ω = UᵀG_U − G_UᵀU (skew without ½)",
    "partial_isometry_quotient": "the canonical-metric formula per factor",
    "stiefel_pair": "the canonical-metric formula per factor",
}
RGRAD_TEXT["stiefel-canonical"] = "the embedded-metric formula P_W(G)"
RGRAD_TEXT["fixed_rank_quotient-balanced"] = RGRAD_TEXT["fixed_rank_quotient"]
RENORM_TEXT = {
    "fixed_rank_quotient": "a step that loses a rank direction (last column of B zeroed)",
    "fixed_rank_quotient-balanced": "a step that loses a rank direction (last column of B zeroed)",
}


@dataclass(frozen=True)
class Case:
    name: str  # "stiefel" or a GEOMETRIES key
    make: Callable[..., Any]  # make(**kwargs) at the check sizes

    @property
    def base(self) -> str:
        return self.name.removeprefix("block_")


def _sizes(name: str) -> tuple[int, ...]:
    if name.split("-")[0] == "stiefel":
        return STIEFEL
    return BLOCK if name.startswith("block_") else PLAIN


def _case(name: str) -> Case:
    if name in VARIANTS:
        return Case(name, VARIANTS[name])
    if name == "stiefel":
        return Case(name, lambda **kw: ref.Stiefel(*STIEFEL, **kw))
    return Case(name, lambda **kw: ref.GEOMETRIES[name](*_sizes(name), **kw))


#: Random points each law is measured at, drawn one after another from the seed's generator
#: (the first is the point the seed alone gives); the slope tests (gradient, retraction), the
#: costly ones, at the first ``SLOPE_POINTS`` of them.
LAW_POINTS, SLOPE_POINTS = 8, 3


def _points(case: Case, ctx: Context, k: int = LAW_POINTS) -> tuple[Any, list[Any]]:
    geo = case.make()
    rng = np.random.default_rng(ctx.seed)
    return geo, [geo.random_point(rng) for _ in range(k)]


def _point(case: Case, ctx: Context) -> tuple[Any, Any]:
    geo, (x,) = _points(case, ctx, 1)
    return geo, x


def _exercised(geo: Any, ctx: Context, points: int, **more: object) -> dict[str, object]:
    """What a GEO check ran: the geometry instance (its sizes and options), how many random
    points, the seed, float64."""
    return {
        "instances": repr(geo),
        "points": f"{points} random",
        "seeds": ctx.seed,
        "dtypes": "float64",
        **more,
    }


def _at_every_point(
    geo: Any, xs: list[Any], ctx: Context, law_at: Callable[[Any], tuple[float, str]]
) -> Outcome:
    """A law measured at every point of ``xs``: residual max over x of res(x)/law_tolerance(x)
    (NaN if any is NaN), tolerance 1, with the worst point's detail."""
    measured = [law_at(x) for x in xs]
    ratios = np.array(
        [res / law.law_tolerance(geo, x) for (res, _), x in zip(measured, xs, strict=True)]
    )
    worst = int(np.argmax(np.where(np.isnan(ratios), np.inf, ratios)))
    return Outcome.bound(
        float(np.max(ratios)),
        1.0,
        f"worst of {len(xs)} random points (point {worst}): {measured[worst][1]}",
        _exercised(geo, ctx, len(xs)),
    )


def _broken(case: Case, method: str, key: str | None = None) -> Any:
    return law.patched(case.make(), **{method: BROKEN[case.base][key or method]})


def check_projector(case: Case) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """The projection is idempotent and self-adjoint in the metric, as a whole operator on
        the ambient space (factor space, or R^{m×n} when embedded); bound ``law_tolerance``.
        At ``LAW_POINTS`` random points. Control: an oblique projection P + P(C⊙(I − P))."""
        geo, xs = _points(case, ctx)
        return _at_every_point(geo, xs, ctx, lambda x: law.projector_law(geo, x, oblique=wrong))

    return run


def check_range(case: Case) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """Every projected vector satisfies the tangent space's own linear constraints and the
        projection has rank dim; bound ``law_tolerance``. Control: the projection without its
        sym/skew (or correction) term. At ``LAW_POINTS`` random points."""
        geo, xs = _points(case, ctx)
        if wrong:
            geo = _broken(case, "proj")
        return _at_every_point(geo, xs, ctx, lambda x: law.range_law(geo, x))

    return run


def check_gradient(case: Case) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """Taylor test of the Riemannian gradient of f = F∘to_matrix (F smooth and nonlinear):
        |f(R(tξ)) − f − t·g(grad f, ξ)| on t = 1e-8…1, slope of the best 10-point window above
        the rounding floor at least 1.9, along each of three unit tangents (two random, and the
        gradient's own direction: ``law.gradient_slope``): the remainder is (t²/2)·∂²f(ξ, ξ) +
        O(t³) when the gradient is right, so the slope is 2, or 3 along a ξ where the
        second-order term vanishes (seed 50 draws one for P2); a wrong gradient leaves a
        first-order term (slope 1) along any ξ not orthogonal to its error (a random ξ nearly
        was, at seed 121). At ``SLOPE_POINTS`` random points. Residual max(0, 2 − smallest
        slope), tolerance 0.1. Control: a wrong Riemannian gradient."""
        geo, xs = _points(case, ctx, SLOPE_POINTS)
        if wrong:
            geo = _broken(case, "egrad_to_rgrad")
        worst, details = 0.0, []
        for i, x in enumerate(xs):
            slope, detail = law.gradient_slope(geo, x, ctx.seed)  # None: no window above floor
            worst = max(worst, np.inf if slope is None else max(0.0, 2.0 - slope))
            details.append(f"point {i}: {detail}")
            if worst > 0.1:  # one point short decides
                break
        tangents = "3 unit tangents per point (2 random, the gradient's)"
        exercised = _exercised(geo, ctx, len(details), tangents=tangents)
        return Outcome.bound(worst, 0.1, " | ".join(details), exercised)

    return run


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


#: The scalings of the nearest-point check: exact powers of two, far from 1 both ways.
SCALES = (2.0**-600, 2.0**600)


def _rank_test_matrix(sigma_sq: float) -> np.ndarray:
    """A 7×3 matrix with max entry 1 and the exactly diagonal Gram diag(2, 1, σ²) (columns
    e_1 + e_4, e_2, σ·e_3; σ a power of two): its Gram and eigenvalues are computed exactly, so
    the rank test sees λ_min/λ_max = σ²/2 with no rounding."""
    a = np.zeros(STIEFEL)
    a[0, 0] = a[3, 0] = a[1, 1] = 1.0
    a[2, 2] = np.sqrt(sigma_sq)
    return a


def stiefel_nearest_point(ctx: Context, wrong: bool) -> Outcome:
    """``project_point`` (the polar factor) of St(7, 3), on what its docstring claims:

    - a stack of three matrices (W + 0.3·Gaussian, κ about 2 to 3) is factored slice by
      slice: each slice within 2κ·``frame_error``(7, 3, κ) of the SVD route's U Vᵀ of that
      slice (each route's forward error is at most κ × its orthonormality bound: the inverse
      square root of a Gram of condition κ² amplifies the Gram's relative error by ≤ κ²/2 and
      A adds κ);
    - polar(sA) = polar(A) bit for bit for s = 2^±600 (A is divided by its largest entry, an
      exact operation for a power-of-two s, before the Gram is formed, which would overflow or
      underflow otherwise);
    - the rank test refuses λ_min ≤ ε·λ_max·d and accepts above it: on exact Grams (see
      ``_rank_test_matrix``) with λ_max = 2, d = 7, σ² = 2^-49 (below 2·7ε = 3.1e-15) is
      refused and σ² = 2^-47 (7.1e-15) accepted.

    Residual: the worst stack deviation relative to its bound, plus the number of inexact
    scalings and wrong rank decisions, tolerance 1. Control: the polar factor without its
    prescaling (substituted into ``reference.linalg``)."""
    geo = ref.Stiefel(*STIEFEL)
    rng = np.random.default_rng([ctx.seed, 6])
    stack = np.stack([geo.random_point(rng) + 0.3 * rng.standard_normal(STIEFEL) for _ in range(3)])
    kappas = [float(np.linalg.cond(a)) for a in stack]
    original = ref.linalg.polar

    def unscaled(a):
        lam, q = np.linalg.eigh(ref.linalg.sym(ref.linalg.transpose(a) @ a))
        if np.any(lam[..., 0] <= np.finfo(np.float64).eps * lam[..., -1] * a.shape[-2]):
            raise ValueError("polar factor of a rank-deficient matrix")
        return a @ ((q / np.sqrt(lam)[..., None, :]) @ ref.linalg.transpose(q))

    with substituted(ref.linalg, "polar", unscaled) if wrong else contextlib.nullcontext():
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            stacked = geo.project_point(stack)
            worst = max(
                frobenius(q - ref.linalg.polar_svd(a)) / (2 * k * frame_error(*STIEFEL, kappa=k))
                for q, a, k in zip(stacked, stack, kappas, strict=True)
            )
            a = stack[0]
            inexact = sum(
                not np.array_equal(_or_nan(geo.project_point, s * a), original(a)) for s in SCALES
            )
        decisions = sum(
            cases.refuses(geo.project_point, _rank_test_matrix(sigma_sq)) != refuse
            for sigma_sq, refuse in ((2.0**-49, True), (2.0**-47, False))
        )
    return Outcome.bound(
        float(worst + inexact + decisions),
        1.0,
        f"stack: {worst:.2e} of its bound (κ ≤ {max(kappas):.2f}); inexact scalings "
        f"{inexact} of {len(SCALES)}; wrong rank decisions {decisions} of 2",
        {
            "instances": repr(geo),
            "points": "a stack of 3 random matrices, 2 scalings, 2 exact Grams",
            "seeds": ctx.seed,
            "dtypes": "float64",
        },
    )


def _or_nan(fn: Callable, a: np.ndarray) -> np.ndarray:
    try:
        return fn(a)
    except ValueError:
        return np.full_like(a, np.nan)


def check_transport(case: Case) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """T_{x→y}(u) lands in the tangent space at y = R_x(0.3ξ); bound ``law_tolerance``.
        At ``LAW_POINTS`` random points. Control: no transport (u reused at y)."""
        geo, xs = _points(case, ctx)
        return _at_every_point(
            geo, xs, ctx, lambda x: law.transport_law(geo, x, ctx.seed, identity=wrong)
        )

    return run


def check_quotient(case: Case) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """The loss is constant on the fibre x·M, the Riemannian gradient is horizontal, and the
        metric is invariant under the group action; bound ``law_tolerance``. Control: a metric
        that is not invariant. At ``LAW_POINTS`` random points."""
        geo, xs = _points(case, ctx)
        if wrong:
            geo = _broken(case, "inner")
        return _at_every_point(geo, xs, ctx, lambda x: law.quotient_law(geo, x, ctx.seed))

    return run


#: A rank condition is kept while its computations keep 8 digits: rank scale u·κ ≤ 1e-8.
RANK_SCALE = 1e-8


def check_constraints(case: Case) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """After 1000 steps (200 quick) of riemannian_adam the point keeps orthonormal factors
        and unit singular values, within 3·frame_error(k, r) for the largest stacked size k
        (each retraction re-orthonormalises from what it formed, so rounding does not
        accumulate), and its rank, as a rank scale u·κ(S) (R1) or u·κ(A)²κ(B)² (R2) below
        1e-8. Residual: the worse of the two ratios to their bounds (tolerance 1). Control: a
        retraction without re-normalisation (or, for R2, one that loses a rank direction)."""
        geo, x = _point(case, ctx)
        if wrong:
            geo = _broken(case, "retract")
        res, scale, detail = law.long_run(
            geo, x, ctx.seed, QUICK_STEPS if ctx.quick else LONG_STEPS
        )
        shapes = [np.shape(p) for p in ref.geometry.parts(x)]
        bound = 3 * frame_error(max(max(s) for s in shapes), min(s[-1] for s in shapes))
        steps = QUICK_STEPS if ctx.quick else LONG_STEPS
        exercised = _exercised(geo, ctx, 1, steps=f"{steps} of riemannian_adam")
        return Outcome.bound(max(res / bound, scale / RANK_SCALE), 1.0, detail, exercised)

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


#: How far the validation control moves a threshold: ±0.5%, far outside the cases' 1e-6
#: margins (``geometry_cases.MARGIN``).
NEAR_MISS = 0.005


def _near_misses(name: str) -> list[tuple[str, Callable[[], contextlib.AbstractContextManager]]]:
    """(label, context) of each near miss of the reference's thresholds that ``name``'s cases
    test, each moved by +0.5% and by −0.5%: atol (``DEFAULT_ATOL``, substituted into
    ``reference.stiefel``, ``reference.fixed_rank`` and ``reference.partial_isometry``, each of
    which reads its own name), R1's rank test (``reference.fixed_rank.RANK_EPS``) and R2's
    limit (``reference.fixed_rank.CONDITION_LIMIT``)."""

    def atol(factor: float) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        for module in (ref.stiefel, ref.fixed_rank, ref.partial_isometry):
            stack.enter_context(substituted(module, "DEFAULT_ATOL", factor * cases.ATOL))
        return stack

    out = []
    for f in (1 + NEAR_MISS, 1 - NEAR_MISS):
        if name == "stiefel" or cases.ORTHONORMAL[name]:
            out.append((f"atol × {f}", lambda f=f: atol(f)))
        if name == "fixed_rank_embedded":
            out.append(
                (
                    f"R1 rank × {f}",
                    lambda f=f: substituted(ref.fixed_rank, "RANK_EPS", f * cases.EPS),
                )
            )
        if name == "fixed_rank_quotient":
            limit = f * cases.CONDITION_LIMIT
            out.append(
                (
                    f"R2 limit × {f}",
                    lambda v=limit: substituted(ref.fixed_rank, "CONDITION_LIMIT", v),
                )
            )
    return out


def check_validation(name: str) -> Callable[[Context, bool], Outcome]:
    make = ref.Stiefel if name == "stiefel" else ref.GEOMETRIES[name]

    def threshold_decisions(ctx: Context) -> tuple[list[str], dict[str, object]]:
        """The labels of the wrong decisions, and what was exercised."""
        geo = make(*(cases.STIEFEL if name == "stiefel" else cases.SIZES))
        rng = np.random.default_rng([ctx.seed, 7])
        x = geo.random_point(rng)
        validity = cases.validity_cases(name, x, rng)
        if name in cases.TANGENT_CHECKED:
            validity += cases.tangent_cases(name, geo, x, rng)
        exercised = {
            "instances": repr(geo),
            "cases": f"{len(validity)} at the thresholds, {len(cases.size_cases(name))} sizes",
            "seeds": ctx.seed,
            "dtypes": "float64",
        }
        return [c.label for c in validity if c.refused_by(geo) != c.refused], exercised

    def run(ctx: Context, wrong: bool) -> Outcome:
        """``check_point`` refuses exactly beyond the stated thresholds, decided at the
        thresholds themselves, and the constructor exactly outside 1 ≤ r ≤ min(m, n): every
        case of ``geometry_cases.validity_cases`` (a factor at 1 ∓ 1e-6 × atol, R1's core at
        1 ∓ 1e-6 × its rank tolerance r·ε, R2's conditioning at 1 ∓ 1e-6 × 1e-8; St(d, r),
        P1, P2, P3: ``check_tangent`` at 1 ∓ 1e-6 × atol·max(1, ‖ξ‖), ``tangent_cases``; each
        case's quantity exact to 2e-7 and the validators' rounding ≤ 1.6e-7 of a threshold)
        and of ``size_cases``. Residual: the number of wrong decisions, tolerance 0. Control,
        near misses (``_near_misses``): each threshold these cases test moved by +0.5% and by
        −0.5% in turn, substituted into the reference's modules; the control's residual is the
        fewest wrong decisions any near miss caused (rejected only if every one is caught)."""
        if wrong:
            caught = {}
            for label, moved in _near_misses(name):
                with moved():
                    caught[label] = len(threshold_decisions(ctx)[0])
            least = min(caught.values())
            return Outcome(
                least == 0, float(least), 0.0, f"wrong decisions per near miss: {caught}"
            )
        wrong_calls, exercised = threshold_decisions(ctx)
        wrong_calls += [
            f"sizes {sizes}"
            for sizes, refused in cases.size_cases(name)
            if cases.refuses(make, *sizes) != refused
        ]
        return Outcome.bound(
            float(len(wrong_calls)), 0.0, f"wrong decisions: {wrong_calls or 'none'}", exercised
        )

    return run


#: GEO-stiefel's checks of what the other Stiefel geometries build on.
STIEFEL_ONLY = [
    Check(
        "float64",
        "every retraction: R(0) = x and its claimed order",
        every_stiefel_retraction("embedded"),
        "the exponential map with +S (first order only)",
    ),
    Check(
        "float64",
        "nearest point: stacks, scales 2^±600, the rank test",
        stiefel_nearest_point,
        "the polar factor without its prescaling",
    ),
]


def _retraction_control_text(geo: Any) -> str:
    if geo.retraction_order == 2:
        return "QR retraction (first order)"
    if law.metric_geodesic(geo) is not None:
        return "the same retraction claiming order 2"
    return "(A + ξ_A, B): not a retraction"


def _register(name: str) -> None:
    case = _case(name)
    geo = case.make()
    base = case.base
    checks = [
        Check(
            "float64",
            "projection is an orthogonal projector",
            check_projector(case),
            "oblique projection",
        ),
        Check(
            "float64",
            "projection range is the tangent space",
            check_range(case),
            CONTROL_TEXT[base],
        ),
        Check(
            "float64", "Riemannian gradient: Taylor slope 2", check_gradient(case), RGRAD_TEXT[base]
        ),
        Check(
            "float64",
            f"retraction: R(0) = x, order {geo.retraction_order}",
            check_retraction(case),
            _retraction_control_text(geo),
        ),
        Check(
            "float64", "transport lands in the tangent space", check_transport(case), "no transport"
        ),
    ]
    if name == "stiefel":
        checks += STIEFEL_ONLY
    if name == "stiefel-canonical":
        checks.append(
            Check(
                "float64",
                "every retraction: R(0) = x and its claimed order",
                every_stiefel_retraction("canonical"),
                "every retraction claims second order",
            )
        )
    if name in cases.ORTHONORMAL or name == "stiefel":
        checks.append(
            Check(
                "float64",
                "validation: refused exactly beyond the stated thresholds",
                check_validation(name),
                "near miss: each threshold the cases test moved by ±0.5%",
            )
        )
    if name in cases.OPTIONS and name != "stiefel" and "retraction" in cases.OPTIONS[name][0]:
        checks.append(
            Check(
                "float64",
                "every retraction option: R(0) = x and its claimed order",
                check_options(name),
                "every option claims second order",
            )
        )
    if getattr(geo, "quotient", False):
        checks.append(
            Check(
                "float64",
                "quotient: fibre, horizontal gradient, invariant metric",
                check_quotient(case),
                "a non-invariant metric",
            )
        )
    checks.append(
        Check(
            "float64",
            "constraints preserved over 1000 steps",
            check_constraints(case),
            RENORM_TEXT.get(base, "additive step without re-orthonormalisation"),
        )
    )
    if (key := MACHINE_CHECKED.get(name)) is not None:
        checks.append(machine_check(key))
    tex_name = name.replace("_", r"\_")
    tex_repr = repr(geo).replace("_", r"\_")
    register(
        Proposition(
            id=f"GEO-{name}",
            title=f"Geometry laws: {name}",
            statement=(
                rf"For \texttt{{{tex_name}}} (\texttt{{{tex_repr}}}), at {LAW_POINTS} random "
                rf"points (the two slope tests at {SLOPE_POINTS} of them): the projection is the "
                r"metric-orthogonal projector onto the (horizontal) tangent space, "
                r"$\operatorname{grad} f$ is the Riemannian gradient, $R_x(0)=x$ and $R$ is a "
                rf"retraction of order {geo.retraction_order}"
                + (
                    r" (against the geodesics $\gamma$ of its metric: "
                    rf"$\|R_x(t\xi)-\gamma(t)\|=O(t^{{{geo.retraction_order + 1}}})$)"
                    if law.metric_geodesic(geo) is not None
                    else ""
                )
                + r", transport lands in the tangent space"
                + (
                    ", the loss and the metric are invariant along the fibre"
                    if geo.quotient
                    else ""
                )
                + r", and the constraints hold after 1000 steps (200 quick) from one of them."
                + MACHINE_CHECKED_CLAIMS.get(name, "")
            ),
            hypotheses=(
                f"sizes {_sizes(name)}",
                "F(W) = ⟨C, W⟩ + ½‖W‖² + 0.3 Σ cos(2W_ij) for the Taylor tests",
            ),
            checks=tuple(checks),
        )
    )


#: The geometries whose projection laws are also proved for every size (``machine_checked``),
#: and what the statement adds for them.
MACHINE_CHECKED = {
    "stiefel": "GEO-stiefel",
    "fixed_rank_embedded": "R1/P1",
    "partial_isometry_embedded": "R1/P1",
}
MACHINE_CHECKED_CLAIMS = {
    "stiefel": r" For every $d\ge r$, $P_W(Z)=Z-W\,\mathrm{sym}(W^\top Z)$ is tangent, "
    r"idempotent and self-adjoint at $W\in\mathrm{St}(d,r)$ (machine-checked).",
    "fixed_rank_embedded": r" For every size, the projected factors $(I-UU^\top)A$ and "
    r"$(I-VV^\top)B$ are orthogonal to $U$ and $V$ (machine-checked).",
    "partial_isometry_embedded": r" For every size, the projected factors $(I-UU^\top)A$ and "
    r"$(I-VV^\top)B$ are orthogonal to $U$ and $V$ (machine-checked).",
}

for _name in ["stiefel", *ref.GEOMETRIES, *VARIANTS]:
    _register(_name)
