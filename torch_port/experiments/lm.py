"""Character-level language modelling: a learning-rate sweep of AdamW against the ten geometries
and Stiefel frames on the attention's QK (and VO) products (DESIGN §8).

Model: ``models.Transformer`` with ``n_layers`` causal pre-norm blocks over the byte vocabulary
(256 tokens, ``TokenEmbedding``), in two attention configurations: MHA (``n_kv_heads =
n_heads``) and GQA (``gqa_kv_heads`` key/value heads). The loss is the mean next-byte
cross-entropy in nats.

Arms. ``adamw``: plain projections, AdamW on every parameter. ``stiefel``: W_Q^h and W_K^g (and,
with ``products="qkvo"``, W_V^g and W_O^h) are frames on St(d_model, head_dim). Each of the ten
design points of DESIGN §4.5 (``fixed_rank_embedded`` … ``block_stiefel_pair``): the QK products
(and with ``"qkvo"`` the VO products) live on that geometry. Every arm's optimizer is built by
``torch_port.optim.groups.build_optimizer`` (``make_optimizer``): the points get
``RiemannianMomentum`` (``rule="momentum"``: M ← β·M + (1 − β)·P(G), ξ = −lr·M/max(‖M‖, c)) or
``RiemannianAdam`` (``rule="adam"``: one scalar second moment per frame), every other parameter
AdamW with decoupled weight decay — so the ``adamw`` arm is exactly AdamW. Learning rates
(after a linear warm-up of ``warmup`` steps, no annealing): with ``plain_lr="adamw"`` (the
paper's protocol) the adamw arm's lr is swept first for the whole model, and every other arm
keeps AdamW at that best lr (per attention configuration) on its plain parameters while its own
lr, swept, applies to its points only; with ``plain_lr`` null the swept lr applies to the whole
optimizer. The presets follow the paper's protocol (``_PAPER_PROTOCOL``: QKVO, momentum, AdamW's
best lr on the rest); ``--set products=qk --set rule=adam --set plain_lr=null`` gives the earlier
shared protocol.

Weight decay differs between the arms on the attention projections only: the ``adamw`` arm
decays them (``weight_decay``, 0.01 in every preset) like every other weight, while
``build_optimizer`` gives every geometry group weight decay 0, so the ``stiefel`` arm and the
ten design points do not decay their points. On frames (Stiefel, partial isometries, Stiefel
pairs) decay does nothing (the Riemannian gradient of (λ/2)‖W‖² is 0 there, RA-5); on the
fixed-rank factors (R1, R2) scaling the stored factors is not decay of the product, so it is
left off. Every other parameter is decayed alike in every arm.

GQA: the plain variants of the five base geometries treat each head's QK product as its own
point, which needs a one-to-one head pattern; the attention module refuses them under GQA, and
the refusal (its message) is recorded as a skipped arm. The GQA configuration runs ``adamw``,
``stiefel`` and the five ``block_`` variants. Under MHA a block group is one head, so each
``block_`` variant is the plain one (the results say whether the measured losses agree).

Data (``corpus``): by default the Python standard library's sources (``.py`` files under
``sysconfig.get_paths()["stdlib"]``, ``site-packages``/``dist-packages``/``__pycache__`` left
out, directories walked in sorted order, files joined by a newline) up to ``corpus_bytes``
bytes; ``--corpus FILE`` reads the first ``corpus_bytes`` bytes of that file instead. The last
``val_fraction`` of the bytes is the validation split. Training batches are ``batch_size``
random windows of ``context + 1`` bytes drawn by a generator seeded with the run's seed (the
same windows for every arm and learning rate of a seed: paired comparisons); validation uses
``eval_windows`` fixed windows spread evenly over the validation split.

Reported (``lm_report``): for each run the final and the best validation loss; for each
(configuration, arm) the learning rate of the lowest mean final validation loss over seeds, with
the seed spread there. A run whose loss becomes non-finite, or whose optimizer step fails the
way a divergence does (a non-finite gradient or point, or a step that leaves the rank-r
manifold: the ValueErrors of ``torch_port.optim`` matched by ``DIVERGENCE_MARKERS``), is marked
diverged and never selected; any other error of a step propagates (a bug is not a divergence).

Threads: every preset fixes ``threads`` (torch intra-op threads), so results do not depend on
the machine's core count; ``results.json`` records the count used.

Each (configuration, arm, lr, seed) run is a cell of ``runs.run_cells``: it checkpoints every
``checkpoint_every`` steps, and its finished record is kept until the whole sweep is done, so an
interrupted sweep resumes where it stopped (and equals the uninterrupted one).

The presets and the checks of a configuration are ``lm_config``'s; the arms and the model of an
arm ``lm_arms``'s.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from torch_port.experiments import common, lm_report, runs
from torch_port.experiments.common import RunOptions
from torch_port.experiments.corpus import Corpus, load_corpus, train_batch, val_windows
from torch_port.experiments.lm_arms import arm_refusal, build_model, kv_heads, resolve_arms
from torch_port.experiments.lm_config import PRESETS, SWEEP_KEYS, arm_lrs, check_config
from torch_port.experiments.lm_report import (
    best_lr,
    block_equals_plain,
    markdown,
    plot,
    summarise,
)
from torch_port.experiments.models import Transformer
from torch_port.optim import (
    FrameDecayWarning,
    NonFiniteGradientWarning,
    RiemannianAdam,
    RiemannianMomentum,
)
from torch_port.optim.groups import build_optimizer

NAME = "lm"

#: Substrings of the ValueErrors ``torch_port.optim`` raises when a step diverges: a non-finite
#: gradient or point ("non-finite"), or a step that leaves the rank-r manifold ("rank-deficient",
#: "leaves the rank-"). Any other error of a step is a bug and propagates.
DIVERGENCE_MARKERS = ("non-finite", "rank-deficient", "leaves the rank-")


# -- one run ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """One point of the sweep."""

    config_name: str
    arm: str
    lr: float
    seed: int
    #: The plain parameters' own lr (None: ``lr`` for every parameter).
    plain_lr: float | None = None

    @property
    def key(self) -> str:
        plain = "" if self.plain_lr is None else f"/plain_lr={self.plain_lr!r}"
        return f"{self.config_name}/{self.arm}/lr={self.lr!r}{plain}/seed={self.seed}"


def run_config(config: Mapping[str, Any], corpus: Corpus) -> dict[str, Any]:
    """The part of the configuration that defines a single run (plus the corpus hash): the
    checkpoint key of every run."""
    return {**runs.run_config(config, SWEEP_KEYS), "corpus_sha256": corpus.info["sha256"]}


@torch.no_grad()
def evaluate(model: Transformer, windows: torch.Tensor, batch: int = 64) -> float:
    """Mean next-byte cross-entropy (nats) over every position of the validation windows."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i : i + batch]
        logits = model(w[:, :-1])
        total += float(F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum"))
        count += w[:, 1:].numel()
    model.train()
    return total / count


def is_divergence(exc: BaseException) -> bool:
    """Whether an optimizer step's error is a divergence (``DIVERGENCE_MARKERS``)."""
    return isinstance(exc, ValueError) and any(m in str(exc) for m in DIVERGENCE_MARKERS)


def _warmup_factor(step: int, warmup: int) -> float:
    """Linear warm-up: lr_t = lr · min(1, (t + 1)/warmup) (1 when warmup = 0)."""
    return 1.0 if warmup <= 0 else min(1.0, (step + 1) / warmup)


def make_optimizer(
    model: Transformer, config: Mapping[str, Any], spec: RunSpec
) -> torch.optim.Optimizer:
    """The arm's optimizer (``build_optimizer``): the points under ``RiemannianAdam`` or, for
    ``rule="momentum"``, ``RiemannianMomentum`` (β ``momentum_beta``, c ``momentum_c``), at
    ``spec.lr``; every other parameter AdamW (betas, decoupled decay ``weight_decay``) at
    ``spec.plain_lr`` when given, else at ``spec.lr``. No parameter is left out of decay
    (module docstring)."""
    common_options: dict[str, Any] = dict(
        lr=spec.lr,
        betas=tuple(config["betas"]),
        weight_decay=float(config["weight_decay"]),
        no_decay=False,
    )
    if spec.plain_lr is not None:
        common_options["plain_options"] = {"lr": spec.plain_lr}
    if config["rule"] == "momentum":
        return build_optimizer(
            model,
            RiemannianMomentum,
            beta=float(config["momentum_beta"]),
            c=float(config["momentum_c"]),
            **common_options,
        )
    return build_optimizer(model, RiemannianAdam, **common_options)


def train_run(
    spec: RunSpec,
    config: Mapping[str, Any],
    corpus: Corpus,
    device: torch.device,
    checkpoint: common.Checkpoint | None = None,
    *,
    bar: Any = None,
    stop_after: int | None = None,
) -> dict[str, Any] | None:
    """Train one run and return its record; with ``checkpoint`` the state is saved every
    ``checkpoint_every`` steps (``runs.save_training``) and a saved state is resumed
    (``runs.resume_training``). The checkpoint is left in place: ``runs.run_cached`` keeps the
    finished record and then removes it. ``bar`` (a progress bar) advances by the steps
    restored, then by one per step, and to ``steps`` when the run stops early (a divergence).

    ``stop_after`` (for resume checks) saves the state after that many steps and returns None."""
    steps, ctx, warmup = int(config["steps"]), int(config["context"]), int(config["warmup"])
    model = build_model(config, spec.config_name, spec.arm, spec.seed).to(device)
    optimizer = make_optimizer(model, config, spec)
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    gen = common.generator(spec.seed)
    windows = val_windows(corpus.val, ctx, int(config["eval_windows"])).to(device)
    history: list[dict[str, Any]] = []
    start, seconds, train_sum, train_count = 0, 0.0, 0.0, 0
    diverged, error = False, None
    state = runs.resume_training(checkpoint, model, optimizer, gen)
    if state is not None:
        start, history, seconds = state["step"], state["history"], state["seconds"]
        train_sum, train_count = state["train_sum"], state["train_count"]
        if bar is not None:
            bar.update(start)

    def save(step: int) -> None:
        runs.save_training(
            checkpoint,
            model,
            optimizer,
            gen,
            step=step,
            history=history,
            seconds=seconds,
            train_sum=train_sum,
            train_count=train_count,
        )

    model.train()
    step = start
    while step < steps:
        t0 = time.perf_counter()
        for group, lr in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = lr * _warmup_factor(step, warmup)
        x, y = train_batch(corpus.train, ctx, int(config["batch_size"]), gen)
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        if not torch.isfinite(loss):
            diverged, error = True, f"non-finite training loss at step {step}"
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NonFiniteGradientWarning)
                warnings.simplefilter("ignore", FrameDecayWarning)
                optimizer.step()
        except ValueError as exc:
            if not is_divergence(exc):
                raise
            diverged, error = True, f"optimizer step {step} failed: {exc}"
            break
        train_sum, train_count = train_sum + loss.item(), train_count + 1
        step += 1
        seconds += time.perf_counter() - t0
        if bar is not None:
            bar.update(1)
        if step % int(config["eval_every"]) == 0 or step == steps:
            val = evaluate(model, windows)
            history.append(
                {"step": step, "train_loss": train_sum / max(train_count, 1), "val_loss": val}
            )
            train_sum, train_count = 0.0, 0
            if not math.isfinite(val):
                diverged, error = True, f"non-finite validation loss at step {step}"
                break
        if checkpoint is not None and (
            step % int(config["checkpoint_every"]) == 0 or step == stop_after
        ):
            save(step)
        if stop_after is not None and step >= stop_after:
            return None
    if bar is not None and step < steps:
        bar.update(steps - step)
    vals = [h["val_loss"] for h in history]
    record = {
        "config": spec.config_name,
        "arm": spec.arm,
        "lr": spec.lr,
        "plain_lr": spec.plain_lr,
        "seed": spec.seed,
        "n_kv_heads": kv_heads(config, spec.config_name),
        "steps_done": step,
        "diverged": diverged,
        "error": error,
        "val_loss": float("nan") if diverged or not vals else vals[-1],
        "best_val_loss": float("nan") if not vals else min(vals),
        "final_train_loss": history[-1]["train_loss"] if history else float("nan"),
        "seconds": seconds,
        "history": history,
    }
    return record


