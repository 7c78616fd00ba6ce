"""``rattn audit``: replay every recorded step of a training run through ``reference.optim`` in
float64 and compare the point the port reached with the exact one (NumPy only: a trace recorded
with torch is replayed where torch is not installed).

A record (``torch_port.audit``; its schema and reader: ``proofs_checks.audit.trace``) holds, for
one point of one geometry group at one step t, the elements kept (frames of a Stiefel parameter,
points of a factored group's batch), each with its point x before the step, its Euclidean
gradient, the optimizer state before and the point y after, in the port's internal layout and
dtype, plus the hyperparameters in force and how the geometry is built. For every element the
replay

1. builds the reference geometry and the reference optimizer of the recorded rule
   (``PRESETS``: the four presets of ``reference.optim.PRESET_CHAINS`` with every option, on
   the Riemannian or the Euclidean gradient; ``FIELD_RULES``: geoopt's RiemannianAdam and
   RiemannianSGD as ``reference.field_rules`` states them) with the recorded hyperparameters;
2. projects x to its manifold in float64 (the polar factor of each orthonormal factor) and
   reports the distance δ = ‖C(x) − C(x̄)‖, C what is compared (the point, or W = A Bᵀ where the
   factors are defined up to a group action: ``Elements``);
3. converts the port's state to the reference's (``reference_state``: the count t − 1, the
   moments' arrays and √v filled into the layout the reference's ``init`` makes at x̄);
4. takes the reference step ȳ = step(x̄, g, state) (g the recorded gradient, negated where one
   of the library's optimizers has torch's ``maximize``) and measures e = ‖C(y) − C(ȳ)‖.

The bound e ≤ B of a step in the dtype it ran in, and of the state after it, with their
derivations: ``proofs_checks.audit.bounds``.

The state is checked too: each recorded step keeps the state after it, and that state is
compared with the reference's after the step, entry by entry (``state_bound``; for the
geometries compared by W, each moment as the tangent matrix it represents:
``in_matrix_form``), so a step whose point is right but whose state is not (a skipped
transport, a wrong moment) is flagged at its step, whatever ``every`` sampled.

The verdict of a row is sound by construction (``verdict``): "pass" only when the bound is at
most ``RESOLUTION`` of the step's own length (or, at lr 0, when the point is unchanged bit for
bit), "fail" when a bound is exceeded, "not auditable" otherwise. A step that the port skipped
(``skip_nonfinite``) passes only when a gradient recorded at that step has a non-finite entry
(``_skipped_verdict``). A run passes when no row fails, none is not auditable and at least one
step was replayed (``overall``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from proofs_checks.audit.bounds import (
    FACTORING_RETRACTIONS,
    LARGEST_STEP,
    _accepted,
    elementwise_amplification,
    step_bound,
)
from proofs_checks.audit.elements import Elements, elements
from proofs_checks.audit.errors import MissingState, TraceError
from proofs_checks.audit.pooled import pooled_test
from proofs_checks.audit.rules import (
    FIELD_RULES,
    PRESETS,
    RECORDED_AS,
    Claim,
    reference_optimizer,
)
from proofs_checks.audit.states import in_matrix_form, reference_state, state_deviation
from proofs_checks.audit.trace import Trace, load
from proofs_checks.audit.verdicts import _said, _skipped_verdict, overall, verdict

Array = np.ndarray


def _dims(spec: dict[str, Any]) -> tuple[int, int]:
    """(n, r): the largest matrix dimension and the rank of one element."""
    s = spec["sizes"]
    r = s["r"]
    o = spec["options"]
    if spec["name"] == "stiefel":
        return s["d"], r
    heads = max(o.get("n_heads", 1), o.get("n_kv_heads", 1)) if "n_heads" in o else 1
    return max(s["m"], s["n"]) * heads, r


def replay_record(trace: Trace, k: int, claim: Claim | None = None) -> list[dict[str, Any]]:
    """Every kept element of record k: deviation, bound, the state after the step against the
    reference's, and the row's verdict (module docstring); against ``claim`` when given."""
    step = trace.meta["steps"][k]
    where = f"step {step['step']}, group {step['group']}"
    try:
        return _replay_record(trace, k, where, claim)
    except TraceError:
        raise
    except (
        KeyError,
        TypeError,
        ValueError,
        IndexError,
        OverflowError,
        np.linalg.LinAlgError,
    ) as err:
        raise TraceError(f"{where}: cannot be replayed ({type(err).__name__}: {err})") from None


def _replay_record(trace: Trace, k: int, where: str, claim: Claim | None) -> list[dict[str, Any]]:
    meta = trace.meta
    optimizer, step = meta["optimizer"], meta["steps"][k]
    # torch's ``maximize`` on the library's own optimizers, which follow −grad (negated before
    # any decay is added). geoopt keeps the flag but ignores it; a claimed rule is descent,
    # whatever the trace says (its hyperparameters are the claim's, never the trace's).
    ascent = (
        claim is None and optimizer in PRESETS and step["hyperparameters"].get("maximize") is True
    )
    if claim is not None:
        optimizer, step = claim.applied(step)
    spec = step["geometry"]
    try:
        el = elements(spec)
        x_parts, g_parts = _float64(trace.parts(k, "x")), _float64(trace.parts(k, "g"))
        if ascent:
            g_parts = [-g for g in g_parts]
        y_parts = _float64(trace.parts(k, "y")) if step["taken"] else None
        state = {key: _float64(trace.parts(k, f"state/{key}")) for key in step["state_keys"]}
        after = {key: _float64(trace.parts(k, f"after/{key}")) for key in step["after_keys"]}
    except (KeyError, TypeError) as err:
        message = f"{where}: the record is incomplete ({type(err).__name__}: {err})"
        raise TraceError(message) from None
    for what, arrays in (("x", x_parts), ("g", g_parts), ("y", y_parts or x_parts)):
        got = tuple(a.shape[1:] for a in arrays)
        if got != el.shapes:
            raise TraceError(
                f"{where}: {what} has parts of shapes {list(got)}; a {spec['name']} point of "
                f"these sizes has {list(el.shapes)}"
            )
    opt = reference_optimizer(optimizer, step, el.geometry)
    # an optimizer that is neither the library's nor geoopt's keeps its state under its own
    # names (``FramesSource``): what the claimed rule needs and it lacks is not checked
    unmapped = meta["optimizer"] not in RECORDED_AS.values()
    dtype = step["dtypes"][0]  # one of ``trace.DTYPES``: ``check_trace`` refused others
    n, r = _dims(spec)
    h = step["hyperparameters"]
    rows = []
    for j, e in enumerate(step["elements"]):
        x = el.point(x_parts, j)
        g = el.point(g_parts, j)
        if optimizer in FIELD_RULES and y_parts is not None:
            g = g - h.get("weight_decay", 0.0) * x  # geoopt added λX to it in place
        row: dict[str, Any] = {
            "step": step["step"],
            "group": step["group"],
            "names": step["names"],
            "params": step["params"],
            "element": e,
            "geometry": spec["name"],
            "dtype": dtype,
            "skipped": y_parts is None,
            "lr": h["lr"],
            "deviation": None,
            "bound": None,
            "state_deviation": None,
            "state_ratio": None,
        }
        residual = el.residual(x)
        accepted = residual <= _accepted(dtype)
        row.update(residual=residual, accepted=accepted)
        if y_parts is None:  # skipped by the port: right only for a non-finite gradient
            rows.append({**row, **_skipped_verdict(trace, step, el, g)})
            continue
        xp = el.project(x)
        delta = float(np.linalg.norm(el.compared(x) - el.compared(xp)))
        template = opt.init(el.geometry, xp)
        entries = {key: _element_entries(el, v, j) for key, v in state.items()}
        try:
            st = reference_state(template, entries, step["step"] - 1)
        except (TypeError, ValueError) as err:  # MissingState included
            if claim is None:
                raise TraceError(f"{where}, element {e}: {err}") from None
            if unmapped and isinstance(err, MissingState):  # nothing is claimed without it
                rows.append({**row, **_said("not auditable", f"not checked: {err}")})
            else:
                rows.append({**row, **_said("fail", f"the state is not the claimed rule's: {err}")})
            continue
        try:
            y_ref, new_state = opt.step(el.geometry, xp, g, st)
        except (TypeError, ValueError) as err:
            message = f"{where}, element {e}: the reference cannot take this step: {err}"
            raise TraceError(message) from None
        y = el.point(y_parts, j)
        c_ref, c_x = el.compared(y_ref), el.compared(xp)
        error = el.compared(y) - c_ref
        deviation = float(np.linalg.norm(error))
        length = float(np.linalg.norm(c_ref - c_x))
        # the deviation's component along the exact step, relative to it: a step taken with
        # (1 + δ) times the rule's lr has δ here, to first order in the step
        along = float(error @ (c_ref - c_x)) / length**2 if length > 0 else None
        kappa = max(el.conditioning(xp), el.conditioning(y_ref))
        amplification = 0.0
        if h.get("moment") == "elementwise":
            amplification = elementwise_amplification(
                el.geometry, xp, g, h["lr"], step["step"], h["betas"][1], length, n, r, dtype
            )
        factoring = optimizer in FIELD_RULES or (  # geoopt: Cayley's solve or QR
            spec["name"] == "stiefel"
            and spec["options"].get("retraction", "polar") in FACTORING_RETRACTIONS
        )
        size = float(np.linalg.norm(c_ref))
        kappa_step = max(kappa, amplification)
        bound = step_bound(dtype, delta, length, size, n, r, kappa_step, factoring)
        bound += amplification * delta
        state_ratio, state_dev, state_entry, unchecked = None, None, None, None
        if deviation <= bound:  # else the row fails by its point (y may not even be one)
            yp = el.project(y)
            entries = {key: _element_entries(el, v, j) for key, v in after.items()}
            try:
                recorded = reference_state(new_state, entries, step["step"], as_recorded=True)
            except MissingState as err:
                if not unmapped:
                    message = f"{where}, element {e}, the state after the step: {err}"
                    raise TraceError(message) from None
                recorded, unchecked = None, f"the state was not checked: {err}"
            except (TypeError, ValueError) as err:
                message = f"{where}, element {e}, the state after the step: {err}"
                raise TraceError(message) from None
            if recorded is not None:
                expected = new_state
                if el.compares_matrix:
                    recorded = in_matrix_form(recorded, el.geometry, yp)
                    expected = in_matrix_form(new_state, el.geometry, y_ref)
                kappa_state = max(kappa, el.conditioning(yp))
                state_ratio, state_dev, state_entry = state_deviation(
                    recorded, expected, dtype, delta, deviation, n, r, kappa_state
                )
        row.update(
            projection=delta,
            conditioning=kappa,
            step_length=length,
            deviation=deviation,
            along=along,
            bound=bound,
            bounded=length <= LARGEST_STEP,
            state_deviation=state_dev,
            state_ratio=state_ratio,
            state_entry=state_entry,
            unchecked=unchecked,
        )
        # at lr 0 the port leaves the point as it is; another library may round it (geoopt's
        # QR retraction re-factors x), which the bound, checked first, covers
        still = optimizer in FIELD_RULES or all(
            np.array_equal(a[j], b[j]) for a, b in zip(x_parts, y_parts, strict=True)
        )
        row.update(verdict(row, lr_zero=h["lr"] == 0, unchanged=still))
        rows.append(row)
    return rows


def _float64(arrays: Sequence[Array]) -> list[Array]:
    """float64 copies (exact: the recorded dtypes are float64, float32 or wider-stored ones)."""
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _element_entries(el: Elements, arrays: Sequence[Array], j: int) -> list[Any]:
    """The arrays of one state entry for element j, as leaves in the reference's order
    (group-major for a block point)."""
    if el.n_groups and arrays[0].ndim > 2:  # tensors (elements, G, ...): split the groups
        return [a[j][c] for c in range(el.n_groups) for a in arrays]
    return [a[j] for a in arrays]


def replay(trace: Trace, *, progress: bool = False, claim: Claim | None = None) -> dict[str, Any]:
    """Every record of a trace: one JSON-ready document with ``passed``,
    ``first_failure_step`` and ``steps`` (one row per element of each record); against the
    claimed rule when given (``Claim``), else the recorded one."""
    rows: list[dict[str, Any]] = []
    records = range(len(trace.meta["steps"]))
    for k in tqdm(
        records, desc="rattn audit", unit="record", file=sys.stderr, disable=not progress
    ):
        rows.extend(replay_record(trace, k, claim))
    for row in rows:  # JSON has no NaN or inf: a non-finite value is null (the row failed)
        for name, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[name] = None
    pooled = pooled_test(rows)
    return {
        **overall(rows, pooled),
        "pooled": pooled,
        "optimizer": trace.meta["optimizer"],
        "rule": None if claim is None else {"name": claim.rule, "settings": claim.settings},
        "partial": bool(trace.meta.get("partial", False)),
        "steps": rows,
        "versions": trace.meta.get("versions"),
    }


def audit(
    path: str | Path, *, progress: bool = False, claim: Claim | None = None
) -> dict[str, Any]:
    """Load a trace (``trace.load``, which checks its layout) and replay it (against
    ``claim`` when given); TraceError naming the file for one that cannot be read or
    replayed."""
    try:
        trace = load(path)
    except ValueError as err:
        raise TraceError(str(err)) from None
    if not trace.meta["steps"]:
        raise TraceError(f"{path}: the trace records no step")
    try:
        result = replay(trace, progress=progress, claim=claim)
    except TraceError as err:
        raise TraceError(f"{path}: {err}") from None
    return {"trace": str(path), **result}
