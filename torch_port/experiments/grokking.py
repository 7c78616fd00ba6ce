"""Grokking of a + b mod p: AdamW against Stiefel W_Q, W_K under ``riemannian_adam``.

Data: all p² pairs (a, b) as tokens [a, b, =] (vocabulary p + 1), label (a + b) mod p; a
``train_fraction`` of the pairs, drawn by the seed, is the training set (full batch), the rest is
the validation set. Model: one layer, d_model 128, 4 heads of 32, ReLU MLP 512, no LayerNorm,
logits read at the "=" token (``models.Transformer``; its MLP and read-out have biases, zero at
initialisation). Arms (``arms``): A, AdamW (lr, betas (0.9, 0.98), decoupled weight decay 1.0 on
every weight), and C, the same model with each head's W_Q and W_K on St(128, 32) under
``riemannian_adam`` (trust radius Δ = τ·√d_head; no decay on frames, decay elsewhere).

Logged at every evaluation: train and validation accuracy, the validation accuracy of the pairs
whose swap (b, a) is a training pair ("swap_in_train": memorisation answers them, since the
label is symmetric) and of the others ("unseen"), ‖·‖_F of every component (decay drives
collapse cycles through them), the largest principal angle between each head's W_Q (W_K) and its
initialisation; at every step, the trust radius's use (``training.train_run``'s ``trust``).
Reported per run: validation accuracy at the last step, its mean over the last 20% of
evaluations, the fraction of evaluations at or above 95%, the first step reaching 95% (overall
and on the unseen pairs), and the fraction of frame steps at the cap. One optimizer step is one
epoch (full batch). Presets: smoke, quick (a smaller task, CPU minutes), long (the paper's
setting for 3,000 epochs, 30 CPU minutes) and paper (20,000 epochs, 3 seeds: one GPU,
``docs/grokking_paper.sh``). Long runs save a checkpoint every ``checkpoint_every`` steps and
resume from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from torch_port.experiments import common, runs
from torch_port.experiments.arms import ARMS, check_arms, trust_radius
from torch_port.experiments.models import INITS, TokenEmbedding, Transformer
from torch_port.experiments.training import (
    CAP_BAND,
    Task,
    check_training_config,
    train_cells,
    trust_metrics,
)

NAME = "grokking"

_OPTIM = dict(betas=[0.9, 0.98], weight_decay=1.0, trust_tau=0.1, frame_lr=None)
#: "scaled" (N(0, 1/fan-in) weights, N(0, 1/d) embeddings, Nanda et al.'s) or "torch"
#: (PyTorch's own initialisations): ``--set init=torch``. ``match_scale``: arm A's W_Q, W_K start
#: at the frames' scale (``arms.prepare_model``): ``--set match_scale=true``.
_INIT = dict(init="scaled", match_scale=False)
#: Read the logits through the exact last-position forward (``Transformer.forward(last_only=
#: True)``: equal to the full forward to rounding, 2.1–2.5 × faster).
_FAST = dict(last_only=True)

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        p=11,
        train_fraction=0.5,
        steps=24,
        d_model=32,
        n_heads=4,
        d_mlp=64,
        lr=3e-3,
        **_OPTIM,
        **_INIT,
        **_FAST,
        eval_every=4,
        checkpoint_every=8,
        threshold=0.95,
        last_fraction=0.2,
        arms=["A", "C"],
        seeds=[0],
    ),
}
# Departures from the paper (stated in docs/results.md): p = 59 instead of 113, 50% of the pairs
# instead of 30%, lr 3e-3 instead of 1e-3, 2,800 epochs instead of 20,000.
PRESETS["quick"] = common.preset_variant(
    PRESETS["smoke"],
    p=59,
    steps=2800,
    d_model=128,
    d_mlp=512,
    eval_every=20,
    checkpoint_every=250,
    seeds=[0, 1, 2],
)
# The paper's setting (p = 113, 30% of the pairs, lr 1e-3) for as long as fits 30 minutes on
# one CPU core with two paired seeds (~0.14 s per full-batch step): 3,000 of the paper's 20,000
# epochs.
PRESETS["long"] = common.preset_variant(
    PRESETS["quick"],
    p=113,
    train_fraction=0.3,
    steps=3000,
    lr=1e-3,
    eval_every=50,
    checkpoint_every=500,
    seeds=[0, 1],
)
# The long setting for the paper's 20,000 epochs, 3 seeds. One GPU:
# `rattn experiment grokking --preset paper --device cuda`.
PRESETS["paper"] = common.preset_variant(
    PRESETS["long"], steps=20000, eval_every=10, seeds=[0, 1, 2]
)

#: The paper's reported numbers (one run, validation accuracy at epoch 20,000).
PAPER = {"C": 0.970, "A": 0.611, "epoch": 20000}


def check_task(config: dict[str, Any]) -> None:
    """Refuse task settings that cannot run (p, split, model sizes, optimizer), naming the bad
    value; the movement and ablation experiments check their grokking task with this."""
    common.check_int(config, "p", 3)
    p, f = config["p"], config["train_fraction"]
    n_train = round(f * p * p) if isinstance(f, int | float) else 0
    if not (isinstance(f, int | float) and 0 < f < 1) or not 1 <= n_train < p * p:
        raise ValueError(
            f"train_fraction must lie in (0, 1) and leave both splits non-empty, got {f!r}"
        )
    check_training_config(config, ("d_model", "n_heads", "d_mlp"))
    if config.get("init", "scaled") not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {config.get('init')!r}")


def check_config(config: dict[str, Any]) -> None:
    """Refuse a grokking configuration that cannot run: ``check_task`` plus the reporting keys
    (threshold, last_fraction) and the arms."""
    check_task(config)
    if not 0 < config["last_fraction"] <= 1:
        raise ValueError(f"last_fraction must lie in (0, 1], got {config['last_fraction']!r}")
    if not 0 < config["threshold"] <= 1:
        raise ValueError(f"threshold must lie in (0, 1], got {config['threshold']!r}")
    check_arms(config["arms"])


def make_task(config: dict[str, Any], seed: int, device: torch.device | str = "cpu") -> Task:
    """The a + b mod p task of ``config`` with the training pairs drawn by ``seed``."""
    p, d = config["p"], config["d_model"]
    a = torch.arange(p).repeat_interleave(p)
    b = torch.arange(p).repeat(p)
    x = torch.stack([a, b, torch.full_like(a, p)], dim=1)
    y = (a + b) % p
    perm = torch.randperm(p * p, generator=torch.Generator().manual_seed(seed))
    n_train = round(config["train_fraction"] * p * p)
    tr, va = perm[:n_train], perm[n_train:]

    def make_model(model_seed: int, qk_geometry: str | None) -> torch.nn.Module:
        return Transformer(
            TokenEmbedding(p + 1, d),
            d,
            1,
            config["n_heads"],
            config["d_mlp"],
            p,
            3,
            seed=model_seed,
            qk_geometry=qk_geometry,
            layernorm=False,
            init=config.get("init", "scaled"),
        ).to(device)

    # (b, a) has the label of (a, b): a validation pair whose swap is a training pair can be
    # answered by memorisation, so its accuracy is logged apart from the pairs never seen.
    in_train = torch.zeros(p, p, dtype=torch.bool)
    in_train[a[tr], b[tr]] = True
    swapped = in_train[b[va], a[va]]
    dev = torch.device(device)
    return Task(
        "grokking",
        make_model,
        x[tr].to(dev),
        y[tr].to(dev),
        x[va].to(dev),
        y[va].to(dev),
        last_only=bool(config.get("last_only", False)),  # one layer read at "="
        val_subsets={"swap_in_train": swapped.to(dev), "unseen": (~swapped).to(dev)},
    )


def run_metrics(
    history: list[dict[str, Any]], threshold: float, last_fraction: float
) -> dict[str, Any]:
    """Validation accuracy at the last evaluation, its mean over the last ``last_fraction`` of
    evaluations, the fraction of evaluations with accuracy ≥ ``threshold`` and the first step
    reaching it (None when never), from one run's history (the step-0 evaluation excluded);
    the same last value and first step for the validation pairs whose swap (b, a) is not a
    training pair ("unseen", when logged): the accuracy that memorisation cannot give."""
    evals = [h for h in history if h["step"] > 0]
    val = np.array([h["val_acc"] for h in evals])
    k = max(1, math.ceil(last_fraction * len(val)))
    hit = [h["step"] for h in evals if h["val_acc"] >= threshold]
    unseen = [h.get("val_acc_by_subset", {}).get("unseen") for h in evals]
    hit_unseen = [h["step"] for h, u in zip(evals, unseen, strict=True) if u and u >= threshold]
    return {
        "final_val_acc_unseen": unseen[-1],
        "first_step_unseen_at_threshold": hit_unseen[0] if hit_unseen else None,
        "final_val_acc": float(val[-1]),
        "final_train_acc": float(evals[-1]["train_acc"]),
        "last_mean_val_acc": float(val[-k:].mean()),
        "fraction_at_threshold": float((val >= threshold).mean()),
        "first_step_at_threshold": hit[0] if hit else None,
        "final_angle_w_q": float(evals[-1]["angles"]["w_q"]),
        "final_angle_w_k": float(evals[-1]["angles"]["w_k"]),
    }


def summarise(config: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: the mean over seeds of every run metric, and the per-seed values."""
    summary: dict[str, Any] = {"arms": {}}
    for arm in config["arms"]:
        mine = [r for r in runs if r["arm"] == arm]
        metrics = [r["metrics"] for r in mine]
        entry: dict[str, Any] = {"seeds": [r["seed"] for r in mine]}
        for key in (
            "final_val_acc",
            "last_mean_val_acc",
            "fraction_at_threshold",
            "final_angle_w_q",
            "final_angle_w_k",
        ):
            entry[key] = float(np.mean([m[key] for m in metrics]))
        steps = [m["first_step_at_threshold"] for m in metrics]
        entry["first_step_at_threshold"] = steps
        summary["arms"][arm] = entry
    summary["paper"] = PAPER
    return summary


