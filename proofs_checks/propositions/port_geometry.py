"""PORT-5: the port's geometries are the reference's, method by method and decision by decision.

PORT-1 compares whole optimizer steps; the methods a step does not call (every retraction
option, the transports and matrices of tangent vectors, the group action, the vertical vectors,
the polar factor's other routes, the validators) are compared here on the same float64 inputs,
for St(d, r), the five plain geometries and the per-head views of their block variants.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

import reference as ref
from proofs_checks import geometry_cases as cases
from proofs_checks import geometry_laws as law
from proofs_checks.bounds import frame_error
from proofs_checks.harness import substituted
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference.geometry import parts, tree_map
from reference.linalg import skew

NAMES = ("stiefel", *cases.ORTHONORMAL)


def _sizes(name: str) -> tuple[int, ...]:
    return cases.STIEFEL if name == "stiefel" else cases.SIZES


def _geometries(
    name: str, option: dict[str, str], sizes: tuple[int, ...] | None = None
) -> tuple[Any, Any]:
    from torch_port.geometries import GEOMETRIES

    make = ref.Stiefel if name == "stiefel" else ref.GEOMETRIES[name]
    sizes = _sizes(name) if sizes is None else sizes
    return make(*sizes, **option), GEOMETRIES[name](*sizes, **option)


def _claims(geo: Any) -> tuple:
    """What a geometry states about itself: the order of its retraction, its dimension, and
    whether it is embedded and a quotient."""
    return (geo.retraction_order, geo.dim, geo.embedded, geo.quotient)


def _torch(v: Any) -> Any:
    import torch

    if isinstance(v, tuple):
        return tuple(_torch(p) for p in v)
    return torch.as_tensor(np.asarray(v, dtype=np.float64))


def _numpy(v: Any) -> list[np.ndarray]:
    items = v if isinstance(v, tuple | list) else (v,)
    return [np.asarray(p.detach().numpy() if hasattr(p, "detach") else p) for p in items]


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
                rg, tg = _geometries(name, option)
                rng = np.random.default_rng([ctx.seed, 8, k])
                x = rg.random_point(rng)
                tol = 2 * law.law_tolerance(rg, x)
                for method, args in _calls(rg, x, rng):
                    if not hasattr(tg, method):
                        continue
                    want = _numpy(getattr(rg, method)(*args))
                    got = _numpy(getattr(tg, method)(*(_torch(a) for a in args)))
                    count += 1
                    if (ratio := _ratio(want, got, tol)) > worst:
                        worst, where = ratio, f"{name} {option} {method}"
        for name in BLOCKS:
            for options, k in itertools.product(BLOCK_OPTIONS, range(POINTS)):
                rg, tg = _block_geometries(name, options)
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
            rg, tg = _geometries(name, {})
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
    draws = [[np.sum(np.square(f)) for f in _numpy(rg.random_point(rng))] for _ in range(DRAWS)]
    want = np.mean(draws, axis=0)
    batch = tg.random_point(generator=torch.Generator().manual_seed(seed), batch_shape=(DRAWS,))
    got = np.array([np.sum(np.square(f)) / DRAWS for f in _numpy(batch)])
    return float(np.max(np.abs(np.log(got / want)))) / np.log(DRAW_FACTOR)


def _frame_norm_ratio(metric: str, seed: int) -> float:
    """The port's ``Stiefel.frame_norm`` of c·u against the reference's ‖u‖ times c, for
    c = 2^-990, 1 and 2^1000 (exact scalings of entries ≥ 1e-10: the squares of c·u underflow or
    ‖c·u‖ overflows, so its scaled route is taken), within 2·law_tolerance relative: the
    residual's ratio."""
    rg, tg = _geometries("stiefel", {"metric": metric})
    rng = np.random.default_rng([seed, 11])
    x = rg.random_point(rng)
    u = rg.proj(x, rng.standard_normal(np.shape(x)))
    want, tol = float(rg.norm(x, u)), 2 * law.law_tolerance(rg, x)
    worst = 0.0
    for c in (2.0**-990, 1.0, 2.0**1000):
        got = float(tg.frame_norm(_torch(x), _torch(c * u))) / c
        worst = max(worst, abs(got - want) / (tol * want))
    return worst


