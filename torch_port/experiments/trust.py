"""Trust-radius sweep: what the cap Δ = τ·√d_head of ``riemannian_adam`` does where it binds.

In the grokking and patches presets the cap never binds (the largest frame step is well below
Δ), so those runs say nothing about it. Here one arm (C by default: frames under
``riemannian_adam``) is trained on the grokking and patches tasks (``suite.TASKS``) at a sweep of
τ, paired over seeds (the same seed gives the same initialisation and data order at every τ).
Every step's tangent steps are recovered from the frames (``training.polar_step_norms``), so the
sweep reports, per task and τ: the fraction of frame steps at the cap (‖ξ‖ ≥ (1 −
``training.CAP_BAND``)·Δ), the median and largest ‖ξ‖/Δ, the validation accuracy (mean and SD
over seeds) and its paired difference from the largest τ of the sweep (the reference, where
the cap should not bind), with a 95% confidence interval.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from torch_port.experiments import ablation, runs
from torch_port.experiments.arms import ARMS, trust_radius
from torch_port.experiments.common import (
    RunOptions,
    configure,
    figure,
    markdown_table,
    output_dir,
    resolve_device,
    results_document,
)
from torch_port.experiments.suite import apply_data_dir, check_tasks, task_config, task_factory
from torch_port.experiments.training import (
    CAP_BAND,
    CAPPED_TANGENT_ARMS,
    train_cells,
    trust_metrics,
)

NAME = "trust"

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        tasks={
            "grokking": task_config("grokking", "smoke", steps=6, eval_every=6, checkpoint_every=0),
            "patches": task_config("patches", "smoke", steps=6),
        },
        arms=["C"],
        taus=[0.1, 0.001],
        seeds=[0],
    ),
    # Δ = τ·√16 on both tasks (4 heads of 16): 0.4 down to 0.0012. The largest frame steps are
    # ≈ lr·√(d·r) (≈ 0.1 on grokking at lr 3e-3, ≈ 0.03 on patches at lr 1e-3), so the cap
    # binds from τ = 0.01 (grokking) and τ = 0.003 (patches) down.
    "quick": dict(
        tasks={
            # The ablation's quick tasks: its grokking task groks within its 1,200 epochs.
            **ablation.PRESETS["quick"]["tasks"],
        },
        arms=["C"],
        taus=[0.1, 0.01, 0.003, 0.001, 0.0003],
        seeds=[0, 1, 2],
    ),
    "paper": dict(
        tasks={
            "grokking": task_config("grokking", "paper", eval_every=100),
            "patches": task_config("patches", "paper"),
        },
        arms=["C"],
        taus=[0.1, 0.01, 0.003, 0.001],
        seeds=[0, 1, 2],
    ),
}


def check_config(config: dict[str, Any]) -> None:
    """Refuse a sweep that cannot run: the tasks and arms (``suite.check_tasks``), one arm of
    ``training.CAPPED_TANGENT_ARMS`` (the others have no cap or no recoverable step), and
    at least two positive, distinct τ (the largest is the reference), naming the bad value."""
    check_tasks(config)
    if len(config["arms"]) != 1 or config["arms"][0] not in CAPPED_TANGENT_ARMS:
        raise ValueError(
            f"the trust sweep trains one arm with a cap on tangent steps, one of "
            f"{CAPPED_TANGENT_ARMS}; got arms {config['arms']}"
        )
    taus = config["taus"]
    ok = isinstance(taus, list) and all(
        isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) and t > 0
        for t in taus
    )
    if not ok or len(set(taus)) < 2 or len(set(taus)) != len(taus):
        raise ValueError(f"taus must be a list of ≥ 2 distinct positive numbers, got {taus!r}")


def summarise(config: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task and τ: Δ, the trust use (``training.trust_metrics``, means over seeds; the
    largest ratio the largest over seeds), validation accuracy (%) mean and SD, and the paired
    difference from the reference τ (the largest) in pp (``runs.paired_stats``)."""
    reference = max(config["taus"])
    out: dict[str, Any] = {"tasks": {}, "reference_tau": reference, "cap_band": CAP_BAND}
    for task, tcfg in config["tasks"].items():
        acc = {
            (r["tau"], r["seed"]): 100 * r["final_val_acc"] for r in records if r["task"] == task
        }
        seeds = sorted({s for _, s in acc})
        rows = []
        for tau in config["taus"]:
            mine = [r for r in records if r["task"] == task and r["tau"] == tau]
            use = [trust_metrics(r) for r in mine]
            vals = [acc[(tau, s)] for s in seeds]
            rows.append(
                {
                    "tau": tau,
                    "radius": trust_radius({**tcfg, "trust_tau": tau}),
                    "at_cap": float(np.mean([u["at_cap"] for u in use])),
                    "median_ratio": float(np.mean([u["median_ratio"] for u in use])),
                    "max_ratio": float(np.max([u["max_ratio"] for u in use])),
                    "val_acc": float(np.mean(vals)),
                    "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else math.nan,
                    "vs_reference": runs.paired_stats([acc[(reference, s)] for s in seeds], vals),
                }
            )
        out["tasks"][task] = {"rows": rows, "seeds": seeds}
    return out


