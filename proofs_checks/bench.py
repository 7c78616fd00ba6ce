"""Timing benchmarks of the reference geometries (``rattn bench NAME``).

``bench_stiefel`` times the Stiefel projection and retractions at one shape in float64, against
the SVD polar factor and, when it is installed, pymanopt's Stiefel manifold; ``format_bench``
renders the result as Markdown. Timings are wall-clock (``time.perf_counter``) and so depend on
the machine, its BLAS and its load: the result records the environment next to the numbers, and
the candidates are interleaved round by round so that machine noise hits all of them alike.
"""

from __future__ import annotations

import gc
import importlib.util
import itertools
import linecache
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy
from tqdm import tqdm

import reference as ref
from proofs_checks.memory import require_memory
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


def _interleaved_rounds(
    fns: dict[str, Callable[[], object]], repeats: int, *, desc: str, progress: bool
) -> tuple[dict[str, int], dict[str, list[float]]]:
    """Warm every candidate up and fix its calls per sample (``_calls_per_sample``), then run
    ``repeats`` rounds, each taking one sample (``_time_sample``) of every candidate in an order
    rotated by one each round, with the garbage collector off. Returns (calls per sample,
    per-call seconds of each round) by candidate name."""
    names = list(fns)
    numbers = {name: _calls_per_sample(fns[name]) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for k in tqdm(
            range(repeats), desc=desc, unit="round", file=sys.stderr, disable=not progress
        ):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                samples[name].append(_time_sample(fns[name], numbers[name]))
    finally:
        if gc_was_enabled:
            gc.enable()
    return numbers, samples


def _iqr(values: list[float]) -> float:
    """Interquartile range (75th − 25th percentile)."""
    q25, q75 = np.percentile(values, [25.0, 75.0])
    return float(q75 - q25)


def _check_repeats(repeats: object) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int | np.integer) or repeats < 1:
        raise ValueError(f"repeats must be an integer ≥ 1, got {repeats!r}")


def _import_pymanopt(notes: list[str]) -> Any:
    """pymanopt (with its manifolds) when importable; otherwise None and a note, never a failure."""
    try:
        import pymanopt
        import pymanopt.manifolds
    except ImportError:
        notes.append(PYMANOPT_MISSING)
    except Exception as exc:  # a broken installation must not break the benchmark
        notes.append(f"pymanopt failed to import ({type(exc).__name__}: {exc}): peer rows skipped")
    else:
        return pymanopt
    return None


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


# -- one optimisation step of each of the ten geometries -------------------------------------------

#: Factor of the retraction step: a step is R_x(STEP_SCALE·ξ) with ξ the unit-norm rgrad.
STEP_SCALE = 0.01

#: The reference geometry the peer and the other rows are compared with.
R1 = "fixed_rank_embedded"
R1_SAME_INPUT_ROW = "fixed_rank_embedded, pymanopt's inputs"
PYMANOPT_FIXED_RANK_ROW = "pymanopt FixedRankEmbedded"

#: Largest m·n at which the peer agreement check (which forms m×n matrices) is run.
AGREEMENT_MAX_ENTRIES = 2**22

#: Square sizes of the cost-scaling series (rank ``r`` of the run), and its geometries.
SCALING_SIZES = (512, 1024, 2048)
SCALING_GEOMETRIES = ("fixed_rank_embedded", "fixed_rank_quotient")


def _gaussian_like(x: Any, rng: np.random.Generator) -> Any:
    """A Gaussian array of each part's shape, in the (possibly nested) layout of ``x``."""
    return ref.geometry.like(x, [rng.standard_normal(np.shape(p)) for p in ref.geometry.parts(x)])


def _geometry_step(geo: Any, x: Any, g: Any) -> Callable[[], Any]:
    """The timed step of a reference geometry: ξ = rgrad/‖rgrad‖ with rgrad = egrad_to_rgrad(x, G),
    y = retract(x, STEP_SCALE·ξ), then transport(x, y, ξ)."""
    tree_map = ref.geometry.tree_map

    def step() -> Any:
        rgrad = geo.egrad_to_rgrad(x, g)
        nrm = geo.norm(x, rgrad)
        xi = tree_map(lambda p: p / nrm, rgrad)
        y = geo.retract(x, tree_map(lambda p: STEP_SCALE * p, xi))
        return geo.transport(x, y, xi)

    return step


def _pymanopt_step(peer: Any, xp: Any, gp: Any) -> Callable[[], Any]:
    """The same step with pymanopt's FixedRankEmbedded."""

    def step() -> Any:
        rgrad = peer.euclidean_to_riemannian_gradient(xp, gp)
        xi = rgrad / peer.norm(xp, rgrad)
        y = peer.retraction(xp, STEP_SCALE * xi)
        return peer.transport(xp, y, xi)

    return step


def _geometry(name: str, m: int, n: int, r: int) -> Any:
    return ref.GEOMETRIES[name](m, n, r)


