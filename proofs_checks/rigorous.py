"""Rigorous checks: ball-arithmetic enclosures (FLINT's Arb, through python-flint) of the exact
value of a quantity for the float64 values the reference computed.

A float64 check measures its residual in float64, whose own rounding is of the size of the
bound it is held to (‖WᵀW − I‖ of a polar factor, formed in float64, errs by about γ_d). A
rigorous check converts the reference's float64 outputs to balls exactly (every float64 is an
exact binary number), evaluates the quantity in interval arithmetic, and compares the ball's
upper end with the bound: what the certificate then states is proven for those float64 values,
not estimated. python-flint is optional (the ``rigorous`` extra); without it these checks are
not run.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

#: Working precision (bits) of the enclosures: far above float64's 53, so the balls are tight.
PRECISION = 256


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why the rigorous checks cannot run here (python-flint not installed), or None."""
    if importlib.util.find_spec("flint") is None:
        return "needs python-flint (the rigorous extra), which is not installed"
    return None


def _flint() -> Any:
    import flint

    flint.ctx.prec = PRECISION
    return flint


def ball(x: float) -> Any:
    """The float64 x as an exact ball (radius 0)."""
    return _flint().arb(float(x))


def matrix(a: np.ndarray) -> Any:
    """The float64 matrix a as an ``arb_mat`` of exact balls."""
    flint = _flint()
    return flint.arb_mat([[flint.arb(float(x)) for x in row] for row in np.asarray(a)])


def above(x: Any) -> float:
    """The smallest float64 certainly ≥ every point of the ball x (``float`` rounds to the
    nearest, which may lie below x's upper end)."""
    v = float(x.upper())
    while not ball(v) >= x:
        v = math.nextafter(v, math.inf)
    return v


def below(x: Any) -> float:
    """The largest float64 certainly ≤ every point of the ball x."""
    return -above(-x)


def frobenius_upper(m: Any) -> float:
    """An upper bound (a float64 above the ball's upper end) of ‖m‖_F for an ``arb_mat``."""
    total = ball(0.0)
    for row in m.tolist():
        for x in row:
            total += x * x
    return above(total.sqrt())


def identity(r: int) -> Any:
    """I_r as an ``arb_mat``."""
    return _flint().arb_mat(r, r, [1 if i == j else 0 for i in range(r) for j in range(r)])


def orthonormality_upper(w: np.ndarray) -> float:
    """An upper bound of ‖WᵀW − I‖_F for the float64 matrix W, exact up to the ball's width."""
    big = matrix(w)
    return frobenius_upper(big.transpose() * big - identity(np.shape(w)[1]))


def relative_error_upper(computed: float, exact: Any) -> float:
    """An upper bound of |computed − exact|/|exact| for a float64 and a ball not containing 0."""
    return above(abs(ball(computed) - exact) / abs(exact))


def mean_square(g: np.ndarray) -> Any:
    """The exact mean square Σ g_i²/n of the float64 entries of g, as a ball."""
    entries: Iterable[float] = np.ravel(g)
    total = ball(0.0)
    for x in entries:
        total += ball(x) * ball(x)
    return total / np.size(g)


def gram_eigenvalue_range(*terms: np.ndarray) -> tuple[float, float]:
    """(lower, upper): float64 numbers enclosing every eigenvalue of AᵀA, A the exact sum of
    the float64 matrices ``terms`` (W + ξ summed in balls, not rounded to float64 first), the
    Gram formed in balls and its eigenvalues enclosed by Arb (``acb_mat.eig``): so that
    κ₂(A)² = λ_max/λ_min ≤ upper/lower."""
    flint = _flint()
    big = matrix(terms[0])
    for term in terms[1:]:
        big = big + matrix(term)
    eigenvalues = flint.acb_mat(big.transpose() * big).eig()
    return min(below(e.real) for e in eigenvalues), max(above(e.real) for e in eigenvalues)


def gram_defect_upper(w: np.ndarray, xi: np.ndarray) -> float:
    """An upper bound of ‖(W + ξ)ᵀ(W + ξ) − I − ξᵀξ‖_F = ‖(WᵀW − I) + (Wᵀξ + ξᵀW)‖_F for the
    float64 W and ξ, exact up to the ball's width."""
    big_w, big_xi = matrix(w), matrix(xi)
    cross = big_w.transpose() * big_xi
    drift = big_w.transpose() * big_w - identity(np.shape(w)[1])
    return frobenius_upper(drift + cross + cross.transpose())