def _plots(directory: Any, summary: dict[str, Any]) -> list[str]:
    path = directory / "trust_sweep.png"
    with figure(path, ncols=2, width=4.8) as axes:
        for task, t in summary["tasks"].items():
            radius = [row["radius"] for row in t["rows"]]
            axes[0].plot(radius, [100 * row["at_cap"] for row in t["rows"]], "o-", label=task)
            axes[1].errorbar(
                radius,
                [row["val_acc"] for row in t["rows"]],
                yerr=[0.0 if not math.isfinite(row["sd"]) else row["sd"] for row in t["rows"]],
                fmt="o-",
                label=task,
            )
        for ax in axes:
            ax.set_xscale("log")
            ax.set_xlabel("trust radius Δ")
            ax.legend(fontsize=7)
        axes[0].set_ylabel("frame steps at the cap (%)")
        axes[1].set_ylabel("validation accuracy (%), mean ± SD")
    return [path.name]


def markdown(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """The tables of results.md."""
    arm = config["arms"][0]
    parts = [
        f"# trust: arm {arm} ({ARMS[arm]}), τ in {config['taus']}, seeds {config['seeds']}",
        f"A frame step is at the cap when ‖ξ‖ ≥ {1 - CAP_BAND:g}·Δ (`training.polar_step_norms`"
        f" recovers ξ from consecutive frames). Differences are paired against τ = "
        f"{summary['reference_tau']:g}; 95% CI t-based; W/T/L: wins, ties, losses.",
    ]
    for task, t in summary["tasks"].items():
        rows = [
            [
                row["tau"],
                row["radius"],
                100 * row["at_cap"],
                row["median_ratio"],
                row["max_ratio"],
                row["val_acc"],
                row["sd"],
                row["vs_reference"]["mean_diff"],
                runs.interval(row["vs_reference"]),
                runs.record_of_wins(row["vs_reference"]),
            ]
            for row in t["rows"]
        ]
        header = [
            "τ",
            "Δ",
            "frame steps at the cap (%)",
            "median ‖ξ‖/Δ",
            "largest ‖ξ‖/Δ",
            "val acc (%)",
            "SD",
            "− reference (pp)",
            "95% CI",
            "W/T/L",
        ]
        parts += [f"## {task}", markdown_table(header, rows)]
    return "\n\n".join(parts)


def run(options: RunOptions) -> dict[str, Any]:
    """Train every (task, seed, τ) of the preset and write results.json, results.md and the
    plot under ``<out>/trust``."""
    config = apply_data_dir(configure(PRESETS, options), options.data_dir)
    check_config(config)
    device = resolve_device(options.device)
    directory = output_dir(options, NAME)
    arm = config["arms"][0]
    cells, keys = [], []
    for name, tcfg in config["tasks"].items():
        make = task_factory(name, tcfg, options.data_dir, device)
        for seed in config["seeds"]:
            task = make(seed)
            for tau in config["taus"]:
                cfg = {**tcfg, "trust_tau": tau}
                cell_config = {"task": name, **cfg}
                key = f"{name}-tau={tau!r}-{seed}-{arm}"
                cells.append(runs.Cell(cell_config, key, (task, cfg, arm, seed)))
                keys.append((name, tau))
    records = train_cells(directory, cells, options, track_trust=True)
    for (name, tau), record in zip(keys, records, strict=True):
        record["task"], record["tau"] = name, tau
    summary = summarise(config, records)
    summary["plots"] = _plots(directory, summary)
    document = results_document(NAME, options, config, records, summary, device)
    return runs.finish(directory, cells, document, markdown(config, summary))


def format_summary(document: dict[str, Any]) -> str:
    """Per task: the fraction at the cap and the accuracy at every τ."""
    lines = [f"trust ({document['preset']})"]
    for task, t in document["summary"]["tasks"].items():
        cells = ", ".join(
            f"τ {row['tau']:g}: {100 * row['at_cap']:.0f}% capped, {row['val_acc']:.1f}%"
            for row in t["rows"]
        )
        lines.append(f"  {task}: {cells}")
    return "\n".join(lines)
