"""The domains of the capacity estimators and task builders at their ends: each call of
``EDGES`` is at the end of a size or parameter range (accepted) or one step past it (refused
with ValueError), so an off-by-one in a domain test changes a decision.

The ends, as the functions' docstrings state them: S·d ≥ n for the static mixer's OLS; S > d
for the first-order softmax regression; n ≤ d_v and n ≤ d for the inversion estimator;
1 ≤ r ≤ d for a planted kernel, 0 ≤ r ≤ n for a planted mixer, r ≥ 0 for a student; every
size ≥ 1; τ ∈ [0, 1) and η ∈ (0, 1] for the thresholded ranks; p, dof ≥ 1 for the noise edges;
a student width in 1 … limit, steps ≥ 0 and init ≥ 0 for the trainers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference.capacity import pretraining, spectra, tasks, trainers


@dataclass(frozen=True)
class Edge:
    label: str
    module: Any
    function: str
    args: Callable[[np.random.Generator], tuple]
    refused: bool


def _xy(s: int, n: int, d: int, dv: int) -> Callable[[np.random.Generator], tuple]:
    return lambda rng: (rng.standard_normal((s, n, d)), rng.standard_normal((s, n, dv)))


def _inversion(s: int, n: int, d: int, dv: int) -> Callable[[np.random.Generator], tuple]:
    def args(rng: np.random.Generator) -> tuple:
        return (
            rng.standard_normal((s, n, d)),
            rng.uniform(0.1, 1.0, (s, n, dv)),
            tasks.orthonormal(d, dv, rng),
        )

    return args


def _student(rank: int) -> Callable[[np.random.Generator], tuple]:
    """A static student on 6 sequences of n = 3 tokens (d = d_v = 2): ranks 1 … n."""

    def args(rng: np.random.Generator) -> tuple:
        x, y = _xy(6, 3, 2, 2)(rng)
        return x, y, np.eye(2), rank, 2

    return args


#: A spectrum for the rank estimators' parameter ends.
SPECTRUM = np.array([1.0, 0.5, 0.1])

EDGES = [
    Edge("OLS mixer at S·d = n", pretraining, "ols_static_mixer", _xy(2, 4, 2, 2), False),
    Edge("OLS mixer at S·d = n − 1", pretraining, "ols_static_mixer", _xy(1, 3, 2, 2), True),
    Edge("first order at S = d + 1", pretraining, "first_order_softmax", _xy(3, 4, 2, 2), False),
    Edge("first order at S = d", pretraining, "first_order_softmax", _xy(2, 4, 2, 2), True),
    Edge(
        "inversion at n = d = d_v",
        pretraining,
        "inversion_estimator",
        _inversion(4, 3, 3, 3),
        False,
    ),
    Edge(
        "inversion at n = d_v + 1", pretraining, "inversion_estimator", _inversion(4, 4, 4, 3), True
    ),
    Edge(
        "inversion at n = d + 1", pretraining, "inversion_estimator", _inversion(4, 4, 3, 4), True
    ),
    Edge("kernel at r = d", tasks, "planted_kernel", lambda rng: (3, 3, rng), False),
    Edge("kernel at r = 1", tasks, "planted_kernel", lambda rng: (3, 1, rng), False),
    Edge("kernel at r = 0", tasks, "planted_kernel", lambda rng: (3, 0, rng), True),
    Edge("kernel at r = d + 1", tasks, "planted_kernel", lambda rng: (3, 4, rng), True),
    Edge("mixer at r = 0", tasks, "planted_mixer", lambda rng: (3, 0, rng), False),
    Edge("mixer at r = n", tasks, "planted_mixer", lambda rng: (3, 3, rng), False),
    Edge("mixer at r = n + 1", tasks, "planted_mixer", lambda rng: (3, 4, rng), True),
    Edge("mixer at r = −1", tasks, "planted_mixer", lambda rng: (3, -1, rng), True),
    Edge("spectrum at r = 0", tasks, "planted_spectrum", lambda rng: (0,), False),
    Edge("spectrum at r = −1", tasks, "planted_spectrum", lambda rng: (-1,), True),
    Edge("explicit spectrum ending in 0", tasks, "planted_spectrum", lambda rng: (2, [1, 0]), True),
    Edge("task of one token", tasks, "linear_qk_task", lambda rng: (1, 1, 1, 1, 1, rng), False),
    Edge("task of no sequence", tasks, "linear_qk_task", lambda rng: (0, 1, 1, 1, 1, rng), True),
    Edge("student rank 0", tasks, "truncated_mixer", lambda rng: (np.eye(3), 0), False),
    Edge("student rank −1", tasks, "truncated_mixer", lambda rng: (np.eye(3), -1), True),
    Edge(
        "deficiency at rank 0",
        tasks,
        "deficiency_bound",
        lambda rng: (np.eye(3), np.eye(2), 0),
        False,
    ),
    Edge(
        "deficiency at rank −1",
        tasks,
        "deficiency_bound",
        lambda rng: (np.eye(3), np.eye(2), -1),
        True,
    ),
    Edge(
        "population at n = 1",
        tasks,
        "pooled_population",
        lambda rng: (np.eye(2), np.eye(2), 1),
        False,
    ),
    Edge(
        "population at n = 0",
        tasks,
        "pooled_population",
        lambda rng: (np.eye(2), np.eye(2), 0),
        True,
    ),
    Edge("τ = 0", spectra, "numerical_rank", lambda rng: (SPECTRUM, 0.0), False),
    Edge("τ = 1", spectra, "numerical_rank", lambda rng: (SPECTRUM, 1.0), True),
    Edge("η = 1", spectra, "energy_threshold_rank", lambda rng: (SPECTRUM, 1.0), False),
    Edge("η = 0", spectra, "energy_threshold_rank", lambda rng: (SPECTRUM, 0.0), True),
    Edge(
        "gap floor at n = 1", spectra, "attention_gap_floor", lambda rng: (SPECTRUM, 0.0, 1), False
    ),
    Edge(
        "gap floor at n = 0", spectra, "attention_gap_floor", lambda rng: (SPECTRUM, 0.0, 0), True
    ),
    Edge("MP edge at p = dof = 1", spectra, "mp_edge", lambda rng: (1.0, 1, 1), False),
    Edge("MP edge at p = 0", spectra, "mp_edge", lambda rng: (1.0, 0, 1), True),
    Edge("MP edge at dof = 0", spectra, "mp_edge", lambda rng: (1.0, 1, 0), True),
    Edge("TW at p = dof = 1", spectra, "tracy_widom_threshold", lambda rng: (1.0, 1, 1), False),
    Edge("TW at dof = 0", spectra, "tracy_widom_threshold", lambda rng: (1.0, 1, 0), True),
    Edge("init of width 1, scale 0", trainers, "small_init", lambda rng: (1, 1, 0.0, rng), False),
    Edge("init of width 0", trainers, "small_init", lambda rng: (2, 0, 0.1, rng), True),
    Edge("student at width n", trainers, "train_static_student", _student(3), False),
    Edge("student at width 1", trainers, "train_static_student", _student(1), False),
    Edge("student at width n + 1", trainers, "train_static_student", _student(4), True),
    Edge("student at width 0", trainers, "train_static_student", _student(0), True),
]


def wrong_decisions(seed: int) -> list[str]:
    """The edges decided against ``EDGES`` (each called through its module's attribute, so a
    substituted function is the one called)."""
    rng = np.random.default_rng([seed, 11])
    wrong = []
    for edge in EDGES:
        try:
            getattr(edge.module, edge.function)(*edge.args(rng))
            refused = False
        except ValueError:
            refused = True
        if refused != edge.refused:
            wrong.append(edge.label)
    return wrong


def ols_refusing_its_end(original: Callable) -> Callable:
    """``ols_static_mixer`` that also refuses S·d = n (an off-by-one near miss: S·d ≤ n)."""

    def variant(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        s, n, d = np.shape(x)
        if s * d <= n:
            raise ValueError(f"Σ X Xᵀ is singular: needs S·d > n, got S·d = {s * d}, n = {n}")
        return original(x, y)

    return variant
