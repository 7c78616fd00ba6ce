"""The optimizer arms of the Stiefel-attention experiments and the training loop they share.

An *arm* is a treatment of the attention's W_Q^h and W_K^h (one d_model×d_head matrix per head);
every other weight is trained by AdamW with the experiment's decay in every arm:

==  ===============================================================================
A   Euclidean AdamW on W_Q, W_K (plain projections, decayed like everything else)
B   frames on St(d, r), fixed-step RSGD ξ = −lr·P_W(G) (degree one in the gradient, no cap)
C   frames, ``riemannian_adam``: one scalar second moment per frame, trust cap, polar
D   frames, normalised RSGD ξ = −lr·P_W(G)/RMS(P_W(G)) (scale free, no moments)
E   frames, no projector: scalar-moment Adam on the raw Euclidean gradient, then polar
F   frames, ``riemannian_adam(moment="elementwise")`` (breaks O(d)-equivariance)
G   frozen frames: W_Q, W_K held at their orthonormal initialisation
H   AdamW (no decay) on W_Q, W_K, then the polar projection W ← polar(W) after every step
==  ===============================================================================

Frames are never decayed (RA-5: decay has zero Riemannian gradient on St(d, r)); nor are H's
W_Q, W_K (decay before the projection would only inflate the step: polar(c·W + ξ) =
polar(W + ξ/c)). The trust radius Δ caps the steps of C, E and F. A ``Task`` is a
classification problem with a model factory; ``train_run`` trains one (task, arm, seed), logs
accuracy, per-component weight norms, principal angles of W_Q/W_K to their initialisation and,
on request, the per-step movement ‖W_{t+1} − W_t‖_F of every head's W_Q and W_K, and can stop
and resume from a ``Checkpoint`` exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from torch_port import linalg
from torch_port.experiments.common import (
    Checkpoint,
    configure,
    generator,
    output_dir,
    progress,
    resolve_device,
    results_document,
    write_results,
)
from torch_port.nn import build_optimizer
from torch_port.optim import (
    RSGD,
    ChainOptimizer,
    NormalizedRSGD,
    RiemannianAdam,
    checks,
    transforms,
)

Tensor = torch.Tensor

#: Arm letter -> what it does to W_Q, W_K.
ARMS: dict[str, str] = {
    "A": "Euclidean AdamW",
    "B": "Stiefel, fixed-step RSGD",
    "C": "Stiefel, riemannian_adam",
    "D": "Stiefel, normalised RSGD",
    "E": "no projector (scalar Adam on raw G, then polar)",
    "F": "Stiefel, elementwise moment",
    "G": "frozen frames",
    "H": "AdamW, then polar projection",
}

#: Arms whose model has W_Q, W_K on St(d, r) from the start (the others start plain).
STIEFEL_ARMS = ("B", "C", "D", "E", "F", "G")


def check_arms(arms: Iterable[str]) -> list[str]:
    """The arm letters, validated (an unknown letter names the known ones)."""
    arms = list(arms)
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise ValueError(f"unknown arms {bad or arms}; choose among {sorted(ARMS)}")
    return arms


def arm_geometry(arm: str) -> str | None:
    """The ``qk_geometry`` the arm's model is built with: "stiefel" or None (plain)."""
    return "stiefel" if arm in STIEFEL_ARMS else None


