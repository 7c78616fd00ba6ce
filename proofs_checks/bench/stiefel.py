"""The Stiefel benchmark (``rattn bench stiefel``).

``bench_stiefel`` times the Stiefel projection and retractions at one shape in float64, against
the SVD polar factor and, when it is installed, pymanopt's Stiefel manifold; ``format_bench``
renders the result as Markdown. Timings and their environment: ``proofs_checks.bench.timing``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import reference as ref
from proofs_checks.bench.peers import _import_pymanopt
from proofs_checks.bench.timing import (
    SAMPLE_TARGET_S,
    _check_repeats,
    _interleaved_rounds,
    _iqr,
    machine_environment,
)
from proofs_checks.memory import require_memory
from reference.linalg import Array

#: Norm of the tangent step ξ the retractions are timed at.
STEP_NORM = 0.1

#: The speed target of the default retraction: the Gram polar at least this many times faster than
#: the SVD polar.
TARGET_SPEEDUP = 2.0

SVD_ROW = "polar retraction (SVD)"
GRAM_ROW = "polar retraction (Gram, reference)"


def stiefel_bytes(d: int, r: int) -> int:
    """Estimated peak memory of ``bench_stiefel(d, r)`` in bytes: 16 float64 d×r frames and 16
    r×r matrices (9 to 12 d×r frames were measured at the peak, pymanopt's rows included)."""
    return 8 * 16 * (d * r + r * r)


def bench_stiefel(
    d: int = 512, r: int = 64, repeats: int = 30, seed: int = 0, *, progress: bool = True
) -> dict[str, Any]:
    """Time the Stiefel projection and retractions at (d, r) in float64.

    One random point W (``Stiefel(d, r).random_point``), one Gaussian ambient Z and one random
    tangent ξ of norm STEP_NORM are drawn from ``seed``; every candidate acts on these same arrays:

    - "projection": ``Stiefel.proj(W, Z)`` = Z − W sym(WᵀZ);
    - "polar retraction (Gram, reference)": ``Stiefel(d, r).retract(W, ξ)``, i.e.
      (W + ξ)(G)^{-1/2} with G = (W + ξ)ᵀ(W + ξ) formed and an r×r ``eigh``;
    - "polar retraction (SVD)": ``reference.linalg.polar_svd(W + ξ)``, U Vᵀ from the thin SVD;
    - "pymanopt Stiefel retraction" (its default, sign-fixed QR) and "pymanopt Stiefel projection"
      of ``pymanopt.manifolds.Stiefel(d, r)``, when pymanopt is importable; otherwise a note
      PYMANOPT_MISSING is recorded and these rows are left out.

    Each candidate is warmed up, then given a number of calls per sample so that one sample lasts
    at least SAMPLE_TARGET_S. Each of ``repeats`` rounds takes one sample of every candidate, in an
    order rotated by one each round, with the garbage collector off. A row reports the median and
    the interquartile range (75th − 25th percentile) of the per-call seconds over the rounds,
    ``ratio_to_svd_polar`` = median / median of the SVD polar (below 1 means faster than the SVD
    polar), and, for retractions, the accuracy of the result Y as ``residual`` = ‖YᵀY − I‖_F
    (None for projections).

    Args:
        d, r: the shape of the frame, 1 ≤ r ≤ d.
        repeats: number of rounds (samples per candidate), at least 1.
        seed: seed of the random W, Z and ξ.
        progress: show a tqdm progress bar over the rounds on stderr.

    Returns:
        ``{"shape": [d, r], "dtype": "float64", "repeats", "seed", "sample_target_s",
        "rows": [{"name", "median_s", "iqr_s", "ratio_to_svd_polar", "residual",
        "calls_per_sample"}, ...], "notes": [...], "environment": {...}}``.
    """
    _check_repeats(repeats)
    st = ref.Stiefel(d, r)  # validates d and r
    require_memory(f"bench stiefel at d={d}, r={r}", stiefel_bytes(d, r))
    rng = np.random.default_rng(seed)
    w = st.random_point(rng)
    z = rng.standard_normal(st.shape)
    xi = STEP_NORM * st.random_tangent(w, rng)
    assert w.dtype == z.dtype == xi.dtype == np.float64

    candidates: dict[str, tuple[Callable[[], Array], bool]] = {
        "projection": (lambda: st.proj(w, z), False),
        GRAM_ROW: (lambda: st.retract(w, xi), True),
        SVD_ROW: (lambda: ref.linalg.polar_svd(w + xi), True),
    }
    notes: list[str] = []
    pymanopt = _import_pymanopt(notes)
    pymanopt_version = getattr(pymanopt, "__version__", "unknown") if pymanopt else None
    if pymanopt:
        peer = pymanopt.manifolds.Stiefel(st.d, st.r)
        candidates["pymanopt Stiefel retraction"] = (lambda: peer.retraction(w, xi), True)
        candidates["pymanopt Stiefel projection"] = (lambda: peer.projection(w, z), False)
        notes.append(
            f"pymanopt {pymanopt_version}: Stiefel(d, r) with its default retraction, the "
            "sign-fixed QR factor of W + ξ (first order); its 'polar' option is the SVD polar, "
            "the same computation as the SVD row."
        )

    names = list(candidates)
    numbers, samples = _interleaved_rounds(
        {name: candidates[name][0] for name in names},
        repeats,
        desc=f"bench stiefel ({st.d}, {st.r})",
        progress=progress,
    )

    medians = {name: float(np.median(samples[name])) for name in names}
    rows = []
    for name in names:
        fn, is_retraction = candidates[name]
        rows.append(
            {
                "name": name,
                "median_s": medians[name],
                "iqr_s": _iqr(samples[name]),
                "ratio_to_svd_polar": medians[name] / medians[SVD_ROW],
                "residual": st.residual(fn()) if is_retraction else None,
                "calls_per_sample": numbers[name],
            }
        )

    gram, svd = ref.linalg.polar(w + xi), ref.linalg.polar_svd(w + xi)
    notes.append(
        "Gram and SVD polar factors agree to "
        f"max|ΔY| = {float(np.max(np.abs(gram - svd))):.1e} (the same map, computed two ways)."
    )
    return {
        "shape": [st.d, st.r],
        "dtype": "float64",
        "repeats": int(repeats),
        "seed": int(seed),
        "sample_target_s": SAMPLE_TARGET_S,
        "rows": rows,
        "notes": notes,
        "environment": machine_environment("pymanopt"),
    }


def format_bench(result: dict[str, Any]) -> str:
    """Markdown for a ``bench_stiefel`` result: a table (name, median ms, IQR ms, × SVD polar,
    ‖YᵀY − I‖) and a line saying whether the reference (Gram) polar retraction is at least
    TARGET_SPEEDUP times faster than the SVD polar, with the measured speed-up, then the notes."""
    d, r = result["shape"]
    lines = [
        f"Stiefel St({d}, {r}), {result['dtype']}, {result['repeats']} interleaved rounds "
        "(median and interquartile range of seconds per call):",
        "",
        "| operation | median (ms) | IQR (ms) | × SVD polar | ‖YᵀY − I‖ |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in result["rows"]:
        residual = "–" if row.get("residual") is None else f"{row['residual']:.1e}"
        lines.append(
            f"| {row['name']} | {1e3 * row['median_s']:.3f} | {1e3 * row['iqr_s']:.3f} "
            f"| {row['ratio_to_svd_polar']:.2f} | {residual} |"
        )
    by_name = {row["name"]: row for row in result["rows"]}
    lines.append("")
    if GRAM_ROW in by_name and SVD_ROW in by_name:
        speedup = by_name[SVD_ROW]["median_s"] / by_name[GRAM_ROW]["median_s"]
        verdict = "met" if speedup >= TARGET_SPEEDUP else "NOT met"
        lines.append(
            f"Target (reference polar retraction at least {TARGET_SPEEDUP:g}× faster than the SVD "
            f"polar): {verdict}; measured {speedup:.2f}× (median SVD / median Gram)."
        )
    else:
        lines.append("Target not evaluated: the Gram or SVD polar row is missing.")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines)
