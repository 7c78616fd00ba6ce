"""Cases on which both the reference's and the port's geometries are checked: every option a
geometry is built with, and points that sit at its stated validity thresholds, within a relative
1e-6 on either side (so a threshold moved by more than 1e-6, e.g. by 0.5%, or a comparison turned,
changes a decision).

The thresholds, as the geometries' docstrings state them (written here, not read from the
library: a threshold moved in the library must not move its cases with it):

- an orthonormal factor F is accepted while ‖FᵀF − I‖ ≤ atol = √ε;
- R1's core S while σ_r(S)/σ_1(S) > r·ε (its rank test);
- R2's factors while κ(A)²κ(B)²·u ≤ ``CONDITION_LIMIT`` = 1e-8;
- a tangent vector while its defect (``tangent_cases``) is ≤ atol·max(1, ‖ξ‖);
- sizes while 1 ≤ r ≤ min(m, n).

Each case is decided by the validators, whatever their float64 route, because its quantity is exact
to far better than the 1e-6 margin (``tests/test_geometry_cases.py`` measures each in mpmath on the
stored arrays: within 6e-8 of its stated multiple over 40 seeds; it requires 2e-7), and a
validator's own rounding is below what is left. An orthonormal factor F is moved to F(I + σD) with
D a unit symmetric r×r direction, so ‖(I + σD)² − I‖ = 2σ + O(σ²) with σ ≈ 7e-9 (the O(σ²) term is
σ/2 = 4e-9 relative, the residual of the drawn point, ~1e-15, 7e-8 relative); a validator forms FᵀF
with error ≤ γ_d·‖F‖² = γ_7·3 = 2.3e-15, 1.6e-7 of atol. A tangent case's threshold is atol·max(1,
‖ξ‖), its defect's products err by ≤ 2γ_d·√r·‖ξ‖ (1.5e-7 of it). S is diagonal, diag(3, 1, …, c),
and A and B have the orthogonal columns 3e_1, e_2, …, σ·e_r, whose singular values, Grams and
condition numbers every SVD and symmetric eigensolver returns to within a few ulps (their
Householder reflections of single-entry columns are the identity).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import reference as ref
from reference.linalg import frobenius

#: The plain geometries' sizes (m, n, r) of these cases (r = 3: a last index differs from a
#: second) and St(d, r)'s (GEO's STIEFEL).
SIZES = (6, 5, 3)
STIEFEL = (7, 3)
#: The stated thresholds: orthonormality (√ε) and R2's conditioning (κ(A)²κ(B)²·u).
EPS = float(np.finfo(np.float64).eps)
ATOL = math.sqrt(EPS)
CONDITION_LIMIT = 1e-8
#: How far inside (1 − 1e-6) and outside (1 + 1e-6) a threshold each case sits.
MARGIN = 1e-6
MARGINS = (1.0 - MARGIN, 1.0 + MARGIN)


def multiple(k: float) -> str:
    """A case's multiple of its threshold as the labels write it (0.999999, 1.000001)."""
    return f"{k:.6f}"


#: Every option each geometry is built with (DESIGN §4): its retractions, or for R2 its metrics.
OPTIONS: dict[str, tuple[dict[str, str], ...]] = {
    "stiefel": (*({"retraction": r} for r in ref.stiefel.RETRACTIONS), {"metric": "canonical"}),
    "fixed_rank_embedded": tuple({"retraction": r} for r in ref.fixed_rank.RETRACTIONS),
    "fixed_rank_quotient": ({"metric": "preconditioned"}, {"metric": "balanced"}),
    "partial_isometry_embedded": tuple(
        {"retraction": r} for r in ref.partial_isometry.EMBEDDED_RETRACTIONS
    ),
    "partial_isometry_quotient": tuple(
        {"retraction": r} for r in ref.partial_isometry.FACTOR_RETRACTIONS
    ),
    "stiefel_pair": tuple({"retraction": r} for r in ref.partial_isometry.FACTOR_RETRACTIONS),
}

#: The positions of the orthonormal factors in a point.
ORTHONORMAL = {
    "fixed_rank_embedded": (0, 2),
    "fixed_rank_quotient": (),
    "partial_isometry_embedded": (0, 1),
    "partial_isometry_quotient": (0, 1),
    "stiefel_pair": (0, 1),
}


@dataclass(frozen=True)
class Validity:
    """A point and whether the stated thresholds refuse it."""

    label: str
    point: Any
    refused: bool
    tangent: Any = None  # a tangent case: check_tangent(point, tangent)

    def refused_by(self, geo: Any, convert: Callable[[Any], Any] = lambda v: v) -> bool:
        """Whether ``geo``'s validator refuses the case (its arrays passed through ``convert``,
        e.g. to torch tensors)."""
        if self.tangent is None:
            return refuses(geo.check_point, convert(self.point))
        return refuses(geo.check_tangent, convert(self.point), convert(self.tangent))


def _unit_symmetric(rng: np.random.Generator, r: int) -> np.ndarray:
    c = rng.standard_normal((r, r))
    return (c + c.T) / frobenius(c + c.T)


