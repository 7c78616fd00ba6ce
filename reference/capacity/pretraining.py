"""Pre-training estimators: the structure of the token mixing read from data, before training.

Group 3 of ``reference.capacity`` (with ``token_gram`` and ``token_gram_count``, which are in
``reference.capacity.spectra``): ``ols_static_mixer`` (static surrogate, Y ≈ A X),
``pooled_regression`` (linear QK attention, value map unknown) and ``first_order_softmax``
(softmax attention, first order in β), the last two returning a ``Regression`` with its
cluster-robust standard error, and ``inversion_estimator`` (softmax attention, value map known).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from reference.capacity.validation import EPS, Array, _matrix, _pair


# ---------------------------------------------------------------------------------------------
# 3. Pre-training estimators
# ---------------------------------------------------------------------------------------------
def ols_static_mixer(x: Array, y: Array) -> Array:
    """The least-squares static mixer Â = (Σ_s Y_s X_sᵀ)(Σ_s X_s X_sᵀ)^{-1} ∈ ℝ^{n×n} of the model
    Y ≈ A X (needs d_v = d and S·d ≥ n).

    Consistent for A* when Y = A*X + E (W* = I). With a general W*, E[YXᵀ] = tr(W*)·A*C, so it is
    diluted by tr(W*). Under input-conditioned attention with exchangeable tokens it tends to
    a·I + b·11ᵀ whatever the kernel's rank (EB-5), so no estimator applied to it recovers r*.
    """
    x, y = _pair(x, y)
    if x.shape[2] != y.shape[2]:
        raise ValueError(
            f"the static mixer Y ≈ A X needs d_v = d, got d = {x.shape[2]}, d_v = {y.shape[2]}"
        )
    s, n, d = x.shape
    if s * d < n:
        raise ValueError(f"Σ X Xᵀ is singular: needs S·d ≥ n, got S·d = {s * d} < n = {n}")
    xf = np.swapaxes(x, 0, 1).reshape(n, s * d)
    gyx = np.swapaxes(y, 0, 1).reshape(n, s * d) @ xf.T
    gxx = xf @ xf.T
    return np.linalg.solve(gxx.T, gyx.T).T


class Regression(NamedTuple):
    coef: Array  #: d_v × d (``first_order_softmax``: the coefficient on x_i)
    stderr: float  #: cluster-robust estimate of ‖coef − E coef‖_F (sequence clusters)
    mean_coef: Array | None = None  #: ``first_order_softmax`` only: the coefficient on x̄
    #: The sequences' contributions M_s (S, d_v, d) to coef − E coef = Σ_s M_s, from the
    #: residuals (stderr = sqrt(Σ_s ‖M_s‖_F²)).
    clusters: Array | None = None
    #: The same from the leave-one-sequence-out residuals: M̃_s = coef − coef₍₋ₛ₎, the exact
    #: change of coef when sequence s is left out (``noise_edge``'s default).
    left_out: Array | None = None


def _ols(z: Array, y: Array, block: int | None = None) -> tuple[Array, Array, Array]:
    """OLS of y (S, n, q) on features z (S, n, p): the coefficient B (q × p) of y ≈ B z, and
    two estimates of the sequences' contributions to the error of its first ``block`` columns
    (all by default), each (S, q, block):

        M_s = [(Σ_i e_i z_iᵀ) H^{-1}]_{:, :block},  H = Σ z zᵀ, e the residuals;
        M̃_s = [(Σ_i ẽ_i z_iᵀ) H^{-1}]_{:, :block},  ẽ_s = (I − H_ss)^{-1} e_s,

    H_ss = Z_s H^{-1} Z_sᵀ (n × n) the leverage of sequence s. B̂ − B = Σ_s (Σ_i ε_i z_iᵀ) H^{-1}
    with independent sequences (H^{-1} treated as fixed): M_s is its s-th term with the
    residuals for the errors ε, and M̃_s = B̂ − B̂₍₋ₛ₎, the exact change of B̂ when sequence s is
    left out (the leave-one-out residual ẽ_s is the error of s predicted without it). The
    residuals shrink the errors (E e_s e_sᵀ = σ²(I − H_ss) for homoskedastic errors), and ẽ_s
    undoes it with room to spare (E ẽ_s ẽ_sᵀ = σ²(I − H_ss)^{-1} ⪰ σ²I): the cluster
    jackknife, CR3 of the cluster-robust literature. ValueError when a sequence has leverage 1
    to within √ε (the others do not identify B: (S − 1)·n < p, or a direction only it has)."""
    s, n, p = z.shape
    zz = z.reshape(s * n, p)
    h = zz.T @ zz
    lam = np.linalg.eigvalsh(h)
    if lam[-1] <= 0.0 or lam[0] <= p * EPS * lam[-1]:
        ratio = lam[0] / lam[-1] if lam[-1] > 0 else 0.0
        raise ValueError(
            f"the token design is rank deficient (λ_min/λ_max of Σ z zᵀ = {ratio:.2e} for {p} "
            "features): more sequences, or tokens that are not all zero, are needed"
        )
    coef = np.linalg.solve(h, zz.T @ y.reshape(s * n, -1)).T
    resid = y - z @ coef.T
    zh = np.linalg.solve(h, np.swapaxes(z, 1, 2))  # H^{-1} Z_sᵀ, p × n per sequence
    complement = np.eye(n) - z @ zh  # I − H_ss
    least = np.linalg.eigvalsh(complement)[:, 0]
    if least.min() <= math.sqrt(EPS):  # ẽ_s would carry fewer than half its digits
        k = int(np.argmin(least))
        raise ValueError(
            f"sequence {k} has leverage 1 (λ_min(I − H_ss) = {least[k]:.2e}): without it the "
            f"other {s - 1} sequences' tokens do not span the {p} features (too few tokens, or "
            "a direction only this sequence has), so its leave-one-out error is undefined; "
            "more sequences are needed"
        )
    loo = np.linalg.solve(complement, resid)  # ẽ_s
    terms = [np.swapaxes((zh @ e)[:, :block, :], 1, 2) for e in (resid, loo)]
    return coef, *terms


def _regression(
    coef: Array, clusters: Array, left_out: Array, mean_coef: Array | None = None
) -> Regression:
    stderr = float(np.sqrt(np.sum(np.square(clusters))))
    return Regression(coef, stderr, mean_coef, clusters, left_out)


def pooled_regression(x: Array, y: Array) -> Regression:
    """Pooled token regression (linear QK attention, value map unknown): Ĉ = argmin Σ‖y_i − C x_i‖²
    over all tokens of all sequences, Ĉ = (Σ y xᵀ)(Σ x xᵀ)^{-1} ∈ ℝ^{d_v×d}.

    For linear QK attention with iid N(0, I) tokens, Ĉ → W_Vᵀ[Kᵀ + (K + tr(K)I)/n] (EB-7): rank
    r* only as n → ∞, with a tail of singular values of order (‖K‖₂ + |tr K|)/n at finite n (the
    j = i term), and up to 2r* values of order ‖K‖/n when K is not symmetric. ``stderr`` is the
    sequence-level cluster-robust (sandwich) estimate of the sampling error ‖Ĉ − E Ĉ‖_F, which
    bounds the sampling error of every singular value (Weyl) at the one-standard-error level.
    """
    x, y = _pair(x, y)
    return _regression(*_ols(x, y))


def first_order_softmax(x: Array, y: Array) -> Regression:
    """First-order (Stein) softmax estimator: regress y_i on [x_i, x̄] (x̄ the sequence mean).

    As β → 0, rowsoftmax(βL) ≈ (1 + β(ℓ_ij − ℓ̄_i))/n, so y_i ≈ W_Vᵀx̄ + (β/√d) W_Vᵀ S_c Kᵀ x_i with
    S_c the centred token covariance: the coefficient on x_i (``coef``) has rank r* up to O(1/n)
    and O(β²) terms, the one on x̄ (``mean_coef``) ≈ W_Vᵀ to first order. Bias: with a PSD part
    in K (tokens attend to themselves) the output carries W_Vᵀx_i and the value map's full rank
    leaks into ``coef``: recovery is only partial, and energy estimators over-count as β grows
    (background §6 P4c). Needs S > d (x̄ varies only across sequences).
    """
    x, y = _pair(x, y)
    s, _, d = x.shape
    if s <= d:
        raise ValueError(f"the first-order estimator needs S > d sequences, got S = {s}, d = {d}")
    xbar = np.broadcast_to(x.mean(axis=1, keepdims=True), x.shape)
    coef, clusters, left_out = _ols(np.concatenate([x, xbar], axis=2), y, block=d)
    return _regression(coef[:, :d], clusters, left_out, coef[:, d:])


#: The sign-flip draws of ``noise_edge`` and their fixed seed (the answer is reproducible).
EDGE_DRAWS, EDGE_SEED = 400, 20261206


def noise_edge(reg: Regression, quantile: float = 0.95, terms: str = "left_out") -> float:
    """The ``quantile`` of the spectral norm of the coefficient's sampling error,
    ‖Ĉ − E Ĉ‖₂, by the sign-flip (wild cluster) bootstrap: ‖Σ_s ε_s M_s‖₂ over ``EDGE_DRAWS``
    draws of independent signs ε_s = ±1 (seeded with ``EDGE_SEED``), M_s the sequences'
    contributions: ``terms="left_out"`` (default) the leave-one-sequence-out changes
    ``Regression.left_out``, ``"residual"`` the residual terms ``Regression.clusters``.

    Why: Ĉ − E Ĉ = Σ_s M_s is a sum of independent mean-zero terms, one per sequence; flipping
    their signs keeps every second moment (E‖Σ ε_s M_s‖_F² = Σ‖M_s‖_F²) and the shape of the
    sum's law, so the draws' spectral norms estimate the law of ‖Ĉ − E Ĉ‖₂, the edge of the
    noise bulk of Ĉ's singular values. By Weyl, |σ_k(Ĉ) − σ_k(E Ĉ)| ≤ ‖Ĉ − E Ĉ‖₂ for every k:
    a singular value that E Ĉ does not have exceeds the edge with probability ≤ 1 − quantile
    (up to the bootstrap's error). The residual terms are shrunk by each sequence's leverage
    (``_ols``): over S = 50 sequences of 16 tokens in d = 16 their 95% edge is exceeded by 8.4%
    of noise-only data sets (linear and first-order softmax, 1000 each), and the leave-one-out
    terms, which undo the shrinkage with room to spare, by 3.5% and 2.7% (docs/entropic_bound.md
    §4). The residual terms' median is the unit of κ (``strength.calibrate``): it matches the
    true median of ‖Ĉ − E Ĉ‖₂ within 2% on the planted tasks. For a d_v × d error of iid
    entries of standard deviation τ the edge is ≈ τ(√d + √d_v), against stderr ≈ τ√(d·d_v):
    the Frobenius error is √d/2 times the edge when d = d_v, which is why a floor at stderr
    hides directions the data show.
    """
    if terms not in ("left_out", "residual"):
        raise ValueError(f"terms must be 'left_out' or 'residual', got {terms!r}")
    m = reg.left_out if terms == "left_out" else reg.clusters
    if m is None:
        raise ValueError(f"noise_edge needs the regression's per-sequence terms ({terms})")
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    signs = np.random.default_rng(EDGE_SEED).choice([-1.0, 1.0], size=(EDGE_DRAWS, m.shape[0]))
    draws = np.tensordot(signs, m, axes=1)  # (draws, d_v, d)
    return float(np.quantile(np.linalg.norm(draws, ord=2, axis=(1, 2)), quantile))


def inversion_estimator(
    x: Array, y: Array, w_v: Array, beta: float = 1.0, floor: float = 1e-12
) -> Array:
    """Inversion estimator (softmax attention, value map W_V known): K̂ ∈ ℝ^{d×d}.

    Per sequence Â_s = Y_s (X_s W_V)^+, which equals A_s exactly (without noise) iff X_s W_V has
    full row rank n. That needs **n ≤ d_v** (and, since rank X_s W_V ≤ rank W_V ≤ min(d, d_v),
    n ≤ d as well; background §5 states n ≤ d_v for d ≥ d_v). Otherwise A is identified only
    modulo {B : B X W_V = 0}, of dimension n(n − rank X W_V) ≥ n(n − d_v), so this function
    **raises ValueError** naming n and d_v (or n and d, or the measured σ_min/σ_max of X_s W_V);
    it never returns an unidentified estimate. Then L̂ = log max(Â, floor), centred by rows
    (softmax is invariant to row shifts: log A · J = βXKXᵀJ/√d with J = I − 11ᵀ/n), and K̂
    solves Σ_s ‖L̂_s J − (β/√d) X_s K (J X_s)ᵀ‖_F² in least squares (d² unknowns; the stacked
    design must have rank d², raised otherwise). Bias: the log amplifies the noise of small
    probabilities (nonlinear inversion), and entries of Â ≤ 0 from noise are clipped at
    ``floor``; recovery is partial at large β or large noise.
    """
    x, y = _pair(x, y)
    w_v = _matrix(w_v, "W_V")
    s, n, d = x.shape
    dv = y.shape[2]
    if w_v.shape != (d, dv):
        raise ValueError(f"W_V must be d×d_v = {d}×{dv}, got shape {w_v.shape}")
    if n > dv:
        raise ValueError(
            f"the inversion estimator needs n ≤ d_v to identify the mixing matrix, got n = {n} > "
            f"d_v = {dv}: A is then determined only modulo a {n * (n - dv)}-dimensional set"
        )
    if n > d:
        raise ValueError(
            f"the inversion estimator needs n ≤ d (rank X_s W_V ≤ d), got n = {n} > d = {d}"
        )
    if not (np.isfinite(beta) and beta != 0):
        raise ValueError(f"beta must be finite and nonzero, got {beta}")
    if not (floor > 0):
        raise ValueError(f"floor must be > 0, got {floor}")
    xw = x @ w_v
    sv = np.linalg.svd(xw, compute_uv=False)
    worst = float(np.min(sv[:, -1] / sv[:, 0]))
    if worst <= n * EPS:
        raise ValueError(
            f"X_s W_V is rank deficient for some sequence (σ_min/σ_max = {worst:.2e}): "
            "A is not identified"
        )
    a_hat = y @ np.linalg.pinv(xw)
    logs = np.log(np.maximum(a_hat, floor))
    lc = logs - logs.mean(axis=2, keepdims=True)
    xc = x - x.mean(axis=1, keepdims=True)
    design = (beta / math.sqrt(d)) * np.einsum("sia,sjb->sijab", x, xc).reshape(s * n * n, d * d)
    sol, _, rank, _ = np.linalg.lstsq(design, lc.reshape(s * n * n), rcond=None)
    if rank < d * d:
        raise ValueError(
            f"K is not identified: the stacked design has rank {rank} < d² = {d * d} "
            f"(S·n(n − 1) = {s * n * (n - 1)} equations); more sequences are needed"
        )
    return sol.reshape(d, d)
