"""REF-1: the reference's Riemannian Adam is the rule of DESIGN §5, to float64 rounding.

RA-1 … RA-7 are invariances, which a wrong schedule can keep (scale independence holds without
bias correction). This proposition pins the schedule itself: ``reference.optim.riemannian_adam``
in float64 against the independent mpmath transcription ``reference.mp.adam_trajectory`` at 50
digits, for every option the transcription has. Each control substitutes a wrong variant of
``reference.optim.scale_by_adam`` into the library for the duration of the run (so the preset
builds its chain from it), each a near miss of one of the schedule's parts.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable

import mpmath
import numpy as np

import reference as ref
from proofs_checks import rigorous
from proofs_checks.bounds import sqrt_v_tolerance, trajectory_tolerance
from proofs_checks.harness import frame_problem, substituted, trajectory
from proofs_checks.propositions.common import BETAS, LR, adam_direction_times, adam_update_then
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference import optim as ro

#: Sizes and steps: St(6, 3), 4 steps (the mpmath polar is the cost).
SIZE_D, SIZE_R, STEPS = 6, 3, 4
#: Working precision of the transcription: its own rounding is far below float64's.
DIGITS = 50
#: (trust radius, moment, reduction, eps, first entry, lr, betas) of the runs; lr·√(d·r) ≤ 1/2
#: as the tolerance assumes. Every option set at (LR, BETAS): Δ ∈ {none, 0.01 (binding)},
#: either moment, either reduction, ε ∈ {0, 1e-3} (1e-3 is of the size of the sum reduction's
#: √v̂ here, so ε matters). Then two other (lr, β): a long step with short memories, and β1 = 0
#: (no first-moment average: 1 − β1^t = 1). Then two corners: a first entry (not None) starts
#: from W_0 = [I; 0] with a first gradient tangent there, P_W(G) = G, whose entry (r, 0) is
#: that value: 1e-12, below ε, where the elementwise √v̂ + ε is ε's (the ratio m̂/(√v̂ + ε) ≈
#: 1e-4, neither 0 nor 1); 0 with ε = 0, where the ratio is 0/0 := 0.
OTHER_HYPERPARAMETERS = (
    (0.05, "frame", "mean", 1e-3, None, 0.05, (0.5, 0.9)),
    (None, "elementwise", "sum", 0.0, None, 2e-3, (0.0, 0.99)),
)
OPTIONS = (
    *(
        (radius, moment, reduction, eps, None, LR, BETAS)
        for radius in (None, 0.01)
        for moment in ("frame", "elementwise")
        for reduction in ("mean", "sum")
        for eps in (0.0, 1e-3)
    ),
    *OTHER_HYPERPARAMETERS,
    (None, "elementwise", "mean", 1e-8, 1e-12, LR, BETAS),
    (None, "elementwise", "mean", 0.0, 0.0, LR, BETAS),
)
#: The near-miss control's relative error of the step (``_direction_scaled``).
NEAR_MISS = 1e-9
#: DESIGN §5's defaults, written here and not read from the code.
DEFAULT_BETAS, DEFAULT_EPS = (0.9, 0.999), 1e-8
#: The runs with the defaults take gradients of this size, where RMS(g) and ε are alike: a
#: changed default ε moves the step by a third.
DEFAULT_SCALE = 1e-8
#: Built with the defaults: the preset, and a chain of the transformation itself.
DEFAULT_RUNS = {
    "riemannian_adam(lr)": lambda: ro.riemannian_adam(LR),
    "chain(scale_by_adam(), scale(−lr))": lambda: ro.Optimizer(
        ro.chain(ro.scale_by_adam(), ro.scale(-LR)), LR
    ),
}


def _shifted_count(shift: int) -> Callable:
    """Bias corrections at t + shift: the count the update sees is moved by ``shift`` (1: t off
    by one; 10^6: no bias correction at all, 1 − β^t = 1)."""

    def make(original):
        def variant(b1=0.9, b2=0.999, eps=1e-8, moment="frame", reduction="mean"):
            inner = original(b1, b2, eps, moment, reduction)

            def update(geometry, x, g, state):
                d, new = inner.update(geometry, x, g, state._replace(count=state.count + shift))
                return d, new._replace(count=new.count - shift)

            return inner._replace(update=update)

        return variant

    return make


def _direction_scaled(k: float) -> Callable:
    """The update m̂/(√v̂ + ε) multiplied by k: a near miss for k = 1 + 1e-9, a step longer
    by 1e-9 relative, which the trajectories resolve (the bound is ~1e-12 absolute on steps of
    length ≤ 0.42)."""
    return adam_direction_times(lambda p: k)


def _beta2_for_its_root(original):
    """β2 where √β2 belongs in √v ← hypot(√β2·√v, √(1 − β2)·√s): √v is scaled by √β2 once more
    before each update."""

    def variant(b1=0.9, b2=0.999, eps=1e-8, moment="frame", reduction="mean"):
        inner = original(b1, b2, eps, moment, reduction)
        rb2 = math.sqrt(b2)

        def update(geometry, x, g, state):
            sv = tuple(rb2 * v for v in state.sqrt_v)
            return inner.update(geometry, x, g, state._replace(sqrt_v=sv))

        return inner._replace(update=update)

    return variant


def _sum_for_mean(original):
    """s(g) = ‖g‖² where the mean ‖g‖²/(entries) is asked (and the reverse)."""

    def variant(b1=0.9, b2=0.999, eps=1e-8, moment="frame", reduction="mean"):
        swapped = {"mean": "sum", "sum": "mean"}[reduction]
        return original(b1, b2, eps, moment, swapped)

    return variant


def _at_the_corner(prob, entry: float):
    """(W_0 = [I; 0], gradients): the first one tangent at W_0 (skew top block, its first
    lower entry ``entry``), the others the problem's."""
    d, r = prob.w0.shape
    w0 = np.eye(d, r)
    first = prob.grads[0].copy()
    first[:r] = 0.5 * (first[:r] - first[:r].T)  # exactly skew: sym(W_0ᵀG) = 0
    first[r, 0] = entry
    return w0, [first, *prob.grads[1:]]


