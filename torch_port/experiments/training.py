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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
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
from torch_port.stiefel import Stiefel

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


def polar_step_norms(w0: Tensor, w1: Tensor) -> Tensor:
    """‖ξ‖_F per trailing d×r frame of the tangent step ξ (W0ᵀξ skew) that the polar retraction
    took from the frame W0 to W1 = polar(W0 + ξ) = (W0 + ξ)(I + ξᵀξ)^(−1/2), recovered from the
    two frames alone (float64): W0 + ξ = W1·S with S = (I + ξᵀξ)^(1/2) symmetric, and the skew
    W0ᵀξ makes sym(W0ᵀW1·S) = I, the Lyapunov equation A·S + S·Aᵀ = 2I for A = W0ᵀW1
    (``scipy.linalg.solve_continuous_lyapunov``; the solution is unique, since A = (I + W0ᵀξ)·S⁻¹
    is similar to S^(−1/2)(I + W0ᵀξ)S^(−1/2), whose symmetric part S⁻¹ is positive definite, so
    every eigenvalue of A has a positive real part); then ξ = W1·S − W0.

    Error: W1 stored in a format of unit roundoff u is W1 + E with ‖E‖_F ≤ u·√r; to first order
    that moves S by the solution of the same equation with right side −2·sym(W0ᵀE·S), and ξ by
    E·S + W1·ΔS, so |Δ‖ξ‖| ≲ 3·u·√r·‖S‖₂ (‖S‖₂ = sqrt(1 + ‖ξ‖₂²) ≤ 1.5 for ‖ξ‖ ≤ 1): 1.2e-6 for
    float32 frames with r = 32, which is why ``train_run`` counts a step "at the cap" when
    ‖ξ‖ ≥ (1 − ``CAP_BAND``)·Δ with a band far wider than that over Δ ≥ 1e-3."""
    a0 = w0.detach().double().reshape(-1, *w0.shape[-2:]).cpu().numpy()
    a1 = w1.detach().double().reshape(-1, *w1.shape[-2:]).cpu().numpy()
    out = []
    for x0, x1 in zip(a0, a1, strict=True):
        r = x0.shape[1]
        s = scipy.linalg.solve_continuous_lyapunov(x0.T @ x1, 2.0 * np.eye(r))
        out.append(np.linalg.norm(x1 @ (0.5 * (s + s.T)) - x0))
    return torch.tensor(out, dtype=torch.float64).reshape(w0.shape[:-2])


#: A frame's step is "at the trust cap" when ‖ξ‖ ≥ (1 − CAP_BAND)·Δ (``polar_step_norms``: the
#: recovery error, with both float32 frames rounded, is below 5e-3·Δ for r ≤ 64 and Δ ≥ 1e-3).
CAP_BAND = 1e-2

#: The arms whose frames take capped tangent steps through the polar retraction, where
#: ``polar_step_norms`` recovers the step: C and F. (E is capped too, but its step is not
#: tangent, so it cannot be recovered from the frames; B and D have no cap.)
CAPPED_TANGENT_ARMS = ("C", "F")


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
    and labels for training and validation, ``batch_size`` (None: full batch), ``readout``
    ("last": logits of the last token, "mean": mean over tokens) and ``val_subsets`` (named
    masks of validation examples whose accuracy is logged as well)."""

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
    #: Named boolean masks over the validation set whose accuracies are logged too.
    val_subsets: dict[str, Tensor] = field(default_factory=dict)


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


def _grad_norms(model: nn.Module, frames: bool) -> dict[str, float]:
    """Per kind (w_q, w_k): the median over heads and layers of ‖G‖_F, the Euclidean gradient
    of W_Q (W_K), and for frames (``frames``) also of ‖P_W(G)‖_F = ‖G − W·sym(WᵀG)‖_F, the
    Riemannian gradient under the embedded metric (``Stiefel.proj``; "rgrad_w_q", "rgrad_w_k")."""
    pooled: dict[str, list[Tensor]] = {}
    for n, p in qk_parameters(model).items():
        if p.grad is None:
            continue
        g, w = p.grad.detach().double(), p.detach().double()
        pooled.setdefault(_short(n), []).append(linalg.frobenius(g).reshape(-1))
        if frames:
            rg = Stiefel(*w.shape[-2:]).proj(w, g)
            pooled.setdefault("rgrad_" + _short(n), []).append(linalg.frobenius(rg).reshape(-1))
    return {k: float(torch.cat(v).quantile(0.5)) for k, v in pooled.items()}


def _trust_use(before: dict[str, Tensor], model: nn.Module, radius: float) -> dict[str, float]:
    """Over every head and layer of W_Q and W_K: the median and the largest ‖ξ‖/Δ of this
    step's tangent steps (``polar_step_norms``) and the fraction of them at the cap
    (‖ξ‖ ≥ (1 − CAP_BAND)·Δ)."""
    ratios = torch.cat(
        [
            polar_step_norms(before[n], p.detach()).reshape(-1) / radius
            for n, p in qk_parameters(model).items()
        ]
    )
    return {
        "median_ratio": float(ratios.quantile(0.5)),
        "max_ratio": float(ratios.max()),
        "at_cap": float((ratios >= 1.0 - CAP_BAND).double().mean()),
    }


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
    track_trust: bool = False,
    match_scale: bool = False,
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
    and layers of ‖W_{t+1} − W_t‖_F for W_Q and W_K), the per-step ``grads`` (``_grad_norms``:
    median ‖G‖_F and, for frames, ‖P_W(G)‖_F, the scale a fixed-step rule's movement is
    proportional to) and the final ``drift`` (mean over heads of ‖W_T − W_0‖_F). With
    ``track_trust``, for the arms whose frames take capped tangent polar steps
    (``CAPPED_TANGENT_ARMS``) when a trust radius is given, the per-step ``trust`` use
    (``_trust_use``: median and largest ‖ξ‖/Δ, fraction of frames at the cap).
    ``match_scale`` gives a plain arm's W_Q, W_K the frames' scale at initialisation
    (``arms.prepare_model``). With a ``checkpoint`` the state is saved every
    ``checkpoint_every`` steps and a saved state is resumed (onto the model's device);
    ``stop_after`` stops after that many steps of this call (saving first) and returns None, to
    test resumption. The checkpoint is left in place: ``runs.run_cached`` removes it once the
    finished record is saved."""
    check_arms([arm])
    model = prepare_model(arm, task.make_model(seed, arm_geometry(arm)), match_scale=match_scale)
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
    grads: dict[str, list[float]] = {}
    trusted = track_trust and trust_radius is not None and arm in CAPPED_TANGENT_ARMS
    trust: dict[str, list[float]] = {}
    step, order, cursor = 0, _batches(task, gen), 0
    saved = resume_training(checkpoint, model, opt, gen)
    if saved is not None:
        init, history = frames_like(saved["init"], model), saved["history"]
        movement, grads, trust = saved["movement"], saved["grads"], saved["trust"]
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
                grads=grads,
                trust=trust,
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
                val_acc_by_subset={
                    name: loss_and_accuracy(task, model, task.x_val[m], task.y_val[m])[1]
                    if bool(m.any())
                    else None
                    for name, m in task.val_subsets.items()
                },
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
        before = _frame_snapshot(model) if track_movement or trusted else None
        loss = F.cross_entropy(logits_of(task, model, task.x_train[idx]), task.y_train[idx])
        opt.zero_grad()
        loss.backward()
        if track_movement:
            for key, value in _grad_norms(model, arm_geometry(arm) is not None).items():
                grads.setdefault(key, []).append(value)
        opt.step()
        step += 1
        done_here += 1
        bar.update(1)
        if track_movement:
            for key, value in _movement(before, model).items():
                movement[key].append(value)
        if trusted:
            for key, value in _trust_use(before, model, trust_radius).items():
                trust.setdefault(key, []).append(value)
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
        record["grads"] = grads
        record["drift"] = _drift(init, model)
    if trusted:
        record["trust"] = trust
    return record