def _group_shape(geo: Any, m: int, n: int, r: int) -> list[int]:
    """[rows, columns, rank] of one block group (the point itself for a plain geometry)."""
    if hasattr(geo, "groups"):
        rows, cols = geo.groups[0]
        return [len(rows) * m, len(cols) * n, r]
    return [m, n, r]


def _diagonal_r1_inputs(m: int, n: int, r: int, rng: np.random.Generator) -> dict[str, Any]:
    """A point of R1 with diagonal S and the factor gradients of one matrix function, in both
    layouts: reference (U, diag(s), V), (G_U, G_S, G_V) and pymanopt (u, s, vt), (du, ds, dvt).

    The point: our ``random_point`` (U, S, V), re-expressed with the SVD S = Y diag(s) Zᵀ as
    (U Y, diag(s), V Z) (the same matrix W). The function: F(W) = ⟨P Qᵀ, W⟩ with Gaussian P (m×r),
    Q (n×r), so G_W = P Qᵀ, never formed: G_W V = P (QᵀV) and G_WᵀU = Q (PᵀU). Then
    (G_U, G_S, G_V) = (G_W V S, Uᵀ G_W V, G_Wᵀ U S) and pymanopt's (du, ds, dvt) =
    (G_W V diag(s), diag(Uᵀ G_W V), diag(s) Uᵀ G_W) (its ds is the gradient in the vector s).
    """
    geo = ref.FixedRankEmbedded(m, n, r)
    u0, s0, v0 = geo.random_point(rng)
    y, s, zt = np.linalg.svd(s0)
    u, v = u0 @ y, v0 @ zt.T
    p, q = rng.standard_normal((m, r)), rng.standard_normal((n, r))
    gv, gtu = p @ (q.T @ v), q @ (p.T @ u)  # G_W V, G_Wᵀ U
    x = (u, np.diag(s), v)
    ours = geo.egrad_from_pair(x, (gv, gtu @ np.diag(s)))
    theirs = (gv * s, np.diag(u.T @ gv).copy(), (gtu * s).T)
    return {"geo": geo, "x": x, "g": ours, "xp": (u, s, v.T), "gp": theirs}


def _r1_peer_agreement(inputs: dict[str, Any], peer: Any) -> str:
    """How far the reference and pymanopt steps agree (checks only: forms m×n matrices)."""
    geo, x = inputs["geo"], inputs["x"]
    rg = geo.egrad_to_rgrad(x, inputs["g"])
    rg_peer = peer.euclidean_to_riemannian_gradient(inputs["xp"], inputs["gp"])
    d_rgrad = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(rg, (rg_peer.M, rg_peer.Up, rg_peer.Vp), strict=True)
    )
    xi = tuple(p / geo.norm(x, rg) for p in rg)
    y = geo.retract(x, tuple(STEP_SCALE * p for p in xi))
    xi_peer = rg_peer / peer.norm(inputs["xp"], rg_peer)
    yp = peer.retraction(inputs["xp"], STEP_SCALE * xi_peer)
    d_point = float(np.max(np.abs(geo.to_matrix(y) - (yp.u * yp.s) @ yp.vt)))
    t = geo.tangent_to_matrix(y, geo.transport(x, y, xi))
    tp = peer.transport(inputs["xp"], yp, xi_peer)
    t_peer = (yp.u @ tp.M + tp.Up) @ yp.vt + yp.u @ tp.Vp.T
    d_transport = float(np.max(np.abs(t - t_peer)))
    return (
        f"The reference and pymanopt steps agree on these inputs: max|Δ| = {d_rgrad:.1e} "
        f"(rgrad factors M, U_p, V_p), {d_point:.1e} (retracted point as a matrix), "
        f"{d_transport:.1e} (transported vector as a matrix)."
    )


