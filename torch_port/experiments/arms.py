"""The optimizer arms of the Stiefel-attention experiments and the training loop they share.

An *arm* is a treatment of the attention's W_Q^h and W_K^h (one d_model×d_head matrix per head);
every other weight is trained by AdamW with the experiment's decay in every arm:

==  ===============================================================================
A   Euclidean AdamW on W_Q, W_K (plain projections, decayed like everything else)
B   frames on St(d, r), fixed-step RSGD ξ = −lr·P_W(G) (degree one in the gradient)
C   frames, ``riemannian_adam``: one scalar second moment per frame, trust cap, polar
D   frames, normalised RSGD ξ = −lr·P_W(G)/RMS(P_W(G)) (scale free, no moments)
E   frames, no projector: scalar-moment Adam on the raw Euclidean gradient, then polar
F   frames, ``riemannian_adam(moment="elementwise")`` (breaks O(d)-equivariance)
G   frozen frames: W_Q, W_K held at their orthonormal initialisation
H   AdamW on W_Q, W_K followed by the polar projection W ← polar(W) after every step
==  ===============================================================================

Frames are never decayed (RA-5: decay has zero Riemannian gradient on St(d, r)). A ``Task`` is a
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
from torch_port.experiments.common import Checkpoint, generator, progress
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
class ScalarAdamPolar(torch.optim.Optimizer):
    """Arm E, per frame W (a trailing d×r matrix) with raw Euclidean gradient G, no projector:
    m ← β1·m + (1 − β1)·G; √v ← hypot(√β2·√v, √(1 − β2)·RMS(G)) (one scalar per frame);
    ξ = −lr·(m/(1 − β1^t))/(√v/sqrt(1 − β2^t) + ε); ξ ← ξ·min(1, Δ/‖ξ‖_F) when Δ is given;
    W ← polar(W + ξ). The retraction removes the normal part of ξ only to first order."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        trust_radius: float | None = None,
    ):
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be positive and finite, got {lr}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, trust_radius=trust_radius))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:
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
                    state["sqrt_v"] = p.new_zeros(p.shape[:-2])
                state["step"] += 1
                t = int(state["step"].item())
                state["exp_avg"].lerp_(p.grad, 1.0 - b1)
                state["sqrt_v"] = torch.hypot(
                    math.sqrt(b2) * state["sqrt_v"], math.sqrt(1.0 - b2) * linalg.rms(p.grad)
                )
                den = state["sqrt_v"] / math.sqrt(1.0 - b2**t) + eps
                scale = torch.where(den > 0, -lr / (1.0 - b1**t) / den, torch.zeros_like(den))
                xi = state["exp_avg"] * scale[..., None, None]
                if radius is not None:
                    norm = linalg.frobenius(xi)
                    cap = torch.where(norm > radius, radius / norm, torch.ones_like(norm))
                    xi = xi * cap[..., None, None]
                p.copy_(linalg.polar(p + xi))


class ArmOptimizer:
    """Several optimizers stepped together (every parameter in exactly one), then the polar
    projection W ← polar(W) of the ``project`` parameters (arm H). ``state_dict`` round-trips."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], project: Sequence[Tensor] = ()):
        self.optimizers = list(optimizers)
        self.project = list(project)

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    @torch.no_grad()
    def step(self) -> None:
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
    weight, the arm's rule (same lr; no decay) on W_Q, W_K (module docstring)."""
    common = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    frame = {"trust_radius": trust_radius}
    if arm in ("A", "G"):
        return ArmOptimizer([build_optimizer(model, RiemannianAdam, **common)])
    if arm == "H":
        opt = build_optimizer(model, RiemannianAdam, **common)
        return ArmOptimizer([opt], project=list(qk_parameters(model).values()))
    if arm == "B":
        return ArmOptimizer([build_optimizer(model, RSGD, frame_options=frame, **common)])
    if arm == "C":
        return ArmOptimizer([build_optimizer(model, RiemannianAdam, frame_options=frame, **common)])
    if arm == "D":
        return ArmOptimizer([build_optimizer(model, NormalizedRSGD, **common)])
    if arm == "F":
        options = {**frame, "moment": "elementwise"}
        return ArmOptimizer(
            [build_optimizer(model, RiemannianAdam, frame_options=options, **common)]
        )
    if arm == "E":
        qk = qk_parameters(model)
        ids = {id(p) for p in qk.values()}
        plain = [(n, p) for n, p in model.named_parameters() if id(p) not in ids]
        group = {"params": [p for _, p in plain], "param_names": [n for n, _ in plain]}
        return ArmOptimizer(
            [
                RiemannianAdam([group], **common),
                ScalarAdamPolar(list(qk.values()), lr, tuple(betas), eps, trust_radius),
            ]
        )
    raise ValueError(f"unknown arm {arm!r}; choose among {sorted(ARMS)}")


