"""One optimisation step of each of the ten geometries (``rattn bench geometries``).

``bench_geometries`` times egrad_to_rgrad + retract + transport of every geometry in
``reference.GEOMETRIES`` against pymanopt's FixedRankEmbedded, with the cost scaling of R1 and R2;
``format_geometries`` renders the result as Markdown. Timings and their environment:
``proofs_checks.bench.timing``.
"""

from __future__ import annotations

import importlib.util
import itertools
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
    _median_rows,
    machine_environment,
)
from proofs_checks.memory import require_memory

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
        "environment": machine_environment("pymanopt"),
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
