"""PORT-1, PORT-2, PORT-3: the torch port that training runs, against the reference and its own
bounds (PORT-3: the capturable step of ``torch_port.optim.capturable``).

Both need torch (``requires``): ``rattn certify`` lists them as not run where it is missing. torch
and the port are imported inside the checks, so the registry loads without them. Each negative
control substitutes a wrong variant into the port's own code (its module attribute, for the
duration of the control) rather than branching inside the check, so the control goes through
the path training takes.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from proofs_checks.harness import substituted
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: The near-miss controls' relative error of a step (PORT-3; PORT-4's ε: ten times it), and
#: PORT-1's on float64 steps, whose bounds are a few u (30× the bound at 3e-12).
NEAR_MISS, FLOAT64_NEAR_MISS = 1e-9, 3e-12
#: Steps of every PORT-1 case (enough for the state carried between steps to be checked twice).
AGREEMENT_STEPS = 3
#: PORT-2: frames, steps and step size (large steps: a truncated inverse square root shows).
DRIFT_D, DRIFT_R, DRIFT_FRAMES = 64, 16, 8
DRIFT_STEPS, DRIFT_STEPS_QUICK = 1000, 50
DRIFT_LR, DRIFT_RADIUS = 0.05, 0.4


def _bias_correction_one_step_ahead(original):
    """``transforms.scale_by_adam`` whose bias corrections use t + 1 for t (a near miss: by step
    3 the corrections differ by 1 − β1^3 against 1 − β1^4, 27% against 34% of the first)."""

    def variant(b1=0.9, b2=0.999, eps=1e-8, moment="frame", reduction="mean"):
        inner = original(b1, b2, eps, moment, reduction)

        def update(geometry, x, step, state, t):
            out, new = inner.update(geometry, x, step, state, t)
            c1, c2 = 1.0 - b1 ** (t + 1), math.sqrt(1.0 - b2 ** (t + 1))
            if out.ratio is not None:  # the frame moment: m·(1/c1)/(√v/c2 + ε)
                return replace(out, ratio=(1.0 / c1, new["sqrt_v"] / c2 + eps)), new
            return replace(out, u=tuple((1.0 - b1**t) / c1 * p for p in out.u)), new

        return inner._replace(update=update)

    return variant


def _cases(quick: bool) -> list[tuple[str, str, str, str]]:
    """(geometry, problem, rule, dtype) of ``rattn compare``'s table (all 195); quick: every
    geometry's base problem with the Adam preset, and every rule and option on the Stiefel
    Brockett problem, each in each of its dtypes (43 cases: every transformation of
    ``torch_port.optim.transforms`` runs in the quick certificate)."""
    from proofs_checks.port_compare.rules import RECORDS

    rows = sorted({(r.geometry, r.problem, r.rule, dt) for r in RECORDS for dt in r.dtypes})
    if not quick:
        return rows
    base = ("brockett", "matrix_fit")
    return [
        row
        for row in rows
        if (row[2] == "riemannian_adam" and row[1] in base)
        or (row[0] == "stiefel" and row[1] == "brockett")
    ]


def _float64_adam_cases(quick: bool) -> list[tuple[str, str, str, str]]:
    """The float64 Adam case of each geometry's base problem (11 cases)."""
    return [c for c in _cases(True) if c[3] == "float64" and c[2] == "riemannian_adam"]


def _scale_stretched(k: float):
    """``transforms.scale`` with its factor times k (a near miss for k = 1 + 3e-12: every
    step 3e-12 relative longer)."""

    def make(original):
        return lambda factor: original(k * factor)

    return make


def replayed_ratio(path: Path) -> tuple[float, int]:
    """The largest deviation/bound of a recorded step or of the state it carried into the
    next (``rattn audit``'s replay through ``reference.optim`` in float64), and its step."""
    from proofs_checks.audit import replay as replay

    worst, where = 0.0, 0
    for row in replay.audit(path)["steps"]:
        ratio = replay.row_ratio(row)
        if row["verdict"] == "fail":  # e.g. a point the port would not accept
            # a failed step's state is not compared (its ratio is then inf): where its point is
            # past the bound, that ratio is the step's, the resolution a near miss shows
            measured = row["deviation"] is not None and row["bound"]
            point = row["deviation"] / row["bound"] if measured else math.inf
            ratio = point if point > 1.0 else max(ratio, math.nextafter(1.0, 2.0))
        if ratio > worst:
            worst, where = ratio, row["step"]
    return worst, where


