"""RA-3: a tangent step keeps W + ξ well conditioned, so the polar retraction is benign."""

from __future__ import annotations

import contextlib

import numpy as np
import sympy as sp
from hypothesis import strategies as st

import reference as ref
from proofs_checks import rigorous
from proofs_checks.bounds import frame_error, gamma, gram_tolerance, step_error, tangent_error
from proofs_checks.harness import (
    frame_problem,
    identities,
    ladder,
    property_check,
    substituted,
    trajectory,
)
from proofs_checks.machine_checked import machine_check
from proofs_checks.propositions.common import MP_D, MP_R, STEPS, D, R
from proofs_checks.propositions.ra_shapes import over_shapes
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference.linalg import frobenius, sym

#: What the controls of the tangency hypothesis break.
TANGENCY = "breaks the hypothesis: Wᵀξ + ξᵀW = 0, not the code"
CONTROL = f"a non-tangent step ξ − ½‖ξ‖·W (a normal component added) ({TANGENCY})"
#: The near miss of ``gram_resolution``: a Tikhonov term τ in the polar retraction's inverse
#: square root. Each point W_t = polar(W + ξ) then has ‖WᵀW − I‖ ≈ τ·‖(I + ξᵀξ)^{-1}‖ ≈ τ√r,
#: about 21 × ``gram_tolerance(64, 16, Δ)``.
POLAR_TIKHONOV = 2e-11
#: The trust radius of these checks: large, so that κ(W + ξ) is visibly above 1.
DELTA = 0.4
#: What the rigorous checks of the rule's steps enclose.
ENCLOSED = f"float64 points and steps enclosed in Arb balls at {rigorous.PRECISION} bits"
#: The learning rate of the rule's steps (``rule_steps``): large enough that the cap Δ acts.
RULE_LR = 0.05


