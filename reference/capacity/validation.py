"""Input validation shared by the capacity modules, and the validated spectrum.

``spectrum`` (a 1-D, finite, non-negative spectrum, sorted in decreasing order) and
``singular_values`` are public. The private helpers check a matrix (``_matrix``), a batch of
sequences of shape (S, n, features) (``_sequences``), a pair X, Y sharing (S, n) (``_pair``), and
turn a seed into a generator (``_rng``). Every check raises ``ValueError`` naming the problem and
the measured value. ``Array`` is the array type of the annotations; ``EPS`` = 2⁻⁵², the float64
machine epsilon.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Array = np.ndarray
EPS = float(np.finfo(np.float64).eps)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def _matrix(a: Array, name: str) -> Array:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a matrix (2-D array), got shape {a.shape}")
    if a.size and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has {int(np.sum(~np.isfinite(a)))} non-finite entries")
    return a


def _sequences(a: Array, name: str) -> Array:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 3:
        raise ValueError(f"{name} must have shape (S, n, features), got shape {a.shape}")
    if min(a.shape) < 1:
        raise ValueError(f"{name} is empty: shape {a.shape}")
    bad = int(np.sum(~np.isfinite(a)))
    if bad:
        raise ValueError(f"{name} has {bad} non-finite entries (NaN or inf)")
    return a


def _pair(x: Array, y: Array) -> tuple[Array, Array]:
    x, y = _sequences(x, "X"), _sequences(y, "Y")
    if x.shape[:2] != y.shape[:2]:
        raise ValueError(f"X and Y must share (S, n): X has shape {x.shape}, Y has shape {y.shape}")
    return x, y


def spectrum(s: Array | Sequence[float]) -> Array:
    """A validated spectrum: 1-D, finite, non-negative, sorted in decreasing order (a copy)."""
    s = np.asarray(s, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"a spectrum must be a 1-D array of singular values, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"a spectrum has {int(np.sum(~np.isfinite(s)))} non-finite values")
    if s.size and s.min() < 0:
        raise ValueError(f"singular values must be ≥ 0, got min {s.min():.3g}")
    return np.sort(s)[::-1].copy()


def singular_values(z: Array) -> Array:
    """σ(Z) in decreasing order (LAPACK SVD: each σ_i within ~m·u·‖Z‖₂ of the exact value)."""
    z = _matrix(z, "Z")
    if z.size == 0:
        return np.zeros(0)
    return np.linalg.svd(z, compute_uv=False)


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
