"""The properties ``rattn conform`` checks on an optimizer it knows only by its steps.

Each property is a registered, citable proposition (``PROPERTIES``, ids ``CONF-…``) about the
step map W ↦ W⁺ of the optimizer under test, driven by the seeded problem of ``problem``. Its
check returns an ``Outcome``: passed (or ``None`` when it cannot be measured, e.g. the
optimizer has no ``weight_decay``), the measured value against its bound, and a detail line.
A claimed property passes only on evidence; an unclaimed one is measured and reported.

Finite differences. The first-order properties read the step map S(h) = W⁺(lr = h) − W at
three step lengths h, 2h, 3h, with h chosen so that ‖S(h)‖ = η = 10⁻³, and fit
S(kh) = k·hD + k²·h²C + k³·h³E (a Vandermonde solve). They run in float64 whatever the dtype
of the run, because a difference quotient needs the precision. For a retraction whose fourth
Taylor coefficient is at most ‖D‖⁴ (polar: ⅜‖W(ξᵀξ)²‖ ≤ ⅜‖ξ‖⁴; QR, Cayley and exp alike) the
fit's truncation error is at most v·81·η⁴ for D and C (v the absolute row sum of the inverse
Vandermonde matrix, 4.83 and 5), and each S(kh) carries a rounding error of at most
R = 10·(d + r)·u·‖W‖ (u = 2⁻⁵³); so, relative to ‖hD‖ and ‖hD‖²:

    τ_D = 4.83·(81·η³ + R/η),    τ_C = 5·(81·η² + R/η²).

Trajectories. Where two runs must agree (scale, equivariance, decay), each step may differ by
the audit's per-step rounding bound B_t (``proofs_checks.audit.replay.step_bound``) and carries the
difference before it with a Lipschitz factor L = 2, so e_T ≤ Σ_t L^{T−t}·B_t. These are
properties of the rule, not of its rounding, and L^T makes the bound useless in float32
(~10 at 20 steps), so they too run in float64; a bound above ``RESOLUTION`` of the path's
length resolves nothing and the property is then not measured, never passed. The iterates'
drift (CONF-MANIFOLD), the state (CONF-STATE) and the agreement with a rule (CONF-RULE, step by
step, so nothing accumulates) are checked in the dtype of the run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from proofs_checks import reference_rules
from proofs_checks.audit.replay import (
    FACTORING_RETRACTIONS,
    LIPSCHITZ,
    RESOLUTION,
    SAFETY,
    step_bound,
)
from proofs_checks.conformance.problem import Problem, Run, TargetError, drive
from proofs_checks.port_compare.geometries import unit_roundoff
from reference import optim as ro

Array = np.ndarray

#: Finite-difference step length ‖S(h)‖ (module docstring) and the multiples of h fitted.
ETA = 1e-3
MULTIPLES = np.array([1.0, 2.0, 3.0])
#: Steps of the long runs: manifold drift, agreement with a rule, the trajectory comparisons.
DRIFT_STEPS = 200
RULE_STEPS = 200
#: The step of CONF-RULE at which the first parameter's grad is None.
NONE_AT = 7
TRAJECTORY_STEPS = 10
EQUIVARIANCE_STEPS = 20
#: Gradient scales of the degree-0 check (powers of two: the scaled gradients are exact).
SCALES = (2.0**-24, 2.0**24)
DECAY = 0.1


@dataclass
class Outcome:
    passed: bool | None
    detail: str
    value: float | None = None
    bound: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What every check needs: the target, the problem (with its space), the dtype of the run,
    the run's lr, the claims and the claimed rule (name and settings) if any."""

    factory: Callable[..., Any]
    problem: Problem
    dtype: torch.dtype
    lr: float | None  # None: the optimizer's own
    claims: dict[str, Any]
    rule: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def space(self) -> Any:
        return self.problem.space

    def run(self, problem: Problem | None = None, dtype: torch.dtype | None = None) -> Run:
        problem = problem or self.problem
        dtype = dtype or self.dtype
        start = [torch.tensor(p, dtype=dtype).double().numpy() for p in problem.start()]
        run = Run(self.factory, problem.space, start, dtype)
        if self.lr is not None:
            run.set("lr", self.lr)
        if "weight_decay" in self.settings:  # the rule's decay is the optimizer's too
            run.set("weight_decay", self.settings["weight_decay"])
        return run

    @property
    def u(self) -> float:
        return unit_roundoff(self.dtype)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype)

    def dims(self) -> tuple[int, int]:
        """(n, r): the largest matrix dimension and the largest rank of the problem's points."""
        sizes = self.space.sizes()
        return max(s[0] for s in sizes), max(s[1] for s in sizes)

    def bound_rules(
        self, lr: float | None = None, decay: bool = True
    ) -> list[reference_rules.BoundRule]:
        """The claimed rule on each point's geometry, at lr (the run's when None), without its
        weight decay when ``decay`` is False (as the first-order properties run)."""
        settings = {**self.settings, "lr": self.lr if lr is None else lr}
        if not decay:
            settings.pop("weight_decay", None)
        spec = reference_rules.rule_spec(self.rule)
        return [spec.bind_to(settings, self.space.geometry(i)) for i in range(len(self.space))]

    def decays(self) -> list[float]:
        """The rule's forgetting factors β (its moments remember ~1/(1 − β) steps)."""
        s = self.settings
        out = list(s.get("betas", (0.9, 0.999) if "adam" in (self.rule or "") else ()))
        out += [s[k] for k in ("beta", "momentum") if k in s]
        if self.rule == "riemannian_momentum" and "beta" not in s:
            out.append(0.9)
        return [float(b) for b in out]

    def factoring(self) -> bool:
        """Whether the claimed rule's retraction factors W + ξ in the working dtype."""
        if self.rule is None:
            return True
        if reference_rules.rule_spec(self.rule).field:
            return True
        return self.settings.get("retraction", "polar") in FACTORING_RETRACTIONS

    # -- the point as the properties see it (``spaces``) -------------------------------------
    def elements(self, arrays: Sequence[Array]) -> list[tuple[int, Any]]:
        """(point index, reference point) of every element the arrays hold."""
        return [(i, x) for i in range(len(self.space)) for x in self.problem.elements(arrays, i)]

    def view(self, arrays: Sequence[Array]) -> list[Array]:
        """Every element's view, flat (what lengths and differences are taken of)."""
        return [v for i, x in self.elements(arrays) for v in self.space.view(i, x)]

    def split(self, arrays: Sequence[Array], flat: Sequence[Array]) -> list[tuple[int, Any, list]]:
        """(i, x, its parts of ``flat``) for every element x: a flat list of views cut up."""
        out, k = [], 0
        for i, x in self.elements(arrays):
            n = len(self.space.view(i, x))
            out.append((i, x, list(flat[k : k + n])))
            k += n
        return out


