"""The properties read from two float64 runs that must agree (CONF-DEGREE,
CONF-EQUIVARIANCE, CONF-DECAY).

Trajectories. Where two runs must agree (scale, equivariance, decay), each step may differ by
the audit's per-step rounding bound B_t (``proofs_checks.audit.bounds.step_bound``) and carries the
difference before it with a Lipschitz factor L = 2, so e_T ≤ Σ_t L^{T−t}·B_t. These are
properties of the rule, not of its rounding, and L^T makes the bound useless in float32
(~10 at 20 steps), so they too run in float64; a bound above ``RESOLUTION`` of the path's
length resolves nothing and the property is then not measured, never passed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from proofs_checks.audit.bounds import LIPSCHITZ, step_bound
from proofs_checks.audit.verdicts import RESOLUTION
from proofs_checks.conformance.context import (
    Context,
    Outcome,
    _diff,
    _largest,
    _norm,
    _Unmeasurable,
)
from proofs_checks.conformance.first_order import _one_step, first_order
from proofs_checks.conformance.problem import Problem, drive

Array = np.ndarray

#: Steps of the trajectory comparisons.
TRAJECTORY_STEPS = 10
EQUIVARIANCE_STEPS = 20
#: Gradient scales of the degree-0 check (powers of two: the scaled gradients are exact).
SCALES = (2.0**-24, 2.0**24)
DECAY = 0.1


def _conditioning(ctx: Context, arrays: Sequence[Array]) -> float:
    return _largest([ctx.space.conditioning(x) for _, x in ctx.elements(arrays)])


def _accumulated(ctx: Context, path: Sequence[list[Array]]) -> float:
    """Σ_t L^{T−t}·B_t over the steps of a float64 path of arrays (module docstring)."""
    total = 0.0
    n, r = ctx.dims()
    for before, after in itertools.pairwise(path):
        a, b = ctx.view(before), ctx.view(after)
        step = _norm(_diff(b, a))
        kappa = _conditioning(ctx, after)
        bound = step_bound(str(torch.float64), 0.0, step, _norm(b), n, r, kappa, factoring=True)
        total = LIPSCHITZ * total + bound
    return total


def _compare_paths(
    ctx: Context, a: Sequence[list[Array]], b: Sequence[list[Array]], what: str, extra=0.0
) -> Outcome:
    """Two float64 trajectories (the parameters' arrays) that must agree: pass when their views
    differ by at most the accumulated bound, and only when that bound resolves a difference
    (≤ RESOLUTION of the path's length; else not measurable, never passed)."""
    va, vb = [ctx.view(p) for p in a], [ctx.view(p) for p in b]
    dev = _largest([_norm(_diff(x, y)) for x, y in zip(va, vb, strict=True)])
    bound = _accumulated(ctx, a) + extra
    length = sum(_norm(_diff(y, x)) for x, y in itertools.pairwise(va))
    detail = f"{what}: differ by {dev:.2e} (bound {bound:.1e})"
    if bound > RESOLUTION * length:
        return Outcome(None, f"{detail}: the bound does not resolve the path", dev, bound)
    return Outcome(dev <= bound, detail, dev, bound)


def _path(ctx: Context, problem: Problem | None = None, steps: int = TRAJECTORY_STEPS, **set_):
    """A float64 trajectory of the problem with the given hyperparameters (scale: of G;
    decay: λ·x added to G)."""
    scale, decay = set_.pop("scale", 1.0), set_.pop("decay", 0.0)
    run = ctx.run(problem, torch.float64)
    for key, value in set_.items():
        run.set(key, value)
    return drive(run, problem or ctx.problem, steps, scale=scale, decay=decay)


def check_degree(ctx: Context, claim: Any) -> Outcome:
    f = first_order(ctx)
    doubled = _norm(_diff(_one_step(ctx, f["h"], scale=2.0), f["w"]))
    single = _norm(_diff(_one_step(ctx, f["h"]), f["w"]))
    measured = math.log2(doubled / single)
    detail = f"measured degree {measured:.3f} (step length under G → 2G at the first step)"
    if claim is None:
        return Outcome(None, detail, measured, extra={"degree": measured})
    if int(claim) == 0:
        base = _path(ctx)
        outcomes = [
            _compare_paths(ctx, base, _path(ctx, scale=c), f"{TRAJECTORY_STEPS} steps, G → {c:g}·G")
            for c in SCALES
        ]
    else:
        outcomes = [
            _compare_paths(
                ctx,
                _path(ctx, steps=1, lr=c * ctx.lr),
                _path(ctx, steps=1, scale=c),
                f"one step with {c:g}·G vs one with {c:g}·lr",
            )
            for c in (0.5, 2.0)
        ]
    out = _worst(outcomes, detail)
    out.extra["degree"] = measured
    return out


def _worst(outcomes: Sequence[Outcome], extra: str = "") -> Outcome:
    """The outcomes joined: failed if one failed, unmeasured if one is, else passed."""
    verdicts = [o.passed for o in outcomes]
    passed = False if False in verdicts else (None if None in verdicts else True)
    worst = max(outcomes, key=lambda o: (o.value or 0.0) / (o.bound or 1.0))
    detail = "; ".join([o.detail for o in outcomes] + ([extra] if extra else []))
    return Outcome(passed, detail, worst.value, worst.bound)


def check_equivariance(ctx: Context, claim: Any) -> Outcome:
    rotated = ctx.problem.rotated()
    base = _path(ctx, steps=EQUIVARIANCE_STEPS)
    turned = _path(ctx, rotated, steps=EQUIVARIANCE_STEPS)
    space = ctx.space
    back = [
        [
            a
            for i, q in enumerate(rotated.rotation)
            for a in space.assemble(i, [space.rotate(q, x) for x in ctx.problem.elements(pts, i)])
        ]
        for pts in base
    ]
    start = _norm(_diff(ctx.view(back[0]), ctx.view(turned[0])))
    return _compare_paths(
        ctx,
        back,
        turned,
        f"{EQUIVARIANCE_STEPS} steps from (QW, QG) vs Q times those from (W, G)"
        + ("" if ctx.space.name == "stiefel" else " (Q on the rows of W, P on its columns)"),
        extra=LIPSCHITZ**EQUIVARIANCE_STEPS * start,
    )


def check_decay(ctx: Context, claim: Any) -> Outcome:
    if not ctx.run().has("weight_decay"):
        raise _Unmeasurable("the optimizer has no 'weight_decay' hyperparameter")
    claim = claim or "none"
    if claim == "fused" and ctx.space.name != "stiefel":
        raise _Unmeasurable("fused decay is stated for Stiefel frames (DESIGN §5)")
    decayed = _path(ctx, lr=ctx.lr, weight_decay=DECAY)
    if claim == "fused":
        expected = _path(ctx, lr=ctx.lr / (1.0 - ctx.lr * DECAY), weight_decay=0.0)
        what = "equals lr/(1 − lr·λ) without decay (fused: polar(W + ξ/(1 − lr·λ)))"
    elif claim == "coupled":
        expected = _path(ctx, lr=ctx.lr, weight_decay=0.0, decay=DECAY)
        what = "equals the run without decay fed G + λ·x (coupled, factor by factor)"
    else:
        expected = _path(ctx, lr=ctx.lr, weight_decay=0.0)
        what = "equals the run without decay (points are not decayed, RA-5)"
    return _compare_paths(
        ctx, expected, decayed, f"{TRAJECTORY_STEPS} steps with weight_decay {DECAY:g} {what}"
    )
