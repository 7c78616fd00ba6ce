"""The validity cases of ``proofs_checks.geometry_cases`` sit where they say (measured here in
mpmath on the stored arrays, independently of the validators), within far less than their 1e-6
margins, and the checks built on them resolve those margins: a threshold moved by 0.5%, or a
port method off by a sign, is rejected."""

from __future__ import annotations

import re

import mpmath
import numpy as np
import pytest

import reference as ref
from proofs_checks import REGISTRY
from proofs_checks import geometry_cases as cases
from proofs_checks.harness import substituted
from proofs_checks.registry import Context

CTX = Context(seed=0, quick=True)
U = float(np.finfo(np.float64).eps) / 2
#: How far (relative) a case's exact quantity may sit from its stated multiple (measured: at
#: most 6e-8 over 40 seeds, the drawn point's own residual ~1e-15 against atol = 1.5e-8): the
#: case then sits ≥ 8e-7 from its threshold, five times the validators' own rounding (≤ 1.6e-7
#: of a threshold, module docstring of ``geometry_cases``), so every validator decides it.
EXACT = 2e-7
SEEDS = range(8)


def _mp(a) -> mpmath.matrix:
    return mpmath.matrix(np.asarray(a, dtype=float).tolist())


def _norm(m: mpmath.matrix) -> mpmath.mpf:
    return mpmath.mnorm(m, "f")


def _residual(f) -> mpmath.mpf:
    """‖FᵀF − I‖ in mpmath on the stored F."""
    m = _mp(f)
    return _norm(m.T * m - mpmath.eye(m.cols))


def _sv_ratio(a) -> mpmath.mpf:
    s = mpmath.svd_r(_mp(a), compute_uv=False)
    return min(s) / max(s)


def _multiple(label: str) -> float:
    return float(re.search(r"(0\.999999|1\.000001)", label).group(1))


def _measured(name: str, label: str, point) -> mpmath.mpf:
    """The case's quantity over its threshold, in mpmath at 40 digits."""
    atol, r = mpmath.sqrt(2 * U), cases.SIZES[2]
    if label.startswith("frame"):
        return _residual(point) / atol
    if label.startswith("factor"):
        return _residual(point[int(label.split()[1])]) / atol
    if label.startswith("S "):
        return _sv_ratio(point[1]) / (r * 2 * U)
    ka, kb = (1 / _sv_ratio(f) for f in point)
    return (ka * kb) ** 2 * U / mpmath.mpf(1e-8)


@pytest.mark.parametrize("name", ["stiefel", *cases.ORTHONORMAL])
def test_each_case_sits_at_its_stated_multiple_of_the_threshold(name) -> None:
    geo = ref.Stiefel(*cases.STIEFEL) if name == "stiefel" else ref.GEOMETRIES[name](*cases.SIZES)
    with mpmath.workdps(40):
        for seed in SEEDS:
            rng = np.random.default_rng(seed)
            found = cases.validity_cases(name, geo.random_point(rng), rng)
            assert len(found) >= 3, "the point as drawn and a case on each side of a threshold"
            for case in found[1:]:
                k = _multiple(case.label)
                off = abs(_measured(name, case.label, case.point) / k - 1)
                assert off <= EXACT, (seed, case.label, float(off))
                assert case.refused == (k > 1 if "S with" not in case.label else k < 1)


@pytest.mark.parametrize(
    "proposition", ["GEO-fixed_rank_embedded", "GEO-partial_isometry_quotient"]
)
def test_a_tolerance_half_a_percent_off_is_rejected(proposition) -> None:
    check = next(c for c in REGISTRY[proposition].checks if "stated thresholds" in c.name)
    assert check.run(CTX, False).passed
    for factor in (1.005, 0.995):
        with substituted(ref.fixed_rank, "DEFAULT_ATOL", factor * ref.stiefel.DEFAULT_ATOL):
            with substituted(ref.partial_isometry, "DEFAULT_ATOL", factor * cases.ATOL):
                assert not check.run(CTX, False).passed, factor


@pytest.mark.parametrize("factor", [1.005, 0.995])
def test_r2s_conditioning_limit_half_a_percent_off_is_rejected(factor) -> None:
    check = next(c for c in REGISTRY["GEO-fixed_rank_quotient"].checks if "stated" in c.name)
    with substituted(ref.fixed_rank, "CONDITION_LIMIT", factor * 1e-8):
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


def _tangent_defect(name: str, x, u) -> mpmath.mpf:
    """What ``check_tangent`` measures, over atol·max(1, ‖ξ‖), in mpmath at 40 digits."""

    def sym(a):
        return (a + a.T) / 2

    atol = mpmath.sqrt(2 * U)
    if name == "stiefel":
        w, v = _mp(x), _mp(u)
        return _norm(2 * sym(w.T * v)) / (atol * max(1, _norm(v)))
    size = mpmath.sqrt(sum(_norm(_mp(p)) ** 2 for p in u))
    if name == "partial_isometry_embedded":
        om = _mp(u[0])
        return _norm(om + om.T) / (atol * max(1, size))
    w, v = _mp(x[0]), _mp(u[0])
    if name == "partial_isometry_quotient":
        return _norm(sym(w.T * v)) / (atol * max(1, size))
    return _norm(2 * sym(w.T * v)) / (atol * max(1, _norm(v)))


@pytest.mark.parametrize("name", cases.TANGENT_CHECKED)
def test_each_tangent_case_sits_at_its_stated_multiple(name) -> None:
    geo = ref.Stiefel(*cases.STIEFEL) if name == "stiefel" else ref.GEOMETRIES[name](*cases.SIZES)
    with mpmath.workdps(40):
        for seed in SEEDS:
            rng = np.random.default_rng([seed, 4])
            x = geo.random_point(rng)
            found = cases.tangent_cases(name, geo, x, rng)
            assert len(found) == len(cases.MARGINS) * len(cases.TANGENT_NORMS)
            for case in found:
                k = _multiple(case.label)
                off = abs(_tangent_defect(name, x, case.tangent) / k - 1)
                assert off <= EXACT, (seed, case.label, float(off))
                assert case.refused == (k > 1)


@pytest.mark.parametrize("proposition", ["PORT-5", "GEO-fixed_rank_embedded"])
def test_validation_decides_at_the_thresholds_not_a_percent_away(proposition, monkeypatch) -> None:
    """The validation check's control moves each threshold by ±0.5% and every such near miss
    changes a decision (the control is rejected); with the cases at 0.99 and 1.01 of their
    thresholds instead, the same near misses all go unnoticed (the control passes)."""
    if proposition == "PORT-5":
        pytest.importorskip("torch")
    check = next(c for c in REGISTRY[proposition].checks if "stated thresholds" in c.name)
    assert check.run(CTX, False).passed
    control = check.run(CTX, True)
    assert not control.passed and control.residual >= 1, control.detail
    monkeypatch.setattr(cases, "MARGINS", (0.99, 1.01))
    assert check.run(CTX, False).passed
    control = check.run(CTX, True)
    assert control.passed and control.residual == 0, control.detail
