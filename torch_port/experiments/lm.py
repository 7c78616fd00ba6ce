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
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from torch_port.experiments import common, lm_report, runs
from torch_port.experiments.common import RunOptions
from torch_port.experiments.corpus import Corpus, load_corpus, train_batch, val_windows
from torch_port.experiments.lm_report import (
    best_lr,
    block_equals_plain,
    markdown,
    plot,
    summarise,
)
from torch_port.experiments.models import TokenEmbedding, Transformer
from torch_port.geometries import GEOMETRIES, PLAIN
from torch_port.optim import (
    FrameDecayWarning,
    NonFiniteGradientWarning,
    RiemannianAdam,
    RiemannianMomentum,
    checks,
)
from torch_port.optim.groups import build_optimizer

NAME = "lm"
VOCAB = 256

#: The ten design points of DESIGN §4.5 (every name of GEOMETRIES except "stiefel").
TEN_GEOMETRIES: tuple[str, ...] = tuple(g for g in GEOMETRIES if g != "stiefel")
#: Every arm, in reporting order.
ALL_ARMS: tuple[str, ...] = ("adamw", "stiefel", *TEN_GEOMETRIES)
#: Substrings of the ValueErrors ``torch_port.optim`` raises when a step diverges: a non-finite
#: gradient or point ("non-finite"), or a step that leaves the rank-r manifold ("rank-deficient",
#: "leaves the rank-"). Any other error of a step is a bug and propagates.
DIVERGENCE_MARKERS = ("non-finite", "rank-deficient", "leaves the rank-")
#: The attention module's refusal of a plain base geometry under GQA (a recorded skip).
GQA_REFUSAL = "one key/value head per query head"

#: Configuration keys that choose which runs make up the sweep; the others define one run,
#: and only those enter a run's checkpoint key (so a sweep may grow and still resume).
SWEEP_KEYS = ("seeds", "configs", "arms", "lrs", "threads", "checkpoint_every")

#: The paper's protocol: the QK and VO products of every head on the arm's geometry, trained by
#: the momentum rule with trust-region normalisation (``RiemannianMomentum``), AdamW (PyTorch's
#: defaults, its lr swept) on every other parameter at the adamw arm's best lr, and each arm's
#: own lr swept. c is not given by the paper: 1e-3 normalises a step to length lr whenever
#: ‖M‖ ≥ 1e-3, which holds for nearly every head (the largest per-head momentum norms of the quick
#: model after 30 steps measured 1.3e-3 to 3.9e-2, over Stiefel, R1 and P3).
#: ``--set products=qk --set rule=adam --set plain_lr=null`` is the earlier shared protocol.
_PAPER_PROTOCOL = {
    "products": "qkvo",
    "rule": "momentum",
    "momentum_beta": 0.9,
    "momentum_c": 1e-3,
    "plain_lr": "adamw",
}
PRODUCTS = ("qk", "vo", "qkvo")
RULES = ("adam", "momentum")

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "corpus_bytes": 20_000,
        "val_fraction": 0.1,
        "context": 16,
        "batch_size": 4,
        "steps": 4,
        "warmup": 2,
        "eval_every": 2,
        "eval_windows": 4,
        "d_model": 16,
        "n_heads": 2,
        "gqa_kv_heads": 1,
        "n_layers": 2,
        "d_mlp": 32,
        "weight_decay": 0.01,
        "betas": [0.9, 0.999],
        **_PAPER_PROTOCOL,
        "configs": ["mha", "gqa"],
        "arms": ["adamw", "stiefel"],
        "lrs": [3e-3, 1e-2],
        "seeds": [0],
        "threads": 1,
        "checkpoint_every": 2,
    },
    "quick": {
        "corpus_bytes": 1_000_000,
        "val_fraction": 0.1,
        "context": 32,
        "batch_size": 16,
        "steps": 300,
        "warmup": 10,
        "eval_every": 50,
        "eval_windows": 64,
        "d_model": 64,
        "n_heads": 4,
        "gqa_kv_heads": 2,
        "n_layers": 2,
        "d_mlp": 128,
        "weight_decay": 0.01,
        "betas": [0.9, 0.999],
        **_PAPER_PROTOCOL,
        "configs": ["mha", "gqa"],
        "arms": "all",
        # a normalised momentum step has length lr per head's point (an AdamW step ≈
        # lr·√entries), so the grid reaches further up than AdamW's best
        "lrs": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1],
        "seeds": [0, 1],
        "threads": 1,
        "checkpoint_every": 100,
    },
    "paper": {
        "corpus_bytes": 8_000_000,
        "val_fraction": 0.1,
        "context": 128,
        "batch_size": 32,
        "steps": 3000,
        "warmup": 10,
        "eval_every": 250,
        "eval_windows": 256,
        "d_model": 128,
        "n_heads": 4,
        "gqa_kv_heads": 2,
        "n_layers": 2,
        "d_mlp": 512,
        "weight_decay": 0.01,
        "betas": [0.9, 0.999],
        **_PAPER_PROTOCOL,
        "configs": ["mha", "gqa"],
        "arms": "all",
        "lrs": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1],
        "seeds": [0, 1, 2],
        "threads": 4,
        "checkpoint_every": 250,
    },
}


