"""The mpmath checks of EB-1 and EB-2: the deficiency bound and its attainment at 30 and 60
digits (``harness.ladder``), on one small problem whose tolerance covers every candidate."""

from __future__ import annotations

import mpmath
import numpy as np

from proofs_checks.harness import ladder
from proofs_checks.propositions.eb_static_problem import (
    MP_D,
    MP_DV,
    MP_N,
    MP_RSTAR,
    TAG_MP,
    _kappa,
    _list,
    _scale,
    _sizes,
    excess_tolerance,
    static_problem,
    wrong_truncation,
)
from proofs_checks.registry import Context, Outcome


def _mp_matrix(a: np.ndarray) -> mpmath.matrix:
    return mpmath.matrix(np.asarray(a, dtype=np.float64).tolist())


def _mp_frob2(a: mpmath.matrix) -> mpmath.mpf:
    return mpmath.fsum(a[i, j] ** 2 for i in range(a.rows) for j in range(a.cols))


def _mp_truncate(b: mpmath.matrix, r: int) -> mpmath.matrix:
    u, s, v = mpmath.svd_r(b)
    out = mpmath.zeros(b.rows, b.cols)
    for k in range(r):
        out += s[k] * u[:, k] * v[k, :]
    return out


#: Perturbation scales of the mpmath candidates ((I + εG)·B_r, rank ≤ r); 0 is the truncation.
MP_PERTURB = (0.0, 1e-3, 1e-1)


def _mp_problem(ctx: Context):
    """The mpmath problem, the perturbations G per r, κ(L), and m: the largest
    (‖A‖_F + ‖A*‖_F)·‖L‖_F over every candidate of both checks and both variants (computed in
    float64, enlarged by 1%), so one tolerance covers them all."""
    a_star, c, w = static_problem(MP_N, MP_D, MP_DV, MP_RSTAR, ctx.seed, TAG_MP)
    rng = np.random.default_rng([ctx.seed, TAG_MP, 1])
    noise = {r: rng.standard_normal((MP_N, MP_N)) for r in range(MP_N + 1)}
    ell = np.linalg.cholesky(c)
    ell_inv = np.linalg.inv(ell)
    u, s, vt = np.linalg.svd(a_star @ ell)
    m = 0.0
    for r in range(MP_N + 1):
        b_r = (u[:, :r] * s[:r]) @ vt[:r]
        mixers = [(b_r + eps * noise[r] @ b_r) @ ell_inv for eps in MP_PERTURB]
        for a in [*mixers, wrong_truncation(a_star, r)]:
            m = max(m, 1.01 * _scale(a, a_star, ell))
    return a_star, c, w, noise, _kappa(ell), m


def _mp_seeds(ctx: Context) -> str:
    """The streams ``_mp_problem`` draws from."""
    return f"default_rng([{ctx.seed}, {TAG_MP}]) and [{ctx.seed}, {TAG_MP}, 1]"


def _mp_inputs(a_star: np.ndarray, c: np.ndarray, w: np.ndarray):
    """A*, L = chol(C) and ‖W*‖_F² at the working precision (inside a ladder's ``measure``)."""
    return _mp_matrix(a_star), mpmath.cholesky(_mp_matrix(c)), _mp_frob2(_mp_matrix(w))


def _mp_bound(w2: mpmath.mpf, s: mpmath.matrix, r: int) -> mpmath.mpf:
    """The deficiency bound b_r = ‖W*‖_F²·Σ_{i>r} σ_i² of EB-1 from the singular values s."""
    return w2 * mpmath.fsum(s[i] ** 2 for i in range(r, MP_N))


def _mp_ladder(ctx: Context, problem: tuple, measure, what: str, **exercised) -> Outcome:
    """``ladder`` of ``measure`` under ``excess_tolerance`` of the mpmath problem ``problem``
    (``_mp_problem``: one tolerance, m the largest candidate, covers every check) at the
    working precision; what it exercised: the problem's sizes, ``exercised``, its seeds."""
    _, _, w, _, kappa, m = problem
    return ladder(
        measure,
        lambda u: excess_tolerance(MP_N, m, kappa, float(np.sum(w * w)), w.size, u),
        what,
        exercised={
            "sizes": _sizes(MP_N, MP_D, MP_DV, MP_RSTAR),
            **exercised,
            "dtypes": "mpmath",
            "seeds": _mp_seeds(ctx),
        },
    )


def mpmath_deficiency(ctx: Context, wrong: bool) -> Outcome:
    """n = 6, r* = 3, seed [ctx.seed, 102], at 30 and 60 digits: for r = 1, 2, 3, the
    truncation A_r and (I + εG)[A*L]_r L^{-1} for ε = 1e-3, 1e-1 (G Gaussian, rank ≤ r) satisfy
    (b_r − ℰ(A))₊ ≤ ``excess_tolerance`` at the working precision, m the largest candidate."""
    problem = _mp_problem(ctx)
    a_star, c, w, noise, _, _ = problem
    ranks = (1, 2, 3)

    def measure(dps: int) -> float:
        am, ell, w2 = _mp_inputs(a_star, c, w)
        b_star = am * (1 if wrong else ell)
        _, s, _ = mpmath.svd_r(b_star)
        worst = mpmath.mpf(0)
        for r in ranks:
            bound = _mp_bound(w2, s, r)
            base = _mp_truncate(am * ell, r)
            for eps in MP_PERTURB:
                a = (base + eps * _mp_matrix(noise[r]) * base) * ell**-1  # rank ≤ r
                excess = w2 * _mp_frob2((a - am) * ell)
                worst = max(worst, bound - excess)
        return worst

    return _mp_ladder(
        ctx,
        problem,
        measure,
        "(b_r − ℰ(A))₊ over r and candidates",
        options=f"r ∈ {{{_list(ranks)}}}",
        points=(
            f"{len(MP_PERTURB)} candidates per r: (I + εG)[A*L]_r L⁻¹, ε ∈ {{{_list(MP_PERTURB)}}}"
        ),
    )


def mpmath_achievability(ctx: Context, wrong: bool) -> Outcome:
    """n = 6, r* = 3, seed [ctx.seed, 102], at 30 and 60 digits: max over r = 0…6 of
    |ℰ(A_r) − b_r| with A_r = [A*L]_r L^{-1} (mpmath Cholesky and SVD), under
    ``excess_tolerance`` at the working precision."""
    problem = _mp_problem(ctx)
    a_star, c, w, _, _, _ = problem
    ranks = range(MP_N + 1)

    def measure(dps: int) -> float:
        am, ell, w2 = _mp_inputs(a_star, c, w)
        b_star = am * ell
        _, s, _ = mpmath.svd_r(b_star)
        worst = mpmath.mpf(0)
        for r in ranks:
            a_r = _mp_truncate(am, r) if wrong else _mp_truncate(b_star, r) * ell**-1
            excess = w2 * _mp_frob2((a_r - am) * ell)
            bound = _mp_bound(w2, s, r)
            worst = max(worst, abs(excess - bound))
        return worst

    return _mp_ladder(
        ctx, problem, measure, "max_r |ℰ(A_r) − b_r|", options=f"r = {ranks[0]}…{ranks[-1]}"
    )
