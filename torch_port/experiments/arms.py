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
from torch_port.optim import RSGD, NormalizedRSGD, RiemannianAdam

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


# -- optimizers of arms E and H ------------------------------------------------------------------
def check_adam_options(
    lr: float, betas: Sequence[float], eps: float, trust_radius: float | None
) -> None:
    """Refuse lr ≤ 0, β ∉ [0, 1), ε < 0 or Δ ≤ 0 (each non-finite value too), naming it."""
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be positive and finite, got {lr!r}")
    if len(betas) != 2 or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number ≥ 0, got {eps!r}")
    if trust_radius is not None and not (
        isinstance(trust_radius, int | float) and math.isfinite(trust_radius) and trust_radius > 0
    ):
        raise ValueError(
            f"trust_radius must be positive and finite (or None), got {trust_radius!r}"
        )


def check_finite_gradients(named: Iterable[tuple[str, Tensor]]) -> None:
    """Refuse gradients with NaN or ±inf entries before anything is changed: a ValueError naming
    every such parameter and its count of non-finite entries (one reduction Σ G per gradient,
    finite unless an entry is not; entries are counted only where the sum is not finite)."""
    items = [(n, p.grad) for n, p in named if p.grad is not None]
    if not items:
        return
    device = items[0][1].device
    sums = torch.stack([g.sum().to(device=device, dtype=torch.float64) for _, g in items])
    counts = [
        0 if ok else int((~torch.isfinite(g)).sum())
        for (_, g), ok in zip(items, torch.isfinite(sums).tolist(), strict=True)
    ]
    bad = [f"{n}: {c} of {g.numel()} entries" for (n, g), c in zip(items, counts, strict=True) if c]
    if bad:
        raise ValueError("non-finite gradient (no parameter was changed) for " + "; ".join(bad))