def agreement(
    ctx: Context,
    wrong: bool,
    cases_of: Callable[[bool], list] = _cases,
    control: tuple[str, Callable] = ("scale_by_adam", _bias_correction_one_step_ahead),
) -> Outcome:
    """Every case (``_cases``): the port's trajectory of ``AGREEMENT_STEPS`` steps, recorded by
    ``torch_port.audit`` and replayed by ``rattn audit`` through ``reference.optim`` in float64;
    residual the largest deviation/bound of a step or of the state it carried into the next
    (bounds of ``proofs_checks.audit.replay``), tolerance 1; the first case past its
    bound decides, and the check stops there. Control: the port's Adam with its bias
    corrections one step ahead, substituted into ``torch_port.optim.transforms`` (or the
    transformation and variant of ``control``, on the cases of ``cases_of``)."""
    import torch

    from proofs_checks.port_compare.problems import PROBLEMS
    from proofs_checks.port_compare.rules import RULES
    from torch_port import audit
    from torch_port.optim import transforms

    cases = cases_of(ctx.quick)
    worst, where, done = 0.0, "", 0
    name, make = control
    patch = (
        substituted(transforms, name, make(getattr(transforms, name)))
        if wrong
        else contextlib.nullcontext()
    )
    with patch, tempfile.TemporaryDirectory() as tmp:
        for geometry, problem, rule, dtype in cases:
            prob = PROBLEMS[geometry][problem]
            inst = prob.build(ctx.seed)
            dt = getattr(torch, dtype)
            params = [torch.nn.Parameter(torch.tensor(p).to(dt)) for p in inst.points]
            data = {k: torch.tensor(v).to(dt) for k, v in inst.data.items()}
            opt = RULES[rule].port([prob.adapter.group(params)])
            path = Path(tmp) / "trace.npz"
            with audit.record(opt, path):
                for _ in range(AGREEMENT_STEPS):
                    opt.zero_grad()
                    inst.loss(params, data).backward()
                    opt.step()
            ratio, step = replayed_ratio(path)
            if ratio > worst:
                worst, where = ratio, f"{geometry}/{problem}/{rule}/{dtype} step {step}"
            done += 1
            if worst > 1.0:  # one case past its bound decides: stop there
                break
    exercised = {
        "cases": f"{done} (geometry, problem, rule, dtype) of rattn compare's table",
        "geometries": ", ".join(sorted({c[0] for c in cases[:done]})),
        "rules": ", ".join(sorted({c[2] for c in cases[:done]})),
        "dtypes": ", ".join(
            f"{dt} in {n}" for dt, n in sorted(Counter(c[3] for c in cases[:done]).items())
        ),
        "steps": f"{AGREEMENT_STEPS} per case",
        "seeds": ctx.seed,
    }
    return Outcome.bound(
        worst,
        1.0,
        f"max deviation/bound over {done} of {len(cases)} cases; worst at {where}",
        exercised,
    )