def _batched_ratio(metric: str, seed: int) -> float:
    """The port's ``inner``, ``norm`` and geodesic ``exp`` (at ‖ξ‖ = 0.3) on a batch of two
    St(7, 3) frames against the reference's per frame, and its ``random_tangent`` on that
    batch: of unit norm and tangent (‖P_W(u) − u‖), each within 2·law_tolerance relative (the
    residual's ratio)."""
    import torch

    from torch_port import linalg as tl

    rg, tg = _geometries("stiefel", {"metric": metric})
    rng = np.random.default_rng([seed, 14])
    xs = [rg.random_point(rng) for _ in range(2)]
    us = [rg.proj(x, rng.standard_normal(np.shape(x))) for x in xs]
    vs = [rg.proj(x, rng.standard_normal(np.shape(x))) for x in xs]
    tol = 2 * max(law.law_tolerance(rg, x) for x in xs)
    x, u, v = (_torch(np.stack(a)) for a in (xs, us, vs))
    inner, norm = _numpy(tg.inner(x, u, v))[0], _numpy(tg.norm(x, u))[0]
    t = tg.random_tangent(x, generator=torch.Generator().manual_seed(seed))
    unit = _numpy(tg.norm(x, t))[0]
    tangency = _numpy(tl.frobenius(tg.proj(x, t) - t))[0]
    xis = [0.3 * u_k / rg.norm(x_k, u_k) for x_k, u_k in zip(xs, us, strict=True)]
    geodesic = _numpy(tg.exp(x, _torch(np.stack(xis))))[0]
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


#: The block variants: with their defaults (two query heads sharing one key head: one group,
#: the rows stacked), and with blocks (0, 1), (1, 0) (two groups, the key heads reordered).
BLOCKS = tuple(f"block_{name}" for name in cases.ORTHONORMAL)
BLOCK_OPTIONS = ({}, {"pattern": [(0, 1), (1, 0)]})


def _block_geometries(name: str, options: dict) -> tuple[Any, Any]:
    from torch_port.geometries import GEOMETRIES

    return (
        ref.GEOMETRIES[name](*cases.SIZES, **options),
        GEOMETRIES[name](*cases.SIZES, **options),
    )


