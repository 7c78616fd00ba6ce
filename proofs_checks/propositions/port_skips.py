"""PORT-7: a skipped step (a non-finite gradient, eager or capturable, or a negative tensor lr in
a capturable run) changes nothing, bitwise, and counts as skipped; a step at lr = 0 advances the
counts only.

As in ``port``, torch and the port are imported inside the checks, and every negative control
substitutes a wrong variant into the port's own code (``harness.substituted``), so the control
goes through the path training takes.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable
from typing import Any

from proofs_checks.harness import substituted
from proofs_checks.propositions.port_frames import brockett, frames_and_costs
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

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
    (w,), (a,) = frames_and_costs(gen, ((3, 8, 3),), torch.float32)
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
    """``ChainOptimizer.check_step`` that, deciding to skip, advances the points' counts."""

    def variant(self: Any, items: Any, mode: str = "careful") -> Any:
        checked = original(self, items, mode)
        if checked is None:
            for gi, group in enumerate(self.param_groups):
                if group.get("geometry") is None:
                    continue
                for point in self._geometries.points(gi, group):
                    if self.state.get(point.key):
                        self.state[point.key]["step"] += 1
        return checked

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
    ``ChainOptimizer.check_step``; (capturable) a negative lr taken as an ascent, substituted
    for ``capturable.proceeds``."""
    from torch_port.optim import capturable as device_step
    from torch_port.optim.optimizer import ChainOptimizer

    script = CAPTURABLE_SCRIPT if capturable else EAGER_SCRIPT
    if capturable:
        patch = substituted(device_step, "proceeds", _sign_ignored(device_step.proceeds))
    else:
        patch = substituted(
            ChainOptimizer, "check_step", _count_advancing(ChainOptimizer.check_step)
        )
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