def agreement_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``agreement`` on the float64 Adam case of each geometry (``_float64_adam_cases``).
    Control, a near miss: every step ``FLOAT64_NEAR_MISS`` relative longer (``transforms.scale``
    stretched, substituted into the port)."""
    stretched = ("scale", _scale_stretched(1 + FLOAT64_NEAR_MISS))
    return agreement(ctx, wrong, cases_of=_float64_adam_cases, control=stretched)


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

    def first_order(e, delta, tol):
        return linalg._inv_sqrt_taylor(e, 1)

    patch = (
        substituted(linalg, "_inv_sqrt_near_identity", first_order)
        if wrong
        else contextlib.nullcontext()
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
        id="PORT-1",
        title="The port's steps are the reference's, within their rounding bounds",
        statement=(
            r"For each case of \texttt{rattn compare} (every geometry, rule and option it "
            r"lists, in the dtypes it lists for it: float64 and float32, and bfloat16 for "
            rf"Stiefel frames under four rules), each of the first {AGREEMENT_STEPS} steps "
            r"$x\mapsto y$ the torch "
            r"port takes, from "
            r"the point, gradient, state and hyperparameters it had, lands within "
            r"$B=L\delta+Ku(\kappa(n+r+2\log_2 nr)\Delta+(r+4)s)$ of the float64 reference "
            r"step from the projected point, and the state it carries into the next step "
            r"within its bound of the reference's."
        ),
        hypotheses=(
            "points the port accepts (orthonormality residual ≤ sqrt(ε) of the dtype)",
            "L = 2, K = 4; u the dtype's unit roundoff",
            "steps shorter than 1/2 in Frobenius norm",
        ),
        checks=(
            Check(
                "float64",
                "every geometry × rule × dtype, replayed by rattn audit",
                agreement,
                "Adam's bias corrections one step ahead (t + 1), substituted into the port",
            ),
            Check(
                "float64",
                f"resolution: float64 Adam steps {FLOAT64_NEAR_MISS:g} relative too long are "
                "caught",
                agreement_resolution,
                f"near miss: every step times 1 + {FLOAT64_NEAR_MISS:g}, substituted into the port",
            ),
        ),
        requires=("torch",),
    )
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


#: PORT-3: the trust radii of the series check, the frames, and the trajectory's steps.
SERIES_RADII = (0.1, 0.3, 0.5, 0.7)
SERIES_D, SERIES_R = 16, 4
CAPTURABLE_STEPS, CAPTURABLE_RADIUS, CAPTURABLE_LR = 20, 0.05, 1e-2


def _degree_for_half_delta(original):
    """``capturable.taylor_degree`` for δ = Δ²/2 + η (a near miss: the spread of E's
    eigenvalues after the normalisation by α when they are balanced, not their bound)."""

    def variant(radius):
        from torch_port import linalg
        from torch_port.optim import capturable

        original(radius)  # its checks
        return linalg._taylor_degree(radius**2 / 2 + capturable.DRIFT_SLACK)

    return variant


def series(ctx: Context, wrong: bool) -> Outcome:
    """For each Δ of ``SERIES_RADII``: a stack of four (16, 4) matrices A = W Q diag(√μ) Qᵀ
    (seed ``ctx.seed``) whose Gram eigenvalues μ spread over [1 − δ, 1 + δ], δ = Δ² + η, so
    that ‖E‖₂ = δ, the bound the degree is chosen for; ``capturable.polar_fixed(A,
    taylor_degree(Δ))`` against the eigendecomposition route ``torch_port.linalg.polar``.
    Bound: 2κ·``frame_error``(16, 4, κ) (each route's forward error at condition κ, as in
    GEO-stiefel's nearest point) + √r·1e-17 (the truncation the degree allows). Residual: the
    worst ratio to the bound. Control: the degree for δ = Δ²/2 + η, substituted into
    ``torch_port.optim.capturable``."""
    import torch

    from proofs_checks.bounds import frame_error
    from torch_port import Stiefel, linalg
    from torch_port.optim import capturable

    g = torch.Generator().manual_seed(ctx.seed)
    w = Stiefel(SERIES_D, SERIES_R).random_point(g, (4,), dtype=torch.float64)
    q = torch.linalg.qr(torch.randn(4, SERIES_R, SERIES_R, generator=g, dtype=torch.float64))[0]
    worst, where = 0.0, ""
    short = substituted(
        capturable, "taylor_degree", _degree_for_half_delta(capturable.taylor_degree)
    )
    with short if wrong else contextlib.nullcontext():
        for radius in SERIES_RADII:
            delta = radius**2 + capturable.DRIFT_SLACK
            mu = torch.linspace(1.0 - delta, 1.0 + delta, SERIES_R, dtype=torch.float64)
            a = w @ (q * torch.sqrt(mu)) @ q.transpose(-1, -2)
            kappa = math.sqrt((1 + delta) / (1 - delta))
            bound = 2 * kappa * frame_error(SERIES_D, SERIES_R, kappa=kappa) + 2e-17
            fixed = capturable.polar_fixed(a, capturable.taylor_degree(radius))
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


def _count_one_ahead(original):
    """``capturable.adam_frames`` at step number t + 1 (its bias corrections one step ahead)."""

    def variant(w, grad, exp_avg, sqrt_v, t, **kw):
        return original(w, grad, exp_avg, sqrt_v, t + 1, **kw)

    return variant


def _radius_stretched(k: float):
    """``capturable.adam_frames`` with the trust radius times k (a near miss for k = 1 + 1e-9:
    the binding cap lets each step be 1e-9 relative longer)."""

    def make(original):
        def variant(*args, radius, **kw):
            return original(*args, radius=k * radius, **kw)

        return variant

    return make


def capturable_trajectory(
    ctx: Context, wrong: bool, variant: Callable = _count_one_ahead
) -> Outcome:
    """``CAPTURABLE_STEPS`` float64 steps of ``RiemannianAdam(capturable=True)`` (lr 1e-2,
    Δ = 0.05, binding) on one (16, 4) frame against ``reference.optim.riemannian_adam`` with
    the same hyperparameters along the same gradients (seed ``ctx.seed``): the largest
    max|W_t − W_t^ref| against 20·``step_error``(16, 4), the per-step rounding bound of the
    two runs accumulated without amplification. Control: the bias corrections one step ahead,
    substituted into ``torch_port.optim.capturable``."""
    import numpy as np
    import torch

    import reference as ref
    from proofs_checks.bounds import step_error
    from torch_port import RiemannianAdam, Stiefel
    from torch_port.optim import capturable

    g = torch.Generator().manual_seed(ctx.seed)
    w = torch.nn.Parameter(Stiefel(SERIES_D, SERIES_R).random_point(g, dtype=torch.float64))
    x = w.detach().numpy().copy()
    group = [{"params": [w], "geometry": "stiefel"}]
    opt = RiemannianAdam(group, lr=CAPTURABLE_LR, trust_radius=CAPTURABLE_RADIUS, capturable=True)
    rule = ref.optim.riemannian_adam(CAPTURABLE_LR, trust_radius=CAPTURABLE_RADIUS)
    geo = ref.Stiefel(SERIES_D, SERIES_R)
    state, worst = rule.init(geo, x), 0.0
    ahead = substituted(capturable, "adam_frames", variant(capturable.adam_frames))
    with ahead if wrong else contextlib.nullcontext():
        for _ in range(CAPTURABLE_STEPS):
            grad = torch.randn(SERIES_D, SERIES_R, generator=g, dtype=torch.float64)
            w.grad = grad
            opt.step()
            x, state = rule.step(geo, x, grad.numpy(), state)
            worst = max(worst, float(np.abs(w.detach().numpy() - x).max()))
    return Outcome.bound(
        worst,
        CAPTURABLE_STEPS * step_error(SERIES_D, SERIES_R),
        f"max_t max|W_t − W_t^ref| over {CAPTURABLE_STEPS} steps",
        {
            "sizes": f"one ({SERIES_D}, {SERIES_R}) frame",
            "options": f"lr {CAPTURABLE_LR}, Δ = {CAPTURABLE_RADIUS}",
            "steps": CAPTURABLE_STEPS,
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def capturable_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``capturable_trajectory``; control, a near miss: the binding trust radius ``NEAR_MISS``
    relative larger (substituted into ``torch_port.optim.capturable``)."""
    return capturable_trajectory(ctx, wrong, variant=_radius_stretched(1 + NEAR_MISS))


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
            r"reference's to float64 rounding."
        ),
        hypotheses=(
            "the Gram and the series in float64 (torch_port.optim.capturable.polar_fixed)",
            "(16, 4) frames; the trajectory with Δ = 0.05 binding, 20 steps",
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
                "the degree for δ = Δ²/2 + η, substituted into the port",
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
        ),
        requires=("torch",),
    )
)