def _median_rows(
    samples: dict[str, list[float]], numbers: dict[str, int], extra: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    for name, values in samples.items():
        rows.append(
            {
                "name": name,
                **extra.get(name, {}),
                "median_s": float(np.median(values)),
                "iqr_s": _iqr(values),
                "calls_per_sample": numbers[name],
            }
        )
    return rows


def geometries_bytes(m: int, n: int, r: int, scaling_sizes: tuple[int, ...] = SCALING_SIZES) -> int:
    """Estimated peak memory of ``bench_geometries(m, n, r)`` in bytes. Every step it times is
    built before the timing starts, so all are held at once: per geometry (and per peer row)
    16 float64 (m + n)×r factors and 20 r×r matrices; with pymanopt importable, whose transport
    forms the m×n matrix of ξ, 3 m×n matrices more; the scaling series likewise at (s, s, r).
    (Measured: about 11 factors and 14 r×r matrices per geometry, 2 m×n matrices.)"""
    peer = importlib.util.find_spec("pymanopt") is not None

    def steps(m: int, n: int, geometries: int) -> int:
        rows = geometries + (2 if peer else 0)
        return rows * (16 * (m + n) * r + 20 * r * r) + (3 * m * n if peer else 0)

    series = sum(steps(s, s, len(SCALING_GEOMETRIES)) for s in scaling_sizes)
    return 8 * (steps(m, n, len(ref.GEOMETRIES)) + series)


def bench_geometries(
    m: int = 512,
    n: int = 512,
    r: int = 64,
    repeats: int = 10,
    seed: int = 0,
    *,
    progress: bool = True,
    scaling_sizes: tuple[int, ...] = SCALING_SIZES,
) -> dict[str, Any]:
    """Time one optimisation step of each geometry in ``reference.GEOMETRIES`` at (m, n, r),
    against pymanopt's FixedRankEmbedded, and the cost scaling of R1 and R2 (float64).

    A *step* is ξ = rgrad/‖rgrad‖ with rgrad = ``egrad_to_rgrad(x, G)``, y = ``retract(x,
    STEP_SCALE·ξ)``, then ``transport(x, y, ξ)``. For each geometry (constructed with its defaults;
    block variants with two query heads sharing one key factor, so their one block group is a
    (2m, n, r) geometry) x is its ``random_point`` and G a Gaussian array in the point's layout
    (a factor gradient). Peer rows, when pymanopt is importable:

    - R1_SAME_INPUT_ROW: the reference R1 step on pymanopt's inputs (``_diagonal_r1_inputs``: a
      point with diagonal S and the factor gradients of F(W) = ⟨P Qᵀ, W⟩);
    - PYMANOPT_FIXED_RANK_ROW: ``euclidean_to_riemannian_gradient`` (from the factor gradients
      (du, ds, dvt): no m×n matrix is given), ``norm``, ``retraction`` and ``transport`` of
      ``pymanopt.manifolds.FixedRankEmbedded(m, n, r)`` on the same point and function. Its
      ``transport`` forms the m×n matrix of ξ internally; that is inside the timed step.

    All candidates are interleaved round by round (``_interleaved_rounds``); rows report the
    median and IQR of the per-call seconds and ``ratio_to_r1`` = median / median of R1's row.

    The scaling series times the R1 and R2 steps (and pymanopt's, when present) at (s, s, r) for
    s in ``scaling_sizes``, interleaved among themselves, and reports the ratios of successive
    medians: a cost O((m+n)r² + r³) doubles (ratio → 2) when m and n double with r fixed.

    Returns:
        ``{"shape": [m, n, r], "dtype": "float64", "repeats", "seed", "step_scale",
        "sample_target_s", "rows": [{"name", "group_shape", "median_s", "iqr_s",
        "ratio_to_r1", "calls_per_sample"}, ...], "scaling": {"r", "sizes", "rows": [{"name",
        "median_s": [...], "iqr_s": [...], "ratios": [...]}]}, "notes", "environment"}``.
    """
    _check_repeats(repeats)
    for label, v in (("m", m), ("n", n), ("r", r)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"{label} must be a positive integer, got {v!r}")
    if r > min(m, n):
        raise ValueError(f"bench geometries needs r ≤ min(m, n), got m={m}, n={n}, r={r}")
    if any(s < r for s in scaling_sizes):
        raise ValueError(f"every scaling size must be ≥ r = {r}, got {list(scaling_sizes)}")
    require_memory(
        f"bench geometries at m={m}, n={n}, r={r}", geometries_bytes(m, n, r, scaling_sizes)
    )
    rng = np.random.default_rng(seed)
    fns: dict[str, Callable[[], Any]] = {}
    extra: dict[str, dict[str, Any]] = {}
    for name in ref.GEOMETRIES:
        geo = _geometry(name, m, n, r)
        x = geo.random_point(rng)
        fns[name] = _geometry_step(geo, x, _gaussian_like(x, rng))
        extra[name] = {"group_shape": _group_shape(geo, m, n, r)}

    notes = [
        "Block variants use their defaults: two query heads sharing one key factor (GQA "
        f"pattern (h, 0), h = 0, 1), one block group of stacked size ({2 * m}, {n}, {r}).",
        f"A step: rgrad = egrad_to_rgrad(x, G) for a Gaussian G in the point's layout, "
        f"ξ = rgrad/‖rgrad‖, y = retract(x, {STEP_SCALE:g}·ξ), transport(x, y, ξ).",
    ]
    pymanopt = _import_pymanopt(notes)
    pymanopt_version = getattr(pymanopt, "__version__", "unknown") if pymanopt else None
    peer_cls = None
    if pymanopt:
        peer_cls = pymanopt.manifolds.FixedRankEmbedded
        inputs = _diagonal_r1_inputs(m, n, r, rng)
        peer = peer_cls(m, n, r)
        fns[R1_SAME_INPUT_ROW] = _geometry_step(inputs["geo"], inputs["x"], inputs["g"])
        fns[PYMANOPT_FIXED_RANK_ROW] = _pymanopt_step(peer, inputs["xp"], inputs["gp"])
        extra[R1_SAME_INPUT_ROW] = extra[PYMANOPT_FIXED_RANK_ROW] = {"group_shape": [m, n, r]}
        notes.append(
            f"pymanopt {pymanopt_version}: FixedRankEmbedded(m, n, r) on the point (U Y, s, "
            "(V Z)ᵀ), S = Y diag(s) Zᵀ, of a reference random point, for F(W) = ⟨P Qᵀ, W⟩ "
            "with Gaussian P, Q. Timed: euclidean_to_riemannian_gradient(x, (du, ds, dvt)) from "
            "the factor gradients (computed outside the timed region, no m×n matrix), "
            "norm, retraction (truncated SVD of W + ξ via QR of U_p, V_p and a 2r×2r SVD, the "
            "same map as the reference's) and transport. Its transport is "
            "projection(y, embedding(x, ξ)), and projection evaluates U @ S @ V.T @ matrix "
            "left to right: it forms the m×n matrix of ξ (and its transpose) inside the timed "
            "step, O(mnr) work. The reference R1 row on the same inputs is "
            f"'{R1_SAME_INPUT_ROW}'."
        )
        if m * n <= AGREEMENT_MAX_ENTRIES:
            notes.append(_r1_peer_agreement(inputs, peer))
        else:
            notes.append(
                f"Agreement of the reference and pymanopt steps not checked: it forms m×n "
                f"matrices, and m·n = {m * n} > {AGREEMENT_MAX_ENTRIES}."
            )

    numbers, samples = _interleaved_rounds(
        fns, repeats, desc=f"bench geometries ({m}, {n}, {r})", progress=progress
    )
    rows = _median_rows(samples, numbers, extra)
    r1_median = next(row["median_s"] for row in rows if row["name"] == R1)
    for row in rows:
        row["ratio_to_r1"] = row["median_s"] / r1_median

    # -- scaling series -----------------------------------------------------------------------
    scale_fns: dict[str, Callable[[], Any]] = {}
    for s in scaling_sizes:
        for name in SCALING_GEOMETRIES:
            geo = _geometry(name, s, s, r)
            x = geo.random_point(rng)
            scale_fns[f"{name}@{s}"] = _geometry_step(geo, x, _gaussian_like(x, rng))
        if peer_cls is not None:
            inputs = _diagonal_r1_inputs(s, s, r, rng)
            scale_fns[f"{PYMANOPT_FIXED_RANK_ROW}@{s}"] = _pymanopt_step(
                peer_cls(s, s, r), inputs["xp"], inputs["gp"]
            )
    scaling_rows = []
    if scale_fns:
        s_numbers, s_samples = _interleaved_rounds(
            scale_fns, repeats, desc=f"bench geometries scaling (r = {r})", progress=progress
        )
        names = [*SCALING_GEOMETRIES] + ([PYMANOPT_FIXED_RANK_ROW] if peer_cls else [])
        for name in names:
            keys = [f"{name}@{s}" for s in scaling_sizes]
            med = [float(np.median(s_samples[k])) for k in keys]
            scaling_rows.append(
                {
                    "name": name,
                    "median_s": med,
                    "iqr_s": [_iqr(s_samples[k]) for k in keys],
                    "ratios": [b / a for a, b in itertools.pairwise(med)],
                    "calls_per_sample": [s_numbers[k] for k in keys],
                }
            )
    return {
        "shape": [int(m), int(n), int(r)],
        "dtype": "float64",
        "repeats": int(repeats),
        "seed": int(seed),
        "step_scale": STEP_SCALE,
        "sample_target_s": SAMPLE_TARGET_S,
        "rows": rows,
        "scaling": {"r": int(r), "sizes": [int(s) for s in scaling_sizes], "rows": scaling_rows},
        "notes": notes,
        "environment": _environment(pymanopt_version),
    }


def format_geometries(result: dict[str, Any]) -> str:
    """Markdown for a ``bench_geometries`` result: the step table (name, group size, median ms,
    IQR ms, × R1), the verdict on "no slower than pymanopt for the same operation", the scaling
    table with ratios of successive sizes, then the notes."""
    m, n, r = result["shape"]
    lines = [
        f"One step (egrad_to_rgrad + retract + transport) at (m, n, r) = ({m}, {n}, {r}), "
        f"{result['dtype']}, {result['repeats']} interleaved rounds (median and interquartile "
        "range of seconds per step); block variants: two query heads sharing one key factor, so "
        f"one block group of size ({2 * m}, {n}, {r}):",
        "",
        "| geometry | group (rows, cols, r) | median (ms) | IQR (ms) | × R1 |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in result["rows"]:
        shape = ", ".join(map(str, row["group_shape"]))
        lines.append(
            f"| {row['name']} | ({shape}) | {1e3 * row['median_s']:.3f} "
            f"| {1e3 * row['iqr_s']:.3f} | {row['ratio_to_r1']:.2f} |"
        )
    by_name = {row["name"]: row for row in result["rows"]}
    lines.append("")
    if PYMANOPT_FIXED_RANK_ROW in by_name:
        peer = by_name[PYMANOPT_FIXED_RANK_ROW]["median_s"]
        same = by_name[R1_SAME_INPUT_ROW]["median_s"]
        plain = by_name[R1]["median_s"]
        verdict = "met" if same <= peer else "NOT met"
        lines.append(
            "Target (reference R1 no slower than pymanopt's FixedRankEmbedded for the same "
            f"operation): {verdict}; pymanopt / reference = {peer / same:.2f} on the same inputs "
            f"({1e3 * peer:.3f} ms against {1e3 * same:.3f} ms), {peer / plain:.2f} against the "
            "R1 row."
        )
    else:
        lines.append("Target (no slower than pymanopt) not evaluated: pymanopt rows missing.")
    scaling = result.get("scaling", {})
    if scaling.get("rows"):
        sizes = scaling["sizes"]
        head = " | ".join(f"({s}, {s}) ms" for s in sizes)
        ratio_head = " | ".join(f"{b}/{a}" for a, b in itertools.pairwise(sizes))
        lines += [
            "",
            f"Scaling at r = {scaling['r']} (median ms per step; ratios of successive medians, "
            "≈ 2 for a cost O((m+n)r² + r³) once (m+n)r² dominates):",
            "",
            f"| geometry | {head} | {ratio_head} |",
            "| --- |" + " ---: |" * (2 * len(sizes) - 1),
        ]
        for row in scaling["rows"]:
            times = " | ".join(f"{1e3 * t:.3f}" for t in row["median_s"])
            ratios = " | ".join(f"{q:.2f}" for q in row["ratios"])
            lines.append(f"| {row['name']} | {times} | {ratios} |")
    lines.append("")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines)


# -- the torch port's optimizer step (``rattn bench port``) ------------------------------------
# torch, torch_port and geoopt are imported inside the functions: ``rattn certify`` and the other
# benchmarks must work without torch (tests/test_project.py checks module-level imports).

PORT_ROW = "torch_port RiemannianAdam"
ADAMW_ROW = "torch AdamW (foreach)"
GEOOPT_ROW = "geoopt RiemannianAdam (EuclideanStiefel)"
GEOOPT_MISSING = "geoopt not installed: peer rows skipped"
FLOOR_ROW = "floor: 6 batched products, 3 XᵀG (r×d·d×r) + 3 X·S (d×r·r×r)"

#: Issue 4's targets for size (b): the port's step at most this many times AdamW's ...
PORT_TARGET_VS_ADAMW = 2.0
#: ... at least this many times faster than geoopt's ...
PORT_TARGET_VS_GEOOPT = 3.0
#: ... and the frames' optimizer state about this fraction of AdamW's.
PORT_TARGET_STATE = 0.5

#: Learning rate of every optimizer in the benchmark (Gaussian gradients of unit entries).
PORT_LR = 1e-3

#: Rows of the profile tables kept.
PROFILE_TOP = 12


def _port_sizes(d: int, r: int) -> list[dict[str, Any]]:
    """(a) one d×r frame; (b) W_Q and W_K of 12 layers × 12 heads × (768×64), each stored as one
    batched frame parameter of shape (12, 12, 768, 64)."""
    return [
        {"key": "a", "label": f"(a) one {d}×{r} frame", "params": 1, "batch": [], "d": d, "r": r},
        {
            "key": "b",
            "label": "(b) W_Q and W_K of 12 layers × 12 heads × (768×64)",
            "params": 2,
            "batch": [12, 12],
            "d": 768,
            "r": 64,
        },
    ]


def check_port_sizes(d: int, r: int, sizes: list[dict[str, Any]] | None = None) -> None:
    """Refuse, before torch is imported or anything allocated, sizes ``bench_port`` cannot run:
    not 1 ≤ r ≤ d, or an estimated peak above ``memory_limit``. The estimate: 28 float64 copies
    of every frame (d×r, with an r×r matrix) of ``sizes`` (default ``_port_sizes(d, r)``): each
    of four optimizers holds its own frames, gradients and state; 25 to 28 were measured."""
    if isinstance(d, bool) or isinstance(r, bool) or not (1 <= r <= d):
        raise ValueError(f"bench port needs 1 ≤ r ≤ d, got d={d}, r={r}")
    sizes = _port_sizes(d, r) if sizes is None else sizes
    entries = sum(s["params"] * math.prod(s["batch"]) * (s["d"] + s["r"]) * s["r"] for s in sizes)
    require_memory(f"bench port at d={d}, r={r}", 8 * 28 * entries)


def _import_geoopt(notes: list[str]) -> Any:
    """geoopt when importable; otherwise None and a note, never a failure."""
    try:
        with warnings.catch_warnings():  # geoopt 0.5 uses torch.jit.script, deprecated in torch
            warnings.simplefilter("ignore", DeprecationWarning)
            import geoopt
    except ImportError:
        notes.append(GEOOPT_MISSING)
    except Exception as exc:  # a broken installation must not break the benchmark
        notes.append(f"geoopt failed to import ({type(exc).__name__}: {exc}): peer rows skipped")
    else:
        return geoopt
    return None


def _state_bytes(opt: Any) -> int:
    """Bytes of every tensor in an optimizer's state (the "step" counters included)."""
    import torch

    return sum(
        t.numel() * t.element_size()
        for state in opt.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )


def _port_inputs(size: dict[str, Any], dtype: Any, seed: int) -> tuple[list[Any], list[Any]]:
    """The frames (``torch_port.Stiefel.random_point``) and Gaussian gradients of a size."""
    import torch

    import torch_port as tp

    gen = torch.Generator().manual_seed(seed)
    st = tp.Stiefel(size["d"], size["r"])
    points = [st.random_point(gen, size["batch"], dtype=dtype) for _ in range(size["params"])]
    grads = [torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype) for p in points]
    return points, grads


