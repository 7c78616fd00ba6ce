"""PORT-1: the torch port's steps that training runs are the reference's, within their rounding
bounds (every geometry, rule and dtype of ``rattn compare``, replayed by ``rattn audit``).

Every PORT proposition needs torch (``requires``): ``rattn certify`` lists them as not run where
it is missing. torch and the port are imported inside the checks, so the registry loads without
them. Each negative control substitutes a wrong variant into the port's own code (its module
attribute, for the duration of the control) rather than branching inside the check, so the
control goes through the path training takes.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from proofs_checks.harness import substituted
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: The near-miss controls' relative error of a step (PORT-3; PORT-4's ε: ten times it), and
#: PORT-1's on float64 steps, whose bounds are a few u (30× the bound at 3e-12).
NEAR_MISS, FLOAT64_NEAR_MISS = 1e-9, 3e-12
#: Steps of every PORT-1 case (enough for the state carried between steps to be checked twice).
AGREEMENT_STEPS = 3


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
    from proofs_checks.audit.verdicts import row_ratio

    worst, where = 0.0, 0
    for row in replay.audit(path)["steps"]:
        ratio = row_ratio(row)
        if row["verdict"] == "fail":  # e.g. a point the port would not accept
            # a failed step's state is not compared (its ratio is then inf): where its point is
            # past the bound, that ratio is the step's, the resolution a near miss shows
            measured = row["deviation"] is not None and row["bound"]
            point = row["deviation"] / row["bound"] if measured else math.inf
            ratio = point if point > 1.0 else max(ratio, math.nextafter(1.0, 2.0))
        if ratio > worst:
            worst, where = ratio, row["step"]
    return worst, where


def replayed_run(
    inst: Any, make: Callable, steps: int, directory: str, dtype: Any = None
) -> tuple[float, int]:
    """A ``port_compare`` problem instance's points as parameters (float64, or ``dtype``), the
    optimizer ``make(params)`` over them, ``steps`` steps of the instance's loss recorded by
    ``torch_port.audit`` in ``directory`` and replayed by ``rattn audit``: ``replayed_ratio``."""
    import torch

    from torch_port import audit

    dt = torch.float64 if dtype is None else dtype
    params = [torch.nn.Parameter(torch.tensor(p).to(dt)) for p in inst.points]
    data = {k: torch.tensor(v).to(dt) for k, v in inst.data.items()}
    opt = make(params)
    path = Path(directory) / "trace.npz"
    with audit.record(opt, path):
        for _ in range(steps):
            opt.zero_grad()
            inst.loss(params, data).backward()
            opt.step()
    return replayed_ratio(path)


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
            ratio, step = replayed_run(
                prob.build(ctx.seed),
                lambda params, prob=prob, rule=rule: RULES[rule].port([prob.adapter.group(params)]),
                AGREEMENT_STEPS,
                tmp,
                getattr(torch, dtype),
            )
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
