"""RA-2: with ε = 0 the scalar-moment Adam trajectory does not depend on the gradient scale."""

from __future__ import annotations

import contextlib

import mpmath
import numpy as np
import sympy as sp
from hypothesis import strategies as st

from proofs_checks.bounds import eps_identity_tolerance, trajectory_tolerance
from proofs_checks.harness import (
    frame_problem,
    ladder,
    max_distance,
    property_check,
    substituted,
    trajectory,
)
from proofs_checks.propositions.common import (
    BETAS,
    LR,
    MP_D,
    MP_R,
    MP_STEPS,
    RADIUS,
    STEPS,
    D,
    R,
    adam,
    all_zero,
)
from proofs_checks.propositions.ra_shapes import over_shapes
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference import optim as ro
from reference.linalg import frobenius

SCALES = (1e-150, 1e-100, 1e-50, 1e-8, 1e8, 1e50, 1e100, 1e150)
BASE_RMS = (1e-8, 1.0, 1e8)
EPS = 1e-8
CONTROL = (
    f"ε = {EPS:g} instead of 0 (the ε floor at small gradient scales) (breaks the hypothesis: "
    "ε = 0, not the code)"
)
#: The near miss of ``eps_floor_resolution``: ε = 0 floored to this value inside the library.
#: The ε identity then misses by EPS_FLOOR/(√v̂ + ε) ≈ 1e-11 at gradient RMS 1e-12, about 17 ×
#: ``eps_identity_tolerance(64, 16)``. (The trajectory checks cannot see it: every one of their
#: steps is capped, and the cap restores the length that a scalar ε takes off.)
EPS_FLOOR = 1e-19


def symbolic_homogeneity(ctx: Context, wrong: bool) -> Outcome:
    """One step maps the state (m, v) with gradient g to (m', v') and direction ξ. SymPy shows
    s(cg) = c²s(g) for s(g) = Σg_i²/n, that (cm, c²v, cg) ↦ (cm', c²v'), and that ξ is unchanged
    for c > 0 when ε = 0; by induction (with P_Y(cm) = cP_Y(m)) the whole trajectory is.
    Control: the same difference with ε > 0 does not vanish."""
    c, lr, eps, s, v = sp.symbols("c lr epsilon s v", positive=True)
    b1, b2, m, g = sp.symbols("beta1 beta2 m g", real=True)
    t = sp.Symbol("t", positive=True, integer=True)
    gs = sp.symbols("g0:3", real=True)
    stat = sum(x**2 for x in gs) / 3
    residuals = [sp.simplify(stat.subs({x: c * x for x in gs}, simultaneous=True) - c**2 * stat)]

    def step(m0, v0, g0, s0):
        m1, v1 = b1 * m0 + (1 - b1) * g0, b2 * v0 + (1 - b2) * s0
        e = eps if wrong else 0
        return m1, v1, -lr * (m1 / (1 - b1**t)) / (sp.sqrt(v1 / (1 - b2**t)) + e)

    m1, v1, xi = step(m, v, g, s)
    m1c, v1c, xic = step(c * m, c**2 * v, c * g, c**2 * s)
    residuals += [sp.simplify(m1c - c * m1), sp.simplify(v1c - c**2 * v1), sp.simplify(xic - xi)]
    return all_zero(
        residuals,
        lambda n: f"{n} of 4 identities left nonzero",
        {
            "sizes": f"{len(gs)} symbolic gradient entries; one step of symbolic (m, v, g, s)",
            "options": f"{'ε > 0' if wrong else 'ε = 0'}, c > 0, β1, β2, lr, t symbolic",
            "dtypes": "exact (SymPy)",
            "seeds": "none (exact)",
        },
    )


def scaled_paths(prob, c: float, eps: float):
    opt = adam(eps=eps)
    base = [s.w for s in trajectory(opt, prob.geometry, prob.w0, prob.grads)[0]]
    scaled = [s.w for s in trajectory(opt, prob.geometry, prob.w0, [c * g for g in prob.grads])[0]]
    return base, scaled


