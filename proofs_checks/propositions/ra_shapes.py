"""The domain of the RA property checks: (d, r) with 1 ≤ r ≤ d ≤ 64, a seed and the draws of
each check, its corners always tried (``harness.shape_corners``), and what it exercised. Apart
from ``common`` so that the propositions importing ``common`` do not also hash ``harness``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from proofs_checks.harness import seeds, shape_corners, shapes
from proofs_checks.propositions.common import D


def over_shapes(
    *draws: st.SearchStrategy,
    corner: Sequence[Any] = (),
    corners: Sequence[tuple] = (),
    min_d: int = 1,
    max_d: int = D,
    space: str = "St(d, r)",
    also: str = "",
    dtypes: str = "float64",
    **exercised: object,
) -> dict[str, Any]:
    """The ``strategy``, ``explicit`` and ``exercised`` of an RA property check
    (``harness.property_check``) over the examples ((d, r), seed, *draws), 1 ≤ r ≤ d ≤ ``max_d``
    (by default D = 64, one head's frame) and d ≥ ``min_d``. Tried first on every seed:
    ``corners``, then r = 1 and r = d at the smallest and largest d (``shape_corners``), each
    followed by ``corner``. What it exercised: "sizes" (``space`` over that domain, then
    ``also``), the ``exercised`` items in order, and ``dtypes``."""
    shape = shapes(max_d) if min_d == 1 else shapes(max_d).filter(lambda s: s[0] >= min_d)
    domain = f"1 ≤ r ≤ d ≤ {max_d}" if min_d == 1 else f"{min_d} ≤ d ≤ {max_d}, 1 ≤ r ≤ d"
    return {
        "strategy": st.tuples(shape, seeds(), *draws),
        "explicit": [*corners, *shape_corners(*corner, max_d=max_d)],
        "exercised": {"sizes": f"{space}, {domain}{also}", **exercised, "dtypes": dtypes},
    }