# -- helpers -----------------------------------------------------------------------------------
def _norm(arrays: Sequence[Array]) -> float:
    return float(np.sqrt(sum(float(np.sum(a * a)) for a in arrays)))


def _diff(a: Sequence[Array], b: Sequence[Array]) -> list[Array]:
    return [x - y for x, y in zip(a, b, strict=True)]


def _largest(values: Sequence[float]) -> float:
    """max of the values, inf when one is not finite (Python's max skips a NaN)."""
    values = list(values)
    return max(values) if all(math.isfinite(v) for v in values) else math.inf


def _residual(ctx: Context, arrays: Sequence[Array]) -> float:
    """max over elements of their distance from the manifold (``spaces``; inf when not finite)."""
    if not all(np.isfinite(a).all() for a in arrays):
        return math.inf
    return _largest([ctx.space.residual(i, x) for i, x in ctx.elements(arrays)])


def _one_step(ctx: Context, lr: float, *, scale: float = 1.0) -> list[Array]:
    """The views after one step from the problem's start with G_0 (float64 run), without
    weight decay (the first-order properties are those of the rule and its retraction; decay
    has its own property)."""
    run = ctx.run(dtype=torch.float64)
    run.set("lr", lr)
    if run.has("weight_decay"):
        run.set("weight_decay", 0.0)
    start = run.points()
    run.step(ctx.problem.gradients(start, 0, scale))
    return ctx.view(run.points())


def _vandermonde() -> Array:
    return np.stack([MULTIPLES, MULTIPLES**2, MULTIPLES**3], axis=1)


def _fit(steps: Sequence[Sequence[Array]]) -> tuple[list[Array], list[Array]]:
    """hD and h²C from S(h), S(2h), S(3h) (one list of arrays per multiple)."""
    inv = np.linalg.inv(_vandermonde())
    hd = [sum(inv[0, k] * steps[k][i] for k in range(3)) for i in range(len(steps[0]))]
    h2c = [sum(inv[1, k] * steps[k][i] for k in range(3)) for i in range(len(steps[0]))]
    return hd, h2c


