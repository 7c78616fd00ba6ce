"""Where a GEO law is measured: the random points drawn from the seed, the worst ratio over
them to the law's tolerance, and what a check reports it exercised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from proofs_checks import geometry_laws as law
from proofs_checks.propositions.geo_variants import Case
from proofs_checks.registry import Context, Outcome

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
