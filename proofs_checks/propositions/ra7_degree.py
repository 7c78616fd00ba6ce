"""RA-7: the fixed-step rule is degree one in the gradient, the Adam rule degree zero."""

from __future__ import annotations

import mpmath
import numpy as np
import sympy as sp
from hypothesis import strategies as st

import reference as ref
from proofs_checks.bounds import relative_tolerance
from proofs_checks.harness import (
    frame_problem,
    ladder,
    property_check,
    seeds,
    shape_corners,
    shapes,
    vanishes,
)
from proofs_checks.propositions.common import BETAS, LR, MP_D, MP_R, D, R
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference.linalg import frobenius

#: The claimed degree of each rule, and the deliberately wrong claims of the negative control.
DEGREES = {"rsgd": 1, "riemannian_adam": 0, "normalized_rsgd": 0}
SWAPPED = {"rsgd": 0, "riemannian_adam": 1, "normalized_rsgd": 1}
CONTROL = "the degrees swapped (fixed step claimed 0, Adam and normalised claimed 1)"
RULES = {
    "rsgd": lambda: ref.optim.rsgd(LR),
    "riemannian_adam": lambda: ref.optim.riemannian_adam(LR, eps=0.0),
    "normalized_rsgd": lambda: ref.optim.normalized_rsgd(LR),
}


def claimed(wrong: bool) -> dict[str, int]:
    return SWAPPED if wrong else DEGREES


def symbolic_degree(ctx: Context, wrong: bool) -> Outcome:
    """One step from a fresh state with gradient g = (g_0, g_1, g_2), c > 0: SymPy reduces
    ξ(cg) − c^k ξ(g) to zero for rsgd ξ = −lr·g (k = 1), Adam with ε = 0
    ξ = −lr·(1 − β1)g/(1 − β1) / sqrt((1 − β2)s(g)/(1 − β2)) (k = 0) and normalised
    ξ = −lr·g/RMS(g) (k = 0), with s(g) = RMS(g)² = Σg_i²/3."""
    c, lr = sp.symbols("c lr", positive=True)
    b1, b2 = sp.symbols("beta1 beta2", positive=True)
    g = sp.Matrix(sp.symbols("g0:3", real=True))
    rms = sp.sqrt(sum(x**2 for x in g) / 3)
    steps = {
        "rsgd": lambda v: -lr * v,
        "riemannian_adam": lambda v: (
            -lr
            * ((1 - b1) * v / (1 - b1))
            / sp.sqrt(
                (1 - b2) * (rms**2).subs(dict(zip(g, v, strict=True)), simultaneous=True) / (1 - b2)
            )
        ),
        "normalized_rsgd": lambda v: (
            -lr * v / rms.subs(dict(zip(g, v, strict=True)), simultaneous=True)
        ),
    }
    degrees = claimed(wrong)
    left = [name for name, f in steps.items() if not vanishes(f(c * g) - c ** degrees[name] * f(g))]
    return Outcome(not left, float(len(left)), 0.0, f"identities left nonzero: {left or 'none'}")


def spread(prob) -> float:
    """‖G‖/‖P_W G‖, the amplification of projection rounding (see ``relative_tolerance``)."""
    g = prob.grads[0]
    return frobenius(g) / frobenius(prob.geometry.proj(prob.w0, g))


def degree_gap(d: int, r: int, seed: int, c: float, degrees: dict[str, int]) -> tuple[float, str]:
    """max over rules of ‖ξ(cG) − c^k ξ(G)‖/‖c^k ξ(G)‖ for one step from a fresh state, and the
    measured degrees log(‖ξ(cG)‖/‖ξ(G)‖)/log c."""
    prob = frame_problem(d, r, 1, seed)
    worst, measured = 0.0, []
    for name, make in RULES.items():
        opt = make()
        state = opt.init(prob.geometry, prob.w0)
        xi = opt.update(prob.geometry, prob.w0, prob.grads[0], state)[0]
        xic = opt.update(prob.geometry, prob.w0, c * prob.grads[0], state)[0]
        expected = c ** degrees[name] * xi
        if frobenius(expected) > 0:
            worst = max(worst, frobenius(xic - expected) / frobenius(expected))
            measured.append(f"{name} {np.log(frobenius(xic) / frobenius(xi)) / np.log(c):.6f}")
    return worst, ", ".join(measured)