def _tolerances(ctx: Context, w_norm: float) -> tuple[float, float]:
    """τ_D and τ_C of the module docstring (float64)."""
    inv = np.abs(np.linalg.inv(_vandermonde())).sum(axis=1)
    d, r = ctx.dims()
    rounding = 10.0 * (d + r) * unit_roundoff(torch.float64) * w_norm
    tau_d = inv[0] * (81.0 * ETA**3 + rounding / ETA)
    tau_c = inv[1] * (81.0 * ETA**2 + rounding / ETA**2)
    return float(tau_d), float(tau_c)


def first_order(ctx: Context) -> dict[str, Any]:
    """The fit of the step map at the problem's start (cached): the start's arrays and view,
    the view gradient G, hD, h²C, h, τ_D, τ_C."""
    if "first" in ctx._cache:
        return ctx._cache["first"]
    run = ctx.run(dtype=torch.float64)
    arrays = run.points()
    w = ctx.view(arrays)
    probe = _norm(_diff(_one_step(ctx, ctx.lr), w))
    if probe == 0.0:
        raise _Unmeasurable(f"one step at lr {ctx.lr:g} does not move the point")
    h = ctx.lr * ETA / probe
    steps = [_diff(_one_step(ctx, k * h), w) for k in MULTIPLES]
    hd, h2c = _fit(steps)
    tau_d, tau_c = _tolerances(ctx, _norm(w))
    ctx._cache["first"] = {
        "arrays": arrays,
        "w": w,
        "g": ctx.problem.view_gradients(arrays, 0),
        "hd": hd,
        "h2c": h2c,
        "h": h,
        "tau_d": tau_d,
        "tau_c": tau_c,
    }
    return ctx._cache["first"]


class _Unmeasurable(Exception):
    """The property cannot be measured on this target (said in its detail)."""


# -- the properties ----------------------------------------------------------------------------
def check_manifold(ctx: Context, claim: Any) -> Outcome:
    run = ctx.run()
    path = drive(run, ctx.problem, DRIFT_STEPS)
    worst = _largest([_residual(ctx, p) for p in path])
    start = _residual(ctx, path[0])
    bound = start + ctx.space.drift_bound(ctx.dtype)
    return Outcome(
        worst <= bound,
        f"max distance from the manifold over {DRIFT_STEPS} steps {worst:.2e} "
        f"(after the last {_residual(ctx, path[-1]):.2e}), bound {bound:.2e} "
        "(one orthonormalisation's rounding: drift must not accumulate)",
        worst,
        bound,
    )


def check_tangent(ctx: Context, claim: Any) -> Outcome:
    f = first_order(ctx)
    size = _norm(f["hd"])
    parts = ctx.split(f["arrays"], f["hd"])
    normal = _norm([n for i, x, d in parts for n in ctx.space.normal(i, x, d)])
    slopes = [
        sum(float(np.sum(gi * di)) for gi, di in zip(g, d, strict=True))
        for (_, _, d), (_, _, g) in zip(parts, ctx.split(f["arrays"], f["g"]), strict=True)
    ]
    ratio = normal / size
    descent = max(slopes) < 0.0
    return Outcome(
        ratio <= f["tau_d"] and descent,
        f"normal part of the first-order step {ratio:.2e} of it (bound τ_D {f['tau_d']:.1e}); "
        f"largest ⟨G, D⟩ over the points {max(slopes) / f['h']:.3e} "
        f"({'a descent direction' if descent else 'NOT a descent direction'} at every point)",
        ratio,
        f["tau_d"],
    )


def _reference_first_order(ctx: Context, f: dict[str, Any]) -> list[Array]:
    """hD of the claimed rule at the same point, gradient and h (float64 fit)."""
    arrays = f["arrays"]
    grads = ctx.problem.gradients(arrays, 0)
    steps = []
    for k in MULTIPLES:
        rules = ctx.bound_rules(k * f["h"], decay=False)
        out = []
        for i, rule in enumerate(rules):
            for x, g in zip(
                ctx.problem.elements(arrays, i), ctx.problem.elements(grads, i), strict=True
            ):
                y = rule.step(x, g, rule.init(x))[0]
                out += _diff(ctx.space.view(i, y), ctx.space.view(i, x))
        steps.append(out)
    return _fit(steps)[0]