def _runs(seed: int) -> list[tuple[str, Callable, tuple]]:
    """(label, the optimizer's maker, (W_0, gradients)) of each run of ``schedule_check``."""
    prob = frame_problem(SIZE_D, SIZE_R, STEPS, seed)
    return [
        (
            f"Δ={radius}, {moment}, {reduction}, ε={eps}, {entry}, lr={lr}, β={betas}",
            lambda r=radius, m=moment, red=reduction, e=eps, lr=lr, b=betas: ro.riemannian_adam(
                lr, b, e, trust_radius=r, moment=m, reduction=red
            ),
            (prob.w0, prob.grads) if entry is None else _at_the_corner(prob, entry),
        )
        for radius, moment, reduction, eps, entry, lr, betas in OPTIONS
    ] + [
        (label, make, (prob.w0, [DEFAULT_SCALE * g for g in prob.grads]))
        for label, make in DEFAULT_RUNS.items()
    ]


def _exact_args(k: int) -> tuple:
    """The transcription's (lr, betas, ε, Δ, moment, reduction) of run k of ``_runs``."""
    if k < len(OPTIONS):
        radius, moment, reduction, eps, _, lr, betas = OPTIONS[k]
        return lr, betas, eps, radius, moment, reduction
    return LR, DEFAULT_BETAS, DEFAULT_EPS, None, "frame", "mean"


@functools.lru_cache(maxsize=32)
def _exact_points(seed: int, k: int) -> list:
    """``mp.adam_trajectory``'s points after W_0 for run k at ``DIGITS`` digits: the same for
    every check of REF-1 and for its controls (only the float64 side changes), so computed
    once per seed and run."""
    _, _, (w0, grads) = _runs(seed)[k]
    with mpmath.workdps(DIGITS):
        return mp.adam_trajectory(w0, grads, *_exact_args(k)).points[1:]