#: PORT-4: one (16, 4) frame stack, lr, and the scales at the ends of the dtypes' ranges.
ENDS_D, ENDS_R, ENDS_FRAMES, ENDS_LR = 16, 4, 3, 1e-2
FLOAT32_HUGE = 2.0**127  # entries of |cG| ≤ 1.7e38 < float32's largest, ‖cG‖ and WᵀcG beyond
FLOAT64_SUBNORMAL = 2.0**-1060


def _ends_exercised(ctx: Context, dtype: str, points: str) -> dict[str, object]:
    return {
        "sizes": f"{ENDS_FRAMES} frames of St({ENDS_D}, {ENDS_R})",
        "rules": "riemannian_adam (ε = 0), normalized_rsgd",
        "points": points,
        "steps": 1,
        "dtypes": dtype,
        "seeds": ctx.seed,
    }


def _one_step(rule: str, w0, grad):
    """One step from a fresh optimizer: the new frames."""
    import torch

    from torch_port import NormalizedRSGD, RiemannianAdam

    w = torch.nn.Parameter(w0.clone())
    group = [{"params": [w], "geometry": "stiefel"}]
    opt = (
        RiemannianAdam(group, lr=ENDS_LR, eps=0.0)
        if rule == "riemannian_adam"
        else NormalizedRSGD(group, lr=ENDS_LR)
    )
    w.grad = grad
    opt.step()
    return w.detach()


