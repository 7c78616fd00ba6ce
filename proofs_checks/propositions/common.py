"""Shared by the proposition checks: the sizes and hyperparameters of the RA checks (stated once,
cited by every check), the exact symbolic-gradient harness of the EB trainers (EB-3, EB-6), and
the outcome of a symbolic check that residuals vanish."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import sympy as sp

import reference as ref
from proofs_checks.registry import Outcome
from reference import capacity

#: float64 checks: one attention head's frame, St(64, 16), over 6 steps.
D, R, STEPS = 64, 16, 6
#: mpmath checks: a small frame, St(6, 3), over 3 steps (object arrays are slow).
MP_D, MP_R, MP_STEPS = 6, 3, 3
#: lr·√(d·r) ≤ 1/2 for every d·r ≤ 64² (the hypothesis of ``bounds.trajectory_tolerance``).
LR = 5e-3
#: Trust radius, below the uncapped step (≈ lr·√(d·r) = 0.16 at St(64, 16)), so the cap is active.
RADIUS = 0.05
BETAS = (0.9, 0.999)
#: The control of RA-1 and RA-4, both of which need one scalar second moment per frame.
ELEMENTWISE_CONTROL = (
    "elementwise second moment (one √v per entry, then projected) (breaks the hypothesis: "
    "one scalar second moment per frame, not the code)"
)


def adam(
    moment: str = "frame", eps: float = 1e-8, beta1: float = BETAS[0], radius: float | None = RADIUS
) -> ref.optim.Optimizer:
    """The rule under test, ``riemannian_adam`` at the hyperparameters above."""
    return ref.optim.riemannian_adam(
        lr=LR, betas=(beta1, BETAS[1]), eps=eps, trust_radius=radius, moment=moment
    )


def all_zero(
    residuals: Iterable[sp.Expr],
    detail: Callable[[int], str],
    exercised: dict[str, object] | None = None,
) -> Outcome:
    """A symbolic check's outcome: passed when every residual (expanded or simplified already)
    is 0. Residual: the number that are not (tolerance 0); ``detail(that number)`` says which."""
    nonzero = sum(1 for e in residuals if e != 0)
    return Outcome(nonzero == 0, float(nonzero), 0.0, detail(nonzero), exercised=exercised or {})


# ---------------------------------------------------------------------------------------------
# Exact symbolic check of a factorised trainer's closed-form gradient (EB-3, EB-6)
# ---------------------------------------------------------------------------------------------
def exact(a: np.ndarray) -> np.ndarray:
    """float64 array → object array of exact SymPy rationals (every float is a dyadic rational)."""
    return np.vectorize(lambda v: sp.Rational(float(v)), otypes=[object])(a)


def symbol_matrix(prefix: str, rows: int, cols: int) -> np.ndarray:
    """A rows × cols object array of distinct real SymPy symbols prefix0, prefix1, …"""
    return np.array(sp.symbols(f"{prefix}0:{rows * cols}", real=True), dtype=object).reshape(
        rows, cols
    )


def asymmetric_draw(
    seed: int,
    tag: int,
    draw: Callable[[np.random.Generator], Any],
    gradient: Callable[[Any], np.ndarray],
) -> Any:
    """The first data draw (from the generator of [seed, tag], then of [seed, tag, attempt])
    whose closed-form gradient ``gradient(data)`` (a matrix in symbolic factors) is not
    symmetric: where G = Gᵀ for every factor, the control of ``factorised_gradient_check`` (the
    transpose dropped) changes nothing and could not be rejected."""
    for attempt in range(100):
        rng = np.random.default_rng([seed, tag] if attempt == 0 else [seed, tag, attempt])
        data = draw(rng)
        g = sp.Matrix(gradient(data))
        if (g - g.T).expand() != sp.zeros(*g.shape):
            return data
    raise RuntimeError(f"no draw with an asymmetric gradient in 100 attempts (seed {seed})")


def factorised_gradient_check(
    left: np.ndarray,
    right: np.ndarray,
    raw_risk: Callable[[np.ndarray], sp.Expr],
    closed_risk: Callable[[np.ndarray], sp.Expr],
    gradient: Callable[[np.ndarray], np.ndarray],
    wrong: bool,
) -> Outcome:
    """The trainer's gradient against SymPy, exactly. With symbolic factors ``left`` = U and
    ``right`` = V (``symbol_matrix``) and M = UVᵀ: SymPy differentiates ``raw_risk(M)`` (the risk
    written from the raw data) in every entry of U and V; the trainer's closed form is
    ``capacity.factor_gradients(gradient(M), U, V)`` = (G V, Gᵀ U); and ``raw_risk(M)`` must equal
    ``closed_risk(M)`` (the sufficient-statistics form, ½c included). Residual: the number of
    nonzero differences (tolerance 0). Control (``wrong``): the transpose dropped in the chain
    rule, ∇_V = G U instead of Gᵀ U."""
    m = left @ right.T
    g = gradient(m)
    g_left, g_right = capacity.factor_gradients(g, left, right)
    if wrong:
        g_right = g @ left
    risk = sp.expand(raw_risk(m))
    diffs = [
        sp.expand(sp.diff(risk, p) - q)
        for params, grads in ((left, g_left), (right, g_right))
        for p, q in zip(params.ravel(), grads.ravel(), strict=True)
    ]
    diffs.append(sp.expand(risk - closed_risk(m)))
    return all_zero(
        diffs, lambda n: f"{n} of {len(diffs)} gradient entries and risk identity differ from SymPy"
    )


def checkerboard(p: np.ndarray) -> np.ndarray:
    """+1 and −1 in a fixed checkerboard over the entries of ``p`` (whatever the seed)."""
    return np.where(np.indices(np.shape(p)).sum(axis=0) % 2 == 0, 1.0, -1.0)


def adam_update_then(after: Callable[[Any, Any], tuple[Any, Any]]) -> Callable:
    """A maker of ``reference.optim.scale_by_adam`` variants whose update's (direction, state)
    is passed through ``after``: the near-miss controls substituted into ``reference.optim``."""

    def make(original: Callable) -> Callable:
        def variant(b1=0.9, b2=0.999, eps=1e-8, moment="frame", reduction="mean"):
            inner = original(b1, b2, eps, moment, reduction)

            def update(geometry, x, g, state):
                return after(*inner.update(geometry, x, g, state))

            return inner._replace(update=update)

        return variant

    return make


def adam_direction_times(factor: Callable[[np.ndarray], Any]) -> Callable:
    """``adam_update_then`` multiplying the direction m̂/(√v̂ + ε) by ``factor(direction)`` (a
    number: the step too long; an array per entry: a second moment not quite scalar): the
    near-miss controls of REF-1, RA-1 and RA-4."""
    return adam_update_then(lambda d, new: (ref.optim.tree_map(lambda p: p * factor(p), d), new))


def entrywise_scaled(delta: float) -> Callable:
    """``scale_by_adam`` whose direction is multiplied entry by entry by 1 + delta·s, s = ±1 in
    a checkerboard fixed in the coordinates: a per-entry second moment that differs from the
    frame's scalar one by a relative ∓delta (``adam_direction_times``): the near miss of RA-1
    and RA-4, neither of which holds without one scalar second moment per frame."""
    return adam_direction_times(lambda p: 1.0 + delta * checkerboard(p))


# ---------------------------------------------------------------------------------------------
# Monte Carlo criterion of the population identities (EB-1, EB-4, EB-5, EB-7)
# ---------------------------------------------------------------------------------------------
#: Pass when T ≤ CHI2_CUT: by the CLT T ≈ Σ w_j χ²₁ with Σ w_j = 1, so P(T > 30) ≤ P(χ²₁ > 30)
#: ≈ 4e-8 for a true identity (Székely & Bakirov 2003, for thresholds ≥ 1.54).
CHI2_CUT = 30.0


def root_chi2(z: np.ndarray, claimed: np.ndarray) -> tuple[float, float]:
    """(√T, SE) for iid samples z_s (the leading axis) of a matrix whose mean is claimed:
    T = ‖z̄ − claimed‖²/v̂, v̂ = Σ_s‖z_s − z̄‖²/(S(S − 1)) the variance of the mean."""
    s = z.shape[0]
    mean = z.mean(axis=0)
    se = math.sqrt(float(np.sum((z - mean) ** 2)) / (s * (s - 1)))
    return float(np.sqrt(np.sum((mean - claimed) ** 2))) / se, se
