"""The domains of the capacity estimators and task builders at their ends: each call of
``EDGES`` is at the end of a size or parameter range (accepted) or one step past it (refused
with ValueError), so an off-by-one in a domain test changes a decision.

The ends, as the functions' docstrings state them: S·d ≥ n for the static mixer's OLS; S > d
for the first-order softmax regression; n ≤ d_v and n ≤ d for the inversion estimator;
1 ≤ r ≤ d for a planted kernel, 0 ≤ r ≤ n for a planted mixer, r ≥ 0 for a student; every
size ≥ 1 and a task's noise ≥ 0; τ ∈ [0, 1) and η ∈ (0, 1] for the thresholded ranks; p,
dof ≥ 1 for the noise edges; a student width in 1 … limit, steps ≥ 0, lr > 0 and init ≥ 0
for the trainers; an inversion floor > 0 and a symmetric token covariance (to n·ε·max|C|). A
refusal that names a measured value (a size, a ratio of singular values or eigenvalues, a
rank, the step at which descent diverged) names the value of the constructed input.

And the defaults (``DEFAULTS``, the table of docs/entropic_bound.md written again here): each
function that has defaults, called without them, returns what it returns with the documented
values passed explicitly (the same random draws, bitwise), so a default moved in the library
changes a result.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference.capacity import largest_root, pretraining, spectra, tasks, trainers


@dataclass(frozen=True)
class Edge:
    """One call at a domain's end; ``says``: a pattern that the refusal's message must contain
    (the measured value it names, derived from the call's constructed input)."""

    label: str
    module: Any
    function: str
    args: Callable[[np.random.Generator], tuple]
    refused: bool
    says: str = ""


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


def _diagonal_tokens(*values: float, copies: int = 1) -> np.ndarray:
    """``copies`` sequences whose n×n token matrix is diag(values): its singular values are the
    values exactly, and their Gram's eigenvalues ``copies`` times their squares (one sequence
    alone has leverage 1: its leave-one-out error is undefined)."""
    return np.repeat(np.diag(values)[None], copies, axis=0)


def _student(rank: int) -> Callable[[np.random.Generator], tuple]:
    """A static student on 6 sequences of n = 3 tokens (d = d_v = 2): ranks 1 … n."""

    def args(rng: np.random.Generator) -> tuple:
        x, y = _xy(6, 3, 2, 2)(rng)
        return x, y, np.eye(2), rank, 2

    return args


def _descent(steps: int, lr: float = 1.0) -> tuple:
    """Factorised GD on 2×1 factors of ones with an infinite gradient: the first step's
    factors are non-finite."""
    return (lambda m: np.full_like(m, np.inf), np.ones((2, 1)), np.ones((2, 1)), lr, steps)


#: A spectrum for the rank estimators' parameter ends.
SPECTRUM = np.array([1.0, 0.5, 0.1])
#: A spectrum whose ranks move with their defaults: 1.5e-3 lies between τ = 1e-3 and 2e-3.
SENSITIVE = np.array([1.0, 0.5, 0.1, 0.0015, 0.0012])

EDGES = [
    Edge("OLS mixer at S·d = n", pretraining, "ols_static_mixer", _xy(2, 4, 2, 2), False),
    Edge(
        "OLS mixer at S·d = n − 1",
        pretraining,
        "ols_static_mixer",
        _xy(1, 3, 2, 2),
        True,
        "S·d = 2 < n = 3",
    ),
    Edge(
        "pooled OLS of one feature",
        pretraining,
        "pooled_regression",
        _xy(2, 3, 1, 2),
        False,
    ),
    Edge(
        "pooled OLS of one feature, zero tokens",
        pretraining,
        "pooled_regression",
        lambda rng: (np.zeros((2, 3, 1)), rng.standard_normal((2, 3, 2))),
        True,
        r"= 0\.00e\+00 for 1 features",
    ),
    Edge(  # λ_min/λ_max = 1e-14, above 3ε; each sequence's leverage 1/2
        "pooled OLS of Gram eigenvalues 2e-8, 2e-4, 2e6",
        pretraining,
        "pooled_regression",
        lambda rng: (_diagonal_tokens(1e-4, 1e-2, 1e3, copies=2), rng.standard_normal((2, 3, 2))),
        False,
    ),
    Edge(  # λ_min/λ_max = 1e-20, below 3ε
        "pooled OLS of Gram eigenvalues 2e-14, 2e-4, 2e6",
        pretraining,
        "pooled_regression",
        lambda rng: (_diagonal_tokens(1e-7, 1e-2, 1e3, copies=2), rng.standard_normal((2, 3, 2))),
        True,
        r"λ_min/λ_max of Σ z zᵀ = 1\.00e-20 for 3 features",
    ),
    Edge("pooled OLS at (S − 1)·n = d", pretraining, "pooled_regression", _xy(3, 1, 2, 2), False),
    Edge(
        "pooled OLS at (S − 1)·n = d − 1",
        pretraining,
        "pooled_regression",
        _xy(2, 1, 2, 2),
        True,
        r"sequence \d has leverage 1 .*other 1 sequences' tokens do not span the 2 features",
    ),
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
    Edge(
        "inversion at n = d_v + 2",
        pretraining,
        "inversion_estimator",
        _inversion(4, 4, 4, 2),
        True,
        "modulo a 8-dimensional set",
    ),
    Edge(
        "inversion with floor 0",
        pretraining,
        "inversion_estimator",
        lambda rng: (*_inversion(4, 3, 3, 3)(rng), 1.0, 0.0),
        True,
    ),
    Edge(
        "inversion of X_s W_V = diag(2, 1, 2⁻⁶⁰)",
        pretraining,
        "inversion_estimator",
        lambda rng: (
            _diagonal_tokens(2.0, 1.0, 2.0**-60),
            rng.uniform(0.1, 1, (1, 3, 3)),
            np.eye(3),
        ),
        True,
        r"σ_min/σ_max = 4\.34e-19",
    ),
    Edge(  # the centred tokens of one sequence have rank n − 1: a design of rank n(n − 1)
        "inversion of one sequence of n = d = 3",
        pretraining,
        "inversion_estimator",
        _inversion(1, 3, 3, 3),
        True,
        r"rank 6 < d² = 9 \(S·n\(n − 1\) = 6 equations\)",
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
    Edge(
        "explicit spectrum of 3 ending in 0",
        tasks,
        "planted_spectrum",
        lambda rng: (3, [1, 0.5, 0]),
        True,
    ),
    Edge(
        "covariance asymmetric by 1",
        tasks,
        "cholesky",
        lambda rng: (np.array([[2.0, 1.0], [0.0, 2.0]]), 2),
        True,
        "symmetric",
    ),
    Edge(  # the asymmetry, 1e-10 (1.2e-10 once rounded), is within n·ε·max|C| = 4.4e-10
        "covariance of scale 1e6 asymmetric by 1e-10",
        tasks,
        "cholesky",
        lambda rng: (np.array([[1e6, 3e5 + 1e-10], [3e5, 1e6]]), 2),
        False,
    ),
    Edge(  # and 6e-10 (5.8e-10 once rounded) is beyond it
        "covariance of scale 1e6 asymmetric by 6e-10",
        tasks,
        "cholesky",
        lambda rng: (np.array([[1e6, 3e5 + 6e-10], [3e5, 1e6]]), 2),
        True,
        "symmetric",
    ),
    Edge("task of one token", tasks, "linear_qk_task", lambda rng: (1, 1, 1, 1, 1, rng), False),
    Edge("task without noise", tasks, "static_task", lambda rng: (2, 2, 2, 2, 1, rng, 0.0), False),
    Edge(
        "task of noise −1e-3", tasks, "static_task", lambda rng: (2, 2, 2, 2, 1, rng, -1e-3), True
    ),
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
    Edge("null law at p = dof = 2", spectra, "largest_root_quantile", lambda rng: (2, 2), False),
    Edge(
        "null law at dof = p − 1",
        spectra,
        "largest_root_quantile",
        lambda rng: (3, 2),
        True,
        "dof = 2",
    ),
    Edge(
        "count at S·d_v = n",
        spectra,
        "token_gram_count",
        lambda rng: (rng.standard_normal((4, 8, 2)),),
        False,
    ),
    Edge(
        "count at S·d_v = n − 1",
        spectra,
        "token_gram_count",
        lambda rng: (rng.standard_normal((7, 8, 1)),),
        True,
        "S·d_v = 7, n = 8",
    ),
    Edge("init of width 1, scale 0", trainers, "small_init", lambda rng: (1, 1, 0.0, rng), False),
    Edge("init of width 0", trainers, "small_init", lambda rng: (2, 0, 0.1, rng), True),
    Edge("GD of 0 steps", trainers, "factorised_gd", lambda rng: _descent(0), False),
    Edge("GD with lr 0", trainers, "factorised_gd", lambda rng: _descent(0, 0.0), True),
    Edge(
        "GD on an infinite gradient",
        trainers,
        "factorised_gd",
        lambda rng: _descent(3),
        True,
        "diverged at step 1 of 3",
    ),
    Edge(
        "student from init 0",
        trainers,
        "train_static_student",
        lambda rng: (*_student(3)(rng), 0.1, 0.0),
        False,
    ),
    Edge("student at width n", trainers, "train_static_student", _student(3), False),
    Edge("student at width 1", trainers, "train_static_student", _student(1), False),
    Edge("student at width n + 1", trainers, "train_static_student", _student(4), True),
    Edge("student at width 0", trainers, "train_static_student", _student(0), True),
]


@dataclass(frozen=True)
class Default:
    module: Any
    function: str
    args: Callable[[np.random.Generator], tuple]
    documented: dict


def _task_args(rng: np.random.Generator) -> tuple:
    return (6, 3, 3, 2, 2)


def _static_fit(rng: np.random.Generator) -> tuple:
    x, y = _xy(6, 3, 2, 2)(rng)
    return x, y, np.eye(2)


def _linear_fit(rng: np.random.Generator) -> tuple:
    """Tokens of scale ½, at which the default lr = 0.2 is stable: 0 divergences in 10,000
    draws, against 12 in 1,500 for unit tokens (the loss is of degree 6 in the tokens)."""
    x, y = _xy(6, 3, 3, 2)(rng)
    return 0.5 * x, y, tasks.orthonormal(3, 2, rng), 1


def _floored_inversion(rng: np.random.Generator) -> tuple:
    """Y = A X W_V with an invertible X W_V (n = d = d_v = 3) and entries of A of 1e-13, below
    the estimator's floor: its result moves with the floor."""
    x, w = rng.standard_normal((4, 3, 3)), tasks.orthonormal(3, 3, rng)
    a = rng.uniform(0.1, 1.0, (4, 3, 3))
    a[:, 0, 1] = 1e-13
    return x, a @ x @ w, w


def _risk(rng: np.random.Generator) -> tuple:
    """A, A* (n = 3) and W* (d = 3, d_v = 2)."""
    return tuple(rng.standard_normal(shape) for shape in ((3, 3), (3, 3), (3, 2)))


#: The documented defaults (docs/entropic_bound.md, "Defaults"), with the positional arguments
#: each function is called with. ``c=None`` is the identity covariance.
DEFAULTS = [
    Default(tasks, "planted_spectrum", lambda rng: (3,), {"spec": "flat"}),
    Default(tasks, "planted_kernel", lambda rng: (3, 2, rng), {"spec": "flat", "psd": False}),
    Default(tasks, "planted_mixer", lambda rng: (3, 2, rng), {"spec": "flat"}),
    Default(
        tasks,
        "softmax_attention_mixing",
        lambda rng: (rng.standard_normal((2, 3, 3)), rng.standard_normal((3, 3))),
        {"beta": 1.0},
    ),
    Default(
        tasks,
        "static_task",
        _task_args,
        {"seed": 0, "noise": 0.01, "spec": "flat", "covariance": None},
    ),
    Default(
        tasks,
        "linear_qk_task",
        _task_args,
        {"seed": 0, "noise": 0.01, "spec": "flat", "psd": False},
    ),
    Default(
        tasks,
        "softmax_task",
        _task_args,
        {"beta": 2.0, "seed": 0, "noise": 0.01, "spec": "flat", "psd": False},
    ),
    Default(tasks, "static_excess_risk", _risk, {"c": np.eye(3)}),
    Default(tasks, "deficiency_bound", lambda rng: (*_risk(rng)[1:], 1), {"c": np.eye(3)}),
    Default(tasks, "truncated_mixer", lambda rng: (_risk(rng)[1], 1), {"c": np.eye(3)}),
    Default(tasks, "gram_population", lambda rng: (*_risk(rng)[1:], 0.1), {"c": np.eye(3)}),
    Default(spectra, "numerical_rank", lambda rng: (SENSITIVE,), {"tau": 0.001}),
    Default(spectra, "energy_threshold_rank", lambda rng: (SENSITIVE,), {"eta": 0.9}),
    Default(spectra, "largest_gap_rank", lambda rng: (SENSITIVE,), {"floor": 0.0}),
    Default(spectra, "estimate_all", lambda rng: (SENSITIVE,), {"tau": 0.001, "floor": 0.0}),
    Default(spectra, "tracy_widom_threshold", lambda rng: (1.0, 16, 1600), {"quantile": 0.99}),
    Default(
        largest_root,
        "largest_root_quantile",
        lambda rng: (16, 1600),
        {"quantile": 0.99, "draws": 10_000},
    ),
    Default(
        spectra,
        "token_gram_count",
        lambda rng: (rng.standard_normal((20, 4, 2)),),
        {"quantile": 0.99},
    ),
    Default(
        trainers,
        "train_static_student",
        _static_fit,
        {"width": None, "steps": 1000, "lr": 0.1, "init": 0.001, "seed": 0},
    ),
    Default(
        trainers,
        "train_linear_qk_student",
        _linear_fit,
        {"steps": 1000, "lr": 0.2, "init": 0.01, "seed": 0},
    ),
    Default(
        pretraining,
        "inversion_estimator",
        _floored_inversion,
        {"beta": 1.0, "floor": 1e-12},
    ),
]


def _same(a: Any, b: Any) -> bool:
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            _same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, tuple):
        return type(a) is type(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    return bool(a == b)


def moved_defaults(seed: int) -> list[str]:
    """The functions of ``DEFAULTS`` whose call without the defaults differs from the call with
    the documented values (each called through its module's attribute on the same draws)."""
    moved = []
    for i, case in enumerate(DEFAULTS):
        function = getattr(case.module, case.function)
        explicit = function(*case.args(np.random.default_rng([seed, 12, i])), **case.documented)
        try:
            implicit = function(*case.args(np.random.default_rng([seed, 12, i])))
        except ValueError:  # a default moved out of its domain
            implicit = None
        if implicit is None or not _same(implicit, explicit):
            moved.append(f"{case.function}'s defaults")
    return moved


def wrong_decisions(seed: int) -> list[str]:
    """The edges decided against ``EDGES`` (each called through its module's attribute, so a
    substituted function is the one called)."""
    rng = np.random.default_rng([seed, 11])
    wrong = []
    for edge in EDGES:
        message = ""
        try:
            getattr(edge.module, edge.function)(*edge.args(rng))
            refused = False
        except ValueError as error:
            refused, message = True, str(error)
        if refused != edge.refused:
            wrong.append(edge.label)
        elif refused and not re.search(edge.says, message):
            wrong.append(f"{edge.label} (its message: {message!r})")
    return wrong


def ols_refusing_its_end(original: Callable) -> Callable:
    """``ols_static_mixer`` that also refuses S·d = n (an off-by-one near miss: S·d ≤ n)."""

    def variant(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        s, n, d = np.shape(x)
        if s * d == n:  # below it, the original refuses with its own message
            raise ValueError(f"Σ X Xᵀ is singular: needs S·d > n, got S·d = {s * d} = n")
        return original(x, y)

    return variant