def _powers(values) -> str:
    """Numbers as a set, in %g form: {1e-08, 1, 1e+08}."""
    return "{" + ", ".join(f"{v:g}" for v in values) + "}"


def _seed_range(ctx: Context, count: int) -> str:
    """The seeds ctx.seed … ctx.seed + count − 1 of ``count`` problems."""
    return f"{ctx.seed}…{ctx.seed + count - 1}" if count > 1 else str(ctx.seed)


def float64_trajectory(ctx: Context, wrong: bool) -> Outcome:
    """max ‖W_t(cG) − W_t(G)‖ over 6 steps at St(64, 16), c ∈ 10^{±8, ±50, ±100, ±150}, base
    gradient RMS 10^{-8, 0, 8}, trust region active. Bound ``trajectory_tolerance(64, 16, 6)``."""
    res = 0.0
    for k, rms in enumerate(BASE_RMS):
        prob = frame_problem(D, R, STEPS, ctx.seed + k, grad_rms=rms)
        for c in SCALES:
            base, scaled = scaled_paths(prob, c, EPS if wrong else 0.0)
            res = max(res, max_distance(base, scaled))
    return Outcome.bound(
        res,
        trajectory_tolerance(D, R, STEPS),
        "max_t ‖W_t(cG) − W_t(G)‖, ε = 0, c·RMS ∈ [1e-158, 1e158]",
        {
            "sizes": f"St({D}, {R})",
            "steps": STEPS,
            "options": f"c ∈ {_powers(SCALES)}, base gradient RMS ∈ {_powers(BASE_RMS)}, "
            f"ε = {EPS if wrong else 0:g}, trust radius {RADIUS}",
            "dtypes": "float64",
            "seeds": _seed_range(ctx, len(BASE_RMS)),
        },
    )


#: Gradient RMS of the ε checks: ε/(√v̂ + ε) from ~1 (RMS 1e-12) to ~1e-8 (RMS 1).
EPS_RMS = (1e-12, 1e-10, 1e-8, 1e-4, 1.0)
#: Trust radii of the capped ε check: the uncapped steps here have ‖ξ_0‖ = 0.064…0.16, so
#: Δ = 0.05 caps every ξ_0 and, at RMS ≳ ε, ξ_ε as well; 0.1 caps some; 0.5 none (the uncapped
#: identity). Seed 0: both steps capped at 18 steps, one at 22, neither at 50.
EPS_RADII = (RADIUS, 0.1, 0.5)


def _eps_steps(ctx: Context):
    """(geometry, point, gradient, prior state, √v̂, uncapped ξ_0) of every step of the ε = 0
    uncapped trajectories at St(64, 16), for each gradient RMS of ``EPS_RMS``."""
    zero = adam(eps=0.0, radius=None)
    for k, rms in enumerate(EPS_RMS):
        prob = frame_problem(D, R, STEPS, ctx.seed + k, grad_rms=rms)
        steps = trajectory(zero, prob.geometry, prob.w0, prob.grads)[0]
        for s, g in zip(steps, prob.grads, strict=True):
            sqrt_v_hat = s.state[0].sqrt_v[0] / np.sqrt(1 - BETAS[1] ** s.state[0].count)
            yield prob.geometry, s, g, sqrt_v_hat


def _eps_exercised(ctx: Context, cap: str) -> dict[str, object]:
    """What a check over ``_eps_steps`` ran, with the trust region(s) ``cap``."""
    return {
        "sizes": f"St({D}, {R})",
        "steps": f"{STEPS} per trajectory, {len(EPS_RMS)} trajectories",
        "options": f"ε ∈ {{0, {EPS:g}}}, gradient RMS ∈ {_powers(EPS_RMS)}, {cap}",
        "dtypes": "float64",
        "seeds": _seed_range(ctx, len(EPS_RMS)),
    }


