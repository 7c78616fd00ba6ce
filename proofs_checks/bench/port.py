"""The torch port's optimizer step (``rattn bench port``).

``bench_port`` times one step of ``torch_port.RiemannianAdam`` against ``torch.optim.AdamW`` and
geoopt's ``RiemannianAdam``, with the optimizer state and a profile of where the port's step goes;
``format_port`` renders the result as Markdown. torch, torch_port and geoopt are imported inside
the functions: ``rattn certify`` and the other benchmarks must work without torch
(tests/test_project.py checks module-level imports).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from proofs_checks.bench.floors import PORT_LR, LinearityFloor, ProductFloor, RouteFloor
from proofs_checks.bench.peers import _import_geoopt
from proofs_checks.bench.profile import port_attribution, port_inputs
from proofs_checks.bench.timing import (
    _check_repeats,
    _interleaved_rounds,
    _iqr,
    machine_environment,
)
from proofs_checks.memory import require_memory

PORT_ROW = "torch_port RiemannianAdam"
ADAMW_ROW = "torch AdamW (foreach)"
GEOOPT_ROW = "geoopt RiemannianAdam (EuclideanStiefel)"
FLOOR_ROW = "floor: 6 batched products, 3 XᵀG (r×d·d×r) + 3 X·S (d×r·r×r)"
PASSES_ROW = "floor with passes: the 6 products and 4 passes over the frames (G, m, W + c·m, ‖g‖)"
LINEARITY_ROW = (
    "floor of the linearity route: 5 products (3 XᵀY, 2 X·S) and 3 passes (‖G‖, m, W + c·m)"
)
ROUTE_ROW = "floor of the step's route: its products, passes, copy of G and r×r work, no checks"
CAPTURABLE_ROW = "torch_port RiemannianAdam, capturable (Δ = 0.5)"
COMPILED_ROW = "torch_port RiemannianAdam, capturable, torch.compile(fullgraph=True)"
#: The capturable rows' trust radius: above every step of the benchmark (‖ξ‖ ≈ lr·sqrt(d·r)
#: ≤ 0.23), so they take the same steps as the port's row.
CAPTURABLE_RADIUS = 0.5

#: Issue 4's targets for size (b): the port's step at most this many times AdamW's ...
PORT_TARGET_VS_ADAMW = 2.0
#: ... at least this many times faster than geoopt's ...
PORT_TARGET_VS_GEOOPT = 3.0
#: ... and the frames' optimizer state about this fraction of AdamW's.
PORT_TARGET_STATE = 0.5
#: The target for size (b): the port's step at most this many times the floor's.
PORT_TARGET_VS_FLOOR = 1.3


def _port_sizes(d: int, r: int) -> list[dict[str, Any]]:
    """(a) one d×r frame; (b) W_Q and W_K of 12 layers × 12 heads × (768×64), each stored as one
    batched frame parameter of shape (12, 12, 768, 64)."""
    return [
        {"key": "a", "label": f"(a) one {d}×{r} frame", "params": 1, "batch": [], "d": d, "r": r},
        {
            "key": "b",
            "label": "(b) W_Q and W_K of 12 layers × 12 heads × (768×64)",
            "params": 2,
            "batch": [12, 12],
            "d": 768,
            "r": 64,
        },
    ]


def check_port_sizes(d: int, r: int, sizes: list[dict[str, Any]] | None = None) -> None:
    """Refuse, before torch is imported or anything allocated, sizes ``bench_port`` cannot run:
    not 1 ≤ r ≤ d, or an estimated peak above ``memory_limit``. The estimate: 64 float64 copies
    of every frame (d×r, with an r×r matrix) of ``sizes`` (default ``_port_sizes(d, r)``): every
    candidate holds its own frames, gradients and state or buffers, and the capturable rows
    make frame-sized temporaries; the peak resident set of a run at the defaults was 58 such
    copies (7.1 GB), the process's own memory included."""
    if isinstance(d, bool) or isinstance(r, bool) or not (1 <= r <= d):
        raise ValueError(f"bench port needs 1 ≤ r ≤ d, got d={d}, r={r}")
    sizes = _port_sizes(d, r) if sizes is None else sizes
    entries = sum(s["params"] * math.prod(s["batch"]) * (s["d"] + s["r"]) * s["r"] for s in sizes)
    require_memory(f"bench port at d={d}, r={r}", 8 * 64 * entries)


def _state_bytes(opt: Any) -> int:
    """Bytes of every tensor in an optimizer's state (the "step" counters included)."""
    import torch

    return sum(
        t.numel() * t.element_size()
        for state in opt.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )


