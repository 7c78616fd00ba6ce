"""The rigorous checks' ball arithmetic: enclosures that contain the exact value, and the two
checks that use them, with their near misses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proofs_checks import rigorous
from proofs_checks.propositions import ra3_conditioning, ref_adam
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
    (check,) = [c for c in REGISTRY[pid].checks if c.kind == "rigorous"]
    assert check.run is run and check.control.startswith("near miss")
