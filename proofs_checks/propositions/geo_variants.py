"""The geometries GEO certifies, at the sizes of its checks, and each one's deliberately wrong
variants (the negative controls), with the words that name them in the certificate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import reference as ref
from proofs_checks import geometry_laws as law

#: Sizes: St(7, 3); plain (m, n, r) = (6, 5, 2); block variants (3, 4, 2) with two query heads
#: sharing one key head (stacked 6×4), so that the block variant differs from the plain one.
STIEFEL = (7, 3)
PLAIN = (6, 5, 2)
BLOCK = (3, 4, 2)


def _eye_minus(f: np.ndarray, z: np.ndarray) -> np.ndarray:
    return z - f @ (f.T @ z)


def _stiefel_proj(f: np.ndarray, z: np.ndarray) -> np.ndarray:
    return z - f @ ref.linalg.sym(f.T @ z)


def _canonical(f: np.ndarray, g: np.ndarray) -> np.ndarray:
    return g - f @ g.T @ f


# Each geometry's deliberately wrong variants, as replacement methods (self, …).
BROKEN: dict[str, dict[str, Callable]] = {
    "stiefel": {
        "proj": lambda self, x, z: _eye_minus(x, z),
        "egrad_to_rgrad": lambda self, x, g: _canonical(x, g),
        "retract": lambda self, x, u: x + u,
    },
    "fixed_rank_embedded": {
        "proj": lambda self, x, z: (np.zeros_like(z[1]), *type(self).proj(self, x, z)[1:]),
        "egrad_to_rgrad": lambda self, x, z: (z[1], _eye_minus(x[0], z[0]), _eye_minus(x[2], z[2])),
        "retract": lambda self, x, u: (
            x[0] + u[1] @ np.linalg.inv(x[1]),
            x[1] + u[0],
            x[2] + u[2] @ np.linalg.inv(x[1]).T,
        ),
    },
    "fixed_rank_quotient": {
        "proj": lambda self, x, z: z,
        "egrad_to_rgrad": lambda self, x, g: self.proj(x, g),
        "retract": lambda self, x, u: (
            x[0] + u[0],
            np.hstack([(x[1] + u[1])[:, :-1], np.zeros((x[1].shape[0], 1))]),
        ),
        "not_a_retraction": lambda self, x, u: (x[0] + u[0], x[1]),
        "inner": lambda self, x, a, b: float(np.vdot(a[0], b[0]) + np.vdot(a[1], b[1])),
    },
    "partial_isometry_embedded": {
        "proj": lambda self, x, z: (x[0].T @ z[0], _eye_minus(x[0], z[0]), _eye_minus(x[1], z[1])),
        "egrad_to_rgrad": lambda self, x, z: (
            x[0].T @ z[0] - z[0].T @ x[0],
            _eye_minus(x[0], z[0]),
            _eye_minus(x[1], z[1]),
        ),
        "retract": lambda self, x, u: (
            x[0] + u[1] + 0.5 * x[0] @ u[0],
            x[1] + u[2] - 0.5 * x[1] @ u[0],
        ),
    },
    "partial_isometry_quotient": {
        "proj": lambda self, x, z: (_stiefel_proj(x[0], z[0]), _stiefel_proj(x[1], z[1])),
        "egrad_to_rgrad": lambda self, x, g: (_canonical(x[0], g[0]), _canonical(x[1], g[1])),
        "retract": lambda self, x, u: (x[0] + u[0], x[1] + u[1]),
        "inner": lambda self, x, a, b: float(
            sum(np.vdot(p * np.arange(1, p.shape[1] + 1), q) for p, q in zip(a, b, strict=True))
        ),
    },
    "stiefel_pair": {
        "proj": lambda self, x, z: (_eye_minus(x[0], z[0]), _eye_minus(x[1], z[1])),
        "egrad_to_rgrad": lambda self, x, g: (_canonical(x[0], g[0]), _canonical(x[1], g[1])),
        "retract": lambda self, x, u: (x[0] + u[0], x[1] + u[1]),
    },
}

# The optional metrics are certified too, under their own ids; only their wrong gradients differ.
BROKEN["stiefel-canonical"] = {
    **BROKEN["stiefel"],
    "egrad_to_rgrad": lambda self, x, g: _stiefel_proj(x, g),
}
BROKEN["fixed_rank_quotient-balanced"] = BROKEN["fixed_rank_quotient"]
VARIANTS = {
    "stiefel-canonical": lambda **kw: ref.Stiefel(*STIEFEL, metric="canonical", **kw),
    "fixed_rank_quotient-balanced": lambda **kw: ref.GEOMETRIES["fixed_rank_quotient"](
        *PLAIN, metric="balanced", **kw
    ),
}

CONTROL_TEXT = {
    "stiefel": "P_W(Z) = Z − W WᵀZ (no sym)",
    "fixed_rank_embedded": "M dropped from the projection",
    "fixed_rank_quotient": "no horizontal correction (identity)",
    "partial_isometry_embedded": "Ω = UᵀZ_U (no skew)",
    "partial_isometry_quotient": "no vertical correction (Stiefel projections only)",
    "stiefel_pair": "P_U(Z) = Z − U UᵀZ (no sym)",
}
CONTROL_TEXT["stiefel-canonical"] = CONTROL_TEXT["stiefel"]
CONTROL_TEXT["fixed_rank_quotient-balanced"] = CONTROL_TEXT["fixed_rank_quotient"]
RGRAD_TEXT = {
    "stiefel": "the canonical-metric formula G − WGᵀW",
    "fixed_rank_embedded": "U_p, V_p without the S^{-ᵀ}, S^{-1} weights",
    "fixed_rank_quotient": "the metric forgotten (horizontal projection of G)",
    "partial_isometry_embedded": "Ω = UᵀG_U − G_UᵀU (skew without ½)",
    "partial_isometry_quotient": "the canonical-metric formula per factor",
    "stiefel_pair": "the canonical-metric formula per factor",
}
RGRAD_TEXT["stiefel-canonical"] = "the embedded-metric formula P_W(G)"
RGRAD_TEXT["fixed_rank_quotient-balanced"] = RGRAD_TEXT["fixed_rank_quotient"]
RENORM_TEXT = {
    "fixed_rank_quotient": "a step that loses a rank direction (last column of B zeroed)",
    "fixed_rank_quotient-balanced": "a step that loses a rank direction (last column of B zeroed)",
}


@dataclass(frozen=True)
class Case:
    name: str  # "stiefel" or a GEOMETRIES key
    make: Callable[..., Any]  # make(**kwargs) at the check sizes

    @property
    def base(self) -> str:
        return self.name.removeprefix("block_")


def _sizes(name: str) -> tuple[int, ...]:
    if name.split("-")[0] == "stiefel":
        return STIEFEL
    return BLOCK if name.startswith("block_") else PLAIN


def _case(name: str) -> Case:
    if name in VARIANTS:
        return Case(name, VARIANTS[name])
    if name == "stiefel":
        return Case(name, lambda **kw: ref.Stiefel(*STIEFEL, **kw))
    return Case(name, lambda **kw: ref.GEOMETRIES[name](*_sizes(name), **kw))


def _broken(case: Case, method: str, key: str | None = None) -> Any:
    return law.patched(case.make(), **{method: BROKEN[case.base][key or method]})