def _port_candidates(
    size: dict[str, Any], dtype: Any, seed: int, geoopt: Any
) -> dict[str, tuple[Any, list[Any]]]:
    """name -> (optimizer, its parameters), each on its own copy of the same frames with the
    same gradients attached (``step`` does not clear them, so every call steps again)."""
    import torch

    import torch_port as tp

    points, grads = _port_inputs(size, dtype, seed)

    def params(make: Callable[[Any], Any]) -> list[Any]:
        ps = [make(p.clone()) for p in points]
        for p, g in zip(ps, grads, strict=True):
            p.grad = g.clone()
        return ps

    out: dict[str, tuple[Any, list[Any]]] = {}
    ps = params(torch.nn.Parameter)
    out[PORT_ROW] = (tp.RiemannianAdam([{"params": ps, "geometry": "stiefel"}], lr=PORT_LR), ps)
    ps = params(torch.nn.Parameter)
    out[ADAMW_ROW] = (torch.optim.AdamW(ps, lr=PORT_LR, foreach=True), ps)
    if geoopt is not None:
        stiefel = geoopt.EuclideanStiefel()
        ps = params(lambda t: geoopt.ManifoldParameter(t, manifold=stiefel))
        out[GEOOPT_ROW] = (geoopt.optim.RiemannianAdam(ps, lr=PORT_LR), ps)

    class _Floor:
        """The batched products any projection-and-polar step needs per frame: rgrad
        G − W sym(WᵀG), the Gram AᵀA and A·(AᵀA)^{-1/2}, transport m − Y sym(Yᵀm): three
        r×d·d×r and three d×r·r×r products, all in the working dtype (a lower bound: nothing
        else of the step is done)."""

        def __init__(self, ps: list[Any]) -> None:
            self.ps, self.state = ps, {}
            self.small = [
                torch.eye(p.shape[-1], dtype=p.dtype).expand(*p.shape[:-2], -1, -1).contiguous()
                for p in ps
            ]

        def step(self) -> None:
            with torch.no_grad():
                for p, s in zip(self.ps, self.small, strict=True):
                    x, g = p.detach(), p.grad
                    for _ in range(3):
                        x.transpose(-1, -2) @ g
                        x @ s

    ps = params(torch.nn.Parameter)
    out[FLOOR_ROW] = (_Floor(ps), ps)
    return out


