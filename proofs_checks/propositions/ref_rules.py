"""REF-2: the reference's momentum, fixed-step and normalised rules are their rules, to float64
rounding.

As REF-1 for Adam: ``reference.optim.riemannian_momentum``, ``rsgd`` (with and without its trust
region) and ``normalized_rsgd`` in float64 against the independent mpmath transcriptions of
``reference.mp`` at 50 digits. Each control substitutes into ``reference.optim`` a transformation
wrong by little (so the preset builds its chain from it): the momentum's cap at 2c, its
momentum left untransported, the trust radius doubled, the RMS taken over the manifold's
dimension d·r − r(r + 1)/2 instead of the d·r entries.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import mpmath

from proofs_checks.bounds import trajectory_tolerance
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
DIGITS = 50

#: name -> (the reference's optimizer, the transcription's trajectory).
RULES: dict[str, tuple[Callable, Callable]] = {
    "momentum": (
        lambda: ro.riemannian_momentum(LR, BETA, CAP),
        lambda w0, gs: mp.momentum_trajectory(w0, gs, LR, BETA, CAP),
    ),
    "rsgd": (lambda: ro.rsgd(LR), lambda w0, gs: mp.rsgd_trajectory(w0, gs, LR)),
    "rsgd with Δ": (
        lambda: ro.rsgd(LR, RADIUS),
        lambda w0, gs: mp.rsgd_trajectory(w0, gs, LR, RADIUS),
    ),
    "normalized_rsgd": (
        lambda: ro.normalized_rsgd(LR),
        lambda w0, gs: mp.normalized_rsgd_trajectory(w0, gs, LR),
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


def rule_check(rule: str, name: str, variant: Callable) -> Callable[[Context, bool], Outcome]:
    def run(ctx: Context, wrong: bool) -> Outcome:
        """``STEPS`` steps of one rule (float64) and of its mpmath transcription (50 digits)
        from one point along one sequence of gradients (seed ``ctx.seed``); residual the
        largest ‖W_t − W_t^mp‖, against ``trajectory_tolerance(6, 3, 4)``. The control
        substitutes the wrong transformation named below into ``reference.optim``."""
        make, exact_of = RULES[rule]
        prob = frame_problem(SIZE_D, SIZE_R, STEPS, ctx.seed)
        wrong_part = substituted(ro, name, variant(getattr(ro, name)))
        with wrong_part if wrong else contextlib.nullcontext():
            opt = make()
            state, w, points = opt.init(prob.geometry, prob.w0), prob.w0, []
            for g in prob.grads:
                w, state = opt.step(prob.geometry, w, g, state)
                points.append(w)
        with mpmath.workdps(DIGITS):
            exact = exact_of(prob.w0, prob.grads).points[1:]
            worst = max(
                float(mp.frobenius(mp.to_mp(a) - b)) for a, b in zip(points, exact, strict=True)
            )
        return Outcome.bound(
            worst, trajectory_tolerance(SIZE_D, SIZE_R, STEPS), f"max_t ‖W_t − W_t^mp‖, {rule}"
        )

    return run


register(
    Proposition(
        id="REF-2",
        title="The reference's momentum, fixed-step and normalised rules are their rules",
        statement=(
            r"$T$ steps from $W_0$ along $G_1,\dots,G_T$ of \texttt{riemannian\_momentum} "
            r"($M_t=\beta M_{t-1}+(1-\beta)g_t$, $\xi_t=-\eta M_t/\max(\|M_t\|,c)$, "
            r"$M_t\leftarrow P_{W_t}(M_t)$), \texttt{rsgd} ($\xi_t=-\eta g_t$, capped at "
            r"$\Delta$) and \texttt{normalized\_rsgd} ($\xi_t=-\eta g_t/\mathrm{RMS}(g_t)$, "
            r"$\mathrm{RMS}(g)=\|g\|/\sqrt{dr}$), each with $W_t=\mathrm{polar}(W_{t-1}+\xi_t)$ "
            r"and $g_t=P_{W_{t-1}}(G_t)$, stay within the float64 trajectory bound of the exact "
            r"rules."
        ),
        hypotheses=(
            "the exact rules transcribed independently in mpmath (reference.mp), 50 digits",
            "St(6, 3), 4 steps, lr·sqrt(d·r) ≤ 1/2",
        ),
        checks=(
            Check(
                "float64",
                "the momentum's cap",
                rule_check("momentum", "normalize_by_max", _times(2.0)),
                "the cap c doubled",
            ),
            Check(
                "float64",
                "the momentum's transport",
                rule_check("momentum", "trace", _untransported),
                "the momentum not transported to the new point",
            ),
            Check(
                "float64",
                "the fixed step",
                rule_check("rsgd", "scale", _times(1.01)),
                "the step 1% longer",
            ),
            Check(
                "float64",
                "the trust radius",
                rule_check("rsgd with Δ", "trust_region", _times(2.0)),
                "the trust radius doubled",
            ),
            Check(
                "float64",
                "the RMS's count",
                rule_check("normalized_rsgd", "normalize_by_rms", _rms_over_dimension),
                "the RMS over the manifold's dimension instead of the entries",
            ),
        ),
    )
)