def _gap(rule: str, w0, grad, scaled) -> float:
    """max|W_1(cG) − W_1(G)| (inf when the port refuses the scaled step)."""
    try:
        return float((_one_step(rule, w0, scaled) - _one_step(rule, w0, grad)).abs().max())
    except ValueError:
        return math.inf


def _naive_frame_rms(original):
    """``transforms.frame_rms`` without its overflow route: ‖g‖/sqrt(entries) as computed."""

    def variant(geometry, x, g):
        import torch

        n = geometry.frame_norms(x, g)
        return n / torch.tensor(math.sqrt(geometry.frame_sizes()[0]), dtype=n.dtype)

    return variant


def _naive_ratio_step(original):
    """``transforms._ratio_step`` without its rescaling: k = num/den even where c·k overflows."""

    def variant(geometry, u, num, den, c):
        import torch

        k = torch.where(den == 0, torch.zeros_like(den), torch.full_like(den, num) / den)
        return tuple(u), k

    return variant


def overflowing_gradients(ctx: Context, wrong: bool) -> Outcome:
    """float32 frames, gradients G with uniform entries in [−1, 1] and c = 2^127 for all frames
    but the last (c = 1): the entries of cG are representable but ‖cG‖ and WᵀcG overflow
    float32, so the port's overflow routes (``frame_rms``'s scaled norm, the projection at scale
    1) are taken for those frames, and not for the last. Adam (ε = 0) and the normalised rule
    are of degree zero per frame, so W_1(cG) = W_1(G) in exact arithmetic: their
    difference is within 2·``step_error``(16, 4, 2^-24) (two float32 steps). Control:
    ``frame_rms`` without its overflow route, substituted into ``torch_port.optim.transforms``."""
    import torch

    from proofs_checks.bounds import step_error
    from torch_port import Stiefel
    from torch_port.optim import transforms

    g = torch.Generator().manual_seed(ctx.seed)
    w0 = Stiefel(ENDS_D, ENDS_R).random_point(g, (ENDS_FRAMES,), dtype=torch.float32)
    grad = (2 * torch.rand(w0.shape, generator=g, dtype=torch.float64) - 1).to(torch.float32)
    # The last frame's gradient stays at scale 1: the batch mixes frames that take the overflow
    # route with one that does not (each frame's step is its own: degree zero per frame).
    scales = torch.tensor([FLOAT32_HUGE] * (ENDS_FRAMES - 1) + [1.0])[:, None, None]
    scaled = grad * scales
    naive = substituted(transforms, "frame_rms", _naive_frame_rms(transforms.frame_rms))
    with naive if wrong else contextlib.nullcontext():
        worst = max(_gap(rule, w0, grad, scaled) for rule in ("riemannian_adam", "normalized_rsgd"))
    return Outcome.bound(
        worst,
        2 * step_error(ENDS_D, ENDS_R, 2.0**-24),
        "max|W_1(2^127·G) − W_1(G)|, float32",
        _ends_exercised(ctx, "float32", "random points, uniform G, c = 2^127 on 2 of 3 frames"),
    )


