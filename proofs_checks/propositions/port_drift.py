"""PORT-2: the port's polar retraction keeps float32 frames on St(d, r): no drift over a long
run, and a frame just inside the acceptance threshold brought back within the bound in one step.

As in ``port``, torch and the port are imported inside the checks, and every negative control
substitutes a wrong variant into the port's own code (``harness.substituted``), so the control
goes through the path training takes.
"""

from __future__ import annotations

import contextlib
import math

from proofs_checks.harness import substituted
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: PORT-2: frames, steps and step size (large steps: a truncated inverse square root shows).
DRIFT_D, DRIFT_R, DRIFT_FRAMES = 64, 16, 8
DRIFT_STEPS, DRIFT_STEPS_QUICK = 1000, 50
DRIFT_LR, DRIFT_RADIUS = 0.05, 0.4


def drift(ctx: Context, wrong: bool) -> Outcome:
    """RiemannianAdam (trust radius 0.4, lr 0.05) in float32 on ``DRIFT_FRAMES`` frames of
    St(64, 16) under a Brockett cost, ``DRIFT_STEPS`` steps (50 quick): after every step
    ‖WᵀW − I‖ (measured in float64 from the stored entries) ≤ (4r(r + 1) + 2(d + r)r)·u₃₂
    (``_drift_bound``); the largest ratio is the residual, tolerance 1. The bound does not
    grow with the steps: the polar factor re-forms the Gram every step. The first step past the
    bound decides, and the check stops there. Control: the inverse
    square root of the Gram truncated at first order (I − E/2), substituted into
    ``torch_port.linalg``."""
    import torch

    import torch_port as tp
    from torch_port import linalg

    steps = DRIFT_STEPS_QUICK if ctx.quick else DRIFT_STEPS
    bound = _drift_bound()

    def first_order(delta, tol):  # the degree of the series I − E/2
        return 1

    patch = (
        substituted(linalg, "_series_degree", first_order) if wrong else contextlib.nullcontext()
    )
    gen = torch.Generator().manual_seed(ctx.seed)
    w = torch.nn.Parameter(tp.Stiefel(DRIFT_D, DRIFT_R).random_point(gen, (DRIFT_FRAMES,)).float())
    a = torch.randn(DRIFT_D, DRIFT_D, generator=gen) / math.sqrt(DRIFT_D)
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}], lr=DRIFT_LR, trust_radius=DRIFT_RADIUS
    )
    worst, taken = 0.0, 0
    with patch:
        while taken < steps and worst <= bound:  # a step past the bound decides: stop there
            opt.zero_grad()
            torch.einsum("hdr,de,her->", w, a, w).backward()
            opt.step()
            taken += 1
            worst = max(worst, float(linalg.orthonormality_residual(w.detach()).max()))
    return Outcome.bound(
        worst / bound,
        1.0,
        f"max_t ‖WᵀW − I‖ = {worst:.2e} over {taken} of {steps} steps, bound {bound:.2e}",
        {
            "sizes": f"{DRIFT_FRAMES} frames of St({DRIFT_D}, {DRIFT_R})",
            "steps": taken,
            "dtypes": "float32",
            "seeds": ctx.seed,
        },
    )


def _drift_bound() -> float:
    """PORT-2's bound at St(DRIFT_D, DRIFT_R): float32 frames, the Gram in float32
    (``port_compare.geometries.polar_drift_bound``)."""
    import torch

    from proofs_checks.port_compare.geometries import polar_drift_bound

    return polar_drift_bound(DRIFT_D, DRIFT_R, torch.float32, gram=torch.float32)


#: PORT-2's correction check: how far off St(d, r) its float32 frames start (just inside the
#: sqrt(ε₃₂) = 3.45e-4 at which the optimizer accepts a point).
CORRECTION_DRIFT = 3.4e-4


def _gram_assumed_orthonormal(self, x, u, c, a):
    """``StiefelFrames.retraction_gram`` as the closed form I + ξᵀξ, ξ = c·u (exact when
    WᵀW = I, so it never sees W's drift: DESIGN §4.0's warning)."""
    import torch

    from torch_port.linalg import eye_like, transpose

    xi = (u[0] * c[..., None, None].to(u[0].dtype)).to(torch.float64)
    return transpose(xi) @ xi + eye_like(xi)