def qk_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Name -> parameter for every attention W_Q and W_K of ``model`` (shape (heads, d, r))."""
    return {n: p for n, p in model.named_parameters() if n.endswith((".attn.w_q", ".attn.w_k"))}


# -- the rules of arms E and H, as chains ---------------------------------------------------------
def euclidean_frame_adam(group: dict[str, Any]) -> transforms.Transform:
    """Arm E's rule on the raw Euclidean gradient G (a group with ``"gradient": "euclidean"``):
    m ← β1·m + (1 − β1)·G; √v ← hypot(√β2·√v, √(1 − β2)·RMS(G)) per frame; ξ = −lr·m̂/(√v̂ + ε),
    capped at ‖ξ‖_F ≤ Δ when ``trust_radius`` is given; then W ← polar(W + ξ), the Stiefel
    retraction, removes the normal part of ξ only to first order."""
    b1, b2 = group["betas"]
    steps = [transforms.scale_by_adam(b1, b2, group["eps"]), transforms.scale(-group["lr"])]
    if group.get("trust_radius") is not None:
        steps.append(transforms.trust_region(group["trust_radius"]))
    return transforms.chain(*steps)


def euclidean_adam(group: dict[str, Any]) -> transforms.Transform:
    """Arm H's rule: Adam with one second moment per entry on the raw gradient, ξ = −lr·m̂/(√v̂ +
    ε) entry by entry (AdamW without decay), then W ← polar(W + ξ)."""
    b1, b2 = group["betas"]
    return transforms.chain(
        transforms.scale_by_adam(b1, b2, group["eps"], moment="elementwise"),
        transforms.scale(-group["lr"]),
    )


#: Arm -> the rule of its W_Q, W_K group (arms E and H; the others use a preset).
EUCLIDEAN_RULES = {"E": euclidean_frame_adam, "H": euclidean_adam}


def arm_rule(group: dict[str, Any]) -> transforms.Transform:
    """The chain of a W_Q, W_K group of arm E or H (named by its "arm" entry)."""
    return EUCLIDEAN_RULES[group["arm"]](group)


def prepare_model(arm: str, model: nn.Module) -> nn.Module:
    """Arm-specific set-up of a freshly built model: H starts from polar(W_Q), polar(W_K);
    G freezes the frames (``requires_grad=False``)."""
    check_arms([arm])
    qk = qk_parameters(model)
    if arm == "H":
        with torch.no_grad():
            for p in qk.values():
                p.copy_(linalg.polar(p))
    if arm == "G":
        for p in qk.values():
            p.requires_grad_(False)
    return model


def make_optimizer(
    arm: str,
    model: nn.Module,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    eps: float = 1e-8,
    trust_radius: float | None = None,
) -> torch.optim.Optimizer:
    """The arm's optimizer: AdamW (lr, betas, eps, decoupled ``weight_decay``) on every non-frame
    weight, the arm's rule (same lr; no decay) on W_Q, W_K (module docstring): a preset for
    A, B, C, D, F, G; for E and H a ``ChainOptimizer`` whose W_Q, W_K group takes the Euclidean
    gradient (``EUCLIDEAN_RULES``) and the Stiefel polar retraction. The trust radius Δ caps the
    steps of C, E and F only (B is plain fixed-step RSGD, D is scale free)."""
    check_arms([arm])
    common = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    frame = {"trust_radius": trust_radius}
    if arm in ("E", "H"):
        qk = qk_parameters(model)
        ids = {id(p) for p in qk.values()}
        rest = [(n, p) for n, p in model.named_parameters() if id(p) not in ids and p.requires_grad]
        frames = {
            "params": list(qk.values()),
            "param_names": list(qk),
            "geometry": "stiefel",
            "gradient": "euclidean",
            "arm": arm,
            "weight_decay": 0.0,
            "trust_radius": trust_radius if arm == "E" else None,
        }
        plain = {"params": [p for _, p in rest], "param_names": [n for n, _ in rest]}
        return ChainOptimizer([frames, plain], arm_rule, **common)
    if arm in ("A", "G"):
        return build_optimizer(model, RiemannianAdam, **common)
    if arm == "B":
        return build_optimizer(model, RSGD, **common)
    if arm == "C":
        return build_optimizer(model, RiemannianAdam, frame_options=frame, **common)
    if arm == "D":
        return build_optimizer(model, NormalizedRSGD, **common)
    options = {**frame, "moment": "elementwise"}  # F
    return build_optimizer(model, RiemannianAdam, frame_options=options, **common)


# -- measurements ------------------------------------------------------------------------------
def max_principal_angle(w0: Tensor, w: Tensor) -> Tensor:
    """Largest principal angle (degrees) between span(W0) and span(W) per trailing d×r matrix:
    θ = atan2(σ_max(Q − Q0(Q0ᵀQ)), σ_min(Q0ᵀQ)), Q0, Q the orthonormal QR factors (float64).
    The sine part keeps small angles accurate (arccos of σ_min ≈ 1 has a floor near 1e-6°), the
    cosine part angles near 90° (arcsin of σ_max ≈ 1 has the same floor there)."""
    q0 = torch.linalg.qr(w0.double())[0]
    q = torch.linalg.qr(w.double())[0]
    overlap = linalg.transpose(q0) @ q
    sin = torch.linalg.svdvals(q - q0 @ overlap).amax(-1)
    cos = torch.linalg.svdvals(overlap).amin(-1)
    return torch.rad2deg(torch.atan2(sin, cos))


def component_of(name: str) -> str:
    """The component a parameter belongs to, for the weight-norm logs: embed, pos, w_q, w_k,
    w_v, w_o, mlp_in, mlp_out, norm, unembed."""
    if name.startswith("embed"):
        return "embed"
    if name == "pos":
        return "pos"
    if ".attn." in name:
        return name.rsplit(".", 1)[-1].replace("b_", "w_")
    if ".mlp.0." in name:
        return "mlp_in"
    if ".mlp.2." in name:
        return "mlp_out"
    if "norm" in name:
        return "norm"
    return "unembed"


def component_norms(model: nn.Module) -> dict[str, float]:
    """‖·‖_F of every component (weights and biases together): sqrt(Σ over its parameters of
    Σ θ²) — the quantity weight decay shrinks and the collapse cycles show."""
    sq: dict[str, float] = {}
    for name, p in model.named_parameters():
        c = component_of(name)
        sq[c] = sq.get(c, 0.0) + float(p.detach().double().square().sum())
    return {c: math.sqrt(v) for c, v in sq.items()}


# -- tasks and the training loop ---------------------------------------------------------------
@dataclass
class Task:
    """A classification problem: ``make_model(seed, qk_geometry)`` builds the model (paired
    initialisation: the same seed gives the same non-attention weights in every arm), inputs
    and labels for training and validation, ``batch_size`` (None: full batch) and ``readout``
    ("last": logits of the last token, "mean": mean over tokens)."""

    name: str
    make_model: Callable[[int, str | None], nn.Module]
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    batch_size: int | None = None
    readout: str = "last"


def logits_of(task: Task, model: nn.Module, x: Tensor) -> Tensor:
    """(B, n_classes) logits of ``model`` on inputs ``x`` with the task's read-out."""
    out = model(x)
    return out[:, -1] if task.readout == "last" else out.mean(dim=1)


