"""CONF-STATE: the optimizer keeps its state as torch's optimizers do (a ``state_dict``
round trip resumes bit for bit, ``zero_grad`` sets None, a parameter whose grad is None keeps
its point and state, lr 0 moves nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from proofs_checks.conformance.context import Context, Outcome, _diff, _norm
from proofs_checks.conformance.problem import Run, drive

Array = np.ndarray


def _same(a: Sequence[Array], b: Sequence[Array]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _state_arrays(run: Run, p: torch.nn.Parameter) -> dict[str, Any]:
    return {
        k: (v.detach().clone() if torch.is_tensor(v) else v)
        for k, v in run.optimizer.state.get(p, {}).items()
    }


def _same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if torch.is_tensor(x) != torch.is_tensor(y):
            return False
        if torch.is_tensor(x) and not torch.equal(x, y):
            return False
        if not torch.is_tensor(x) and x != y:
            return False
    return True


def check_state(ctx: Context, claim: Any) -> Outcome:
    failures = []
    # (a) state_dict round trip resumes bitwise, and saving changes nothing: both the run that
    # was saved and the one resumed from it end where a twin never saved ends
    twin = drive(ctx.run(), ctx.problem, 10)[-1]
    run = ctx.run()
    drive(run, ctx.problem, 5)
    resumed = run.clone(ctx.factory)
    for what, other in (("saved", run), ("resumed from state_dict", resumed)):
        end = drive(other, ctx.problem, 5, start=5)[-1]
        if not _same(end, twin):
            failures.append(f"a run {what} departs by {_norm(_diff(end, twin)):.2e}")
    # (b) zero_grad leaves no gradient (torch's default set_to_none=True)
    run.optimizer.zero_grad()
    if any(p.grad is not None for p in run.params):
        failures.append("zero_grad() left gradients that are not None")
    # (c) None gradients for the first point: its parameters and their state are untouched
    before_p = run.points()
    first, others = ctx.space.params_of(0), ctx.space.params_of(1)
    kept = [_state_arrays(run, run.params[k]) for k in first]
    grads: list = run.rounded(ctx.problem.gradients(before_p, 10))
    run.step([None if k in first else g for k, g in enumerate(grads)])
    after = run.points()
    if not all(np.array_equal(after[k], before_p[k]) for k in first):
        failures.append("a point whose gradients are None moved")
    if not all(
        _same_state(s, _state_arrays(run, run.params[k])) for s, k in zip(kept, first, strict=True)
    ):
        failures.append("the state of a point whose gradients are None changed")
    if all(np.array_equal(after[k], before_p[k]) for k in others):
        failures.append("with one point's gradients None, the other point did not move")
    # (d) lr 0 leaves every point bit for bit
    run.set("lr", 0.0)
    before = run.points()
    run.step(run.rounded(ctx.problem.gradients(before, 11)))
    if not _same(before, run.points()):
        failures.append(
            f"a step at lr 0 moved the points by {_norm(_diff(run.points(), before)):.2e}"
        )
    return Outcome(
        not failures,
        "; ".join(failures)
        or "state_dict round trip resumes bitwise; zero_grad sets None; None grads leave their "
        "point and state as they were; lr 0 leaves the points bit for bit",
    )