def correction(ctx: Context, wrong: bool) -> Outcome:
    """``DRIFT_FRAMES`` float32 frames of St(64, 16) made off the manifold by exactly
    ‖WᵀW − I‖ = ``CORRECTION_DRIFT`` in float64 (W = Q(I + D)^{1/2}, Q a frame, D symmetric;
    the float32 rounding of W adds ≤ 1e-6), one RiemannianAdam step (lr 0.05, trust radius
    0.4, a Brockett cost): every frame is within PORT-2's bound after it (0.65 of the start),
    because the Gram of W + ξ is formed from the stored entries. Control: the Gram taken as
    I + ξᵀξ, substituted for ``StiefelFrames.retraction_gram``: the drift stays."""
    import torch

    import torch_port as tp
    from torch_port import linalg
    from torch_port.stiefel import StiefelFrames

    gen = torch.Generator().manual_seed(ctx.seed)
    q = tp.Stiefel(DRIFT_D, DRIFT_R).random_point(gen, (DRIFT_FRAMES,))
    d = torch.randn(DRIFT_FRAMES, DRIFT_R, DRIFT_R, generator=gen, dtype=torch.float64)
    d = linalg.sym(d)
    d = d * (CORRECTION_DRIFT / linalg.frobenius(d))[:, None, None]
    lam, v = torch.linalg.eigh(d + linalg.eye_like(d))
    w = torch.nn.Parameter((q @ (v * lam.sqrt()[..., None, :]) @ linalg.transpose(v)).float())
    start = float(linalg.orthonormality_residual(w.detach()).min())
    a = torch.randn(DRIFT_D, DRIFT_D, generator=gen) / math.sqrt(DRIFT_D)
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}], lr=DRIFT_LR, trust_radius=DRIFT_RADIUS
    )
    torch.einsum("hdr,de,her->", w, a, w).backward()
    patch = (
        substituted(StiefelFrames, "retraction_gram", _gram_assumed_orthonormal)
        if wrong
        else contextlib.nullcontext()
    )
    with patch:
        opt.step()
    after = float(linalg.orthonormality_residual(w.detach()).max())
    bound = _drift_bound()
    return Outcome.bound(
        after / bound,
        1.0,
        f"‖WᵀW − I‖ from ≥ {start:.2e} to ≤ {after:.2e} in one step, bound {bound:.2e}",
        {
            "sizes": f"{DRIFT_FRAMES} frames of St({DRIFT_D}, {DRIFT_R})",
            "points": f"{CORRECTION_DRIFT:g} off St(d, r)",
            "steps": 1,
            "dtypes": "float32",
            "seeds": ctx.seed,
        },
    )


register(
    Proposition(
        id="PORT-2",
        title="The port's polar retraction keeps float32 frames on St(d, r) without drift",
        statement=(
            r"RiemannianAdam with the polar retraction on 8 float32 frames $W\in\mathbb{R}^{64"
            r"\times 16}$ (lr 0.05, trust radius 0.4, a Brockett cost), the Gram of $A=W+\xi$ "
            r"formed in float32 from the stored entries and its inverse square root in float64, "
            r"leaves $\|W^\top W-I\|_F\le(4r(r+1)+2(d+r)r)\,u_{32}$ after each of 1000 steps "
            r"(50 quick) from frames on St(64, 16), and after one step from frames "
            r"$3.4\times10^{-4}$ off it (just inside the $\sqrt{\varepsilon_{32}}$ it accepts): "
            r"with $H=(A^\top A+E)^{-1/2}$, $(AH)^\top AH-I=-HEH$."
        ),
        hypotheses=(
            "float32 frames; Gram in float32, inverse square root in float64 "
            "(torch_port.stiefel.StiefelFrames.retraction_gram, torch_port.linalg.polar_plan)",
            "steps ‖ξ‖ ≤ 0.4·sqrt(r); frames within sqrt(ε₃₂) of St(d, r) when the state is made",
            "the residual measured in float64 from the stored entries",
        ),
        remarks=(
            "The bound is below the acceptance threshold sqrt(ε₃₂), so if the one-step "
            "statement held from every accepted frame, the bound would hold after any number of "
            "steps by induction; the checks run the frames and steps stated.",
        ),
        checks=(
            Check(
                "float64",
                "‖WᵀW − I‖ after every step of a long float32 run",
                drift,
                "the Gram's inverse square root truncated at first order, substituted",
            ),
            Check(
                "float64",
                "a frame 3.4e-4 off St(d, r) is within the bound after one step",
                correction,
                "the Gram taken as I + ξᵀξ (WᵀW = I assumed), substituted",
            ),
        ),
        requires=("torch",),
    )
)
