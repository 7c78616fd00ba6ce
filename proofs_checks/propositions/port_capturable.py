"""PORT-3: the capturable step of ``torch_port.optim.capturable``: its fixed-degree polar series,
and its steps against the reference's.

As in ``port``, torch and the port are imported inside the checks, and every negative control
substitutes a wrong variant into the port's own code (``harness.substituted``), so the control
goes through the path training takes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from proofs_checks.harness import substituted
from proofs_checks.propositions.port import NEAR_MISS
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: PORT-3: the trust radii of the series check, the frames, and the trajectory's steps.
SERIES_RADII = (0.1, 0.3, 0.5, 0.7)
SERIES_D, SERIES_R = 16, 4
CAPTURABLE_STEPS, CAPTURABLE_RADIUS, CAPTURABLE_LR = 20, 0.05, 1e-2
TRAJECTORY_SHAPES = ((16, 4), (2, 16, 4), (3, 8, 4))


def _bound_for_half_delta(original):
    """``capturable.series_bound`` at δ = Δ²/2 + η (a near miss: the spread of E's
    eigenvalues after the normalisation by α when they are balanced, not their bound)."""

    def variant(radius):
        from torch_port.optim import capturable

        original(radius)  # its checks
        return radius**2 / 2 + capturable.DRIFT_SLACK

    return variant


def series(ctx: Context, wrong: bool) -> Outcome:
    """For each Δ of ``SERIES_RADII``: a stack of four (16, 4) matrices A = W Q diag(√μ) Qᵀ
    (seed ``ctx.seed``) whose Gram eigenvalues μ spread over [1 − δ, 1 + δ], δ = Δ² + η, so
    that ‖E‖₂ = δ, the bound the degree is chosen for; ``capturable.polar_series(A, Δ)`` (the
    series the capturable step takes) against the eigendecomposition route
    ``torch_port.linalg.polar``.
    Bound: 2κ·``frame_error``(16, 4, κ) (each route's forward error at condition κ, as in
    GEO-stiefel's nearest point) + √r·1e-17 (the truncation the degree allows). Residual: the
    worst ratio to the bound. Control: the series sized for δ = Δ²/2 + η, substituted into
    ``torch_port.optim.capturable``."""
    import torch

    from proofs_checks.bounds import frame_error
    from torch_port import Stiefel, linalg
    from torch_port.optim import capturable

    g = torch.Generator().manual_seed(ctx.seed)
    w = Stiefel(SERIES_D, SERIES_R).random_point(g, (4,), dtype=torch.float64)
    q = torch.linalg.qr(torch.randn(4, SERIES_R, SERIES_R, generator=g, dtype=torch.float64))[0]
    worst, where = 0.0, ""
    short = substituted(capturable, "series_bound", _bound_for_half_delta(capturable.series_bound))
    with short if wrong else contextlib.nullcontext():
        for radius in SERIES_RADII:
            delta = radius**2 + capturable.DRIFT_SLACK
            mu = torch.linspace(1.0 - delta, 1.0 + delta, SERIES_R, dtype=torch.float64)
            a = w @ (q * torch.sqrt(mu)) @ q.transpose(-1, -2)
            kappa = math.sqrt((1 + delta) / (1 - delta))
            bound = 2 * kappa * frame_error(SERIES_D, SERIES_R, kappa=kappa) + 2e-17
            fixed = capturable.polar_series(a, radius)
            dev = float(linalg.frobenius(fixed - linalg.polar(a)).max())
            if dev / bound > worst:
                worst, where = dev / bound, f"Δ = {radius}: {dev:.2e} against {bound:.2e}"
    exercised = {
        "sizes": f"a stack of 4 ({SERIES_D}, {SERIES_R}) matrices",
        "options": "Δ = " + ", ".join(map(str, SERIES_RADII)),
        "dtypes": "float64",
        "seeds": ctx.seed,
    }
    return Outcome.bound(worst, 1.0, f"worst at {where}", exercised)


def _count_one_ahead():
    """``capturable.step_numbers`` one ahead (the bias corrections of the next step),
    substituted."""
    from torch_port.optim import capturable

    original = capturable.step_numbers
    return substituted(capturable, "step_numbers", lambda *args: original(*args) + 1)


def _radius_stretched():
    """``transforms.trust_region`` with the trust radius times 1 + ``NEAR_MISS``, as the
    capturable step builds its chain, substituted (a near miss: the binding cap lets each step
    be 1e-9 relative longer)."""
    from torch_port.optim import transforms

    original = transforms.trust_region
    return substituted(transforms, "trust_region", lambda r: original((1 + NEAR_MISS) * r))


def capturable_trajectory(
    ctx: Context, wrong: bool, control: Callable = _count_one_ahead
) -> Outcome:
    """``CAPTURABLE_STEPS`` float64 steps of ``RiemannianAdam(capturable=True)`` (lr 1e-2,
    Δ = 0.05, binding) on the frame parameters of ``TRAJECTORY_SHAPES`` in one group (a
    (16, 4) frame and two batches of frames, of two d and one r, so that the step batches and
    splits them) against ``reference.optim.riemannian_adam`` with the same hyperparameters on
    each frame along the same gradients (seed ``ctx.seed``): the largest max|W_t − W_t^ref|
    against 20·``step_error``(16, 4), the per-step rounding bound of the two runs accumulated
    without amplification. Control: the bias corrections one step ahead, substituted into
    ``torch_port.optim.capturable``."""
    import numpy as np
    import torch

    import reference as ref
    from proofs_checks.bounds import step_error
    from torch_port import RiemannianAdam, Stiefel

    g = torch.Generator().manual_seed(ctx.seed)
    ws = [
        torch.nn.Parameter(Stiefel(*shape[-2:]).random_point(g, shape[:-2], dtype=torch.float64))
        for shape in TRAJECTORY_SHAPES
    ]
    group = [{"params": ws, "geometry": "stiefel"}]
    opt = RiemannianAdam(group, lr=CAPTURABLE_LR, trust_radius=CAPTURABLE_RADIUS, capturable=True)
    rule = ref.optim.riemannian_adam(CAPTURABLE_LR, trust_radius=CAPTURABLE_RADIUS)
    frames = [  # per frame of every parameter: (geometry, point, state)
        [ref.Stiefel(*w.shape[-2:]), x, None]
        for w in ws
        for x in w.detach().numpy().reshape(-1, *w.shape[-2:]).copy()
    ]
    for frame in frames:
        frame[2] = rule.init(frame[0], frame[1])
    worst = 0.0
    with control() if wrong else contextlib.nullcontext():
        for _ in range(CAPTURABLE_STEPS):
            for w in ws:
                w.grad = torch.randn(w.shape, generator=g, dtype=torch.float64)
            opt.step()
            grads = [gk for w in ws for gk in w.grad.numpy().reshape(-1, *w.shape[-2:])]
            points = [xk for w in ws for xk in w.detach().numpy().reshape(-1, *w.shape[-2:])]
            for frame, grad, point in zip(frames, grads, points, strict=True):
                frame[1], frame[2] = rule.step(frame[0], frame[1], grad, frame[2])
                worst = max(worst, float(np.abs(point - frame[1]).max()))
    return Outcome.bound(
        worst,
        CAPTURABLE_STEPS * step_error(SERIES_D, SERIES_R),
        f"max_t max|W_t − W_t^ref| over {CAPTURABLE_STEPS} steps",
        {
            "sizes": f"frame parameters {', '.join(map(str, TRAJECTORY_SHAPES))}",
            "options": f"lr {CAPTURABLE_LR}, Δ = {CAPTURABLE_RADIUS}",
            "steps": CAPTURABLE_STEPS,
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def capturable_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``capturable_trajectory``; control, a near miss: the binding trust radius ``NEAR_MISS``
    relative larger (substituted into ``torch_port.optim.transforms``, whose chain the
    capturable step runs)."""
    return capturable_trajectory(ctx, wrong, control=_radius_stretched)


#: PORT-3: the plain parameter of the AdamW check, its hyperparameters and steps.
PLAIN_SHAPE, PLAIN_DECAY = (5, 3), 1e-2


def _decay_dropped():
    """``capturable.adamw`` with the group's weight decay taken as 0 (a near miss of
    lr·λ = 1e-4 relative per step), substituted."""
    from torch_port.optim import capturable

    original = capturable.adamw
    return substituted(
        capturable, "adamw", lambda group, *a: original({**group, "weight_decay": 0.0}, *a)
    )


def capturable_adamw(ctx: Context, wrong: bool) -> Outcome:
    """``CAPTURABLE_STEPS`` float64 steps of a plain (5, 3) parameter in
    ``RiemannianAdam(capturable=True)`` (lr 1e-2, weight decay 1e-2) against
    ``torch.optim.AdamW`` with the same hyperparameters along the same gradients (seed
    ``ctx.seed``, drawn independently of the parameters): max_t ‖p_t − p_t^torch‖ over
    2·``adamw_tolerance`` (each run within that bound of the exact AdamW trajectory, the
    bound growing with t). Control: the weight decay dropped, substituted into
    ``torch_port.optim.capturable``."""
    import torch

    from proofs_checks.bounds import adamw_tolerance
    from torch_port import RiemannianAdam

    g = torch.Generator().manual_seed(ctx.seed)
    start = torch.randn(PLAIN_SHAPE, generator=g, dtype=torch.float64)
    p, q = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    port = RiemannianAdam(
        [{"params": [p]}], lr=CAPTURABLE_LR, weight_decay=PLAIN_DECAY, capturable=True
    )
    torch_adamw = torch.optim.AdamW([q], lr=CAPTURABLE_LR, weight_decay=PLAIN_DECAY)
    worst = 0.0
    with _decay_dropped() if wrong else contextlib.nullcontext():
        for _ in range(CAPTURABLE_STEPS):
            grad = torch.randn(PLAIN_SHAPE, generator=g, dtype=torch.float64)
            p.grad, q.grad = grad.clone(), grad.clone()
            port.step()
            torch_adamw.step()
            worst = max(worst, float(torch.linalg.vector_norm(p.detach() - q.detach())))
    bound = 2 * adamw_tolerance(
        start.numel(),
        CAPTURABLE_STEPS,
        float(torch.linalg.vector_norm(start)),
        CAPTURABLE_LR,
        (0.9, 0.999),
        PLAIN_DECAY,
    )
    return Outcome.bound(
        worst / bound,
        1.0,
        f"max_t ‖p_t − p_t^torch‖ = {worst:.2e} over {CAPTURABLE_STEPS} steps against {bound:.2e}",
        {
            "sizes": f"one plain {PLAIN_SHAPE} parameter",
            "options": f"lr {CAPTURABLE_LR}, weight decay {PLAIN_DECAY}",
            "steps": CAPTURABLE_STEPS,
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


register(
    Proposition(
        id="PORT-3",
        title="The capturable step: a fixed-degree polar series, and the reference's steps",
        statement=(
            r"For $\Delta\in\{0.1,0.3,0.5,0.7\}$ and $A=WQ\operatorname{diag}(\sqrt{\mu})"
            r"Q^\top$ whose Gram eigenvalues $\mu$ span $[1-\delta,1+\delta]$, "
            r"$\delta=\Delta^2+10^{-3}$, the Taylor polynomial of $(I+E)^{-1/2}$ of the degree "
            r"$k$ with "
            r"$\delta^{k+1}/(1-\delta)\le10^{-17}$ gives the polar factor to float64 rounding; "
            r"with it, the steps of \texttt{RiemannianAdam(capturable=True)} are the "
            r"reference's to float64 rounding, and its steps of plain parameters are "
            r"\texttt{torch.optim.AdamW}'s."
        ),
        hypotheses=(
            "the Gram and the series in float64 (torch_port.optim.capturable.polar_series)",
            "(16, 4) frames; the trajectory with Δ = 0.05 binding, 20 steps, on frame "
            "parameters of shapes (16, 4), (2, 16, 4) and (3, 8, 4) in one group",
            "a plain (5, 3) parameter with weight decay 1e-2, 20 steps",
        ),
        remarks=(
            r"For $A=W+\xi$ with $W$ a frame and $\|\xi\|\le\Delta\le0.7$ the eigenvalues of "
            r"$A^\top A/\alpha$ ($\alpha=\mathrm{tr}(A^\top A)/r$) are meant to lie within "
            r"$\delta$ of 1, which is what the degree is chosen for; the checks build matrices "
            r"with that spectrum, and the trajectory check runs the capturable step itself.",
        ),
        checks=(
            Check(
                "float64",
                "the series at ‖E‖₂ = δ for Δ = 0.1 … 0.7",
                series,
                "the series sized for δ = Δ²/2 + η, substituted into the port",
            ),
            Check(
                "float64",
                "20 capturable steps against the reference",
                capturable_trajectory,
                "the bias corrections one step ahead, substituted into the port",
            ),
            Check(
                "float64",
                "resolution: capturable steps 1e-9 relative too long are caught",
                capturable_resolution,
                f"near miss: the trust radius times 1 + {NEAR_MISS:g}, substituted into the port",
            ),
            Check(
                "float64",
                "20 capturable AdamW steps of a plain parameter against torch's AdamW",
                capturable_adamw,
                "the weight decay dropped, substituted into the port",
            ),
        ),
        requires=("torch",),
    )
)
