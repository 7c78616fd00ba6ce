"""Step-rule ablation: which part of the Stiefel rule carries the gain?

Paired arms on the grokking and patches tasks (``arms``): A Euclidean AdamW, B fixed-step RSGD,
C ``riemannian_adam``, D normalised RSGD, E no projector (scalar Adam on the raw gradient, then
polar), F elementwise moment, G frozen frames, H AdamW (no decay on W_Q, W_K) followed by a
polar projection. Same
seeds, hence the same non-attention initialisation and data order, in every arm; AdamW with the
task's decay on every non-frame weight. Reported per task: validation accuracy per arm (mean
and SD over seeds) and the paired difference of every arm against C and against A
(``scipy.stats.ttest_rel``, wins). The paper reports C ≈ D ≈ E ≈ F ≫ B ≈ G: the whole gain
comes from a scale-free step, none from the projector or from equivariance.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torch_port.experiments.arms import ARMS
from torch_port.experiments.common import RunOptions, figure, markdown_table
from torch_port.experiments.runs import interval, paired_stats, record_of_wins
from torch_port.experiments.suite import StiefelExperiment, run_stiefel_experiment, task_config

NAME = "ablation"
ALL_ARMS = list(ARMS)

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        tasks={
            "grokking": task_config("grokking", "smoke", steps=6, eval_every=6, checkpoint_every=0),
            "patches": task_config("patches", "smoke", steps=6),
        },
        arms=ALL_ARMS,
        seeds=[0],
    ),
    # Smaller than the grokking and patches quick presets, to fit ~15 CPU minutes: grokking on
    # p = 31 with 60% of pairs, d_model 64 (4 heads of 16, MLP 256), 1,200 epochs at lr 3e-3;
    # patches on digits with the patches quick model, 300 steps, one evaluation at the end.
    "quick": dict(
        tasks={
            "grokking": task_config(
                "grokking",
                "quick",
                p=31,
                train_fraction=0.6,
                d_model=64,
                d_mlp=256,
                steps=1200,
                eval_every=100,
                checkpoint_every=0,
            ),
            "patches": task_config("patches", "quick", eval_every=300),
        },
        arms=ALL_ARMS,
        seeds=[0, 1, 2, 3],
    ),
    "paper": dict(
        tasks={
            "grokking": task_config("grokking", "paper", eval_every=100),
            "patches": task_config("patches", "paper"),
        },
        arms=ALL_ARMS,
        seeds=list(range(12)),
    ),
}

PAPER = {"ordering": "C ≈ D ≈ E ≈ F ≫ B ≈ G"}


def summarise(config: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task: accuracy (%) per arm, mean and SD over seeds, and paired statistics of every
    arm against C and against A (when those arms ran)."""
    out: dict[str, Any] = {"tasks": {}, "paper": PAPER}
    for task in config["tasks"]:
        mine = [r for r in runs if r["task"] == task]
        acc = {(r["arm"], r["seed"]): 100 * r["final_val_acc"] for r in mine}
        seeds = sorted({r["seed"] for r in mine})
        arms = {}
        for arm in config["arms"]:
            vals = [acc[(arm, s)] for s in seeds]
            entry: dict[str, Any] = {
                "mean": float(np.mean(vals)),
                "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan"),
                "per_seed": vals,
            }
            for ref in ("C", "A"):
                if ref in config["arms"] and ref != arm:
                    entry[f"vs_{ref}"] = paired_stats([acc[(ref, s)] for s in seeds], vals)
            arms[arm] = entry
        out["tasks"][task] = {"arms": arms, "seeds": seeds}
    return out


def _plots(
    directory: Any, config: dict[str, Any], runs: list[dict[str, Any]], summary: dict[str, Any]
) -> list[str]:
    path = directory / "ablation_arms.png"
    tasks = list(summary["tasks"])
    with figure(path, ncols=len(tasks), width=5.0) as axes:
        for ax, task in zip(axes, tasks, strict=True):
            arms = summary["tasks"][task]["arms"]
            names = list(arms)
            for i, arm in enumerate(names):
                ax.scatter([i] * len(arms[arm]["per_seed"]), arms[arm]["per_seed"], s=10, alpha=0.6)
                ax.errorbar([i], [arms[arm]["mean"]], fmt="_k", markersize=14)
            ax.set_xticks(range(len(names)), names)
            ax.set_ylabel("validation accuracy (%)")
            ax.set_title(task)
    return [path.name]


def markdown(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """The tables of results.md."""
    parts = [f"# ablation: arms {', '.join(config['arms'])}, seeds {config['seeds']}"]
    for task, t in summary["tasks"].items():
        rows = []
        for arm, e in t["arms"].items():
            row: list[Any] = [arm, ARMS[arm], e["mean"], e["sd"]]
            for ref in ("C", "A"):
                s = e.get(f"vs_{ref}")
                row += ["–"] * 3 if s is None else [s["mean_diff"], interval(s), record_of_wins(s)]
            rows.append(row)
        parts.append(f"## {task}")
        parts.append(
            markdown_table(
                [
                    "arm",
                    "W_Q, W_K",
                    "val acc (%)",
                    "SD",
                    "− C (pp)",
                    "95% CI",
                    "W/T/L vs C",
                    "− A (pp)",
                    "95% CI",
                    "W/T/L vs A",
                ],
                rows,
            )
        )
    parts.append(f"Paper: {PAPER['ordering']} (the gain is the scale-free step).")
    return "\n\n".join(parts)


EXPERIMENT = StiefelExperiment(NAME, PRESETS, summarise, markdown, _plots, track_movement=False)


def run(options: RunOptions) -> dict[str, Any]:
    """Train every (task, seed, arm) and write the outputs."""
    return run_stiefel_experiment(EXPERIMENT, options)


def format_summary(document: dict[str, Any]) -> str:
    """Mean accuracy per arm and task."""
    lines = [f"ablation ({document['preset']})"]
    for task, t in document["summary"]["tasks"].items():
        cells = ", ".join(f"{arm} {e['mean']:.1f}" for arm, e in t["arms"].items())
        lines.append(f"  {task} val acc (%): {cells}")
    lines.append(f"  paper: {PAPER['ordering']}")
    return "\n".join(lines)
