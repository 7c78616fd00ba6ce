"""RA-7: the fixed-step rule is degree one in the gradient, the Adam rule degree zero."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import mpmath
import numpy as np
import sympy as sp
from hypothesis import strategies as st

import reference as ref
from proofs_checks.bounds import gamma, relative_tolerance
from proofs_checks.harness import frame_problem, ladder, property_check, substituted, vanishes
from proofs_checks.propositions.common import BETAS, LR, MP_D, MP_R, D, R
from proofs_checks.propositions.ra_shapes import over_shapes
from proofs_checks.registry import Check, Context, Outcome, Proposition, register
from reference import mp, optim_transforms
from reference.linalg import frobenius

#: The claimed degree of each rule.
DEGREES = {"rsgd": 1, "riemannian_adam": 0, "normalized_rsgd": 0}
RULES = {
    "rsgd": lambda: ref.optim.rsgd(LR),
    "riemannian_adam": lambda: ref.optim.riemannian_adam(LR, eps=0.0),
    "normalized_rsgd": lambda: ref.optim.normalized_rsgd(LR),
}


#: The near miss of every check but the range ends, substituted into the library: Adam's ε
#: forced to 1e-8 (optim's default) whatever ε is asked for, as a builder that drops its ε
#: argument would, in ``reference.optim`` and in the transcription ``reference.mp``. Degree zero
#: then fails by ≈ ε/(c·RMS(P_W G)): 1e-5 at c = 1e-3 in float64, 7e7 × the tolerance.
EPS_DROPPED = "Adam's ε = 0 dropped by its builder (ε = 1e-8, optim's default, taken instead)"
DROPPED_EPS = 1e-8

#: The near miss of ``degree_resolution``: the normalised rule's denominator RMS(g) + τ (a
#: guard against 0/0), so degree zero fails by (1 − c)·τ/(c·RMS + τ) ≈ τ/(c·RMS) = 3e-12 at
#: c = 1e-3, about 20 × ``relative_tolerance(64, 16)``.
RMS_GUARD = 3e-15

_RIEMANNIAN_ADAM = ref.optim.riemannian_adam
_ADAM_TRAJECTORY = mp.adam_trajectory


def _eps_dropped(lr, betas=BETAS, eps=DROPPED_EPS, *rest, **options):
    return _RIEMANNIAN_ADAM(lr, betas, DROPPED_EPS, *rest, **options)


def _trajectory_eps_dropped(w0, egrads, lr, betas=BETAS, eps=DROPPED_EPS, *rest, **options):
    return _ADAM_TRAJECTORY(w0, egrads, lr, betas, DROPPED_EPS, *rest, **options)


@contextlib.contextmanager
def eps_dropped(wrong: bool) -> Iterator[None]:
    """``EPS_DROPPED`` in ``reference.optim`` and ``reference.mp`` when ``wrong``."""
    if not wrong:
        yield
        return
    with (
        substituted(ref.optim, "riemannian_adam", _eps_dropped),
        substituted(mp, "adam_trajectory", _trajectory_eps_dropped),
    ):
        yield


def one_step_maps() -> tuple[dict, list, list]:
    """The one-step maps from a fresh state on ℝ³ (gradient g = (g_0, g_1, g_2), s(g) = RMS(g)²
    = Σg_i²/3): rsgd ξ = −lr·g, Adam with ε = 0
    ξ = −lr·((1 − β1)g/(1 − β1))/sqrt((1 − β2)s(g)/(1 − β2)) and normalised ξ = −lr·g/RMS(g);
    with their symbols (g, [c, lr, β1, β2]). At t = 1 the moment factors and bias corrections
    cancel exactly, and SymPy cancels them as it builds the map: Adam's step is the normalised
    one, −lr·g/RMS(g)."""
    c, lr = sp.symbols("c lr", positive=True)
    b1, b2 = sp.symbols("beta1 beta2", positive=True)
    g = sp.Matrix(sp.symbols("g0:3", real=True))

    def rms(v: sp.Matrix) -> sp.Expr:
        return sp.sqrt(sum(x**2 for x in v) / 3)

    steps = {
        "rsgd": lambda v: -lr * v,
        "riemannian_adam": lambda v: (
            -lr * ((1 - b1) * v / (1 - b1)) / sp.sqrt((1 - b2) * rms(v) ** 2 / (1 - b2))
        ),
        "normalized_rsgd": lambda v: -lr * v / rms(v),
    }
    return steps, list(g), [c, lr, b1, b2]


#: Gradients at which the transcribed maps are held to the library's: an entry of each sign,
#: one much smaller than the others.
LIBRARY_POINTS = ((0.3, -1.2, 2.0), (1e-3, 5.0, -0.25), (-7.0, 0.5, 3.0))


def transcription_gap() -> float:
    """max over rules and ``LIBRARY_POINTS`` of ‖ξ_sympy(g) − ξ_lib(g)‖/‖ξ_lib(g)‖, the library's
    step being one step of ``RULES[name]`` on ``reference.Euclidean(3)`` from a fresh state."""
    steps, g, (_, lr, b1, b2) = one_step_maps()
    worst = 0.0
    for name, f in steps.items():
        numeric = sp.lambdify([g], f(sp.Matrix(g)).subs({lr: LR, b1: BETAS[0], b2: BETAS[1]}))
        geometry, x = ref.Euclidean(3), np.zeros(3)
        for point in LIBRARY_POINTS:
            opt = RULES[name]()
            lib = opt.update(geometry, x, np.array(point), opt.init(geometry, x))[0]
            ours = np.asarray(numeric(list(point)), dtype=float).reshape(3)
            worst = max(worst, frobenius(ours - lib) / frobenius(lib))
    return worst


#: Bound on ``transcription_gap``, from the operations each side rounds (each relative error
#: ≤ u). The lambdified map −lr·g/sqrt(Σ g_i²/3): three squares, three divisions by 3, two
#: additions and the square root (under the root, so halved), then ×lr and the division: ≤ 7u
#: per entry. The library's Adam step (``reference.optim``): g/s, the squares and their sum,
#: the square root, ÷√3 (√3 itself rounded), ×s, ×√(1 − β2), ÷c2, 1/c1, ÷ the denominator,
#: (1 − β1)·g, the trust factor and ×(−lr): ≤ 14u (factors that cancel exactly, c2 = 1 − β2 and
#: c1 = 1 − β1 as the same floats, counted anyway). Each side is within γ_16 of the exact step
#: entrywise, and the two within 2γ_16 of each other in norm; measured 4.0e-16 ≈ 3.6u.
TRANSCRIPTION_TOL = 2 * gamma(16)


def symbolic_degree(ctx: Context, wrong: bool) -> Outcome:
    """SymPy reduces ξ(cg) − c^k ξ(g) to zero for the one-step maps of ``one_step_maps``
    (c > 0; rsgd k = 1, Adam with ε = 0 and normalised k = 0), and those maps are the library's:
    evaluated at ``LIBRARY_POINTS`` they equal its one-step maps on ℝ³ within
    ``TRANSCRIPTION_TOL``. Control (a near miss): ``EPS_DROPPED`` substituted into
    ``reference.optim``, so that the library's Adam keeps ε = 1e-8 (gap ≈ ε/RMS(g) ≈ 7e-9).
    The SymPy identities themselves are held to their wrong degrees by the tests
    (``tests/test_propositions.py``)."""
    steps, g, (c, *_) = one_step_maps()
    v = sp.Matrix(g)
    left = [name for name, f in steps.items() if not vanishes(f(c * v) - c ** DEGREES[name] * f(v))]
    with eps_dropped(wrong):
        gap = transcription_gap()
    return Outcome(
        not left and gap <= TRANSCRIPTION_TOL,
        gap,
        TRANSCRIPTION_TOL,
        f"identities left nonzero: {left or 'none'}; transcription vs library {gap:.2e}",
        exercised={
            "sizes": f"{len(g)} symbolic gradient entries (ℝ^{len(g)})",
            "options": f"rules {', '.join(steps)}; c > 0, lr, β1, β2 symbolic; "
            f"library at lr {LR}, β = {BETAS}",
            "points": f"{len(LIBRARY_POINTS)} gradients on ℝ^{len(g)} for the transcription",
            "steps": "1 from a fresh state",
            "dtypes": "exact (SymPy); float64 for the transcription against the library",
            "seeds": "none (exact)",
        },
    )


def spread(prob) -> float:
    """‖G‖/‖P_W G‖, the amplification of projection rounding (see ``relative_tolerance``)."""
    g = prob.grads[0]
    return frobenius(g) / frobenius(prob.geometry.proj(prob.w0, g))


def degree_gap(d: int, r: int, seed: int, c: float) -> tuple[float, str]:
    """max over rules of ‖ξ(cG) − c^k ξ(G)‖/‖c^k ξ(G)‖ for one step from a fresh state, and the
    measured degrees log(‖ξ(cG)‖/‖ξ(G)‖)/log c."""
    prob = frame_problem(d, r, 1, seed)
    worst, measured = 0.0, []
    for name, make in RULES.items():
        opt = make()
        state = opt.init(prob.geometry, prob.w0)
        xi = opt.update(prob.geometry, prob.w0, prob.grads[0], state)[0]
        xic = opt.update(prob.geometry, prob.w0, c * prob.grads[0], state)[0]
        expected = c ** DEGREES[name] * xi
        if frobenius(expected) > 0:
            worst = max(worst, frobenius(xic - expected) / frobenius(expected))
            measured.append(f"{name} {np.log(frobenius(xic) / frobenius(xi)) / np.log(c):.6f}")
    return worst, ", ".join(measured)


def float64_degree(ctx: Context, wrong: bool) -> Outcome:
    """At St(64, 16), c = 1e3 and 1e-3: relative gap ≤ ``relative_tolerance(d, r)``. Control
    (a near miss): ``EPS_DROPPED`` substituted into ``reference.optim``, the claim unchanged."""
    scales = (1e3, 1e-3)
    with eps_dropped(wrong):
        results = [degree_gap(D, R, ctx.seed, c) for c in scales]
    res = max(r for r, _ in results)
    tol = relative_tolerance(D, R, spread(frame_problem(D, R, 1, ctx.seed)))
    return Outcome.bound(
        res,
        tol,
        f"measured degrees at c = 1e3: {results[0][1]}",
        {
            "sizes": f"St({D}, {R})",
            "steps": "1 from a fresh state",
            "options": f"c ∈ {{{', '.join(f'{c:g}' for c in scales)}}}, "
            f"rules {', '.join(RULES)} (lr {LR}, Adam ε = 0)",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def _normalize_by_rms_guarded() -> ref.optim.Transform:
    """``normalize_by_rms`` with the denominator RMS(g) + ``RMS_GUARD`` per frame: a tiny additive
    constant where degree zero needs the scale to cancel exactly."""

    def update(geometry, x, u):
        dens = [s + RMS_GUARD for s in optim_transforms._frame_rms(geometry, x, u)]
        return optim_transforms._scale_groups(geometry, u, [1.0] * len(dens), dens)

    return optim_transforms._stateless(update)


def degree_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``float64_degree`` (‖ξ(cG) − c^k ξ(G)‖/‖c^k ξ(G)‖ at St(64, 16), c = 1e±3, bound
    ``relative_tolerance(d, r)``); control, a near miss: the normalised rule's RMS(g) + τ,
    τ = ``RMS_GUARD`` (``_normalize_by_rms_guarded``), substituted into ``reference.optim``:
    its degree-zero gap is then ≈ τ/(c·RMS(P_W G)) = 3e-12 at c = 1e-3."""
    guarded = substituted(ref.optim, "normalize_by_rms", _normalize_by_rms_guarded)
    with guarded if wrong else contextlib.nullcontext():
        return float64_degree(ctx, False)