def subnormal_gradients(ctx: Context, wrong: bool) -> Outcome:
    """float64 frames at W = [I; 0] (each of three), a gradient G tangent there (skew top block:
    P_W(G) = G exactly), G_s = fl(2^-1060·G) (subnormal entries) and G' = G_s·2^1060 (exact):
    W_1(G_s) against W_1(G'), within 2·``step_error``(16, 4) + lr·sqrt(d·r)·δ, δ RA-7's
    ``subnormal_grid`` (the subnormal values' rounding moves the step's length ‖ξ‖ = lr·sqrt(d·r)
    by a relative δ, and the polar map moves the point by no more). num/den of the step's factor
    overflows here, so the port's rescaled route of ``_ratio_step`` is taken. Control: that
    route removed (substituted into ``torch_port.optim.transforms``)."""
    import numpy as np
    import torch

    from proofs_checks.bounds import step_error
    from proofs_checks.propositions.ra7_degree import subnormal_grid
    from torch_port.optim import transforms

    rng = np.random.default_rng([ctx.seed, 9])
    grad = rng.standard_normal((ENDS_FRAMES, ENDS_D, ENDS_R))
    top = grad[:, :ENDS_R]
    grad[:, :ENDS_R] = 0.5 * (top - top.transpose(0, 2, 1))
    g_sub = FLOAT64_SUBNORMAL * grad
    g_back = g_sub / FLOAT64_SUBNORMAL  # exact
    w0 = torch.tensor(np.broadcast_to(np.eye(ENDS_D, ENDS_R), g_sub.shape).copy())
    naive = substituted(transforms, "_ratio_step", _naive_ratio_step(transforms._ratio_step))
    worst = 0.0
    with naive if wrong else contextlib.nullcontext():
        for rule in ("riemannian_adam", "normalized_rsgd"):
            delta = max(subnormal_grid(rule, g, FLOAT64_SUBNORMAL) for g in g_back)
            tol = 2 * step_error(ENDS_D, ENDS_R) + ENDS_LR * math.sqrt(ENDS_D * ENDS_R) * delta
            gap = _gap(rule, w0, torch.tensor(g_back), torch.tensor(g_sub))
            worst = max(worst, gap / tol)
    return Outcome.bound(
        worst,
        1.0,
        "max|W_1(G_s) − W_1(G')| / bound, float64, subnormal G_s",
        _ends_exercised(ctx, "float64", "W = [I; 0], G tangent there, c = 2^-1060"),
    )


#: The defaults of ``RiemannianAdam`` and of ``transforms.scale_by_adam`` (DESIGN §5 and
#: torch's AdamW): written here, not read from the code.
PORT_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}
#: The gradients' size in the defaults check: RMS(g) like ε, so that a changed ε shows.
DEFAULTS_SCALE = 1e-8


def _eps_default_times(k: float):
    """``scale_by_adam`` whose default ε is k·1e-8 (k = 2: doubled; k = 1 + 1e-8: a near miss
    that moves steps along gradients of RMS 1e-8 by about 1e-8/2 relative)."""

    def make(original):
        def variant(b1=0.9, b2=0.999, eps=k * 1e-8, moment="frame", reduction="mean"):
            return original(b1, b2, eps, moment, reduction)

        return variant

    return make


#: PORT-4's gross control of the defaults: the default ε doubled.
EPS_DOUBLED = _eps_default_times(2.0)


