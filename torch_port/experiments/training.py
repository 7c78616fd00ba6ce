"""The training loop of the Stiefel-attention experiments and what it measures.

A ``Task`` is a classification problem with a model factory; ``train_run`` trains one (task,
arm, seed) under the arm's optimizer (``arms``), logs accuracy, per-component weight norms,
principal angles of W_Q/W_K to their initialisation and, on request, the per-step movement
‖W_{t+1} − W_t‖_F of every head's W_Q and W_K, and can stop and resume from a ``Checkpoint``
exactly (``runs.save_training``/``runs.resume_training``); ``train_with`` takes its settings from
a task configuration (``check_training_config`` refuses one that cannot run); ``train_cells``
trains the (task, configuration, arm, seed) cells of a sweep through ``runs.run_cells``.
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
from torch_port.experiments.arms import (
    arm_geometry,
    check_arms,
    check_optimizer_config,
    make_optimizer,
    prepare_model,
    qk_parameters,
    trust_radius,
)
from torch_port.experiments.common import Checkpoint, check_int, generator, progress
from torch_port.experiments.runs import Cell, resume_training, run_cells, save_training

Tensor = torch.Tensor


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
    #: Read-out "last" through ``Transformer.forward(last_only=True)`` (one-layer models).
    last_only: bool = False


def logits_of(task: Task, model: nn.Module, x: Tensor) -> Tensor:
    """(B, n_classes) logits of ``model`` on inputs ``x`` with the task's read-out."""
    if task.last_only:
        return model(x, last_only=True)[:, -1]
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
    frame_lr: float | None = None,
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
    left in place: ``runs.run_cached`` removes it once the finished record is saved."""
    check_arms([arm])
    model = prepare_model(arm, task.make_model(seed, arm_geometry(arm)))
    opt = make_optimizer(
        arm,
        model,
        lr=lr,
        betas=betas,
        weight_decay=weight_decay,
        trust_radius=trust_radius,
        frame_lr=frame_lr,
    )
    gen = generator(seed + 7919)
    init = _frame_snapshot(model)
    history: list[dict[str, Any]] = []
    movement: dict[str, list[float]] = {_short(n): [] for n in init} if track_movement else {}
    step, order, cursor = 0, _batches(task, gen), 0
    saved = resume_training(checkpoint, model, opt, gen)
    if saved is not None:
        init, history, movement = (
            frames_like(saved["init"], model),
            saved["history"],
            saved["movement"],
        )
        step, order, cursor = saved["step"], saved["order"], saved["cursor"]

    def save() -> None:
        if checkpoint is not None:
            save_training(
                checkpoint,
                model,
                opt,
                gen,
                init=init,
                history=history,
                movement=movement,
                step=step,
                order=order,
                cursor=cursor,
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


def train_with(task: Task, config: dict[str, Any], arm: str, seed: int, **kw: Any) -> Any:
    """``train_run`` with a task configuration's steps, lr (and ``frame_lr``, the frames' own,
    when the configuration has one), betas, decay, evaluation and checkpoint intervals and trust
    radius Δ = τ·√d_head (``trust_radius``)."""
    return train_run(
        task,
        arm,
        seed,
        steps=config["steps"],
        lr=config["lr"],
        betas=tuple(config["betas"]),
        weight_decay=config["weight_decay"],
        trust_radius=trust_radius(config),
        frame_lr=config.get("frame_lr"),
        eval_every=config["eval_every"],
        checkpoint_every=config["checkpoint_every"],
        **kw,
    )


def check_training_config(config: dict[str, Any], sizes: Iterable[str]) -> None:
    """Refuse a task configuration whose ``train_with`` settings cannot run, naming the bad
    value: ``steps``, ``eval_every`` and the ``sizes`` keys must be positive integers,
    ``checkpoint_every`` an integer ≥ 0, ``d_model`` divisible by ``n_heads``, and the optimizer
    settings valid (``arms.check_optimizer_config``)."""
    for key in ("steps", "eval_every", *sizes):
        check_int(config, key)
    check_int(config, "checkpoint_every", 0)
    if config["d_model"] % config["n_heads"]:
        raise ValueError(
            f"d_model={config['d_model']} is not divisible by n_heads={config['n_heads']}"
        )
    check_optimizer_config(config)


def train_cells(
    directory: Any, cells: Sequence[Cell], options: Any, *, track_movement: bool = False
) -> list[dict[str, Any]]:
    """The records of ``cells``, each cell's ``spec`` a (task, task configuration, arm, seed)
    trained by ``train_with`` (``track_movement`` passed on), through ``runs.run_cells``: a cell
    finished earlier is read back, an interrupted one resumed from its checkpoint, none of it with
    ``options.resume`` False; each run's progress bar shown when ``options.progress``."""

    def work(cell: Cell, checkpoint: Checkpoint, bar: Any) -> dict[str, Any] | None:
        task, config, arm, seed = cell.spec
        return train_with(
            task,
            config,
            arm,
            seed,
            track_movement=track_movement,
            checkpoint=checkpoint,
            show_progress=options.progress,
        )

    return run_cells(directory, cells, work, resume=options.resume)
