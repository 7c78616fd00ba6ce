"""CONF-RULE: the claimed reference rule, shadowing the optimizer's own points step by step
(so nothing accumulates), reaches each next point within the audit's per-step bound, in the
run's dtype and in float64."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from proofs_checks import reference_rules
from proofs_checks.audit.bounds import SAFETY, step_bound
from proofs_checks.audit.verdicts import RESOLUTION
from proofs_checks.conformance.context import Context, Outcome, _diff, _norm, _Unmeasurable
from reference import optim as ro

#: Steps of the long run of CONF-RULE.
RULE_STEPS = 200
#: The step of CONF-RULE at which the first parameter's grad is None.
NONE_AT = 7


def _shadow_step(
    ctx: Context, i: int, rule: reference_rules.BoundRule, x: Any, g: Any, y: Any, state: Any
) -> tuple[float, bool, Any]:
    """One step of the reference from the optimizer's own element x of point i (projected to
    the manifold in float64, x̄) with the same gradient: the deviation of the optimizer's y from
    ȳ (in the view) over the audit's bound B (plus SAFETY·u·Σ1/(1 − β)·Δ: the reference's
    moments are rebuilt from the optimizer's points, so they carry its rounding, forgotten at
    rate β), whether B resolves the step (B ≤ RESOLUTION·Δ), and the reference's state moved
    to y. A step the reference refuses is a departure (ratio inf), and the state restarts at
    y."""
    space = ctx.space
    if not (space.residual(i, x) < math.inf and space.residual(i, y) < math.inf):
        return math.inf, True, state  # a point that is not finite departs from every rule
    xbar, ybar_of_y = space.project(i, x), space.project(i, y)
    try:
        ybar, new_state = rule.step(xbar, g, state)
    except ValueError:
        return math.inf, True, rule.init(ybar_of_y)
    n, r = ctx.dims()
    vx, vxbar, vy, vybar = (space.view(i, p) for p in (x, xbar, y, ybar))
    length = _norm(_diff(vybar, vxbar))
    memory = sum(1.0 / (1.0 - b) for b in ctx.decays())
    kappa = max(space.conditioning(xbar), space.conditioning(ybar))
    bound = (
        step_bound(
            ctx.dtype_name,
            _norm(_diff(vx, vxbar)),
            length,
            _norm(vybar),
            n,
            r,
            kappa,
            factoring=ctx.factoring(),
        )
        + SAFETY * ctx.u * memory * length
    )
    dev = _norm(_diff(vy, vybar))
    ratio = dev / bound if bound > 0 else math.inf
    g = space.representative(i, ybar, ybar_of_y)
    if g is not None:  # a quotient: the optimizer may keep another representative of ȳ
        ybar, new_state = rule.geometry.act(ybar, g), _act_on_state(new_state, rule.geometry, g)
    return ratio, bound <= RESOLUTION * length, rule.transport(ybar, ybar_of_y, new_state)


def _act_on_state(state: Any, geometry: Any, g: Any) -> Any:
    """The state with every tangent moment moved by the group element g as the point is,
    (ξ_A M, ξ_B M^{-ᵀ}) or (ξ_U Q, ξ_V Q) (``act``): the same moments at another representative
    (a transport by projection would change them); the scalar √v, a metric norm, is
    invariant."""
    if isinstance(state, ro.AdamState | ro.TraceState):
        return state._replace(m=geometry.act(state.m, g))
    if isinstance(state, tuple):
        return tuple(_act_on_state(s, geometry, g) for s in state)
    return state


def _rule_run(ctx: Context, dtype: torch.dtype) -> tuple[float, int | None, int | None]:
    """CONF-RULE in one dtype: ``RULE_STEPS`` steps under a schedule (lr falls linearly to
    half, set in ``param_groups`` as a scheduler sets it) with the first point's gradients None
    at step ``NONE_AT`` (that point must stay put and its state and count must not move: the
    reference skips it too). Returns the worst deviation/bound, the first departing step and
    the first step the bound does not resolve."""
    run = ctx.run(dtype=dtype)
    problem, space = ctx.problem, ctx.space
    states = [
        [rule.init(space.project(i, x)) for x in problem.elements(run.points(), i)]
        for i, rule in enumerate(ctx.bound_rules())
    ]
    sub = Context(ctx.factory, problem, dtype, ctx.lr, ctx.claims, ctx.rule, ctx.settings)
    first_point = space.params_of(0)
    worst, first, unresolved = 0.0, None, None
    for t in range(RULE_STEPS):
        lr = ctx.lr * (1.0 - 0.5 * t / RULE_STEPS)
        run.set("lr", lr)
        before = run.points()
        grads: list = run.rounded(problem.gradients(before, t))
        skipped = t + 1 == NONE_AT
        try:
            run.step([None if skipped and k in first_point else g for k, g in enumerate(grads)])
        except Exception:  # a step the optimizer cannot take departs from the rule
            return math.inf, first or t + 1, unresolved
        after = run.points()
        for i, rule in enumerate(ctx.bound_rules(lr)):
            if skipped and i == 0:
                still = all(np.array_equal(before[k], after[k]) for k in first_point)
                ratio = 0.0 if still else math.inf
                worst = max(worst, ratio)
                first = t + 1 if ratio > 1.0 and first is None else first
                continue
            elements = zip(
                problem.elements(before, i),
                problem.elements(grads, i),
                problem.elements(after, i),
                strict=True,
            )
            for j, (x, g, y) in enumerate(elements):
                ratio, resolved, states[i][j] = _shadow_step(sub, i, rule, x, g, y, states[i][j])
                worst = max(worst, ratio) if not math.isnan(ratio) else math.inf
                if not ratio <= 1.0 and first is None:
                    first = t + 1
                if not resolved and unresolved is None:
                    unresolved = t + 1
    return worst, first, unresolved


def check_rule(ctx: Context, claim: Any) -> Outcome:
    if ctx.rule is None:
        raise _Unmeasurable("no rule claimed (--rule NAME)")
    if ctx.settings.get("moment") == "elementwise":
        raise _Unmeasurable(
            "the elementwise moment's per-step bound is not available here (use rattn audit)"
        )
    # the run's dtype, and float64 too: a float32 bound (its moments' memory SAFETY·u·Σ1/(1−β)
    # is ~3e-4 of a step) lets through what float64 resolves
    dtypes = [ctx.dtype] + ([torch.float64] if ctx.dtype != torch.float64 else [])
    results = [(dt, *_rule_run(ctx, dt)) for dt in dtypes]
    firsts = [f for _, _, f, _ in results if f is not None]
    unresolved = [u for _, _, _, u in results if u is not None]
    worst = max(w for _, w, _, _ in results)
    first = min(firsts) if firsts else None
    where = ", ".join(str(dt).removeprefix("torch.") for dt in dtypes)
    if first is not None:
        detail = f"departs from {ctx.rule} at step {first} (worst deviation/bound {worst:.3g})"
    elif unresolved:
        detail = f"the bound exceeds {RESOLUTION:g} of the step at step {min(unresolved)}"
    else:
        detail = (
            f"{RULE_STEPS} steps ({where}; lr falling to half; grads None for one point at "
            f"step {NONE_AT}) within the audit's per-step bounds of {ctx.rule} "
            f"(worst deviation/bound {worst:.3g})"
        )
    passed = first is None and not unresolved
    return Outcome(passed, detail, worst, 1.0, {"first_departure_step": first})
