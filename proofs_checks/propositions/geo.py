"""GEO-stiefel and GEO-<name> for the ten geometries: DESIGN §6's laws with negative controls."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases
from proofs_checks import geometry_laws as law
from proofs_checks import rigorous
from proofs_checks.bounds import frame_error
from proofs_checks.machine_checked import machine_check
from proofs_checks.propositions.geo_nearest import stiefel_nearest_point
from proofs_checks.propositions.geo_points import (
    LAW_POINTS,
    SLOPE_POINTS,
    _at_every_point,
    _exercised,
    _point,
    _points,
)
from proofs_checks.propositions.geo_retraction import (
    _retraction_control_text,
    check_options,
    check_retraction,
    every_stiefel_retraction,
    exp_enclosure,
)
from proofs_checks.propositions.geo_validation import check_validation
from proofs_checks.propositions.geo_variants import (
    CONTROL_TEXT,
    RENORM_TEXT,
    RGRAD_TEXT,
    VARIANTS,
    Case,
    _broken,
    _case,
    _sizes,
)
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: The constraint check's run of riemannian_adam, in steps (quick: the second).
LONG_STEPS, QUICK_STEPS = 1000, 200


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
    Check(
        "rigorous",
        "the exponential retraction's ‖YᵀY − I‖, enclosed",
        exp_enclosure,
        "the exponential map with +S (off the manifold at second order)",
        unavailable=rigorous.unavailable,
    ),
]


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
                + RIGOROUS_CLAIMS.get(name, "")
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

#: What the statement adds for the geometries with a rigorous check.
RIGOROUS_CLAIMS = {
    "stiefel": r" Computed in float64 by the reference, the exponential map's output "
    r"$Y=\operatorname{Exp}_W(\xi)$ for a unit $\xi$ at $\mathrm{St}(7,3)$ and "
    r"$\mathrm{St}(64,16)$ satisfies $\|Y^\top Y-I\|_F\le\mathtt{law\_tolerance}$ "
    r"(a rigorous enclosure).",
}

for _name in ["stiefel", *ref.GEOMETRIES, *VARIANTS]:
    _register(_name)
