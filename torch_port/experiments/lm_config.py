"""The configuration of the lm sweep: its presets (the paper's protocol at three scales) and the
check that refuses, before any work, a configuration that cannot define a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch_port.experiments import common
from torch_port.experiments.lm_arms import resolve_arms
from torch_port.optim.guard import values as checks

#: Configuration keys that choose which runs make up the sweep; the others define one run,
#: and only those enter a run's checkpoint key (so a sweep may grow and still resume).
SWEEP_KEYS = ("seeds", "configs", "arms", "lrs", "adamw_lrs", "threads", "checkpoint_every")

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
        # AdamW's own grid (null: ``lrs``); its best lr then trains the other arms' plain
        # parameters, so the two grids tune plain parameters and points separately
        "adamw_lrs": None,
        "seeds": [0],
        "threads": 1,
        "checkpoint_every": 2,
    },
}
# CPU minutes: a 1 MB corpus, a d_model 64 model, every arm over a six-point lr grid, 2 seeds.
PRESETS["quick"] = common.preset_variant(
    PRESETS["smoke"],
    corpus_bytes=1_000_000,
    context=32,
    batch_size=16,
    steps=300,
    warmup=10,
    eval_every=50,
    eval_windows=64,
    d_model=64,
    n_heads=4,
    gqa_kv_heads=2,
    d_mlp=128,
    arms="all",
    # a normalised momentum step has length lr per head's point (an AdamW step ≈
    # lr·√entries), so the grid reaches further up than AdamW's best
    lrs=[1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1],
    seeds=[0, 1],
    checkpoint_every=100,
)
# The paper's scale: an 8 MB corpus, context 128, d_model 128, 3,000 steps, 3 seeds, 4 threads.
PRESETS["paper"] = common.preset_variant(
    PRESETS["quick"],
    corpus_bytes=8_000_000,
    context=128,
    batch_size=32,
    steps=3000,
    eval_every=250,
    eval_windows=256,
    d_model=128,
    d_mlp=512,
    lrs=[3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1],
    seeds=[0, 1, 2],
    threads=4,
    checkpoint_every=250,
)
# The quick model at the paper's length: 3,000 steps, 3 seeds, MHA (under MHA each block
# variant is its plain geometry, as the quick preset shows). Each grid holds the arm's best lr
# at 300 steps and the next one down (a longer run without annealing wants a smaller lr).
PRESETS["long"] = common.preset_variant(
    PRESETS["quick"],
    steps=3000,
    eval_every=250,
    configs=["mha"],
    arms=[
        "adamw",
        "stiefel",
        "fixed_rank_embedded",
        "fixed_rank_quotient",
        "partial_isometry_embedded",
        "partial_isometry_quotient",
        "stiefel_pair",
    ],
    adamw_lrs=[1e-3, 3e-3],
    lrs=[1e-2, 3e-2],
    seeds=[0, 1, 2],
    checkpoint_every=250,
)


def arm_lrs(config: Mapping[str, Any], arm: str) -> list[float]:
    """The learning rates swept for ``arm``: ``adamw_lrs`` for AdamW when given, else ``lrs``."""
    own = config["adamw_lrs"] if arm == "adamw" else None
    return [float(lr) for lr in (config["lrs"] if own is None else own)]


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
    for key in ("lrs", "adamw_lrs"):
        lrs = config[key]
        if key == "adamw_lrs" and lrs is None:
            continue
        if (
            not isinstance(lrs, list)
            or not lrs
            or any(not (isinstance(x, int | float) and math.isfinite(x) and x > 0) for x in lrs)
        ):
            raise ValueError(
                f"{key} must be a non-empty list of finite positive numbers, got {lrs!r}"
            )
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