def check_direction(ctx: Context, claim: Any) -> Outcome:
    f = first_order(ctx)
    hd = f["hd"]
    if ctx.rule is not None:
        expected = _reference_first_order(ctx, f)
        err = _norm(_diff(hd, expected)) / _norm(expected)
        bound = 2.0 * f["tau_d"]
        ratio = _norm(hd) / _norm(expected)
        return Outcome(
            err <= bound,
            f"first-order step vs {ctx.rule}'s: relative difference {err:.2e} (bound {bound:.1e}); "
            f"length ratio {ratio:.6f}",
            err,
            bound,
        )
    metric = ctx.claims.get("metric")
    grads = ctx.problem.gradients(f["arrays"], 0)
    worst = 0.0
    egrads = [g for k in range(len(ctx.space)) for g in ctx.problem.elements(grads, k)]
    for (i, x, d), eg in zip(ctx.split(f["arrays"], hd), egrads, strict=True):
        rg = ctx.space.view_tangent(i, x, ctx.space.rgrad(i, x, eg, metric))
        gap = _norm([di / _norm(d) + ri / _norm(rg) for di, ri in zip(d, rg, strict=True)])
        worst = max(worst, gap * _norm(d) / _norm(hd))
    where = f"the {metric} metric" if metric else "the geometry's metric"
    return Outcome(
        worst <= f["tau_d"],
        f"first-order step vs −grad in {where}, point by point: direction gap "
        f"{worst:.2e} (bound τ_D {f['tau_d']:.1e})",
        worst,
        f["tau_d"],
    )


def check_order(ctx: Context, claim: Any) -> Outcome:
    f = first_order(ctx)
    metric = ctx.claims.get("metric")
    gaps = []
    for (i, x, d), (_, _, c) in zip(
        ctx.split(f["arrays"], f["hd"]), ctx.split(f["arrays"], f["h2c"]), strict=True
    ):
        gap = ctx.space.order_gap(i, x, d, c, metric)
        if gap is None:
            raise _Unmeasurable(
                "on a quotient the order is that of horizontal geodesics, not read from W"
            )
        gaps += gap
    rho = _norm(gaps) / _norm(f["hd"]) ** 2
    measured = 2 if rho <= f["tau_c"] else 1
    against = f"the {metric} geodesic's" if metric else "the geodesic's (a normal acceleration)"
    return Outcome(
        None if claim is None else measured == int(claim),
        f"second-order term vs {against}: ρ = {rho:.2e} of ‖D‖² "
        f"(order 2 when ρ ≤ τ_C = {f['tau_c']:.1e}): order {measured}",
        rho,
        f["tau_c"],
        {"order": measured},
    )


def _conditioning(ctx: Context, arrays: Sequence[Array]) -> float:
    return _largest([ctx.space.conditioning(x) for _, x in ctx.elements(arrays)])


def _accumulated(ctx: Context, path: Sequence[list[Array]]) -> float:
    """Σ_t L^{T−t}·B_t over the steps of a float64 path of arrays (module docstring)."""
    total = 0.0
    n, r = ctx.dims()
    for before, after in itertools.pairwise(path):
        a, b = ctx.view(before), ctx.view(after)
        step = _norm(_diff(b, a))
        kappa = _conditioning(ctx, after)
        bound = step_bound(str(torch.float64), 0.0, step, _norm(b), n, r, kappa, factoring=True)
        total = LIPSCHITZ * total + bound
    return total


def _compare_paths(
    ctx: Context, a: Sequence[list[Array]], b: Sequence[list[Array]], what: str, extra=0.0
) -> Outcome:
    """Two float64 trajectories (the parameters' arrays) that must agree: pass when their views
    differ by at most the accumulated bound, and only when that bound resolves a difference
    (≤ RESOLUTION of the path's length; else not measurable, never passed)."""
    va, vb = [ctx.view(p) for p in a], [ctx.view(p) for p in b]
    dev = _largest([_norm(_diff(x, y)) for x, y in zip(va, vb, strict=True)])
    bound = _accumulated(ctx, a) + extra
    length = sum(_norm(_diff(y, x)) for x, y in itertools.pairwise(va))
    detail = f"{what}: differ by {dev:.2e} (bound {bound:.1e})"
    if bound > RESOLUTION * length:
        return Outcome(None, f"{detail}: the bound does not resolve the path", dev, bound)
    return Outcome(dev <= bound, detail, dev, bound)