# -- measurements ------------------------------------------------------------------------------
def max_principal_angle(w0: Tensor, w: Tensor) -> Tensor:
    """Largest principal angle (degrees) between span(W0) and span(W) per trailing d×r matrix:
    arccos of the smallest singular value of Q0ᵀQ, Q the orthonormal QR factors."""
    q0 = torch.linalg.qr(w0.double())[0]
    q = torch.linalg.qr(w.double())[0]
    s = torch.linalg.svdvals(linalg.transpose(q0) @ q).amin(-1).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.arccos(s))


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
def accuracy(task: Task, model: nn.Module, x: Tensor, y: Tensor, chunk: int = 4096) -> float:
    """Fraction of correct argmax predictions (in chunks, eval mode)."""
    model.eval()
    correct = 0
    for i in range(0, len(x), chunk):
        correct += int(
            (logits_of(task, model, x[i : i + chunk]).argmax(-1) == y[i : i + chunk]).sum()
        )
    model.train()
    return correct / max(len(x), 1)


def _batches(task: Task, gen: torch.Generator) -> Tensor:
    """Index order of one epoch: all indices (full batch) or a permutation drawn from ``gen``."""
    n = len(task.x_train)
    return torch.arange(n) if task.batch_size is None else torch.randperm(n, generator=gen)


def _frame_snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in qk_parameters(model).items()}


def _short(name: str) -> str:
    """``blocks.0.attn.w_q`` -> ``w_q`` (layers pooled)."""
    return name.rsplit(".", 1)[-1]


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

    Returns the run record: ``history`` (one entry per evaluation: step, train loss and
    accuracy, validation accuracy, component norms, mean over heads of the largest principal
    angle of W_Q and W_K to their initialisation), and with ``track_movement`` the per-step
    ``movement`` (median over heads and layers of ‖W_{t+1} − W_t‖_F for W_Q and W_K) and the
    final ``drift`` (mean over heads of ‖W_T − W_0‖_F). With a ``checkpoint`` the state is saved
    every ``checkpoint_every`` steps and a saved state is resumed; ``stop_after`` stops after
    that many steps of this call (saving first) and returns None, to test resumption."""
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
        init, history, movement = saved["init"], saved["history"], saved["movement"]
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

    def evaluate(loss: float) -> None:
        qk = qk_parameters(model)
        pooled: dict[str, list[float]] = {}
        for n, p in qk.items():
            pooled.setdefault(_short(n), []).extend(
                max_principal_angle(init[n], p.detach()).reshape(-1).tolist()
            )
        angles = {k: float(np.mean(v)) for k, v in pooled.items()}
        history.append(
            dict(
                step=step,
                train_loss=loss,
                train_acc=accuracy(task, model, task.x_train, task.y_train),
                val_acc=accuracy(task, model, task.x_val, task.y_val),
                norms=component_norms(model),
                angles=angles,
            )
        )

    if step == 0:
        with torch.no_grad():
            evaluate(float(F.cross_entropy(logits_of(task, model, task.x_train), task.y_train)))
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
            moved: dict[str, list[Tensor]] = {}
            for n, p in qk_parameters(model).items():
                delta = linalg.frobenius((p.detach() - before[n]).double()).reshape(-1)
                moved.setdefault(_short(n), []).append(delta)
            for key, parts in moved.items():
                movement[key].append(float(torch.cat(parts).quantile(0.5)))
        if step % eval_every == 0 or step == steps:
            evaluate(float(loss.detach()))
        if checkpoint is not None and checkpoint_every and step % checkpoint_every == 0:
            save()
    bar.close()
    record: dict[str, Any] = {
        "task": task.name,
        "arm": arm,
        "seed": seed,
        "history": history,
        "final_val_acc": history[-1]["val_acc"],
        "final_train_acc": history[-1]["train_acc"],
    }
    if track_movement:
        record["movement"] = movement
        qk = qk_parameters(model)
        drift: dict[str, list[float]] = {}
        for n, p in qk.items():
            drift.setdefault(_short(n), []).extend(
                linalg.frobenius((p.detach() - init[n]).double()).reshape(-1).tolist()
            )
        record["drift"] = {k: float(np.mean(v)) for k, v in drift.items()}
    if checkpoint is not None:
        checkpoint.remove()
    return record


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (NaN for an empty one)."""
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else math.nan