def float64_eps_identity(ctx: Context, wrong: bool) -> Outcome:
    """Without the trust region, ε > 0, from the same state: ‖ξ_ε − ξ_0‖ = ‖ξ_0‖·ε/(√v̂ + ε),
    along the trajectories of ``_eps_steps`` (ε/(√v̂ + ε) from ~1 to ~1e-8), relative to
    ‖ξ_0‖; bound ``eps_identity_tolerance(64, 16)`` (Δ = ∞). Control: ε inside the square
    root, ξ = −lr·m̂/sqrt(v̂ + ε)."""
    res = 0.0
    with_eps = adam(eps=EPS, radius=None)
    for geometry, s, g, sqrt_v_hat in _eps_steps(ctx):
        xi0, state = s.xi, s.state[0]
        if wrong:
            m_hat = state.m / (1 - BETAS[0] ** state.count)
            xie = -LR * m_hat / np.sqrt(sqrt_v_hat**2 + EPS)
        else:
            xie = with_eps.update(geometry, s.w, g, s.prior)[0]
        n0 = frobenius(xi0)
        res = max(res, abs(frobenius(xie - xi0) - n0 * EPS / (sqrt_v_hat + EPS)) / n0)
    return Outcome.bound(
        res,
        eps_identity_tolerance(D, R),
        "|‖ξ_ε − ξ_0‖ − ‖ξ_0‖ε/(√v̂ + ε)|/‖ξ_0‖, no cap",
        _eps_exercised(ctx, "no trust region"),
    )


def _scale_by_adam_floored(original):
    """``scale_by_adam`` with ε = max(ε, ``EPS_FLOOR``): a guard against 0/0 that makes the ε = 0
    asked for a tiny positive ε."""

    def variant(b1=0.9, b2=0.999, eps=1e-8, moment="frame", reduction="mean"):
        return original(b1, b2, max(eps, EPS_FLOOR), moment, reduction)

    return variant


