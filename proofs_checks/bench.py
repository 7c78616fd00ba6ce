"""Timing benchmarks of the reference geometries (``rattn bench NAME``).

``bench_stiefel`` times the Stiefel projection and retractions at one shape in float64, against
the SVD polar factor and, when it is installed, pymanopt's Stiefel manifold; ``format_bench``
renders the result as Markdown. Timings are wall-clock (``time.perf_counter``) and so depend on
the machine, its BLAS and its load: the result records the environment next to the numbers, and
the candidates are interleaved round by round so that machine noise hits all of them alike.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy
from tqdm import tqdm

import reference as ref
from reference.linalg import Array

#: Shortest wall time of one timed sample; a sample repeats the call until it lasts about this long,
#: so timer resolution and loop overhead stay negligible against the call itself.
SAMPLE_TARGET_S = 2e-3

#: Norm of the tangent step ξ the retractions are timed at.
STEP_NORM = 0.1

#: The speed target of the default retraction: the Gram polar at least this many times faster than
#: the SVD polar.
TARGET_SPEEDUP = 2.0

SVD_ROW = "polar retraction (SVD)"
GRAM_ROW = "polar retraction (Gram, reference)"
PYMANOPT_MISSING = "pymanopt not installed: peer rows skipped"

_ENV_VARS = (
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def _cpu_model() -> str | None:
    """The CPU model named in /proc/cpuinfo (Linux), else ``platform.processor()`` or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _blas_info() -> Any:
    """The BLAS NumPy uses: threadpoolctl's per-library info if importable, else NumPy's build
    configuration (name, version, configuration string), else None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        pass
    else:
        keys = ("internal_api", "version", "num_threads", "threading_layer", "architecture")
        libs = [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]
        return [{k: lib.get(k) for k in keys} for lib in libs]
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except Exception:  # older NumPy without mode="dicts", or a changed layout
        return None
    return {k: blas.get(k) for k in ("name", "version", "openblas configuration") if k in blas}


def _environment(pymanopt_version: str | None) -> dict[str, Any]:
    """Versions, platform, CPU and BLAS of the machine the timings were taken on."""
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pymanopt": pymanopt_version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "blas": _blas_info(),
        "env": {k: os.environ[k] for k in _ENV_VARS if k in os.environ},
    }


def _calls_per_sample(fn: Callable[[], object]) -> int:
    """How many back-to-back calls of ``fn`` make one sample of at least SAMPLE_TARGET_S."""
    fn()  # warm-up: caches, lazy imports, BLAS thread start-up
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-9)
    return max(1, math.ceil(SAMPLE_TARGET_S / once))


def _time_sample(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of ``fn``, averaged over ``number`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


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
    if isinstance(repeats, bool) or not isinstance(repeats, int | np.integer) or repeats < 1:
        raise ValueError(f"repeats must be an integer ≥ 1, got {repeats!r}")
    st = ref.Stiefel(d, r)  # validates d and r
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
    pymanopt_version: str | None = None
    try:
        import pymanopt
        from pymanopt.manifolds import Stiefel as PymanoptStiefel
    except ImportError:
        notes.append(PYMANOPT_MISSING)
    except Exception as exc:  # a broken installation must not break the benchmark
        notes.append(f"pymanopt failed to import ({type(exc).__name__}: {exc}): peer rows skipped")
    else:
        pymanopt_version = getattr(pymanopt, "__version__", "unknown")
        peer = PymanoptStiefel(st.d, st.r)
        candidates["pymanopt Stiefel retraction"] = (lambda: peer.retraction(w, xi), True)
        candidates["pymanopt Stiefel projection"] = (lambda: peer.projection(w, z), False)
        notes.append(
            f"pymanopt {pymanopt_version}: Stiefel(d, r) with its default retraction, the "
            "sign-fixed QR factor of W + ξ (first order); its 'polar' option is the SVD polar, "
            "the same computation as the SVD row."
        )

    names = list(candidates)
    numbers = {name: _calls_per_sample(candidates[name][0]) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for k in tqdm(
            range(repeats),
            desc=f"bench stiefel ({st.d}, {st.r})",
            unit="round",
            file=sys.stderr,
            disable=not progress,
        ):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                samples[name].append(_time_sample(candidates[name][0], numbers[name]))
    finally:
        if gc_was_enabled:
            gc.enable()

    medians = {name: float(np.median(samples[name])) for name in names}
    rows = []
    for name in names:
        fn, is_retraction = candidates[name]
        q25, q75 = np.percentile(samples[name], [25.0, 75.0])
        rows.append(
            {
                "name": name,
                "median_s": medians[name],
                "iqr_s": float(q75 - q25),
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
        "environment": _environment(pymanopt_version),
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
