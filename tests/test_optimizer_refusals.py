"""What the port's optimizers refuse when they are built or given a group, and what they accept
at the edges: the table of PORT-11 (``proofs_checks.propositions.port_refusals.ROWS``: input,
error type, message pattern), run row by row by one generic test, in the manner of torch's
``ErrorOptimizerInput``. A refused input leaves the optimizer as it was.

What a step or a load refuses is in ``test_step_refusals.py`` (its own tables: hyperparameters
set after construction, changes between steps); flags torch's optimizers take are in
``test_torch_conventions.py`` (``FLAGS``)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from proofs_checks.propositions.port_refusals import (  # noqa: E402
    ROWS,
    Row,
    _adam,
    _adam_with_frames,
    _frames,
    misbehaviour,
)


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_each_row_behaves_as_the_table_says(row: Row) -> None:
    assert misbehaviour(row) is None


def test_the_table_names_each_row_once() -> None:
    names = [row.name for row in ROWS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (Row("accepted", lambda _: _adam([_frames()], lr=1e-3), ValueError, "lr"), "accepted"),
        (Row("refused", lambda _: _adam([_frames()], lr=-1.0), None), "raised ValueError"),
        (
            Row("another message", lambda _: _adam([_frames()], lr=-1.0), ValueError, "beta"),
            "not ValueError 'beta'",
        ),
        (
            Row("another type", lambda _: _adam([_frames()], lr=-1.0), TypeError, "lr"),
            "not TypeError",
        ),
        (
            Row("no warning", lambda _: _adam([_frames()]), UserWarning, "weight_decay"),
            "no UserWarning",
        ),
    ],
    ids=["accepted", "refused", "another message", "another type", "no warning"],
)
def test_a_row_that_does_not_behave_is_named(row: Row, why: str) -> None:
    """Controls of the generic test: each way a row can depart from the table is reported."""
    assert why in (misbehaviour(row) or "")


def test_a_refusal_that_writes_is_caught() -> None:
    """Control: a refusal raised after a point was changed is caught by the snapshot."""

    def writes_then_refuses(opt: Any) -> None:
        with torch.no_grad():
            opt.param_groups[0]["params"][0].mul_(2.0)
        raise ValueError("refused too late")

    row = Row("late", writes_then_refuses, ValueError, "too late", build=_adam_with_frames)
    assert misbehaviour(row) == "refused after writing"


def test_a_warning_from_inside_the_library_is_not_the_callers() -> None:
    """Control: a warning attributed to a line of torch_port (as when the guard's
    ``caller_stacklevel`` walks one frame short) fails a row that says it is the caller's."""
    import warnings

    from torch_port.optim.guard import values

    def in_the_library(_: Any) -> None:
        warnings.warn_explicit("weight_decay", values.FrameDecayWarning, values.__file__, 1)

    row = Row("library", in_the_library, UserWarning, "weight_decay")
    assert "no UserWarning" in (misbehaviour(row) or "")
