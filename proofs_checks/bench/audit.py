"""What recording a run costs (``rattn bench audit``): the recorder of ``torch_port.audit`` on the
attention frames of a GPT-2-small-shaped model.

The model: W_Q, W_K, W_V and W_O of ``layers`` layers, each one Stiefel parameter of ``heads``
frames of d×r (GPT-2 small: 12 layers, 12 heads, 768×64: 576 frames, 28M entries), float32,
``RiemannianAdam``, fixed Gaussian gradients. Three copies step side by side, interleaved round
by round (``timing._interleaved_rounds``):

- ``step``: the optimizer step alone (the baseline, measured in the same run);
- ``step, hooks idle``: the step with a recorder attached that records nothing at this step (its
  hooks only read the step counts);
- ``step, recorded``: the step with a recorder that records it (``frames`` frames of each
  parameter: their points, gradients, state and new points, written to a temporary file);
- ``the idle hooks alone``: the two hooks of the idle recorder, called without a step (their
  cost, which the difference of the first two rows measures only within noise).

The overhead of recording every ``every``-th step, per step, relative to the step, is then
((every − 1)·hooks + (recorded − step))/every/step. The issue's target: ≤ 2% at
every = 100 with ≤ 1 frame in 8. The gradients are set, not computed, so the step is the
optimizer's alone: a forward and backward pass would make the ratio smaller still.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from proofs_checks.bench.timing import (
    _check_repeats,
    _interleaved_rounds,
    _iqr,
    machine_environment,
)

AUDIT_TARGET = 0.02
STEP_ROW = "step"
IDLE_ROW = "step, hooks idle"
RECORDED_ROW = "step, recorded"
HOOKS_ROW = "the idle hooks alone"


def bench_audit(
    layers: int = 12,
    heads: int = 12,
    d: int = 768,
    r: int = 64,
    every: int = 100,
    frames: int = 1,
    repeats: int = 5,
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """Time the three candidates of the module docstring; JSON-ready result."""
    import torch

    import torch_port as tp
    from proofs_checks.audit import trace as trace_file
    from torch_port import audit

    _check_repeats(repeats)
    torch.manual_seed(0)

    def model() -> tuple[list[torch.nn.Parameter], Any]:
        gen = torch.Generator().manual_seed(0)
        params = [
            torch.nn.Parameter(tp.Stiefel(d, r).random_point(gen, (heads,)).float())
            for _ in range(4 * layers)
        ]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt = tp.RiemannianAdam([{"params": params, "geometry": "stiefel"}], lr=1e-3)
        opt.step()  # the state exists, as in a run under way
        return params, opt

    with tempfile.TemporaryDirectory() as tmp:
        _, plain = model()
        _, idle = model()
        _, recorded = model()
        recorders = [
            audit.record(idle, Path(tmp) / "idle.npz", every=10**9),
            audit.record(recorded, Path(tmp) / "recorded.npz", every=1, frames=frames),
        ]

        def hooks() -> None:
            recorders[0]._before(idle, (), {})
            recorders[0]._after(idle, (), {})

        try:
            numbers, samples = _interleaved_rounds(
                {
                    STEP_ROW: plain.step,
                    IDLE_ROW: idle.step,
                    RECORDED_ROW: recorded.step,
                    HOOKS_ROW: hooks,
                },
                repeats,
                desc="rattn bench audit",
                progress=progress,
            )
        finally:
            for rec in recorders:
                rec.close()
        size = (Path(tmp) / "recorded.npz").stat().st_size
        n_recorded = len(trace_file.load(Path(tmp) / "recorded.npz").meta["steps"])
    median = {k: float(sorted(v)[len(v) // 2]) for k, v in samples.items()}
    base = median[STEP_ROW]
    record_extra = median[RECORDED_ROW] - base
    overhead = ((every - 1) * median[HOOKS_ROW] + record_extra) / every / base
    return {
        "benchmark": "audit",
        "sizes": {"layers": layers, "heads": heads, "d": d, "r": r, "frames": 4 * layers * heads},
        "every": every,
        "frames_recorded_per_parameter": frames,
        "fraction_of_frames": frames / heads,
        "repeats": repeats,
        "rows": [
            {"name": k, "median_s": median[k], "iqr_s": _iqr(v), "calls": numbers[k]}
            for k, v in samples.items()
        ],
        "idle_hooks_s": median[HOOKS_ROW],
        "recorded_extra_s": record_extra,
        "bytes_per_recorded_step": size / max(n_recorded / (4 * layers), 1),
        "overhead": overhead,
        "target": AUDIT_TARGET,
        "passed": overhead <= AUDIT_TARGET,
        "environment": machine_environment("torch", "numpy"),
    }


def format_audit(result: dict[str, Any]) -> str:
    """Markdown table of ``bench_audit``."""
    s = result["sizes"]
    lines = [
        f"Recording cost on {s['frames']} frames of {s['d']}×{s['r']} ({s['layers']} layers × "
        f"4 parameters × {s['heads']} heads), float32, RiemannianAdam, {result['repeats']} "
        "interleaved rounds:",
        "",
        "| candidate | median (s) | IQR (s) | / step |",
        "| --- | ---: | ---: | ---: |",
    ]
    base = next(r["median_s"] for r in result["rows"] if r["name"] == STEP_ROW)
    for row in result["rows"]:
        lines.append(
            f"| {row['name']} | {row['median_s']:.3e} | {row['iqr_s']:.1e} "
            f"| {row['median_s'] / base:.3g} |"
        )
    pct = 100 * result["overhead"]
    lines += [
        "",
        f"Recording every {result['every']}th step, {result['frames_recorded_per_parameter']} "
        f"frame of {s['heads']} per parameter ({result['fraction_of_frames']:.3f} of the frames; "
        f"{result['bytes_per_recorded_step'] / 1e6:.1f} MB per recorded step): overhead "
        f"{pct:.2f}% of the step (target ≤ {100 * result['target']:g}%): "
        + ("PASSED" if result["passed"] else "FAILED"),
    ]
    return "\n".join(lines)