def schedule_check(variant: Callable) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """For each of ``OPTIONS`` and ``DEFAULT_RUNS``: ``STEPS`` steps of the optimizer
        (float64) and of ``mp.adam_trajectory`` (50 digits) from one point along one sequence of
        gradients (seed ``ctx.seed``; times ``DEFAULT_SCALE`` for the runs with the defaults);
        residual the largest ‖W_t − W_t^mp‖ over runs and steps, against
        ``trajectory_tolerance(6, 3, 4)`` (float64 rounding of one trajectory, doubled: the
        mpmath one rounds 10^-34 times less). The control substitutes the variant named below
        into ``reference.optim``."""
        prob = frame_problem(SIZE_D, SIZE_R, STEPS, ctx.seed)
        worst, where = 0.0, ""
        runs = _runs(ctx.seed)
        for k, (label, make, (w0, grads)) in enumerate(runs):
            with (
                substituted(ro, "scale_by_adam", variant(ro.scale_by_adam))
                if wrong
                else contextlib.nullcontext()
            ):
                opt = make()
                state, w, points = opt.init(prob.geometry, w0), w0, []
                for g in grads:
                    w, state = opt.step(prob.geometry, w, g, state)
                    points.append(w)
            with mpmath.workdps(DIGITS):
                exact = _exact_points(ctx.seed, k)
                for t, (a, b) in enumerate(zip(points, exact, strict=True), start=1):
                    dev = float(mp.frobenius(mp.to_mp(a) - b))
                    if dev > worst:
                        worst, where = dev, f"{label}, t={t}"
        exercised = {
            "sizes": f"St({SIZE_D}, {SIZE_R})",
            "steps": STEPS,
            "options": f"{len(OPTIONS) - 4} option sets (Δ ∈ {{none, 0.01}} × frame/elementwise"
            f" × mean/sum × ε ∈ {{0, 1e-3}}) at lr {LR}, β = {BETAS}; "
            + "; ".join(
                f"Δ={o[0]}, {o[1]}, {o[2]}, ε={o[3]} at lr {o[5]}, β = {o[6]}"
                for o in OTHER_HYPERPARAMETERS
            )
            + "; 2 corners at W = [I; 0]; "
            + ", ".join(DEFAULT_RUNS),
            "dtypes": f"float64 against mpmath at {DIGITS} digits",
            "seeds": ctx.seed,
        }
        return Outcome.bound(
            worst,
            trajectory_tolerance(SIZE_D, SIZE_R, STEPS),
            f"max_t ‖W_t − W_t^mp‖ over {len(runs)} runs; worst at {where}",
            exercised,
        )

    return run


#: The rigorous check: steps along gradients whose scales span 10^±3 (so hypot's two terms
#: trade places), and the near miss: √v stored RIGOROUS_NEAR_MISS relative too large each step.
RIGOROUS_STEPS, RIGOROUS_NEAR_MISS = 100, 1e-14


#: ``scale_by_adam`` storing √v·(1 + RIGOROUS_NEAR_MISS) after each update.
_sqrt_v_inflated = adam_update_then(
    lambda d, new: (d, new._replace(sqrt_v=tuple(v * (1 + RIGOROUS_NEAR_MISS) for v in new.sqrt_v)))
)


def sqrt_v_enclosure(ctx: Context, wrong: bool) -> Outcome:
    """The second moment, rigorously: ``RIGOROUS_STEPS`` steps of ``riemannian_adam`` (frame
    moment, mean reduction, default β) at St(6, 3) along gradients G_t = 10^U(−3, 3)·Gaussian
    (seed [seed, 5]); for each t the exact recursion v_t = β2·v_{t−1} + (1 − β2)·‖g_t‖²/n on
    the same float64 β2 and projected gradients g_t is enclosed in a ball (``rigorous``, 256
    bits), and the upper end of |√v_t(float64) − √v_t|/√v_t is held to
    ``sqrt_v_tolerance(18, t)``. Residual: the largest ratio, tolerance 1. Control, a near
    miss: √v stored 1e-14 relative too large after each update (``_sqrt_v_inflated``),
    substituted into ``reference.optim``."""
    rng = np.random.default_rng([ctx.seed, 5])
    geometry = ref.Stiefel(SIZE_D, SIZE_R)
    w0 = geometry.random_point(rng)
    grads = [
        10.0 ** rng.uniform(-3, 3) * rng.standard_normal((SIZE_D, SIZE_R))
        for _ in range(RIGOROUS_STEPS)
    ]
    with (
        substituted(ro, "scale_by_adam", _sqrt_v_inflated(ro.scale_by_adam))
        if wrong
        else (contextlib.nullcontext())
    ):
        steps, _ = trajectory(ro.riemannian_adam(LR, DEFAULT_BETAS), geometry, w0, grads)
    b2, n = rigorous.ball(DEFAULT_BETAS[1]), SIZE_D * SIZE_R
    v, worst = rigorous.ball(0.0), 0.0
    for t, (step, grad) in enumerate(zip(steps, grads, strict=True), start=1):
        g = geometry.egrad_to_rgrad(step.w, grad)
        v = b2 * v + (1 - b2) * rigorous.mean_square(g)
        error = rigorous.relative_error_upper(step.state[0].sqrt_v[0], v.sqrt())
        ratio = error / sqrt_v_tolerance(n, t)
        worst = max(worst, ratio if ratio == ratio else math.inf)  # a NaN fails
    return Outcome.bound(
        worst,
        1.0,
        f"max_t |√v_t − √v_t^exact|/√v_t over sqrt_v_tolerance(18, t), {RIGOROUS_STEPS} steps",
        {
            "sizes": f"St({SIZE_D}, {SIZE_R})",
            "steps": RIGOROUS_STEPS,
            "options": f"frame moment, mean reduction, β = {DEFAULT_BETAS}, gradient scales 10^±3",
            "dtypes": f"float64 against Arb balls at {rigorous.PRECISION} bits",
            "seeds": f"[{ctx.seed}, 5]",
        },
    )


