"""Sizes and hyperparameters shared by the RA checks (stated once, cited by every check)."""

from __future__ import annotations

import reference as ref

#: float64 checks: one attention head's frame, St(64, 16), over 6 steps.
D, R, STEPS = 64, 16, 6
#: mpmath checks: a small frame, St(6, 3), over 3 steps (object arrays are slow).
MP_D, MP_R, MP_STEPS = 6, 3, 3
#: lr·√(d·r) ≤ 1/2 for every d·r ≤ 64² (the hypothesis of ``bounds.trajectory_tolerance``).
LR = 5e-3
#: Trust radius, below the uncapped step (≈ lr·√(d·r) = 0.16 at St(64, 16)), so the cap is active.
RADIUS = 0.05
BETAS = (0.9, 0.999)


def adam(
    moment: str = "frame", eps: float = 1e-8, beta1: float = BETAS[0], radius: float | None = RADIUS
) -> ref.optim.Optimizer:
    """The rule under test, ``riemannian_adam`` at the hyperparameters above."""
    return ref.optim.riemannian_adam(
        lr=LR, betas=(beta1, BETAS[1]), eps=eps, trust_radius=radius, moment=moment
    )
