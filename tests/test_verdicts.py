"""The verdict rule of docs/results.md, row by row of its table, and its refusals."""

from __future__ import annotations

import math

import pytest

from torch_port.experiments.verdicts import absence_verdict, bonferroni_level, verdict

#: (low, high, sign, paper, paper_task) -> verdict. Intervals chosen by hand around 0 and the
#: paper's value 8.98 (claim +) or -0.28 (claim -); the expected words are the table's.
ROWS = [
    # excludes 0 on the claim's side
    ((1.0, 10.0, +1, 8.98, True), "reproduced"),
    ((1.0, 10.0, +1, 8.98, False), "reproduced on a substitute task"),
    ((-10.0, -0.1, -1, -0.28, True), "reproduced"),
    ((1.0, 3.0, +1, 8.98, True), "sign reproduced, size refuted"),
    ((1.0, 3.0, +1, 8.98, False), "sign reproduced on a substitute task, not the size"),
    ((9.5, 12.0, +1, 8.98, True), "sign reproduced, size refuted"),  # larger than the paper's
    ((28.0, 165.0, +1, None, False), "reproduced on a substitute task"),
    ((1662.0, 4772.0, +1, None, True), "reproduced"),
    # holds 0
    ((-0.31, 9.0, +1, 8.98, True), "unresolved"),
    ((-0.31, 9.0, +1, 8.98, False), "unresolved"),
    ((-0.31, 1.57, +1, 8.98, True), "refuted"),
    ((-0.31, 1.57, +1, 8.98, False), "not reproduced on a substitute task"),
    ((-1.0, 1.0, -1, -0.28, False), "unresolved"),
    ((-0.2, 1.0, -1, -0.28, True), "refuted"),
    ((-41.0, 308.0, +1, None, True), "not detected"),
    ((-41.0, 308.0, +1, None, False), "not detected on a substitute task"),
    ((0.0, 2.0, +1, None, True), "not detected"),  # an end point at 0 is held
    # excludes 0 on the other side
    ((-3.0, -1.0, +1, 8.98, True), "refuted"),
    ((-3.0, -1.0, +1, 8.98, False), "reversed on a substitute task"),
    ((-3.0, -1.0, +1, None, True), "refuted"),
    ((0.5, 2.0, -1, -0.28, False), "reversed on a substitute task"),
]


@pytest.mark.parametrize(
    ("args", "expected"), ROWS, ids=[f"{r[1]}-{i}" for i, r in enumerate(ROWS)]
)
def test_each_row_of_the_rule(args: tuple, expected: str) -> None:
    assert verdict(*args) == expected


def test_the_direction_flips_with_the_sign() -> None:
    """A claim read as b − a or as a − b gets the same verdict."""
    for (low, high, sign, paper, task), _ in ROWS:
        flipped = None if paper is None else -paper
        assert verdict(-high, -low, -sign, flipped, task) == verdict(low, high, sign, paper, task)


@pytest.mark.parametrize(
    ("m", "level", "t_quantile"),
    # t quantiles of 1 - (1 - level)/2 at 5 degrees of freedom, from a table (Student, 1925)
    [(1, 0.95, 2.5706), (2, 0.975, 3.1634), (5, 0.99, 4.0321)],
)
def test_bonferroni_levels(m: int, level: float, t_quantile: float) -> None:
    from scipy import stats

    assert bonferroni_level(m) == pytest.approx(level, abs=1e-15)
    assert stats.t.ppf(0.5 + bonferroni_level(m) / 2, 5) == pytest.approx(t_quantile, abs=1e-4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((math.nan, 1.0, 1), "finite interval"),
        ((2.0, 1.0, 1), "low ≤ high"),
        ((0.0, math.inf, 1), "finite interval"),
        ((0.0, 1.0, 0), "sign must be"),
        ((0.0, 1.0, 1, -8.98), "on the claim's side"),
        ((0.0, 1.0, 1, math.nan), "must be finite"),
    ],
)
def test_bad_input_is_refused(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verdict(*args)


@pytest.mark.parametrize("m", [0, -1, 1.5, True])
def test_a_bad_count_of_intervals_is_refused(m: object) -> None:
    with pytest.raises(ValueError, match="integer ≥ 1"):
        bonferroni_level(m)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("intervals", "sign", "paper_task", "expected"),
    [
        ([(-0.2, 0.3), (-2.7, 2.8)], -1, True, "not contradicted"),  # holds 0: power, not proof
        ([(-0.2, 0.3), (0.03, 0.07)], -1, True, "not contradicted"),  # excludes 0 the other way
        ([(-0.2, 0.3), (-0.07, -0.03)], -1, True, "refuted"),
        ([(-0.2, 0.3), (-0.07, -0.03)], -1, False, "contradicted on a substitute task"),
        ([(0.01, 0.2)], +1, False, "contradicted on a substitute task"),
    ],
)
def test_a_claim_of_absence(intervals: list, sign: int, paper_task: bool, expected: str) -> None:
    assert absence_verdict(intervals, sign, paper_task) == expected


def test_a_claim_of_absence_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one interval"):
        absence_verdict([], -1)
    with pytest.raises(ValueError, match="finite interval"):
        absence_verdict([(0.0, math.nan)], -1)
    with pytest.raises(ValueError, match="sign must be"):
        absence_verdict([(0.0, 1.0)], 2)