def eps_floor_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``float64_eps_identity`` (‖ξ_ε − ξ_0‖ = ‖ξ_0‖·ε/(√v̂ + ε) without the cap, relative to
    ‖ξ_0‖, bound ``eps_identity_tolerance(64, 16)``); control, a near miss: the ε = 0 of ξ_0
    floored to ``EPS_FLOOR`` (``_scale_by_adam_floored``), substituted into
    ``reference.optim``, so ξ_0 is not the ε = 0 step: the identity misses by
    EPS_FLOOR/(√v̂ + ε) ≈ 1e-11 at gradient RMS 1e-12."""
    variant = _scale_by_adam_floored(ro.scale_by_adam)
    with substituted(ro, "scale_by_adam", variant) if wrong else contextlib.nullcontext():
        return float64_eps_identity(ctx, False)


def capped_gap(n0: float, q: float, radius: float) -> float:
    """‖ξ_ε^Δ − ξ_0^Δ‖ predicted from the uncapped ‖ξ_0‖ = n0 and q = √v̂/(√v̂ + ε): both
    capped steps are positive multiples of m̂ (the cap only shortens), of norms min(n0, Δ) and
    min(q·n0, Δ), so their distance is min(n0, Δ) − min(q·n0, Δ)."""
    return min(n0, radius) - min(q * n0, radius)


def float64_eps_capped(ctx: Context, wrong: bool) -> Outcome:
    """With the trust region Δ ∈ {0.05, 0.1, 0.5}, ε > 0, from the same state:
    ‖ξ_ε^Δ − ξ_0^Δ‖ = min(‖ξ_0‖, Δ) − min(‖ξ_0‖·√v̂/(√v̂ + ε), Δ) (``capped_gap``; ξ_0 the
    uncapped ε = 0 step), both capped steps taken by the library (riemannian_adam with
    ``trust_radius`` = Δ), along the trajectories of ``_eps_steps``, relative to
    min(‖ξ_0‖, Δ); bound ``eps_identity_tolerance(64, 16)``. The detail counts the steps where
    both, one or neither step is capped. Control: the uncapped identity ‖ξ_0‖·ε/(√v̂ + ε) held
    for the capped steps (false where the cap acts: at Δ = 0.05 and RMS 1e-8 both steps are
    capped and the gap is 0)."""
    res, regimes = 0.0, {"both": 0, "one": 0, "neither": 0}
    for radius in EPS_RADII:
        capped0, capped_eps = adam(eps=0.0, radius=radius), adam(eps=EPS, radius=radius)
        for geometry, s, g, sqrt_v_hat in _eps_steps(ctx):
            n0, q = frobenius(s.xi), sqrt_v_hat / (sqrt_v_hat + EPS)
            prior = (*s.prior, ())  # the same state; the trust region keeps none
            xi0 = capped0.update(geometry, s.w, g, prior)[0]
            xie = capped_eps.update(geometry, s.w, g, prior)[0]
            want = n0 * EPS / (sqrt_v_hat + EPS) if wrong else capped_gap(n0, q, radius)
            res = max(res, abs(frobenius(xie - xi0) - want) / min(n0, radius))
            caps = int(n0 > radius) + int(q * n0 > radius)
            regimes[("neither", "one", "both")[caps]] += 1
    return Outcome.bound(
        res,
        eps_identity_tolerance(D, R),
        "|‖ξ_ε^Δ − ξ_0^Δ‖ − (min(‖ξ_0‖, Δ) − min(‖ξ_0‖√v̂/(√v̂ + ε), Δ))|/min(‖ξ_0‖, Δ); "
        f"steps capped: {regimes}",
        _eps_exercised(ctx, f"trust radius Δ ∈ {_powers(EPS_RADII)}"),
    )


def mpmath_trajectory(ctx: Context, wrong: bool) -> Outcome:
    """max ‖W_t(cG) − W_t(G)‖ along the mpmath trajectory (St(6, 3), 3 steps) for c = 1e±150 at
    30 and 60 digits, under ``trajectory_tolerance(6, 3, 3, u)``."""
    prob = frame_problem(MP_D, MP_R, MP_STEPS, ctx.seed)
    eps = EPS if wrong else 0.0
    radius, scales = 0.01, (1e-150, 1e150)

    def measure(dps: int) -> float:
        base = mp.adam_trajectory(prob.w0, prob.grads, LR, BETAS, eps, radius).points
        worst = mpmath.mpf(0)
        for c in scales:
            grads = [mp.to_mp(g) * mpmath.mpf(c) for g in prob.grads]
            scaled = mp.adam_trajectory(prob.w0, grads, LR, BETAS, eps, radius).points
            worst = max([worst] + [mp.frobenius(a - b) for a, b in zip(base, scaled, strict=True)])
        return worst

    return ladder(
        measure,
        lambda u: trajectory_tolerance(MP_D, MP_R, MP_STEPS, u),
        "max_t ‖W_t(cG) − W_t(G)‖, c = 1e±150",
        exercised={
            "sizes": f"St({MP_D}, {MP_R})",
            "steps": MP_STEPS,
            "options": f"c ∈ {_powers(scales)}, ε = {eps:g}, lr {LR}, trust radius {radius}",
            "dtypes": "mpmath",
            "seeds": ctx.seed,
        },
    )


def property_trajectory(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ r ≤ d ≤ 64, seeds, c = 10^[-150, 150] and base RMS 10^[-8, 8]
    (its corners always among the examples): 3-step trajectories agree within
    ``trajectory_tolerance(d, r, 3)``."""

    steps_run, c_range, rms_range = 3, (-150, 150), (-8, 8)

    def measure(example) -> tuple[float, float]:
        (d, r), seed, c_exp, rms_exp = example
        prob = frame_problem(d, r, steps_run, seed, grad_rms=10.0**rms_exp)
        base, scaled = scaled_paths(prob, 10.0**c_exp, EPS if wrong else 0.0)
        return max_distance(base, scaled), trajectory_tolerance(d, r, steps_run)

    space = over_shapes(
        st.floats(*c_range),
        st.floats(*rms_range),
        # the corners, on every seed: r = 1 and r = d at the largest scales, and the smallest
        # gradient (c·RMS = 1e-158), where ε > 0 dominates the denominator and the control must
        # fail
        corners=[((8, 1), 0, 150.0, 8.0), ((6, 6), 1, -150.0, 0.0), ((16, 4), 2, -150.0, -8.0)],
        corner=(3, 0.0, 0.0),
        steps=steps_run,
        options=f"c = 10^[{c_range[0]}, {c_range[1]}], "
        f"base gradient RMS 10^[{rms_range[0]}, {rms_range[1]}], ε = {EPS if wrong else 0:g}, "
        f"trust radius {RADIUS}",
    )
    return property_check(ctx, measure=measure, what="max_t ‖W_t(cG) − W_t(G)‖", **space)


