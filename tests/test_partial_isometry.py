"""Unit tests of reference.partial_isometry: the three geometries P1, P2, P3 on rank-r partial
isometries PI_r(m, n) = {U Vᵀ : U ∈ St(m,r), V ∈ St(n,r)} (DESIGN §4.3).

Expected values come from independent computations on formed m×n matrices (the tangent-space
projection in closed matrix form, the nearest partial isometry by a full SVD, ranks of linear maps
assembled column by column), from tangent vectors built with scipy's null spaces instead of the
code under test, and from Taylor slopes.

Rounding bounds (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §3.5): u is the
unit roundoff 2^-53, γ_k = k·u/(1 − k·u); |fl(AB) − AB| ≤ γ_k |A||B| for an inner dimension k, so
‖fl(AB) − AB‖_F ≤ γ_k ‖A‖_F ‖B‖_F, and errors of a chain of products add to first order. For a
matrix U with r orthonormal columns ‖U‖_F = √r, so each U or V factor in a chain contributes at
most √r; ``_chain_tol`` collects this.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.linalg

import reference as ref
from reference.partial_isometry import (
    PartialIsometryEmbedded,
    PartialIsometryQuotient,
    StiefelPair,
)

U_ROUND = np.finfo(np.float64).eps / 2  # unit roundoff u = 2^-53 ≈ 1.1e-16

P1, P2, P3 = PartialIsometryEmbedded, PartialIsometryQuotient, StiefelPair
GEOMETRIES = [P1, P2, P3]
FACTOR_GEOMETRIES = [P2, P3]
# (m, n, r): a generic case, rank one, r = n (V square), r = m = n (PI_r = O(r)).
SIZES = [(7, 5, 2), (7, 5, 1), (5, 3, 3), (4, 4, 4)]


def gamma(k: int) -> float:
    """γ_k = k·u/(1 − k·u)."""
    return k * U_ROUND / (1 - k * U_ROUND)


def _chain_tol(k: int, d: int, r: int, scale: float, terms: int = 1) -> float:
    """Bound on the rounding of ``terms`` chains of k products of inner dimension ≤ d, each chain
    holding k frames (U or V, ‖·‖_F = √r) and one data matrix of Frobenius norm ``scale``:
    ≤ terms·k·γ_d·r^{k/2}·scale (first order; see the module docstring)."""
    return terms * k * gamma(d) * r ** (k / 2) * scale


def frame_error(d: int, r: int, kappa: float = 1.0) -> float:
    """A-priori bound on ‖WᵀW − I‖ for W = polar(A) computed in float64 (the derivation is in
    proofs_checks.bounds.frame_error: Gram γ_d κ²√r, symmetric eigensolver r·u, two r×r products
    2γ_r κ²√r, times a safety factor 10 and √r): 10·(γ_d + r·u + 2γ_r)·κ²·r. Householder QR is
    orthonormal to ≤ γ̃_{d·r}-level accuracy (Higham Thm 19.4), below this for our sizes."""
    return 10 * (gamma(d) + r * U_ROUND + 2 * gamma(r)) * kappa**2 * r


# -- independent constructions (NumPy/SciPy, not the code under test) --------------------------
def _frames(m, n, r, seed):
    """(U, V) from SciPy's QR of Gaussian matrices."""
    rng = np.random.default_rng(seed)
    uu = scipy.linalg.qr(rng.standard_normal((m, r)), mode="economic")[0]
    vv = scipy.linalg.qr(rng.standard_normal((n, r)), mode="economic")[0]
    return uu, vv


def _skew(a):
    return (a - a.T) / 2


def _sym(a):
    return (a + a.T) / 2


def _matrix_tangent_parts(x, rng, scale=1.0):
    """(Ω, U_p, V_p) with Ω skew, U_p = U_⊥B, V_p = V_⊥C (orthogonal complements by SciPy)."""
    uu, vv = x


r"""placeholder"""