# -- the experiment -----------------------------------------------------------------------------
def run(options: RunOptions) -> dict[str, Any]:
    """Run the sweep of the preset (every configuration × arm × lr × seed) and write
    results.json, results.md, lr_sweep.png and curves.png under ``<out>/lm``."""
    config = common.configure(PRESETS, options)
    check_config(config)
    device = common.resolve_device(options.device)
    corpus = load_corpus(options.corpus, config)
    directory = common.output_dir(options, NAME)
    arms = resolve_arms(config)
    with runs.torch_threads(config["threads"]):
        skipped, runnable = [], []
        for name in config["configs"]:
            for arm in arms:
                reason = arm_refusal(config, name, arm)
                if reason is None:
                    runnable.append((name, arm))
                else:
                    skipped.append({"config": name, "arm": arm, "reason": reason})
        base, steps = run_config(config, corpus), int(config["steps"])

        def work(cell: runs.Cell, ckpt: common.Checkpoint, bar: Any) -> dict[str, Any] | None:
            spec = cell.spec
            bar.set_postfix_str(f"{spec.config_name} {spec.arm} lr={spec.lr:g}")
            return train_run(spec, config, corpus, device, ckpt, bar=bar)

        def sweep(pairs: list[tuple[str, str]], plain: dict[str, float | None], desc: str):
            cells = [
                runs.Cell(base, spec.key, spec, steps)
                for name, arm in pairs
                for spec in (
                    RunSpec(name, arm, float(lr), int(seed), plain[name])
                    for lr in arm_lrs(config, arm)
                    for seed in config["seeds"]
                )
            ]
            records = runs.run_cells(
                directory, cells, work, resume=options.resume, desc=desc, show=options.progress
            )
            return cells, records

        # plain_lr "adamw": AdamW's sweep first, its best lr then fixed on the other arms'
        # plain parameters (per configuration).
        first = [(n, a) for n, a in runnable if a == "adamw"] if config["plain_lr"] else []
        cells, records = sweep(first, dict.fromkeys(config["configs"]), "lm sweep (adamw)")
        plain = {n: best_lr(records, n, "adamw") for n in config["configs"]}
        rest = [pair for pair in runnable if pair not in first]
        if config["plain_lr"]:  # no AdamW lr to fix where AdamW diverged at every lr
            for name, arm in [(n, a) for n, a in rest if plain[n] is None]:
                reason = "plain_lr='adamw' but AdamW diverged at every swept lr here"
                skipped.append({"config": name, "arm": arm, "reason": reason})
            rest = [(n, a) for n, a in rest if plain[n] is not None]
        more_cells, more = sweep(rest, plain, "lm sweep")
        cells, records = cells + more_cells, records + more
        table = summarise(records, config["configs"], arms)
        summary = {
            "table": table,
            "skipped": skipped,
            "protocol": lm_report.protocol(config),
            "plain_lr_by_config": plain if config["plain_lr"] else None,
            "selection": "lowest mean (over seeds) final validation loss over the swept lrs",
            "point_weight_decay": (
                f"adamw arm: the attention projections decayed like every weight (weight_decay "
                f"{config['weight_decay']}); geometry arms: points not decayed"
            ),
            "block_equals_plain_mha": block_equals_plain(records),
            "corpus": corpus.info,
            "seconds": sum(r["seconds"] for r in records),
            "environment_threads": torch.get_num_threads(),
        }
        document = common.results_document(NAME, options, config, records, summary, device)
    plot(document, directory)
    return runs.finish(directory, cells, document, markdown(document))


def format_summary(document: Mapping[str, Any]) -> str:
    """One line per (configuration, arm): best validation loss, its lr, and − AdamW."""
    lines = [f"lm ({document['preset']}): best final validation loss over lrs (nats/byte)"]
    for r in document["summary"]["table"]:
        if r.get("best_val_loss") is None:
            lines.append(f"  {r['config']:<4} {r['arm']:<32} diverged at every lr")
            continue
        delta = r.get("minus_adamw")
        lines.append(
            f"  {r['config']:<4} {r['arm']:<32} {r['best_val_loss']:.4f} at lr {r['best_lr']:g}"
            + ("" if delta is None or r["arm"] == "adamw" else f"  (− AdamW {delta:+.4f})")
        )
    for s in document["summary"]["skipped"]:
        lines.append(f"  skipped {s['config']}/{s['arm']}: {s['reason'][:90]}")
    return "\n".join(lines)
