"""The optimizer arms of the Stiefel-attention experiments: what each arm does to W_Q, W_K.

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
polar(W + ξ/c)). The trust radius Δ = τ·√d_head (``trust_radius``) caps the steps of C, E and
F. ``prepare_model`` sets a freshly built model up for its arm and ``make_optimizer`` builds the
arm's optimizer; ``training.train_run`` trains one (task, arm, seed) with them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from torch_port import linalg
from torch_port.optim import RSGD, NormalizedRSGD, RiemannianAdam, checks
from torch_port.optim.groups import build_optimizer

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


def prepare_model(arm: str, model: nn.Module, match_scale: bool = False) -> nn.Module:
    """Arm-specific set-up of a freshly built model: H starts from polar(W_Q), polar(W_K);
    G freezes the frames (``requires_grad=False``). ``match_scale``: A's W_Q^h, W_K^h (d×r)
    are rescaled to ‖W‖_F = √r, a frame's norm, so that A's initial attention logits q·k have
    the frames' scale (each column's mean squared norm becomes 1, as a frame's columns are;
    without it A's columns have squared norm ≈ d·1/(3d) = 1/3 and its logits start ≈ 3×
    smaller); the direction of every W is kept."""
    check_arms([arm])
    qk = qk_parameters(model)
    if match_scale and arm_geometry(arm) is None and arm != "H":
        with torch.no_grad():
            for p in qk.values():
                r = p.shape[-1]
                p.mul_(math.sqrt(r) / linalg.frobenius(p).unsqueeze(-1).unsqueeze(-1))
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
    frame_lr: float | None = None,
) -> torch.optim.Optimizer:
    """The arm's optimizer: AdamW (lr, betas, eps, decoupled ``weight_decay``) on every non-frame
    weight, the arm's rule (same lr; no decay) on W_Q, W_K (module docstring): a preset on the
    model's groups for A, B, C, D, F, G; for E and H ``RiemannianAdam``'s chain on a W_Q, W_K
    group with ``"gradient": "euclidean"`` (the chain acts on the raw gradient, with no
    projection or transport, and the Stiefel polar retraction puts the frames back): E with one
    second moment per frame and the cap, H with one per entry (AdamW's update without decay).
    The trust radius Δ caps the steps of C, E and F only (B is plain fixed-step RSGD, D is scale
    free). ``frame_lr`` gives the frames their own learning rate (arms B–F, H; default ``lr``,
    as for every other weight; A's W_Q, W_K are plain weights and keep ``lr``)."""
    check_arms([arm])
    # no_decay=False: the experiments decay every plain weight, biases and embeddings too, as
    # their papers' setups do (build_optimizer's usual rule would keep those out).
    common = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, no_decay=False)
    frame: dict[str, Any] = {"trust_radius": trust_radius}
    if frame_lr is not None:
        frame["lr"] = frame_lr
    if arm in ("E", "H"):
        qk = qk_parameters(model)
        ids = {id(p) for p in qk.values()}
        rest = [(n, p) for n, p in model.named_parameters() if id(p) not in ids and p.requires_grad]
        frames = {
            "params": list(qk.values()),
            "param_names": list(qk),
            "geometry": "stiefel",
            "gradient": "euclidean",
            "moment": "frame" if arm == "E" else "elementwise",
            "weight_decay": 0.0,
            "trust_radius": trust_radius if arm == "E" else None,
            **({} if frame_lr is None else {"lr": frame_lr}),
        }
        plain = {"params": [p for _, p in rest], "param_names": [n for n, _ in rest]}
        common.pop("no_decay")
        return RiemannianAdam([frames, plain], **common)
    lr_only = {k: v for k, v in frame.items() if k == "lr"}  # A, B, D, G: no cap
    if arm in ("A", "G"):
        return build_optimizer(model, RiemannianAdam, frame_options=lr_only, **common)
    if arm == "B":
        return build_optimizer(model, RSGD, frame_options=lr_only, **common)
    if arm == "C":
        return build_optimizer(model, RiemannianAdam, frame_options=frame, **common)
    if arm == "D":
        return build_optimizer(model, NormalizedRSGD, frame_options=lr_only, **common)
    options = {**frame, "moment": "elementwise"}  # F
    return build_optimizer(model, RiemannianAdam, frame_options=options, **common)


def check_optimizer_config(config: dict[str, Any]) -> None:
    """Refuse a task configuration's optimizer settings unless lr > 0, betas in [0, 1),
    weight_decay ≥ 0 and trust_tau > 0 (all finite), naming the bad value."""
    checks.positive("lr", config["lr"])
    checks.betas(config["betas"])
    checks.nonnegative("weight_decay", config["weight_decay"])
    checks.positive("trust_tau", config["trust_tau"])
    if config.get("frame_lr") is not None:
        checks.positive("frame_lr", config["frame_lr"])


def trust_radius(config: dict[str, Any]) -> float:
    """Δ = τ·√d_head, d_head = d_model/n_heads (τ·‖W‖_F for a frame with d_head orthonormal
    columns)."""
    return config["trust_tau"] * math.sqrt(config["d_model"] // config["n_heads"])
