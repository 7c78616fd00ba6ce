"""REF-2: the reference's momentum, fixed-step, normalised and AdamW rules are their rules, to
float64 rounding.

As REF-1 for Adam: ``reference.optim.riemannian_momentum`` (with explicit arguments and with its
defaults), ``rsgd`` (with and without its trust region), ``normalized_rsgd`` and ``adamw`` (with
all of its defaults, on a plain array) in float64 against the independent mpmath transcriptions
of ``reference.mp`` at 50 digits. The defaults are DESIGN §5's (β = 0.9, c = 1) and torch's
documented AdamW ones (lr 1e-3, betas (0.9, 0.999), ε 1e-8, λ 1e-2), written here and not read
from the code. Each control substitutes into ``reference.optim`` a transformation wrong by little
(so the preset builds its chain from it): the momentum's cap at 2c, its momentum left
untransported, the trust radius doubled, the RMS taken over the manifold's dimension
d·r − r(r + 1)/2 instead of the d·r entries, AdamW's weight decay 1% larger.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import NamedTuple

import mpmath
import numpy as np

import reference as ref
from proofs_checks.bounds import adamw_tolerance, trajectory_tolerance
from proofs_checks.harness import frame_problem, substituted
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference import optim as ro

#: St(6, 3), 4 steps; lr·sqrt(d·r) = 0.21 ≤ 1/2 as the tolerance assumes.
SIZE_D, SIZE_R, STEPS = 6, 3, 4
LR = 0.05
#: The momentum's β and cap (‖M‖ ≈ (1 − β)·sqrt(d·r) < c at first: both branches are taken);
#: the trust radius binds (‖lr·g‖ ≈ 0.2 > Δ).
BETA, CAP, RADIUS = 0.9, 0.5, 0.1
#: A second run of each frame rule at other hyperparameters: a short momentum memory with a cap
#: that does not bind, a shorter fixed step, a longer one under a tighter radius (lr·sqrt(d·r) =
#: 0.42 ≤ 1/2).
OTHER = {"lr": 0.02, "beta": 0.5, "c": 2.0, "lr_capped": 0.1, "radius": 0.03}
DIGITS = 50
#: The defaults the presets document: riemannian_momentum's (DESIGN §5) and torch's AdamW's.
MOMENTUM_DEFAULTS = {"beta": 0.9, "c": 1.0}
ADAMW_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}


class Rule(NamedTuple):
    """A rule's runs, each (the reference's optimizer, the transcription's trajectory), on one
    problem (geometry, start, gradients from a seed) with the bound of its float64 trajectory."""

    runs: tuple[tuple[Callable, Callable], ...]
    problem: Callable[[int], tuple]
    tolerance: Callable[[tuple], float]


def _frames(seed: int) -> tuple:
    prob = frame_problem(SIZE_D, SIZE_R, STEPS, seed)
    return prob.geometry, prob.w0, prob.grads


def _plain(seed: int) -> tuple:
    """A plain (6, 3) array and gradients whose entries range over 10^-10 … 10 (each a
    Gaussian times 10^U(−10, 1)), so that ε = 1e-8 is neither negligible nor dominant for some
    entries of √v̂ + ε."""
    rng = np.random.default_rng([seed, 2])
    shape = (SIZE_D, SIZE_R)
    grads = [rng.standard_normal(shape) * 10.0 ** rng.uniform(-10, 1, shape) for _ in range(STEPS)]
    return ref.Euclidean(*shape), rng.standard_normal(shape), grads


def _frame_bound(problem: tuple) -> float:
    return trajectory_tolerance(SIZE_D, SIZE_R, STEPS)


def _adamw_bound(problem: tuple) -> float:
    _, x0, _ = problem
    d = ADAMW_DEFAULTS
    return adamw_tolerance(
        x0.size, STEPS, float(np.linalg.norm(x0)), d["lr"], d["betas"], d["weight_decay"]
    )


def _on_frames(*runs: tuple[Callable, Callable]) -> Rule:
    return Rule(runs, _frames, _frame_bound)


RULES: dict[str, Rule] = {
    "momentum": _on_frames(
        (
            lambda: ro.riemannian_momentum(LR, BETA, CAP),
            lambda w0, gs: mp.momentum_trajectory(w0, gs, LR, BETA, CAP),
        ),
        (
            lambda: ro.riemannian_momentum(OTHER["lr"], OTHER["beta"], OTHER["c"]),
            lambda w0, gs: mp.momentum_trajectory(w0, gs, OTHER["lr"], OTHER["beta"], OTHER["c"]),
        ),
        (
            lambda: ro.riemannian_momentum(LR),
            lambda w0, gs: mp.momentum_trajectory(w0, gs, LR, **MOMENTUM_DEFAULTS),
        ),
    ),
    "rsgd": _on_frames(
        *(
            (lambda lr=lr: ro.rsgd(lr), lambda w0, gs, lr=lr: mp.rsgd_trajectory(w0, gs, lr))
            for lr in (LR, OTHER["lr"])
        )
    ),
    "rsgd with Δ": _on_frames(
        *(
            (
                lambda lr=lr, dr=dr: ro.rsgd(lr, dr),
                lambda w0, gs, lr=lr, dr=dr: mp.rsgd_trajectory(w0, gs, lr, dr),
            )
            for lr, dr in ((LR, RADIUS), (OTHER["lr_capped"], OTHER["radius"]))
        )
    ),
    "normalized_rsgd": _on_frames(
        *(
            (
                lambda lr=lr: ro.normalized_rsgd(lr),
                lambda w0, gs, lr=lr: mp.normalized_rsgd_trajectory(w0, gs, lr),
            )
            for lr in (LR, OTHER["lr"])
        )
    ),
    "adamw": Rule(
        ((lambda: ro.adamw(), lambda x0, gs: mp.adamw_trajectory(x0, gs, **ADAMW_DEFAULTS)),),
        _plain,
        _adamw_bound,
    ),
}


def _times(k: float) -> Callable:
    """The transformation built with its one argument multiplied by k (the cap c, the trust
    radius Δ, the step's factor −lr)."""
    return lambda original: lambda value: original(k * value)


def _untransported(original):
    def variant(beta):
        inner = original(beta)
        return inner._replace(transport=lambda geometry, x, y, s: s)

    return variant


def _rms_over_dimension(original):
    """RMS with the count d·r − r(r+1)/2 (the manifold's dimension) for the d·r entries: the
    step is longer by sqrt(d·r / (d·r − r(r+1)/2))."""

    def variant():
        inner = original()
        d, r = SIZE_D, SIZE_R
        factor = math.sqrt(d * r / (d * r - r * (r + 1) / 2))

        def update(geometry, x, u, state):
            out, new = inner.update(geometry, x, u, state)
            return ro.tree_map(lambda p: factor * p, out), new

        return inner._replace(update=update)

    return variant


#: (check, rule, the transformation substituted, its variant, the control's description).
CONTROLS = (
    ("the momentum's cap", "momentum", "normalize_by_max", _times(2.0), "the cap c doubled"),
    (
        "the momentum's transport",
        "momentum",
        "trace",
        _untransported,
        "the momentum not transported to the new point",
    ),
    ("the fixed step", "rsgd", "scale", _times(1.01), "the step 1% longer"),
    (
        "resolution: steps 1e-10 relative too long are caught",
        "rsgd",
        "scale",
        _times(1 + 1e-10),
        "near miss: the step 1e-10 relative longer",
    ),
    ("the trust radius", "rsgd with Δ", "trust_region", _times(2.0), "the trust radius doubled"),
    (
        "the RMS's count",
        "normalized_rsgd",
        "normalize_by_rms",
        _rms_over_dimension,
        "the RMS over the manifold's dimension instead of the entries",
    ),
    (
        "AdamW with its defaults",
        "adamw",
        "add_decayed_weights",
        _times(1.01),
        "the weight decay 1% larger",
    ),
)


def rule_check(rule: str, name: str, variant: Callable) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """For each run of one rule: ``STEPS`` steps (float64) and its mpmath transcription
        (50 digits) from one point along one sequence of gradients (seed ``ctx.seed``);
        residual the largest ‖W_t − W_t^mp‖, against the rule's bound
        (``trajectory_tolerance(6, 3, 4)`` on frames, ``adamw_tolerance`` on a plain array).
        The control substitutes the wrong transformation named below into
        ``reference.optim``."""
        rule_ = RULES[rule]
        geometry, x0, grads = problem = rule_.problem(ctx.seed)
        worst = 0.0
        for make, exact_of in rule_.runs:
            with (
                substituted(ro, name, variant(getattr(ro, name)))
                if wrong
                else (contextlib.nullcontext())
            ):
                opt = make()
                state, w, points = opt.init(geometry, x0), x0, []
                for g in grads:
                    w, state = opt.step(geometry, w, g, state)
                    points.append(w)
            with mpmath.workdps(DIGITS):
                exact = exact_of(x0, grads).points[1:]
                worst = max(
                    worst,
                    *(
                        float(mp.frobenius(mp.to_mp(a) - b))
                        for a, b in zip(points, exact, strict=True)
                    ),
                )
        exercised = {
            "sizes": repr(geometry),
            "steps": len(grads),
            "options": f"{rule}: {len(rule_.runs)} run(s); lr {LR}, β {BETA}, c {CAP}, "
            f"Δ {RADIUS} where the rule takes them, and {OTHER} (frame rules), the defaults "
            "where named",
            "dtypes": f"float64 against mpmath at {DIGITS} digits",
            "seeds": ctx.seed,
        }
        return Outcome.bound(
            worst,
            rule_.tolerance(problem),
            f"max_t ‖W_t − W_t^mp‖ over {rule}'s runs",
            exercised,
        )

    return run


register(
    Proposition(
        id="REF-2",
        title="The reference's momentum, fixed-step, normalised and AdamW rules are their rules",
        statement=(
            r"$T$ steps from $W_0$ along $G_1,\dots,G_T$ of \texttt{riemannian\_momentum} "
            r"($M_t=\beta M_{t-1}+(1-\beta)g_t$, $\xi_t=-\eta M_t/\max(\|M_t\|,c)$, "
            r"$M_t\leftarrow P_{W_t}(M_t)$), \texttt{rsgd} ($\xi_t=-\eta g_t$, capped at "
            r"$\Delta$) and \texttt{normalized\_rsgd} ($\xi_t=-\eta g_t/\mathrm{RMS}(g_t)$, "
            r"$\mathrm{RMS}(g)=\|g\|/\sqrt{dr}$), each with $W_t=\mathrm{polar}(W_{t-1}+\xi_t)$ "
            r"and $g_t=P_{W_{t-1}}(G_t)$, stay within the float64 trajectory bound of the exact "
            r"rules at $(\eta,\beta,c)\in\{(0.05,0.9,0.5),(0.02,0.5,2)\}$ (momentum), "
            r"$\eta\in\{0.05,0.02\}$ (\texttt{rsgd}, \texttt{normalized\_rsgd}) and "
            r"$(\eta,\Delta)\in\{(0.05,0.1),(0.1,0.03)\}$ (\texttt{rsgd} capped); so do $T$ "
            r"steps of \texttt{adamw} with its defaults on a plain array "
            r"($x_t=(1-\eta\lambda)x_{t-1}-\eta\,\hat m_t/(\sqrt{\hat v_t}+\varepsilon)$, "
            r"per entry, $\eta=10^{-3}$, $\beta=(0.9,0.999)$, $\varepsilon=10^{-8}$, "
            r"$\lambda=10^{-2}$), and the momentum rule with its defaults $\beta=0.9$, $c=1$."
        ),
        hypotheses=(
            "the exact rules transcribed independently in mpmath (reference.mp), 50 digits",
            "St(6, 3) (AdamW: a 6×3 array), 4 steps, lr·sqrt(d·r) ≤ 1/2",
        ),
        checks=tuple(
            Check("float64", name, rule_check(rule, part, variant), control)
            for name, rule, part, variant, control in CONTROLS
        ),
    )
)
