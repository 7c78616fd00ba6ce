"""PORT-5: the port's geometries are the reference's, method by method and decision by decision.

PORT-1 compares whole optimizer steps; the methods a step does not call (every retraction
option, the transports and matrices of tangent vectors, the group action, the vertical vectors,
the polar factor's other routes, the validators) are compared here on the same float64 inputs,
for St(d, r), the five plain geometries and the per-head views of their block variants (the
pairs built in ``port_geometry_pairs``; the validators' check in ``port_validation``).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases
from proofs_checks import geometry_laws as law
from proofs_checks.bounds import frame_error
from proofs_checks.harness import substituted
from proofs_checks.propositions.port_geometry_pairs import (
    BLOCK_OPTIONS,
    BLOCKS,
    NAMES,
    block_geometries,
    geometries,
    to_numpy,
    to_torch,
)
from proofs_checks.propositions.port_validation import validation
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference.geometry import parts, tree_map
from reference.linalg import skew

#: Random points per geometry and option at which ``methods`` compares every method.
POINTS = 3


def _calls(rg: Any, x: Any, rng: np.random.Generator) -> list[tuple[str, tuple]]:
    """(method, arguments) of every method both sides have, on one point x: an ambient z, a
    tangent u, a vector of the tangent layout that is not tangent (for ``proj_tangent``), a
    step ξ (‖ξ‖ = 0.3) to y = R_x(ξ), a vertical Ω, a group element."""
    z = tree_map(lambda p: rng.standard_normal(np.shape(p)), x)
    u = rg.proj(x, z)
    xi = law.times(0.3 / rg.norm(x, u), u)
    y = rg.retract(x, xi)
    g = rg.egrad_to_rgrad(x, tree_map(lambda p: rng.standard_normal(np.shape(p)), x))
    calls = [
        ("proj", (x, z)),
        ("egrad_to_rgrad", (x, z)),
        ("proj_tangent", (x, tree_map(lambda p: rng.standard_normal(np.shape(p)), u))),
        ("retract", (x, xi)),
        ("transport", (x, y, u)),
        ("inner", (x, u, g)),
        ("norm", (x, u)),
        ("to_matrix", (x,)),
        ("tangent_to_matrix", (x, u)),
        ("pair", (x,)),
    ]
    if hasattr(rg, "exp"):
        calls.append(("exp", (x, xi)))
    if hasattr(rg, "pair"):
        pair = rg.pair(x)
        calls.append(
            ("egrad_from_pair", (x, tuple(rng.standard_normal(np.shape(p)) for p in pair)))
        )
    r = np.shape(parts(x)[0])[-1]
    omega = skew(rng.standard_normal((r, r)))
    if hasattr(rg, "vertical"):
        calls.append(("vertical", (x, omega)))
        calls.append(("act", (x, law.random_group_element(rg, rng))))
    if hasattr(rg, "horizontal_residual"):
        calls.append(("horizontal_residual", (x, tree_map(np.add, u, rg.vertical(x, omega)))))
    return calls


def _ratio(want: list[np.ndarray], got: list[np.ndarray], tol: float) -> float:
    """max ‖got − want‖ over the parts, relative to tol·max(1, ‖want‖)."""
    size = max(1.0, float(np.sqrt(sum(np.sum(w**2) for w in want))))
    dev = max(float(np.linalg.norm(np.ravel(g - w))) for g, w in zip(got, want, strict=True))
    return dev / (tol * size)


def _polar_one_step_short(a: Any, *args: Any, **kwargs: Any) -> Any:
    """The polar factor one Newton–Schulz step short: A(3I − AᵀA)/2, right to first order in
    AᵀA − I (so wrong by O(‖ξ‖⁴) ≈ 1e-2 for a step of 0.3)."""
    from torch_port import linalg as tl

    return a @ (3.0 * tl.eye_like(a) - tl.transpose(a) @ a) / 2.0


def _polar_control(wrong: bool) -> contextlib.AbstractContextManager:
    """The control of the method and route checks: ``_polar_one_step_short`` substituted for
    ``torch_port.linalg.polar``."""
    from torch_port import linalg as tl

    return substituted(tl, "polar", _polar_one_step_short) if wrong else contextlib.nullcontext()


def methods(ctx: Context, wrong: bool) -> Outcome:
    """St(7, 3) and the five plain geometries at (6, 5, 3), each with every option it is built with
    (``geometry_cases.OPTIONS``): every method both sides have (``_calls``), on the same float64
    points (``POINTS`` random ones per geometry and option, seeds [seed, 8, k]), evaluated by the
    reference and by the port. Each side evaluates at most ten products of inner dimension k ≤
    (largest size) + 2r and factorisations of r×r or 2r×2r matrices, so each is within
    ``law_tolerance`` (20·γ_k times the conditioning of R1's and R2's r×r solves) of the exact
    value, relative to the output's size: residual max ‖port − reference‖/(2·law_tolerance·max(1,
    ‖reference‖)), tolerance 1; and the block variants' per-head views (``head_factors``,
    ``egrad_from_heads``) alike; the port's ``Stiefel.frame_norm`` in both metrics on scaled
    tangents (``_frame_norm_ratio``); and the scale of the random points, in distribution
    (``_draws_ratio``). Control: the port's polar factor one Newton–Schulz step short, substituted
    into ``torch_port.linalg``."""
    worst, where, count = 0.0, "", 0
    with _polar_control(wrong):
        for name in NAMES:
            for option, k in itertools.product(cases.OPTIONS[name], range(POINTS)):
                rg, tg = geometries(name, option)
                rng = np.random.default_rng([ctx.seed, 8, k])
                x = rg.random_point(rng)
                tol = 2 * law.law_tolerance(rg, x)
                for method, args in _calls(rg, x, rng):
                    if not hasattr(tg, method):
                        continue
                    want = to_numpy(getattr(rg, method)(*args))
                    got = to_numpy(getattr(tg, method)(*(to_torch(a) for a in args)))
                    count += 1
                    if (ratio := _ratio(want, got, tol)) > worst:
                        worst, where = ratio, f"{name} {option} {method}"
        for name in BLOCKS:
            for options, k in itertools.product(BLOCK_OPTIONS, range(POINTS)):
                rg, tg = block_geometries(name, options)
                if [tuple(b) for b in tg.pattern] != [tuple(b) for b in rg.pattern]:
                    worst, where = np.inf, f"{name} {options}: pattern {tg.pattern}"
                    continue
                rng = np.random.default_rng([ctx.seed, 8, k])
                x = rg.random_point(rng)
                tol = 2 * law.law_tolerance(rg, x)
                for method, want, got in _block_calls(rg, tg, x, rng):
                    count += 1
                    if (ratio := _ratio(want, got, tol)) > worst:
                        worst, where = ratio, f"{name} {options} {method}"
        for name in NAMES:
            rg, tg = geometries(name, {})
            count += 1
            if (ratio := _draws_ratio(rg, tg, ctx.seed)) > worst:
                worst, where = ratio, f"{name} random_point"
        for metric in ("embedded", "canonical"):
            count += 2
            if (ratio := _frame_norm_ratio(metric, ctx.seed)) > worst:
                worst, where = ratio, f"stiefel {metric} frame_norm"
            if (ratio := _batched_ratio(metric, ctx.seed)) > worst:
                worst, where = ratio, f"stiefel {metric} batched inner, norm, random_tangent"
    exercised = {
        "geometries": f"{', '.join(NAMES)} with every option; {', '.join(BLOCKS)}",
        "sizes": f"St{cases.STIEFEL}, {cases.SIZES} (blocks as BLOCK_OPTIONS)",
        "points": f"{POINTS} random per geometry and option ({count} method calls)",
        "dtypes": "float64",
        "seeds": ctx.seed,
    }
    return Outcome.bound(
        worst, 1.0, f"{count} method calls; worst {worst:.2e} at {where}", exercised
    )


#: Random points compared in distribution: DRAWS from each side, and the factor by which the
#: mean squared norms of a factor may differ. Each mean has relative standard deviation
#: sqrt(2/(DRAWS·k)) ≤ 0.036 (k ≥ 3 entries a factor; 0 for orthonormal factors), so the log of
#: a ratio of two has standard deviation ≤ 0.051 and log 1.25 = 0.223 is more than four of
#: them for k = 3; at the sizes used, 7.5 for R1's 3×3 core (k = 9) and 9.7 or more for R2's
#: factors (k ≥ 15): a false failure has probability below 1e-5 per comparison at k = 3, and
#: below 1e-13 here (measured: 0.13 of log 1.25 at seed 0, the largest of seeds 0 … 2).
DRAWS, DRAW_FACTOR = 512, 1.25


def _draws_ratio(rg: Any, tg: Any, seed: int) -> float:
    """max over the factors of |log(port's mean ‖P‖²/reference's mean ‖P‖²)| / log 1.25, over
    DRAWS random points drawn by each side (the scale a random point is drawn at)."""
    import torch

    rng = np.random.default_rng([seed, 10])
    draws = [[np.sum(np.square(f)) for f in to_numpy(rg.random_point(rng))] for _ in range(DRAWS)]
    want = np.mean(draws, axis=0)
    batch = tg.random_point(generator=torch.Generator().manual_seed(seed), batch_shape=(DRAWS,))
    got = np.array([np.sum(np.square(f)) / DRAWS for f in to_numpy(batch)])
    return float(np.max(np.abs(np.log(got / want)))) / np.log(DRAW_FACTOR)


def _frame_norm_ratio(metric: str, seed: int) -> float:
    """The port's ``Stiefel.frame_norm`` of c·u against the reference's ‖u‖ times c, for
    c = 2^-990, 1 and 2^1000 (exact scalings of entries ≥ 1e-10: the squares of c·u underflow or
    ‖c·u‖ overflows, so its scaled route is taken), within 2·law_tolerance relative: the
    residual's ratio."""
    rg, tg = geometries("stiefel", {"metric": metric})
    rng = np.random.default_rng([seed, 11])
    x = rg.random_point(rng)
    u = rg.proj(x, rng.standard_normal(np.shape(x)))
    want, tol = float(rg.norm(x, u)), 2 * law.law_tolerance(rg, x)
    worst = 0.0
    for c in (2.0**-990, 1.0, 2.0**1000):
        got = float(tg.frame_norm(to_torch(x), to_torch(c * u))) / c
        worst = max(worst, abs(got - want) / (tol * want))
    return worst


