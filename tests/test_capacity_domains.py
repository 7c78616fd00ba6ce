"""EB-4's domain check: every function of ``capacity_domains.EDGES`` is tried on both sides of
an end, and a function that refuses its own end (an off-by-one) is caught, whichever it is."""

from __future__ import annotations

import inspect
from collections import defaultdict

import numpy as np
import pytest

from proofs_checks import capacity_domains as cd
from proofs_checks.harness import substituted


def test_every_function_is_tried_inside_and_outside_its_domain() -> None:
    decisions = defaultdict(set)
    for edge in cd.EDGES:
        decisions[edge.function].add(edge.refused)
    assert all(d == {False, True} for d in decisions.values()), dict(decisions)


def _refusing_everything(original):
    def variant(*args, **kwargs):
        raise ValueError("refused")

    return variant


@pytest.mark.parametrize("edge", [e for e in cd.EDGES if not e.refused], ids=lambda e: e.label)
def test_a_function_that_refuses_its_end_is_caught(edge) -> None:
    original = getattr(edge.module, edge.function)
    with substituted(edge.module, edge.function, _refusing_everything(original)):
        assert edge.label in cd.wrong_decisions(0)
    assert cd.wrong_decisions(0) == []


def test_the_ols_near_miss_refuses_only_the_end() -> None:
    with substituted(
        cd.pretraining, "ols_static_mixer", cd.ols_refusing_its_end(cd.pretraining.ols_static_mixer)
    ):
        assert cd.wrong_decisions(0) == ["OLS mixer at S·d = n"]


def _moved(value):
    """A default moved by a little: an integer one up, a real doubled (0 made 0.3), a flag
    flipped, a spectrum name changed, ``None`` made the covariance 2I."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 0.3
    if isinstance(value, str):
        return "decay"
    return 2 * np.eye(3) if value is None else 2 * value


@pytest.mark.parametrize("case", cd.DEFAULTS, ids=lambda c: c.function)
def test_every_documented_default_moved_is_caught(case) -> None:
    original = getattr(case.module, case.function)
    signature = inspect.signature(original)
    for key, value in case.documented.items():
        if key == "width":  # None is the only legal value below the student's limit here
            continue

        def variant(*args, _key=key, _value=value, **kwargs):
            if _key not in signature.bind_partial(*args, **kwargs).arguments:
                kwargs[_key] = _moved(_value)
            return original(*args, **kwargs)

        with substituted(case.module, case.function, variant):
            assert cd.moved_defaults(0) == [f"{case.function}'s defaults"], key
    assert cd.moved_defaults(0) == []


def test_a_refusal_that_misnames_the_measured_value_is_caught() -> None:
    """The static OLS refusing S·d = 2 < n = 3 but reporting S·d/… = 0.5: the decision is
    right, the message is not."""

    def misreporting(x, y):
        raise ValueError("Σ X Xᵀ is singular: needs S·d ≥ n, got S·d = 0.5 < n = 3")

    with substituted(cd.pretraining, "ols_static_mixer", misreporting):
        wrong = cd.wrong_decisions(0)
    assert len(wrong) == 2 and wrong[0] == "OLS mixer at S·d = n"
    assert wrong[1].startswith("OLS mixer at S·d = n − 1 (its message: ")
