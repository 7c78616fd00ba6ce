"""The optimizer step of a whole model (``rattn bench model``).

``bench_model`` times one step of ``torch_port.RiemannianAdam`` over the parameters of the 12
blocks of GPT-2 small (85 M parameters: W_Q and W_K as 24 frame tensors (12 heads, 768, 64) on
St(768, 64), everything else plain, AdamW in the same optimizer) against ``torch.optim.AdamW``
(foreach) over the same parameters, all plain. Only the parameters' shapes are built (no
forward); the embeddings are left out (plain in both, their AdamW step is the same). torch and
torch_port are imported inside the functions (``rattn certify`` runs without torch).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from proofs_checks.bench.floors import ProductFloor, RouteFloor
from proofs_checks.bench.timing import (
    _check_repeats,
    _interleaved_rounds,
    _iqr,
    machine_environment,
)
from proofs_checks.memory import require_memory

#: GPT-2 small: 12 blocks of width 768, 12 heads of 64, MLP width 3072.
GPT2_SMALL = {"layers": 12, "d": 768, "heads": 12, "mlp": 3072}
#: The target: the whole model's step at most this many times AdamW's.
MODEL_TARGET_VS_ADAMW = 1.05
PORT_ROW = "torch_port RiemannianAdam (frames on W_Q, W_K)"
ADAMW_ROW = "torch AdamW (foreach, all plain)"
FLOOR_ROW = "floor: AdamW on the plain parameters + the frames' 6 batched products"
PASSES_ROW = "floor with passes: the floor + the frames' 4 passes (G, m, W + c·m, ‖g‖)"
ROUTE_ROW = "floor of the step's route: AdamW on the plain parameters + the frames' route"
LR = 1e-3


def model_shapes(c: dict[str, int] | None = None) -> tuple[list[tuple], list[tuple]]:
    """(frame shapes, plain shapes) of the blocks: per block W_Q, W_K (heads, d, d/heads) and
    the rest of GPT-2's block — LayerNorm gains and biases, W_V (d, d), the q/k/v bias (3d),
    the attention output (d, d) and its bias, the MLP (d, mlp), (mlp,), (mlp, d), (d,)."""
    c = GPT2_SMALL if c is None else c
    d, h, m = c["d"], c["heads"], c["mlp"]
    frames, plain = [], []
    for _ in range(c["layers"]):
        frames += [(h, d, d // h)] * 2
        plain += [(d,), (d,), (d, d), (3 * d,), (d, d), (d,), (d,), (d,)]
        plain += [(d, m), (m,), (m, d), (d,)]
    return frames, plain


def _entries(shapes: list[tuple]) -> int:
    return sum(int(np.prod(s)) for s in shapes)


def check_model_memory(dtypes: tuple[str, ...], config: dict[str, int] | None = None) -> None:
    """Refuse, before torch is imported, a run whose estimate exceeds the memory limit: 21
    copies of every entry (each of the five candidates holds its parameters, gradients and two
    state tensors or buffers of every entry, and foreach AdamW makes temporaries of its
    parameters' size) and 12 more of every frame entry (the floors' and the port's buffers);
    the peak resident set of a float64 run at GPT-2 small's size was 14.7 GB, 0.94 of this
    estimate, the process's own memory included."""
    frames, plain = model_shapes(config)
    widest = 8 if "float64" in dtypes else 4
    copies = 21 * (_entries(frames) + _entries(plain)) + 12 * _entries(frames)
    require_memory("bench model", widest * copies)


def _candidates(
    dtype: Any, seed: int, config: dict[str, int] | None
) -> dict[str, tuple[Any, list[Any]]]:
    """name -> (optimizer, parameters), each on its own copy of the same values and gradients
    (left attached, so that every call is a full step)."""
    import torch

    import torch_port as tp

    gen = torch.Generator().manual_seed(seed)
    frame_shapes, plain_shapes = model_shapes(config)
    frames = [tp.Stiefel(s[-2], s[-1]).random_point(gen, s[:-2], dtype=dtype) for s in frame_shapes]
    plain = [
        0.02 * torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in plain_shapes
    ]
    grads = [
        torch.randn(t.shape, generator=gen, dtype=torch.float64).to(dtype) for t in frames + plain
    ]

    def params() -> list[Any]:
        ps = [torch.nn.Parameter(t.clone()) for t in frames + plain]
        for p, g in zip(ps, grads, strict=True):
            p.grad = g.clone()
        return ps

    port = params()
    groups = [
        {"params": port[: len(frames)], "geometry": "stiefel"},
        {"params": port[len(frames) :], "weight_decay": 1e-2},
    ]
    adamw = params()
    floor, passes, route = params(), params(), params()
    n = len(frames)
    return {
        PORT_ROW: (tp.RiemannianAdam(groups, lr=LR), port),
        ADAMW_ROW: (torch.optim.AdamW(adamw, lr=LR, foreach=True), adamw),
        FLOOR_ROW: (_ModelFloor(ProductFloor(floor[:n]), floor[n:]), floor),
        PASSES_ROW: (_ModelFloor(ProductFloor(passes[:n], passes=True), passes[n:]), passes),
        ROUTE_ROW: (_ModelFloor(RouteFloor(route[:n]), route[n:]), route),
    }


class _ModelFloor:
    """A floor of this model's step: torch's AdamW (foreach) on the plain parameters, as the
    port runs them, plus a floor of the frames (``ProductFloor``: the six batched products per
    frame, with ``passes`` the Adam rule's four passes over them; ``RouteFloor``: the whole
    arithmetic of the step's route)."""

    def __init__(self, frames: Any, plain: list[Any]) -> None:
        import torch

        self.frames = frames
        self.plain = torch.optim.AdamW(plain, lr=LR, foreach=True, weight_decay=1e-2)

    def step(self) -> None:
        self.frames.step()
        self.plain.step()


def bench_model(
    repeats: int = 5,
    seed: int = 0,
    *,
    progress: bool = True,
    dtypes: tuple[str, ...] = ("float32", "float64"),
    config: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Time the two optimizers' steps and the three floors (``_ModelFloor``: the products,
    with the rule's passes, and the step's whole route), interleaved round by round
    (``_interleaved_rounds``), in each dtype, on GPT-2 small's blocks (or ``config``: layers,
    d, heads, mlp); returns ``{"rows": [{"dtype", "name", "median_s", "iqr_s",
    "ratio_to_adamw"}], "targets": [{"dtype", "port_over_adamw", "met", "floor_over_adamw",
    "floor_with_passes_over_adamw", "route_floor_over_adamw"}], "parameters",
    "frame_parameters", "notes", "environment"}``. A floor above the target puts the target out
    of reach of any step that forms the six products (and makes the rule's passes, or takes
    the step's route)."""
    _check_repeats(repeats)
    check_model_memory(dtypes, config)
    import torch

    names = {"float32": torch.float32, "float64": torch.float64}
    bad = [t for t in dtypes if t not in names]
    if bad:
        raise ValueError(f"bench model dtypes are float32 and float64, got {bad}")
    rows, targets = [], []
    for dt in dtypes:
        cands = _candidates(names[dt], seed, config)
        fns = {name: opt.step for name, (opt, _) in cands.items()}
        _, samples = _interleaved_rounds(fns, repeats, desc=f"bench model {dt}", progress=progress)
        adamw = float(np.median(samples[ADAMW_ROW]))
        for name in cands:
            med = float(np.median(samples[name]))
            rows.append(
                {
                    "dtype": dt,
                    "name": name,
                    "median_s": med,
                    "iqr_s": _iqr(samples[name]),
                    "ratio_to_adamw": med / adamw,
                }
            )
        by = {x["name"]: x["median_s"] for x in rows if x["dtype"] == dt}
        ratio = by[PORT_ROW] / adamw
        targets.append(
            {
                "dtype": dt,
                "port_over_adamw": ratio,
                "met": ratio <= MODEL_TARGET_VS_ADAMW,
                "floor_over_adamw": by[FLOOR_ROW] / adamw,
                "floor_with_passes_over_adamw": by[PASSES_ROW] / adamw,
                "route_floor_over_adamw": by[ROUTE_ROW] / adamw,
            }
        )
        del cands, fns
    frames, plain = model_shapes(config)
    return {
        "dtypes": list(dtypes),
        "repeats": int(repeats),
        "parameters": _entries(frames) + _entries(plain),
        "frame_parameters": _entries(frames),
        "rows": rows,
        "targets": targets,
        "notes": [
            f"lr {LR:g} for both; AdamW weight_decay 1e-2 on the plain parameters of both "
            "(torch's default); the frames with the port's defaults (moment='frame', polar "
            "retraction, no decay)."
        ],
        "environment": machine_environment(
            "torch",
            loadavg_at_end=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            torch_threads=torch.get_num_threads(),
        ),
    }


def format_model(result: dict[str, Any]) -> str:
    """Markdown for a ``bench_model`` result."""
    lines = [
        f"Optimizer step of GPT-2 small's 12 blocks ({result['parameters'] / 1e6:.1f} M "
        f"parameters, {result['frame_parameters'] / 1e6:.1f} M of them in frames), "
        f"{result['repeats']} interleaved rounds:",
        "",
        "| dtype | optimizer | median (ms) | IQR (ms) | × AdamW |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for x in result["rows"]:
        lines.append(
            f"| {x['dtype']} | {x['name']} | {1e3 * x['median_s']:.1f} | {1e3 * x['iqr_s']:.1f} "
            f"| {x['ratio_to_adamw']:.2f} |"
        )
    lines.append("")
    for t in result["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        lines.append(
            f"- {t['dtype']}: port / AdamW = {t['port_over_adamw']:.2f} "
            f"(target ≤ {MODEL_TARGET_VS_ADAMW:g}: {verdict}); floor / AdamW = "
            f"{t['floor_over_adamw']:.2f}; floor with passes / AdamW = "
            f"{t['floor_with_passes_over_adamw']:.2f}; floor of the step's route / AdamW = "
            f"{t['route_floor_over_adamw']:.2f}"
        )
    lines += ["", *result["notes"]]
    return "\n".join(lines)