# -- arms and models ----------------------------------------------------------------------------
def attention_options(arm: str, products: str = "qk") -> dict[str, Any]:
    """Keyword arguments of ``models.Transformer`` for ``arm``: the QK geometry (``arm`` for
    ``products`` "qk" and "qkvo", else None), the VO geometry (``arm`` for "vo" and "qkvo", else
    None; both None for AdamW) and ``block`` for the ``block_`` design points."""
    if arm == "adamw":
        return {"qk_geometry": None, "vo_geometry": None, "block": False}
    if arm not in ALL_ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose from {list(ALL_ARMS)}")
    qk = arm if products in ("qk", "qkvo") else None
    vo = arm if products in ("vo", "qkvo") else None
    return {"qk_geometry": qk, "vo_geometry": vo, "block": arm.startswith("block_")}


def kv_heads(config: Mapping[str, Any], name: str) -> int:
    """Key/value heads of attention configuration ``name`` ("mha" or "gqa")."""
    if name == "mha":
        return int(config["n_heads"])
    if name == "gqa":
        return int(config["gqa_kv_heads"])
    raise ValueError(f"unknown attention configuration {name!r}; choose mha or gqa")


def build_model(config: Mapping[str, Any], name: str, arm: str, seed: int) -> Transformer:
    """The causal byte-level transformer of one arm (paired initialisation from ``seed``)."""
    d = int(config["d_model"])
    return Transformer(
        TokenEmbedding(VOCAB, d),
        d,
        int(config["n_layers"]),
        int(config["n_heads"]),
        int(config["d_mlp"]),
        VOCAB,
        int(config["context"]),
        seed=seed,
        n_kv_heads=kv_heads(config, name),
        causal=True,
        **attention_options(arm, config["products"]),
    )


def arm_refusal(config: Mapping[str, Any], name: str, arm: str) -> str | None:
    """The attention module's refusal message when ``arm`` is a plain base geometry and
    configuration ``name`` has fewer key/value heads than query heads (each head's QK product
    is its own point, which needs a one-to-one head pattern: a known, recorded skip); None when
    the model builds. Any other error building the model propagates (a bad setting, not a skip)."""
    if arm in PLAIN and kv_heads(config, name) < int(config["n_heads"]):
        try:
            build_model(config, name, arm, 0)
        except ValueError as exc:
            if GQA_REFUSAL not in str(exc):
                raise
            return str(exc)
        return None
    build_model(config, name, arm, 0)
    return None


def resolve_arms(config: Mapping[str, Any]) -> list[str]:
    """The arms asked for: ``"all"`` or a list of names from ``ALL_ARMS``."""
    arms = config["arms"]
    if arms == "all":
        return list(ALL_ARMS)
    if isinstance(arms, str) or not isinstance(arms, Sequence) or not arms:
        raise ValueError(f"arms must be 'all' or a non-empty list of names, got {arms!r}")
    unknown = [a for a in arms if a not in ALL_ARMS]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; choose from {list(ALL_ARMS)}")
    return list(dict.fromkeys(arms))


def check_config(config: Mapping[str, Any]) -> None:
    """Refuse, before any work, values that cannot define a run (the measured value named)."""
    for key in (
        "steps",
        "batch_size",
        "eval_every",
        "eval_windows",
        "checkpoint_every",
        "threads",
        "d_model",
        "n_heads",
        "gqa_kv_heads",
        "n_layers",
        "d_mlp",
    ):
        common.check_int(config, key)
    d, heads, kv = config["d_model"], config["n_heads"], config["gqa_kv_heads"]
    if d % heads:
        raise ValueError(f"d_model = {d} must be divisible by n_heads = {heads}")
    if heads % kv:
        raise ValueError(
            f"gqa_kv_heads = {kv} must divide n_heads = {heads} (GQA groups of equal size)"
        )
    if isinstance(config["warmup"], bool) or int(config["warmup"]) < 0:
        raise ValueError(f"warmup must be ≥ 0, got {config['warmup']!r}")
    lrs = config["lrs"]
    if not lrs or any(not (isinstance(x, int | float) and math.isfinite(x) and x > 0) for x in lrs):
        raise ValueError(f"lrs must be a non-empty list of finite positive numbers, got {lrs!r}")
    for key, known in (("products", PRODUCTS), ("rule", RULES)):
        if config[key] not in known:
            raise ValueError(f"{key} must be one of {known}, got {config[key]!r}")
    plain_lr = config["plain_lr"]
    if plain_lr is not None and plain_lr != "adamw":
        raise ValueError(f"plain_lr must be null (shared lr) or 'adamw', got {plain_lr!r}")
    if plain_lr == "adamw" and "adamw" not in resolve_arms(config):
        raise ValueError("plain_lr='adamw' takes AdamW's best lr, so the arms must include adamw")
    checks.beta("momentum_beta", config["momentum_beta"])
    checks.positive("momentum_c", config["momentum_c"])
    if not config["configs"] or any(c not in ("mha", "gqa") for c in config["configs"]):
        raise ValueError(
            f"configs must be a non-empty list of 'mha'/'gqa', got {config['configs']}"
        )
    resolve_arms(config)


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
                    for lr in config["lrs"]
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
