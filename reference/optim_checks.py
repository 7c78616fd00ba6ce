"""What ``reference.optim`` checks before it steps: hyperparameters, and states that must fit
the point (the layout the chain's ``init`` makes there, finite values, counts and √v ≥ 0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from reference.geometry import check_finite, check_shapes, is_integer


def is_real(v: Any) -> bool:
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)


def hyper(name: str, v: Any, ok: Callable[[Any], bool], must: str) -> Any:
    """v, once checked: TypeError unless it is a real number (an int or a float, NumPy's
    included; never a bool, a string or a complex), ValueError unless ok(v). Both messages name
    the hyperparameter, what it must be and the value given ("lr must be ..., got '1e-3'")."""
    if not is_real(v):
        raise TypeError(f"{name} must {must}, got {v!r} of type {type(v).__name__}")
    if not ok(v):
        raise ValueError(f"{name} must {must}, got {v!r}")
    return v


def positive(name: str, v: Any, must: str = "be a finite number > 0") -> Any:
    return hyper(name, v, lambda t: 0.0 < t < np.inf, must)  # NaN fails every comparison


def nonnegative(name: str, v: Any) -> Any:
    return hyper(name, v, lambda t: 0.0 <= t < np.inf, "be a finite number ≥ 0")


def beta(name: str, v: Any) -> Any:
    return hyper(name, v, lambda t: 0.0 <= t < 1.0, "lie in [0, 1)")


def check_lr(lr: Any) -> None:
    positive("lr", lr, "be a positive finite number")


def two_betas(betas: tuple[float, float]) -> tuple[float, float]:
    if not isinstance(betas, tuple | list):
        raise TypeError(f"betas must be a pair of numbers (beta1, beta2), got {betas!r}")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair of numbers (beta1, beta2), got {betas!r}")
    return float(beta("beta1", betas[0])), float(beta("beta2", betas[1]))


#: State fields whose entries are never negative: a step count and a root second moment √v.
NONNEGATIVE_FIELDS = ("count", "sqrt_v")


def check_state(expected: Any, state: Any, path: str = "state", nonnegative: bool = False) -> None:
    """Raise ValueError naming the field unless ``state`` fits the point, i.e. has the layout of
    ``expected``, the state the chain's ``init`` makes there: the same nesting of tuples (a
    NamedTuple such as ``AdamState`` of the same class, so √v has one entry per moment group),
    arrays of the same shapes with finite real entries (TypeError for complex or object ones),
    ints where a count is, finite reals where a scalar √v is; counts and √v ≥ 0."""
    fields = getattr(type(expected), "_fields", None)
    if fields is not None and type(state) is not type(expected):
        raise ValueError(
            f"{path}: expected type {type(expected).__name__}, got {type(state).__name__}"
        )
    if isinstance(expected, tuple):
        if not isinstance(state, tuple) or len(state) != len(expected):
            got = f"{len(state)} entries" if isinstance(state, tuple) else type(state).__name__
            raise ValueError(f"{path}: expected a tuple of {len(expected)} entries, got {got}")
        for i, (e, s) in enumerate(zip(expected, state, strict=True)):
            name = fields[i] if fields else None
            check_state(
                e,
                s,
                f"{path}.{name}" if name else f"{path}[{i}]",
                nonnegative or name in NONNEGATIVE_FIELDS,
            )
    elif isinstance(expected, np.ndarray):
        check_shapes(path, [expected.shape], state)
        check_finite(path, state)
        low = float(np.min(state)) if np.size(state) else 0.0
        if nonnegative and low < 0.0:
            raise ValueError(f"{path}: entries must be ≥ 0, got a minimum of {low!r}")
    elif is_integer(expected) and not (is_integer(state) and state >= 0):
        raise ValueError(f"{path}: expected an integer ≥ 0, got {state!r}")
    elif isinstance(expected, float) and not (
        is_real(state) and np.isfinite(state) and (state >= 0.0 or not nonnegative)
    ):
        want = "a finite number" + (" ≥ 0" if nonnegative else "")
        raise ValueError(f"{path}: expected {want}, got {state!r}")