class _Compiled:
    """An optimizer whose ``step`` is ``torch.compile(opt.step, fullgraph=True)`` (compiled at
    the first call, a warm-up call of the benchmark)."""

    def __init__(self, opt: Any) -> None:
        import torch

        self.state = opt.state
        self.step = torch.compile(opt.step, fullgraph=True)


def _port_candidates(
    size: dict[str, Any], dtype: Any, seed: int, geoopt: Any, device: str = "cpu"
) -> dict[str, tuple[Any, list[Any]]]:
    """name -> (optimizer, its parameters), each on its own copy of the same frames with the
    same gradients attached (``step`` does not clear them, so every call steps again)."""
    import torch

    import torch_port as tp

    points, grads = port_inputs(size, dtype, seed, device)

    def params(make: Callable[[Any], Any]) -> list[Any]:
        ps = [make(p.clone()) for p in points]
        for p, g in zip(ps, grads, strict=True):
            p.grad = g.clone()
        return ps

    out: dict[str, tuple[Any, list[Any]]] = {}
    ps = params(torch.nn.Parameter)
    out[PORT_ROW] = (tp.RiemannianAdam([{"params": ps, "geometry": "stiefel"}], lr=PORT_LR), ps)
    for row, compiled in ((CAPTURABLE_ROW, False), (COMPILED_ROW, True)):
        ps = params(torch.nn.Parameter)
        opt = tp.RiemannianAdam(
            [{"params": ps, "geometry": "stiefel"}],
            lr=PORT_LR,
            trust_radius=CAPTURABLE_RADIUS,
            capturable=True,
        )
        out[row] = (_Compiled(opt) if compiled else opt, ps)
    ps = params(torch.nn.Parameter)
    out[ADAMW_ROW] = (torch.optim.AdamW(ps, lr=PORT_LR, foreach=True), ps)
    if geoopt is not None and dtype != torch.bfloat16:  # its QR retraction has no bfloat16
        stiefel = geoopt.EuclideanStiefel()
        ps = params(lambda t: geoopt.ManifoldParameter(t, manifold=stiefel))
        out[GEOOPT_ROW] = (geoopt.optim.RiemannianAdam(ps, lr=PORT_LR), ps)

    ps = params(torch.nn.Parameter)
    out[FLOOR_ROW] = (ProductFloor(ps), ps)
    ps = params(torch.nn.Parameter)
    out[PASSES_ROW] = (ProductFloor(ps, passes=True), ps)
    ps = params(torch.nn.Parameter)
    out[LINEARITY_ROW] = (LinearityFloor(ps), ps)
    ps = params(torch.nn.Parameter)
    out[ROUTE_ROW] = (RouteFloor(ps), ps)
    return out


