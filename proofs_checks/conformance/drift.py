"""CONF-MANIFOLD: the iterates of a long run in its own dtype stay on the manifold, within
one orthonormalisation's rounding (drift must not accumulate)."""

from __future__ import annotations

from typing import Any

from proofs_checks.conformance.context import Context, Outcome, _largest, _residual
from proofs_checks.conformance.problem import drive

#: Steps of the long run whose manifold drift is measured.
DRIFT_STEPS = 200


def check_manifold(ctx: Context, claim: Any) -> Outcome:
    run = ctx.run()
    path = drive(run, ctx.problem, DRIFT_STEPS)
    worst = _largest([_residual(ctx, p) for p in path])
    start = _residual(ctx, path[0])
    bound = start + ctx.space.drift_bound(ctx.dtype)
    return Outcome(
        worst <= bound,
        f"max distance from the manifold over {DRIFT_STEPS} steps {worst:.2e} "
        f"(after the last {_residual(ctx, path[-1]):.2e}), bound {bound:.2e} "
        "(one orthonormalisation's rounding: drift must not accumulate)",
        worst,
        bound,
    )
