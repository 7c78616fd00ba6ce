"""PORT-5's validation check: the port's validators decide as the stated thresholds do, at the
thresholds themselves, and its constructors, claims and GQA patterns are the reference's; the
control moves each threshold of the port by ±0.5% in turn.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases
from proofs_checks.harness import substituted
from proofs_checks.propositions.port_geometry_pairs import (
    BLOCK_OPTIONS,
    BLOCKS,
    NAMES,
    block_geometries,
    default_sizes,
    geometries,
    to_torch,
)
from proofs_checks.registry import Context, Outcome


def _claims(geo: Any) -> tuple:
    """What a geometry states about itself: the order of its retraction, its dimension, and
    whether it is embedded and a quotient."""
    return (geo.retraction_order, geo.dim, geo.embedded, geo.quotient)


def _pattern(gqa: Callable, heads: tuple[int, int]) -> list | None:
    """The GQA pattern, or None when it is refused."""
    try:
        return gqa(*heads)
    except ValueError:
        return None


#: How far the validation control moves each of the port's thresholds: ±0.5%, far outside the
#: cases' 1e-6 margins (``geometry_cases.MARGIN``) and far inside anything a check at 1% sees.
NEAR_MISS = 0.005


def _scaled(original: Callable, factor: float) -> Callable:
    return lambda *args: factor * original(*args)


def _port_near_misses() -> list[tuple[str, Callable[[], contextlib.AbstractContextManager]]]:
    """(label, context) of each near miss: one of the port's stated thresholds times 1 ± 0.5%,
    substituted where the port reads it: ``default_atol`` (``torch_port.geometry`` and the
    name ``torch_port.stiefel`` imported), R2's ``CONDITION_LIMIT`` and R1's ``RANK_EPS``
    (``torch_port.fixed_rank``), and the polar factor's ``polar_rank_floor``
    (``torch_port.linalg``)."""
    from torch_port import fixed_rank, geometry, stiefel
    from torch_port import linalg as tl

    def atol(factor: float) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        for module in (geometry, stiefel):
            moved = _scaled(module.default_atol, factor)
            stack.enter_context(substituted(module, "default_atol", moved))
        return stack

    out = []
    for f in (1 + NEAR_MISS, 1 - NEAR_MISS):
        out += [
            (f"atol × {f}", lambda f=f: atol(f)),
            (
                f"R2 limit × {f}",
                lambda f=f: substituted(fixed_rank, "CONDITION_LIMIT", f * 1e-8),
            ),
            (
                f"R1 rank × {f}",
                lambda f=f: substituted(fixed_rank, "RANK_EPS", f * cases.EPS),
            ),
            (
                f"polar rank × {f}",
                lambda f=f: substituted(tl, "polar_rank_floor", _scaled(tl.polar_rank_floor, f)),
            ),
        ]
    return out


def _rank_test_matrix(factor: float) -> np.ndarray:
    """A 10×3 A with orthogonal columns of disjoint supports, e_1 + e_4 + e_6 + e_9 (λ_max = 4;
    every entry 0 or 1, so dividing by max|a| is exact), e_2 (λ = 1) and σ·e_3 with
    σ² = factor·ε·λ_max·d (d = 10 rows): its Gram is diag(4, 1, σ²) in every float64 route
    (each entry one product of single entries; σ·σ is within 2u of factor·ε·40) and a symmetric
    eigensolver returns a diagonal matrix's entries exactly, so the polar factor's rank test
    (refuse when λ_min(AᵀA) ≤ ε·λ_max·d) sees factor·ε·λ_max·d itself: it refuses
    factor 1 − 1e-6 and accepts 1 + 1e-6. A test without d, with ε·λ_max/d, with ε/λ_max, or
    with the middle eigenvalue for λ_max decides both alike (λ_max = 4 ≠ 1 and r = 3 tell those
    apart)."""
    a = np.zeros((10, 3))
    a[[0, 3, 5, 8], 0] = 1.0
    a[1, 1] = 1.0
    a[2, 2] = np.sqrt(factor * cases.EPS * 4.0 * 10)
    return a


def _threshold_decisions(ctx: Context) -> tuple[list[str], int]:
    """(wrong decisions, count) of the port at its stated thresholds: ``check_point`` on every
    case of ``geometry_cases.validity_cases`` (and the Stiefel ``tangent_cases``) for St(7, 3)
    and the five plain geometries, and both libraries' polar factors on ``_rank_test_matrix``
    at 1 ∓ 1e-6."""
    from torch_port import linalg as tl

    wrong_calls, count = [], 0
    for name in NAMES:
        rg, tg = geometries(name, {})
        rng = np.random.default_rng([ctx.seed, 9])
        x = rg.random_point(rng)
        found = cases.validity_cases(name, x, rng)
        if name == "stiefel":  # the port's one tangent validator
            found += cases.tangent_cases(name, rg, x, rng)
        for c in found:
            count += 1
            if c.refused_by(tg, to_torch) != c.refused:
                wrong_calls.append(f"{name}: {c.label}")
    for k in cases.MARGINS:
        a, refused = _rank_test_matrix(k), k < 1
        for where, polar in (("reference", ref.linalg.polar), ("port", tl.polar)):
            count += 1
            if cases.refuses(polar, a if where == "reference" else to_torch(a)) != refused:
                wrong_calls.append(f"{where} polar at λ_min = {cases.multiple(k)}·ε·λ_max·d")
    return wrong_calls, count


def _other_decisions(ctx: Context) -> tuple[list[str], int]:
    """(wrong decisions, count) of what ``validation`` checks beside the thresholds: sizes,
    claims, a batch of frames, GQA patterns."""
    import torch

    from torch_port import blocks
    from torch_port.geometries import GEOMETRIES

    wrong_calls, count = [], 0
    for name in NAMES:
        for sizes, refused in cases.size_cases(name):
            count += 1
            if cases.refuses(GEOMETRIES[name], *sizes) != refused:
                wrong_calls.append(f"{name}: sizes {sizes}")
    for name in NAMES:
        for option in cases.OPTIONS[name]:
            for r in (1, default_sizes(name)[-1]):
                count += 1
                sizes = (*default_sizes(name)[:-1], r)
                rg, tg = geometries(name, option, sizes)
                if _claims(tg) != _claims(rg):
                    wrong_calls.append(f"{name} {option} at r = {r}: claims {_claims(tg)}")
    for name in BLOCKS:
        for options in BLOCK_OPTIONS:
            count += 1
            rg, tg = block_geometries(name, options)
            if _claims(tg) != _claims(rg):
                wrong_calls.append(f"{name} {options}: claims {_claims(tg)}")
    rg, tg = geometries("stiefel", {})
    w = to_torch(rg.random_point(np.random.default_rng([ctx.seed, 12])))
    off = w * (1 + 2 * cases.ATOL)  # ‖WᵀW − I‖ ≈ 4·atol·√r
    for frames, refused in (((w, w, w), False), ((w, off, w), True)):
        count += 1
        if cases.refuses(tg.check_point, torch.stack(frames)) != refused:
            wrong_calls.append(f"stiefel: a batch of 3 frames, refused {not refused}")
    for heads in cases.GQA_CASES:
        count += 1
        if _pattern(ref.blocks.gqa_pattern, heads) != _pattern(blocks.gqa_pattern, heads):
            wrong_calls.append(f"gqa_pattern{heads}")
    return wrong_calls, count


def validation(ctx: Context, wrong: bool) -> Outcome:
    """The port's validators decide as the stated thresholds do, at the thresholds themselves
    (``_threshold_decisions``): ``check_point`` on every case of
    ``geometry_cases.validity_cases`` (the point as drawn; each orthonormal factor at 1 ∓ 1e-6
    × atol; R1's core at 1 ∓ 1e-6 × r·ε; R2's conditioning at 1 ∓ 1e-6 × 1e-8; the Stiefel
    tangent validator at 1 ∓ 1e-6 × atol·max(1, ‖ξ‖); each case's quantity exact to 2e-7 and
    the validators' rounding ≤ 1.6e-7 of a threshold, ``geometry_cases``), and both libraries'
    polar factors on a 10×3 A (λ_max = 4) whose λ_min(AᵀA) is (1 ∓ 1e-6)·ε·λ_max·d, exactly
    (``_rank_test_matrix``); and beside them (``_other_decisions``) its constructors accept and
    refuse the sizes of ``size_cases`` (r = 1, r = min(m, n), r = min(m, n) + 1) for St(7, 3)
    and the five plain geometries, its GQA patterns are the reference's, refusals included
    (``GQA_CASES``), every option's claims (``_claims``: the retraction's order, the
    dimension, embedded, quotient) at r = 1 and r = 3, and the block variants' with both
    ``BLOCK_OPTIONS``, are the reference's, and a batch of three St(7, 3) frames is accepted,
    and refused when its middle frame is off by 4·atol·√r. Residual: the number of wrong
    decisions, tolerance 0. Control, near misses (``_port_near_misses``): each threshold of the
    port moved by +0.5% and by −0.5% in turn (atol, R2's limit, R1's rank test, the polar
    factor's rank test), substituted into the port's modules; the threshold decisions are
    repeated under each, and the control's residual is the fewest wrong decisions any near miss
    caused (so it is rejected only if every near miss is caught)."""
    if not wrong:
        found, count = _threshold_decisions(ctx)
        others, more = _other_decisions(ctx)
        wrong_calls = found + others
        exercised = {
            "geometries": ", ".join(NAMES) + ", the block variants",
            "cases": f"{count} at the thresholds, {more} others",
            "dtypes": "float64",
            "seeds": ctx.seed,
        }
        return Outcome.bound(
            float(len(wrong_calls)),
            0.0,
            f"wrong decisions: {wrong_calls or 'none'} of {count + more}",
            exercised,
        )
    caught = {}
    for label, moved in _port_near_misses():
        with moved():
            caught[label] = len(_threshold_decisions(ctx)[0])
    least = min(caught.values())
    return Outcome(least == 0, float(least), 0.0, f"wrong decisions per near miss: {caught}")