def _port_attribution(size: dict[str, Any], dtype: Any, seed: int) -> dict[str, Any]:
    """Where one ``RiemannianAdam`` step spends its time, by source line of ``torch_port`` and
    by torch operator.

    After two warm-up steps, one step runs under a ``TorchDispatchMode`` that times every
    operator call (CPU operators are synchronous, so the wall time around the call is its
    cost) and charges it to the innermost ``torch_port`` source line on the Python stack. This
    instruments the real step, whatever its code is at the time, not a replica; the overhead is
    a few µs per operator call (the step makes a few hundred). Returns ``{"step_s" (the same
    step uninstrumented), "instrumented_s", "ops_s" (sum of the timed operator calls),
    "sites": [{"site", "calls", "seconds", "share"}], "operators": [...]}``, each list sorted
    by time and cut at PROFILE_TOP."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import torch_port as tp

    class _Timer(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sites: dict[str, list[float]] = {}
            self.ops: dict[str, list[float]] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            frame, site = sys._getframe(1), "outside torch_port"
            while frame is not None:
                path = frame.f_code.co_filename.replace("\\", "/")
                if "/torch_port/" in path:
                    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
                    site = (
                        f"torch_port/{path.rsplit('/torch_port/', 1)[1]}:{frame.f_lineno} "
                        f"({frame.f_code.co_name}) `{code[:70]}`"
                    )
                    break
                frame = frame.f_back
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            spent = time.perf_counter() - start
            for table, key in ((self.sites, site), (self.ops, str(func.overloadpacket))):
                entry = table.setdefault(key, [0, 0.0])
                entry[0] += 1
                entry[1] += spent
            return out

    points, grads = _port_inputs(size, dtype, seed)
    ps = [torch.nn.Parameter(p) for p in points]
    for p, g in zip(ps, grads, strict=True):
        p.grad = g
    opt = tp.RiemannianAdam([{"params": ps, "geometry": "stiefel"}], lr=PORT_LR)
    opt.step()
    opt.step()
    start = time.perf_counter()
    opt.step()
    plain = time.perf_counter() - start
    timer = _Timer()
    start = time.perf_counter()
    with timer:
        opt.step()
    instrumented = time.perf_counter() - start
    total = sum(v[1] for v in timer.sites.values()) or 1.0

    def rows(table: dict[str, list[float]], label: str) -> list[dict[str, Any]]:
        ranked = sorted(table.items(), key=lambda kv: kv[1][1], reverse=True)[:PROFILE_TOP]
        return [
            {label: k, "calls": int(c), "seconds": float(t), "share": float(t / total)}
            for k, (c, t) in ranked
        ]

    return {
        "step_s": plain,
        "instrumented_s": instrumented,
        "ops_s": total,
        "sites": rows(timer.sites, "site"),
        "operators": rows(timer.ops, "op"),
    }


def bench_port(
    d: int = 512,
    r: int = 64,
    repeats: int = 5,
    seed: int = 0,
    *,
    progress: bool = True,
    dtypes: tuple[str, ...] = ("float32", "float64"),
    sizes: list[dict[str, Any]] | None = None,
    profile: bool = True,
) -> dict[str, Any]:
    """Time one optimizer step of ``torch_port.RiemannianAdam`` against ``torch.optim.AdamW``
    (foreach=True) and, when geoopt is importable, geoopt's ``RiemannianAdam`` on
    ``geoopt.EuclideanStiefel`` (its retraction: sign-fixed QR; transport: projection), for
    (a) one d×r frame and (b) W_Q and W_K of 12 layers × 12 heads × (768×64) (two batched frame
    parameters of shape (12, 12, 768, 64)), in each dtype of ``dtypes``; with the bytes of each
    optimizer's state tensors.

    All optimizers get lr = PORT_LR and otherwise torch's or geoopt's defaults (AdamW:
    weight_decay 1e-2), the same starting frames and the same Gaussian gradients, left attached
    so that every timed call is a full step. Candidates are interleaved round by round
    (``_interleaved_rounds``: warm-up, calls per sample, ``repeats`` rounds, order rotated,
    garbage collector off). A fourth row, FLOOR_ROW, times only the six batched d×r·r products a
    projection-and-polar step needs per frame (rgrad, Gram, polar product, transport), in the
    working dtype: if it alone exceeds PORT_TARGET_VS_ADAMW × AdamW, the time target is out of
    reach on that machine for this algorithm with torch's batched matmul, however the rest of the
    step is written. Rows report the median and IQR of seconds per step, ``ratio_to_adamw`` and
    ``state_bytes`` (after the warm-up steps). With ``profile``, one port step on the last
    size is attributed to source lines and operators (``_port_attribution``), for each dtype.

    Returns ``{"rows": [{"size", "label", "dtype", "name", "median_s", "iqr_s",
    "ratio_to_adamw", "state_bytes", "param_bytes", "calls_per_sample"}], "targets": [...],
    "profile": {dtype: {...}}, "notes", "environment"}``.
    """
    _check_repeats(repeats)
    sizes = _port_sizes(d, r) if sizes is None else sizes
    check_port_sizes(d, r, sizes)
    import torch

    names = {"float32": torch.float32, "float64": torch.float64}
    bad = [t for t in dtypes if t not in names]
    if bad:
        raise ValueError(f"bench port dtypes are float32 and float64, got {bad}")
    notes: list[str] = []
    geoopt = _import_geoopt(notes)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        for dt in dtypes:
            cands = _port_candidates(size, names[dt], seed, geoopt)
            fns = {name: opt.step for name, (opt, _) in cands.items()}
            numbers, samples = _interleaved_rounds(
                fns, repeats, desc=f"bench port {size['key']} {dt}", progress=progress
            )
            adamw = float(np.median(samples[ADAMW_ROW]))
            for name, (opt, ps) in cands.items():
                med = float(np.median(samples[name]))
                rows.append(
                    {
                        "size": size["key"],
                        "label": size["label"],
                        "dtype": dt,
                        "name": name,
                        "median_s": med,
                        "iqr_s": _iqr(samples[name]),
                        "ratio_to_adamw": med / adamw,
                        "state_bytes": _state_bytes(opt),
                        "param_bytes": sum(p.numel() * p.element_size() for p in ps),
                        "calls_per_sample": numbers[name],
                    }
                )
            del cands, fns
    targets = []
    for size in sizes:
        for dt in dtypes:
            by = {x["name"]: x for x in rows if x["size"] == size["key"] and x["dtype"] == dt}
            port, adamw = by[PORT_ROW], by[ADAMW_ROW]
            t = {
                "size": size["key"],
                "dtype": dt,
                "port_over_adamw": port["median_s"] / adamw["median_s"],
                "state_over_adamw": port["state_bytes"] / adamw["state_bytes"],
                "geoopt_over_port": (
                    by[GEOOPT_ROW]["median_s"] / port["median_s"] if GEOOPT_ROW in by else None
                ),
            }
            t["time_vs_adamw_met"] = t["port_over_adamw"] <= PORT_TARGET_VS_ADAMW
            t["vs_geoopt_met"] = (
                None
                if t["geoopt_over_port"] is None
                else t["geoopt_over_port"] >= PORT_TARGET_VS_GEOOPT
            )
            t["state_met"] = t["state_over_adamw"] <= PORT_TARGET_STATE * 1.05
            t["floor_over_adamw"] = (
                by[FLOOR_ROW]["median_s"] / adamw["median_s"] if FLOOR_ROW in by else None
            )
            targets.append(t)
    profile_rows: dict[str, Any] = {}
    if profile:
        big = sizes[-1]
        for dt in dtypes:
            profile_rows[dt] = _port_attribution(big, names[dt], seed)
        notes.append(
            f"Profile on size ({big['key']}): one port step after two warm-up steps, every torch "
            "operator call timed under a TorchDispatchMode and charged to the innermost "
            "torch_port source line (``_port_attribution``); 'step' is the same step "
            "uninstrumented."
        )
    notes.append(
        f"lr {PORT_LR:g} for all; AdamW with torch's defaults otherwise (weight_decay 1e-2, "
        "foreach=True); geoopt RiemannianAdam with its defaults on ManifoldParameter("
        "manifold=EuclideanStiefel()) (QR retraction, projection transport, full-size "
        "exp_avg_sq); the port's RiemannianAdam with moment='frame' (one √v per frame) and the "
        "polar retraction."
    )
    env = _environment(None)
    env.update(
        {
            "loadavg_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "geoopt": getattr(geoopt, "__version__", None) if geoopt else None,
        }
    )
    return {
        "dtypes": list(dtypes),
        "repeats": int(repeats),
        "seed": int(seed),
        "lr": PORT_LR,
        "sizes": sizes,
        "rows": rows,
        "targets": targets,
        "profile": profile_rows,
        "notes": notes,
        "environment": env,
    }


def format_port(result: dict[str, Any]) -> str:
    """Markdown for a ``bench_port`` result: the step table, the targets of size (b), the stage
    breakdown and the profile, then the notes."""
    lines = [
        f"Optimizer step, {result['repeats']} interleaved rounds (median and interquartile "
        "range of seconds per step); state = bytes of the optimizer's state tensors:",
        "",
        "| size | dtype | optimizer | median (ms) | IQR (ms) | × AdamW | state (MB) "
        "| state / AdamW |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    adamw_state = {
        (x["size"], x["dtype"]): x["state_bytes"] for x in result["rows"] if x["name"] == ADAMW_ROW
    }
    for x in result["rows"]:
        lines.append(
            f"| {x['size']} | {x['dtype']} | {x['name']} | {1e3 * x['median_s']:.2f} "
            f"| {1e3 * x['iqr_s']:.2f} | {x['ratio_to_adamw']:.2f} "
            f"| {x['state_bytes'] / 2**20:.2f} "
            f"| {x['state_bytes'] / adamw_state[(x['size'], x['dtype'])]:.2f} |"
        )
    lines.append("")
    labels = {s["key"]: s["label"] for s in result["sizes"]}
    for t in result["targets"]:
        verdict = "met" if t["time_vs_adamw_met"] else "NOT met"
        line = (
            f"- {labels[t['size']]}, {t['dtype']}: port / AdamW = {t['port_over_adamw']:.2f} "
            f"(target ≤ {PORT_TARGET_VS_ADAMW:g}: {verdict})"
        )
        if t["geoopt_over_port"] is not None:
            verdict = "met" if t["vs_geoopt_met"] else "NOT met"
            line += (
                f"; geoopt / port = {t['geoopt_over_port']:.2f} "
                f"(target ≥ {PORT_TARGET_VS_GEOOPT:g}: {verdict})"
            )
        verdict = "met" if t["state_met"] else "NOT met"
        line += (
            f"; state port / AdamW = {t['state_over_adamw']:.3f} "
            f"(target ≈ {PORT_TARGET_STATE:g}: {verdict})"
        )
        if t.get("floor_over_adamw") is not None:
            line += f"; floor / AdamW = {t['floor_over_adamw']:.2f}"
        lines.append(line)
    for dt, prof in result.get("profile", {}).items():
        lines += [
            "",
            f"Where one port step goes, size ({result['sizes'][-1]['key']}), {dt}: step "
            f"{1e3 * prof['step_s']:.0f} ms uninstrumented, {1e3 * prof['instrumented_s']:.0f} ms "
            f"instrumented, of which {1e3 * prof['ops_s']:.0f} ms inside torch operators "
            f"(top {len(prof['sites'])} source lines, then operators):",
            "",
            "| torch_port source line | operator calls | ms | share |",
            "| --- | ---: | ---: | ---: |",
        ]
        for x in prof["sites"]:
            lines.append(
                f"| {x['site']} | {x['calls']} | {1e3 * x['seconds']:.1f} | {x['share']:.0%} |"
            )
        lines += ["", "| operator | calls | ms | share |", "| --- | ---: | ---: | ---: |"]
        for x in prof["operators"]:
            lines.append(
                f"| {x['op']} | {x['calls']} | {1e3 * x['seconds']:.1f} | {x['share']:.0%} |"
            )
    lines.append("")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines)
