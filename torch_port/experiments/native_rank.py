"""Attention-native rank (Entropic Bound, background §5 and §6 P3/P4): the QK kernel rank.

Teachers are ``capacity.linear_qk_task`` and ``capacity.softmax_task`` (n tokens iid N(0, I_d),
K* = U Vᵀ of rank r* with a flat spectrum, W_V* = ``orthonormal(d, d_v)``, noise σ). Three parts:

1. **Deficiency and achievability.** Students ``attention_students.QKStudent`` with
   K = W_Q W_Kᵀ of rank r (W_Q, W_K ∈ ℝ^{d×r}, iid N(0, init_std²) entries) and a **learned** W_V
   (iid N(0, 1/d) entries), the teacher's attention kind and β, trained full batch with Adam
   (``lr``, ``steps``; float32 in smoke/quick, float64 in paper) on ``train_sequences``, for
   each r of ``ranks`` (all trained for ``steps``). Reported:
   the relative excess test risk ‖ŷ − y_clean‖²/‖y_clean‖² and the relative test MSE against r,
   with the relative noise floor. Linear attention is compared with the Eckart–Young prediction
   max(r* − r, 0)/r* for a flat spectrum (the n → ∞ limit, where y_i → W_Vᵀ Kᵀ x_i). The plateau
   rank is the smallest r with relative excess ≤ ``plateau_tol``.
2. **Recovery.** A full-rank student (r = d) from the same small initialisation, trained for
   ``recovery_steps``; the spectrum of the learned K̂ goes through every estimator (the
   largest-gap rank counted above σ₁/d), and its singular values are logged during training
   (incremental learning). It is kept apart from part 1 (its own cells, type "recovery"): its
   longer training never enters the deficiency curve or the plateau rank.
3. **Data-only frontier** (no training, no W_V): ``capacity.pooled_regression`` on linear QK
   data against n, and ``capacity.first_order_softmax`` on softmax data against n and β, for
   K* = U Vᵀ and the PSD K* = U Uᵀ (self-attention bias). Reported: every estimator on the
   coefficient's spectrum (gap above max(noise edge, σ₁/n), the rule of ``rattn rank``),
   and σ_{r*+1}/σ_{r*}; for linear QK also its population value from
   ``capacity.pooled_population`` (W_Vᵀ[Kᵀ + (K + tr(K)I)/n], EB-7: the tail falls like 1/n).
   The number of sequences is ``max(min_sequences, tokens // n)``; the gap floor is
   ``capacity.attention_gap_floor``.

The experiment runs on CPU only (``--device`` other than cpu is refused): its students are at
most 16×16 matrices and its estimators run in NumPy. ``run`` is
``attention_students.run_experiment``. The cells are computed in ``native_rank_cells``, the
summary, tables and plots in ``native_rank_report``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch_port.experiments import attention_students as st
from torch_port.experiments.common import RunOptions, preset_variant
from torch_port.experiments.native_rank_cells import (
    cells_of,
    frontier_cell,
    recovery_cell,
    student_cell,
)
from torch_port.experiments.native_rank_report import markdown, plots, summarize

NAME = "native-rank"

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        n=8,
        d=8,
        r_star=2,
        noise=0.01,
        beta=2.0,
        train_sequences=100,
        test_sequences=100,
        ranks=[1, 2, 3],
        steps=120,
        recovery_steps=150,
        lr=2e-2,
        init_std=0.05,
        plateau_tol=0.02,
        dtype="float32",
        threads=1,
        log_every=10,
        frontier_n_linear=[8, 32],
        frontier_n_softmax=[8],
        frontier_betas=[0.5, 4.0],
        tokens=4000,
        min_sequences=20,
        seeds=[0],
    ),
}
# CPU minutes: n = d = 16 and r* = 3, longer training, a wider data-only frontier.
PRESETS["quick"] = preset_variant(
    PRESETS["smoke"],
    n=16,
    d=16,
    r_star=3,
    train_sequences=400,
    test_sequences=500,
    ranks=[1, 2, 3, 4, 6],
    steps=1000,
    recovery_steps=1500,
    log_every=25,
    frontier_n_linear=[16, 64, 256],
    frontier_n_softmax=[16, 64],
    frontier_betas=[0.5, 2.0, 8.0],
    tokens=65536,
    min_sequences=100,
    seeds=[0, 1, 2],
)
# The quick problem with more sequences and steps, in float64, the widest frontier, 10 seeds.
PRESETS["paper"] = preset_variant(
    PRESETS["quick"],
    train_sequences=1000,
    test_sequences=1000,
    ranks=[1, 2, 3, 4, 6, 8],
    steps=3000,
    recovery_steps=4000,
    lr=1e-2,
    dtype="float64",
    frontier_n_linear=[16, 64, 256, 1024],
    frontier_n_softmax=[16, 64, 256],
    frontier_betas=[0.5, 2.0, 4.0, 8.0, 16.0],
    tokens=131072,
    seeds=list(range(10)),
)


def check_config(config: Mapping[str, Any]) -> None:
    """Refuse a configuration that cannot run, naming the offending value."""
    n, d, r = config["n"], config["d"], config["r_star"]
    if n < 2 or d < 2:
        raise ValueError(f"needs n ≥ 2 and d ≥ 2, got n = {n}, d = {d}")
    if not 1 <= r < d:
        raise ValueError(f"r_star must be in 1…d − 1 = {d - 1}, got {r}")
    bad = [k for k in config["ranks"] if not 1 <= k <= d]
    if bad or not config["ranks"]:
        raise ValueError(f"student ranks must be in 1…d = {d}, got {config['ranks']}")
    for key in ("train_sequences", "test_sequences", "steps", "recovery_steps", "log_every"):
        if config[key] < 1:
            raise ValueError(f"{key} must be ≥ 1, got {config[key]}")
    st.check_training(config, ("lr", "init_std", "plateau_tol", "beta"))
    for key in ("frontier_n_linear", "frontier_n_softmax"):
        if any(m < 2 for m in config[key]):
            raise ValueError(f"{key} must hold sequence lengths ≥ 2, got {config[key]}")
    if any(not (math.isfinite(b) and b > 0) for b in config["frontier_betas"]):
        raise ValueError(f"frontier_betas must be finite and > 0, got {config['frontier_betas']}")
    if config["min_sequences"] <= d:
        raise ValueError(
            f"min_sequences must exceed d = {d} (first-order estimator), "
            f"got {config['min_sequences']}"
        )


def work(config: Mapping[str, Any]) -> Any:
    """The function computing one cell of ``cells_of(config)``."""
    handlers = {"student": student_cell, "recovery": recovery_cell, "frontier": frontier_cell}
    return st.cell_worker(config, handlers)


EXPERIMENT = st.StudentExperiment(
    NAME, PRESETS, check_config, cells_of, work, summarize, plots, markdown
)


def run(options: RunOptions) -> dict[str, Any]:
    """Run the three parts for the preset's seeds; write results.json, results.md and plots.
    CPU only: any other ``options.device`` is refused before any work."""
    return st.run_experiment(EXPERIMENT, options)


def format_summary(document: Mapping[str, Any]) -> str:
    """Plateau ranks, recovered ranks and the frontier's recovery counts."""
    s = document["summary"]
    r = s["r_star"]
    lines = [f"native-rank: planted QK rank r* = {r}"]
    for kind, dfc in s["deficiency"].items():
        ex = ", ".join(
            f"r={k}: {e['mean']:.3g}" for k, e in zip(dfc["ranks"], dfc["excess"], strict=True)
        )
        lines.append(f"  {kind:<8} rel. excess {ex}; plateau at r = {dfc['plateau_rank']}")
    for kind, rec in s["recovery"].items():
        e = rec["estimators"]
        lines.append(
            f"  {kind:<8} full-rank student: r_0.9 {e['r_0.9']['mean']:.2f}, r_0.99 "
            f"{e['r_0.99']['mean']:.2f}, gap {e['gap']['mean']:.2f}, erank_E "
            f"{e['erank_E']['mean']:.3f}"
        )
    for row in s["frontier"]:
        beta = "" if row["beta"] is None else f", β = {row['beta']:g}"
        hits = row["recovered_seeds"]
        lines.append(
            f"  frontier {row['kind']:<7} {row['shape']} n = {row['n']}{beta}: gap = r* in "
            f"{hits['gap']}/{row['seeds']}, r_0.99 = r* in {hits['r_0.99']}/{row['seeds']}, "
            f"σ_(r*+1)/σ_r* = {row['ratio']['mean']:.3g}"
        )
    lines.append(f"  wall {s['wall_seconds']:.1f} s, cpu {s['cpu_seconds']:.1f} s")
    return "\n".join(lines)


__all__ = ["PRESETS", "format_summary", "run"]
