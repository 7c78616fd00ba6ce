"""The verdicts of an audit: of a replayed row ("pass", "fail", "not auditable": sound by
construction, ``verdict``), of a step the port skipped (``_skipped_verdict``) and of a run
(``overall``), and the ratio a row is plotted by (``row_ratio``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from proofs_checks.audit.bounds import LARGEST_STEP
from proofs_checks.audit.elements import Elements
from proofs_checks.audit.trace import Trace
from reference.geometry import parts

#: The resolution a passing row must have: its bound at most this fraction of its own step's
#: length, so that a pass excludes every departure larger than a tenth of the step (a step
#: not taken, a learning rate off by more than 10%, a step of the wrong direction).
RESOLUTION = 0.1

VERDICTS = ("pass", "fail", "not auditable")


def verdict(row: dict[str, Any], *, lr_zero: bool, unchanged: bool) -> dict[str, Any]:
    """The verdict of a replayed row, sound by construction: "fail" when the point was one the
    port refuses, the deviation (or the state's) exceeds its bound or is not finite; "pass"
    only when the check can tell a wrong step from a right one: at lr 0 the point is unchanged
    (``unchanged``: bit for bit for the port, whose R_x(0) = x; within the bound for another
    library's rule, whose retraction may round x), otherwise the bound is at most
    ``RESOLUTION`` of the step's length Δ and the step is one the bound covers
    (Δ ≤ ``LARGEST_STEP``); every other row is "not auditable", with the reason."""
    dev, bound, state = row["deviation"], row["bound"], row["state_ratio"]
    if not row["accepted"]:
        return _said("fail", f"the point is off its manifold by {row['residual']:.1e}")
    if not (math.isfinite(dev) and math.isfinite(bound)) or dev > bound:
        return _said("fail", "the point after the step departs from the rule's")
    if row.get("unchecked") is None and not state <= 1.0:  # NaN included
        return _said(
            "fail", f"the state after the step departs from the rule's ({row['state_entry']})"
        )
    if lr_zero:
        if unchanged:
            return _said("pass", "lr 0: the point is unchanged")
        return _said("fail", "lr 0, but the point changed")
    if not row["bounded"]:
        return _said("not auditable", f"a step longer than {LARGEST_STEP:g}")
    if bound > RESOLUTION * row["step_length"]:
        ratio = bound / row["step_length"] if row["step_length"] else math.inf
        return _said(
            "not auditable", f"the bound is {ratio:.2g} of the step (a pass needs ≤ {RESOLUTION:g})"
        )
    return _said("pass", row.get("unchecked"))


def _said(what: str, reason: str | None) -> dict[str, Any]:
    return {"verdict": what, "passed": what == "pass", "reason": reason}


def _skipped_verdict(trace: Trace, step: dict[str, Any], el: Elements, g: Any) -> dict:
    """A step the port skipped (``skip_nonfinite``) is right only for a non-finite gradient:
    "pass" when one of the gradients recorded at this step has a non-finite entry, "fail" when
    every gradient of the step is finite (the trace says none was not), "not auditable" when
    the trace says a gradient it did not keep was not finite."""
    if not all(np.isfinite(a).all() for a in parts(g)):
        return _said("pass", "skipped: its gradient is not finite")
    same = [k for k, s in enumerate(trace.meta["steps"]) if s["step"] == step["step"]]
    if any(not np.isfinite(a).all() for k in same for a in trace.parts(k, "g")):
        return _said("pass", "skipped: a gradient of this step is not finite")
    if step["nonfinite_gradient"]:
        return _said(
            "not auditable",
            "skipped for a non-finite gradient that the trace does not keep",
        )
    return _said("fail", "skipped, but every gradient of the step is finite")


def overall(rows: Sequence[dict[str, Any]], pooled: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict of a run: "failed" when a row failed or the pooled test
    (``proofs_checks.audit.pooled``) flagged a step; else "not auditable" when a row is, or
    when no step was replayed (only skipped steps, or none: nothing was shown); else "passed".
    ``passed`` is true for "passed" only: the pooled test can fail a run, never pass one."""
    flagged = [t["step"] for t in pooled["flagged"]] if pooled else []
    failed = [r["step"] for r in rows if r["verdict"] == "fail"] + flagged
    unauditable = [r["step"] for r in rows if r["verdict"] == "not auditable"]
    replayed = [r for r in rows if not r["skipped"]]
    if failed:
        result = "failed"
    elif unauditable or not replayed:
        result = "not auditable"
    else:
        result = "passed"
    return {
        "verdict": result,
        "passed": result == "passed",
        "first_failure_step": min(failed) if failed else None,
        "first_unauditable_step": min(unauditable) if unauditable else None,
        "counts": {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS},
    }


def row_ratio(row: dict[str, Any]) -> float:
    """The largest of deviation/bound and the state's ratio (0 for a skipped step, inf for a
    step whose deviation was not finite)."""
    if row["deviation"] is None or not row["bound"]:
        return 0.0 if row["skipped"] else math.inf
    point = row["deviation"] / row["bound"]
    if row["state_ratio"] is None:  # the state was not checked (listed), or the point failed
        return point if row.get("unchecked") else math.inf
    return max(point, row["state_ratio"])