def validity_cases(name: str, x: tuple, rng: np.random.Generator) -> list[Validity]:
    """The cases of a plain geometry ``name`` (at ``SIZES``, or St(d, r) at ``STIEFEL``) around
    the valid point ``x``: x itself (accepted), each orthonormal factor (or the frame) moved to
    a residual of k·atol, R1's core S with σ_r/σ_1 = k·r·ε, R2's factors with
    κ(A)²κ(B)²·u = k·1e-8 (largest singular value 3), for k in ``MARGINS``."""
    atol, eps = ATOL, EPS
    cases = [Validity("as drawn", x, False)]
    if name == "stiefel":
        d = _unit_symmetric(rng, STIEFEL[1])
        for k in MARGINS:
            moved = x @ (np.eye(STIEFEL[1]) + (k * atol / 2) * d)
            cases.append(Validity(f"frame at {multiple(k)}·atol", moved, k > 1))
        return cases
    m, n, r = SIZES
    for i in ORTHONORMAL[name]:
        d = _unit_symmetric(rng, r)
        for k in MARGINS:
            moved = list(x)
            moved[i] = x[i] @ (np.eye(r) + (k * atol / 2) * d)
            cases.append(Validity(f"factor {i} at {multiple(k)}·atol", tuple(moved), k > 1))
    # The largest singular value is 3 and the middle ones 1 (r = 3), so that a ratio taken as a
    # product, or against the middle value, decides otherwise.
    if name == "fixed_rank_embedded":
        for k in MARGINS:
            core = np.diag([3.0] + [1.0] * (r - 2) + [3.0 * k * r * eps])
            label = f"S with σ_r/σ_1 = {multiple(k)}·r·ε"
            cases.append(Validity(label, (x[0], core, x[2]), k < 1))
    if name == "fixed_rank_quotient":
        for k in MARGINS:
            # κ(A) = κ(B) = 3/σ, so κ(A)²κ(B)²·u = 81u/σ⁴ (each factor carries half the limit)
            a, b = np.eye(m, r), np.eye(n, r)
            a[0, 0] = b[0, 0] = 3.0
            a[r - 1, r - 1] = b[r - 1, r - 1] = 3.0 * (eps / 2 / (k * CONDITION_LIMIT)) ** 0.25
            cases.append(Validity(f"κ(A)²κ(B)²·u = {multiple(k)}·1e-8", (a, b), k > 1))
    return cases


#: The geometries whose tangent validators are checked, and the tangent norms ‖ξ‖ of the cases
#: (below and above 1, where the tolerance atol·max(1, ‖ξ‖) switches).
TANGENT_CHECKED = (
    "stiefel",
    "partial_isometry_embedded",
    "partial_isometry_quotient",
    "stiefel_pair",
)
TANGENT_NORMS = (0.5, 3.0)


def tangent_cases(name: str, geo: Any, x: Any, rng: np.random.Generator) -> list[Validity]:
    """Tangent vectors with a defect of k·atol·max(1, ‖ξ‖) in what ``check_tangent`` measures,
    for k in ``MARGINS`` and ‖ξ‖ in ``TANGENT_NORMS``: a symmetric σD added where only a skew or
    zero part is tangent. St(d, r) and P3's first factor: ξ + W·σD, ‖2 sym(Wᵀ·)‖ = 2σ (P3: ‖ξ‖ of
    that factor); P1: Ω + σD, ‖Ω + Ωᵀ‖ = 2σ; P2: ξ_U + U·σD, ‖sym(Uᵀξ_U)‖ = σ. Each defect is
    orthogonal to the tangent vector (a symmetric part against a skew or zero one), so ‖ξ‖ moves
    by O(σ²) only."""
    cases = []
    for size in TANGENT_NORMS:
        u = geo.random_tangent(x, rng)
        first = u if name == "stiefel" else u[0]
        scale = size / (frobenius(first) if name in ("stiefel", "stiefel_pair") else geo.norm(x, u))
        u = u * scale if name == "stiefel" else tuple(p * scale for p in u)
        r = (STIEFEL if name == "stiefel" else SIZES)[-1]
        d = _unit_symmetric(rng, r)
        for k in MARGINS:
            if name == "partial_isometry_quotient":
                sigma = k * ATOL * max(1.0, size)
            else:
                sigma = k * ATOL * max(1.0, size) / 2
            if name == "stiefel":
                moved = u + x @ (sigma * d)
            elif name == "partial_isometry_embedded":
                moved = (u[0] + sigma * d, *u[1:])
            else:
                moved = (u[0] + x[0] @ (sigma * d), *u[1:])
            label = f"tangent at {multiple(k)}·atol, ‖ξ‖ = {size}"
            cases.append(Validity(label, x, k > 1, moved))
    return cases


def size_cases(name: str) -> list[tuple[tuple[int, int, int], bool]]:
    """((m, n, r), refused) at the rank's ends: r = 1 and r = min(m, n) are legal sizes, and
    so are a single row or column (m = 1 or n = 1, r = 1); r = min(m, n) + 1 (above n, and
    above m when m < n) is not; for St(d, r), (d, r)."""
    if name == "stiefel":
        d, _ = STIEFEL
        return [((d, 1), False), ((d, d), False), ((d, d + 1), True)]
    m, n, _ = SIZES
    return [
        ((m, n, 1), False),
        ((m, n, n), False),
        ((1, n, 1), False),
        ((m, 1, 1), False),
        ((m, n, n + 1), True),
        ((n, m, n + 1), True),
    ]


#: GQA patterns (n_heads, n_kv_heads): one head, MHA, MQA, GQA, and refused ones (zero heads, a
#: head count that is not a multiple of the key heads).
GQA_CASES = ((1, 1), (2, 2), (2, 1), (4, 2), (0, 1), (1, 0), (3, 2), (2, 4))


def refuses(fn: Any, *args: Any) -> bool:
    """Whether ``fn(*args)`` raises ValueError (the refusal every validator gives)."""
    try:
        fn(*args)
    except ValueError:
        return True
    return False
