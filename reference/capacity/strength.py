"""Signal strength κ in units of the detection edge, κ = 1 at the edge, for the planted tasks.

The operator each pre-training estimator reads is signal plus noise; κ says how far above the
edge of the noise's spectrum the weakest planted direction stands:

- static mixing (``token_gram_count``): the token Gram's population spike ℓ = σ_i²(A*)/σ² over
  the BBP edge √γ, γ = n/(S·d_v), below which no eigenvalue separates from the noise bulk
  (Baik–Ben Arous–Péché); with the flat planted spectrum σ_i(A*) = 1, W* with orthonormal
  columns and C = I, κ = 1/(σ²√γ), so σ² = 1/(κ√γ) (``static_noise``);
- attention (``pooled_regression``, ``first_order_softmax``): the coefficient's smallest
  planted singular value σ_{r*}(E Ĉ) over the edge of its noise bulk, the median of
  ‖Ĉ − E Ĉ‖₂. That edge grows with the noise σ as √(a + bσ²), a from the misspecification of a
  linear fit to attention (σ = 0), b from the noise; ``calibrate`` reads a and b from a pilot
  (the sign-flip medians ``noise_edge(reg, 0.5, "residual")`` of 4 data sets at σ = 0 and at
  σ = 1: the residual terms, whose median matches the true one within 2%) and E Ĉ from the
  closed form of EB-7 (linear) or from a 20 000-sequence noiseless pilot (softmax);
  ``attention_noise`` solves √(a + bσ²) = σ_{r*}(E Ĉ)/κ for σ. κ above
  σ_{r*}/√a cannot be reached (None).

Kinds: ``KINDS``; every task has d_v = d and a flat planted spectrum.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from reference.capacity.pretraining import (
    Regression,
    first_order_softmax,
    noise_edge,
    pooled_regression,
)
from reference.capacity.tasks import (
    PlantedTask,
    linear_qk_task,
    pooled_population,
    softmax_task,
    static_task,
)
from reference.capacity.validation import singular_values

KINDS = ("static", "linear", "softmax", "softmax-psd")
#: The softmax tasks' inverse temperature (the generators' default).
BETA = 2.0


def planted(
    kind: str, s: int, n: int, d: int, r: int, noise: float, seed: int | np.random.Generator
) -> PlantedTask:
    """The planted task of ``kind`` (d_v = d, flat spectrum; softmax-psd: K = UUᵀ)."""
    if kind == "static":
        return static_task(s, n, d, d, r, seed=seed, noise=noise)
    if kind == "linear":
        return linear_qk_task(s, n, d, d, r, seed=seed, noise=noise)
    if kind in ("softmax", "softmax-psd"):
        psd = kind == "softmax-psd"
        return softmax_task(s, n, d, d, r, beta=BETA, seed=seed, noise=noise, psd=psd)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def coefficient(kind: str, task: PlantedTask) -> Regression:
    """The coefficient an attention kind's estimator reads: the pooled regression (linear) or
    the first-order estimator (softmax)."""
    if kind == "linear":
        return pooled_regression(task.x, task.y)
    return first_order_softmax(task.x, task.y)


def static_noise(kappa: float, s: int, n: int, dv: int) -> float:
    """σ = (κ√γ)^{-1/2}, γ = n/(S·d_v): the static task's noise at signal strength κ."""
    return (kappa * math.sqrt(n / (s * dv))) ** -0.5


@functools.lru_cache(maxsize=64)
def calibrate(kind: str, s: int, n: int, d: int, r: int) -> tuple[float, float, float]:
    """(σ_{r*}(E Ĉ), a, b) of an attention kind at (S, n, d = d_v, r*) (module docstring; pilots
    seeded 9999 and 1000–1003)."""
    if kind == "static":
        raise ValueError("calibrate is for the attention kinds; static: static_noise")
    pilot = planted(kind, 20000 if kind != "linear" else s, n, d, r, 0.0, 9999)
    if kind == "linear":
        mean = pooled_population(pilot.kernel, pilot.value, n)
    else:
        mean = coefficient(kind, pilot).coef
    signal = float(singular_values(mean)[r - 1])
    edge2 = []
    for noise in (0.0, 1.0):
        regs = [coefficient(kind, planted(kind, s, n, d, r, noise, 1000 + i)) for i in range(4)]
        edge2.append(float(np.mean([noise_edge(reg, 0.5, "residual") ** 2 for reg in regs])))
    return signal, edge2[0], edge2[1] - edge2[0]


def noise_at(kind: str, kappa: float, s: int, n: int, d: int, r: int) -> float | None:
    """The noise σ at which a task of ``kind`` has signal strength κ (None: out of reach)."""
    if not (kappa > 0 and math.isfinite(kappa)):
        raise ValueError(f"kappa must be positive and finite, got {kappa}")
    if kind == "static":
        return static_noise(kappa, s, n, d)
    signal, a, b = calibrate(kind, s, n, d, r)
    target = (signal / kappa) ** 2
    return None if target <= a else math.sqrt((target - a) / b)
