"""``torch_port.deferred``: what ``holds`` and ``fast`` answer and record in each mode, and that
the modes are kept per thread."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from torch_port import deferred  # noqa: E402

TRUE, FALSE = torch.tensor(True), torch.tensor(False)

#: (mode, function, condition, answer, recorded): None is outside any speculation.
ROWS = [
    (None, deferred.holds, TRUE, True, False),
    (None, deferred.holds, FALSE, False, False),
    (None, deferred.fast, FALSE, False, False),
    ("read", deferred.holds, FALSE, False, False),
    ("read", deferred.fast, TRUE, True, False),
    ("defer", deferred.holds, FALSE, True, True),
    ("defer", deferred.fast, FALSE, True, True),
    ("device", deferred.holds, FALSE, True, True),
    ("device", deferred.fast, TRUE, False, False),
    ("device", deferred.fast, FALSE, False, False),
]


@pytest.mark.parametrize(("mode", "fn", "cond", "answer", "recorded"), ROWS)
def test_each_mode_answers_and_records_as_documented(mode, fn, cond, answer, recorded) -> None:
    if mode is None:
        assert fn(cond) is answer
        return
    with deferred.speculate({}, mode) as spec:
        assert fn(cond) is answer
    assert (spec.conditions == [cond]) if recorded else not spec.conditions


def test_choices_are_remembered_and_hinted_only_when_deferring() -> None:
    hints: dict = {}
    with deferred.speculate(hints, "read"):
        key = deferred.site("polar_degree")
        assert deferred.hint(key) is None
        deferred.remember(key, 7)
    assert hints == {"polar_degree#0": 7}
    with deferred.speculate(hints, "defer"):
        assert deferred.hint(deferred.site("polar_degree")) == 7
        assert deferred.hint(deferred.site("polar_degree")) is None  # its second call: #1
    with deferred.speculate(hints, "device", bound=0.25):
        assert deferred.hint(deferred.site("polar_degree")) is None
        assert deferred.on_device() and deferred.series_bound() == 0.25
    assert not deferred.on_device() and deferred.series_bound() is None


def test_the_innermost_speculation_decides_and_the_outer_one_returns() -> None:
    with deferred.speculate({}, "device") as outer:
        with deferred.speculate({}, "read"):
            assert deferred.holds(FALSE) is False
        assert deferred.holds(FALSE) is True
    assert len(outer.conditions) == 1


def test_a_thread_does_not_see_another_threads_speculation() -> None:
    seen: list = []
    with deferred.speculate({}, "device"):
        worker = threading.Thread(target=lambda: seen.append(deferred.on_device()))
        worker.start()
        worker.join()
        assert deferred.on_device()
    assert seen == [False]


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown mode 'lazy'"), deferred.speculate({}, "lazy"):
        pass


def test_all_hold_and_which_hold() -> None:
    assert bool(deferred.all_hold([]))
    assert not bool(deferred.all_hold([TRUE, FALSE]))
    assert deferred.which_hold([[TRUE], [TRUE, FALSE], []]) == [True, False, True]
