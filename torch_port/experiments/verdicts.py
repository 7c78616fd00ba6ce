"""One rule for the verdict on a paper's claim, read from a paired interval over seeds.

The claim is about a paired difference Δ (the paper's arm minus its baseline, one value per
seed), in the direction ``sign`` (+1: the paper's arm is higher), with the paper's size
``paper`` when it gives one. The run gives a confidence interval [lo, hi] of the mean of Δ.
When m intervals are read together for one verdict, each is a (1 − 0.05/m) interval
(Bonferroni), so the chance that any of them misses its mean is at most 5%
(``bonferroni_level``).

| the interval                          | paper's task      | substitute task                 |
| ------------------------------------- | ----------------- | ------------------------------- |
| excludes 0 on the claim's side,       | reproduced        | reproduced on a substitute task |
|   holds ``paper``                     |                   |                                 |
| excludes 0 on the claim's side and    | sign reproduced,  | sign reproduced on a substitute |
|   ``paper``                           | size refuted      | task, not the size              |
| holds 0 and ``paper``                 | unresolved        | unresolved                      |
| holds 0, excludes ``paper``           | refuted           | not reproduced on a substitute  |
|                                       |                   | task                            |
| excludes 0 on the other side          | refuted           | reversed on a substitute task   |

A claim of direction only (``paper`` None) is reproduced when the interval excludes 0 on its
side, "not detected" when it holds 0 (an interval holding 0 cannot refute a direction), and
refuted (reversed) otherwise. A substitute task (other data, another model size) can fail to
show an effect without refuting the paper, so "refuted" is said only on the paper's own task.

A claim that an effect is absent (``absence_verdict``) is never reproduced by intervals that hold
0, which measure the run's power, not the absence: it is "not contradicted" while no interval
excludes 0 in the direction it denies, and refuted (on a substitute task: "contradicted on a
substitute task") when one does.
"""

from __future__ import annotations

import math

REPRODUCED = "reproduced"
SIGN_ONLY = "sign reproduced, size refuted"
UNRESOLVED = "unresolved"
NOT_DETECTED = "not detected"
REFUTED = "refuted"
ON_A_SUBSTITUTE = {
    REPRODUCED: "reproduced on a substitute task",
    SIGN_ONLY: "sign reproduced on a substitute task, not the size",
    UNRESOLVED: UNRESOLVED,
    NOT_DETECTED: "not detected on a substitute task",
}


def bonferroni_level(m: int, family: float = 0.05) -> float:
    """The level 1 − family/m of each of m intervals read together (family-wise error ≤
    ``family``)."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"the number of intervals read together must be an integer ≥ 1, got {m!r}")
    return 1 - family / m


def absence_verdict(
    intervals: list[tuple[float, float]], sign: int, paper_task: bool = True
) -> str:
    """The verdict on a claim that no difference lies in direction ``sign`` (±1), read from the
    intervals [low, high] of every difference it covers (each at the Bonferroni level of their
    number)."""
    if not intervals:
        raise ValueError("a claim of absence needs at least one interval")
    for low, high in intervals:
        _check(low, high, sign)
    if any(min(sign * low, sign * high) > 0 for low, high in intervals):
        return REFUTED if paper_task else "contradicted on a substitute task"
    return "not contradicted"


def _check(low: float, high: float, sign: int) -> None:
    """Refuse an interval that is not finite with low ≤ high, or a sign other than ±1."""
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"a verdict needs a finite interval low ≤ high, got [{low}, {high}]")
    if sign not in (-1, 1):
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")


def verdict(
    low: float,
    high: float,
    sign: int,
    paper: float | None = None,
    paper_task: bool = True,
) -> str:
    """The verdict of the module's table for the interval [low, high] of the mean paired
    difference, a claim in direction ``sign`` (±1) with the paper's size ``paper`` (None: a
    claim of direction only), on the paper's task or a substitute."""
    _check(low, high, sign)
    if paper is not None and (not math.isfinite(paper) or paper * sign <= 0):
        raise ValueError(f"the paper's value {paper!r} must be finite and on the claim's side")
    lo, hi = sorted((sign * low, sign * high))  # the claim's direction made positive
    size = None if paper is None else sign * paper
    if lo > 0:
        found = REPRODUCED if size is None or lo <= size <= hi else SIGN_ONLY
    elif hi < 0:
        return REFUTED if paper_task else "reversed on a substitute task"
    elif size is None:
        found = NOT_DETECTED
    elif size <= hi:
        found = UNRESOLVED
    else:
        return REFUTED if paper_task else "not reproduced on a substitute task"
    return found if paper_task else ON_A_SUBSTITUTE[found]
