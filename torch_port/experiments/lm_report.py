"""The reports of the character-level LM sweep (``lm``): its summary table, results.md and plots.

For each run the sweep records the validation loss at the end of training (``val_loss``) and the
minimum over the evaluations (``best_val_loss``). ``summarise`` gives, for each (configuration,
arm), the learning rate whose mean final validation loss over seeds is lowest, that mean, and
the seed spread (sample standard deviation, minimum and maximum) at that learning rate; a
diverged run is never selected. ``block_equals_plain`` compares each ``block_`` design point
with its plain base geometry under MHA (one head per block group: the same geometry).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch_port.experiments import common
from torch_port.geometries import PLAIN


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _lr_means(
    runs: Sequence[Mapping[str, Any]], name: str, arm: str
) -> tuple[dict[float, list[float]], dict[float, float | None]]:
    """Final validation losses per lr of (configuration, arm), and their means over seeds (None
    when a seed diverged)."""
    per_lr: dict[float, list[float]] = {}
    for r in runs:
        if r["config"] == name and r["arm"] == arm:
            per_lr.setdefault(r["lr"], []).append(r["val_loss"])
    means = {
        lr: (statistics.fmean(v) if all(_finite(x) for x in v) else None)
        for lr, v in sorted(per_lr.items())
    }
    return per_lr, means


def best_lr(runs: Sequence[Mapping[str, Any]], name: str, arm: str) -> float | None:
    """The lr of the lowest finite mean final validation loss of (configuration, arm) (None
    when every lr diverged or the arm did not run)."""
    finite = {lr: m for lr, m in _lr_means(runs, name, arm)[1].items() if m is not None}
    return min(finite, key=finite.get) if finite else None


def _best_mean(runs: Sequence[Mapping[str, Any]], name: str, arm: str) -> float | None:
    """The lowest finite mean final validation loss over the lrs of (configuration, arm)."""
    finite = [m for m in _lr_means(runs, name, arm)[1].values() if m is not None]
    return min(finite) if finite else None


def summarise(
    runs: Sequence[Mapping[str, Any]], configs: Sequence[str], arms: Sequence[str]
) -> list[dict[str, Any]]:
    """For each (configuration, arm): mean final validation loss over seeds for every lr (None
    when a seed diverged), the best lr (lowest mean), the seed spread at that lr, and (for
    every arm but AdamW, whatever the order of ``arms``) ``minus_adamw``: its best mean minus
    AdamW's in the same configuration, when AdamW ran there."""
    rows = []
    for name in configs:
        adamw_best = _best_mean(runs, name, "adamw") if "adamw" in arms else None
        for arm in arms:
            per_lr, means = _lr_means(runs, name, arm)
            if not per_lr:
                continue
            finite = {lr: m for lr, m in means.items() if m is not None}
            # every run of one (configuration, arm) shares its plain lr (``lm.run``)
            plain = next(r.get("plain_lr") for r in runs if (r["config"], r["arm"]) == (name, arm))
            row: dict[str, Any] = {
                "plain_lr": plain,
                "config": name,
                "arm": arm,
                "val_loss_by_lr": {repr(lr): m for lr, m in means.items()},
                "diverged_lrs": [lr for lr, m in means.items() if m is None],
            }
            if finite:
                best_lr = min(finite, key=finite.get)
                seeds = per_lr[best_lr]
                row.update(
                    best_lr=best_lr,
                    best_val_loss=finite[best_lr],
                    seed_std=statistics.stdev(seeds) if len(seeds) > 1 else None,
                    seed_min=min(seeds),
                    seed_max=max(seeds),
                    n_seeds=len(seeds),
                    best_lr_at_sweep_edge=best_lr in (min(per_lr), max(per_lr)),
                )
                if arm != "adamw" and adamw_best is not None:
                    row["minus_adamw"] = finite[best_lr] - adamw_best
            else:
                row.update(best_lr=None, best_val_loss=None)
            rows.append(row)
    return rows


