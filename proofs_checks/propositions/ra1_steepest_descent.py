"""RA-1: the scalar-moment Adam step is steepest descent in the embedded metric."""

from __future__ import annotations

import contextlib

import mpmath
import numpy as np
import sympy as sp
from hypothesis import strategies as st

from proofs_checks.bounds import cosine_tolerance, tangent_error
from proofs_checks.harness import (
    cos_residual,
    frame_problem,
    ladder,
    property_check,
    substituted,
    trajectory,
)
from proofs_checks.machine_checked import machine_check
from proofs_checks.propositions.common import (
    BETAS,
    ELEMENTWISE_CONTROL,
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
from proofs_checks.propositions.common import entrywise_scaled as _entrywise_scaled
from proofs_checks.propositions.ra_shapes import over_shapes
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference import optim as ro
from reference.linalg import frobenius

CONTROL = ELEMENTWISE_CONTROL
#: The near miss of ``direction_resolution``: the Adam direction times 1 ± NEAR_MISS per entry.
#: |1 − cos(ξ, −m̂)| grows like NEAR_MISS²/2 = 8e-12, about 18 × ``cosine_tolerance(64·16)``.
NEAR_MISS = 4e-6


def m_hat(step) -> np.ndarray:
    """m̂ = m/(1 − β1^t) from the Adam state a step left behind."""
    adam_state = step.state[0]
    return adam_state.m / (1.0 - BETAS[0] ** adam_state.count)


def symbolic_orthogonality(ctx: Context, wrong: bool) -> Outcome:
    """⟨W sym(WᵀG), ξ⟩ = tr(S·Wᵀξ) = tr(SΩ) = 0 for S symmetric and Ω = Wᵀξ skew, so
    ⟨G, ξ⟩ = ⟨P_W(G), ξ⟩ on T_W St and Cauchy–Schwarz gives the maximiser −P_W(G)/‖P_W(G)‖.
    SymPy expands tr(SΩ) with symbolic entries for r = 1…12. Control: Ω not skew."""
    leftovers, rs = [], range(1, 13)
    for r in rs:
        s = sp.Matrix(r, r, lambda i, j: sp.Symbol(f"s_{min(i, j)}_{max(i, j)}"))
        o = sp.Matrix(r, r, lambda i, j: sp.Symbol(f"o_{i}_{j}"))
        omega = o if wrong else (o - o.T) / 2
        leftovers.append(sp.expand((s * omega).trace()))
    return all_zero(
        leftovers,
        lambda n: f"tr(SΩ) expanded for r = {rs[0]}…{rs[-1]}: {n} nonzero",
        {
            "sizes": f"r = {rs[0]}…{rs[-1]} (symbolic r×r S symmetric, Ω)",
            "dtypes": "exact (SymPy)",
            "seeds": "none (exact)",
        },
    )


def float64_direction(ctx: Context, wrong: bool) -> Outcome:
    """Over 6 steps at St(64, 16) with the cap active: ξ_t = −c_t·m̂_t with c_t > 0 (β1 = 0.9),
    and ξ_t = −c_t·P_W(G_t) (β1 = 0). Residual max |1 − cos|; bound ``cosine_tolerance(d·r)``."""
    moment = "elementwise" if wrong else "frame"
    prob = frame_problem(D, R, STEPS, ctx.seed)
    res, beta1s = 0.0, (BETAS[0], 0.0)
    for beta1 in beta1s:
        steps, _ = trajectory(adam(moment, beta1=beta1), prob.geometry, prob.w0, prob.grads)
        for s, g in zip(steps, prob.grads, strict=True):
            target = m_hat(s) if beta1 else prob.geometry.proj(s.w, g)
            res = max(res, cos_residual(s.xi, -target))
    capped = sum(frobenius(s.xi) >= RADIUS * (1 - 1e-12) for s in steps)
    return Outcome.bound(
        res,
        cosine_tolerance(D * R),
        f"max |1 − cos(ξ, −m̂)| over {STEPS} steps, {capped} capped",
        {
            "sizes": f"St({D}, {R})",
            "steps": STEPS,
            "options": f"β1 ∈ {{{', '.join(map(str, beta1s))}}}, trust radius {RADIUS}",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def float64_maximum(ctx: Context, wrong: bool) -> Outcome:
    """With β1 = 0 the unit step η = ξ/‖ξ‖ attains ⟨−G, η⟩ = ‖P_W(G)‖, and 1024 random unit
    tangents ν never exceed it. Residual: max relative gap and excess. Bound: the cosine bound
    plus the tangency error of the unit η (``tangent_error``), scaled by ‖G‖/‖P_W G‖."""
    moment = "elementwise" if wrong else "frame"
    prob = frame_problem(D, R, STEPS, ctx.seed)
    geometry = prob.geometry
    steps, _ = trajectory(adam(moment, beta1=0.0), geometry, prob.w0, prob.grads)
    rng = np.random.default_rng(ctx.seed + 1)
    res, tol, tangents = 0.0, np.inf, 256 if ctx.quick else 1024
    for s, g in zip(steps, prob.grads, strict=True):
        best = frobenius(geometry.proj(s.w, g))
        eta = s.xi / frobenius(s.xi)
        res = max(res, abs(float(np.vdot(-g, eta)) - best) / best)
        nu = geometry.proj(s.w, rng.standard_normal((tangents, D, R)))
        nu /= np.linalg.norm(nu, axis=(1, 2), keepdims=True)
        res = max(res, (float(np.max(np.einsum("kij,ij->k", nu, -g))) - best) / best)
        tol = min(tol, (cosine_tolerance(D * R) + tangent_error(D, R, 1.0)) * frobenius(g) / best)
    return Outcome.bound(
        res,
        tol,
        "β1 = 0: |⟨−G, ξ/‖ξ‖⟩ − ‖P_W G‖| and random tangents' excess",
        {
            "sizes": f"St({D}, {R})",
            "steps": STEPS,
            "options": f"β1 = 0, trust radius {RADIUS}",
            "tangents": f"{tangents} random unit tangents per step",
            "dtypes": "float64",
            "seeds": f"{ctx.seed} (frame, gradients), {ctx.seed + 1} (tangents)",
        },
    )


def direction_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``float64_direction`` (max |1 − cos(ξ, −m̂)| over 6 steps at St(64, 16), bound
    ``cosine_tolerance(d·r)``); control, a near miss: the Adam direction times 1 ± ``NEAR_MISS``
    per entry (``_entrywise_scaled``), substituted into ``reference.optim``, which turns ξ off
    −m̂ by |1 − cos| ≈ NEAR_MISS²/2."""
    variant = _entrywise_scaled(NEAR_MISS)(ro.scale_by_adam)
    with substituted(ro, "scale_by_adam", variant) if wrong else contextlib.nullcontext():
        return float64_direction(ctx, False)


def mp_cos_residual(a: np.ndarray, b: np.ndarray) -> mpmath.mpf:
    dot = mpmath.fsum(x * y for x, y in zip(np.ravel(a), np.ravel(b), strict=True))
    return abs(1 - dot / (mp.frobenius(a) * mp.frobenius(b)))


def mpmath_direction(ctx: Context, wrong: bool) -> Outcome:
    """max_t |1 − cos(ξ_t, −m̂_t)| along the mpmath trajectory (St(6, 3), 3 steps, cap active)
    at 30 and 60 digits, under ``cosine_tolerance(d·r, u)`` at each precision."""
    prob = frame_problem(MP_D, MP_R, MP_STEPS, ctx.seed)
    moment = "elementwise" if wrong else "frame"
    lr, eps, radius = 0.05, 1e-8, 0.05

    def measure(dps: int) -> float:
        tr = mp.adam_trajectory(prob.w0, prob.grads, lr, BETAS, eps, radius, moment)
        return max(mp_cos_residual(x, -m) for x, m in zip(tr.steps, tr.m_hats, strict=True))

    return ladder(
        measure,
        lambda u: cosine_tolerance(MP_D * MP_R, u),
        "max |1 − cos(ξ, −m̂)|",
        exercised={
            "sizes": f"St({MP_D}, {MP_R})",
            "steps": MP_STEPS,
            "options": f"lr {lr}, β = {BETAS}, ε {eps:g}, trust radius {radius}",
            "dtypes": "mpmath",
            "seeds": ctx.seed,
        },
    )


def property_direction(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ r ≤ d ≤ 64, seeds, gradient RMS 10^[-8, 8], β1 ∈ {0, 0.9} and cap
    on/off: max |1 − cos(ξ, −m̂)| over 3 steps ≤ ``cosine_tolerance(d·r)``."""
    moment = "elementwise" if wrong else "frame"
    steps_run, rms_exp, beta1s, radii = 3, (-8, 8), [0.0, BETAS[0]], [None, RADIUS]

    def measure(example) -> tuple[float, float]:
        (d, r), seed, exponent, beta1, radius = example
        prob = frame_problem(d, r, steps_run, seed, grad_rms=10.0**exponent)
        opt = adam(moment, beta1=beta1, radius=radius)
        steps, _ = trajectory(opt, prob.geometry, prob.w0, prob.grads)
        return max(cos_residual(s.xi, -m_hat(s)) for s in steps), cosine_tolerance(d * r)

    radius_names = ", ".join("none" if r is None else str(r) for r in radii)
    space = over_shapes(
        st.floats(*rms_exp),
        st.sampled_from(beta1s),
        st.sampled_from(radii),
        corner=(0, 0.0, BETAS[0], RADIUS),
        steps=steps_run,
        options=f"gradient RMS 10^[{rms_exp[0]}, {rms_exp[1]}], "
        f"β1 ∈ {{{', '.join(map(str, beta1s))}}}, trust radius ∈ {{{radius_names}}}",
    )
    return property_check(ctx, measure=measure, what="max |1 − cos(ξ, −m̂)|", **space)


register(
    Proposition(
        id="RA-1",
        title="Steepest descent in the embedded metric",
        statement=(
            r"For $W\in\mathrm{St}(d,r)$ and $G\in\mathbb{R}^{d\times r}$ with $P_W(G)\neq0$, "
            r"$-P_W(G)/\|P_W(G)\|$ maximises $\langle -G,\xi\rangle$ over unit "
            r"$\xi\in T_W\mathrm{St}(d,r)$ with $\langle\xi,\eta\rangle=\operatorname{tr}"
            r"(\xi^\top\eta)$. Every step of the scalar-moment Riemannian Adam is "
            r"$\xi_t=-c_t\,\hat m_t$ with $c_t>0$, before and after the trust-region cap; "
            r"when $\beta_1=0$ $\xi_t=-c_t\,P_{W_t}(G_t)$."
        ),
        hypotheses=(
            "embedded metric; P_W(Z) = Z − W sym(WᵀZ)",
            "one scalar second moment per frame (moment='frame'), reduction 'mean'",
            "trust region ξ ← ξ·min(1, Δ/‖ξ‖)",
            "checked: tr(SΩ) = 0 symbolically for r = 1…12; the steps at St(64, 16), St(6, 3) "
            "(mpmath) and 1 ≤ r ≤ d ≤ 64",
        ),
        checks=(
            machine_check("RA-1"),
            Check(
                "symbolic",
                "tr(SΩ) = 0: the normal part of G is orthogonal to T_W",
                symbolic_orthogonality,
                "Ω not skew (breaks the hypothesis: ξ ∈ T_W St, i.e. Wᵀξ skew, not the code)",
            ),
            Check("float64", "ξ is a positive multiple of −m̂", float64_direction, CONTROL),
            Check(
                "float64",
                f"resolution: a step off −m̂ by a relative ±{NEAR_MISS:g} per entry is caught",
                direction_resolution,
                f"near miss: the Adam direction times 1 ± {NEAR_MISS:g} per entry (a checkerboard "
                "of signs: a second moment not quite scalar), substituted into reference.optim",
            ),
            Check("float64", "the step attains the maximum ‖P_W G‖", float64_maximum, CONTROL),
            Check("mpmath", "direction residual falls with precision", mpmath_direction, CONTROL),
            Check("property", "ξ ∥ −m̂ over shapes, seeds and scales", property_direction, CONTROL),
        ),
    )
)
