"""RA-6: a loss of W_Q W_Kᵀ has no gradient along the gauge directions (W_QΩ, W_KΩ)."""

from __future__ import annotations

import mpmath
import numpy as np
from hypothesis import strategies as st

import reference as ref
from proofs_checks.bounds import gamma, tangent_error
from proofs_checks.harness import ladder, property_check, seeds, shape_corners, shapes
from proofs_checks.propositions.common import LR, MP_D, MP_R, STEPS, D, R
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference.linalg import frobenius, skew

TOKENS = 8
CONTROL = "the query frame's term alone, skew(W_QᵀG_Q) (not gauge invariant)"


def head_problem(d: int, r: int, seed: int):
    """A pair of frames W_Q, W_K ∈ St(d, r) and tokens X ∈ R^{8×d} (unit-RMS rows)."""
    rng = np.random.default_rng(seed)
    frame = ref.Stiefel(d, r)
    return frame.random_point(rng), frame.random_point(rng), rng.standard_normal((TOKENS, d))


def loss_gradient(x: np.ndarray, wq: np.ndarray, wk: np.ndarray, tanh=np.tanh):
    """L = Σ_ij log cosh((X W_Q W_Kᵀ Xᵀ)_ij), a nonlinear function of the product alone.
    H = ∂L/∂(W_Q W_Kᵀ) = Xᵀ tanh(X W_Q W_Kᵀ Xᵀ) X; G_Q = H W_K, G_K = Hᵀ W_Q."""
    h = x.T @ tanh(x @ wq @ (wk.T @ x.T)) @ x
    return h, h @ wk, h.T @ wq


def gauge_tolerance(d: int, r: int, norm_h, u: float | None = None) -> float:
    """W_QᵀG_Q + W_KᵀG_K = S + Sᵀ with S = W_QᵀHW_K exactly, for the computed H. Each side is two
    products of inner dimension d each: ≤ γ_{2d}‖W_Q‖‖H‖‖W_K‖ = γ_{2d}·r·‖H‖; both sides:
    2γ_{2d}·r·‖H‖."""
    args = () if u is None else (u,)
    return 2 * gamma(2 * d, *args) * r * float(norm_h)


def vertical_residual(wq, wk, gq, gk, wrong: bool) -> float:
    return frobenius(skew(wq.T @ gq) if wrong else skew(wq.T @ gq + wk.T @ gk))


def float64_gauge(ctx: Context, wrong: bool) -> Outcome:
    """‖skew(W_QᵀG_Q + W_KᵀG_K)‖ at St(64, 16) for the log-cosh attention-logit loss;
    bound ``gauge_tolerance``."""
    wq, wk, x = head_problem(D, R, ctx.seed)
    h, gq, gk = loss_gradient(x, wq, wk)
    res = vertical_residual(wq, wk, gq, gk, wrong)
    return Outcome.bound(res, gauge_tolerance(D, R, frobenius(h)), "‖skew(W_QᵀG_Q + W_KᵀG_K)‖")


def vertical_parts(ctx: Context, shared: bool) -> tuple[float, float]:
    """Six steps of riemannian_adam (β1 = 0, cap active) on the pair, gradients of the loss at
    each point: the largest vertical part √2‖Ω‖/‖ξ‖, Ω = ½skew(W_Qᵀξ_Q + W_Kᵀξ_K), and the
    smallest tolerance (gauge bound relative to ‖grad‖ plus twice ``tangent_error``)."""
    wq, wk, x = head_problem(D, R, ctx.seed)
    pair = ref.Product(ref.Stiefel(D, R), ref.Stiefel(D, R), shared_moment=shared)
    opt = ref.optim.riemannian_adam(lr=LR, betas=(0.0, 0.999), trust_radius=0.05)
    point, state = (wq, wk), opt.init(pair, (wq, wk))
    res, tol = 0.0, np.inf
    for _ in range(STEPS):
        h, gq, gk = loss_gradient(x, *point)
        xi, new_state = opt.update(pair, point, (gq, gk), state)
        omega = 0.5 * skew(point[0].T @ xi[0] + point[1].T @ xi[1])
        res = max(res, np.sqrt(2) * frobenius(omega) / pair.norm(point, xi))
        rgrad = pair.norm(point, pair.egrad_to_rgrad(point, (gq, gk)))
        tol = min(tol, gauge_tolerance(D, R, frobenius(h)) / rgrad + 2 * tangent_error(D, R, 1.0))
        moved = opt.move(pair, point, xi)
        state, point = opt.transform.transport(pair, point, moved, new_state), moved
    return res, tol


