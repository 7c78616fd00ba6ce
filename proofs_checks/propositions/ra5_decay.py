"""RA-5: weight decay has zero Riemannian gradient on St(d, r), and its three corollaries."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import sympy as sp
from hypothesis import strategies as st

import reference as ref
from proofs_checks.bounds import frame_error, gamma, step_error, trajectory_tolerance
from proofs_checks.harness import (
    frame_problem,
    identities,
    ladder,
    max_distance,
    property_check,
    substituted,
    trajectory,
)
from proofs_checks.machine_checked import machine_check
from proofs_checks.propositions.common import LR, MP_D, MP_R, STEPS, D, R
from proofs_checks.propositions.ra_shapes import over_shapes
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference.linalg import frobenius, polar_svd, sym
from reference.optim import FrameDecayWarning

#: The decay rate of the corollary checks (lr·λ = 0.05 < 1).
LAMBDA = 10.0
OFF = 1.1  # the negative control's point c·W, off the manifold for c ≠ 1
#: What the controls that move W off the manifold break.
OFF_MANIFOLD = "breaks the hypothesis: WᵀW = I_r, not the code"
#: The near miss of ``normal_resolution``: the projection keeps this fraction of the normal
#: part, so the decay's Riemannian gradient is λ·NORMAL_KEPT·W, not 0: ‖P_W(W)‖ = NORMAL_KEPT·√r,
#: about 18 × ``normal_tolerance(64, 16)``.
NORMAL_KEPT = 1e-11
#: The trust radius of the decay trajectories (``decay_path``).
DECAY_RADIUS = 0.05


def normal_tolerance(d: int, r: int, u: float | None = None) -> float:
    """Bound on ‖P_W(W)‖ = ‖W(I − sym(WᵀW))‖ for a computed W: ‖W‖₂·‖WᵀW − I‖ plus the two
    products' rounding (γ_d + γ_r)·r, doubled: frame_error + 2(γ_d + γ_r)·r."""
    args = () if u is None else (u,)
    return frame_error(d, r, *args) + 2 * (gamma(d, *args) + gamma(r, *args)) * r


def symbolic_normal(ctx: Context, wrong: bool) -> Outcome:
    """SymPy with d×r matrix symbols: W − W·sym(WᵀW) = 0 once WᵀW = I; for scalars c > 0,
    c·(c²)^{-1/2} = 1 (so polar(cA) = polar(A)); and (1 − a)W + ξ = (1 − a)(W + ξ/(1 − a)).
    Control: W off the manifold (WᵀW = c²I with c ≠ 1)."""
    d, r = sp.symbols("d r", integer=True, positive=True)
    c, a = sp.symbols("c a", positive=True)
    w, xi = sp.MatrixSymbol("W", d, r), sp.MatrixSymbol("xi", d, r)
    gram = (OFF**2 if wrong else 1) * sp.Identity(r)
    normal = sp.expand(w - w * (w.T * w + (w.T * w).T) / 2).subs({w.T * w: gram})
    left = [
        normal,
        c * (c**2) ** sp.Rational(-1, 2) - 1,
        (1 - a) * w + xi - (1 - a) * (w + xi / (1 - a)),
    ]
    symbols = f"{w.shape[0]}×{w.shape[1]} matrix symbols W, ξ (d, r symbolic); scalar c, a"
    return identities(left, symbols)