def trust_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """The trust radius's use over a run (``train_run``'s ``trust``): the fraction of frame
    steps at the cap (the mean over steps of the per-step fraction; every step has the same
    frames), the median over steps of the median ‖ξ‖/Δ and the largest ‖ξ‖/Δ; None each for a
    run without a cap on tangent polar steps."""
    trust = record.get("trust")
    if not trust or not trust["at_cap"]:
        return {"at_cap": None, "median_ratio": None, "max_ratio": None}
    return {
        "at_cap": float(np.mean(trust["at_cap"])),
        "median_ratio": float(np.median(trust["median_ratio"])),
        "max_ratio": float(np.max(trust["max_ratio"])),
    }


def train_with(task: Task, config: dict[str, Any], arm: str, seed: int, **kw: Any) -> Any:
    """``train_run`` with a task configuration's steps, lr (and ``frame_lr``, the frames' own,
    when the configuration has one), betas, decay, evaluation and checkpoint intervals, trust
    radius Δ = τ·√d_head (``trust_radius``) and ``match_scale`` (default False)."""
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
        match_scale=bool(config.get("match_scale", False)),
        **kw,
    )


def check_training_config(config: dict[str, Any], sizes: Iterable[str]) -> None:
    """Refuse a task configuration whose ``train_with`` settings cannot run, naming the bad
    value: ``steps``, ``eval_every`` and the ``sizes`` keys must be positive integers,
    ``checkpoint_every`` an integer ≥ 0, ``d_model`` divisible by ``n_heads``, and the optimizer
    settings valid (``arms.check_optimizer_config``), ``match_scale`` a bool."""
    for key in ("steps", "eval_every", *sizes):
        check_int(config, key)
    check_int(config, "checkpoint_every", 0)
    if not isinstance(config.get("match_scale", False), bool):
        raise ValueError(f"match_scale must be true or false, got {config['match_scale']!r}")
    if config["d_model"] % config["n_heads"]:
        raise ValueError(
            f"d_model={config['d_model']} is not divisible by n_heads={config['n_heads']}"
        )
    check_optimizer_config(config)


def train_cells(
    directory: Any,
    cells: Sequence[Cell],
    options: Any,
    *,
    track_movement: bool = False,
    track_trust: bool = False,
) -> list[dict[str, Any]]:
    """The records of ``cells``, each cell's ``spec`` a (task, task configuration, arm, seed)
    trained by ``train_with`` (``track_movement`` and ``track_trust`` passed on: the trust use
    costs a copy of the frames and a Lyapunov solve per frame and step), through
    ``runs.run_cells``: a cell finished earlier is read back, an interrupted one resumed from its
    checkpoint, none of it with ``options.resume`` False; each run's progress bar shown when
    ``options.progress``."""

    def work(cell: Cell, checkpoint: Checkpoint, bar: Any) -> dict[str, Any] | None:
        task, config, arm, seed = cell.spec
        return train_with(
            task,
            config,
            arm,
            seed,
            track_movement=track_movement,
            track_trust=track_trust,
            checkpoint=checkpoint,
            show_progress=options.progress,
        )

    return run_cells(directory, cells, work, resume=options.resume)
