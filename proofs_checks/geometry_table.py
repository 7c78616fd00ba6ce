"""``rattn geometries``: the ten design points and St(d, r), with measured retraction order."""

from __future__ import annotations

from typing import Any

import numpy as np

import reference as ref
from proofs_checks import geometry_laws as law

DESCRIPTIONS = {
    "stiefel": ("W ∈ St(m, r)", "embedded tr(ξᵀη)"),
    "fixed_rank_embedded": ("(U, S, V), W = U S Vᵀ", "Frobenius on R^{m×n}"),
    "fixed_rank_quotient": ("(A, B) / GL(r), W = A Bᵀ", "tr(BᵀB ξ_Aᵀη_A) + tr(AᵀA ξ_Bᵀη_B)"),
    "partial_isometry_embedded": ("(U, V), W = U Vᵀ", "Frobenius on R^{m×n}"),
    "partial_isometry_quotient": ("(U, V) / O(r)", "product embedded, horizontal"),
    "stiefel_pair": ("(U, V) ∈ St(m, r) × St(n, r)", "product embedded"),
}
COST = "O((m+n)r² + r³)"

#: Peak memory of ``describe`` in float64 matrices of the block variants' stacked 2m×n size: the
#: retraction-order measurements hold the ambient matrices of the points on their Taylor grid
#: (measured with tracemalloc: 96, 111 and 123 of them at (m, n, r) = (200, 150, 10),
#: (400, 300, 20), (600, 100, 30)); a margin of 1.3 over the largest.
AMBIENT_COPIES = 160


def describe_bytes(m: int, n: int, r: int) -> int:
    """The estimated peak memory of ``describe(m, n, r)`` in bytes (``AMBIENT_COPIES``)."""
    return 8 * AMBIENT_COPIES * 2 * m * max(n, r)


def describe(m: int = 8, n: int = 6, r: int = 2, seed: int = 0) -> list[dict[str, Any]]:
    """One row per geometry: representation, metric, dimension, claimed and measured order.

    The order is measured as in GEO-*: the slope of the order-defining error (for St(d, r) the
    distance of R_x(tξ) to the metric's geodesic, else the tangential part of R_x(tξ) − x − tξ;
    3 for second order, 2 for first) on the Taylor grid; None when every error is at the
    rounding floor (an exact model, e.g. the additive retraction in factor space).
    """
    rows = []
    for name in ["stiefel", *ref.GEOMETRIES]:
        geo = ref.Stiefel(m, r) if name == "stiefel" else ref.GEOMETRIES[name](m, n, r)
        x = geo.random_point(np.random.default_rng(seed))
        s1, s2, _, _ = law.retraction_slopes(geo, x, seed)
        point, metric = DESCRIPTIONS[name.removeprefix("block_")]
        if name.startswith("block_"):
            point = f"per group, stacked factors: {point}"
        rows.append(
            {
                "name": name,
                "point": point,
                "metric": metric,
                "dim": int(geo.dim),
                "retraction_order": int(geo.retraction_order),
                "measured_slope": None if s2 is None else round(float(s2), 2),
                "first_order_slope": None if s1 is None else round(float(s1), 2),
                "cost": COST,
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| name | point | metric | dim | order (measured slope) | cost |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        slope = row["measured_slope"]
        measured = "exact in factor space" if slope is None else f"slope {slope:.2f}"
        lines.append(
            f"| {row['name']} | {row['point']} | {row['metric']} | {row['dim']} | "
            f"{row['retraction_order']} ({measured}) | {row['cost']} |"
        )
    return "\n".join(lines)