def mpmath_degree(ctx: Context, wrong: bool) -> Outcome:
    """At St(6, 3) with c = 1e3 at 30 and 60 digits: rsgd ξ = −lr·P_W(cG) and the Adam step of
    the mpmath trajectory (ε = 0), relative gap ≤ ``relative_tolerance(d, r, u)``. Control:
    ``EPS_DROPPED`` substituted into ``reference.mp`` (the gap then stays ≈ 1e-8 at every
    precision)."""
    prob = frame_problem(MP_D, MP_R, 1, ctx.seed)
    scale = 1000

    def measure(dps: int) -> float:
        c, w, g = mpmath.mpf(scale), mp.to_mp(prob.w0), mp.to_mp(prob.grads[0])
        pairs = {
            "rsgd": (-LR * mp.proj(w, g), -LR * mp.proj(w, c * g)),
            "riemannian_adam": tuple(
                mp.adam_trajectory(w, [s * g], LR, BETAS, 0.0).steps[0] for s in (1, c)
            ),
        }
        return max(
            mp.frobenius(b - c ** DEGREES[k] * a) / mp.frobenius(c ** DEGREES[k] * a)
            for k, (a, b) in pairs.items()
        )

    with eps_dropped(wrong):
        return ladder(
            measure,
            lambda u: relative_tolerance(MP_D, MP_R, spread(prob), u),
            "relative gap ξ(cG) vs c^k ξ(G)",
            exercised={
                "sizes": f"St({MP_D}, {MP_R})",
                "steps": "1 from a fresh state",
                "options": f"c = {scale}, rules rsgd, riemannian_adam (lr {LR}, ε = 0)",
                "dtypes": "mpmath",
                "seeds": ctx.seed,
            },
        )


