"""PORT-6, PORT-7, PORT-8: what users run around the step — per-group hyperparameters and
schedules, trust caps that bind, skipped steps (eager and capturable), low-precision state, and
the recorder's copies.

As in ``port``, torch and the port are imported inside the checks, and every negative control
substitutes a wrong variant into the port's own code (``harness.substituted``), so the control
goes through the path training takes.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from proofs_checks.bounds import gamma
from proofs_checks.harness import substituted
from proofs_checks.propositions.port import replayed_ratio
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
#: PORT-8: steps of the low-precision runs (past 256, where t + 1 = t in bfloat16).
STATE_STEPS, STATE_STEPS_QUICK = 1000, 300


def brockett(ws: list[Any], costs: list[Any]) -> Any:
    """Σ_k Σ_frames tr(W_kᵀ A_k W_k) (A_k symmetric): a smooth cost whose Riemannian gradient
    never vanishes at a random frame."""
    import torch

    return sum(torch.einsum("...dr,de,...er->", w, a, w) for w, a in zip(ws, costs, strict=True))


def _frames(gen: Any, shapes: tuple[tuple[int, ...], ...], dtype: Any) -> list[Any]:
    """Frame stacks of the given (batch..., d, r) shapes and a symmetric cost per stack."""
    import torch

    import torch_port as tp

    ws, costs = [], []
    for *batch, d, r in shapes:
        ws.append(torch.nn.Parameter(tp.Stiefel(d, r).random_point(gen, tuple(batch)).to(dtype)))
        a = torch.randn(d, d, generator=gen, dtype=torch.float64)
        costs.append(((a + a.T) / (2 * math.sqrt(d))).to(dtype))
    return ws, costs


def schedule(t: int) -> float:
    """The LR factor of step t + 1 (torch's ``LambdaLR`` epoch t): t/W over the warm-up, from
    0, then ½(1 + cos(π(t − W)/(T − W)))."""
    if t < WARMUP:
        return t / WARMUP
    return 0.5 * (1.0 + math.cos(math.pi * (t - WARMUP) / (SCHEDULE_STEPS - WARMUP)))


def _lr_ignored(original: Callable) -> Callable:
    """``optimizer._in_force`` reading the optimizer's default lr instead of the group's."""
    return lambda group: original({**group, "lr": DEFAULT_LR})


def groups_and_schedule(ctx: Context, wrong: bool) -> Outcome:
    """Two groups of float64 frames, St(8, 3)×4 and St(6, 2)×2, with their own learning rates
    ``GROUP_LRS`` (the optimizer's default ``DEFAULT_LR``), under torch's ``LambdaLR`` with
    ``schedule`` (the first step at lr = 0), ``SCHEDULE_STEPS`` steps recorded by
    ``torch_port.audit`` and replayed by ``rattn audit``: residual the largest deviation/bound of
    a step (tolerance 1), and every recorded lr must be the group's lr times the schedule's
    factor, exactly (else the residual is inf). Control: the step reading the default lr
    instead of the group's, substituted for ``torch_port.optim.optimizer._in_force``."""
    import torch

    import torch_port as tp
    from proofs_checks.audit import trace as trace_file
    from torch_port import audit
    from torch_port.optim import optimizer as chain

    gen = torch.Generator().manual_seed(ctx.seed)
    ws, costs = _frames(gen, ((4, 8, 3), (2, 6, 2)), torch.float64)
    opt = tp.RiemannianAdam(
        [
            {"params": [w], "geometry": "stiefel", "lr": lr}
            for w, lr in zip(ws, GROUP_LRS, strict=True)
        ],
        lr=DEFAULT_LR,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    patch = substituted(chain, "_in_force", _lr_ignored(chain._in_force)) if wrong else None
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
    (w,), (a,) = _frames(gen, ((TRUST_FRAMES, 8, 3),), torch.float64)
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


# -- PORT-7: skipped steps ---------------------------------------------------------------------
#: What a scripted run does at each step: a plain step, a NaN in a frame's gradient, an inf in
#: a plain parameter's gradient, a tensor lr set negative, or set to 0 (restored after it).
EAGER_SCRIPT = ("step", "step", "nan-frame", "step", "inf-plain", "step", "step", "step")
CAPTURABLE_SCRIPT = (
    *("step", "step", "nan-frame", "step", "inf-plain", "step"),
    *("negative-lr", "zero-lr", "step", "step"),
)
#: The actions that must change nothing (the others are steps that are taken).
SKIPS = ("nan-frame", "inf-plain", "negative-lr")
SCRIPT_LR, SCRIPT_RADIUS = 0.02, 0.3


def _snapshot(opt: Any) -> dict[str, Any]:
    """A copy of every tensor the optimizer reads or writes: its parameters and every entry of
    every state (counts included), and its skip counters."""
    import torch

    out = {}
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            out[f"params[{gi}][{pi}]"] = p.detach().clone()
            for key, v in opt.state.get(p, {}).items():
                for i, part in enumerate(v if isinstance(v, tuple) else (v,)):
                    if isinstance(part, torch.Tensor):
                        out[f"state[{gi}][{pi}][{key}][{i}]"] = part.detach().clone()
    device = getattr(opt, "skipped_on_device", None)
    out["skipped"] = opt.skipped_steps + (0 if device is None else int(device.item()))
    return out


def _differing(a: dict[str, Any], b: dict[str, Any], names: Callable[[str], bool]) -> list[str]:
    """The names (of those ``names`` accepts) whose values differ bitwise between a and b."""
    import torch

    def same(u: Any, v: Any) -> bool:
        if isinstance(u, torch.Tensor):
            return u.dtype == v.dtype and u.shape == v.shape and bool(torch.equal(u, v))
        return u == v

    return sorted(k for k in a.keys() | b.keys() if names(k) and not same(a.get(k), b.get(k)))


def _scripted_run(script: tuple[str, ...], capturable: bool, seed: int) -> tuple[dict, list[str]]:
    """Run ``script`` on float32 frames St(8, 3)×3 and a plain 4×4 weight: the final snapshot
    and what went wrong on the way (a skipped step that changed something or did not count as
    skipped, an lr = 0 step that moved a parameter or did not advance the counts)."""
    import torch

    import torch_port as tp
    from torch_port.optim import checks

    gen = torch.Generator().manual_seed(seed)
    (w,), (a,) = _frames(gen, ((3, 8, 3),), torch.float32)
    plain = torch.nn.Parameter(torch.randn(4, 4, generator=gen))
    target = torch.randn(4, 4, generator=gen)
    lr = torch.tensor(SCRIPT_LR) if capturable else SCRIPT_LR
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}, {"params": [plain], "weight_decay": 0.01}],
        lr=lr,
        trust_radius=SCRIPT_RADIUS,
        capturable=capturable,
        skip_nonfinite=not capturable,
    )
    problems = []
    for k, action in enumerate(script, 1):
        opt.zero_grad()
        (brockett([w], [a]) + 0.5 * ((plain - target) ** 2).sum()).backward()
        if action == "nan-frame":
            w.grad[0, 0, 0] = math.nan
        elif action == "inf-plain":
            plain.grad[1, 2] = math.inf
        elif action in ("negative-lr", "zero-lr"):
            for group in opt.param_groups:
                group["lr"].fill_(-SCRIPT_LR if action == "negative-lr" else 0.0)
        before = _snapshot(opt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", checks.NonFiniteGradientWarning)
            opt.step()
        after = _snapshot(opt)
        if action in ("negative-lr", "zero-lr"):
            for group in opt.param_groups:
                group["lr"].fill_(SCRIPT_LR)
        if action in SKIPS:
            changed = _differing(before, after, lambda n: n != "skipped")
            counted = after["skipped"] == before["skipped"] + 1
            problems += [f"step {k} ({action}) changed {n}" for n in changed]
            problems += [] if counted else [f"step {k} ({action}) not counted as skipped"]
        elif action == "zero-lr":
            moved = _differing(before, after, lambda n: n.startswith("params"))
            counts = [n for n in after if n.endswith("[step][0]")]
            stuck = [n for n in counts if not bool(after[n] == before.get(n, 0) + 1)]
            problems += [f"step {k} (lr = 0) moved {n}" for n in moved]
            problems += [f"step {k} (lr = 0) did not advance {n}" for n in stuck]
    return after, problems


def _count_advancing(original: Callable) -> Callable:
    """``ChainOptimizer._validate`` that, deciding to skip, advances the points' counts."""

    def variant(self: Any, items: Any, points: Any) -> bool:
        ok = original(self, items, points)
        if not ok:
            for point in points:
                if self.state.get(point.key):
                    self.state[point.key]["step"] += 1
        return ok

    return variant


def _sign_ignored(original: Callable) -> Callable:
    """``capturable.proceeds`` that checks a tensor lr only for finiteness, so a negative lr is
    taken (an ascent)."""
    return lambda grads, lrs, frames: original(grads, [lr.abs() for lr in lrs], frames)


def skipped_steps(ctx: Context, wrong: bool, capturable: bool = False) -> Outcome:
    """A scripted float32 run (``EAGER_SCRIPT``: steps with a NaN frame gradient and an inf
    plain gradient, ``skip_nonfinite=True``; ``CAPTURABLE_SCRIPT`` with ``capturable=True``: the
    same, a tensor lr set negative, and one set to 0): every skipped step leaves every
    parameter, every state entry and every count bitwise as it was and counts as skipped; the
    lr = 0 step moves no parameter and advances every count by one; and the run ends bitwise
    where the same run without the skipped steps ends. Residual: the number of violations,
    tolerance 0. Control (eager): a skip that advances the counts, substituted for
    ``ChainOptimizer._validate``; (capturable) a negative lr taken as an ascent, substituted
    for ``capturable.proceeds``."""
    from torch_port.optim import capturable as device_step
    from torch_port.optim.optimizer import ChainOptimizer

    script = CAPTURABLE_SCRIPT if capturable else EAGER_SCRIPT
    if capturable:
        patch = substituted(device_step, "proceeds", _sign_ignored(device_step.proceeds))
    else:
        patch = substituted(ChainOptimizer, "_validate", _count_advancing(ChainOptimizer._validate))
    with patch if wrong else contextlib.nullcontext():
        end, problems = _scripted_run(script, capturable, ctx.seed)
        clean, _ = _scripted_run(tuple(a for a in script if a not in SKIPS), capturable, ctx.seed)
    problems += [
        f"the run ends off the run without skips at {n}"
        for n in _differing(end, clean, lambda n: n != "skipped")
    ]
    skips = sum(a in SKIPS for a in script)
    return Outcome.bound(
        len(problems),
        0,
        f"{len(problems)} violations over {len(script)} steps, {skips} of them skipped"
        + (f": {'; '.join(problems[:3])}" if problems else ""),
        {
            "sizes": "St(8, 3)×3 and a plain 4×4 weight",
            "steps": ", ".join(script),
            "dtypes": "float32",
            "seeds": ctx.seed,
        },
    )


def capturable_skipped_steps(ctx: Context, wrong: bool) -> Outcome:
    """``skipped_steps`` with ``capturable=True`` on ``CAPTURABLE_SCRIPT``: the same bitwise
    claims, residual the number of violations, tolerance 0."""
    return skipped_steps(ctx, wrong, capturable=True)


# -- PORT-8: what the port stores ----------------------------------------------------------------
def sqrt_v_decay_tolerance(steps: int) -> float:
    """|√v_t/(√v_1·√β2^{t−1}) − 1| ≤ γ_{2(t−1)} in float32 (u = 2⁻²⁴): with a zero gradient each
    step is √v ← fl(fl(√β2)·√v) (hypot(a, 0) = |a| exactly), two roundings a step."""
    return gamma(2 * (steps - 1), 2.0**-24)


def _half_step_count(original: Callable) -> Callable:
    """``ChainOptimizer._new_step`` counting in bfloat16 (t + 1 = t from t = 256)."""
    import torch

    return staticmethod(lambda: original().to(torch.bfloat16))


def _sqrt_v_in_dtype(original: Callable) -> Callable:
    """``transforms.sqrt_v_dtype`` keeping √v in the frame's own dtype."""
    return lambda dtype: dtype


#: PORT-8's resolution: β2 this much too large decays √v 5e-7 relative a step too slowly.
BETA2_NEAR_MISS = 1e-6


def _beta2_raised(original: Callable) -> Callable:
    """``transforms.scale_by_adam`` with β2 + ``BETA2_NEAR_MISS``."""
    return lambda b1=0.9, b2=0.999, *rest, **kw: original(b1, b2 + BETA2_NEAR_MISS, *rest, **kw)


def low_precision_state(ctx: Context, wrong: bool, control: str = "sqrt_v") -> Outcome:
    """RiemannianAdam (lr 1e-3, β2 = 0.999) on St(8, 3)×4 frames in bfloat16 and in float16:
    a random gradient at the first step, zero gradients after it, ``STATE_STEPS`` steps (300
    quick): at every step t, √v_t = √v_1·√β2^{t−1} within ``sqrt_v_decay_tolerance``(t) relative
    (residual: the largest ratio of the error to it, tolerance 1), and the count is t exactly
    (else the residual is inf). Control ("sqrt_v"): √v held in the frame's dtype, substituted
    for ``transforms.sqrt_v_dtype`` (in bfloat16 √β2·√v rounds back to √v); ("count"): the count
    held in bfloat16, substituted for ``ChainOptimizer._new_step``; ("beta2"): β2 raised by
    ``BETA2_NEAR_MISS``, substituted for ``transforms.scale_by_adam``."""
    import torch

    import torch_port as tp
    from torch_port.optim import transforms
    from torch_port.optim.optimizer import ChainOptimizer

    steps = STATE_STEPS_QUICK if ctx.quick else STATE_STEPS
    b2 = 0.999
    patch = {
        "sqrt_v": lambda: substituted(
            transforms, "sqrt_v_dtype", _sqrt_v_in_dtype(transforms.sqrt_v_dtype)
        ),
        "count": lambda: substituted(
            ChainOptimizer, "_new_step", _half_step_count(ChainOptimizer._new_step)
        ),
        "beta2": lambda: substituted(
            transforms, "scale_by_adam", _beta2_raised(transforms.scale_by_adam)
        ),
    }[control]()
    worst, where, miscounted = 0.0, "", []
    with patch if wrong else contextlib.nullcontext():
        for dtype in (torch.bfloat16, torch.float16):
            gen = torch.Generator().manual_seed(ctx.seed)
            (w,), _ = _frames(gen, ((4, 8, 3),), dtype)
            group = {"params": [w], "geometry": "stiefel"}
            opt = tp.RiemannianAdam([group], lr=1e-3, betas=(0.9, b2))
            first = torch.randn(w.shape, generator=gen).to(dtype)
            for t in range(1, steps + 1):
                w.grad = first if t == 1 else torch.zeros_like(w)
                opt.step()
                state = opt.state[w]
                sqrt_v = state["sqrt_v"].to(torch.float64)
                if t == 1:
                    start = sqrt_v
                    continue
                want = start * math.sqrt(b2) ** (t - 1)
                ratio = float(((sqrt_v / want - 1.0).abs()).max()) / sqrt_v_decay_tolerance(t)
                if ratio > worst:
                    worst, where = ratio, f"{dtype} step {t}"
                if float(state["step"]) != t:
                    miscounted.append(f"{dtype} step {t}: count {float(state['step'])}")
    residual = math.inf if miscounted else worst
    return Outcome.bound(
        residual,
        1.0,
        f"max |√v_t/(√v_1·√β2^(t−1)) − 1|/γ_2(t−1) = {worst:.3g} ({where}); counts not t: "
        f"{len(miscounted)}" + (f" (first: {miscounted[0]})" if miscounted else ""),
        {
            "sizes": "St(8, 3)×4",
            "steps": steps,
            "dtypes": "bfloat16, float16",
            "seeds": ctx.seed,
        },
    )


def low_precision_counts(ctx: Context, wrong: bool) -> Outcome:
    """``low_precision_state`` whose control holds the count in bfloat16."""
    return low_precision_state(ctx, wrong, control="count")


def low_precision_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``low_precision_state`` whose control, a near miss, raises β2 by ``BETA2_NEAR_MISS``."""
    return low_precision_state(ctx, wrong, control="beta2")


def _view_of(original: Callable) -> Callable:
    """``audit._array`` keeping a NumPy view of the tensor instead of a copy."""
    return lambda t: t.detach().to("cpu").float().numpy() if t.dtype.itemsize < 4 else t.numpy()


def recorded_copies(ctx: Context, wrong: bool) -> Outcome:
    """A float32 run of RiemannianAdam on an unbatched St(8, 3) frame and a stack St(6, 2)×2,
    four steps recorded by ``torch_port.audit``; independently of the recorder, the check
    copies every point before the step, its gradient, and the point after it: every array of
    the loaded trace ("x", "g", "y") equals its copy bitwise (residual: the number that differ,
    tolerance 0). Control: the recorder keeping views instead of copies, substituted for
    ``torch_port.audit._array`` (the step then overwrites what was recorded)."""
    import torch

    import torch_port as tp
    from proofs_checks.audit import trace as trace_file
    from torch_port import audit

    gen = torch.Generator().manual_seed(ctx.seed)
    ws, costs = _frames(gen, ((8, 3), (2, 6, 2)), torch.float32)
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"} for w in ws], lr=0.05, trust_radius=0.3
    )
    seen: dict[tuple[int, int], dict[str, list]] = {}
    patch = substituted(audit, "_array", _view_of(audit._array)) if wrong else None
    with patch or contextlib.nullcontext(), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.npz"
        with audit.record(opt, path):
            for t in range(1, 5):
                opt.zero_grad()
                brockett(ws, costs).backward()
                for gi, w in enumerate(ws):
                    seen[(gi, t)] = {"x": [w.detach().clone()], "g": [w.grad.clone()]}
                opt.step()
                for gi, w in enumerate(ws):
                    seen[(gi, t)]["y"] = [w.detach().clone()]
        trace = trace_file.load(path)
    differ, compared = [], 0
    for k, record in enumerate(trace.meta["steps"]):
        copies = seen[(record["group"], record["step"])]
        for what, want in copies.items():
            got = trace.parts(k, what)
            compared += len(want)
            same = len(got) == len(want) and all(
                torch.equal(torch.from_numpy(g).reshape(c.shape), c)
                for g, c in zip(got, want, strict=True)
            )
            if not same:
                differ.append(f"record {k} {what}")
    return Outcome.bound(
        len(differ) if compared else math.inf,
        0,
        f"{len(differ)} of {compared} recorded arrays differ from the step's own copies"
        + (f": {', '.join(differ[:3])}" if differ else ""),
        {
            "sizes": "St(8, 3) unbatched and St(6, 2)×2",
            "steps": 4,
            "dtypes": "float32",
            "seeds": ctx.seed,
        },
    )


register(
    Proposition(
        id="PORT-6",
        title="Per-group learning rates, schedules and trust caps that bind are the reference's",
        statement=(
            r"In a run of \texttt{RiemannianAdam} on parameter groups with their own learning "
            r"rates under a \texttt{torch.optim.lr\_scheduler}, every step of every group lands "
            r"within PORT-1's bound $B$ of the float64 reference step taken at that group's "
            r"scheduled learning rate (a step at lr $=0$ not moving), and the learning rate the "
            r"recorder reads is the group's rate times the schedule's factor, exactly. Where the "
            r"trust cap $\|\xi\|\le\Delta$ binds, the step is the reference's capped step within "
            r"the same bound."
        ),
        hypotheses=(
            f"float64 frames; {SCHEDULE_STEPS} steps of LambdaLR (a linear warm-up from lr = 0 "
            f"over {WARMUP} steps, then a cosine); two groups",
            f"the trust run binds on a fraction of its frame-steps in {BINDING_RANGE}",
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
        ),
        requires=("torch",),
    )
)

register(
    Proposition(
        id="PORT-7",
        title="A skipped step changes nothing, eager or capturable",
        statement=(
            r"A step of \texttt{RiemannianAdam} skipped for a non-finite gradient "
            r"(\texttt{skip\_nonfinite=True}, or \texttt{capturable=True}), or in a capturable "
            r"run for a negative tensor learning rate, leaves every parameter, every state entry "
            r"and every step count bitwise as it was and is counted as skipped; a step at a "
            r"tensor lr $=0$ moves no parameter and advances every count by one; and the run "
            r"ends bitwise where the same run without the skipped steps ends."
        ),
        hypotheses=(
            "float32 frames and plain parameters on the CPU (bitwise: one device, one order of "
            "operations)",
            "the scripted runs of EAGER_SCRIPT and CAPTURABLE_SCRIPT",
        ),
        checks=(
            Check(
                "float64",
                "eager: NaN and inf gradients skipped, the run against the run without them",
                skipped_steps,
                "near miss: a skipped step that advances the step counts by one, substituted "
                "into the port",
            ),
            Check(
                "float64",
                "capturable: NaN and inf gradients and a negative lr skipped, an lr = 0 step",
                capturable_skipped_steps,
                "a negative tensor lr taken as an ascent, substituted into the port",
            ),
        ),
        requires=("torch",),
    )
)

register(
    Proposition(
        id="PORT-8",
        title="Low-precision state keeps decaying and counting; the recorder keeps copies",
        statement=(
            r"For bfloat16 and float16 frames, the frame moment's $\sqrt v$ decays as "
            r"$\sqrt{v_t}=\sqrt{v_1}\,\beta_2^{(t-1)/2}$ once the gradient is zero, within "
            r"$\gamma_{2(t-1)}$ relative in float32, and the step count is $t$ exactly, over "
            rf"{STATE_STEPS} steps; and every point, gradient and new point the recorder "
            r"(\texttt{torch\_port.audit}) writes is bitwise the value the step saw or made."
        ),
        hypotheses=(
            "β2 = 0.999, lr = 1e-3; a random gradient at the first step, zero after it",
            "the recording: float32 frames, unbatched and batched, four steps",
        ),
        checks=(
            Check(
                "float64",
                f"√v and the count over {STATE_STEPS} steps (300 quick) in bfloat16 and float16",
                low_precision_state,
                "√v held in the frame's dtype, substituted into the port",
            ),
            Check(
                "float64",
                "the count past 256 steps",
                low_precision_counts,
                "the count held in bfloat16, substituted into the port",
            ),
            Check(
                "float64",
                f"resolution: β2 {BETA2_NEAR_MISS:g} too large is caught",
                low_precision_resolution,
                f"near miss: β2 + {BETA2_NEAR_MISS:g}, substituted into the port",
            ),
            Check(
                "float64",
                "the recorded arrays against the step's own copies",
                recorded_copies,
                "the recorder keeping views instead of copies, substituted into the port",
            ),
        ),
        requires=("torch",),
    )
)
