"""PORT-6: what users set around the step — per-group learning rates under a schedule, and trust
caps that bind — replayed by ``rattn audit`` against the reference.

As in ``port``, torch and the port are imported inside the checks, and every negative control
substitutes a wrong variant into the port's own code (``harness.substituted``), so the control
goes through the path training takes.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from proofs_checks.harness import substituted
from proofs_checks.propositions.port import replayed_ratio, replayed_run
from proofs_checks.propositions.port_frames import brockett, frames_and_costs
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: PORT-6: the groups' own learning rates, the optimizer's default (which a group's lr must
#: override), and the schedule's length and warm-up (a linear warm-up from lr = 0, then a cosine).
GROUP_LRS, DEFAULT_LR = (0.05, 0.02), 1e-3
SCHEDULE_STEPS, WARMUP = 12, 3
#: PORT-6's trust-cap run: St(8, 3) frames, steps, step size, radius, and the gradient noise
#: that makes ‖m̂‖/√v̂ vary, so that the cap binds on some frame-steps and not on others.
TRUST_FRAMES, TRUST_STEPS, TRUST_LR, TRUST_RADIUS, TRUST_NOISE = 8, 12, 0.05, 0.2, 0.1
#: The fraction of frame-steps on which the cap must bind for the check to mean anything.
BINDING_RANGE = (0.2, 0.8)
#: The near miss of the cap: Δ·(1 + this), invisible wherever the cap does not bind.
TRUST_NEAR_MISS = 2e-12


def schedule(t: int) -> float:
    """The LR factor of step t + 1 (torch's ``LambdaLR`` epoch t): t/W over the warm-up, from
    0, then ½(1 + cos(π(t − W)/(T − W)))."""
    if t < WARMUP:
        return t / WARMUP
    return 0.5 * (1.0 + math.cos(math.pi * (t - WARMUP) / (SCHEDULE_STEPS - WARMUP)))


def _lr_ignored(original: Callable) -> Callable:
    """``guard._in_force`` reading the optimizer's default lr instead of the group's."""
    return lambda group: original({**group, "lr": DEFAULT_LR})


def groups_and_schedule(ctx: Context, wrong: bool) -> Outcome:
    """Two groups of float64 frames, St(8, 3)×4 and St(6, 2)×2, with their own learning rates
    ``GROUP_LRS`` (the optimizer's default ``DEFAULT_LR``), under torch's ``LambdaLR`` with
    ``schedule`` (the first step at lr = 0), ``SCHEDULE_STEPS`` steps recorded by
    ``torch_port.audit`` and replayed by ``rattn audit``: residual the largest deviation/bound of
    a step (tolerance 1), and every recorded lr must be the group's lr times the schedule's
    factor, exactly (else the residual is inf). Control: the step reading the default lr
    instead of the group's, substituted for ``torch_port.optim.guard._in_force``."""
    import torch

    import torch_port as tp
    from proofs_checks.audit import trace as trace_file
    from torch_port import audit
    from torch_port.optim import guard

    gen = torch.Generator().manual_seed(ctx.seed)
    ws, costs = frames_and_costs(gen, ((4, 8, 3), (2, 6, 2)), torch.float64)
    opt = tp.RiemannianAdam(
        [
            {"params": [w], "geometry": "stiefel", "lr": lr}
            for w, lr in zip(ws, GROUP_LRS, strict=True)
        ],
        lr=DEFAULT_LR,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    patch = substituted(guard, "_in_force", _lr_ignored(guard._in_force)) if wrong else None
    with patch or contextlib.nullcontext(), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.npz"
        with audit.record(opt, path):
            for _ in range(SCHEDULE_STEPS):
                opt.zero_grad()
                brockett(ws, costs).backward()
                opt.step()
                sched.step()
        ratio, step = replayed_ratio(path)
        records = trace_file.load(path).meta["steps"]
    wrong_lrs = [
        (r["step"], r["group"], r["hyperparameters"]["lr"])
        for r in records
        if r["hyperparameters"]["lr"] != GROUP_LRS[r["group"]] * schedule(r["step"] - 1)
    ]
    residual = math.inf if wrong_lrs else ratio
    return Outcome.bound(
        residual,
        1.0,
        f"max deviation/bound {ratio:.3g} (step {step}) over {len(records)} records; recorded "
        f"lrs not the group's × schedule: {wrong_lrs[:3] or 'none'}",
        {
            "sizes": "St(8, 3)×4 and St(6, 2)×2 in two groups",
            "hyperparameters": f"group lrs {GROUP_LRS}, default {DEFAULT_LR}, LambdaLR",
            "steps": SCHEDULE_STEPS,
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


@contextlib.contextmanager
def _binding_counted(transforms: Any) -> Iterator[list[int]]:
    """[frame-steps where the cap binds, frame-steps capped]: counted from the step factors
    ``transforms._trust_capped`` (whatever is installed) is given and returns."""
    counts = [0, 0]
    capped = transforms._trust_capped

    def counting(c: Any, n: Any, radius: float) -> Any:
        out = capped(c, n, radius)
        counts[0] += int((out != c).sum())
        counts[1] += out.numel()
        return out

    with substituted(transforms, "_trust_capped", counting):
        yield counts


def _cap_stretched(k: float) -> Callable:
    def make(original: Callable) -> Callable:
        return lambda c, n, radius: original(c, n, k * radius)

    return make


def binding_trust_cap(ctx: Context, wrong: bool) -> Outcome:
    """``TRUST_FRAMES`` float64 frames of St(8, 3), RiemannianAdam (lr ``TRUST_LR``, trust
    radius ``TRUST_RADIUS``) on a Brockett cost plus a fresh random linear term per step (scale
    ``TRUST_NOISE``, so that ‖m̂‖/√v̂ varies), ``TRUST_STEPS`` steps recorded and replayed by
    ``rattn audit`` (residual: the largest deviation/bound, tolerance 1); the cap must bind on a
    fraction of the frame-steps within ``BINDING_RANGE`` (else the residual is inf: a run where
    it never binds shows nothing of it). Control, a near miss visible only where the cap binds:
    the cap at Δ·(1 + ``TRUST_NEAR_MISS``), substituted for ``transforms._trust_capped``."""
    import torch

    import torch_port as tp
    from torch_port import audit
    from torch_port.optim import transforms

    gen = torch.Generator().manual_seed(ctx.seed)
    (w,), (a,) = frames_and_costs(gen, ((TRUST_FRAMES, 8, 3),), torch.float64)
    noise = [
        TRUST_NOISE * torch.randn(w.shape, generator=gen, dtype=torch.float64)
        for _ in range(TRUST_STEPS)
    ]
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}], lr=TRUST_LR, trust_radius=TRUST_RADIUS
    )
    stretch = _cap_stretched(1.0 + TRUST_NEAR_MISS)
    patch = substituted(transforms, "_trust_capped", stretch(transforms._trust_capped))
    with (
        patch if wrong else contextlib.nullcontext(),
        _binding_counted(transforms) as counts,
        tempfile.TemporaryDirectory() as tmp,
    ):
        path = Path(tmp) / "trace.npz"
        with audit.record(opt, path):
            for n in noise:
                opt.zero_grad()
                (brockett([w], [a]) + (n * w).sum()).backward()
                opt.step()
        ratio, step = replayed_ratio(path)
    binding = counts[0] / counts[1] if counts[1] else 0.0
    low, high = BINDING_RANGE
    residual = ratio if low <= binding <= high else math.inf
    return Outcome.bound(
        residual,
        1.0,
        f"max deviation/bound {ratio:.3g} (step {step}); the cap binds on {counts[0]} of "
        f"{counts[1]} frame-steps ({binding:.0%}, required {low:.0%}–{high:.0%})",
        {
            "sizes": f"{TRUST_FRAMES} frames of St(8, 3)",
            "hyperparameters": f"lr {TRUST_LR}, trust radius {TRUST_RADIUS}",
            "steps": TRUST_STEPS,
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


#: PORT-6's defaults: each preset with the lr it requires (RiemannianAdam: none, so torch's),
#: the reference preset of the same name, and the steps of the comparison.
DEFAULT_PRESETS = {
    "RiemannianAdam": ("riemannian_adam", None),
    "ChainOptimizer": ("riemannian_adam", None),  # of ``group_adam``, reading its group
    "RiemannianMomentum": ("riemannian_momentum", 0.05),
    "RSGD": ("rsgd", 0.05),
    "NormalizedRSGD": ("normalized_rsgd", 0.05),
}
DEFAULT_STEPS = 3


def group_adam(group: dict[str, Any]) -> Any:
    """A rule of one's own that reads its group: chain(scale_by_adam(β1, β2, ε), scale(−lr))."""
    from torch_port.optim import transforms as T

    return T.chain(T.scale_by_adam(*group["betas"], group["eps"]), T.scale(-group["lr"]))


def default_moved(init: Callable, name: str, value: Any) -> Callable:
    """An optimizer's ``__init__`` whose default for the argument ``name`` is ``value``."""

    def wrapped(self, params, *args, **kwargs):
        kwargs.setdefault(name, value)
        return init(self, params, *args, **kwargs)

    return wrapped


def defaults(ctx: Context, wrong: bool) -> Outcome:
    """Each preset built as a user builds it, with no hyperparameter but the lr it requires
    (``DEFAULT_PRESETS``; ``ChainOptimizer`` of ``group_adam``, with no hyperparameter at
    all), on an St(8, 3) float64 frame and a plain 4×3 parameter,
    ``DEFAULT_STEPS`` steps: the frame against the reference preset of the same name with its
    own defaults and the same lr (RiemannianAdam's: ``torch.optim.Adam``'s default lr), within
    ``trajectory_tolerance(8, 3, steps)``; the plain parameter against ``torch.optim.Adam`` with
    its defaults and the same lr, within 4·u·max|p| per step (one AdamW update rounded in
    another order). Residual: the largest ratio, tolerance 1. Control: RiemannianAdam's and
    ChainOptimizer's default lr moved from torch's 1e-3 to 2e-3 (their ``__init__``
    substituted)."""
    import numpy as np
    import torch

    import reference as ref
    import torch_port as tp
    from proofs_checks.bounds import FLOAT64_U, trajectory_tolerance
    from torch_port.optim import ChainOptimizer

    torch_lr = torch.optim.Adam([torch.zeros(1)]).defaults["lr"]
    frame_tol = trajectory_tolerance(8, 3, DEFAULT_STEPS)
    worst, details = 0.0, []
    patches = [
        substituted(cls, "__init__", default_moved(cls.__init__, "lr", 2e-3))
        for cls in (tp.RiemannianAdam, ChainOptimizer)
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches if wrong else ():
            stack.enter_context(patch)
        for name, (reference_name, lr) in DEFAULT_PRESETS.items():
            gen = torch.Generator().manual_seed(ctx.seed)
            w = torch.nn.Parameter(tp.Stiefel(8, 3).random_point(gen, dtype=torch.float64))
            p = torch.nn.Parameter(torch.randn(4, 3, generator=gen, dtype=torch.float64))
            q = torch.nn.Parameter(p.detach().clone())
            given = {} if lr is None else {"lr": lr}
            groups = [{"params": [w], "geometry": "stiefel"}, {"params": [p]}]
            rule = (group_adam,) if name == "ChainOptimizer" else ()
            opt = (ChainOptimizer if rule else getattr(tp, name))(groups, *rule, **given)
            adam = torch.optim.Adam([q], **given)
            reference = getattr(ref.optim, reference_name)(lr=torch_lr if lr is None else lr)
            geo, x = ref.Stiefel(8, 3), w.detach().numpy().copy()
            state = reference.init(geo, x)
            for _ in range(DEFAULT_STEPS):
                g, h = (
                    torch.randn(s, generator=gen, dtype=torch.float64) for s in ((8, 3), (4, 3))
                )
                w.grad, p.grad, q.grad = g, h, h.clone()
                opt.step()
                adam.step()
                x, state = reference.step(geo, x, g.numpy(), state)
            frame = float(np.abs(w.detach().numpy() - x).max()) / frame_tol
            plain_tol = 4 * FLOAT64_U * DEFAULT_STEPS * float(q.detach().abs().max())
            plain = float((p - q).detach().abs().max()) / plain_tol
            worst = max(worst, frame, plain)
            details.append(f"{name}: frame {frame:.3g}, plain {plain:.3g}")
    return Outcome.bound(
        worst,
        1.0,
        "deviation / bound with the defaults: " + "; ".join(details),
        {
            "sizes": "St(8, 3) and a plain 4×3 parameter",
            "options": ", ".join(DEFAULT_PRESETS),
            "steps": DEFAULT_STEPS,
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


#: PORT-6's ascent run: RiemannianAdam's lr, the coupled decay λ of the factored geometries'
#: groups (frames take none: RA-5), and the steps of each geometry's base problem.
ASCENT_LR, ASCENT_DECAY, ASCENT_STEPS = 1e-2, 0.1, 3


def _with(**changed: Callable[[Any], Any]) -> Callable[[Callable], Callable]:
    """``update.move`` reading each named group entry through its function (a wrong variant:
    e.g. ``maximize`` read as False, the decay doubled)."""

    def make(original: Callable) -> Callable:
        def move(geometry, rule, group, *rest):
            seen = {**group, **{k: f(group[k]) for k, f in changed.items()}}
            return original(geometry, rule, seen, *rest)

        return move

    return make


def ascent_and_decay(ctx: Context, wrong: bool, variant: Callable) -> Outcome:
    """The base problem of every geometry of ``rattn compare`` (PORT-1's float64 Adam cases),
    RiemannianAdam (lr ``ASCENT_LR``) with torch's ``maximize`` and, on the factored geometries'
    groups, coupled decay λ = ``ASCENT_DECAY`` (added to the Euclidean gradient after its
    negation), ``ASCENT_STEPS`` steps ascending the loss, recorded and replayed by ``rattn audit``
    (the reference's step for the gradient −G + λ·x): residual the largest deviation/bound,
    tolerance 1. ``variant`` (the control) is substituted for ``torch_port.optim.update.move``."""
    import warnings

    import torch_port as tp
    from proofs_checks.port_compare.problems import PROBLEMS
    from proofs_checks.propositions.port import _float64_adam_cases
    from torch_port.optim import update
    from torch_port.optim.guard import values

    cases = _float64_adam_cases(ctx.quick)
    worst, where, decayed = 0.0, "", []
    patch = substituted(update, "move", variant(update.move)) if wrong else None
    with patch or contextlib.nullcontext(), tempfile.TemporaryDirectory() as tmp:
        for geometry, problem, _, _ in cases:
            prob = PROBLEMS[geometry][problem]
            decay = {} if geometry in values.FRAME_GEOMETRIES else {"weight_decay": ASCENT_DECAY}
            decayed += [geometry] if decay else []

            def make(params, prob=prob, decay=decay):
                group = {**prob.adapter.group(params), **decay}
                return tp.RiemannianAdam([group], lr=ASCENT_LR, maximize=True)

            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no decay on frames: no warning to hide
                ratio, step = replayed_run(prob.build(ctx.seed), make, ASCENT_STEPS, tmp)
            if ratio > worst:
                worst, where = ratio, f"{geometry}/{problem} step {step}"
    return Outcome.bound(
        worst,
        1.0,
        f"max deviation/bound over {len(cases)} geometries; worst at {where}; coupled decay "
        f"on {len(decayed)} of them",
        {
            "geometries": ", ".join(c[0] for c in cases),
            "hyperparameters": f"lr {ASCENT_LR}, maximize, weight_decay {ASCENT_DECAY} "
            f"(coupled) on {', '.join(decayed)}",
            "steps": f"{ASCENT_STEPS} per geometry",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def ascent(ctx: Context, wrong: bool) -> Outcome:
    """``ascent_and_decay``; control: ``maximize`` read as False by the move."""
    return ascent_and_decay(ctx, wrong, _with(maximize=lambda _: False))


def coupled_decay(ctx: Context, wrong: bool) -> Outcome:
    """``ascent_and_decay``; control: the coupled decay λ doubled in the move."""
    return ascent_and_decay(ctx, wrong, _with(weight_decay=lambda wd: 2 * wd))


register(
    Proposition(
        id="PORT-6",
        title=(
            "Per-group learning rates, schedules, trust caps that bind, maximize and coupled "
            "decay are the reference's"
        ),
        statement=(
            r"In a run of \texttt{RiemannianAdam} on parameter groups with their own learning "
            r"rates under a \texttt{torch.optim.lr\_scheduler}, every step of every group lands "
            r"within PORT-1's bound $B$ of the float64 reference step taken at that group's "
            r"scheduled learning rate (a step at lr $=0$ not moving), and the learning rate the "
            r"recorder reads is the group's rate times the schedule's factor, exactly. Where the "
            r"trust cap $\|\xi\|\le\Delta$ binds, the step is the reference's capped step within "
            r"the same bound. With torch's \texttt{maximize} every step is, within the same "
            r"bound, the reference's step for the gradient $-G$ ($-G+\lambda x$ with coupled "
            r"decay $\lambda$ on the factored geometries). Each preset, and a "
            r"\texttt{ChainOptimizer} of a rule that reads its group, built with no "
            r"hyperparameter but the lr it requires "
            r"(\texttt{RiemannianAdam}: none) steps frames as the reference preset with its "
            r"defaults (and \texttt{torch.optim.Adam}'s default lr), and plain parameters as "
            r"\texttt{torch.optim.Adam} with its defaults."
        ),
        hypotheses=(
            f"float64 frames; {SCHEDULE_STEPS} steps of LambdaLR (a linear warm-up from lr = 0 "
            f"over {WARMUP} steps, then a cosine); two groups",
            f"the trust run binds on a fraction of its frame-steps in {BINDING_RANGE}",
            f"the ascent run: each geometry's base problem, {ASCENT_STEPS} steps, λ = "
            f"{ASCENT_DECAY} on the factored geometries",
        ),
        checks=(
            Check(
                "float64",
                "two groups with their own lrs under LambdaLR, replayed by rattn audit",
                groups_and_schedule,
                "the step reading the optimizer's default lr instead of the group's, "
                "substituted into the port",
            ),
            Check(
                "float64",
                "a run where the trust cap binds on about half the frame-steps, replayed",
                binding_trust_cap,
                f"near miss: the cap at Δ·(1 + {TRUST_NEAR_MISS:g}), substituted into the port "
                "(visible only where the cap binds)",
            ),
            Check(
                "float64",
                "maximize on every geometry, replayed by rattn audit",
                ascent,
                "the move reading maximize as False, substituted into the port",
            ),
            Check(
                "float64",
                "coupled decay on the factored geometries under maximize, replayed",
                coupled_decay,
                "the move's coupled decay λ doubled, substituted into the port",
            ),
            Check(
                "float64",
                "each preset with its defaults: the reference's and torch's Adam's",
                defaults,
                "RiemannianAdam's and ChainOptimizer's default lr moved from torch's 1e-3 to "
                "2e-3, substituted into the port",
            ),
        ),
        requires=("torch",),
    )
)