@torch.no_grad()
def loss_and_accuracy(
    task: Task, model: nn.Module, x: Tensor, y: Tensor, chunk: int = 4096
) -> tuple[float, float]:
    """Mean cross-entropy (1/N)·Σ −log softmax(z_i)[y_i] and the fraction of correct argmax
    predictions on (x, y), in chunks and in eval mode."""
    model.eval()
    total, correct = 0.0, 0
    for i in range(0, len(x), chunk):
        z, t = logits_of(task, model, x[i : i + chunk]), y[i : i + chunk]
        total += float(F.cross_entropy(z.double(), t, reduction="sum"))
        correct += int((z.argmax(-1) == t).sum())
    model.train()
    n = max(len(x), 1)
    return total / n, correct / n


def _batches(task: Task, gen: torch.Generator) -> Tensor:
    """Index order of one epoch: all indices (full batch) or a permutation drawn from ``gen``."""
    n = len(task.x_train)
    return torch.arange(n) if task.batch_size is None else torch.randperm(n, generator=gen)


def _frame_snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in qk_parameters(model).items()}


def frames_like(saved: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """The saved initial W_Q, W_K moved to the device (and dtype) of the model's parameters: a
    checkpoint is loaded onto the CPU, the model may live on a GPU."""
    return {n: saved[n].to(device=p.device, dtype=p.dtype) for n, p in qk_parameters(model).items()}


def _short(name: str) -> str:
    """``blocks.0.attn.w_q`` -> ``w_q`` (layers pooled)."""
    return name.rsplit(".", 1)[-1]


def _angles(init: dict[str, Tensor], model: nn.Module) -> dict[str, float]:
    """Per kind (w_q, w_k): the mean over heads and layers of ``max_principal_angle`` to init."""
    pooled: dict[str, list[float]] = {}
    for n, p in qk_parameters(model).items():
        pooled.setdefault(_short(n), []).extend(
            max_principal_angle(init[n], p.detach()).reshape(-1).tolist()
        )
    return {k: float(np.mean(v)) for k, v in pooled.items()}


def _drift(init: dict[str, Tensor], model: nn.Module) -> dict[str, float]:
    """Per kind (w_q, w_k): the mean over heads and layers of ‖W_T − W_0‖_F."""
    drift: dict[str, list[float]] = {}
    for n, p in qk_parameters(model).items():
        drift.setdefault(_short(n), []).extend(
            linalg.frobenius((p.detach() - init[n]).double()).reshape(-1).tolist()
        )
    return {k: float(np.mean(v)) for k, v in drift.items()}


def _movement(before: dict[str, Tensor], model: nn.Module) -> dict[str, float]:
    """Per kind (w_q, w_k): the median over heads and layers of ‖W_{t+1} − W_t‖_F."""
    moved: dict[str, list[Tensor]] = {}
    for n, p in qk_parameters(model).items():
        delta = linalg.frobenius((p.detach() - before[n]).double()).reshape(-1)
        moved.setdefault(_short(n), []).append(delta)
    return {k: float(torch.cat(parts).quantile(0.5)) for k, parts in moved.items()}


def train_run(
    task: Task,
    arm: str,
    seed: int,
    *,
    steps: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    trust_radius: float | None = None,
    eval_every: int = 10,
    track_movement: bool = False,
    checkpoint: Checkpoint | None = None,
    checkpoint_every: int = 0,
    show_progress: bool = False,
    stop_after: int | None = None,
) -> dict[str, Any] | None:
    """Train ``task``'s model under ``arm`` for ``steps`` optimizer steps from ``seed``.

    Returns the run record: ``n_train``, ``n_val`` and ``history``, one entry per evaluation (at
    step 0, every ``eval_every`` steps and at the last): step, loss and accuracy on the whole
    training set and validation accuracy, all measured after that step in eval mode; component
    norms; mean over heads of the largest principal angle of W_Q and W_K to their
    initialisation. With ``track_movement`` also the per-step ``movement`` (median over heads
    and layers of ‖W_{t+1} − W_t‖_F for W_Q and W_K) and the final ``drift`` (mean over heads of
    ‖W_T − W_0‖_F). With a ``checkpoint`` the state is saved every ``checkpoint_every`` steps
    and a saved state is resumed (onto the model's device); ``stop_after`` stops after that many
    steps of this call (saving first) and returns None, to test resumption. The checkpoint is
    left in place: ``run_cached`` removes it once the finished record is saved."""
    check_arms([arm])
    model = prepare_model(arm, task.make_model(seed, arm_geometry(arm)))
    opt = make_optimizer(
        arm, model, lr=lr, betas=betas, weight_decay=weight_decay, trust_radius=trust_radius
    )
    gen = generator(seed + 7919)
    init = _frame_snapshot(model)
    history: list[dict[str, Any]] = []
    movement: dict[str, list[float]] = {_short(n): [] for n in init} if track_movement else {}
    step, order, cursor = 0, _batches(task, gen), 0
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        gen.set_state(saved["generator"])
        init, history, movement = (
            frames_like(saved["init"], model),
            saved["history"],
            saved["movement"],
        )
        step, order, cursor = saved["step"], saved["order"], saved["cursor"]

    def save() -> None:
        if checkpoint is not None:
            checkpoint.save(
                dict(
                    model=model.state_dict(),
                    optimizer=opt.state_dict(),
                    generator=gen.get_state(),
                    init=init,
                    history=history,
                    movement=movement,
                    step=step,
                    order=order,
                    cursor=cursor,
                )
            )

    def evaluate() -> None:
        loss, acc = loss_and_accuracy(task, model, task.x_train, task.y_train)
        history.append(
            dict(
                step=step,
                train_loss=loss,
                train_acc=acc,
                val_acc=loss_and_accuracy(task, model, task.x_val, task.y_val)[1],
                norms=component_norms(model),
                angles=_angles(init, model),
            )
        )

    if not history:  # a run stopped at step 0 has logged its step-0 evaluation already
        evaluate()
    bar = progress(steps, f"{task.name} {arm} seed {seed}", show_progress)
    bar.update(step)
    done_here = 0
    while step < steps:
        if stop_after is not None and done_here >= stop_after:
            save()
            bar.close()
            return None
        size = len(order) if task.batch_size is None else task.batch_size
        if cursor >= len(order):
            order, cursor = _batches(task, gen), 0
        idx = order[cursor : cursor + size]
        cursor += size
        before = _frame_snapshot(model) if track_movement else None
        loss = F.cross_entropy(logits_of(task, model, task.x_train[idx]), task.y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        done_here += 1
        bar.update(1)
        if before is not None:
            for key, value in _movement(before, model).items():
                movement[key].append(value)
        if step % eval_every == 0 or step == steps:
            evaluate()
        if checkpoint is not None and checkpoint_every and step % checkpoint_every == 0:
            save()
    bar.close()
    record: dict[str, Any] = {
        "task": task.name,
        "arm": arm,
        "seed": seed,
        "n_train": len(task.y_train),
        "n_val": len(task.y_val),
        "history": history,
        "final_val_acc": history[-1]["val_acc"],
        "final_train_acc": history[-1]["train_acc"],
    }
    if track_movement:
        record["movement"] = movement
        record["drift"] = _drift(init, model)
    return record


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (NaN for an empty one)."""
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else math.nan


# -- caching, statistics ----------------------------------------------------------------------
def run_config(config: dict[str, Any], drop: Iterable[str]) -> dict[str, Any]:
    """The part of ``config`` one run depends on: ``config`` without the ``drop`` keys (the
    seed and arm lists, report-only keys), so the run's cache entry survives changes to them."""
    dropped = set(drop)
    return {k: v for k, v in config.items() if k not in dropped}


def run_cached(
    directory: Any,
    config: dict[str, Any],
    key: str,
    resume: bool,
    train: Callable[[Checkpoint], dict[str, Any] | None],
) -> dict[str, Any]:
    """``train(checkpoint)`` for one run, ``config`` being that run's configuration
    (``run_config``) and ``key`` naming its seed and arm, with resumption: a run finished
    earlier under the same (config, key) is read back from its saved record, one interrupted is
    resumed from its checkpoint; ``resume=False`` discards both first. The record stays saved
    until ``forget_cached`` (so an interrupted multi-run experiment skips the finished runs)."""
    running, finished = (
        Checkpoint(directory, config, key),
        Checkpoint(directory, config, key + "/done"),
    )
    if not resume:
        running.remove()
        finished.remove()
    done = finished.load()
    if done is not None:
        return done["record"]
    record = train(running)
    if record is None:
        raise RuntimeError(f"run {key} stopped before its last step")
    finished.save({"record": record})
    running.remove()  # only now: a kill before this line resumes from either file, never retrains
    return record


def forget_cached(directory: Any, entries: Iterable[tuple[dict[str, Any], str]]) -> None:
    """Remove the saved records of ``run_cached`` ((run config, key) pairs) once the
    experiment's outputs are written."""
    for config, key in entries:
        Checkpoint(directory, config, key).remove()
        Checkpoint(directory, config, key + "/done").remove()


def paired_stats(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Paired comparison of b against a over seeds: mean difference d̄ = mean(b − a), its sample
    SD, t = d̄/(SD/√n) with its two-sided p (``scipy.stats.ttest_rel(b, a)``), and the number
    of seeds where b > a. SD 0: t = ±inf and p = 0 when d̄ ≠ 0 (every seed moved by the same
    non-zero amount), t = p = NaN when d̄ = 0; n < 2: t = p = NaN."""
    from scipy import stats

    a_arr, b_arr = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = b_arr - a_arr
    n = len(diff)
    mean = float(diff.mean()) if n else math.nan
    sd = float(diff.std(ddof=1)) if n > 1 else math.nan
    if n > 1 and sd > 0:
        res = stats.ttest_rel(b_arr, a_arr)
        t, p = float(res.statistic), float(res.pvalue)
    elif n > 1 and mean != 0:
        t, p = math.copysign(math.inf, mean), 0.0
    else:
        t = p = math.nan
    return {"n": n, "mean_diff": mean, "sd_diff": sd, "t": t, "p": p, "wins": int((diff > 0).sum())}


def stat_cell(v: float | None) -> Any:
    """A table cell for t or p: "+∞"/"−∞" for infinite values (``markdown_table`` writes every
    non-finite float as "–"), the value itself otherwise."""
    if isinstance(v, float) and math.isinf(v):
        return "+∞" if v > 0 else "−∞"
    return v


# -- tasks of the movement and ablation experiments --------------------------------------------
TASKS = ("grokking", "patches")

#: Per task, the keys of its experiment's presets that are not task settings.
_EXPERIMENT_KEYS = {
    "grokking": ("arms", "seeds", "threshold", "last_fraction"),
    "patches": ("arms", "seeds", "fractions", "sweep_seeds"),
}


def task_config(name: str, preset: str, **changes: Any) -> dict[str, Any]:
    """The task settings of experiment ``name``'s ``preset`` (its seed, arm and report keys
    removed), with ``changes`` applied; a change equal to the preset's value is refused (it
    would only hide which settings differ)."""
    from torch_port.experiments import grokking, patches

    presets = {"grokking": grokking.PRESETS, "patches": patches.PRESETS}[name]
    base = run_config(presets[preset], _EXPERIMENT_KEYS[name])
    same = sorted(k for k, v in changes.items() if k in base and base[k] == v)
    if same:
        raise ValueError(f"{name} {preset}: changes {same} repeat the preset's values")
    return {**base, **changes}


def check_optimizer_config(config: dict[str, Any]) -> None:
    """Refuse a task configuration's optimizer settings unless lr > 0, betas in [0, 1),
    weight_decay ≥ 0 and trust_tau > 0 (all finite), naming the bad value."""
    checks.positive("lr", config["lr"])
    checks.betas(config["betas"])
    checks.nonnegative("weight_decay", config["weight_decay"])
    checks.positive("trust_tau", config["trust_tau"])


def trust_radius(config: dict[str, Any]) -> float:
    """Δ = τ·√d_head, d_head = d_model/n_heads (τ·‖W‖_F for a frame with d_head orthonormal
    columns)."""
    return config["trust_tau"] * math.sqrt(config["d_model"] // config["n_heads"])


def check_tasks(config: dict[str, Any]) -> None:
    """Refuse a movement/ablation configuration without tasks, with unknown tasks or arms, or
    with a task configuration that cannot run (each task's ``check_task``)."""
    from torch_port.experiments import grokking, patches

    tasks = config["tasks"]
    if not isinstance(tasks, dict) or not tasks:
        raise ValueError(f"tasks must be a non-empty mapping, got {tasks!r}")
    bad = sorted(set(tasks) - set(TASKS))
    if bad:
        raise ValueError(f"unknown tasks {bad}; choose among {TASKS}")
    checks = {"grokking": grokking.check_task, "patches": patches.check_task}
    for name, tcfg in tasks.items():
        checks[name](tcfg)
    check_arms(config["arms"])


def apply_data_dir(config: dict[str, Any], data_dir: Any) -> dict[str, Any]:
    """``config`` with its patches task switched to CIFAR-10 when ``data_dir`` is given (a new
    dict; the preset is not changed), so that what is cached and recorded names the dataset."""
    if data_dir is None or "patches" not in config["tasks"]:
        return config
    tasks = {**config["tasks"], "patches": {**config["tasks"]["patches"], "dataset": "cifar10"}}
    return {**config, "tasks": tasks}


def task_factory(
    name: str, config: dict[str, Any], data_dir: Any, device: torch.device | str
) -> Callable[[int], Task]:
    """seed -> Task for the named task ("grokking": a + b mod p, split drawn by the seed;
    "patches": the configured dataset, one fixed split, loaded here) with ``config`` in the
    format of ``task_config``."""
    if name == "grokking":
        from torch_port.experiments import grokking

        grokking.check_task(config)
        return lambda seed: grokking.make_task(config, seed, device)
    if name == "patches":
        from torch_port.experiments import patches

        patches.check_task(config)
        task = patches.make_task(config, patches.load_data(config, data_dir), 1.0, device)
        return lambda seed: task
    raise ValueError(f"unknown task {name!r}; choose among {TASKS}")


def train_with(task: Task, config: dict[str, Any], arm: str, seed: int, **kw: Any) -> Any:
    """``train_run`` with a task configuration's steps, lr, betas, decay, evaluation and
    checkpoint intervals and trust radius Δ = τ·√d_head (``trust_radius``)."""
    return train_run(
        task,
        arm,
        seed,
        steps=config["steps"],
        lr=config["lr"],
        betas=tuple(config["betas"]),
        weight_decay=config["weight_decay"],
        trust_radius=trust_radius(config),
        eval_every=config["eval_every"],
        checkpoint_every=config["checkpoint_every"],
        **kw,
    )


def run_tasks(
    config: dict[str, Any],
    options: Any,
    directory: Any,
    device: torch.device | str,
    track_movement: bool,
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """Every (task, seed, arm) of ``config`` ("tasks": name -> task configuration, "arms",
    "seeds"), resumable (``run_cached``, keyed by the task's configuration, seed and arm); every
    task is built (its data loaded) before the first run. Returns the run records and their
    cache entries (for ``forget_cached``)."""
    check_arms(config["arms"])
    tasks = {}
    for name, tcfg in config["tasks"].items():
        make = task_factory(name, tcfg, options.data_dir, device)
        for seed in config["seeds"]:
            tasks[(name, seed)] = make(seed)
    runs, entries = [], []
    for (name, seed), task in tasks.items():
        tcfg = config["tasks"][name]
        cache_config = {"task": name, **tcfg, "track_movement": track_movement}
        for arm in config["arms"]:
            key = f"{name}-{seed}-{arm}"
            entries.append((cache_config, key))

            def train(
                ck: Checkpoint,
                task: Task = task,
                tcfg: dict = tcfg,
                arm: str = arm,
                seed: int = seed,
            ) -> Any:
                return train_with(
                    task,
                    tcfg,
                    arm,
                    seed,
                    track_movement=track_movement,
                    checkpoint=ck,
                    show_progress=options.progress,
                )

            runs.append(run_cached(directory, cache_config, key, options.resume, train))
    return runs, entries


def run_experiment(
    name: str,
    presets: dict[str, dict[str, Any]],
    options: Any,
    *,
    track_movement: bool,
    summarise: Callable[[dict[str, Any], list[dict[str, Any]]], dict[str, Any]],
    markdown: Callable[[dict[str, Any], dict[str, Any]], str],
    plots: Callable[[Any, dict[str, Any], list[dict[str, Any]], dict[str, Any]], list[str]],
) -> dict[str, Any]:
    """A movement/ablation-style experiment: configure the preset (CIFAR-10 for the patches
    task when ``options.data_dir`` is given), check it, train every (task, seed, arm), then
    ``summarise`` the runs, draw the ``plots`` and write results.json and results.md."""
    config = apply_data_dir(configure(presets, options), options.data_dir)
    check_tasks(config)
    device = resolve_device(options.device)
    directory = output_dir(options, name)
    runs, entries = run_tasks(config, options, directory, device, track_movement)
    summary = summarise(config, runs)
    summary["plots"] = plots(directory, config, runs, summary)
    document = results_document(name, options, config, runs, summary, device)
    write_results(directory, document, markdown(config, summary))
    forget_cached(directory, entries)
    return document
