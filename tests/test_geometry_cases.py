"""The validity cases of ``proofs_checks.geometry_cases`` sit where they say (measured here
independently of the validators), and the checks built on them resolve their 1% margins: a
threshold moved by 2%, or a port method off by a sign, is rejected."""

from __future__ import annotations

import re

import numpy as np
import pytest

import reference as ref
from proofs_checks import REGISTRY
from proofs_checks import geometry_cases as cases
from proofs_checks.harness import substituted
from proofs_checks.registry import Context
from reference.linalg import orthonormality_residual

CTX = Context(seed=0, quick=True)
U = float(np.finfo(np.float64).eps) / 2


def _measured(name: str, label: str, point) -> float:
    """The case's quantity over its threshold, measured with NumPy's SVD."""
    atol, r = np.sqrt(2 * U), cases.SIZES[2]
    if label.startswith("frame"):
        return orthonormality_residual(point) / atol
    if label.startswith("factor"):
        return orthonormality_residual(point[int(label.split()[1])]) / atol
    if label.startswith("S "):
        s = np.linalg.svd(point[1], compute_uv=False)
        return s[-1] / s[0] / (r * 2 * U)
    ka, kb = (np.linalg.cond(f) for f in point)
    return (ka * kb) ** 2 * U / 1e-8


@pytest.mark.parametrize("name", ["stiefel", *cases.ORTHONORMAL])
def test_each_case_sits_at_its_stated_multiple_of_the_threshold(name) -> None:
    rng = np.random.default_rng(3)
    geo = ref.Stiefel(*cases.STIEFEL) if name == "stiefel" else ref.GEOMETRIES[name](*cases.SIZES)
    found = cases.validity_cases(name, geo.random_point(rng), rng)
    assert len(found) >= 3, "the point as drawn and a case on each side of a threshold"
    for case in found[1:]:
        k = float(re.search(r"(0\.99|1\.01)", case.label).group(1))
        # O(σ) ≈ 1e-8 relative terms and ulps: far inside the 1% margin (module docstring)
        assert _measured(name, case.label, case.point) == pytest.approx(k, rel=1e-6), case.label
        assert case.refused == (k > 1 if "S with" not in case.label else k < 1)


@pytest.mark.parametrize(
    "proposition", ["GEO-fixed_rank_embedded", "GEO-partial_isometry_quotient"]
)
def test_a_tolerance_two_percent_too_loose_is_rejected(proposition) -> None:
    check = next(c for c in REGISTRY[proposition].checks if "stated thresholds" in c.name)
    assert check.run(CTX, False).passed
    for module in (ref.fixed_rank, ref.partial_isometry):
        with substituted(module, "DEFAULT_ATOL", 1.02 * ref.stiefel.DEFAULT_ATOL):
            if not check.run(CTX, False).passed:
                return
    raise AssertionError("a 2% looser atol passed the validation check")


def test_r2s_conditioning_limit_two_percent_too_loose_is_rejected() -> None:
    check = next(c for c in REGISTRY["GEO-fixed_rank_quotient"].checks if "stated" in c.name)
    with substituted(ref.fixed_rank, "CONDITION_LIMIT", 1.02e-8):
        assert not check.run(CTX, False).passed


def test_a_port_vertical_vector_with_its_sign_dropped_is_rejected() -> None:
    """R2's vertical vectors are (AΩ, −BΩᵀ); with the minus dropped, PORT-5's method check
    fails (the check's ratio is far above 1, not at it)."""
    pytest.importorskip("torch")
    from torch_port import fixed_rank

    check = REGISTRY["PORT-5"].checks[0]
    honest = check.run(CTX, False)
    assert honest.passed

    def unsigned(self, x, omega):
        return x[0] @ omega.to(x[0].dtype), x[1] @ omega.to(x[1].dtype).transpose(-2, -1)

    with substituted(fixed_rank.FixedRankQuotient, "vertical", unsigned):
        outcome = check.run(CTX, False)
    assert not outcome.passed and outcome.residual > 1e6, outcome.detail
    assert "vertical" in outcome.detail


def _tangent_defect(name: str, x, u) -> float:
    """What ``check_tangent`` measures, over atol·max(1, ‖ξ‖), computed here with NumPy."""
    sym = lambda a: (a + a.T) / 2  # noqa: E731
    atol = np.sqrt(2 * U)
    if name == "stiefel":
        return np.linalg.norm(2 * sym(x.T @ u)) / (atol * max(1.0, np.linalg.norm(u)))
    size = np.sqrt(sum(np.sum(p**2) for p in u))
    if name == "partial_isometry_embedded":
        return np.linalg.norm(u[0] + u[0].T) / (atol * max(1.0, size))
    if name == "partial_isometry_quotient":
        return np.linalg.norm(sym(x[0].T @ u[0])) / (atol * max(1.0, size))
    return np.linalg.norm(2 * sym(x[0].T @ u[0])) / (atol * max(1.0, np.linalg.norm(u[0])))


@pytest.mark.parametrize("name", cases.TANGENT_CHECKED)
def test_each_tangent_case_sits_at_its_stated_multiple(name) -> None:
    rng = np.random.default_rng(4)
    geo = ref.Stiefel(*cases.STIEFEL) if name == "stiefel" else ref.GEOMETRIES[name](*cases.SIZES)
    x = geo.random_point(rng)
    found = cases.tangent_cases(name, geo, x, rng)
    assert len(found) == len(cases.MARGINS) * len(cases.TANGENT_NORMS)
    for case in found:
        k = float(re.search(r"(0\.99|1\.01)", case.label).group(1))
        assert _tangent_defect(name, x, case.tangent) == pytest.approx(k, rel=1e-6), case.label
        assert case.refused == (k > 1)