def _batched_ratio(metric: str, seed: int) -> float:
    """The port's ``inner``, ``norm`` and geodesic ``exp`` (at ‖ξ‖ = 0.3) on a batch of two
    St(7, 3) frames against the reference's per frame, and its ``random_tangent`` on that
    batch: of unit norm and tangent (‖P_W(u) − u‖), each within 2·law_tolerance relative (the
    residual's ratio)."""
    import torch

    from torch_port import linalg as tl

    rg, tg = geometries("stiefel", {"metric": metric})
    rng = np.random.default_rng([seed, 14])
    xs = [rg.random_point(rng) for _ in range(2)]
    us = [rg.proj(x, rng.standard_normal(np.shape(x))) for x in xs]
    vs = [rg.proj(x, rng.standard_normal(np.shape(x))) for x in xs]
    tol = 2 * max(law.law_tolerance(rg, x) for x in xs)
    x, u, v = (to_torch(np.stack(a)) for a in (xs, us, vs))
    inner, norm = to_numpy(tg.inner(x, u, v))[0], to_numpy(tg.norm(x, u))[0]
    t = tg.random_tangent(x, generator=torch.Generator().manual_seed(seed))
    unit = to_numpy(tg.norm(x, t))[0]
    tangency = to_numpy(tl.frobenius(tg.proj(x, t) - t))[0]
    xis = [0.3 * u_k / rg.norm(x_k, u_k) for x_k, u_k in zip(xs, us, strict=True)]
    geodesic = to_numpy(tg.exp(x, to_torch(np.stack(xis))))[0]
    errors = [
        *(
            np.linalg.norm(geodesic[k] - (want := rg.exp(xs[k], xis[k])))
            / max(1, np.linalg.norm(want))
            for k in (0, 1)
        ),
        *(abs(inner[k] - rg.inner(xs[k], us[k], vs[k])) / max(1, abs(inner[k])) for k in (0, 1)),
        *(abs(norm[k] - rg.norm(xs[k], us[k])) / norm[k] for k in (0, 1)),
        *np.abs(unit - 1),
        *tangency,
    ]
    return float(max(errors)) / tol


