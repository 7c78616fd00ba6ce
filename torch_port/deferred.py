"""Host decisions of a step: read at once, deferred to one read per step, or kept on the device.

The frame path branches on data in a few places: a norm that needs no rescaling, a coefficient
that is finite, a step factor that is representable, the degree of the polar series; and it
refuses what it cannot take (a non-finite new point, an unrepresentable transported moment).
Deciding either reads a value from the device (a GPU synchronisation). ``speculate(mode)`` runs a
step's code in one of three modes:

- "read": every decision is read where it is made (``bool(cond)``), as outside ``speculate``;
  the choices made (the polar degree) are remembered in ``hints`` for the next step.
- "defer": the step takes the common branch without reading: ``fast(cond)`` and ``holds(cond)``
  record the condition under which the careful ("read") code takes that branch and answer True,
  and ``hint`` gives the choice remembered at the point's last step. The caller reads every
  recorded condition at once (``which_hold``); a point whose conditions do not all hold is
  computed again in "read" mode. Where they hold, the deferred run took the careful code's
  branches and ran the same operations, so its result is the careful code's bitwise.
- "device" (the capturable step): nothing is read. ``fast(cond)`` answers False, so the code
  takes its branch-free route, which is right whether or not ``cond`` holds (for conditions
  that common inputs fail: a zero norm); ``holds(cond)`` answers True and records a condition
  the step needs, decided on the device with the others: a refusal of the careful code, or a
  fast route that only values near the dtype's largest fail (an overflow), become "skip the
  step"; the polar series takes the degree that the step's trust radius bounds
  (``series_bound``).

The modes are kept per thread (simulated ranks step in threads) in a plain stack, which
``torch.compile`` traces (it cannot trace a ``ContextVar``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

Tensor = torch.Tensor

MODES = ("read", "defer", "device")


@dataclass
class Speculation:
    """One point's (or batch's) update in a mode: the conditions it recorded, the choices
    carried between its steps (``hints``, the caller's dict, updated in place) and, on the
    device, the bound on ‖E‖₂ of the polar series (``bound``)."""

    hints: dict[str, Any]
    mode: str = "defer"
    bound: float | None = None
    conditions: list[Tensor] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)


_threads = threading.local()


def _stack() -> list[Speculation]:
    stack = getattr(_threads, "stack", None)
    if stack is None:
        stack = _threads.stack = []
    return stack


def _current() -> Speculation | None:
    stack = _stack()
    return stack[-1] if stack else None


@contextmanager
def speculate(
    hints: dict[str, Any], mode: str = "defer", bound: float | None = None
) -> Iterator[Speculation]:
    """Run the enclosed code in ``mode`` (module docstring), its choices remembered in
    ``hints``; ``bound``: on the device, the bound on ‖E‖₂ the polar series is sized for."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    spec = Speculation(hints, mode, bound)
    stack = _stack()
    stack.append(spec)
    try:
        yield spec
    finally:
        stack.pop()


def holds(cond: Tensor) -> bool:
    """Whether a condition the step needs holds (a 0-d boolean tensor): ``bool(cond)`` when
    reading; deferred or on the device, True, with ``cond`` recorded."""
    spec = _current()
    if spec is None or spec.mode == "read":
        return bool(cond)
    spec.conditions.append(cond)
    return True


def fast(cond: Tensor) -> bool:
    """Whether the fast route may be taken (its result is right only where ``cond`` holds; the
    other route is right everywhere): ``bool(cond)`` when reading; deferred, True with ``cond``
    recorded; on the device, False (the route without a decision)."""
    spec = _current()
    if spec is not None and spec.mode == "device":
        return False
    return holds(cond)


def on_device() -> bool:
    """Whether the code runs in the capturable step (nothing may be read, kept or made lazy)."""
    spec = _current()
    return spec is not None and spec.mode == "device"


def series_bound() -> float | None:
    """On the device, the bound on ‖E‖₂ that the polar series is sized for (else None)."""
    spec = _current()
    return spec.bound if spec is not None and spec.mode == "device" else None


def site(name: str) -> str:
    """The key of this call of the branch ``name`` within the point's update (``name#k`` for
    its k-th call), under which its choice is remembered."""
    spec = _current()
    if spec is None:
        return name
    k = spec.calls.get(name, 0)
    spec.calls[name] = k + 1
    return f"{name}#{k}"


def hint(key: str) -> Any:
    """The choice remembered under ``key`` at the previous step of the point being deferred
    (None when there is none, or in another mode)."""
    spec = _current()
    return spec.hints.get(key) if spec is not None and spec.mode == "defer" else None


def remember(key: str, value: Any) -> None:
    """Remember a choice made by reading, for the next step of the same point."""
    spec = _current()
    if spec is not None:
        spec.hints[key] = value


def _together(conditions: Sequence[Tensor]) -> Tensor:
    """The one-element conditions as one vector on the first one's device."""
    device = conditions[0].device
    return torch.stack([c if c.device == device else c.to(device) for c in conditions])


def all_hold(conditions: Sequence[Tensor]) -> Tensor:
    """Whether every condition holds, as a 0-d boolean tensor (no read)."""
    if not conditions:
        return torch.ones((), dtype=torch.bool)
    return _together([c.reshape(()) for c in conditions]).all()


def which_hold(
    groups: Sequence[Sequence[Tensor]], agree: Callable[[Tensor], Any] | None = None
) -> list[bool]:
    """For each group of conditions, whether all of its conditions hold (one read). With
    ``agree`` (a sum over the processes of a distributed step, in place), whether they hold in
    every process: a group that fails in one fails in all."""
    held = _together([all_hold(g) for g in groups])
    if agree is not None:
        failed = (~held).to(torch.int32)
        agree(failed)
        held = failed == 0
    return [bool(v) for v in held.tolist()]
