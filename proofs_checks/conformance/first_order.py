"""The first-order properties (CONF-TANGENT, CONF-DIRECTION, CONF-ORDER): the step map at
the problem's start, read by finite differences.

Finite differences. The first-order properties read the step map S(h) = W⁺(lr = h) − W at
three step lengths h, 2h, 3h, with h chosen so that ‖S(h)‖ = η = 10⁻³, and fit
S(kh) = k·hD + k²·h²C + k³·h³E (a Vandermonde solve). They run in float64 whatever the dtype
of the run, because a difference quotient needs the precision. For a retraction whose fourth
Taylor coefficient is at most ‖D‖⁴ (polar: ⅜‖W(ξᵀξ)²‖ ≤ ⅜‖ξ‖⁴; QR, Cayley and exp alike) the
fit's truncation error is at most v·81·η⁴ for D and C (v the absolute row sum of the inverse
Vandermonde matrix, 4.83 and 5), and each S(kh) carries a rounding error of at most
R = 10·(d + r)·u·‖W‖ (u = 2⁻⁵³); so, relative to ‖hD‖ and ‖hD‖²:

    τ_D = 4.83·(81·η³ + R/η),    τ_C = 5·(81·η² + R/η²).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from proofs_checks.conformance.context import Context, Outcome, _diff, _norm, _Unmeasurable
from proofs_checks.port_compare.geometries import unit_roundoff

Array = np.ndarray

#: Finite-difference step length ‖S(h)‖ (module docstring) and the multiples of h fitted.
ETA = 1e-3
MULTIPLES = np.array([1.0, 2.0, 3.0])


def _one_step(ctx: Context, lr: float, *, scale: float = 1.0) -> list[Array]:
    """The views after one step from the problem's start with G_0 (float64 run), without
    weight decay (the first-order properties are those of the rule and its retraction; decay
    has its own property)."""
    run = ctx.run(dtype=torch.float64)
    run.set("lr", lr)
    if run.has("weight_decay"):
        run.set("weight_decay", 0.0)
    start = run.points()
    run.step(ctx.problem.gradients(start, 0, scale))
    return ctx.view(run.points())


def _vandermonde() -> Array:
    return np.stack([MULTIPLES, MULTIPLES**2, MULTIPLES**3], axis=1)


def _fit(steps: Sequence[Sequence[Array]]) -> tuple[list[Array], list[Array]]:
    """hD and h²C from S(h), S(2h), S(3h) (one list of arrays per multiple)."""
    inv = np.linalg.inv(_vandermonde())
    hd = [sum(inv[0, k] * steps[k][i] for k in range(3)) for i in range(len(steps[0]))]
    h2c = [sum(inv[1, k] * steps[k][i] for k in range(3)) for i in range(len(steps[0]))]
    return hd, h2c


def _tolerances(ctx: Context, w_norm: float) -> tuple[float, float]:
    """τ_D and τ_C of the module docstring (float64)."""
    inv = np.abs(np.linalg.inv(_vandermonde())).sum(axis=1)
    d, r = ctx.dims()
    rounding = 10.0 * (d + r) * unit_roundoff(torch.float64) * w_norm
    tau_d = inv[0] * (81.0 * ETA**3 + rounding / ETA)
    tau_c = inv[1] * (81.0 * ETA**2 + rounding / ETA**2)
    return float(tau_d), float(tau_c)


def first_order(ctx: Context) -> dict[str, Any]:
    """The fit of the step map at the problem's start (cached): the start's arrays and view,
    the view gradient G, hD, h²C, h, τ_D, τ_C."""
    if "first" in ctx._cache:
        return ctx._cache["first"]
    run = ctx.run(dtype=torch.float64)
    arrays = run.points()
    w = ctx.view(arrays)
    probe = _norm(_diff(_one_step(ctx, ctx.lr), w))
    if probe == 0.0:
        raise _Unmeasurable(f"one step at lr {ctx.lr:g} does not move the point")
    h = ctx.lr * ETA / probe
    steps = [_diff(_one_step(ctx, k * h), w) for k in MULTIPLES]
    hd, h2c = _fit(steps)
    tau_d, tau_c = _tolerances(ctx, _norm(w))
    ctx._cache["first"] = {
        "arrays": arrays,
        "w": w,
        "g": ctx.problem.view_gradients(arrays, 0),
        "hd": hd,
        "h2c": h2c,
        "h": h,
        "tau_d": tau_d,
        "tau_c": tau_c,
    }
    return ctx._cache["first"]


def check_tangent(ctx: Context, claim: Any) -> Outcome:
    f = first_order(ctx)
    size = _norm(f["hd"])
    parts = ctx.split(f["arrays"], f["hd"])
    normal = _norm([n for i, x, d in parts for n in ctx.space.normal(i, x, d)])
    slopes = [
        sum(float(np.sum(gi * di)) for gi, di in zip(g, d, strict=True))
        for (_, _, d), (_, _, g) in zip(parts, ctx.split(f["arrays"], f["g"]), strict=True)
    ]
    ratio = normal / size
    descent = max(slopes) < 0.0
    return Outcome(
        ratio <= f["tau_d"] and descent,
        f"normal part of the first-order step {ratio:.2e} of it (bound τ_D {f['tau_d']:.1e}); "
        f"largest ⟨G, D⟩ over the points {max(slopes) / f['h']:.3e} "
        f"({'a descent direction' if descent else 'NOT a descent direction'} at every point)",
        ratio,
        f["tau_d"],
    )


def _reference_first_order(ctx: Context, f: dict[str, Any]) -> list[Array]:
    """hD of the claimed rule at the same point, gradient and h (float64 fit)."""
    arrays = f["arrays"]
    grads = ctx.problem.gradients(arrays, 0)
    steps = []
    for k in MULTIPLES:
        rules = ctx.bound_rules(k * f["h"], decay=False)
        out = []
        for i, rule in enumerate(rules):
            for x, g in zip(
                ctx.problem.elements(arrays, i), ctx.problem.elements(grads, i), strict=True
            ):
                y = rule.step(x, g, rule.init(x))[0]
                out += _diff(ctx.space.view(i, y), ctx.space.view(i, x))
        steps.append(out)
    return _fit(steps)[0]


def check_direction(ctx: Context, claim: Any) -> Outcome:
    f = first_order(ctx)
    hd = f["hd"]
    if ctx.rule is not None:
        expected = _reference_first_order(ctx, f)
        err = _norm(_diff(hd, expected)) / _norm(expected)
        bound = 2.0 * f["tau_d"]
        ratio = _norm(hd) / _norm(expected)
        return Outcome(
            err <= bound,
            f"first-order step vs {ctx.rule}'s: relative difference {err:.2e} (bound {bound:.1e}); "
            f"length ratio {ratio:.6f}",
            err,
            bound,
        )
    metric = ctx.claims.get("metric")
    grads = ctx.problem.gradients(f["arrays"], 0)
    worst = 0.0
    egrads = [g for k in range(len(ctx.space)) for g in ctx.problem.elements(grads, k)]
    for (i, x, d), eg in zip(ctx.split(f["arrays"], hd), egrads, strict=True):
        rg = ctx.space.view_tangent(i, x, ctx.space.rgrad(i, x, eg, metric))
        gap = _norm([di / _norm(d) + ri / _norm(rg) for di, ri in zip(d, rg, strict=True)])
        worst = max(worst, gap * _norm(d) / _norm(hd))
    where = f"the {metric} metric" if metric else "the geometry's metric"
    return Outcome(
        worst <= f["tau_d"],
        f"first-order step vs −grad in {where}, point by point: direction gap "
        f"{worst:.2e} (bound τ_D {f['tau_d']:.1e})",
        worst,
        f["tau_d"],
    )


def check_order(ctx: Context, claim: Any) -> Outcome:
    f = first_order(ctx)
    metric = ctx.claims.get("metric")
    gaps = []
    for (i, x, d), (_, _, c) in zip(
        ctx.split(f["arrays"], f["hd"]), ctx.split(f["arrays"], f["h2c"]), strict=True
    ):
        gap = ctx.space.order_gap(i, x, d, c, metric)
        if gap is None:
            raise _Unmeasurable(
                "on a quotient the order is that of horizontal geodesics, not read from W"
            )
        gaps += gap
    rho = _norm(gaps) / _norm(f["hd"]) ** 2
    measured = 2 if rho <= f["tau_c"] else 1
    against = f"the {metric} geodesic's" if metric else "the geodesic's (a normal acceleration)"
    return Outcome(
        None if claim is None else measured == int(claim),
        f"second-order term vs {against}: ρ = {rho:.2e} of ‖D‖² "
        f"(order 2 when ρ ≤ τ_C = {f['tau_c']:.1e}): order {measured}",
        rho,
        f["tau_c"],
        {"order": measured},
    )