def float64_normal(ctx: Context, wrong: bool) -> Outcome:
    """‖P_W(W)‖ at every point of a 6-step trajectory at St(64, 16); bound ``normal_tolerance``."""
    prob = frame_problem(D, R, STEPS, ctx.seed)
    steps, _ = trajectory(ref.optim.riemannian_adam(lr=LR), prob.geometry, prob.w0, prob.grads)
    scale = OFF if wrong else 1.0
    res = max(frobenius(prob.geometry.proj(scale * s.w, scale * s.w)) for s in steps)
    return Outcome.bound(
        res,
        normal_tolerance(D, R),
        "max_t ‖P_W(W)‖ along the trajectory",
        {
            "sizes": f"St({D}, {R})",
            "steps": STEPS,
            "points": f"{len(steps)} trajectory points",
            "options": f"riemannian_adam lr {LR}",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def _leaky_proj(self, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``Stiefel.proj`` that removes only 1 − ``NORMAL_KEPT`` of the normal part:
    Z − (1 − δ)·W sym(WᵀZ), i.e. P_W(Z) + δ·W sym(WᵀZ) (a normal component kept)."""
    return z - (1.0 - NORMAL_KEPT) * (x @ sym(x.T @ z))


def normal_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``float64_normal`` (‖P_W(W)‖ at every point of a 6-step trajectory at St(64, 16), bound
    ``normal_tolerance``); control, a near miss: the projection keeps ``NORMAL_KEPT`` of the
    normal part (``_leaky_proj``), substituted into ``reference.Stiefel``, so the decay's
    Riemannian gradient P_W(λW) is λ·δ·W, of norm λ·δ·√r, instead of 0."""
    with substituted(ref.Stiefel, "proj", _leaky_proj) if wrong else contextlib.nullcontext():
        return float64_normal(ctx, False)


def decay_path(prob, decay: str | None, weight_decay: float = LAMBDA):
    opt = ref.optim.riemannian_adam(
        lr=LR,
        trust_radius=DECAY_RADIUS,
        weight_decay=0.0 if decay is None else weight_decay,
        decay=decay or "coupled",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FrameDecayWarning)
        steps, last = trajectory(opt, prob.geometry, prob.w0, prob.grads)
    return opt, steps, [s.w for s in steps] + [last]


def unprojected_after(prob) -> list[np.ndarray]:
    """The control: W ← (1 − lr·λ)·R_W(ξ) without the re-projection. One step suffices (the
    optimizer refuses to step from the off-manifold point it leaves)."""
    opt = decay_path(prob, None)[0]
    w, _ = opt.step(prob.geometry, prob.w0, prob.grads[0], opt.init(prob.geometry, prob.w0))
    return [prob.w0, (1 - LR * LAMBDA) * w]


def float64_corollaries(ctx: Context, wrong: bool) -> Outcome:
    """λ = 10, lr·λ = 0.05: coupled decay and decay after the retraction (with its re-projection)
    leave the 6-step trajectory unchanged (bound ``trajectory_tolerance``); fused decay steps to
    polar(W + ξ/(1 − lr·λ)) computed by SVD (bound ``step_error``) and so moves further. Residual:
    the worst of the three distances over its bound (tolerance 1). Control: decay after the
    retraction without the re-projection, i.e. a decay that would really shrink a frame."""
    prob = frame_problem(D, R, STEPS, ctx.seed)
    _, _, plain = decay_path(prob, None)
    ratios, modes = [], ("coupled", "after")
    for mode in modes:
        path = unprojected_after(prob) if wrong and mode == "after" else decay_path(prob, mode)[2]
        ratios.append(max_distance(plain[: len(path)], path) / trajectory_tolerance(D, R, STEPS))
    _, steps, fused = decay_path(prob, "fused")
    fused_gap, inflation = 0.0, 0.0
    for s, y in zip(steps, fused[1:], strict=True):
        expected = polar_svd(s.w + s.xi / (1 - LR * LAMBDA))
        fused_gap = max(fused_gap, frobenius(y - expected) / step_error(D, R))
        inflation = max(inflation, frobenius(y - prob.geometry.retract(s.w, s.xi)))
    ratios.append(fused_gap)
    return Outcome.bound(
        max(ratios),
        1.0,
        "worst of coupled, after, fused distance / bound; fused steps move up to "
        f"{inflation:.2e} further than undecayed ones",
        {
            "sizes": f"St({D}, {R})",
            "steps": STEPS,
            "options": f"decay ∈ {{none, {', '.join(modes)}, fused}}, λ = {LAMBDA:g}, "
            f"lr·λ = {LR * LAMBDA:g}, trust radius {DECAY_RADIUS}",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def mpmath_normal(ctx: Context, wrong: bool) -> Outcome:
    """‖P_W(W)‖ for W = polar(A) at St(6, 3) computed at 30 and 60 digits, under
    ``normal_tolerance(6, 3, u)``."""
    a = np.random.default_rng(ctx.seed).standard_normal((MP_D, MP_R))

    def measure(dps: int) -> float:
        w = mp.polar(mp.to_mp(a)) * (OFF if wrong else 1)
        return mp.frobenius(mp.proj(w, w))

    return ladder(
        measure,
        lambda u: normal_tolerance(MP_D, MP_R, u),
        "‖P_W(W)‖",
        exercised={
            "sizes": f"St({MP_D}, {MP_R})",
            "points": "1 random point (polar of a Gaussian)",
            "dtypes": "mpmath",
            "seeds": ctx.seed,
        },
    )


def property_coupled(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ r ≤ d ≤ 64, seeds and λ ∈ 10^[-4, 2]: ‖P_W(W)‖ ≤ ``normal_tolerance``
    and one coupled-decay step equals the undecayed step within (1 + λ)·``step_error`` (the decay
    adds λ·fl(P_W(W)), of size ≤ λ·normal_tolerance ≤ λ·step_error, before the scale-free
    normalisation); residual the worst ratio to its bound (tolerance 1). Control: W off the
    manifold."""

    steps_run, lam_range = 1, (-4, 2)

    def measure(example) -> tuple[float, float]:
        (d, r), seed, lam_exp = example
        prob = frame_problem(d, r, steps_run, seed)
        if wrong:
            prob.w0 = OFF * prob.w0
        normal = frobenius(prob.geometry.proj(prob.w0, prob.w0)) / normal_tolerance(d, r)
        if wrong:
            return normal, 1.0
        plain = decay_path(prob, None)[2]
        decayed = decay_path(prob, "coupled", 10.0**lam_exp)[2]
        bound = (1 + 10.0**lam_exp) * step_error(d, r)
        return max(normal, max_distance(plain, decayed) / bound), 1.0

    space = over_shapes(
        st.floats(*lam_range),
        corner=(0, 0.0),
        steps=steps_run,
        options=f"coupled decay λ = 10^[{lam_range[0]}, {lam_range[1]}] vs none, "
        f"lr {LR}, trust radius {DECAY_RADIUS}",
    )
    what = "‖P_W(W)‖ and the coupled-decay step"
    return property_check(ctx, measure=measure, what=what, **space)


register(
    Proposition(
        id="RA-5",
        title="Zero Riemannian gradient of weight decay",
        statement=(
            r"On $\mathrm{St}(d,r)$ the Riemannian gradient of $\tfrac\lambda2\|W\|^2$ is "
            r"$P_W(\lambda W)=\lambda(W-W\,\mathrm{sym}(W^\top W))=0$. Hence coupled decay leaves "
            r"every step unchanged; decay applied after the retraction is undone by the "
            r"re-projection, $\mathrm{polar}(cW)=W$ for $c>0$; and decay fused before the "
            r"retraction gives $\mathrm{polar}((1-\eta\lambda)W+\xi)="
            r"\mathrm{polar}(W+\xi/(1-\eta\lambda))$ "
            r"for $\eta\lambda<1$, an inflated step."
        ),
        hypotheses=("WᵀW = I_r", "η·λ < 1 for the fused form", "polar is the true polar map"),
        checks=(
            machine_check("RA-5"),
            Check(
                "symbolic",
                "P_W(W) = 0 and the decay identities",
                symbolic_normal,
                f"W off the manifold ({OFF_MANIFOLD})",
            ),
            Check(
                "float64",
                "P_W(W) = 0 along a trajectory",
                float64_normal,
                f"W scaled by {OFF} ({OFF_MANIFOLD})",
            ),
            Check(
                "float64",
                f"resolution: a decay gradient of λ·{NORMAL_KEPT:g}·W is caught",
                normal_resolution,
                f"near miss: the projection keeps {NORMAL_KEPT:g} of the normal part, "
                f"Z − (1 − {NORMAL_KEPT:g})·W sym(WᵀZ), substituted into reference.Stiefel",
            ),
            Check(
                "float64",
                "the three decay corollaries",
                float64_corollaries,
                "unprojected decay after the retraction",
            ),
            Check(
                "mpmath",
                "‖P_W(W)‖ falls with precision",
                mpmath_normal,
                f"W scaled by {OFF} ({OFF_MANIFOLD})",
            ),
            Check(
                "property",
                "coupled decay over shapes, seeds, λ",
                property_coupled,
                f"W scaled by {OFF} ({OFF_MANIFOLD})",
            ),
        ),
    )
)