#: The ends of float64's range: gradients scaled by 2^-1060 (their entries subnormal) and by
#: 2^1000, and two frames whose gradients are 2^1100 apart (2^1000 and 2^-100).
SUBNORMAL, HUGE, APART = 2.0**-1060, 2.0**1000, (2.0**1000, 2.0**-100)
#: St(8, 3): the frames start at W_0 = [I; 0].
END_D, END_R = 8, 3
#: The degree-zero rules at the ends of the range.
ZERO_DEGREE = {
    "riemannian_adam": lambda: ref.optim.riemannian_adam(LR, eps=0.0),
    "normalized_rsgd": lambda: ref.optim.normalized_rsgd(LR),
}
TINY_STEP = 2.0**-1074  # the spacing of the subnormal grid


def _tangent_at_corner(rng: np.random.Generator) -> np.ndarray:
    """A Gaussian G whose top r×r block is exactly skew: at W_0 = [I; 0], WᵀG is that block and
    sym(WᵀG) = 0 bit for bit, so P_W(G) = G with no rounding at any scale (rounding c·G keeps
    the block skew: round to nearest is symmetric in sign)."""
    g = rng.standard_normal((END_D, END_R))
    g[:END_R] = 0.5 * (g[:END_R] - g[:END_R].T)
    return g