def bench_port(
    d: int = 512,
    r: int = 64,
    repeats: int = 5,
    seed: int = 0,
    *,
    progress: bool = True,
    dtypes: tuple[str, ...] = ("float32", "float64"),
    sizes: list[dict[str, Any]] | None = None,
    profile: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Time one optimizer step of ``torch_port.RiemannianAdam`` against ``torch.optim.AdamW``
    (foreach=True) and, when geoopt is importable, geoopt's ``RiemannianAdam`` on
    ``geoopt.EuclideanStiefel`` (its retraction: sign-fixed QR; transport: projection), for
    (a) one d×r frame and (b) W_Q and W_K of 12 layers × 12 heads × (768×64) (two batched frame
    parameters of shape (12, 12, 768, 64)), in each dtype of ``dtypes``; with the bytes of each
    optimizer's state tensors.

    All optimizers get lr = PORT_LR and otherwise torch's or geoopt's defaults (AdamW:
    weight_decay 1e-2), the same starting frames and the same Gaussian gradients, left attached
    so that every timed call is a full step. Candidates are interleaved round by round
    (``_interleaved_rounds``: warm-up, calls per sample, ``repeats`` rounds, order rotated,
    garbage collector off). A fourth row, FLOOR_ROW, times only the six batched d×r·r products a
    projection-and-polar step needs per frame (rgrad, Gram, polar product, transport), in the
    working dtype: if it alone exceeds PORT_TARGET_VS_ADAMW × AdamW, the time target is out of
    reach on that machine for this algorithm with torch's batched matmul, however the rest of the
    step is written. PASSES_ROW adds the rule's four passes over the frames to those products
    (``ProductFloor(passes=True)``), LINEARITY_ROW times the products and passes of the route
    with lazy transport (``LinearityFloor``), and ROUTE_ROW the whole arithmetic of the step's
    own route, r×r work included, without its checks (``RouteFloor``). Rows report the median
    and IQR of seconds per step, ``ratio_to_adamw`` and ``state_bytes`` (after the warm-up
    steps). With ``profile``, one port step on the last size is attributed to source lines and
    operators (``port_attribution``), for each dtype.

    Returns ``{"rows": [{"size", "label", "dtype", "name", "median_s", "iqr_s",
    "ratio_to_adamw", "state_bytes", "param_bytes", "calls_per_sample"}], "targets": [...],
    "profile": {dtype: {...}}, "notes", "environment"}``.
    """
    _check_repeats(repeats)
    sizes = _port_sizes(d, r) if sizes is None else sizes
    check_port_sizes(d, r, sizes)
    import torch

    names = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
    bad = [t for t in dtypes if t not in names]
    if bad:
        raise ValueError(f"bench port dtypes are float32, float64 and bfloat16, got {bad}")
    if device not in ("cpu", "cuda") or (device == "cuda" and not torch.cuda.is_available()):
        raise ValueError(f"bench port runs on cpu or cuda (when available), got {device!r}")
    notes: list[str] = []
    geoopt = _import_geoopt(notes)
    rows: list[dict[str, Any]] = []

    def synced(step: Callable[[], Any]) -> Callable[[], None]:
        """A step that returns when the device has finished it (CUDA runs asynchronously)."""
        if device == "cpu":
            return step
        return lambda: (step(), torch.cuda.synchronize())

    for size in sizes:
        for dt in dtypes:
            cands = _port_candidates(size, names[dt], seed, geoopt, device)
            fns = {name: synced(opt.step) for name, (opt, _) in cands.items()}
            numbers, samples = _interleaved_rounds(
                fns, repeats, desc=f"bench port {size['key']} {dt}", progress=progress
            )
            adamw = float(np.median(samples[ADAMW_ROW]))
            for name, (opt, ps) in cands.items():
                med = float(np.median(samples[name]))
                rows.append(
                    {
                        "size": size["key"],
                        "label": size["label"],
                        "dtype": dt,
                        "name": name,
                        "median_s": med,
                        "iqr_s": _iqr(samples[name]),
                        "ratio_to_adamw": med / adamw,
                        "state_bytes": _state_bytes(opt),
                        "param_bytes": sum(p.numel() * p.element_size() for p in ps),
                        "calls_per_sample": numbers[name],
                    }
                )
            del cands, fns
    targets = []
    for size in sizes:
        for dt in dtypes:
            by = {x["name"]: x for x in rows if x["size"] == size["key"] and x["dtype"] == dt}
            port, adamw = by[PORT_ROW], by[ADAMW_ROW]
            t = {
                "size": size["key"],
                "dtype": dt,
                "port_over_adamw": port["median_s"] / adamw["median_s"],
                "state_over_adamw": port["state_bytes"] / adamw["state_bytes"],
                "geoopt_over_port": (
                    by[GEOOPT_ROW]["median_s"] / port["median_s"] if GEOOPT_ROW in by else None
                ),
            }
            t["time_vs_adamw_met"] = t["port_over_adamw"] <= PORT_TARGET_VS_ADAMW
            t["vs_geoopt_met"] = (
                None
                if t["geoopt_over_port"] is None
                else t["geoopt_over_port"] >= PORT_TARGET_VS_GEOOPT
            )
            t["state_met"] = t["state_over_adamw"] <= PORT_TARGET_STATE * 1.05
            t["floor_over_adamw"] = by[FLOOR_ROW]["median_s"] / adamw["median_s"]
            t["port_over_floor"] = port["median_s"] / by[FLOOR_ROW]["median_s"]
            t["port_over_floor_with_passes"] = port["median_s"] / by[PASSES_ROW]["median_s"]
            t["floor_met"] = t["port_over_floor"] <= PORT_TARGET_VS_FLOOR
            t["linearity_floor_over_floor"] = (
                by[LINEARITY_ROW]["median_s"] / by[FLOOR_ROW]["median_s"]
            )
            t["route_floor_over_floor"] = by[ROUTE_ROW]["median_s"] / by[FLOOR_ROW]["median_s"]
            t["port_over_route_floor"] = port["median_s"] / by[ROUTE_ROW]["median_s"]
            targets.append(t)
    profile_rows: dict[str, Any] = {}
    if profile and device != "cpu":
        notes.append("No profile on CUDA: operators run asynchronously there.")
    if profile and device == "cpu":
        big = sizes[-1]
        for dt in dtypes:
            profile_rows[dt] = port_attribution(big, names[dt], seed)
        notes.append(
            f"Profile on size ({big['key']}): one port step after two warm-up steps, every torch "
            "operator call timed under a TorchDispatchMode and charged to the innermost "
            "torch_port source line (``port_attribution``); 'step' is the same step "
            "uninstrumented."
        )
    notes.append(
        f"lr {PORT_LR:g} for all; AdamW with torch's defaults otherwise (weight_decay 1e-2, "
        "foreach=True); geoopt RiemannianAdam with its defaults on ManifoldParameter("
        "manifold=EuclideanStiefel()) (QR retraction, projection transport, full-size "
        "exp_avg_sq); the port's RiemannianAdam with moment='frame' (one √v per frame) and the "
        "polar retraction."
    )
    env = machine_environment(
        "torch",
        "geoopt",
        loadavg_at_end=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        torch_threads=torch.get_num_threads(),
    )
    return {
        "device": device,
        "dtypes": list(dtypes),
        "repeats": int(repeats),
        "seed": int(seed),
        "lr": PORT_LR,
        "sizes": sizes,
        "rows": rows,
        "targets": targets,
        "profile": profile_rows,
        "notes": notes,
        "environment": env,
    }


def format_port(result: dict[str, Any]) -> str:
    """Markdown for a ``bench_port`` result: the step table, the targets of size (b), the stage
    breakdown and the profile, then the notes."""
    lines = [
        f"Optimizer step, {result['repeats']} interleaved rounds (median and interquartile "
        "range of seconds per step); state = bytes of the optimizer's state tensors:",
        "",
        "| size | dtype | optimizer | median (ms) | IQR (ms) | × AdamW | state (MB) "
        "| state / AdamW |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    adamw_state = {
        (x["size"], x["dtype"]): x["state_bytes"] for x in result["rows"] if x["name"] == ADAMW_ROW
    }
    for x in result["rows"]:
        lines.append(
            f"| {x['size']} | {x['dtype']} | {x['name']} | {1e3 * x['median_s']:.2f} "
            f"| {1e3 * x['iqr_s']:.2f} | {x['ratio_to_adamw']:.2f} "
            f"| {x['state_bytes'] / 2**20:.2f} "
            f"| {x['state_bytes'] / adamw_state[(x['size'], x['dtype'])]:.2f} |"
        )
    lines.append("")
    labels = {s["key"]: s["label"] for s in result["sizes"]}
    for t in result["targets"]:
        verdict = "met" if t["time_vs_adamw_met"] else "NOT met"
        line = (
            f"- {labels[t['size']]}, {t['dtype']}: port / AdamW = {t['port_over_adamw']:.2f} "
            f"(target ≤ {PORT_TARGET_VS_ADAMW:g}: {verdict})"
        )
        if t["geoopt_over_port"] is not None:
            verdict = "met" if t["vs_geoopt_met"] else "NOT met"
            line += (
                f"; geoopt / port = {t['geoopt_over_port']:.2f} "
                f"(target ≥ {PORT_TARGET_VS_GEOOPT:g}: {verdict})"
            )
        verdict = "met" if t["state_met"] else "NOT met"
        line += (
            f"; state port / AdamW = {t['state_over_adamw']:.3f} "
            f"(target ≈ {PORT_TARGET_STATE:g}: {verdict})"
        )
        verdict = "met" if t["floor_met"] else "NOT met"
        line += (
            f"; floor / AdamW = {t['floor_over_adamw']:.2f}; port / floor = "
            f"{t['port_over_floor']:.2f} (target ≤ {PORT_TARGET_VS_FLOOR:g}: {verdict}); "
            f"port / floor with passes = {t['port_over_floor_with_passes']:.2f}; "
            f"floor of the linearity route / floor = {t['linearity_floor_over_floor']:.2f}; "
            f"floor of the step's route / floor = {t['route_floor_over_floor']:.2f}; "
            f"port / floor of the step's route = {t['port_over_route_floor']:.2f}"
        )
        lines.append(line)
    for dt, prof in result.get("profile", {}).items():
        lines += [
            "",
            f"Where one port step goes, size ({result['sizes'][-1]['key']}), {dt}: step "
            f"{1e3 * prof['step_s']:.0f} ms uninstrumented, {1e3 * prof['instrumented_s']:.0f} ms "
            f"instrumented, of which {1e3 * prof['ops_s']:.0f} ms inside torch operators "
            f"(top {len(prof['sites'])} source lines, then operators):",
            "",
            "| torch_port source line | operator calls | ms | share |",
            "| --- | ---: | ---: | ---: |",
        ]
        for x in prof["sites"]:
            lines.append(
                f"| {x['site']} | {x['calls']} | {1e3 * x['seconds']:.1f} | {x['share']:.0%} |"
            )
        lines += ["", "| operator | calls | ms | share |", "| --- | ---: | ---: | ---: |"]
        for x in prof["operators"]:
            lines.append(
                f"| {x['op']} | {x['calls']} | {1e3 * x['seconds']:.1f} | {x['share']:.0%} |"
            )
    lines.append("")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines)