register(
    Proposition(
        id="RA-2",
        title="Gradient-scale independence",
        statement=(
            r"Let $W_t(\{G_s\})$ be the trajectory of the scalar-moment Riemannian Adam "
            r"from $W_0$. "
            r"With $\varepsilon=0$, $W_t(\{cG_s\})=W_t(\{G_s\})$ for every $c>0$ and every $t$. "
            r"With $\varepsilon>0$, from the same state and without the trust region, "
            r"$\|\xi_\varepsilon-\xi_0\|=\|\xi_0\|\,\varepsilon/(\sqrt{\hat v}+\varepsilon)$; "
            r"with the trust region $\Delta$ the capped steps satisfy "
            r"$\|\xi^\Delta_\varepsilon-\xi^\Delta_0\|=\min(\|\xi_0\|,\Delta)"
            r"-\min(\|\xi_0\|\sqrt{\hat v}/(\sqrt{\hat v}+\varepsilon),\Delta)$ "
            r"($\xi_0$ the uncapped step with $\varepsilon=0$), which is the uncapped identity "
            r"only where neither step is capped."
        ),
        hypotheses=(
            "one scalar second moment per frame, stored as √v and updated by hypot",
            "trust region and polar retraction depend on the step only",
            "checked for c from 1e-150 to 1e150 and base gradient RMS from 1e-8 to 1e8",
            "ε identities: St(64, 16), 6 steps, ε = 1e-8 with gradient RMS 1e-12…1 (ε/√v̂ from "
            "about 1e-8 to 1e4), Δ ∈ {0.05, 0.1, 0.5}",
        ),
        checks=(
            Check(
                "symbolic",
                "one step is homogeneous of degree (1, 2, 0) in (m, v, ξ)",
                symbolic_homogeneity,
                "ε > 0 (breaks the hypothesis: ε = 0, not the code)",
            ),
            Check(
                "float64", "trajectories agree for c = 1e-150…1e150", float64_trajectory, CONTROL
            ),
            Check(
                "float64",
                "the ε deviation identity without the trust region",
                float64_eps_identity,
                "ε inside the square root",
            ),
            Check(
                "float64",
                f"resolution: ε = {EPS_FLOOR:g} where 0 is asked for is caught",
                eps_floor_resolution,
                f"near miss: Adam's ε = 0 floored to {EPS_FLOOR:g} (a 0/0 guard max(ε, "
                f"{EPS_FLOOR:g})), substituted into reference.optim",
            ),
            Check(
                "float64",
                "the ε deviation of the capped steps",
                float64_eps_capped,
                "the uncapped identity held for the capped steps",
            ),
            Check("mpmath", "trajectory residual falls with precision", mpmath_trajectory, CONTROL),
            Check(
                "property",
                "trajectories agree over shapes, seeds and scales",
                property_trajectory,
                CONTROL,
            ),
        ),
    )
)