def _one_step(make, geometry, x, g) -> tuple:
    opt = make()
    return ref.geometry.parts(opt.update(geometry, x, g, opt.init(geometry, x))[0])


def _frame_gaps(make, geometry, x, g, g_scaled) -> float:
    """max over frames of ‖ξ_k(scaled) − ξ_k(G)‖/‖ξ_k(G)‖."""
    a, b = _one_step(make, geometry, x, g), _one_step(make, geometry, x, g_scaled)
    return max(frobenius(q - p) / frobenius(p) for p, q in zip(a, b, strict=True))


def subnormal_tolerance(rule: str, g: np.ndarray, c: float) -> float:
    """``subnormal_grid`` plus the rounding of the normal-range operations,
    ``relative_tolerance(8, 3, 0)`` (the products of P_W are exact here)."""
    return subnormal_grid(rule, g, c) + relative_tolerance(END_D, END_R, 0.0)


def subnormal_grid(rule: str, g: np.ndarray, c: float) -> float:
    """Bound on the relative change ‖ξ(cG) − ξ(G)‖/‖ξ(G)‖ of one step of a degree-zero rule
    (Adam with ε = 0, t = 1, or the normalised rule) that the subnormal values of cG add.

    Each operation whose result is subnormal adds up to half the grid
    spacing η = 2^-1074, relative to its value: the RMS s·‖g/s‖/√n itself (both rules), and for
    Adam (t = 1) also the n entries of m = (1 − β1)cg, relative to ‖m‖, √(1 − β2)·RMS and
    √v/c2 ≈ RMS: δ = η/2·(1/RMS) or η/2·(√n/((1 − β1)‖cg‖) + 2/RMS + 1/(√(1 − β2)·RMS)),
    with η/(c·x) computed as (η/c)/x so that nothing overflows; a relative error δ in the
    denominator moves the step by |δ/(1 + δ)| ≤ δ/(1 − δ). The normalised rule reaches 0.99 of
    its bound on some seeds: its one subnormal rounding can take the whole half spacing.
    """
    n = g.size
    h = 0.5 * (TINY_STEP / c)  # η/2 in units of the scale c (η/2 itself rounds to 0)
    norm = frobenius(g)
    rms = norm / np.sqrt(n)
    if rule == "normalized_rsgd":
        grid = h / rms
    else:
        b1, b2 = BETAS
        grid = h * (np.sqrt(n) / ((1 - b1) * norm) + 2 / rms + 1 / (np.sqrt(1 - b2) * rms))
    return grid / (1 - grid)  # |δ/(1 + δ)| for |δ| ≤ grid


