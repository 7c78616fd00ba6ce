"""The statistical Entropic-Bound propositions EB-3, EB-4, EB-6 and EB-8.

``test_propositions.py`` runs every check at certificate seed 0; here the statistical checks run
at further certificate seeds, the exact binomial criterion (``binomial``) is checked against
sums computed here, and the registry is checked for what a statistical proposition must state:
its seeds, sample sizes, the probability it claims and the test that checks it.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from proofs_checks import REGISTRY
from proofs_checks.propositions import (
    binomial,
    eb_data,
    eb_native,
    eb_null,
    eb_recovery,
    eb_softmax,
)
from proofs_checks.registry import Context, run_check
from reference import capacity

STATISTICAL = ("EB-3", "EB-4", "EB-6", "EB-8")
MODULES = {"EB-3": eb_recovery, "EB-4": eb_data, "EB-6": eb_native, "EB-8": eb_softmax}
#: Checks that are not binomial tests of 100 replicates: EB-4's exact decisions and values on fixed
#: inputs, its Monte Carlo of the Gram's mean (a χ² criterion) and of the count's null law (an
#: exceedance count in standard deviations), and EB-6's deficiency (a theorem, checked on every
#: replicate).
DETERMINISTIC = (
    eb_data.domains,
    eb_data.estimator_forms,
    eb_data.gram_limit,
    eb_null.null_law,
    eb_native.deficiency,
)

CASES = [
    pytest.param(pid, i, seed, id=f"{pid}-{i}-seed{seed}")
    for pid in STATISTICAL
    for i, c in enumerate(REGISTRY[pid].checks)
    if c.kind == "float64"
    for seed in (4, 10)
]


@pytest.mark.slow
@pytest.mark.parametrize(("pid", "index", "seed"), CASES)
def test_statistical_check_passes_and_rejects_its_control_at_other_seeds(pid, index, seed):
    result = run_check(REGISTRY[pid].checks[index], Context(seed=seed, quick=False))
    assert result.outcome.passed, result.outcome.detail
    assert result.control_rejected, f"control not rejected: {result.control_outcome.detail}"


def test_the_eb_ids_are_registered_in_citation_order():
    eb = [i for i in REGISTRY if i.startswith("EB-")]
    assert eb == [f"EB-{k}" for k in range(1, 9)]


@pytest.mark.parametrize("pid", STATISTICAL)
def test_statistical_propositions_state_seeds_sizes_and_criterion(pid):
    p = REGISTRY[pid]
    module = MODULES[pid]
    assert module.REPLICATES == binomial.REPLICATES == 100
    assert "probability at least $0.9$" in p.statement and "binomial test" in p.statement
    assert "9 of 10" not in p.statement and "measured at" not in p.statement
    assert "default_rng" in p.seeds and "0…99" in p.seeds
    assert any(binomial.HYPOTHESIS in h for h in p.hypotheses)
    for c in p.checks:
        doc = " ".join(c.run.__doc__.split())
        if c.kind == "float64" and c.run not in DETERMINISTIC:
            assert "100" in doc and "binomial" in doc, c.name
        assert c.control


def _tail(k: int, p: Fraction, hits: range) -> Fraction:
    """P(Bin(k, p) ∈ hits), exactly."""
    return sum((math.comb(k, h) * p**h * (1 - p) ** (k - h) for h in hits), Fraction(0))


def test_the_binomial_thresholds_are_the_exact_tests():
    """h_min(100, 0.9, 0.05) = 96: P(X ≥ 96) ≤ 0.05 < P(X ≥ 95); h_max(100, 0.2, 0.05) = 13:
    P(X ≤ 13) ≤ 0.05 < P(X ≤ 14), summed here in exact rationals."""
    k, alpha = 100, Fraction(1, 20)
    need, most = binomial.min_hits(), binomial.max_hits()
    p0, p1 = Fraction(9, 10), Fraction(1, 5)
    assert _tail(k, p0, range(need, k + 1)) <= alpha < _tail(k, p0, range(need - 1, k + 1))
    assert _tail(k, p1, range(0, most + 1)) <= alpha < _tail(k, p1, range(0, most + 2))
    assert (need, most) == (96, 13)
    # the verdicts: 96 hits pass and 95 do not; 13 hits pass "at most" and 14 do not
    assert binomial.at_least(96, "x").passed and not binomial.at_least(95, "x").passed
    assert binomial.at_most(13, "x").passed and not binomial.at_most(14, "x").passed


def test_counts_are_the_residual_of_the_statistical_checks():
    """A statistical check reports the number of failing replicates against the number the
    test allows (100 − 96 = 4), so a control with 5 or more failing replicates is rejected."""
    count = next(c for c in REGISTRY["EB-4"].checks if c.run is eb_data.static_count)
    result = run_check(count, Context(seed=0))
    assert result.outcome.tolerance == 4.0
    assert result.outcome.residual <= 4.0 < result.control_outcome.residual


# -- EB-6 deficiency: NaN, divergence and the two-sided bound ----------------------------------
def test_deficiency_fails_when_a_trained_student_is_nan(monkeypatch):
    """Python's max(0.58, nan) is 0.58: the ratios are collected in one array and reduced with
    np.max, so a NaN student makes the residual NaN and the check fail."""
    real = eb_native.students
    bad = [3]  # the replicates made NaN

    def nan_students(seed, rank):
        k = real(seed, rank).copy()
        k[bad, 0, 0] = np.nan
        return k

    monkeypatch.setattr(eb_native, "students", nan_students)
    outcome = eb_native.deficiency(Context(seed=0), False)
    assert not outcome.passed and np.isnan(outcome.residual), outcome.detail
    # achievability counts a NaN replicate as a miss (NaN ≤ 1 is false): two fail the check
    bad[:] = [3, 7]
    assert eb_native.achievability(Context(seed=0), False).residual == 2.0


def test_deficiency_reports_a_diverging_trainer_naming_lr(monkeypatch):
    """A step far too large diverges: the trainer raises, naming lr, and the check does not pass
    (``run_check`` reports the crash; a crash never passes nor rejects a control)."""
    monkeypatch.setattr(eb_native, "LR", 50.0)
    result = run_check(REGISTRY["EB-6"].checks[1], Context(seed=0))
    assert not result.outcome.passed and result.outcome.crashed
    assert "diverged" in result.outcome.detail and "lr = 50" in result.outcome.detail


def test_deficiency_upper_bound_catches_a_too_small_eckart_young_value(monkeypatch):
    """EY_{r+1} in place of EY_r passes the lower bound alone; the upper bound for [K*]_r
    (ℰ_rel ≤ κ·EY_r) rejects it."""
    real = eb_native.eckart_young
    monkeypatch.setattr(eb_native, "eckart_young", lambda k, r: real(k, r + 1))
    outcome = eb_native.deficiency(Context(seed=0), False)
    assert not outcome.passed and "max (EY_r/κ)/ℰ_rel = 0." in outcome.detail, outcome.detail


def test_deficiency_tolerance_is_the_derived_rounding_allowance():
    outcome = eb_native.deficiency(Context(seed=0), False)
    assert 1.0 < outcome.tolerance <= 1.0 + 1e-11
    assert outcome.tolerance == 1.0 + eb_native.rounding_allowance(
        float(np.max(_kappa(eb_native.replicates(0)[2])))
    )


def _kappa(hess):
    lam = np.linalg.eigvalsh(hess)
    return lam[:, -1] / lam[:, 0]


def test_symbolic_check_catches_a_wrong_kronecker_order(monkeypatch):
    """The deficiency bounds hold for every PSD 𝓗', so a swapped Kronecker order in
    ``linear_qk_statistics`` is caught by the exact risk identity of the symbolic check."""
    real = capacity.linear_qk_statistics

    def swapped(x, y, w):
        st = real(x, y, w)
        d = st.b.shape[0]
        return st._replace(
            hess=st.hess.reshape(d, d, d, d).transpose(1, 0, 3, 2).reshape(d * d, -1)
        )

    monkeypatch.setattr(capacity, "linear_qk_statistics", swapped)
    assert not eb_native.symbolic_gradient(Context(seed=0), False).passed


# -- EB-4 and EB-8 certify the rule of ``rattn rank`` -----------------------------------------
def test_eb4_and_eb8_use_the_attention_gap_floor_of_rattn_rank(monkeypatch):
    calls = []
    real = capacity.attention_gap_floor

    def spy(s, noise, n):
        calls.append(n)
        return real(s, noise, n)

    monkeypatch.setattr(capacity, "attention_gap_floor", spy)
    assert eb_data.linear_pooled(Context(seed=0), False).passed
    assert calls == [eb_data.LQ_N] * eb_data.REPLICATES
    calls.clear()
    eb_softmax.estimates.__wrapped__(0, False)  # bypass the cache
    assert calls == [eb_softmax.N] * eb_softmax.REPLICATES