def corrupt(w: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """The negative control's step: ξ plus a normal component −½‖ξ‖W."""
    return xi - 0.5 * frobenius(xi) * w


def symbolic_gram(ctx: Context, wrong: bool) -> Outcome:
    """SymPy, with d×r matrix symbols: (W + ξ)ᵀ(W + ξ) − I − ξᵀξ = 0 once WᵀW = I and
    Wᵀξ = −ξᵀW. Scalar facts behind the bounds: the eigenvalues 1 + s² of I + ξᵀξ are ≥ 1; with
    k = (1 + s²)^{-1/2}, (k − 1)² + s²k² = 2 − 2k (the displacement per singular value, the cross
    term tr(sym·skew) vanishing); and s² − (2 − 2k) = (u − 1)²(u + 2)/u ≥ 0 for u = 1/k ≥ 1.
    Control: without the tangency relation the Gram identity does not reduce."""
    d, r = sp.symbols("d r", integer=True, positive=True)
    w, xi = sp.MatrixSymbol("W", d, r), sp.MatrixSymbol("xi", d, r)
    rules = {w.T * w: sp.Identity(r)}
    if not wrong:
        rules[w.T * xi] = -xi.T * w
    gram = sp.expand((w + xi).T * (w + xi)).subs(rules)
    left = [gram - sp.Identity(r) - xi.T * xi]
    s, uu = sp.symbols("s u", positive=True)
    k = 1 / sp.sqrt(1 + s**2)
    left.append((k - 1) ** 2 + s**2 * k**2 - (2 - 2 * k))
    gap = sp.factor(sp.simplify((s**2 - (2 - 2 * k)).subs(s, sp.sqrt(uu**2 - 1))))
    left.append(gap - (uu - 1) ** 2 * (uu + 2) / uu)
    symbols = f"{w.shape[0]}×{w.shape[1]} matrix symbols W, ξ (d, r symbolic); scalar s, u"
    return identities(left, symbols)


def gram_residual(w: np.ndarray, xi: np.ndarray) -> float:
    a = w + xi
    return frobenius(a.T @ a - np.eye(w.shape[1]) - xi.T @ xi)


def bound_violation(w: np.ndarray, xi: np.ndarray, delta: float) -> float:
    """Worst of the three bounds' violations, each divided by its own rounding tolerance:
    σ_min(W + ξ) ≥ 1, κ(W + ξ) ≤ sqrt(1 + Δ²), ‖polar(W + ξ) − W‖ ≤ ‖ξ‖."""
    d, r = w.shape
    e = gram_tolerance(d, r, frobenius(xi))
    sv = np.linalg.svd(w + xi, compute_uv=False)
    svd_err = gamma(d) * sv[0]  # backward-stable SVD: |σ̂ − σ| ≤ p(d)·u·‖A‖₂
    violations = [
        (1.0 - sv[-1]) / (e + svd_err),
        (sv[0] / sv[-1] - np.sqrt(1 + delta**2)) / (2 * e * (1 + delta**2) + 2 * svd_err),
        (frobenius(ref.linalg.polar(w + xi) - w) - frobenius(xi)) / step_error(d, r),
    ]
    return max(violations)


def rule_steps(ctx: Context, wrong: bool, capped: bool = True):
    """Steps of the full rule (lr = 0.05, so the cap Δ = 0.4 is active) at St(64, 16), or of
    the rule without its cap."""
    prob = frame_problem(D, R, STEPS, ctx.seed)
    opt = ref.optim.riemannian_adam(lr=RULE_LR, trust_radius=DELTA if capped else None)
    for s in trajectory(opt, prob.geometry, prob.w0, prob.grads)[0]:
        yield s.w, corrupt(s.w, s.xi) if wrong else s.xi


def rule_exercised(ctx: Context) -> dict[str, object]:
    """What a check over ``rule_steps`` ran."""
    return {
        "sizes": f"St({D}, {R})",
        "steps": STEPS,
        "options": f"riemannian_adam lr {RULE_LR}, trust radius Δ = {DELTA}",
        "dtypes": "float64",
        "seeds": ctx.seed,
    }


def float64_gram(ctx: Context, wrong: bool) -> Outcome:
    """(W + ξ)ᵀ(W + ξ) = I + ξᵀξ at every step of the rule; bound ``gram_tolerance``."""
    res, tol = 0.0, np.inf
    for w, xi in rule_steps(ctx, wrong):
        res = max(res, gram_residual(w, xi))
        tol = min(tol, gram_tolerance(D, R, frobenius(xi)))
    return Outcome.bound(
        res,
        tol,
        f"max ‖(W + ξ)ᵀ(W + ξ) − I − ξᵀξ‖ over {STEPS} capped steps",
        rule_exercised(ctx),
    )


def float64_bounds(ctx: Context, wrong: bool) -> Outcome:
    """σ_min ≥ 1, κ ≤ sqrt(1 + Δ²) and ‖R_W(ξ) − W‖ ≤ ‖ξ‖ at every step of the rule. Residual:
    the worst violation divided by its own rounding tolerance, so the tolerance is 1."""
    res = max(0.0, *(bound_violation(w, xi, DELTA) for w, xi in rule_steps(ctx, wrong)))
    return Outcome.bound(
        res,
        1.0,
        "positive part of the worst violation / tolerance of σ_min ≥ 1, κ ≤ √(1+Δ²), ‖R − W‖ ≤ ‖ξ‖",
        rule_exercised(ctx),
    )


def _tikhonov_polar(a: np.ndarray) -> np.ndarray:
    """polar(A) computed as A(AᵀA + τI)^{-1/2} with τ = ``POLAR_TIKHONOV`` (a regularised
    inverse square root, a guard against rank deficiency): columns short by ≈ τ/(2σ²)."""
    lam, q = np.linalg.eigh(sym(a.T @ a))
    return a @ (q * (lam + POLAR_TIKHONOV) ** -0.5) @ q.T


def gram_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``float64_gram`` ((W + ξ)ᵀ(W + ξ) = I + ξᵀξ at every step of the rule, bound
    ``gram_tolerance``); control, a near miss: the polar retraction regularised by
    ``POLAR_TIKHONOV`` (``_tikhonov_polar``), substituted into ``reference.linalg``, so the
    rule's points leave St(d, r) by ‖WᵀW − I‖ ≈ τ√r and the identity fails by as much."""
    with substituted(ref.linalg, "polar", _tikhonov_polar) if wrong else contextlib.nullcontext():
        return float64_gram(ctx, False)


def orthonormality_enclosure(ctx: Context, wrong: bool) -> Outcome:
    """The float64 polar retraction's output, rigorously: at each of the rule's steps (St(64,
    16), Δ = 0.4), W' = R_W(ξ) as the reference computes it, and the upper end of a ball
    enclosing ‖W'ᵀW' − I‖_F for those float64 entries (``rigorous``, 256 bits) held to
    ``frame_error(64, 16, κ)``, κ = sqrt(1 + Δ²) the bound of this proposition on κ(W + ξ).
    Residual: the largest ratio, tolerance 1. Control, a near miss: the regularised polar of
    ``gram_resolution`` (τ = ``POLAR_TIKHONOV``), substituted into ``reference.linalg``."""
    geometry = ref.Stiefel(D, R)
    with substituted(ref.linalg, "polar", _tikhonov_polar) if wrong else contextlib.nullcontext():
        outputs = [geometry.retract(w, xi) for w, xi in rule_steps(ctx, False)]
    bound = frame_error(D, R, kappa=float(np.sqrt(1 + DELTA**2)))
    # np.max propagates a NaN (max() would drop it), so a NaN frame fails the check
    worst = float(np.max([rigorous.orthonormality_upper(w) for w in outputs]))
    return Outcome.bound(
        worst / bound,
        1.0,
        f"max ‖W'ᵀW' − I‖_F ≤ {worst:.3g} (enclosed) over {len(outputs)} retractions; "
        f"frame_error = {bound:.3g}",
        {
            "sizes": f"St({D}, {R}), Δ = {DELTA}",
            "steps": len(outputs),
            "dtypes": f"float64 outputs enclosed in Arb balls at {rigorous.PRECISION} bits",
            "seeds": ctx.seed,
        },
    )


def _drift(xi: np.ndarray) -> float:
    """ε = frame_error(64, 16) + tangent_error(64, 16, ‖ξ‖): the float64 drift of a point and
    the tangency error of a step (the exact-arithmetic part of ``gram_tolerance``)."""
    return frame_error(D, R) + tangent_error(D, R, frobenius(xi))


def defect_enclosure(ctx: Context, wrong: bool) -> Outcome:
    """The Gram identity, rigorously, at every step of the rule (St(64, 16), Δ = 0.4): for the
    float64 W and ξ the reference computes, Arb encloses the exact
    e = ‖(W + ξ)ᵀ(W + ξ) − I − ξᵀξ‖_F = ‖(WᵀW − I) + (Wᵀξ + ξᵀW)‖_F
    (``rigorous.gram_defect_upper``), held to ε (``_drift``). Residual: the largest e/ε,
    tolerance 1. Control: the non-tangent step (``CONTROL``)."""
    steps = list(rule_steps(ctx, wrong))
    worst = max(rigorous.gram_defect_upper(w, xi) / _drift(xi) for w, xi in steps)
    return Outcome.bound(
        worst,
        1.0,
        f"largest enclosed Gram defect / ε over {len(steps)} steps: {worst:.3g}",
        {**rule_exercised(ctx), "dtypes": ENCLOSED},
    )


def conditioning_enclosure(ctx: Context, wrong: bool) -> Outcome:
    """κ₂(W + ξ) ≤ √(1 + Δ²) up to the float64 drift, rigorously, at every step of the rule
    (St(64, 16), Δ = 0.4): Arb encloses the eigenvalues of (W + ξ)ᵀ(W + ξ) for the float64 W
    and ξ, summed exactly (``rigorous.gram_eigenvalue_range``), whose ratio bounds
    κ₂(W + ξ)², held to (1 + Δ² + ε)/(1 − ε) (``_drift``): by Weyl's inequality the
    eigenvalues of I + ξᵀξ + E lie in [1 − ‖E‖₂, 1 + ‖ξ‖₂² + ‖E‖₂], ‖ξ‖₂ ≤ ‖ξ‖_F ≤ Δ, and
    ‖E‖₂ ≤ ε is the other rigorous check's. Residual: the largest ratio, tolerance 1.
    Control: the same rule without its trust cap (steps of norm up to lr·√(d·r) = 1.6)."""
    steps = list(rule_steps(ctx, False, capped=not wrong))
    worst = 0.0
    for w, xi in steps:
        low, high = rigorous.gram_eigenvalue_range(w, xi)
        eps = _drift(xi)
        bound = (1 + DELTA**2 + eps) / (1 - eps)
        worst = max(worst, (high / low if low > 0 else np.inf) / bound)
    return Outcome.bound(
        worst,
        1.0,
        f"largest enclosed κ₂(W + ξ)² / ((1 + Δ² + ε)/(1 − ε)) over {len(steps)} steps: "
        f"{worst:.3g}",
        {**rule_exercised(ctx), "dtypes": ENCLOSED},
    )


def mpmath_gram(ctx: Context, wrong: bool) -> Outcome:
    """The Gram identity at St(6, 3) for a tangent step of norm Δ at 30 and 60 digits, under
    ``gram_tolerance(6, 3, Δ, u)``."""
    rng = np.random.default_rng(ctx.seed)
    w0, z = rng.standard_normal((MP_D, MP_R)), rng.standard_normal((MP_D, MP_R))

    def measure(dps: int) -> float:
        w = mp.polar(mp.to_mp(w0))
        xi = mp.proj(w, mp.to_mp(z))
        xi = xi * (DELTA / mp.frobenius(xi))
        if wrong:
            xi = xi - w * (mp.frobenius(xi) / 2)
        a = w + xi
        return mp.frobenius(a.T @ a - mp.eye(MP_R) - xi.T @ xi)

    return ladder(
        measure,
        lambda u: gram_tolerance(MP_D, MP_R, DELTA, u),
        "‖(W+ξ)ᵀ(W+ξ) − I − ξᵀξ‖",
        exercised={
            "sizes": f"St({MP_D}, {MP_R})",
            "points": "1 random point (polar of a Gaussian)",
            "tangents": f"1 random tangent of norm Δ = {DELTA}",
            "dtypes": "mpmath",
            "seeds": ctx.seed,
        },
    )


def property_conditioning(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ r ≤ d ≤ 64, seeds and ‖ξ‖ = Δ ∈ 10^[-3, 1]: the Gram identity and the
    three bounds, as violation/tolerance ≤ 1."""

    def measure(example) -> tuple[float, float]:
        (d, r), seed, delta_exp = example
        delta = 10.0**delta_exp
        rng = np.random.default_rng(seed)
        geometry = ref.Stiefel(d, r)
        w = geometry.random_point(rng)
        xi = delta * geometry.random_tangent(w, rng)
        if wrong:
            xi = corrupt(w, xi)
        gram = gram_residual(w, xi) / gram_tolerance(d, r, frobenius(xi))
        return max(gram, bound_violation(w, xi, delta)), 1.0

    # St(1, 1) has only the zero tangent vector, where every claim is trivial: start at d = 2.
    min_d, delta_range = 2, (-3, 1)
    space = over_shapes(
        st.floats(*delta_range),
        corner=(0, 0.0),
        min_d=min_d,
        options=f"‖ξ‖ = Δ ∈ 10^[{delta_range[0]}, {delta_range[1]}]",
        tangents="1 random tangent per example",
    )
    what = "violation / tolerance, Gram identity and bounds"
    return property_check(ctx, measure=measure, what=what, **space)


register(
    Proposition(
        id="RA-3",
        title="Conditioning of the polar retraction",
        statement=(
            r"For $W\in\mathrm{St}(d,r)$ and $\xi\in T_W\mathrm{St}(d,r)$: "
            r"$(W+\xi)^\top(W+\xi)=I_r+\xi^\top\xi$, hence $\sigma_{\min}(W+\xi)\ge1$; if "
            r"$\|\xi\|\le\Delta$ then $\kappa_2(W+\xi)\le\sqrt{1+\Delta^2}$; and "
            r"$\|R_W(\xi)-W\|\le\|\xi\|$ for the polar retraction "
            r"$R_W(\xi)=(W+\xi)(I_r+\xi^\top\xi)^{-1/2}$. Computed in float64 by the "
            r"reference along a run at $\mathrm{St}(64,16)$ with $\Delta=0.4$, "
            r"$R_W(\xi)$ satisfies $\|R^\top R-I\|_F\le\mathtt{frame\_error}(64,16,"
            r"\sqrt{1+\Delta^2})$, and its points and steps satisfy "
            r"$\|(W+\xi)^\top(W+\xi)-I_r-\xi^\top\xi\|_F\le\varepsilon$ and "
            r"$\kappa_2(W+\xi)^2\le(1+\Delta^2+\varepsilon)/(1-\varepsilon)$ with "
            r"$\varepsilon=\mathtt{frame\_error}(64,16)+\mathtt{tangent\_error}(64,16,"
            r"\|\xi\|)$ (rigorous enclosures of the float64 values)."
        ),
        hypotheses=(
            "WᵀW = I_r",
            "Wᵀξ + ξᵀW = 0",
            "‖ξ‖ ≤ Δ (trust region) for the κ bound",
            "checked: the Gram identity for every d ≥ r (symbolic, with matrix symbols, and "
            "machine-checked); the three bounds along the rule at St(64, 16) and over "
            "1 ≤ r ≤ d ≤ 64 with ‖ξ‖ ∈ [1e-3, 10] (property)",
        ),
        checks=(
            machine_check("RA-3"),
            Check(
                "symbolic",
                "Gram identity and the scalar bounds",
                symbolic_gram,
                f"tangency dropped ({TANGENCY})",
            ),
            Check("float64", "Gram identity along the rule", float64_gram, CONTROL),
            Check(
                "float64",
                f"resolution: points {POLAR_TIKHONOV:g}·√r off St(d, r) are caught",
                gram_resolution,
                f"near miss: the polar retraction computed as A(AᵀA + τI)^(-1/2) with "
                f"τ = {POLAR_TIKHONOV:g} (a regularised inverse square root), substituted into "
                "reference.linalg",
            ),
            Check("float64", "σ_min, κ and displacement bounds", float64_bounds, CONTROL),
            Check(
                "rigorous",
                "the float64 retraction's ‖RᵀR − I‖, enclosed",
                orthonormality_enclosure,
                f"near miss: the polar retraction regularised by τ = {POLAR_TIKHONOV:g}, "
                "substituted into reference.linalg",
                unavailable=rigorous.unavailable,
            ),
            Check(
                "rigorous",
                "the Gram identity along the rule, enclosed",
                defect_enclosure,
                CONTROL,
                unavailable=rigorous.unavailable,
            ),
            Check(
                "rigorous",
                "κ₂(W + ξ) ≤ √(1 + Δ²) along the rule, enclosed",
                conditioning_enclosure,
                "the rule without its trust cap (steps longer than Δ)",
                unavailable=rigorous.unavailable,
            ),
            Check("mpmath", "Gram residual falls with precision", mpmath_gram, CONTROL),
            Check(
                "property",
                "identity and bounds over shapes, seeds, Δ",
                property_conditioning,
                CONTROL,
            ),
        ),
    )
)