def _pow2(c: float) -> str:
    """A power of two as 2^k."""
    return f"2^{np.log2(c):.0f}"


def subnormal_degree(ctx: Context, wrong: bool) -> Outcome:
    """One step of each degree-zero rule at W_0 = [I; 0] on G' = fl(2^-1060·G)/2^-1060 (exactly
    the gradient whose 2^-1060 multiple is the subnormal fl(2^-1060·G)) and on that subnormal
    gradient: relative gap ≤ ``subnormal_tolerance`` (the rounding of its subnormal values on
    the subnormal grid; about 2e-3 for Adam and 2e-5 for the normalised rule). Here num/den
    overflows, so ``_ratio_scaler`` takes its p/den·num route. Control (``wrong``): that
    route removed, p·(num/den) at every size."""
    geometry = ref.Stiefel(END_D, END_R)
    x = np.eye(END_D, END_R)
    g_sub = SUBNORMAL * _tangent_at_corner(np.random.default_rng([ctx.seed, 7]))
    g = g_sub / SUBNORMAL  # exact: a power-of-two scaling back into the normal range
    tolerances = {name: subnormal_tolerance(name, g, SUBNORMAL) for name in ZERO_DEGREE}
    naive = substituted(
        optim_transforms,
        "_ratio_scaler",
        lambda num, den: lambda p: p * optim_transforms._safe_ratio(num, den),
    )
    with naive if wrong else contextlib.nullcontext(), np.errstate(over="ignore", invalid="ignore"):
        ratios = {
            name: _frame_gaps(make, geometry, x, g, g_sub) / tolerances[name]
            for name, make in ZERO_DEGREE.items()
        }
    worst = max(ratios, key=lambda k: ratios[k] if np.isfinite(ratios[k]) else np.inf)
    return Outcome.bound(
        float(ratios[worst]) if np.isfinite(ratios[worst]) else np.inf,
        1.0,
        f"gap / bound: {', '.join(f'{k} {v:.3e}' for k, v in ratios.items())}",
        {
            "sizes": f"St({END_D}, {END_R})",
            "points": "W_0 = [I; 0]",
            "steps": "1 from a fresh state",
            "options": f"gradient scale {_pow2(SUBNORMAL)} (subnormal entries), "
            f"rules {', '.join(ZERO_DEGREE)} (lr {LR}, Adam ε = 0)",
            "dtypes": "float64, subnormal range",
            "seeds": ctx.seed,
        },
    )


