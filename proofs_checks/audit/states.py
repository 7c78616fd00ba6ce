"""The optimizer's state in a replay: the port's recorded entries in the layout of the
reference's state (``reference_state``), and the recorded state after a step against the
reference's, entry by entry, within ``bounds.state_bound`` (``state_deviation``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from proofs_checks.audit.bounds import state_bound
from proofs_checks.audit.errors import MissingState, TraceError
from reference import field_rules as fr
from reference import optim as ro
from reference.geometry import like, parts

Array = np.ndarray


def reference_state(
    template: Any, entries: dict[str, list[Any]], count: int, *, as_recorded: bool = False
) -> Any:
    """The port's state entries of one element (``entries``: key -> its arrays, group-major for
    a block point) in the layout of ``template``, the state the reference's ``init`` makes: an
    ``AdamState`` takes the count, "exp_avg" and "sqrt_v", a ``TraceState`` "momentum_buffer";
    each is checked to fill its field exactly (shapes and number of leaves). geoopt's states
    (``reference.field_rules``) take "exp_avg", "exp_avg_sq" and "max_exp_avg_sq", or
    "momentum_buffer"; its second moments, one value per frame kept broadcast over the
    frame's entries (which a vectorised update may round differently), enter a step as their
    mean and are compared ``as_recorded``, entry by entry."""

    def recorded(key: str) -> list[Any]:
        if key not in entries:
            raise MissingState(f"the recorded state has no {key!r}")
        return entries[key]

    def fill(field: Any, key: str) -> Any:
        values = recorded(key)
        if isinstance(field, tuple) and all(isinstance(v, float) for v in field):  # √v per frame
            flat = np.concatenate([np.ravel(v) for v in values])
            if len(flat) != len(field):
                raise TraceError(f"state {key!r}: {len(flat)} values for {len(field)} frames")
            return tuple(float(v) for v in flat)
        leaves = parts(field)
        if len(leaves) != len(values) or any(
            np.shape(a) != np.shape(b) for a, b in zip(leaves, values, strict=True)
        ):
            raise TraceError(
                f"state {key!r}: shapes {[np.shape(v) for v in values]} do not fit the "
                f"reference's {[np.shape(a) for a in leaves]}"
            )
        return like(field, list(values)) if isinstance(field, tuple) else values[0]

    def per_frame(key: str) -> Any:
        """geoopt's second moment: one value per frame, kept broadcast over its entries."""
        a = np.asarray(recorded(key)[0])
        return a if as_recorded else float(np.mean(a))

    def build(t: Any) -> Any:
        if isinstance(t, fr.AdamState):
            amsgrad = "max_exp_avg_sq" in entries
            v_max = per_frame("max_exp_avg_sq") if amsgrad else 0.0
            return fr.AdamState(count, fill(t.m, "exp_avg"), per_frame("exp_avg_sq"), v_max)
        if isinstance(t, fr.MomentumState):  # geoopt seeds the buffer at its first step
            buffer = entries.get("momentum_buffer")
            return fr.MomentumState(
                count if buffer else 0, np.asarray(buffer[0]) if buffer else None
            )
        if isinstance(t, ro.AdamState):
            return ro.AdamState(count, fill(t.m, "exp_avg"), fill(t.sqrt_v, "sqrt_v"))
        if isinstance(t, ro.TraceState):
            return ro.TraceState(fill(t.m, "momentum_buffer"))
        if isinstance(t, tuple):
            return tuple(build(s) for s in t)
        return t

    return template if count == 0 else build(template)


def state_leaves(state: Any) -> list[tuple[str, Any]]:
    """(field, value) of every number and array of a reference state, in order: the count, then
    each moment's arrays and √v's values."""
    out: list[tuple[str, Any]] = []
    if isinstance(state, ro.AdamState):
        out.append(("count", state.count))
        out += [("exp_avg", a) for a in parts(state.m)]
        out += [("sqrt_v", v) for v in parts(state.sqrt_v)]
    elif isinstance(state, ro.TraceState):
        out += [("momentum_buffer", a) for a in parts(state.m)]
    elif isinstance(state, fr.AdamState):  # geoopt's names
        out += [("count", state.count), ("exp_avg", state.m), ("exp_avg_sq", state.v)]
        out.append(("max_exp_avg_sq", state.v_max))
    elif isinstance(state, fr.MomentumState):  # geoopt counts SGD's steps per group, not here
        out += [("momentum_buffer", state.buffer)] if state.buffer is not None else []
    elif isinstance(state, tuple):
        for s in state:
            out += state_leaves(s)
    return out


def in_matrix_form(state: Any, geometry: Any, point: Any) -> Any:
    """The state with each moment as the ambient matrix it represents at ``point``
    (``tangent_to_matrix``) and per-entry √v left out: for the geometries compared by W, whose
    factors after a step are fixed only up to the group (R1's SVD chooses them), so that a
    moment's factor coordinates differ between two representations of one point while the
    tangent matrix does not; the per-frame √v (a metric norm) needs no change."""
    if isinstance(state, ro.AdamState):
        scalar = all(isinstance(v, float) for v in state.sqrt_v)
        return state._replace(
            m=geometry.tangent_to_matrix(point, state.m),
            sqrt_v=state.sqrt_v if scalar else (),
        )
    if isinstance(state, ro.TraceState):
        return ro.TraceState(geometry.tangent_to_matrix(point, state.m))
    if isinstance(state, tuple):
        return tuple(in_matrix_form(s, geometry, point) for s in state)
    return state


def state_deviation(
    recorded: Any,
    expected: Any,
    dtype: str,
    delta: float,
    deviation: float,
    n: int,
    r: int,
    kappa: float = 1.0,
) -> tuple[float, float, str | None]:
    """(the largest ratio deviation/bound over the entries, that entry's deviation, its name)
    between the state recorded before a step and the reference's after the step before; each
    entry (all parts of a moment) is taken whole; the counts must agree exactly (a bound of
    1/2)."""
    got: dict[str, list[Array]] = {}
    want: dict[str, list[Array]] = {}
    leaves, wanted = state_leaves(recorded), state_leaves(expected)
    if [name for name, _ in leaves] != [name for name, _ in wanted]:
        return math.inf, math.inf, f"entries {[n for n, _ in leaves]}, not the rule's"
    for (name, a), (_, b) in zip(leaves, wanted, strict=True):
        if name == "count":
            if a != b:  # counts agree exactly: a bound of 1/2 on |Δcount|
                return 2.0 * abs(a - b), float(abs(a - b)), "count"
            continue
        if np.ndim(b) == 0 and np.ndim(a) > 0:  # one value per frame, recorded broadcast
            b = np.full(np.shape(a), b)
        got.setdefault(name, []).append(np.ravel(a))
        want.setdefault(name, []).append(np.ravel(b))
    worst: tuple[float, float, str | None] = (0.0, 0.0, None)
    for name in want:
        a, b = np.concatenate(got[name]), np.concatenate(want[name])
        dev = float(np.linalg.norm(a - b))
        bound = state_bound(dtype, delta, deviation, float(np.linalg.norm(b)), n, r, kappa)
        ratio = dev / bound if bound > 0 else (0.0 if dev == 0 else math.inf)
        if ratio > worst[0] or worst[2] is None:
            worst = (ratio, dev, name)
    return worst
