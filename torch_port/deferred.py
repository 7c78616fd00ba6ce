"""Host decisions deferred to one read of the device per step.

The frame path branches on data in a few places: a norm that needs no rescaling, a coefficient
that is finite, a step factor that is representable, the degree of the polar series. Deciding
each branch reads a value from the device (a GPU synchronisation). Inside ``speculate()`` the
step takes the common branch without reading: ``holds(cond)`` records the device condition
under which the careful code takes that branch and answers True, and ``hint``/``remember``
carry a branch's choice (the polar degree) from one step of a point to the next. The step then
reads every recorded condition at once (``which_hold``). A point whose conditions do not all hold
is computed again by the careful code, which reads as it goes; where they hold, the speculative
run took the careful code's branches and ran the same operations, so its result is the careful
code's bitwise. Outside ``speculate()`` (and inside ``speculate(defer=False)``, which still
records choices) ``holds`` is ``bool(cond)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

Tensor = torch.Tensor


@dataclass
class Speculation:
    """The conditions recorded while one point's update ran (``conditions``), and the choices
    carried between its steps (``hints``, the caller's dict, updated in place)."""

    hints: dict[str, Any]
    defer: bool = True
    conditions: list[Tensor] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)


_current: ContextVar[Speculation | None] = ContextVar("speculation", default=None)


@contextmanager
def speculate(hints: dict[str, Any], defer: bool = True) -> Iterator[Speculation]:
    """Run the enclosed code with its host decisions deferred (``defer``) or read at once, the
    choices it makes remembered in ``hints``."""
    spec = Speculation(hints, defer)
    token = _current.set(spec)
    try:
        yield spec
    finally:
        _current.reset(token)


def holds(cond: Tensor) -> bool:
    """``bool(cond)`` of a 0-d boolean tensor; while speculating, True, with ``cond`` recorded
    to be read with the others."""
    spec = _current.get()
    if spec is None or not spec.defer:
        return bool(cond)
    spec.conditions.append(cond)
    return True


def site(name: str) -> str:
    """The key of this call of the branch ``name`` within the point's update (``name#k`` for
    its k-th call), under which its choice is remembered."""
    spec = _current.get()
    if spec is None:
        return name
    k = spec.calls.get(name, 0)
    spec.calls[name] = k + 1
    return f"{name}#{k}"


def hint(key: str) -> Any:
    """The choice remembered under ``key`` at the previous step of the point being speculated
    on (None when there is none, or outside a speculation that defers)."""
    spec = _current.get()
    return None if spec is None or not spec.defer else spec.hints.get(key)


def remember(key: str, value: Any) -> None:
    """Remember a choice made by reading, for the next step of the same point."""
    spec = _current.get()
    if spec is not None:
        spec.hints[key] = value


def _together(conditions: Sequence[Tensor]) -> Tensor:
    """The one-element conditions as one vector on the first one's device."""
    device = conditions[0].device
    return torch.stack([c if c.device == device else c.to(device) for c in conditions])


def which_hold(
    groups: Sequence[Sequence[Tensor]], agree: Callable[[Tensor], Any] | None = None
) -> list[bool]:
    """For each group of conditions, whether all of its conditions hold (one read). With
    ``agree`` (a sum over the processes of a distributed step, in place), whether they hold in
    every process: a group that fails in one fails in all."""
    each = [_together(g).all() if g else torch.ones((), dtype=torch.bool) for g in groups]
    held = _together(each)
    if agree is not None:
        failed = (~held).to(torch.int32)
        agree(failed)
        held = failed == 0
    return [bool(v) for v in held.tolist()]