def _plots(directory: Any, config: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    colors = {"A": "tab:blue", "C": "tab:red"}
    names = []
    path = directory / "grokking_accuracy.png"
    with common.figure(path, ncols=1, width=6.5) as axes:
        ax = axes[0]
        for r in runs:
            steps = [h["step"] for h in r["history"]]
            c = colors.get(r["arm"])
            ax.plot(
                steps,
                [h["val_acc"] for h in r["history"]],
                color=c,
                label=f"{r['arm']} val s{r['seed']}",
            )
            if "unseen" in r["history"][0].get("val_acc_by_subset", {}):
                ax.plot(
                    steps,
                    [h["val_acc_by_subset"]["unseen"] for h in r["history"]],
                    color=c,
                    ls="--",
                    label=f"{r['arm']} unseen val s{r['seed']}",
                )
            ax.plot(
                steps,
                [h["train_acc"] for h in r["history"]],
                color=c,
                ls=":",
                alpha=0.6,
                label=f"{r['arm']} train s{r['seed']}",
            )
        ax.set_xlabel("epoch (full-batch step)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"a + b mod {config['p']}, {config['train_fraction']:.0%} of pairs")
        ax.legend(fontsize=7)
    names.append(path.name)
    path = directory / "grokking_norms.png"
    arms = config["arms"]
    with common.figure(path, ncols=len(arms), width=5.0) as axes:
        for ax, arm in zip(axes, arms, strict=True):
            r = next(r for r in runs if r["arm"] == arm)
            steps = [h["step"] for h in r["history"]]
            for comp in r["history"][0]["norms"]:
                ax.plot(steps, [h["norms"][comp] for h in r["history"]], label=comp)
            ax.set_yscale("log")
            ax.set_title(f"arm {arm} ({ARMS[arm]}), seed {r['seed']}", fontsize=8)
            ax.set_xlabel("epoch")
            ax.set_ylabel("‖component‖_F")
            ax.legend(fontsize=6)
    names.append(path.name)
    path = directory / "grokking_angles.png"
    with common.figure(path) as axes:
        ax = axes[0]
        for r in runs:
            steps = [h["step"] for h in r["history"]]
            for key, ls in (("w_q", "-"), ("w_k", "--")):
                ax.plot(
                    steps,
                    [h["angles"][key] for h in r["history"]],
                    ls=ls,
                    color=colors.get(r["arm"]),
                    label=f"{r['arm']} {key} s{r['seed']}",
                )
        ax.set_xlabel("epoch")
        ax.set_ylabel("largest principal angle to init (°)")
        ax.legend(fontsize=7)
    names.append(path.name)
    return names


def markdown(config: dict[str, Any], runs: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """The tables of results.md."""
    rows = []
    for r in runs:
        m = r["metrics"]
        rows.append(
            [
                r["arm"],
                ARMS[r["arm"]],
                r["seed"],
                100 * m["final_val_acc"],
                100 * m["last_mean_val_acc"],
                100 * m["fraction_at_threshold"],
                "–" if m["first_step_at_threshold"] is None else m["first_step_at_threshold"],
                _percent(m["final_val_acc_unseen"]),
                "–"
                if m["first_step_unseen_at_threshold"] is None
                else m["first_step_unseen_at_threshold"],
                m["final_angle_w_q"],
                m["final_angle_w_k"],
                _percent(m["trust_at_cap"]),
                "–" if m["trust_max_ratio"] is None else m["trust_max_ratio"],
            ]
        )
    header = [
        "arm",
        "W_Q, W_K",
        "seed",
        "val acc, last (%)",
        f"val acc, mean last {config['last_fraction']:.0%} (%)",
        f"evals ≥ {config['threshold']:.0%} (%)",
        f"first epoch ≥ {config['threshold']:.0%}",
        "unseen val acc, last (%)",
        f"first epoch unseen ≥ {config['threshold']:.0%}",
        "angle W_Q (°)",
        "angle W_K (°)",
        "frame steps at the cap (%)",
        "largest ‖ξ‖/Δ",
    ]
    mean_rows = [
        [
            arm,
            e["seeds"],
            100 * e["final_val_acc"],
            100 * e["last_mean_val_acc"],
            100 * e["fraction_at_threshold"],
        ]
        for arm, e in summary["arms"].items()
    ]
    return "\n\n".join(
        [
            f"# grokking: a + b mod {config['p']}, {config['train_fraction']:.0%} of pairs, "
            f"{config['steps']} epochs",
            common.markdown_table(header, rows),
            "Mean over seeds:",
            common.markdown_table(
                [
                    "arm",
                    "seeds",
                    "val acc, last (%)",
                    "mean last part (%)",
                    "evals ≥ threshold (%)",
                ],
                mean_rows,
            ),
            "Unseen: the validation pairs (a, b) whose swap (b, a) is not a training pair; the "
            "others have the label of a training pair, so memorisation alone answers them.",
            f"Trust radius Δ = {config['trust_tau']}·√d_head = {trust_radius(config):.4g}; a frame "
            f"step is at the cap when ‖ξ‖ ≥ {1 - CAP_BAND:g}·Δ (`training.polar_step_norms`).",
            f"Paper (one run, epoch {PAPER['epoch']:,}): Stiefel "
            f"{100 * PAPER['C']:.1f}% against AdamW {100 * PAPER['A']:.1f}%.",
        ]
    )


def _percent(v: float | None) -> Any:
    """100·v, or "–" where there is no value."""
    return "–" if v is None else 100 * v


def run(options: common.RunOptions) -> dict[str, Any]:
    """Train every (seed, arm) of the preset and write results.json, results.md and plots."""
    config = common.configure(PRESETS, options)
    check_config(config)
    device = common.resolve_device(options.device)
    directory = common.output_dir(options, NAME)
    cache_config = runs.run_config(config, ("seeds", "arms", "threshold", "last_fraction"))
    cells = []
    for seed in config["seeds"]:
        task = make_task(config, seed, device)
        cells += [
            runs.Cell(cache_config, f"{seed}-{arm}", (task, config, arm, seed))
            for arm in config["arms"]
        ]
    records = train_cells(directory, cells, options, track_trust=True)
    for record in records:
        record["metrics"] = {
            **run_metrics(record["history"], config["threshold"], config["last_fraction"]),
            **{f"trust_{k}": v for k, v in trust_metrics(record).items()},
        }
    summary = summarise(config, records)
    summary["plots"] = _plots(directory, config, records)
    document = common.results_document(NAME, options, config, records, summary, device)
    return runs.finish(directory, cells, document, markdown(config, records, summary))


def assemble(options: common.RunOptions, parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The results of one preset whose runs were made in separate processes (one per seed and
    arm, in parallel on one device: ``docs/grokking_paper.sh``), written as ``run`` writes them:
    the records of every (seed, arm) of ``options`` taken from the ``parts`` (results.json
    documents of the same configuration), in seed-then-arm order, summarised and plotted."""
    config = common.configure(PRESETS, options)
    check_config(config)
    keep = runs.run_config(config, ("seeds", "arms"))
    records: dict[tuple[int, str], dict[str, Any]] = {}
    for part in parts:
        if part.get("experiment") != NAME or runs.run_config(part["config"], ("seeds", "arms")) != (
            common.jsonable(keep)
        ):
            raise ValueError("a part to assemble is not a run of this preset and configuration")
        records.update({(r["seed"], r["arm"]): r for r in part["runs"]})
    wanted = [(seed, arm) for seed in config["seeds"] for arm in config["arms"]]
    missing = [key for key in wanted if key not in records]
    if missing:
        raise ValueError(f"no finished run for (seed, arm) {missing} among the parts")
    ordered = [records[key] for key in wanted]
    directory = common.output_dir(options, NAME)
    summary = summarise(config, ordered)
    summary["plots"] = _plots(directory, config, ordered)
    device = common.resolve_device(options.device)
    document = common.results_document(NAME, options, config, ordered, summary, device)
    common.write_results(directory, document, markdown(config, ordered, summary))
    return document


def format_summary(document: dict[str, Any]) -> str:
    """One line per arm: final and late-mean validation accuracy, fraction ≥ threshold."""
    lines = [f"grokking ({document['preset']}): a + b mod {document['config']['p']}"]
    for arm, e in document["summary"]["arms"].items():
        lines.append(
            f"  {arm} {ARMS[arm]:<28} val acc last {100 * e['final_val_acc']:.1f}%, "
            f"mean last part {100 * e['last_mean_val_acc']:.1f}%, "
            f"evals ≥ threshold {100 * e['fraction_at_threshold']:.0f}%"
        )
    lines.append(
        f"  paper: Stiefel {100 * PAPER['C']:.1f}% vs AdamW {100 * PAPER['A']:.1f}% "
        f"at epoch {PAPER['epoch']}"
    )
    return "\n".join(lines)