class ScalarAdamPolar(torch.optim.Optimizer):
    """Arm E, per frame W (a trailing d×r matrix) with raw Euclidean gradient G, no projector:
    m ← β1·m + (1 − β1)·G; √v ← hypot(√β2·√v, √(1 − β2)·RMS(G)) (one scalar per frame, stored in
    at least float32); ξ = −lr·(m/(1 − β1^t))/(√v/sqrt(1 − β2^t) + ε); ξ ← ξ·min(1, Δ/‖ξ‖_F)
    when Δ is given; W ← polar(W + ξ). The retraction removes the normal part of ξ only to first
    order. A non-finite gradient is a ValueError raised before any parameter changes."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        trust_radius: float | None = None,
    ):
        check_adam_options(lr, betas, eps, trust_radius)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, trust_radius=trust_radius))

    def _named(self) -> list[tuple[str, Tensor]]:
        """(name, parameter) of every parameter, named by its group's "param_names" if any."""
        out = []
        for gi, group in enumerate(self.param_groups):
            names = group.get("param_names") or []
            for pi, p in enumerate(group["params"]):
                out.append((names[pi] if pi < len(names) else f"param_groups[{gi}][{pi}]", p))
        return out

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:
        check_finite_gradients(self._named())
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            radius = group["trust_radius"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros(())
                    state["exp_avg"] = torch.zeros_like(p)
                    dtype = torch.promote_types(p.dtype, torch.float32)
                    state["sqrt_v"] = p.new_zeros(p.shape[:-2], dtype=dtype)
                state["step"] += 1
                t = int(state["step"].item())
                state["exp_avg"].lerp_(p.grad, 1.0 - b1)
                rms = linalg.rms(p.grad.to(state["sqrt_v"].dtype))
                state["sqrt_v"] = torch.hypot(
                    math.sqrt(b2) * state["sqrt_v"], math.sqrt(1.0 - b2) * rms
                )
                den = state["sqrt_v"] / math.sqrt(1.0 - b2**t) + eps
                scale = torch.where(den > 0, -lr / (1.0 - b1**t) / den, torch.zeros_like(den))
                xi = state["exp_avg"] * scale.to(p.dtype)[..., None, None]
                if radius is not None:
                    norm = linalg.frobenius(xi)
                    cap = torch.where(norm > radius, radius / norm, torch.ones_like(norm))
                    xi = xi * cap[..., None, None]
                p.copy_(linalg.polar(p + xi))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, but √v keeps its saved dtype (torch would cast it to the parameter's)."""
        saved = {k: s["sqrt_v"] for k, s in state_dict["state"].items() if "sqrt_v" in s}
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for k, sqrt_v in saved.items():
            self.state[params[int(k)]]["sqrt_v"] = sqrt_v.to(device=params[int(k)].device)


class ArmOptimizer:
    """Several optimizers stepped together (every parameter in exactly one), then the polar
    projection W ← polar(W) of the ``project`` parameters (arm H). Every gradient is checked for
    non-finite entries before any optimizer steps (``names``: id(parameter) -> name, for the
    message). ``state_dict`` round-trips."""

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        project: Sequence[Tensor] = (),
        names: dict[int, str] | None = None,
    ):
        self.optimizers = list(optimizers)
        self.project = list(project)
        self.names = dict(names or {})

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def _named(self) -> list[tuple[str, Tensor]]:
        params = [p for opt in self.optimizers for g in opt.param_groups for p in g["params"]]
        return [(self.names.get(id(p), f"shape {tuple(p.shape)}"), p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        check_finite_gradients(self._named())
        for opt in self.optimizers:
            opt.step()
        for p in self.project:
            p.copy_(linalg.polar(p))

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for opt, s in zip(self.optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(s)


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


def _split_groups(model: nn.Module) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two plain parameter groups: every trainable weight but W_Q, W_K, and W_Q, W_K with
    ``weight_decay`` 0 (the frames of arms E and H are never decayed)."""
    qk = qk_parameters(model)
    ids = {id(p) for p in qk.values()}
    rest = [(n, p) for n, p in model.named_parameters() if id(p) not in ids and p.requires_grad]
    return (
        {"params": [p for _, p in rest], "param_names": [n for n, _ in rest]},
        {"params": list(qk.values()), "param_names": list(qk), "weight_decay": 0.0},
    )


def make_optimizer(
    arm: str,
    model: nn.Module,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    eps: float = 1e-8,
    trust_radius: float | None = None,
) -> ArmOptimizer:
    """The arm's optimizer: AdamW (lr, betas, eps, decoupled ``weight_decay``) on every non-frame
    weight, the arm's rule (same lr; no decay) on W_Q, W_K (module docstring). The trust radius
    Δ caps the steps of C, E and F only (B is plain fixed-step RSGD, D is scale free)."""
    common = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    names = {id(p): n for n, p in model.named_parameters()}
    frame = {"trust_radius": trust_radius}
    if arm in ("A", "G"):
        opts: list[torch.optim.Optimizer] = [build_optimizer(model, RiemannianAdam, **common)]
    elif arm == "H":
        rest, qk = _split_groups(model)
        return ArmOptimizer([RiemannianAdam([rest, qk], **common)], qk["params"], names)
    elif arm == "B":
        opts = [build_optimizer(model, RSGD, **common)]
    elif arm == "C":
        opts = [build_optimizer(model, RiemannianAdam, frame_options=frame, **common)]
    elif arm == "D":
        opts = [build_optimizer(model, NormalizedRSGD, **common)]
    elif arm == "F":
        options = {**frame, "moment": "elementwise"}
        opts = [build_optimizer(model, RiemannianAdam, frame_options=options, **common)]
    elif arm == "E":
        rest, qk = _split_groups(model)
        qk.pop("weight_decay")
        opts = [
            RiemannianAdam([rest], **common),
            ScalarAdamPolar([qk], lr, tuple(betas), eps, trust_radius),
        ]
    else:
        raise ValueError(f"unknown arm {arm!r}; choose among {sorted(ARMS)}")
    return ArmOptimizer(opts, names=names)


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
    check_adam_options(config["lr"], config["betas"], 0.0, None)
    for key, low_ok in (("weight_decay", True), ("trust_tau", False)):
        v = config[key]
        if not (isinstance(v, int | float) and math.isfinite(v) and (v > 0 or (low_ok and v == 0))):
            raise ValueError(f"{key} must be a finite number {'≥' if low_ok else '>'} 0, got {v!r}")


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