def _block_calls(rg: Any, tg: Any, x: Any, rng: np.random.Generator) -> list[tuple]:
    """(method, reference's output, port's output) of the per-head views of a block variant:
    the port's point is the reference's groups stacked along a group dimension."""
    xt = tuple(_torch(np.stack([xg[k] for xg in x])) for k in range(len(x[0])))
    a, b = rg.head_factors(x)
    got_a, got_b = tg.head_factors(xt)
    g_a = [rng.standard_normal(np.shape(f)) for f in a]
    g_b = [rng.standard_normal(np.shape(f)) for f in b]
    want = rg.egrad_from_heads(x, g_a, g_b)
    got = _numpy(tg.egrad_from_heads(xt, _torch(np.stack(g_a)), _torch(np.stack(g_b))))
    return [
        ("head_factors", [np.stack(a), np.stack(b)], _numpy((got_a, got_b))),
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
            got = tl.polar(_torch(a)).numpy()
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


def _pattern(gqa: Callable, heads: tuple[int, int]) -> list | None:
    """The GQA pattern, or None when it is refused."""
    try:
        return gqa(*heads)
    except ValueError:
        return None


#: How far the validation control moves each of the port's thresholds: ±0.5%, far outside the
#: cases' 1e-6 margins (``geometry_cases.MARGIN``) and far inside anything a check at 1% sees.
NEAR_MISS = 0.005


def _scaled(original: Callable, factor: float) -> Callable:
    return lambda *args: factor * original(*args)


def _port_near_misses() -> list[tuple[str, Callable[[], contextlib.AbstractContextManager]]]:
    """(label, context) of each near miss: one of the port's stated thresholds times 1 ± 0.5%,
    substituted where the port reads it: ``default_atol`` (``torch_port.geometry`` and the
    name ``torch_port.stiefel`` imported), R2's ``CONDITION_LIMIT`` and R1's ``RANK_EPS``
    (``torch_port.fixed_rank``), and the polar factor's ``polar_rank_floor``
    (``torch_port.linalg``)."""
    from torch_port import fixed_rank, geometry, stiefel
    from torch_port import linalg as tl

    def atol(factor: float) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        for module in (geometry, stiefel):
            moved = _scaled(module.default_atol, factor)
            stack.enter_context(substituted(module, "default_atol", moved))
        return stack

    out = []
    for f in (1 + NEAR_MISS, 1 - NEAR_MISS):
        out += [
            (f"atol × {f}", lambda f=f: atol(f)),
            (
                f"R2 limit × {f}",
                lambda f=f: substituted(fixed_rank, "CONDITION_LIMIT", f * 1e-8),
            ),
            (
                f"R1 rank × {f}",
                lambda f=f: substituted(fixed_rank, "RANK_EPS", f * cases.EPS),
            ),
            (
                f"polar rank × {f}",
                lambda f=f: substituted(tl, "polar_rank_floor", _scaled(tl.polar_rank_floor, f)),
            ),
        ]
    return out


def _rank_test_matrix(factor: float) -> np.ndarray:
    """A 10×3 A with orthogonal columns of disjoint supports, e_1 + e_4 + e_6 + e_9 (λ_max = 4;
    every entry 0 or 1, so dividing by max|a| is exact), e_2 (λ = 1) and σ·e_3 with
    σ² = factor·ε·λ_max·d (d = 10 rows): its Gram is diag(4, 1, σ²) in every float64 route
    (each entry one product of single entries; σ·σ is within 2u of factor·ε·40) and a symmetric
    eigensolver returns a diagonal matrix's entries exactly, so the polar factor's rank test
    (refuse when λ_min(AᵀA) ≤ ε·λ_max·d) sees factor·ε·λ_max·d itself: it refuses
    factor 1 − 1e-6 and accepts 1 + 1e-6. A test without d, with ε·λ_max/d, with ε/λ_max, or
    with the middle eigenvalue for λ_max decides both alike (λ_max = 4 ≠ 1 and r = 3 tell those
    apart)."""
    a = np.zeros((10, 3))
    a[[0, 3, 5, 8], 0] = 1.0
    a[1, 1] = 1.0
    a[2, 2] = np.sqrt(factor * cases.EPS * 4.0 * 10)
    return a


def _threshold_decisions(ctx: Context) -> tuple[list[str], int]:
    """(wrong decisions, count) of the port at its stated thresholds: ``check_point`` on every
    case of ``geometry_cases.validity_cases`` (and the Stiefel ``tangent_cases``) for St(7, 3)
    and the five plain geometries, and both libraries' polar factors on ``_rank_test_matrix``
    at 1 ∓ 1e-6."""
    from torch_port import linalg as tl

    wrong_calls, count = [], 0
    for name in NAMES:
        rg, tg = _geometries(name, {})
        rng = np.random.default_rng([ctx.seed, 9])
        x = rg.random_point(rng)
        found = cases.validity_cases(name, x, rng)
        if name == "stiefel":  # the port's one tangent validator
            found += cases.tangent_cases(name, rg, x, rng)
        for c in found:
            count += 1
            if c.refused_by(tg, _torch) != c.refused:
                wrong_calls.append(f"{name}: {c.label}")
    for k in cases.MARGINS:
        a, refused = _rank_test_matrix(k), k < 1
        for where, polar in (("reference", ref.linalg.polar), ("port", tl.polar)):
            count += 1
            if cases.refuses(polar, a if where == "reference" else _torch(a)) != refused:
                wrong_calls.append(f"{where} polar at λ_min = {cases.multiple(k)}·ε·λ_max·d")
    return wrong_calls, count


def _other_decisions(ctx: Context) -> tuple[list[str], int]:
    """(wrong decisions, count) of what ``validation`` checks beside the thresholds: sizes,
    claims, a batch of frames, GQA patterns."""
    import torch

    from torch_port import blocks
    from torch_port.geometries import GEOMETRIES

    wrong_calls, count = [], 0
    for name in NAMES:
        for sizes, refused in cases.size_cases(name):
            count += 1
            if cases.refuses(GEOMETRIES[name], *sizes) != refused:
                wrong_calls.append(f"{name}: sizes {sizes}")
    for name in NAMES:
        for option in cases.OPTIONS[name]:
            for r in (1, _sizes(name)[-1]):
                count += 1
                sizes = (*_sizes(name)[:-1], r)
                rg, tg = _geometries(name, option, sizes)
                if _claims(tg) != _claims(rg):
                    wrong_calls.append(f"{name} {option} at r = {r}: claims {_claims(tg)}")
    for name in BLOCKS:
        for options in BLOCK_OPTIONS:
            count += 1
            rg, tg = _block_geometries(name, options)
            if _claims(tg) != _claims(rg):
                wrong_calls.append(f"{name} {options}: claims {_claims(tg)}")
    rg, tg = _geometries("stiefel", {})
    w = _torch(rg.random_point(np.random.default_rng([ctx.seed, 12])))
    off = w * (1 + 2 * cases.ATOL)  # ‖WᵀW − I‖ ≈ 4·atol·√r
    for frames, refused in (((w, w, w), False), ((w, off, w), True)):
        count += 1
        if cases.refuses(tg.check_point, torch.stack(frames)) != refused:
            wrong_calls.append(f"stiefel: a batch of 3 frames, refused {not refused}")
    for heads in cases.GQA_CASES:
        count += 1
        if _pattern(ref.blocks.gqa_pattern, heads) != _pattern(blocks.gqa_pattern, heads):
            wrong_calls.append(f"gqa_pattern{heads}")
    return wrong_calls, count


def validation(ctx: Context, wrong: bool) -> Outcome:
    """The port's validators decide as the stated thresholds do, at the thresholds themselves
    (``_threshold_decisions``): ``check_point`` on every case of
    ``geometry_cases.validity_cases`` (the point as drawn; each orthonormal factor at 1 ∓ 1e-6
    × atol; R1's core at 1 ∓ 1e-6 × r·ε; R2's conditioning at 1 ∓ 1e-6 × 1e-8; the Stiefel
    tangent validator at 1 ∓ 1e-6 × atol·max(1, ‖ξ‖); each case's quantity exact to 2e-7 and
    the validators' rounding ≤ 1.6e-7 of a threshold, ``geometry_cases``), and both libraries'
    polar factors on a 10×3 A (λ_max = 4) whose λ_min(AᵀA) is (1 ∓ 1e-6)·ε·λ_max·d, exactly
    (``_rank_test_matrix``); and beside them (``_other_decisions``) its constructors accept and
    refuse the sizes of ``size_cases`` (r = 1, r = min(m, n), r = min(m, n) + 1) for St(7, 3)
    and the five plain geometries, its GQA patterns are the reference's, refusals included
    (``GQA_CASES``), every option's claims (``_claims``: the retraction's order, the
    dimension, embedded, quotient) at r = 1 and r = 3, and the block variants' with both
    ``BLOCK_OPTIONS``, are the reference's, and a batch of three St(7, 3) frames is accepted,
    and refused when its middle frame is off by 4·atol·√r. Residual: the number of wrong
    decisions, tolerance 0. Control, near misses (``_port_near_misses``): each threshold of the
    port moved by +0.5% and by −0.5% in turn (atol, R2's limit, R1's rank test, the polar
    factor's rank test), substituted into the port's modules; the threshold decisions are
    repeated under each, and the control's residual is the fewest wrong decisions any near miss
    caused (so it is rejected only if every near miss is caught)."""
    if not wrong:
        found, count = _threshold_decisions(ctx)
        others, more = _other_decisions(ctx)
        wrong_calls = found + others
        exercised = {
            "geometries": ", ".join(NAMES) + ", the block variants",
            "cases": f"{count} at the thresholds, {more} others",
            "dtypes": "float64",
            "seeds": ctx.seed,
        }
        return Outcome.bound(
            float(len(wrong_calls)),
            0.0,
            f"wrong decisions: {wrong_calls or 'none'} of {count + more}",
            exercised,
        )
    caught = {}
    for label, moved in _port_near_misses():
        with moved():
            caught[label] = len(_threshold_decisions(ctx)[0])
    least = min(caught.values())
    return Outcome(least == 0, float(least), 0.0, f"wrong decisions per near miss: {caught}")


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