def _path(ctx: Context, problem: Problem | None = None, steps: int = TRAJECTORY_STEPS, **set_):
    """A float64 trajectory of the problem with the given hyperparameters (scale: of G;
    decay: λ·x added to G)."""
    scale, decay = set_.pop("scale", 1.0), set_.pop("decay", 0.0)
    run = ctx.run(problem, torch.float64)
    for key, value in set_.items():
        run.set(key, value)
    return drive(run, problem or ctx.problem, steps, scale=scale, decay=decay)


def check_degree(ctx: Context, claim: Any) -> Outcome:
    f = first_order(ctx)
    doubled = _norm(_diff(_one_step(ctx, f["h"], scale=2.0), f["w"]))
    single = _norm(_diff(_one_step(ctx, f["h"]), f["w"]))
    measured = math.log2(doubled / single)
    detail = f"measured degree {measured:.3f} (step length under G → 2G at the first step)"
    if claim is None:
        return Outcome(None, detail, measured, extra={"degree": measured})
    if int(claim) == 0:
        base = _path(ctx)
        outcomes = [
            _compare_paths(ctx, base, _path(ctx, scale=c), f"{TRAJECTORY_STEPS} steps, G → {c:g}·G")
            for c in SCALES
        ]
    else:
        outcomes = [
            _compare_paths(
                ctx,
                _path(ctx, steps=1, lr=c * ctx.lr),
                _path(ctx, steps=1, scale=c),
                f"one step with {c:g}·G vs one with {c:g}·lr",
            )
            for c in (0.5, 2.0)
        ]
    out = _worst(outcomes, detail)
    out.extra["degree"] = measured
    return out


def _worst(outcomes: Sequence[Outcome], extra: str = "") -> Outcome:
    """The outcomes joined: failed if one failed, unmeasured if one is, else passed."""
    verdicts = [o.passed for o in outcomes]
    passed = False if False in verdicts else (None if None in verdicts else True)
    worst = max(outcomes, key=lambda o: (o.value or 0.0) / (o.bound or 1.0))
    detail = "; ".join([o.detail for o in outcomes] + ([extra] if extra else []))
    return Outcome(passed, detail, worst.value, worst.bound)


def check_equivariance(ctx: Context, claim: Any) -> Outcome:
    rotated = ctx.problem.rotated()
    base = _path(ctx, steps=EQUIVARIANCE_STEPS)
    turned = _path(ctx, rotated, steps=EQUIVARIANCE_STEPS)
    space = ctx.space
    back = [
        [
            a
            for i, q in enumerate(rotated.rotation)
            for a in space.assemble(i, [space.rotate(q, x) for x in ctx.problem.elements(pts, i)])
        ]
        for pts in base
    ]
    start = _norm(_diff(ctx.view(back[0]), ctx.view(turned[0])))
    return _compare_paths(
        ctx,
        back,
        turned,
        f"{EQUIVARIANCE_STEPS} steps from (QW, QG) vs Q times those from (W, G)"
        + ("" if ctx.space.name == "stiefel" else " (Q on the rows of W, P on its columns)"),
        extra=LIPSCHITZ**EQUIVARIANCE_STEPS * start,
    )


def check_decay(ctx: Context, claim: Any) -> Outcome:
    if not ctx.run().has("weight_decay"):
        raise _Unmeasurable("the optimizer has no 'weight_decay' hyperparameter")
    claim = claim or "none"
    if claim == "fused" and ctx.space.name != "stiefel":
        raise _Unmeasurable("fused decay is stated for Stiefel frames (DESIGN §5)")
    decayed = _path(ctx, lr=ctx.lr, weight_decay=DECAY)
    if claim == "fused":
        expected = _path(ctx, lr=ctx.lr / (1.0 - ctx.lr * DECAY), weight_decay=0.0)
        what = "equals lr/(1 − lr·λ) without decay (fused: polar(W + ξ/(1 − lr·λ)))"
    elif claim == "coupled":
        expected = _path(ctx, lr=ctx.lr, weight_decay=0.0, decay=DECAY)
        what = "equals the run without decay fed G + λ·x (coupled, factor by factor)"
    else:
        expected = _path(ctx, lr=ctx.lr, weight_decay=0.0)
        what = "equals the run without decay (points are not decayed, RA-5)"
    return _compare_paths(
        ctx, expected, decayed, f"{TRAJECTORY_STEPS} steps with weight_decay {DECAY:g} {what}"
    )


