"""Statistical claims as probabilities, checked by an exact one-sided binomial test.

A statistical proposition states, at its configuration, P(event) ≥ p₀ for an estimator that
should succeed (or P(event) ≤ p₁ for one that should fail). Its check draws ``REPLICATES``
independent replicates and counts the hits h. "P ≥ p₀" passes when

    P(Bin(k, p₀) ≥ h) ≤ α,  i.e.  h ≥ h_min(k, p₀, α),

so that a true probability below p₀ passes with probability at most α; "P ≤ p₁" passes when
P(Bin(k, p₁) ≤ h) ≤ α (h ≤ h_max). At k = 100, p₀ = 0.9, α = 0.05: h_min = 96, and a true
probability of 0.99 passes with probability 0.997 (the checks measured no miss in 210 replicates
each before this criterion). The residual of a check is the number of misses, its tolerance
k − h_min (or the number of hits against h_max).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TypeVar

import numpy as np
from scipy.stats import binom

from proofs_checks.registry import Outcome

#: k, p₀ (claims of success), p₁ (claims of failure) and the level α of every statistical claim.
REPLICATES, P_SUCCESS, P_FAILURE, ALPHA = 100, 0.9, 0.2, 0.05


T = TypeVar("T")


def replicates(
    seed: int,
    tag: int,
    estimate: Callable[[np.random.Generator], T],
    under: AbstractContextManager | None = None,
    k: int = REPLICATES,
) -> list[T]:
    """``estimate(rng)`` on k independent replicates (``REPLICATES`` by default), rng =
    default_rng([seed, tag, i]) for i = 0…k − 1, inside ``under`` (a control's substitution)
    when given."""
    with under or contextlib.nullcontext():
        return [estimate(np.random.default_rng([seed, tag, i])) for i in range(k)]


def min_hits(k: int = REPLICATES, p0: float = P_SUCCESS, alpha: float = ALPHA) -> int:
    """The smallest h with P(Bin(k, p₀) ≥ h) ≤ α."""
    return next(h for h in range(k + 1) if binom.sf(h - 1, k, p0) <= alpha)


def max_hits(k: int = REPLICATES, p1: float = P_FAILURE, alpha: float = ALPHA) -> int:
    """The largest h with P(Bin(k, p₁) ≤ h) ≤ α."""
    return max(h for h in range(k + 1) if binom.cdf(h, k, p1) <= alpha)


def tally(values: Iterable[object]) -> str:
    """The values found with their counts, "3 ×98, 4 ×2" (100 replicates do not fit a list)."""
    return ", ".join(f"{v} ×{n}" for v, n in sorted(Counter(values).items(), key=str))


def at_least(hits: int, what: str, k: int = REPLICATES) -> Outcome:
    """ "P(hit) ≥ p₀" by the exact test: pass when hits ≥ h_min (residual: the misses)."""
    need = min_hits(k)
    return Outcome.bound(
        float(k - hits),
        float(k - need),
        f"{what}: {hits} of {k} replicates (P ≥ {P_SUCCESS:g} at level {ALPHA:g} needs ≥ {need})",
    )


def at_most(hits: int, what: str, k: int = REPLICATES, p1: float = P_FAILURE) -> Outcome:
    """ "P(hit) ≤ p₁" by the exact test: pass when hits ≤ h_max (residual: the hits)."""
    most = max_hits(k, p1)
    return Outcome.bound(
        float(hits),
        float(most),
        f"{what}: {hits} of {k} replicates (P ≤ {p1:g} at level {ALPHA:g} needs ≤ {most})",
    )


#: The sentence every statistical statement uses (LaTeX), and the hypothesis line.
CLAIM = (
    rf"with probability at least ${P_SUCCESS:g}$ (checked by a one-sided exact binomial test "
    rf"over ${REPLICATES}$ independent replicates at level ${ALPHA:g}$: at least "
    rf"${min_hits()}$ hits)"
)
FAILURE_CLAIM = (
    rf"with probability at most ${P_FAILURE:g}$ (the same test: at most ${max_hits()}$ hits of "
    rf"${REPLICATES}$)"
)
HYPOTHESIS = (
    f"a statistical claim: P ≥ {P_SUCCESS:g} (or P ≤ {P_FAILURE:g} for a failure), one-sided "
    f"exact binomial test over {REPLICATES} independent replicates at level {ALPHA:g}"
)