def _block_calls(rg: Any, tg: Any, x: Any, rng: np.random.Generator) -> list[tuple]:
    """(method, reference's output, port's output) of the per-head views of a block variant:
    the port's point is the reference's groups stacked along a group dimension."""
    xt = tuple(to_torch(np.stack([xg[k] for xg in x])) for k in range(len(x[0])))
    a, b = rg.head_factors(x)
    got_a, got_b = tg.head_factors(xt)
    g_a = [rng.standard_normal(np.shape(f)) for f in a]
    g_b = [rng.standard_normal(np.shape(f)) for f in b]
    want = rg.egrad_from_heads(x, g_a, g_b)
    got = to_numpy(tg.egrad_from_heads(xt, to_torch(np.stack(g_a)), to_torch(np.stack(g_b))))
    return [
        ("head_factors", [np.stack(a), np.stack(b)], to_numpy((got_a, got_b))),
        (
            "egrad_from_heads",
            [w[k] for w in want for k in range(len(w))],
            [g[c] for c in range(len(want)) for g in got],
        ),
    ]


def _route_matrices(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """W + 1e-3·G (the Taylor polynomial: δ ≈ 1e-3), W·diag(1, 2, 3) (δ > 0.5, κ = 3: eigh),
    W·diag(1, 1, 1/20) (κ = 20 > 10: the SVD), and 2^700·(W + 0.3·G) (a Gram beyond float64:
    rescaled first)."""
    d, r = cases.STIEFEL
    w = ref.Stiefel(d, r).random_point(rng)
    g = rng.standard_normal((d, r))
    return [
        ("Taylor", w + 1e-3 * g),
        ("eigh", w @ np.diag([1.0, 2.0, 3.0])),
        ("SVD", w @ np.diag([1.0, 1.0, 1.0 / 20.0])),
        ("rescaled", 2.0**700 * (w + 0.3 * g)),
    ]


def polar_routes(ctx: Context, wrong: bool) -> Outcome:
    """Every route of the port's polar factor (``_route_matrices``) against
    ``reference.linalg.polar`` of the same matrix: each route's forward error is at most κ × its
    orthonormality bound (``frame_error``: the inverse square root of a Gram of condition κ²
    amplifies the Gram's relative error by ≤ κ²/2 and A adds κ), so the two agree within
    2κ·frame_error(7, 3, κ). Residual: the worst deviation over its bound, tolerance 1. Control:
    the port's polar factor one Newton–Schulz step short, substituted into
    ``torch_port.linalg``."""
    from torch_port import linalg as tl

    rng = np.random.default_rng([ctx.seed, 10])
    worst, details = 0.0, []
    with _polar_control(wrong):
        for label, a in _route_matrices(rng):
            kappa = float(np.linalg.cond(a))
            bound = 2 * kappa * frame_error(*cases.STIEFEL, kappa=kappa)
            got = tl.polar(to_torch(a)).numpy()
            ratio = float(np.linalg.norm(got - ref.linalg.polar(a))) / bound
            worst = max(worst, ratio)
            details.append(f"{label} {ratio:.1e}")
    exercised = {
        "sizes": f"St{cases.STIEFEL}",
        "points": ", ".join(label for label, _ in _route_matrices(np.random.default_rng(0))),
        "dtypes": "float64",
        "seeds": ctx.seed,
    }
    return Outcome.bound(worst, 1.0, "deviation/bound: " + ", ".join(details), exercised)


register(
    Proposition(
        id="PORT-5",
        title="The port's geometries are the reference's, method by method",
        statement=(
            r"For $\mathrm{St}(7,3)$ and the five plain geometries at $(m,n,r)=(6,5,3)$, with "
            r"every retraction and metric they are built with, every method that the port and "
            r"the reference both have (projections, gradients, retractions, transports, "
            r"metrics, matrices of points and tangents, the group action and vertical vectors, "
            r"and the block variants' per-head factors and gradients) agrees with the "
            r"reference's on the same float64 inputs (three random points per geometry and "
            r"option, with their tangents) within the rounding bound of "
            r"\texttt{law\_tolerance}, their random points are drawn at the same scale (the "
            r"mean squared norm of each factor within a factor 1.25 over 512 draws), every "
            r"route of its polar factor agrees with the "
            r"reference's polar factor within $2\kappa$ times its orthonormality bound, and "
            r"the port's validators accept and refuse the points the stated thresholds do "
            r"at the thresholds themselves (within a relative $10^{-6}$ on either side, so "
            r"that a threshold moved by $0.5\%$ changes a decision) and the sizes they state."
        ),
        hypotheses=(
            "float64 inputs drawn by the reference",
            "thresholds √ε (orthonormality, tangency ×max(1, ‖ξ‖)), r·ε (R1's core), "
            "κ(A)²κ(B)²·u ≤ 1e-8 (R2), λ_min(AᵀA) > ε·λ_max·d (the polar factor)",
        ),
        checks=(
            Check(
                "float64",
                "every method as the reference's",
                methods,
                "the polar factor one Newton–Schulz step short",
            ),
            Check(
                "float64",
                "every route of the polar factor",
                polar_routes,
                "the polar factor one Newton–Schulz step short",
            ),
            Check(
                "float64",
                "validation as the stated thresholds",
                validation,
                "near miss: each threshold of the port moved by ±0.5% (atol, R2's limit, R1's "
                "and the polar factor's rank tests)",
            ),
        ),
        requires=("torch",),
    )
)