def _same(a: Sequence[Array], b: Sequence[Array]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _state_arrays(run: Run, p: torch.nn.Parameter) -> dict[str, Any]:
    return {
        k: (v.detach().clone() if torch.is_tensor(v) else v)
        for k, v in run.optimizer.state.get(p, {}).items()
    }


def _same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if torch.is_tensor(x) != torch.is_tensor(y):
            return False
        if torch.is_tensor(x) and not torch.equal(x, y):
            return False
        if not torch.is_tensor(x) and x != y:
            return False
    return True


def check_state(ctx: Context, claim: Any) -> Outcome:
    failures = []
    # (a) state_dict round trip resumes bitwise, and saving changes nothing: both the run that
    # was saved and the one resumed from it end where a twin never saved ends
    twin = drive(ctx.run(), ctx.problem, 10)[-1]
    run = ctx.run()
    drive(run, ctx.problem, 5)
    resumed = run.clone(ctx.factory)
    for what, other in (("saved", run), ("resumed from state_dict", resumed)):
        end = drive(other, ctx.problem, 5, start=5)[-1]
        if not _same(end, twin):
            failures.append(f"a run {what} departs by {_norm(_diff(end, twin)):.2e}")
    # (b) zero_grad leaves no gradient (torch's default set_to_none=True)
    run.optimizer.zero_grad()
    if any(p.grad is not None for p in run.params):
        failures.append("zero_grad() left gradients that are not None")
    # (c) None gradients for the first point: its parameters and their state are untouched
    before_p = run.points()
    first, others = ctx.space.params_of(0), ctx.space.params_of(1)
    kept = [_state_arrays(run, run.params[k]) for k in first]
    grads: list = run.rounded(ctx.problem.gradients(before_p, 10))
    run.step([None if k in first else g for k, g in enumerate(grads)])
    after = run.points()
    if not all(np.array_equal(after[k], before_p[k]) for k in first):
        failures.append("a point whose gradients are None moved")
    if not all(
        _same_state(s, _state_arrays(run, run.params[k])) for s, k in zip(kept, first, strict=True)
    ):
        failures.append("the state of a point whose gradients are None changed")
    if all(np.array_equal(after[k], before_p[k]) for k in others):
        failures.append("with one point's gradients None, the other point did not move")
    # (d) lr 0 leaves every point bit for bit
    run.set("lr", 0.0)
    before = run.points()
    run.step(run.rounded(ctx.problem.gradients(before, 11)))
    if not _same(before, run.points()):
        failures.append(
            f"a step at lr 0 moved the points by {_norm(_diff(run.points(), before)):.2e}"
        )
    return Outcome(
        not failures,
        "; ".join(failures)
        or "state_dict round trip resumes bitwise; zero_grad sets None; None grads leave their "
        "point and state as they were; lr 0 leaves the points bit for bit",
    )


def _shadow_step(
    ctx: Context, i: int, rule: reference_rules.BoundRule, x: Any, g: Any, y: Any, state: Any
) -> tuple[float, bool, Any]:
    """One step of the reference from the optimizer's own element x of point i (projected to
    the manifold in float64, x̄) with the same gradient: the deviation of the optimizer's y from
    ȳ (in the view) over the audit's bound B (plus SAFETY·u·Σ1/(1 − β)·Δ: the reference's
    moments are rebuilt from the optimizer's points, so they carry its rounding, forgotten at
    rate β), whether B resolves the step (B ≤ RESOLUTION·Δ), and the reference's state moved
    to y. A step the reference refuses is a departure (ratio inf), and the state restarts at
    y."""
    space = ctx.space
    if not (space.residual(i, x) < math.inf and space.residual(i, y) < math.inf):
        return math.inf, True, state  # a point that is not finite departs from every rule
    xbar, ybar_of_y = space.project(i, x), space.project(i, y)
    try:
        ybar, new_state = rule.step(xbar, g, state)
    except ValueError:
        return math.inf, True, rule.init(ybar_of_y)
    n, r = ctx.dims()
    vx, vxbar, vy, vybar = (space.view(i, p) for p in (x, xbar, y, ybar))
    length = _norm(_diff(vybar, vxbar))
    memory = sum(1.0 / (1.0 - b) for b in ctx.decays())
    kappa = max(space.conditioning(xbar), space.conditioning(ybar))
    bound = (
        step_bound(
            ctx.dtype_name,
            _norm(_diff(vx, vxbar)),
            length,
            _norm(vybar),
            n,
            r,
            kappa,
            factoring=ctx.factoring(),
        )
        + SAFETY * ctx.u * memory * length
    )
    dev = _norm(_diff(vy, vybar))
    ratio = dev / bound if bound > 0 else math.inf
    g = space.representative(i, ybar, ybar_of_y)
    if g is not None:  # a quotient: the optimizer may keep another representative of ȳ
        ybar, new_state = rule.geometry.act(ybar, g), _act_on_state(new_state, rule.geometry, g)
    return ratio, bound <= RESOLUTION * length, rule.transport(ybar, ybar_of_y, new_state)


def _act_on_state(state: Any, geometry: Any, g: Any) -> Any:
    """The state with every tangent moment moved by the group element g as the point is,
    (ξ_A M, ξ_B M^{-ᵀ}) or (ξ_U Q, ξ_V Q) (``act``): the same moments at another representative
    (a transport by projection would change them); the scalar √v, a metric norm, is
    invariant."""
    if isinstance(state, ro.AdamState | ro.TraceState):
        return state._replace(m=geometry.act(state.m, g))
    if isinstance(state, tuple):
        return tuple(_act_on_state(s, geometry, g) for s in state)
    return state


def _rule_run(ctx: Context, dtype: torch.dtype) -> tuple[float, int | None, int | None]:
    """CONF-RULE in one dtype: ``RULE_STEPS`` steps under a schedule (lr falls linearly to
    half, set in ``param_groups`` as a scheduler sets it) with the first point's gradients None
    at step ``NONE_AT`` (that point must stay put and its state and count must not move: the
    reference skips it too). Returns the worst deviation/bound, the first departing step and
    the first step the bound does not resolve."""
    run = ctx.run(dtype=dtype)
    problem, space = ctx.problem, ctx.space
    states = [
        [rule.init(space.project(i, x)) for x in problem.elements(run.points(), i)]
        for i, rule in enumerate(ctx.bound_rules())
    ]
    sub = Context(ctx.factory, problem, dtype, ctx.lr, ctx.claims, ctx.rule, ctx.settings)
    first_point = space.params_of(0)
    worst, first, unresolved = 0.0, None, None
    for t in range(RULE_STEPS):
        lr = ctx.lr * (1.0 - 0.5 * t / RULE_STEPS)
        run.set("lr", lr)
        before = run.points()
        grads: list = run.rounded(problem.gradients(before, t))
        skipped = t + 1 == NONE_AT
        try:
            run.step([None if skipped and k in first_point else g for k, g in enumerate(grads)])
        except Exception:  # a step the optimizer cannot take departs from the rule
            return math.inf, first or t + 1, unresolved
        after = run.points()
        for i, rule in enumerate(ctx.bound_rules(lr)):
            if skipped and i == 0:
                still = all(np.array_equal(before[k], after[k]) for k in first_point)
                ratio = 0.0 if still else math.inf
                worst = max(worst, ratio)
                first = t + 1 if ratio > 1.0 and first is None else first
                continue
            elements = zip(
                problem.elements(before, i),
                problem.elements(grads, i),
                problem.elements(after, i),
                strict=True,
            )
            for j, (x, g, y) in enumerate(elements):
                ratio, resolved, states[i][j] = _shadow_step(sub, i, rule, x, g, y, states[i][j])
                worst = max(worst, ratio) if not math.isnan(ratio) else math.inf
                if not ratio <= 1.0 and first is None:
                    first = t + 1
                if not resolved and unresolved is None:
                    unresolved = t + 1
    return worst, first, unresolved


def check_rule(ctx: Context, claim: Any) -> Outcome:
    if ctx.rule is None:
        raise _Unmeasurable("no rule claimed (--rule NAME)")
    if ctx.settings.get("moment") == "elementwise":
        raise _Unmeasurable(
            "the elementwise moment's per-step bound is not available here (use rattn audit)"
        )
    # the run's dtype, and float64 too: a float32 bound (its moments' memory SAFETY·u·Σ1/(1−β)
    # is ~3e-4 of a step) lets through what float64 resolves
    dtypes = [ctx.dtype] + ([torch.float64] if ctx.dtype != torch.float64 else [])
    results = [(dt, *_rule_run(ctx, dt)) for dt in dtypes]
    firsts = [f for _, _, f, _ in results if f is not None]
    unresolved = [u for _, _, _, u in results if u is not None]
    worst = max(w for _, w, _, _ in results)
    first = min(firsts) if firsts else None
    where = ", ".join(str(dt).removeprefix("torch.") for dt in dtypes)
    if first is not None:
        detail = f"departs from {ctx.rule} at step {first} (worst deviation/bound {worst:.3g})"
    elif unresolved:
        detail = f"the bound exceeds {RESOLUTION:g} of the step at step {min(unresolved)}"
    else:
        detail = (
            f"{RULE_STEPS} steps ({where}; lr falling to half; grads None for one point at "
            f"step {NONE_AT}) within the audit's per-step bounds of {ctx.rule} "
            f"(worst deviation/bound {worst:.3g})"
        )
    passed = first is None and not unresolved
    return Outcome(passed, detail, worst, 1.0, {"first_departure_step": first})


# -- the registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Property:
    id: str
    claim: str  # the --claims key
    title: str
    statement: str
    check: Callable[[Context, Any], Outcome]


PROPERTIES: dict[str, Property] = {
    p.id: p
    for p in (
        Property(
            "CONF-MANIFOLD",
            "manifold",
            "iterates stay on the manifold",
            f"Over {DRIFT_STEPS} steps of the problem, max ‖WᵀW − I‖ stays within the rounding of "
            "one orthonormalisation in the run's dtype (polar_drift_bound): no drift accumulates.",
            check_manifold,
        ),
        Property(
            "CONF-TANGENT",
            "tangent",
            "the first-order step is tangent and descends",
            "D = dW⁺/d lr at lr = 0 satisfies ‖sym(WᵀD)‖ ≤ τ_D‖D‖ and ⟨G, D⟩ < 0 in every frame.",
            check_tangent,
        ),
        Property(
            "CONF-DIRECTION",
            "direction",
            "the first-order step is the claimed rule's",
            "D equals the claimed rule's first-order step within 2τ_D (length included); without "
            "a rule, D is a positive multiple of −grad f in the claimed metric, frame by frame.",
            check_direction,
        ),
        Property(
            "CONF-ORDER",
            "order",
            "retraction order as claimed",
            "The second-order term of the step map equals half the claimed metric's geodesic "
            "acceleration along D within τ_C‖D‖² (order 2), or does not (order 1).",
            check_order,
        ),
        Property(
            "CONF-DEGREE",
            "degree",
            "behaviour under gradient scaling as claimed",
            "Degree 0: the trajectory under G → cG (c = 2^±24) is unchanged within the "
            "accumulated rounding bound; degree 1: a step with cG equals a step with c·lr.",
            check_degree,
        ),
        Property(
            "CONF-EQUIVARIANCE",
            "equivariant",
            "O(d)-equivariance",
            f"The {EQUIVARIANCE_STEPS}-step trajectory from (QW, QG_t) equals Q times the one "
            "from (W, G_t) within the accumulated rounding bound (on the ten: from "
            "(QWPᵀ, QG_tPᵀ), P ∈ O(n) acting on the column factor).",
            check_equivariance,
        ),
        Property(
            "CONF-DECAY",
            "decay",
            "weight decay as claimed",
            "none: a run with weight_decay λ = 0.1 equals the run without; fused: it equals the "
            "run at lr/(1 − lr·λ) without decay (polar(W + ξ/(1 − lr·λ)), DESIGN §5); "
            "coupled: it equals the run without decay fed G + λ·x.",
            check_decay,
        ),
        Property(
            "CONF-STATE",
            "state",
            "state as torch's optimizers keep it",
            "A run saved with state_dict() and one resumed from it continue bit for bit as a twin "
            "never saved; zero_grad() sets gradients to None; a parameter whose grad is None "
            "keeps its point and state; lr 0 moves nothing.",
            check_state,
        ),
        Property(
            "CONF-RULE",
            "rule",
            "agreement with the claimed reference rule",
            f"For {RULE_STEPS} steps (lr falling to half, one grad None at step {NONE_AT}) the "
            "reference rule, shadowing the optimizer's own points, reaches each next point "
            f"within the audit's per-step bound, which resolves the step (≤ {RESOLUTION:g} of "
            "its length), in the run's dtype and in float64; the first departing step is named.",
            check_rule,
        ),
    )
}

CLAIM_KEYS = (*(p.claim for p in PROPERTIES.values()), "metric")


def evaluate(prop: Property, ctx: Context) -> Outcome:
    """Run one property; an unmeasurable one is an ``Outcome`` with passed None."""
    claim = ctx.claims.get(prop.claim)
    try:
        return prop.check(ctx, claim)
    except _Unmeasurable as why:
        return Outcome(None, f"not measured: {why}")
    except TargetError:
        raise
    except Exception as err:  # a foreign optimizer may raise anything
        return Outcome(False, f"the optimizer raised {type(err).__name__}: {err}")