def defaults(ctx: Context, wrong: bool, variant: Callable = EPS_DOUBLED) -> Outcome:
    """``RiemannianAdam(params)`` and a ``ChainOptimizer`` of ``chain(scale_by_adam(),
    scale(−1e-3))``, both with their defaults, 4 float64 steps on a (16, 4) frame stack along
    gradients of size 1e-8 (where ε matters), against ``reference.optim.riemannian_adam`` at
    ``PORT_DEFAULTS``: max|W_t − W_t^ref| within 4·``step_error``(16, 4). Control: the default
    ε of ``scale_by_adam`` doubled, substituted into ``torch_port.optim.transforms``."""
    import numpy as np
    import torch

    import reference as ref
    from proofs_checks.bounds import step_error
    from torch_port import RiemannianAdam, Stiefel
    from torch_port.optim import ChainOptimizer, transforms

    g = torch.Generator().manual_seed(ctx.seed)
    w0 = Stiefel(ENDS_D, ENDS_R).random_point(g, dtype=torch.float64)
    grads = [
        DEFAULTS_SCALE * torch.randn(w0.shape, generator=g, dtype=torch.float64) for _ in range(4)
    ]
    rule = ref.optim.riemannian_adam(
        PORT_DEFAULTS["lr"], PORT_DEFAULTS["betas"], PORT_DEFAULTS["eps"]
    )
    geo = ref.Stiefel(ENDS_D, ENDS_R)
    x, expected = w0.numpy().copy(), []
    state = rule.init(geo, x)
    for grad in grads:
        x, state = rule.step(geo, x, grad.numpy(), state)
        expected.append(x)
    builders = {
        "RiemannianAdam(params)": lambda group: RiemannianAdam(group),
        "chain(scale_by_adam(), scale(−lr))": lambda group: ChainOptimizer(
            group,
            lambda grp: transforms.chain(
                transforms.scale_by_adam(), transforms.scale(-PORT_DEFAULTS["lr"])
            ),
        ),
    }
    eps_2 = substituted(transforms, "scale_by_adam", variant(transforms.scale_by_adam))
    worst = 0.0
    with eps_2 if wrong else contextlib.nullcontext():
        for build in builders.values():
            w = torch.nn.Parameter(w0.clone())
            opt = build([{"params": [w], "geometry": "stiefel"}])
            for grad, want in zip(grads, expected, strict=True):
                w.grad = grad.clone()
                opt.step()
                worst = max(worst, float(np.abs(w.detach().numpy() - want).max()))
    return Outcome.bound(
        worst,
        4 * step_error(ENDS_D, ENDS_R),
        "max_t max|W_t − W_t^ref|",
        {
            "sizes": f"one ({ENDS_D}, {ENDS_R}) frame",
            "options": ", ".join(builders),
            "steps": len(grads),
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def defaults_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``defaults``; control, a near miss: the default ε 10·``NEAR_MISS`` relative larger
    (substituted into ``torch_port.optim.transforms``)."""
    return defaults(ctx, wrong, variant=_eps_default_times(1 + 10 * NEAR_MISS))


register(
    Proposition(
        id="PORT-4",
        title="The port at the ends of the dtypes' ranges, and with its defaults",
        statement=(
            r"One step of the port's Riemannian Adam ($\varepsilon=0$) and normalised rule, "
            r"both of degree zero in the gradient, is the same along $cG$ as along $G$ when "
            r"$\|cG\|$ and $W^\top cG$ overflow float32 ($c=2^{127}$) and when the entries of "
            r"$cG$ are float64 subnormals ($c=2^{-1060}$, at $W=[I;0]$ with $G$ tangent "
            r"there), to the rounding of the step and of the subnormal values; and "
            r"\texttt{RiemannianAdam} and "
            r"\texttt{scale\_by\_adam} with their defaults are the rule with "
            r"$\eta=10^{-3}$, $\beta=(0.9,0.999)$, $\varepsilon=10^{-8}$."
        ),
        hypotheses=(
            "Stiefel frames (16, 4), the embedded metric and the polar retraction",
            "one step from a fresh state for the degree claims; 4 steps for the defaults",
        ),
        checks=(
            Check(
                "float64",
                "float32 gradients whose norm overflows",
                overflowing_gradients,
                "frame_rms without its overflow route, substituted into the port",
            ),
            Check(
                "float64",
                "float64 subnormal gradients",
                subnormal_gradients,
                "the step factor's rescaled route removed, substituted into the port",
            ),
            Check(
                "float64",
                "the defaults",
                defaults,
                "scale_by_adam's default ε doubled, substituted into the port",
            ),
            Check(
                "float64",
                "resolution: a default ε 1e-8 relative off is caught",
                defaults_resolution,
                f"near miss: scale_by_adam's default ε times 1 + {10 * NEAR_MISS:g}",
            ),
        ),
        requires=("torch",),
    )
)
