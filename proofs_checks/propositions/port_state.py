"""PORT-8: what the port stores: low-precision state that keeps decaying and counting, and the
recorder's copies of every point and gradient.

As in ``port``, torch and the port are imported inside the checks, and every negative control
substitutes a wrong variant into the port's own code (``harness.substituted``), so the control
goes through the path training takes.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from proofs_checks.bounds import gamma
from proofs_checks.harness import substituted
from proofs_checks.propositions.port_frames import brockett, frames_and_costs
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: PORT-8: steps of the low-precision runs (past 256, where t + 1 = t in bfloat16).
STATE_STEPS, STATE_STEPS_QUICK = 1000, 300


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
            (w,), _ = frames_and_costs(gen, ((4, 8, 3),), dtype)
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


def _sampled_steps(ws: list, costs: list, path: Path) -> list[tuple[int, int]]:
    """(group, step) of each record of 6 steps of RiemannianAdam on ``ws`` recorded with
    ``every=3`` on ``ranks=[0]`` (this process's rank)."""
    import torch_port as tp
    from proofs_checks.audit import trace as trace_file
    from torch_port import audit

    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"} for w in ws], lr=0.05, trust_radius=0.3
    )
    with audit.record(opt, path, every=3, ranks=[0]):
        for _ in range(6):
            opt.zero_grad()
            brockett(ws, costs).backward()
            opt.step()
    return [(r["group"], r["step"]) for r in trace_file.load(path).meta["steps"]]


def recorded_copies(ctx: Context, wrong: bool) -> Outcome:
    """A float32 run of RiemannianAdam on an unbatched St(8, 3) frame and a stack St(6, 2)×2,
    four steps recorded by ``torch_port.audit``; independently of the recorder, the check
    copies every point before the step, its gradient, and the point after it: every array of
    the loaded trace ("x", "g", "y") equals its copy bitwise; and 6 more steps recorded with
    ``every=3`` on ``ranks=[0]`` give the records of steps 3 and 6 of each group, in order
    (residual: the number of arrays that differ, plus one for other records; tolerance 0).
    Control: the recorder keeping views instead of copies, substituted for
    ``torch_port.audit._array`` (the step then overwrites what was recorded)."""
    import torch

    import torch_port as tp
    from proofs_checks.audit import trace as trace_file
    from torch_port import audit

    gen = torch.Generator().manual_seed(ctx.seed)
    ws, costs = frames_and_costs(gen, ((8, 3), (2, 6, 2)), torch.float32)
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
        sampled = _sampled_steps(ws, costs, Path(tmp) / "sampled.npz")
    differ, compared = [], 0
    if sampled != [(gi, t) for t in (3, 6) for gi in range(len(ws))]:
        differ.append(f"the steps recorded with every=3, ranks=[0]: {sampled}")
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
        id="PORT-8",
        title="Low-precision state keeps decaying and counting; the recorder keeps copies",
        statement=(
            r"For bfloat16 and float16 frames, the frame moment's $\sqrt v$ decays as "
            r"$\sqrt{v_t}=\sqrt{v_1}\,\beta_2^{(t-1)/2}$ once the gradient is zero, within "
            r"$\gamma_{2(t-1)}$ relative in float32, and the step count is $t$ exactly, over "
            rf"{STATE_STEPS} steps; and every point, gradient and new point the recorder "
            r"(\texttt{torch\_port.audit}) writes is bitwise the value the step saw or made; "
            r"recording every $k$-th step on named ranks records steps $k, 2k, \dots$ of every "
            r"point there."
        ),
        hypotheses=(
            "β2 = 0.999, lr = 1e-3; a random gradient at the first step, zero after it",
            "the recording: float32 frames, unbatched and batched, four steps; then six "
            "recorded with every=3 on ranks=[0]",
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
