"""RA-6: a loss of W_Q W_Kᵀ has no gradient along the gauge directions (W_QΩ, W_KΩ).

The gradient is taken by differentiating the loss itself, entry by entry (the complex step
Im L(W + ihE_ab)/h), not from a closed form written as (H W_K, Hᵀ W_Q), whose gauge residual
skew(W_QᵀHW_K + W_KᵀHᵀW_Q) vanishes for every H whatever the loss. The closed form is checked
against that derivative, and is what the optimizer steps use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import mpmath
import numpy as np

import reference as ref
from proofs_checks.bounds import frame_error, gamma, unit_roundoff
from proofs_checks.harness import ladder, property_check, substituted
from proofs_checks.machine_checked import machine_check
from proofs_checks.propositions.common import LR, MP_D, MP_R, RADIUS, STEPS, D, R
from proofs_checks.propositions.ra_shapes import over_shapes
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp
from reference import optim as ro
from reference.linalg import frobenius, skew

TOKENS = 8
#: The complex step: a power of two, so that dividing by it is exact; h² underflows to 0, so
#: the derivative carries no truncation error.
STEP = 2.0**-600
CONTROL = "the closed form with a dropped transpose, G_K = H W_Q"
#: The Adam hyperparameters of the step checks (``vertical_parts``): β1 = 0, so m̂ = g.
VERTICAL_BETAS, VERTICAL_EPS = (0.0, 0.999), 1e-8
#: The near miss of ``vertical_resolution``: W_K's Adam direction this much relative longer
#: than W_Q's, so a_K = a_Q·(1 + δ) where one shared moment gives a_Q = a_K: a vertical part
#: ½·δ·a·‖skew(W_KᵀG_K)‖, 16–21 × ``vertical_parts``' bound (seeds 0–2).
SHARED_NEAR_MISS = 3e-10
Array = np.ndarray


def head_problem(d: int, r: int, seed: int) -> tuple[Array, Array, Array]:
    """A pair of frames W_Q, W_K ∈ St(d, r) and tokens X ∈ R^{8×d} (Gaussian rows)."""
    rng = np.random.default_rng(seed)
    frame = ref.Stiefel(d, r)
    return frame.random_point(rng), frame.random_point(rng), rng.standard_normal((TOKENS, d))


def _logcosh(z: Array) -> Array:
    """log cosh, entrywise, for float, complex or mpmath object arrays (|Re z| ≤ ‖x_i‖‖x_j‖,
    far below cosh's overflow at 710 for the sizes here)."""
    if z.dtype == object:
        return np.vectorize(lambda v: mpmath.log(mpmath.cosh(v)), otypes=[object])(z)
    return np.log(np.cosh(z))


def loss(x: Array, wq: Array, wk: Array) -> Array:
    """L(W_Q, W_K) = Σ_ij log cosh((X W_Q)(X W_K)ᵀ)_ij, a nonlinear function of W_Q W_Kᵀ alone
    (the attention logits of one head through log cosh); batched over leading axes of W_Q or
    W_K, analytic in their entries (complex arguments allowed)."""
    z = (x @ wq) @ np.swapaxes(x @ wk, -1, -2)
    return np.sum(_logcosh(z), axis=(-2, -1))


def complex_step_gradient(
    x: Array, wq: Array, wk: Array, h: float = STEP, chunk: int = 512
) -> tuple[Array, Array]:
    """(∂L/∂W_Q, ∂L/∂W_K) entry by entry as Im L(W + ihE_ab)/h (Squire & Trapp 1998): one loss
    evaluation per entry, in batches of ``chunk``; no subtraction, so no cancellation, and with
    h² below the smallest float the result is the derivative up to rounding."""

    def partials(w: Array, at: Callable[[Array], Array]) -> Array:
        n = w.size
        out = np.empty(n)
        for start in range(0, n, chunk):
            idx = np.arange(start, min(start + chunk, n))
            batch = np.repeat(w[None].astype(complex), len(idx), axis=0)
            batch.reshape(len(idx), -1)[np.arange(len(idx)), idx] += 1j * h
            out[idx] = at(batch).imag / h
        return out.reshape(w.shape)

    return (
        partials(wq, lambda b: loss(x, b, wk)),
        partials(wk, lambda b: loss(x, wq, b)),
    )


def mp_complex_step_gradient(x: Array, wq: Array, wk: Array) -> tuple[Array, Array]:
    """``complex_step_gradient`` in mpmath at the working precision (object arrays of mpc),
    h = 10^(−3·dps) (truncation h²·L''' far below the precision)."""
    h = mpmath.mpf(10) ** (-3 * mpmath.mp.dps)

    def partials(w: Array, at: Callable[[Array], object]) -> Array:
        out = np.empty(w.shape, dtype=object)
        for idx in np.ndindex(*w.shape):
            moved = w.astype(object).copy()
            moved[idx] = mpmath.mpc(moved[idx], h)
            out[idx] = mpmath.im(at(moved)) / h
        return out

    return (
        partials(wq, lambda b: loss(x, b, wk)),
        partials(wk, lambda b: loss(x, wq, b)),
    )


def closed_form_gradient(x: Array, wq: Array, wk: Array, wrong: bool = False, tanh=np.tanh):
    """H = ∂L/∂(W_Q W_Kᵀ) = Xᵀ tanh(X W_Q W_Kᵀ Xᵀ) X; (G_Q, G_K) = (H W_K, Hᵀ W_Q), or with
    ``wrong`` the transpose dropped, G_K = H W_Q (the control). Returns (H, G_Q, G_K)."""
    h = x.T @ tanh((x @ wq) @ (x @ wk).T) @ x
    return h, h @ wk, (h if wrong else h.T) @ wq


# -- rounding bounds -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Scales:
    """What the bounds depend on: d, r, the row norms a_i = ‖x_i‖ through Σa_i and ρ = Σa_i²,
    the loss value, and the unit roundoff."""

    d: int
    r: int
    sum_a: float
    rho: float
    loss: float
    u: float

    @classmethod
    def of(cls, x: Array, wq: Array, wk: Array, u: float | None = None) -> Scales:
        a = np.linalg.norm(np.asarray(x, dtype=float), axis=1)
        value = float(loss(np.asarray(x, float), np.asarray(wq, float), np.asarray(wk, float)))
        d, r = np.shape(wq)
        return cls(d, r, float(a.sum()), float(a @ a), value, unit_roundoff() if u is None else u)

    def gamma(self, k: int) -> float:
        return gamma(k, self.u)

    @property
    def logits(self) -> float:
        """c_Z with |fl(Z)_ij − Z_ij| ≤ c_Z·a_i·a_j for Z = (X W_Q)(X W_K)ᵀ, also with W_Q
        replaced by fl(W_Q Q): each of X W_Q, X W_K is off by ≤ γ_d·a_i·√r per row, W_Q Q by
        ≤ γ_r·r, the outer product adds γ_r (rows of norm ≤ a_i): ≤ 5r·γ_{d+2r}."""
        return 5 * self.r * self.gamma(self.d + 2 * self.r)

    @property
    def gradient(self) -> float:
        """B_G ≥ ‖fl(G_F) − G_F‖ for the complex-step and the closed-form gradient of one frame.
        Every entry is Σ_ij tanh(Z_ij)·X_ia·(X W_K)_jb (or its transpose): the logits' error
        moves tanh by ≤ c_Z·a_i·a_j (|tanh'| ≤ 1), giving ≤ c_Z·ρ² in Frobenius norm; the
        products and the sum over T² terms (γ_d + γ_{T²}), and tanh, the complex log and cosh or
        the closed form's extra products (≤ 5u), give ≤ (γ_d + γ_{T²} + 5u)·√r·(Σa)²
        (Σ_ij |X_ia|·(|X||W|)_jb is a rank-one matrix of norm ≤ Σa·√r·Σa)."""
        k = self.gamma(self.d) + self.gamma(TOKENS**2) + 5 * self.u
        return k * np.sqrt(self.r) * self.sum_a**2 + self.logits * self.rho**2

    def gauge(self, wq: Array, wk: Array, gq: Array, gk: Array) -> float:
        """Bound on ‖skew(W_QᵀG_Q + W_KᵀG_K)‖ for computed gradients within B_G of the exact
        ones, whose gauge residual is exactly 0: (‖W_Q‖₂ + ‖W_K‖₂)·B_G, plus the products
        W_FᵀG_F (γ_d·√r·‖G_F‖ each) and the sum and skew (2u, folded into γ_{d+2})."""
        spectral = float(np.linalg.norm(np.asarray(wq, float), 2))
        spectral += float(np.linalg.norm(np.asarray(wk, float), 2))
        products = self.gamma(self.d + 2) * np.sqrt(self.r) * (_norm(gq) + _norm(gk))
        return spectral * self.gradient + products

    def invariance(self, q: Array, wq: Array, wk: Array) -> float:
        """Bound on |L(W_Q Q, W_K Q) − L(W_Q, W_K)|: each evaluation is off by ≤ c_Z·(Σa)²
        (Σ_ij |tanh|·|ΔZ_ij|) plus log cosh and the sum of T² terms, (γ_{T²} + 3u)·L; the stored
        Q is orthogonal only to ‖QQᵀ − I‖₂, which moves the product W_Q Q Qᵀ W_Kᵀ and so L by
        ≤ ‖QQᵀ − I‖₂·‖W_Q‖₂‖W_K‖₂·(Σa)²."""
        one = self.logits * self.sum_a**2 + (self.gamma(TOKENS**2) + 3 * self.u) * abs(self.loss)
        off = float(np.linalg.norm(q @ q.T - np.eye(len(q)), 2))
        moved = off * np.linalg.norm(wq, 2) * np.linalg.norm(wk, 2) * self.sum_a**2
        return 2 * one + float(moved)


def _norm(a: Array) -> float:
    return float(mp.frobenius(a)) if a.dtype == object else frobenius(a)


def vertical_residual(wq: Array, wk: Array, gq: Array, gk: Array) -> float:
    """‖skew(W_QᵀG_Q + W_KᵀG_K)‖ (float or mpmath arrays)."""
    if gq.dtype == object:
        return float(mp.frobenius(mp.skew(wq.T @ gq + wk.T @ gk)))
    return frobenius(skew(wq.T @ gq + wk.T @ gk))


# -- checks ----------------------------------------------------------------------------------------
def gauge_ratios(wq: Array, wk: Array, x: Array, seed: int, wrong: bool) -> dict[str, float]:
    """Each measurement over its bound (``Scales``): the loss at (W_Q Q, W_K Q) for a Haar
    Q ∈ O(r); the gauge residual of the complex-step gradient; the closed form's distance to
    it (≤ 2·B_G per frame, √2 for the pair: 3·B_G); and the closed form's gauge residual
    (the closed form with a dropped transpose under ``wrong``)."""
    sc = Scales.of(x, wq, wk)
    q = ref.linalg.haar_orthogonal(wq.shape[1], np.random.default_rng([seed, 6]))
    moved = abs(float(loss(x, wq @ q, wk @ q)) - sc.loss)
    cq, ck = complex_step_gradient(x, wq, wk)
    _, gq, gk = closed_form_gradient(x, wq, wk, wrong)
    apart = float(np.hypot(frobenius(gq - cq), frobenius(gk - ck)))
    return {
        "invariance": moved / sc.invariance(q, wq, wk),
        "complex-step gauge": vertical_residual(wq, wk, cq, ck) / sc.gauge(wq, wk, cq, ck),
        "closed form vs complex step": apart / (3 * sc.gradient),
        "closed-form gauge": vertical_residual(wq, wk, gq, gk) / sc.gauge(wq, wk, gq, gk),
    }


def _log2(h: float) -> str:
    """A power of two as 2^k."""
    return f"2^{np.log2(h):.0f}"


def float64_gauge(ctx: Context, wrong: bool) -> Outcome:
    """At St(64, 16) for the log-cosh attention-logit loss (``loss``), each measurement of
    ``gauge_ratios`` within its rounding bound: L(W_Q Q, W_K Q) = L for a Haar Q;
    skew(W_QᵀG_Q + W_KᵀG_K) = 0 for the gradient differentiated from L itself (the complex
    step, ``complex_step_gradient``: 2·64·16 loss evaluations); the closed form
    (HW_K, HᵀW_Q) equals that gradient, and so has no vertical part either. Residual: the
    largest ratio, tolerance 1. Control: the closed form with a dropped transpose,
    G_K = H W_Q."""
    wq, wk, x = head_problem(D, R, ctx.seed)
    ratios = gauge_ratios(wq, wk, x, ctx.seed, wrong)
    detail = ", ".join(f"{k} {v:.1e}" for k, v in ratios.items())
    return Outcome.bound(
        max(ratios.values()),
        1.0,
        f"measurement/bound: {detail}",
        {
            "sizes": f"St({D}, {R}) × St({D}, {R}), {len(x)} tokens in R^{x.shape[1]}",
            "options": f"log-cosh loss, complex step h = {_log2(STEP)}, Haar Q ∈ O({R})",
            "samples": f"{wq.size + wk.size} complex-step loss evaluations",
            "dtypes": "float64 (complex128 for the complex step)",
            "seeds": ctx.seed,
        },
    )


def frame_scalar(
    rgrads: tuple[Array, ...], sqrt_v_hat: float, eps: float, radius: float | None
) -> float:
    """a_F of one moment group (its Riemannian gradients ``rgrads``): the step is
    ξ = −a_F·P_W(G) with a_F = lr·c/(√v̂ + ε), c = min(1, Δ/‖ξ_uncapped‖) the trust-region
    factor (β1 = 0: m̂ = g)."""
    norm = float(np.sqrt(sum(frobenius(p) ** 2 for p in rgrads)))
    scale = LR / (sqrt_v_hat + eps)
    return scale if radius is None or scale * norm <= radius else radius / norm


def _proj(w: Array, g: Array) -> Array:
    return g - w @ ref.linalg.sym(w.T @ g)


def vertical_parts(
    ctx: Context, shared: bool, radius: float | None, wrong: bool
) -> tuple[float, float, str]:
    """Six steps of riemannian_adam (β1 = 0, ε = 1e-8) on the pair at St(64, 16), with one
    scalar moment shared by the pair or one per frame, the trust region Δ or none, gradients
    of ``loss`` by the closed form (the dropped transpose under ``wrong``): the largest
    ‖Ω − Ω_pred‖ over its bound, Ω = ½skew(W_Qᵀξ_Q + W_Kᵀξ_K) of the library's step and
    Ω_pred = −½(a_Q − a_K)·skew(W_QᵀG_Q) (``frame_scalar``), and the smallest ‖Ω_pred‖.

    Bound: ξ_F = −a_F·P_W(G_F) and W_FᵀP_W(G_F) = skew(W_FᵀG_F) − (W_FᵀW_F − I)sym(W_FᵀG_F);
    so Ω − Ω_pred = −½a_K·(S_Q + S_K) + rounding, S_F = skew(W_FᵀG_F). ‖S_Q + S_K‖ ≤
    2γ_{2d}·r·‖H‖ for the closed form (W_QᵀHW_K against the transpose of W_KᵀHᵀW_Q); per frame
    the step's scalars and cap (relative 2γ_{2dr} + 18u, ``eps_identity_tolerance``'s terms,
    with the check's own cap), the product W_Fᵀξ_F (γ_d·√r·‖P_W G‖), the projection, twice
    (the library's and the check's, (2γ_d + 2γ_r)·√r·‖G‖ each) and the frame's orthonormality
    (``frame_error``·‖G‖): ½Σ_F a_F·E_F + ½a_K·2γ_{2d}·r·‖H‖, and γ_d·√r·‖G_Q‖·½|a_Q − a_K|
    for the prediction's product."""
    wq, wk, x = head_problem(D, R, ctx.seed)
    pair = ref.Product(ref.Stiefel(D, R), ref.Stiefel(D, R), shared_moment=shared)
    eps = VERTICAL_EPS
    opt = ref.optim.riemannian_adam(lr=LR, betas=VERTICAL_BETAS, eps=eps, trust_radius=radius)
    point, state = (wq, wk), opt.init(pair, (wq, wk))
    worst, smallest = 0.0, np.inf
    for _ in range(STEPS):
        h, gq, gk = closed_form_gradient(x, *point, wrong=wrong)
        xi, new_state = opt.update(pair, point, (gq, gk), state)
        adam_state = new_state[0]
        c2 = np.sqrt(1 - VERTICAL_BETAS[1] ** adam_state.count)
        rg = (_proj(point[0], gq), _proj(point[1], gk))
        if shared:
            scalars = (frame_scalar(rg, adam_state.sqrt_v[0] / c2, eps, radius),) * 2
        else:
            scalars = tuple(
                frame_scalar((g,), sv / c2, eps, radius)
                for g, sv in zip(rg, adam_state.sqrt_v, strict=True)
            )
        omega = 0.5 * skew(point[0].T @ xi[0] + point[1].T @ xi[1])
        predicted = -0.5 * (scalars[0] - scalars[1]) * skew(point[0].T @ gq)
        worst = max(worst, frobenius(omega - predicted) / _step_bound((gq, gk), rg, h, scalars))
        smallest = min(smallest, frobenius(predicted))
        moved = opt.move(pair, point, xi)
        state, point = opt.transform.transport(pair, point, moved, new_state), moved
    label = f"{'shared' if shared else 'separate'}, Δ = {radius}"
    return worst, smallest, f"{label}: {worst:.1e} (smallest ‖Ω_pred‖ {smallest:.1e})"


def _step_bound(
    grads: tuple[Array, Array], rgrads: tuple[Array, Array], h: Array, scalars: tuple[float, ...]
) -> float:
    """The bound of ``vertical_parts`` at one step (Euclidean and Riemannian gradients, H, and
    the frames' step scalars a_Q, a_K)."""
    u = unit_roundoff()
    root_r = np.sqrt(R)
    per_entry = 2 * gamma(2 * D * R) + 18 * u + gamma(D) * root_r
    projection = 2 * (2 * gamma(D) + 2 * gamma(R)) * root_r + frame_error(D, R)
    frames = sum(
        a * (per_entry * frobenius(g) + projection * frobenius(big))
        for a, g, big in zip(scalars, rgrads, grads, strict=True)
    )
    gauge = scalars[1] * 2 * gamma(2 * D) * R * frobenius(h)
    prediction = abs(scalars[0] - scalars[1]) * gamma(D) * root_r * frobenius(grads[0])
    return 0.5 * (frames + gauge + prediction)


def float64_vertical_step(ctx: Context, wrong: bool) -> Outcome:
    """With β1 = 0 the step's vertical part is Ω = −½(a_Q − a_K)·skew(W_QᵀG_Q),
    a_F = lr·c_F/(√v̂_F + ε) (``vertical_parts``, within its bound): 0 with one moment shared
    by the pair (a_Q = a_K), with and without the trust region (Δ = 0.05, below the uncapped
    steps, ≈ lr·√(d·r) = 0.16 a frame); with separate per-frame moments, without the cap,
    ‖Ω‖ = ½·lr·|1/(√v̂_Q + ε) − 1/(√v̂_K + ε)|·‖skew(W_QᵀG_Q)‖, nonzero (its smallest value
    reported), and with the cap the same with each frame's cap factor. Residual: the largest
    ratio, tolerance 1. Control: the steps taken with the closed-form gradient with a dropped
    transpose (G_K = H W_Q), which has a vertical part of its own."""
    worst, details, moments, radii = 0.0, [], (True, False), (None, RADIUS)
    for shared in moments:
        for radius in radii:
            res, _, detail = vertical_parts(ctx, shared, radius, wrong)
            worst = max(worst, res)
            details.append(detail)
    moment_names = ", ".join("shared" if m else "per frame" for m in moments)
    radius_names = ", ".join("none" if r is None else str(r) for r in radii)
    return Outcome.bound(
        worst,
        1.0,
        "‖Ω − Ω_pred‖/bound over 6 steps; " + "; ".join(details),
        {
            "sizes": f"St({D}, {R}) × St({D}, {R}), {TOKENS} tokens",
            "steps": f"{STEPS} per run, {len(moments) * len(radii)} runs",
            "options": f"moment ∈ {{{moment_names}}}, trust radius ∈ {{{radius_names}}}, "
            f"lr {LR}, β = {VERTICAL_BETAS}, ε {VERTICAL_EPS:g}",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def _second_frame_scaled(original):
    """``scale_by_adam`` whose direction for the second frame of a pair (W_K) is
    ``SHARED_NEAR_MISS`` relative longer than the first's: the shared √v̂ + ε divided by 1 + δ
    for W_K alone, a moment not quite shared (frames with moments of their own are scaled the
    same way, so the prediction from their √v̂ misses by as much)."""

    def variant(b1=0.9, b2=0.999, eps=1e-8, moment="frame", reduction="mean"):
        inner = original(b1, b2, eps, moment, reduction)

        def update(geometry, x, g, state):
            d, new = inner.update(geometry, x, g, state)
            return (d[0], (1.0 + SHARED_NEAR_MISS) * d[1]), new

        return inner._replace(update=update)

    return variant


def vertical_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``float64_vertical_step`` (the step's vertical part ½skew(W_Qᵀξ_Q + W_Kᵀξ_K) against
    −½(a_Q − a_K)·skew(W_QᵀG_Q), over its bound, tolerance 1); control, a near miss: W_K's
    Adam direction ``SHARED_NEAR_MISS`` relative longer (``_second_frame_scaled``),
    substituted into ``reference.optim``, so a_K ≠ a_Q where the moment is shared and the
    vertical part is ½·δ·a_K·‖skew(W_KᵀG_K)‖ instead of 0."""
    variant = _second_frame_scaled(ro.scale_by_adam)
    with substituted(ro, "scale_by_adam", variant) if wrong else contextlib.nullcontext():
        return float64_vertical_step(ctx, False)


def mpmath_gauge(ctx: Context, wrong: bool) -> Outcome:
    """At St(6, 3) with frames, tokens and loss at 30 and 60 digits: the gauge residual of the
    gradient differentiated from L by the complex step in mpmath (``mp_complex_step_gradient``)
    under ``Scales.gauge`` at that precision's u. Control: the closed form with a dropped
    transpose, in mpmath."""
    wq0, wk0, x0 = head_problem(MP_D, MP_R, ctx.seed)
    tanh = np.vectorize(mpmath.tanh, otypes=[object])

    def measure(dps: int) -> float:
        wq, wk, x = mp.polar(mp.to_mp(wq0)), mp.polar(mp.to_mp(wk0)), mp.to_mp(x0)
        if wrong:
            _, gq, gk = closed_form_gradient(x, wq, wk, True, tanh)
        else:
            gq, gk = mp_complex_step_gradient(x, wq, wk)
        return vertical_residual(wq, wk, gq, gk)

    # ‖G_F‖ in the products' term: the float64 values, within 1e-13 of the mpmath ones.
    cq, ck = complex_step_gradient(x0, wq0, wk0)
    return ladder(
        measure,
        lambda u: Scales.of(x0, wq0, wk0, u).gauge(wq0, wk0, cq, ck),
        "‖skew(W_QᵀG_Q + W_KᵀG_K)‖ of the complex-step gradient",
        exercised={
            "sizes": f"St({MP_D}, {MP_R}) × St({MP_D}, {MP_R}), {len(x0)} tokens",
            "options": "log-cosh loss, complex step in mpmath (h = 10^(−3·dps))",
            "samples": f"{wq0.size + wk0.size} complex-step loss evaluations per precision",
            "dtypes": "mpmath",
            "seeds": ctx.seed,
        },
    )


def property_gauge(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 2 ≤ d ≤ 64, 1 ≤ r ≤ d and seeds (the corners r = 1 and r = d at d = 2
    and 64 always): every ratio of ``gauge_ratios`` ≤ 1 (the largest as the residual). Control:
    the closed form with a dropped transpose (at r = 1 skew of a 1×1 matrix is 0, and the
    distance to the complex-step gradient rejects it)."""

    def measure(example) -> tuple[float, float]:
        (d, r), seed = example
        wq, wk, x = head_problem(d, r, seed)
        return max(gauge_ratios(wq, wk, x, seed, wrong).values()), 1.0

    # d = 1: H is 1×1, so the dropped transpose changes nothing; start at d = 2.
    min_d = 2
    space = over_shapes(
        corner=(0,),
        min_d=min_d,
        space="St(d, r) × St(d, r)",
        also=f", {TOKENS} tokens",
        dtypes="float64 (complex128 for the complex step)",
        options=f"log-cosh loss, complex step h = {_log2(STEP)}, Haar Q ∈ O(r)",
    )
    what = "largest measurement/bound of gauge_ratios"
    return property_check(ctx, measure=measure, what=what, **space)


register(
    Proposition(
        id="RA-6",
        title="Gauge directions carry no gradient",
        statement=(
            r"If $L(W_Q,W_K)=f(W_QW_K^\top)$ then $L(W_QQ,W_KQ)=L$ for $Q\in O(r)$, and the "
            r"gradient is orthogonal to every vertical direction $(W_Q\Omega,W_K\Omega)$, "
            r"$\Omega^\top=-\Omega$: $\mathrm{skew}(W_Q^\top G_Q+W_K^\top G_K)=0$. With "
            r"$\beta_1=0$ the Riemannian Adam step "
            r"$\xi_F=-a_F P_{W_F}(G_F)$, $a_F=\mathrm{lr}\,c_F/(\sqrt{\hat v_F}+\varepsilon)$ "
            r"($c_F$ the trust-region factor of $F$'s moment group), has the vertical part "
            r"$\tfrac12\mathrm{skew}(W_Q^\top\xi_Q+W_K^\top\xi_K)="
            r"-\tfrac12(a_Q-a_K)\,\mathrm{skew}(W_Q^\top G_Q)$: none with one scalar moment "
            r"shared by the pair; with separate per-frame moments and no trust region, of norm "
            r"$\tfrac12\mathrm{lr}\,|1/(\sqrt{\hat v_Q}+\varepsilon)-1/(\sqrt{\hat v_K}+"
            r"\varepsilon)|\,\|\mathrm{skew}(W_Q^\top G_Q)\|$."
        ),
        hypotheses=(
            "f: L = Σ_ij log cosh((X W_Q W_Kᵀ Xᵀ)_ij), X ∈ R^{8×d} Gaussian",
            "gradient differentiated from L entry by entry (complex step, h = 2^-600; mpmath: "
            "h = 10^(-3·dps)); the closed form (HW_K, HᵀW_Q) checked against it and used by "
            "the steps",
            "vertical part measured in the product embedded metric",
            "with β1 > 0 projected momentum is not horizontal: compare like with like",
            "checked: the gauge identity for every d ≥ r (machine-checked) and on the "
            "differentiated loss at St(64, 16)² and 2 ≤ d ≤ 64, Q Haar; the vertical part of "
            "the step at St(64, 16)², 6 steps per run, shared and per-frame moments, with and "
            "without the trust region, lr 0.005, ε 1e-8",
        ),
        checks=(
            machine_check("RA-6"),
            Check(
                "float64",
                "invariance and skew(W_QᵀG_Q + W_KᵀG_K) = 0 for the differentiated loss",
                float64_gauge,
                CONTROL,
            ),
            Check(
                "float64",
                "the step's vertical part is −½(a_Q − a_K)·skew(W_QᵀG_Q)",
                float64_vertical_step,
                "steps with the dropped-transpose gradient (breaks the hypothesis: G the "
                "gradient of a loss f(W_Q W_Kᵀ), not the code)",
            ),
            Check(
                "float64",
                f"resolution: frame scalars {SHARED_NEAR_MISS:g} relative apart are caught",
                vertical_resolution,
                f"near miss: W_K's Adam direction times 1 + {SHARED_NEAR_MISS:g} (a moment not "
                "quite shared by the pair), substituted into reference.optim",
            ),
            Check("mpmath", "gauge residual falls with precision", mpmath_gauge, CONTROL),
            Check("property", "gauge residual over shapes and seeds", property_gauge, CONTROL),
        ),
    )
)