def block_equals_plain(runs: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Under MHA, max |val_loss(block_X) − val_loss(X)| over the shared (lr, seed) runs of each
    base geometry X (the block variant of a one-to-one pattern is the plain one)."""
    out: dict[str, float | None] = {}
    mha = {(r["arm"], r["lr"], r["seed"]): r["val_loss"] for r in runs if r["config"] == "mha"}
    for arm in PLAIN:
        diffs = [
            abs(v - mha[("block_" + arm, lr, seed)])
            for (a, lr, seed), v in mha.items()
            if a == arm
            and ("block_" + arm, lr, seed) in mha
            and _finite(v)
            and _finite(mha[("block_" + arm, lr, seed)])
        ]
        if diffs:
            out[arm] = max(diffs)
    return out


def protocol(cfg: Mapping[str, Any]) -> str:
    """One paragraph: which products each arm puts on its geometry, the rule that trains them,
    and which learning rate is swept."""
    products = {
        "qkvo": "QK and VO products",
        "qk": "QK products (VO plain)",
        "vo": "VO products (QK plain)",
    }[cfg["products"]]
    if cfg["rule"] == "momentum":
        rule = (
            f"`RiemannianMomentum` (M ← β·M + (1 − β)·P(G), ξ = −lr·M/max(‖M‖, c), β "
            f"{cfg['momentum_beta']}, c {cfg['momentum_c']})"
        )
    else:
        rule = "`RiemannianAdam` (one scalar second moment per frame)"
    if cfg["plain_lr"] == "adamw":
        grids = (
            ""
            if cfg.get("adamw_lrs") is None
            else f" (AdamW over {_grid(cfg['adamw_lrs'])}, the points over {_grid(cfg['lrs'])})"
        )
        lr = (
            "The adamw arm's lr is swept for the whole model first; every other arm keeps "
            "AdamW at that best lr (per configuration) on its plain parameters and sweeps the "
            f"lr of its points only{grids}."
        )
    else:
        lr = "The learning rate is swept for the whole optimizer (points and AdamW share it)."
    return f"Each geometry arm puts the {products} on it, trained by {rule}. {lr}"


def _grid(lrs: Sequence[float]) -> str:
    return "{" + ", ".join(f"{float(lr):g}" for lr in lrs) + "}"


def _fmt(x: Any, digits: int = 4) -> str:
    return "–" if not _finite(x) else f"{x:.{digits}f}"


def markdown(document: Mapping[str, Any]) -> str:
    """results.md: the best-lr table, the full sweep, the skipped arms and the setup."""
    cfg, summary = document["config"], document["summary"]
    rows = summary["table"]
    lines = [
        "# lm: character-level LM, learning-rate sweep (AdamW vs attention geometries)",
        "",
        f"Preset `{document['preset']}`; corpus: {summary['corpus']['source']} "
        f"({summary['corpus']['bytes']} bytes, sha256 {summary['corpus']['sha256'][:12]}…); "
        f"{cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads "
        f"(GQA: {cfg['gqa_kv_heads']} kv heads), context {cfg['context']}, batch "
        f"{cfg['batch_size']}, {cfg['steps']} steps (warm-up {cfg['warmup']}, no annealing), "
        f"seeds {cfg['seeds']}. Validation loss = next-byte cross-entropy in nats after the "
        f"last step. {protocol(cfg)} Weight decay {cfg['weight_decay']} on every AdamW-trained "
        "weight, the attention projections included in the adamw arm; the other arms do not "
        "decay their points (on frames decay does nothing, RA-5; on fixed-rank factors scaling "
        "the stored factors is not decay of the product).",
        "",
        "## Best learning rate per arm",
        "",
    ]
    table = []
    for r in rows:
        spread = (
            "–"
            if r.get("best_val_loss") is None
            else (
                f"{_fmt(r.get('seed_std'))} [{_fmt(r['seed_min'])}, {_fmt(r['seed_max'])}]"
                if r.get("n_seeds", 1) > 1
                else "1 seed"
            )
        )
        edge = " (edge)" if r.get("best_lr_at_sweep_edge") else ""
        table.append(
            [
                r["arm"],
                r["config"],
                _fmt(r.get("best_val_loss")),
                "–" if r.get("best_lr") is None else f"{r['best_lr']:g}{edge}",
                spread,
                f"{r['minus_adamw']:+.4f}" if _finite(r.get("minus_adamw")) else "–",
            ]
        )
    lines.append(
        common.markdown_table(
            ["arm", "config", "best val loss", "best lr", "seed std [min, max]", "− AdamW"],
            table,
        )
    )
    lrs = sorted({float(x) for x in [*cfg["lrs"], *(cfg.get("adamw_lrs") or [])]})
    lines += ["", "## Mean final validation loss for every learning rate", ""]
    lines.append(
        common.markdown_table(
            ["arm", "config", *[f"lr {lr:g}" for lr in lrs]],
            [
                [r["arm"], r["config"], *[_fmt(r["val_loss_by_lr"].get(repr(lr))) for lr in lrs]]
                for r in rows
            ],
        )
    )
    if summary["skipped"]:
        lines += ["", "## Arms not run", ""]
        lines += [f"- {s['config']} / {s['arm']}: {s['reason']}" for s in summary["skipped"]]
    if summary["block_equals_plain_mha"]:
        lines += [
            "",
            "Under MHA each block group is one head, so each `block_` variant is the plain one: "
            "max |Δ final val loss| over shared runs: "
            + ", ".join(f"{k} {v:.2g}" for k, v in summary["block_equals_plain_mha"].items())
            + ".",
        ]
    failed = [r for r in document["runs"] if r["diverged"]]
    if failed:
        lines += ["", "## Diverged runs", ""]
        lines += [
            f"- {r['config']} / {r['arm']} / lr {r['lr']:g} / seed {r['seed']}: {r['error']}"
            for r in failed
        ]
    lines += [
        "",
        f"Compute: {summary['seconds']:.0f} s of training steps over {len(document['runs'])} runs "
        f"({summary['environment_threads']} torch thread(s), device "
        f"{document['environment']['device']}).",
        "",
        '"(edge)": the best lr is the smallest or largest swept, so the optimum may lie '
        'outside the sweep. "− AdamW": best val loss minus AdamW\'s in the same configuration '
        "(negative: better than AdamW).",
        "",
        "Plots: `lr_sweep.png` (final validation loss against lr, mean over seeds, bars = seed "
        "range), `curves.png` (validation loss against step at each arm's best lr, seed "
        f"{cfg['seeds'][0]}).",
    ]
    return "\n".join(lines)


def plot(document: Mapping[str, Any], directory: Path) -> list[Path]:
    """lr_sweep.png and curves.png, one panel per attention configuration."""
    cfg, rows, runs = document["config"], document["summary"]["table"], document["runs"]
    names = [c for c in cfg["configs"] if any(r["config"] == c for r in rows)]
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    bases = list(PLAIN)
    colour = {"adamw": "black", "stiefel": "grey"}
    for i, base in enumerate(bases):  # tab20 pairs: dark for plain, light for block_
        colour[base], colour["block_" + base] = cmap(2 * i), cmap(2 * i + 1)
    paths = [directory / "lr_sweep.png", directory / "curves.png"]
    with common.figure(paths[0], ncols=max(1, len(names)), width=6.0, height=4.2) as axes:
        for ax, name in zip(axes, names or ["mha"], strict=False):
            for r in (r for r in rows if r["config"] == name):
                pts = []
                for lr_key, mean in r["val_loss_by_lr"].items():
                    lr = float(lr_key)
                    vals = [
                        x["val_loss"]
                        for x in runs
                        if x["config"] == name and x["arm"] == r["arm"] and x["lr"] == lr
                    ]
                    if mean is not None:
                        pts.append((lr, mean, mean - min(vals), max(vals) - mean))
                if not pts:
                    continue
                lr_, m_, lo, hi = zip(*sorted(pts), strict=True)
                style = "--" if r["arm"].startswith("block_") else "-"
                ax.errorbar(
                    lr_,
                    m_,
                    yerr=[lo, hi],
                    fmt="o" + style,
                    ms=3,
                    capsize=2,
                    color=colour[r["arm"]],
                    label=r["arm"],
                    lw=2.0 if r["arm"] == "adamw" else 1.0,
                )
            ax.set_xscale("log")
            ax.set_xlabel("learning rate")
            ax.set_ylabel("final validation loss (nats/byte)")
            ax.set_title(f"{name.upper()}")
            ax.legend(fontsize=6, ncol=2)
    with common.figure(paths[1], ncols=max(1, len(names)), width=6.0, height=4.2) as axes:
        for ax, name in zip(axes, names or ["mha"], strict=False):
            for r in (r for r in rows if r["config"] == name and r.get("best_lr") is not None):
                match = [
                    x
                    for x in runs
                    if x["config"] == name
                    and x["arm"] == r["arm"]
                    and x["lr"] == r["best_lr"]
                    and x["seed"] == cfg["seeds"][0]
                ]
                if match and match[0]["history"]:
                    h = match[0]["history"]
                    ax.plot(
                        [p["step"] for p in h],
                        [p["val_loss"] for p in h],
                        color=colour[r["arm"]],
                        label=f"{r['arm']} ({r['best_lr']:g})",
                        lw=2.0 if r["arm"] == "adamw" else 1.0,
                    )
            ax.set_xlabel("step")
            ax.set_ylabel("validation loss (nats/byte)")
            ax.set_title(f"{name.upper()}, best lr per arm")
            ax.legend(fontsize=6, ncol=2)
    return paths
