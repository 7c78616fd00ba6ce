"""EB-4's estimator check: the transcriptions of ``spectrum_forms`` reproduce the worked values
that the estimators' docstrings state, every estimator is really compared (a variant of any one
of them is caught), and the cases cover the claimed domain."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from proofs_checks import spectrum_forms as sf
from proofs_checks.harness import substituted
from reference import capacity
from reference.capacity import spectra

EXAMPLE = np.array([3.0, 2.5, 2.0, 1.5])


def test_the_transcriptions_give_the_docstrings_worked_values() -> None:
    assert round(float(sf.entropy_rank(EXAMPLE, 2)[0]), 3) == 3.571
    assert round(float(sf.entropy_rank(EXAMPLE, 1)[0]), 3) == 3.876
    tail = np.concatenate([EXAMPLE, np.full(20, 0.008)])
    assert round(float(sf.entropy_rank(tail, 1)[0]), 3) == 4.356
    assert abs(float(sf.entropy_rank(tail, 2)[0] - sf.entropy_rank(EXAMPLE, 2)[0])) < 0.01
    assert sf.stable_rank(EXAMPLE) == Fraction(43, 18)  # 21.5/9
    floored = np.array([1.0, 0.2, 0.1, 0.001])  # values below 0.05 must not make a gap
    assert sf.largest_gap_rank(floored, 0.05) == 1
    assert sf.largest_gap_rank(floored, 0.0) == 3 == sf.unfloored_gap(floored, 0.05)
    assert sf.largest_gap_rank(np.array([1.0, 0.5, 0.0]), 0.0) == 2  # exact rank 2
    assert [sf.energy_threshold_rank(np.ones(r), 0.9) for r in (1, 10, 20)] == [1, 9, 18]
    assert sf.energy_threshold_rank(np.ones(100), 0.99) == 99


def test_the_library_reads_the_same_tracy_widom_table() -> None:
    assert spectra.TRACY_WIDOM_1 == sf.TW1_QUANTILES


def test_the_library_agrees_with_every_transcription() -> None:
    found = list(sf.comparisons(0))
    assert [c.label for c in found if c.wrong] == []
    assert 0.0 < max(c.ratio for c in found) <= 1.0


def _off(name: str):
    """A variant of ``capacity.name`` wrong by little: an integer one too large, a real (or
    the token Gram) one part in 10⁹ too large, ``estimate_all`` with one value one too large, a
    token-Gram count one too large, a student's reported risk one part in 10⁹ too large."""
    original = getattr(capacity, name)

    def variant(*args, **kwargs):
        value = original(*args, **kwargs)
        if isinstance(value, dict):
            return {**value, "largest_gap_rank": value["largest_gap_rank"] + 1}
        if isinstance(value, capacity.GramCount):
            return value._replace(rank=value.rank + 1)
        if isinstance(value, capacity.StudentFit):
            return value._replace(loss=value.loss * (1 + 1e-9))
        return value + 1 if isinstance(value, int) else value * (1 + 1e-9)

    return variant


@pytest.mark.parametrize(
    "name",
    [
        "numerical_rank",
        "energy_threshold_rank",
        "largest_gap_rank",
        "stable_rank",
        "energy_effective_rank",
        "roy_vetterli_rank",
        "attention_gap_floor",
        "estimate_all",
        "mp_edge",
        "tracy_widom_threshold",
        "token_gram",
        "token_gram_count",
        "train_static_student",
        "train_linear_qk_student",
        "linear_attention_mixing",
        "softmax_attention_mixing",
        "planted_spectrum",
    ],
)
def test_a_variant_of_any_estimator_is_caught(name: str) -> None:
    with substituted(capacity, name, _off(name)):
        wrong = [c.label for c in sf.comparisons(0) if c.wrong]
    assert wrong, name


def test_a_real_value_twice_its_bound_off_is_rejected_and_the_bounds_are_tight() -> None:
    bound = sf.gamma(2 * 64 + 12) * 2
    assert not sf._real("x", 1.0 + bound / 2, 1.0, bound).wrong
    assert sf._real("x", 1.0 + 2 * bound, 1.0, bound).wrong
    assert sf._real("exact", np.nextafter(1.0, 2.0), 1.0, 0.0).wrong  # a zero bound: bit for bit
    assert sf._real("not a number", float("nan"), 1.0, 1.0).wrong  # never within a bound
    assert bound < 1e-13  # the claim is about the last digits, not a loose agreement


def test_a_softmax_that_overflows_is_caught() -> None:
    """The row maximum added instead of subtracted: at logits ~1e3 exp overflows and the
    entries are NaN, which the comparison must count as wrong (NaN > 1 is false): it counts
    a value that is not finite as infinitely far."""

    def shifted_up(x, k, beta=1.0):
        logits = beta * (x @ k @ np.swapaxes(x, -1, -2)) / np.sqrt(x.shape[-1])
        e = np.exp(logits + logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    for seed in range(4):
        with (
            substituted(capacity, "softmax_attention_mixing", shifted_up),
            np.errstate(over="ignore", invalid="ignore"),
        ):
            wrong = [c.label for c in sf.task_comparisons(seed) if c.wrong]
        assert len(wrong) == 1 and wrong[0].endswith("inf of its bound"), wrong
        assert wrong[0].startswith("softmax mixing at (S, n, d, β) = (2, 4, 3, ")


def test_the_count_is_transcribed_as_a_sequential_test() -> None:
    """On eigenvalues (1, 0.5, 0.2, 0.1 × 13) at N = 10,000 the count passes λ₁, λ₂ and λ₃
    (each far above c_k·mean of the smaller ones, c_k ≈ 1.05) and stops at the first 0.1,
    which equals the mean of the rest: k = 3, noise 0.1, and the threshold c_3·0.1 it failed."""
    lam = [1.0, 0.5, 0.2] + [0.1] * 13
    k, noise, last, thresholds = sf.gram_count(lam, 10_000, 0.99)
    c3 = spectra.largest_root_quantile(13, 10_000 - 3, 0.99)
    assert k == 3 and noise == pytest.approx(0.1) and last == thresholds[-1]
    assert last == pytest.approx(0.1 * c3)
    assert len(thresholds) == 4 and thresholds[0] > thresholds[3]  # λ₁ faced the largest mean


def test_the_cases_cover_the_claimed_domain() -> None:
    cases = sf.spectra(0)
    sizes = {s.size for _, s, _ in cases}
    assert {1, 64, 100} <= sizes
    tops = [float(s.max()) for _, s, _ in cases if s.size and s.max() > 0]
    assert min(tops) < 1e-150 and max(tops) > 1e150
    assert any(f > 0 for _, _, f in cases) and any(f == 0 for _, _, f in cases)
    assert any(np.any(np.diff(s) > 0) for _, s, _ in cases)  # an unsorted input
    assert any(np.any(s == 0) and s.max() > 0 for _, s, _ in cases)  # exact rank with zeros
    assert sf.spectra(0)[-1][1].tolist() != sf.spectra(1)[-1][1].tolist()  # seeded