def float64_degree(ctx: Context, wrong: bool) -> Outcome:
    """At St(64, 16), c = 1e3 and 1e-3: relative gap ≤ ``relative_tolerance(d, r)``."""
    results = [degree_gap(D, R, ctx.seed, c, claimed(wrong)) for c in (1e3, 1e-3)]
    res = max(r for r, _ in results)
    tol = relative_tolerance(D, R, spread(frame_problem(D, R, 1, ctx.seed)))
    return Outcome.bound(res, tol, f"measured degrees at c = 1e3: {results[0][1]}")


def mpmath_degree(ctx: Context, wrong: bool) -> Outcome:
    """At St(6, 3) with c = 1e3 at 30 and 60 digits: rsgd ξ = −lr·P_W(cG) and the Adam step of
    the mpmath trajectory (ε = 0), relative gap ≤ ``relative_tolerance(d, r, u)``."""
    prob = frame_problem(MP_D, MP_R, 1, ctx.seed)
    degrees = claimed(wrong)

    def measure(dps: int) -> float:
        c, w, g = mpmath.mpf(1000), mp.to_mp(prob.w0), mp.to_mp(prob.grads[0])
        pairs = {
            "rsgd": (-LR * mp.proj(w, g), -LR * mp.proj(w, c * g)),
            "riemannian_adam": tuple(
                mp.adam_trajectory(w, [s * g], LR, BETAS, 0.0).steps[0] for s in (1, c)
            ),
        }
        return max(
            mp.frobenius(b - c ** degrees[k] * a) / mp.frobenius(c ** degrees[k] * a)
            for k, (a, b) in pairs.items()
        )

    return ladder(
        measure,
        lambda u: relative_tolerance(MP_D, MP_R, spread(prob), u),
        "relative gap ξ(cG) vs c^k ξ(G)",
    )


def property_degree(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ r ≤ d ≤ 64, seeds and c = 10^[-100, 100] (St(1, 1) excluded: its
    only tangent vector is 0): relative gap ≤ ``relative_tolerance(d, r)``."""

    def measure(example) -> tuple[float, float]:
        (d, r), seed, c_exp = example
        tol = relative_tolerance(d, r, spread(frame_problem(d, r, 1, seed)))
        return degree_gap(d, r, seed, 10.0**c_exp, claimed(wrong))[0], tol

    strategy = st.tuples(
        shapes().filter(lambda s: s[0] > 1),
        seeds(),
        st.floats(-100, 100).filter(lambda e: abs(e) > 0.5),
    )
    what = "relative gap ξ(cG) vs c^k ξ(G)"
    return property_check(ctx, strategy, measure, what, explicit=shape_corners(0, 3.0))


register(
    Proposition(
        id="RA-7",
        title="Degree of the update rules in the gradient",
        statement=(
            r"For $c>0$, one step of fixed-step Riemannian SGD satisfies $\xi(cG)=c\,\xi(G)$ "
            r"(degree one), while the scalar-moment Riemannian Adam with $\varepsilon=0$ and the "
            r"normalised rule satisfy $\xi(cG)=\xi(G)$ (degree zero)."
        ),
        hypotheses=(
            "one step from a fresh state",
            "no trust-region cap (a cap truncates degree one)",
        ),
        checks=(
            Check("symbolic", "homogeneity of the three one-step maps", symbolic_degree, CONTROL),
            Check("float64", "measured degrees at c = 1e±3", float64_degree, CONTROL),
            Check("mpmath", "degree gap falls with precision", mpmath_degree, CONTROL),
            Check("property", "degrees over shapes, seeds and c", property_degree, CONTROL),
        ),
    )
)