register(
    Proposition(
        id="REF-1",
        title="The reference's Riemannian Adam is its rule, to float64 rounding",
        statement=(
            r"For every combination of its options (trust radius $\Delta\in\{\text{none},"
            r"0.01\}$, frame or elementwise moment, mean or sum reduction, $\varepsilon\in"
            r"\{0,10^{-3}\}$) at $\eta=5\cdot10^{-3}$, $\beta=(0.9,0.999)$, and for one option "
            r"set each at $(\eta,\beta)=(0.05,(0.5,0.9))$ ($\Delta=0.05$, frame, mean, "
            r"$\varepsilon=10^{-3}$) and $(2\cdot10^{-3},(0,0.99))$ (no $\Delta$, elementwise, "
            r"sum, $\varepsilon=0$), $T=4$ steps of "
            r"\texttt{reference.optim.riemannian\_adam}"
            r" from $W_0$ along gradients $G_1,\dots,G_T$ stay within the float64 trajectory "
            r"bound of the exact rule: $m_t=\beta_1m_{t-1}+(1-\beta_1)g_t$, "
            r"$v_t=\beta_2v_{t-1}+(1-\beta_2)s(g_t)$, "
            r"$\xi_t=-\eta\,\hat m_t/(\sqrt{\hat v_t}+\varepsilon)$ with "
            r"$\hat m_t=m_t/(1-\beta_1^t)$, $\hat v_t=v_t/(1-\beta_2^t)$, capped at $\Delta$, "
            r"$W_t=\mathrm{polar}(W_{t-1}+\xi_t)$, $m_t\leftarrow P_{W_t}(m_t)$; built with "
            r"its defaults (the preset, and a chain of \texttt{scale\_by\_adam()}), the rule "
            r"is the one with $\beta=(0.9,0.999)$, $\varepsilon=10^{-8}$; and over "
            r"100 steps at those defaults (frame moment, mean reduction) its stored "
            r"$\sqrt{v_t}$ is the exact recursion's on the same float64 gradients to relative "
            r"$\gamma_{n+6}+\gamma_{4t}$, $n=dr$ (a rigorous enclosure)."
        ),
        hypotheses=(
            "the exact rule transcribed independently in mpmath (reference.mp), 50 digits",
            "St(6, 3), 4 steps, lr·sqrt(d·r) ≤ 1/2",
            "the runs with the defaults on gradients of size 1e-8, where ε matters",
        ),
        checks=(
            Check(
                "float64",
                "the bias corrections",
                schedule_check(_shifted_count(1)),
                "bias corrections at t + 1 (t off by one)",
            ),
            Check(
                "float64",
                "the bias corrections are there",
                schedule_check(_shifted_count(10**6)),
                "no bias correction (1 − β^t taken as 1)",
            ),
            Check(
                "float64",
                "the second moment's decay",
                schedule_check(_beta2_for_its_root),
                "β2 where √β2 belongs in the √v update",
            ),
            Check(
                "float64",
                "the reduction of s(g)",
                schedule_check(_sum_for_mean),
                "the sum ‖g‖² where the mean is asked (and the reverse)",
            ),
            Check(
                "rigorous",
                "the second moment √v_t against its exact recursion, enclosed",
                sqrt_v_enclosure,
                f"near miss: √v stored {RIGOROUS_NEAR_MISS:g} relative too large after each "
                "update, substituted into reference.optim",
                unavailable=rigorous.unavailable,
            ),
            Check(
                "float64",
                "resolution: steps 1e-9 relative too long are caught",
                schedule_check(_direction_scaled(1 + NEAR_MISS)),
                f"near miss: the direction m̂/(√v̂ + ε) times 1 + {NEAR_MISS:g}",
            ),
        ),
    )
)