def float64_vertical_step(ctx: Context, wrong: bool) -> Outcome:
    """With one scalar moment shared by the pair the step has no vertical part (``vertical_parts``).
    The vertical part of the separate-moment step, ∝ (1/√v_Q − 1/√v_K), is measured and
    reported. Control: separate moments per frame."""
    res, tol = vertical_parts(ctx, shared=not wrong)
    separate, _ = vertical_parts(ctx, shared=False)
    return Outcome.bound(
        res,
        tol,
        f"max_t ‖vertical part of ξ_t‖/‖ξ_t‖ over {STEPS} steps; with separate per-frame "
        f"moments it is {separate:.3e}",
    )


def mpmath_gauge(ctx: Context, wrong: bool) -> Outcome:
    """The gauge residual at St(6, 3) with frames, tokens and tanh at 30 and 60 digits."""
    wq0, wk0, x0 = head_problem(MP_D, MP_R, ctx.seed)
    tanh = np.vectorize(mpmath.tanh, otypes=[object])

    def measure(dps: int) -> float:
        wq, wk, x = mp.polar(mp.to_mp(wq0)), mp.polar(mp.to_mp(wk0)), mp.to_mp(x0)
        _, gq, gk = loss_gradient(x, wq, wk, tanh)
        return mp.frobenius(mp.skew(wq.T @ gq) if wrong else mp.skew(wq.T @ gq + wk.T @ gk))

    norm_h = frobenius(loss_gradient(x0, wq0, wk0)[0])  # ‖H‖ agrees with the mpmath one to ~1e-15
    return ladder(
        measure, lambda u: gauge_tolerance(MP_D, MP_R, norm_h, u), "‖skew(W_QᵀG_Q + W_KᵀG_K)‖"
    )


def property_gauge(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ r ≤ d ≤ 64 and seeds: the gauge residual ≤ ``gauge_tolerance``."""

    def measure(example) -> tuple[float, float]:
        (d, r), seed = example
        wq, wk, x = head_problem(d, r, seed)
        h, gq, gk = loss_gradient(x, wq, wk)
        return vertical_residual(wq, wk, gq, gk, wrong), gauge_tolerance(d, r, frobenius(h))

    # r = d = 1: skew of a 1×1 matrix is 0 for the control too; start at d = 2.
    strategy = st.tuples(shapes().filter(lambda s: s[0] > 1), seeds())
    what = "‖skew(W_QᵀG_Q + W_KᵀG_K)‖"
    return property_check(ctx, strategy, measure, what, explicit=shape_corners(0))


register(
    Proposition(
        id="RA-6",
        title="Gauge directions carry no gradient",
        statement=(
            r"If $L(W_Q,W_K)=f(W_QW_K^\top)$ then $L(W_QQ,W_KQ)=L$ for $Q\in O(r)$, and the "
            r"gradient is orthogonal to every vertical direction $(W_Q\Omega,W_K\Omega)$, "
            r"$\Omega^\top=-\Omega$: $\mathrm{skew}(W_Q^\top G_Q+W_K^\top G_K)=0$. A step with one "
            r"scalar moment shared by the pair (at $t=1$, or with $\beta_1=0$) has no vertical "
            r"part; separate per-frame moments give one of size "
            r"$\propto|1/\sqrt{v_Q}-1/\sqrt{v_K}|$."
        ),
        hypotheses=(
            "G_Q = H W_K, G_K = Hᵀ W_Q with H = ∂f/∂(W_Q W_Kᵀ)",
            "vertical part measured in the product embedded metric",
            "with β1 > 0 projected momentum is not horizontal: compare like with like",
        ),
        checks=(
            Check("float64", "skew(W_QᵀG_Q + W_KᵀG_K) = 0", float64_gauge, CONTROL),
            Check(
                "float64",
                "shared-moment steps are horizontal",
                float64_vertical_step,
                "separate per-frame moments",
            ),
            Check("mpmath", "gauge residual falls with precision", mpmath_gauge, CONTROL),
            Check("property", "gauge residual over shapes and seeds", property_gauge, CONTROL),
        ),
    )
)
