"""The recommended rank of a user's sequences, estimated before training (``rattn rank``).

X (S, n, d) are S sequences of n tokens and Y (S, n, d_v) the outputs of the token-mixing layer
to be sized. Each attention kind has its own pre-training estimator (docs/entropic_bound.md):

- ``static``: the token Gram Σ_s Y_sY_sᵀ/(S·d_v); recommended rank = the sequential count of its
  eigenvalues above the noise's largest root, 1% false detection (``token_gram_count``);
- ``linear``: the pooled token regression ŷ = C x (value map unknown; EB-7);
- ``softmax``: the first-order estimator, y_i regressed on [x_i, x̄] (its x_i block).

For ``linear`` and ``softmax`` the recommended rank is the largest-gap rank of the coefficient's
singular values with the floor max(noise edge, σ₁/n): the sampling error, and the O(1/n)
finite-n tail of EB-7, cannot make a gap. Every estimator of ``estimate_all`` is reported with
the caveats that apply. ``estimate`` returns one JSON-ready report.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from reference import capacity

ATTENTION = ("linear", "softmax", "static")


def minimum_sequences(attention: str, n: int, d: int, dv: int) -> tuple[int, str]:
    """The fewest sequences each estimator can use, and why."""
    if attention == "static":
        return max(2, math.ceil(n / dv)), "the token Gram needs S·d_v ≥ n"
    if attention == "linear":
        return math.ceil(d / n) + 1, (
            "the pooled regression's leave-one-sequence-out error needs (S − 1)·n ≥ d"
        )
    return d + 1, "the first-order estimator regresses on the sequence means: S > d"


def _floats(values) -> list[float]:
    return [float(v) for v in values]


def _static(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    s, n, d = x.shape
    dv = y.shape[2]
    gc = capacity.token_gram_count(y)
    signal = np.sqrt(np.maximum(gc.eigenvalues - gc.noise, 0.0))
    floor = math.sqrt(max(gc.threshold - gc.noise, 0.0))
    estimators = capacity.estimate_all(signal, floor=floor)
    estimators["token_gram_count"] = gc.rank
    assumptions = [
        "assumes a static (input-independent) mixer Y = A*XW* + noise, with noise iid across "
        "tokens; with input-conditioned attention use --attention linear or softmax (a static "
        "summary of attention is aI + b11ᵀ, EB-5)",
        "the count compares each eigenvalue with the mean of the smaller ones (no noise level "
        f"needed); the eigenvalues not counted have mean σ̂² = {gc.noise:.3g}, and directions "
        "weaker than about σ̂²·2√(n/(S·d_v)) are not detected",
        "the spectrum estimators act on sqrt(max(λ − σ̂², 0)), the token Gram's signal part",
    ]
    caveats = _near_threshold(
        gc.eigenvalues[: gc.rank] - gc.noise,
        np.asarray(gc.thresholds[: gc.rank]) - gc.noise,
        "eigenvalue excess(es) λ − σ̂²",
    )
    extra: dict[str, Any] = {}
    if d == dv and s * d >= n:
        mixer = capacity.ols_static_mixer(x, y)
        sv = capacity.singular_values(mixer)
        extra["ols_static_mixer"] = {
            "spectrum": _floats(sv),
            "estimators": capacity.estimate_all(sv),
        }
        assumptions.append(
            "the OLS static mixer (Σ YXᵀ)(Σ XXᵀ)⁻¹ models Y ≈ A X: it is meaningful only when "
            "the value map is close to the identity (it is diluted by tr W*)"
        )
    return {
        "operator": "token Gram G = Σ_s Y_s Y_sᵀ/(S·d_v), eigenvalues",
        "spectrum_of": "token-Gram eigenvalues",
        "spectrum": _floats(gc.eigenvalues),
        "threshold": float(gc.threshold),
        "noise_floor": float(gc.noise),
        "estimators": estimators,
        "recommended_rank": int(gc.rank),
        "recommended_by": (
            "token-Gram eigenvalues counted in turn while each exceeds the 99% quantile of the "
            "noise's largest root over the mean of the rest (1% false detection)"
        ),
        "zero_means": (
            f"no token-Gram eigenvalue above the threshold {gc.threshold:.3g} (λ₁ = "
            f"{gc.eigenvalues[0]:.3g}, noise σ̂² = {gc.noise:.3g}): no direction is "
            "distinguishable from the noise at this S; a direction would count from "
            f"λ > {gc.threshold:.3g}"
        ),
        "assumptions": assumptions,
        "caveats": caveats,
        **extra,
    }


#: A counted value less than this factor above the threshold is "near" it (the caveat of
#: ``_near_threshold``): a sample of the same size may not count it.
NEAR = 1.25


def _near_threshold(values: np.ndarray, thresholds: float | np.ndarray, what: str) -> list[str]:
    """The caveat that fires when a counted value lies in (t, NEAR·t], t the threshold it
    passed (one for all values, or one each: the static count tests each against its own)."""
    pairs = zip(values, np.broadcast_to(thresholds, np.shape(values)), strict=True)
    near = [(float(v), float(t)) for v, t in pairs if t < v <= NEAR * t]
    if not near:
        return []
    listed = ", ".join(f"{v:.3g} against {t:.3g}" for v, t in near)
    return [
        f"{len(near)} counted {what} less than {NEAR}× the threshold each passed ({listed}): "
        "another sample of this size may not count them"
    ]


def _attention(x: np.ndarray, y: np.ndarray, attention: str) -> dict[str, Any]:
    n, dv = x.shape[1], y.shape[2]
    if attention == "linear":
        reg = capacity.pooled_regression(x, y)
        operator = "pooled token regression ŷ_i = C x_i (d_v × d), singular values"
    else:
        reg = capacity.first_order_softmax(x, y)
        operator = (
            "first-order estimator: y_i on [x_i, x̄], the x_i block (d_v × d), singular values"
        )
    sv = capacity.singular_values(reg.coef)
    edge = capacity.noise_edge(reg)
    floor = capacity.attention_gap_floor(sv, edge, n)  # max(noise edge, σ₁/n)
    estimators = capacity.estimate_all(sv, floor=floor)
    rank = capacity.largest_gap_rank(sv, floor)
    assumptions = [
        "the floor is the larger of the noise edge (the 95% quantile of ‖Ĉ − E Ĉ‖₂ by a "
        "sign-flip bootstrap of the sequences' leave-one-out changes of Ĉ) and σ₁/n, the "
        "finite-n tail of EB-7: the pooled coefficient W_Vᵀ[Kᵀ + (K + tr(K) I)/n] has rank r* "
        "only as n → ∞",
        "the estimate is at most rank(W_V): a value map of low rank hides kernel directions",
    ]
    if attention == "softmax":
        assumptions.append(
            "softmax: partial recovery. The first-order estimator assumes no systematic "
            "self-attention bias; with a PSD part in K (tokens attending to themselves) the value "
            "map's full rank leaks into the coefficient (background §6 P4c)"
        )
    caveats = _near_threshold(sv[:rank], floor, "singular value(s)")
    if 0 < rank < sv.size and sv[rank] > floor:
        caveats.append(
            f"{int(np.sum(sv[rank:] > floor))} singular value(s) after the gap (σ_{rank + 1} = "
            f"{sv[rank]:.3g}) are above the floor {floor:.3g}: a finite-n tail (EB-7) or a "
            "full-rank part (under softmax, a self-attention bias or a large β); not counted"
        )
    if attention == "softmax" and n > dv:
        caveats.append(
            "the inversion estimator (reference.capacity.inversion_estimator), which needs W_V, "
            f"cannot identify K here: it needs n ≤ d_v, and n = {n} > d_v = {dv}"
        )
    return {
        "operator": operator,
        "spectrum_of": "coefficient singular values",
        "spectrum": _floats(sv),
        "threshold": float(floor),
        "noise_edge": edge,
        "noise_floor": float(floor),
        "standard_error": float(reg.stderr),
        "estimators": estimators,
        "recommended_rank": int(rank),
        "recommended_by": (
            "largest-gap rank of the coefficient's singular values above the threshold "
            "max(noise edge, σ₁/n)"
        ),
        "zero_means": (
            f"no singular value above the threshold {floor:.3g} (σ₁ = {sv[0]:.3g}): no direction "
            "is distinguishable from the sampling error at this S; a direction would count from "
            f"σ > {floor:.3g}"
        ),
        "assumptions": assumptions,
        "caveats": caveats,
    }


def estimate(x: np.ndarray, y: np.ndarray, attention: str = "linear") -> dict[str, Any]:
    """Every estimator appropriate to ``attention`` on sequences X (S, n, d), Y (S, n, d_v): a
    JSON-ready report with ``recommended_rank`` (an int), ``estimators`` and ``caveats``."""
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 3 or y.ndim != 3 or x.shape[:2] != y.shape[:2]:
        raise ValueError(f"needs X (S, n, d) and Y (S, n, d_v), got {x.shape} and {y.shape}")
    s, n, d = x.shape
    dv = y.shape[2]
    if n < 2:
        raise ValueError(f"needs at least 2 tokens per sequence to mix, got n = {n}")
    need, why = minimum_sequences(attention, n, d, dv)
    if s < need:
        raise ValueError(
            f"too few sequences for --attention {attention}: S = {s}, needs S ≥ {need} ({why})"
        )
    body = _static(x, y) if attention == "static" else _attention(x, y, attention)
    return {"attention": attention, "S": s, "n": n, "d": d, "d_v": dv, **body}