def apart_degree(ctx: Context, wrong: bool) -> Outcome:
    """One step of each degree-zero rule on St(8, 3) × St(8, 3) at ([I; 0], [I; 0]), with the
    frames' gradients (G_A, G_B) and (2^1000·G_A, 2^-100·G_B): per frame, relative gap ≤
    ``relative_tolerance(8, 3, 0)`` (every value stays normal, and each frame's RMS is its own).
    max|g_B|/max|g_A| = 2^-1100 is below the smallest normal ratio, so dividing both frames by
    one scale would leave g_B/s subnormal. Control (``wrong``): ``_frame_rms`` with one scale
    for all frames."""
    x0 = np.eye(END_D, END_R)
    geometry = ref.Product(ref.Stiefel(END_D, END_R), ref.Stiefel(END_D, END_R))
    rng = np.random.default_rng([ctx.seed, 8])
    g = (_tangent_at_corner(rng), _tangent_at_corner(rng))
    g_apart = tuple(c * gi for c, gi in zip(APART, g, strict=True))
    worst = 0.0
    with (
        substituted(optim_transforms, "_frame_rms", _one_scale)
        if wrong
        else contextlib.nullcontext()
    ):
        for make in ZERO_DEGREE.values():
            worst = max(worst, _frame_gaps(make, geometry, (x0, x0), g, g_apart))
    return Outcome.bound(
        worst,
        relative_tolerance(END_D, END_R, 0.0),
        "per-frame gap at scales 2^1000, 2^-100",
        {
            "sizes": f"St({END_D}, {END_R}) × St({END_D}, {END_R})",
            "points": "([I; 0], [I; 0])",
            "steps": "1 from a fresh state",
            "options": f"frame gradient scales {', '.join(map(_pow2, APART))}, "
            f"rules {', '.join(ZERO_DEGREE)} (lr {LR}, Adam ε = 0)",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def _one_scale(geometry, x, u) -> list[float]:
    """RMS(g_k) = s·‖g_k/s‖/sqrt(entries) with one s = max|g| over all frames."""
    s = optim_transforms._max_abs(u)
    v = optim_transforms._map_groups(geometry, u, [lambda p: p / s] * len(geometry.moment_groups))
    norms = optim_transforms._frame_norms(geometry, x, v)
    sizes = optim_transforms._frame_sizes(geometry, u)
    return [s * (nk / np.sqrt(k)) for nk, k in zip(norms, sizes, strict=True)]


def property_degree(ctx: Context, wrong: bool) -> Outcome:
    """Hypothesis over 1 ≤ r ≤ d ≤ 64, seeds and c = 10^[-100, 100] (St(1, 1) excluded: its
    only tangent vector is 0): relative gap ≤ ``relative_tolerance(d, r)``. Control:
    ``EPS_DROPPED`` substituted into ``reference.optim`` (a gap ≥ ε/RMS(P_W G)·|1 − 10^-0.5|
    at every example)."""

    def measure(example) -> tuple[float, float]:
        (d, r), seed, c_exp = example
        tol = relative_tolerance(d, r, spread(frame_problem(d, r, 1, seed)))
        with eps_dropped(wrong):
            return degree_gap(d, r, seed, 10.0**c_exp)[0], tol

    min_d, c_range, c_gap = 2, (-100, 100), 0.5
    space = over_shapes(
        st.floats(*c_range).filter(lambda e: abs(e) > c_gap),
        corner=(0, 3.0),
        min_d=min_d,
        steps="1 from a fresh state",
        options=f"c = 10^e, e ∈ [{c_range[0]}, {c_range[1]}], |e| > {c_gap}, "
        f"rules {', '.join(RULES)} (lr {LR}, Adam ε = 0)",
    )
    what = "relative gap ξ(cG) vs c^k ξ(G)"
    return property_check(ctx, measure=measure, what=what, **space)


register(
    Proposition(
        id="RA-7",
        title="Degree of the update rules in the gradient",
        statement=(
            r"For $c>0$, one step of fixed-step Riemannian SGD satisfies $\xi(cG)=c\,\xi(G)$ "
            r"(degree one), while the scalar-moment Riemannian Adam with $\varepsilon=0$ and the "
            r"normalised rule satisfy $\xi(cG)=\xi(G)$ (degree zero)."
        ),
        hypotheses=(
            "one step from a fresh state",
            "no trust-region cap (a cap truncates degree one)",
        ),
        checks=(
            Check(
                "symbolic",
                "homogeneity of the three one-step maps, the library's",
                symbolic_degree,
                EPS_DROPPED,
            ),
            Check("float64", "measured degrees at c = 1e±3", float64_degree, EPS_DROPPED),
            Check(
                "float64",
                f"resolution: a guard RMS(g) + {RMS_GUARD:g} in the normalised rule is caught",
                degree_resolution,
                f"near miss: the normalised rule's denominator RMS(g) + {RMS_GUARD:g} (a tiny "
                "additive guard where degree zero needs exact cancellation), substituted into "
                "reference.optim",
            ),
            Check("mpmath", "degree gap falls with precision", mpmath_degree, EPS_DROPPED),
            Check("property", "degrees over shapes, seeds and c", property_degree, EPS_DROPPED),
            Check(
                "float64",
                "degree zero for subnormal gradients",
                subnormal_degree,
                "the ratio's route for an overflowing num/den removed",
            ),
            Check(
                "float64",
                "degree zero per frame, frames 2^1100 apart",
                apart_degree,
                "one scale for all frames in the RMS",
            ),
        ),
    )
)