def run_cached(
    directory: Any,
    config: dict[str, Any],
    key: str,
    resume: bool,
    train: Callable[[Checkpoint], dict[str, Any] | None],
) -> dict[str, Any]:
    """``train(checkpoint)`` for one (seed, arm), with resumption: a run finished earlier under
    the same configuration is read back from its saved record, one interrupted is resumed from
    its checkpoint; ``resume=False`` discards both first. The record stays saved until
    ``forget_cached`` (so an interrupted multi-run experiment skips the finished runs)."""
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
    return record


def forget_cached(directory: Any, config: dict[str, Any], keys: Iterable[str]) -> None:
    """Remove the saved records of ``run_cached`` once the experiment's outputs are written."""
    for key in keys:
        Checkpoint(directory, config, key).remove()
        Checkpoint(directory, config, key + "/done").remove()


def paired_stats(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Paired comparison of b against a over seeds: mean difference d̄ = mean(b − a), its sample
    SD, t = d̄/(SD/√n) with its two-sided p (``scipy.stats.ttest_rel(b, a)``; NaN for n < 2 or
    SD 0), and the number of seeds where b > a."""
    from scipy import stats

    a_arr, b_arr = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = b_arr - a_arr
    n = len(diff)
    sd = float(diff.std(ddof=1)) if n > 1 else math.nan
    if n > 1 and sd > 0:
        res = stats.ttest_rel(b_arr, a_arr)
        t, p = float(res.statistic), float(res.pvalue)
    else:
        t = p = math.nan
    return {
        "n": n,
        "mean_diff": float(diff.mean()) if n else math.nan,
        "sd_diff": sd,
        "t": t,
        "p": p,
        "wins": int((diff > 0).sum()),
    }


TASKS = ("grokking", "patches")


def task_factory(
    name: str, config: dict[str, Any], data_dir: Any, device: torch.device | str
) -> Callable[[int], Task]:
    """seed -> Task for the named task ("grokking": a + b mod p, split drawn by the seed;
    "patches": digits, or CIFAR-10 when ``data_dir`` is given, one fixed split) with ``config``
    in the format of that experiment's presets."""
    if name == "grokking":
        from torch_port.experiments import grokking

        grokking.check_config({**config, "arms": ["A"], "last_fraction": 1.0})
        return lambda seed: grokking.make_task(config, seed, device)
    if name == "patches":
        from torch_port.experiments import patches

        cfg = dict(config)
        if data_dir is not None:
            cfg["dataset"] = "cifar10"
        patches.check_config({**cfg, "arms": ["A"], "fractions": []})
        data = patches.load_data(cfg, data_dir)
        task = patches.make_task(cfg, data, 1.0, device)
        return lambda seed: task
    raise ValueError(f"unknown task {name!r}; choose among {TASKS}")


def train_with(task: Task, config: dict[str, Any], arm: str, seed: int, **kw: Any) -> Any:
    """``train_run`` with a task configuration's steps, lr, betas, decay, evaluation interval
    and trust radius Δ = trust_tau·√d_head."""
    return train_run(
        task,
        arm,
        seed,
        steps=config["steps"],
        lr=config["lr"],
        betas=tuple(config["betas"]),
        weight_decay=config["weight_decay"],
        trust_radius=config["trust_tau"] * math.sqrt(config["d_model"] // config["n_heads"]),
        eval_every=config["eval_every"],
        **kw,
    )


def run_tasks(
    config: dict[str, Any],
    options: Any,
    directory: Any,
    device: torch.device | str,
    track_movement: bool,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every (task, seed, arm) of ``config`` ("tasks": name -> task configuration, "arms",
    "seeds"), resumable (``run_cached``); returns the run records and their cache keys."""
    check_arms(config["arms"])
    runs, keys = [], []
    for name, tcfg in config["tasks"].items():
        make = task_factory(name, tcfg, options.data_dir, device)
        for seed in config["seeds"]:
            task = make(seed)
            for arm in config["arms"]:
                key = f"{name}-{seed}-{arm}"
                keys.append(key)

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
                        checkpoint_every=tcfg.get("checkpoint_every", 0),
                        show_progress=options.progress,
                    )

                runs.append(run_cached(directory, config, key, options.resume, train))
    return runs, keys
