"""The rigorous checks' ball arithmetic: enclosures that contain the exact value, and the checks
that use them, with their controls."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proofs_checks import rigorous
from proofs_checks.propositions import geo_retraction, ra3_conditioning, ref_adam
from proofs_checks.registry import REGISTRY, Context

pytestmark = pytest.mark.skipif(
    rigorous.unavailable() is not None, reason=str(rigorous.unavailable())
)
CTX = Context(seed=0)


def test_an_orthonormal_matrix_encloses_zero_and_a_scaled_one_its_defect() -> None:
    # [I; 0] is exactly orthonormal; 2·[I; 0] has WᵀW − I = 3I, of norm 3√r (exact values)
    w = np.eye(7, 3)
    assert rigorous.orthonormality_upper(w) == 0.0
    upper = rigorous.orthonormality_upper(2.0 * w)
    assert 3 * math.sqrt(3) <= upper <= 3 * math.sqrt(3) * (1 + 1e-15)


def test_an_enclosure_sees_what_float64_rounds_away() -> None:
    # 1 + 2^-60 is not a float64: W = [1 + 2^-53·…] built so that float64's WᵀW rounds to 1
    w = np.array([[1.0 + 2.0**-52]])
    assert (w.T @ w)[0, 0] - 1.0 == pytest.approx(2.0**-51, rel=0.01)  # float64 sees 2^-51
    exact = 2.0**-51 + 2.0**-104  # (1 + 2^-52)² − 1
    assert exact <= rigorous.orthonormality_upper(w) <= exact * (1 + 1e-15)


def test_bounds_are_rounded_outward_to_float64() -> None:
    """1/3 is no float64: the nearest, ``float``'s answer, lies below it, so an upper bound
    must round up (and a lower one down); an exact float64 stays itself."""
    third = rigorous.ball(1.0) / 3
    assert not rigorous.ball(float(third.upper())) >= third  # the nearest is no upper bound
    up, down = rigorous.above(third), rigorous.below(third)
    assert rigorous.ball(up) >= third and rigorous.ball(down) <= third
    assert up == math.nextafter(down, math.inf)
    assert rigorous.above(rigorous.ball(0.5)) == rigorous.below(rigorous.ball(0.5)) == 0.5


def test_mean_square_and_relative_error_are_exact_for_exact_inputs() -> None:
    g = np.array([[3.0, 4.0]])
    ms = rigorous.mean_square(g)
    assert ms.contains(rigorous.ball(12.5)) and float(ms.rad()) == 0.0
    assert rigorous.relative_error_upper(5.5, rigorous.ball(5.0)) == pytest.approx(0.1, rel=1e-15)


@pytest.mark.parametrize(
    ("pid", "run"),
    [("REF-1", ref_adam.sqrt_v_enclosure), ("RA-3", ra3_conditioning.orthonormality_enclosure)],
)
def test_each_rigorous_check_passes_and_its_near_miss_fails(pid, run) -> None:
    good, bad = run(CTX, False), run(CTX, True)
    assert good.passed and good.residual < 0.2  # far inside the bound
    assert not bad.passed and 1.0 < bad.residual <= 100.0  # a near miss
    (check,) = [c for c in REGISTRY[pid].checks if c.run is run]
    assert check.kind == "rigorous" and check.control.startswith("near miss")


def test_gram_eigenvalues_and_defect_are_exact_for_exact_inputs() -> None:
    """W = [I; 0] and ξ = [0; diag(1, 2)] (tangent: Wᵀξ = 0): (W + ξ)ᵀ(W + ξ) = diag(2, 5)
    exactly, so its eigenvalues are enclosed as 2 and 5 and the Gram defect is 0; ξ + W (not
    tangent) has the defect 2‖I‖_F = 2√2."""
    w = np.eye(4, 2)
    xi = np.zeros((4, 2))
    xi[2, 0], xi[3, 1] = 1.0, 2.0
    low, high = rigorous.gram_eigenvalue_range(w, xi)
    assert 2.0 * (1 - 1e-15) <= low <= 2.0 and 5.0 <= high <= 5.0 * (1 + 1e-15)
    assert rigorous.gram_defect_upper(w, xi) == 0.0
    assert 2 * math.sqrt(2) <= rigorous.gram_defect_upper(w, xi + w) <= 2 * math.sqrt(2) * 1.001


@pytest.mark.parametrize(
    ("pid", "run", "control_at_least"),
    [
        ("RA-3", ra3_conditioning.defect_enclosure, 1e6),
        ("RA-3", ra3_conditioning.conditioning_enclosure, 1.0),
        ("GEO-stiefel", geo_retraction.exp_enclosure, 1e6),
    ],
)
def test_the_other_rigorous_checks_pass_and_their_controls_fail(pid, run, control_at_least) -> None:
    """The Gram defect, κ₂(W + ξ) and the exponential map, each registered as rigorous: passed
    with a residual below 1, the control failed beyond the given ratio (the uncapped rule, a
    near miss of κ, only just)."""
    good, bad = run(CTX, False), run(CTX, True)
    assert good.passed and good.residual < 1.0
    assert not bad.passed and bad.residual > control_at_least
    (check,) = [c for c in REGISTRY[pid].checks if c.run is run]
    assert check.kind == "rigorous" and check.unavailable is rigorous.unavailable
