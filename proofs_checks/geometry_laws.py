"""The laws every geometry must satisfy (DESIGN §6, GEO-*), as measurements on one geometry.

Each function returns (residual, tolerance, detail) for a geometry and a seed; ``geo.py`` binds
them to the registered propositions with each geometry's deliberately wrong variants. The sizes
are small (m, n ≤ 7), so the projection can be measured as a whole operator, and forming m×n
matrices (``to_matrix``) is allowed here, in checks only.
"""

from __future__ import annotations

import copy
import types
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import reference as ref
from proofs_checks.bounds import gamma
from reference.blocks import BlockGeometry
from reference.geometry import like, parts, tree_map
from reference.linalg import frobenius, orthonormality_residual, skew, sym

#: Taylor grid (Manopt's): t = 10^-8 … 1, 51 points; a window is 10 consecutive points.
TAYLOR_T = np.logspace(-8, 0, 51)
WINDOW = 10


# -- geometry surgery for the negative controls --------------------------------------------------
def times(t: float, u: Any) -> Any:
    return tree_map(lambda p: t * p, u)


def base_name(geo: Any) -> str:
    return geo.name.removeprefix("block_")


def patched(geo: Any, **methods: Callable) -> Any:
    """A copy of ``geo`` with methods replaced (``fn(self, ...)``); for a block variant the
    replacement goes to every group's base geometry."""
    if isinstance(geo, BlockGeometry):
        out = copy.copy(geo)
        out.factors = tuple(patched(f, **methods) for f in geo.factors)
        return out
    out = copy.copy(geo)
    for name, fn in methods.items():
        setattr(out, name, types.MethodType(fn, out))
    return out


def per_group(geo: Any, fn: Callable, x: Any, *rest: Any) -> float:
    """Sum ``fn(base, x_g, …)`` over the groups of a block variant (or call it once)."""
    if isinstance(geo, BlockGeometry):
        return float(sum(fn(f, *a) for f, *a in zip(geo.factors, x, *rest, strict=True)))
    return float(fn(geo, x, *rest))


# -- independent tests of tangency and of the constraints -----------------------------------------
def _stiefel_tangency(w: np.ndarray, u: np.ndarray) -> float:
    return frobenius(sym(w.T @ u))


def _tangency(geo: Any, x: Any, u: Any) -> float:
    name = base_name(geo)
    if name == "stiefel":
        return _stiefel_tangency(x, u)
    if name == "fixed_rank_embedded":
        return frobenius(x[0].T @ u[1]) + frobenius(x[2].T @ u[2])
    if name == "partial_isometry_embedded":
        return frobenius(x[0].T @ u[1]) + frobenius(x[1].T @ u[2]) + frobenius(sym(u[0]))
    if name == "stiefel_pair":
        return _stiefel_tangency(x[0], u[0]) + _stiefel_tangency(x[1], u[1])
    if name == "partial_isometry_quotient":
        return (
            _stiefel_tangency(x[0], u[0])
            + _stiefel_tangency(x[1], u[1])
            + frobenius(skew(x[0].T @ u[0] + x[1].T @ u[1]))
        )
    if name == "fixed_rank_quotient":  # horizontality: g(u, (AΩ, −BΩᵀ)) = 0 for every Ω
        r = x[0].shape[1]
        worst = 0.0
        for k in range(r * r):
            omega = np.zeros(r * r)
            omega[k] = 1.0
            v = geo.vertical(x, omega.reshape(r, r))
            worst = max(worst, abs(geo.inner(x, u, v)) / geo.norm(x, v))
        return worst
    raise KeyError(name)


def tangency(geo: Any, x: Any, u: Any) -> float:
    """How far u is from the (horizontal) tangent space at x, by each representation's own
    linear constraints (never by ``proj``), relative to ‖u‖."""
    size = frobenius(np.concatenate([np.ravel(p) for p in parts(u)]))
    return per_group(geo, _tangency, x, u) / max(size, np.finfo(float).tiny)


def law_u() -> float:
    return float(np.finfo(float).eps) / 2


def _rounding_scale(a: np.ndarray) -> float:
    """u·κ(a) (inf for a rank-deficient factor): how much a solve with a amplifies rounding."""
    s = np.linalg.svd(a, compute_uv=False)
    return law_u() * s[0] / s[-1] if s[-1] > 0 else np.inf


def _constraints(geo: Any, x: Any) -> float:
    name = base_name(geo)
    if name == "stiefel":
        return orthonormality_residual(x)
    if name == "fixed_rank_embedded":
        return orthonormality_residual(x[0]) + orthonormality_residual(x[2])
    if name == "fixed_rank_quotient":
        return 0.0
    u, v = x  # the partial isometries: orthonormal factors, unit singular values
    sv = np.linalg.svd(u @ v.T, compute_uv=False)[: u.shape[1]]
    return orthonormality_residual(u) + orthonormality_residual(v) + float(np.max(np.abs(sv - 1.0)))


def constraints(geo: Any, x: Any) -> float:
    """Orthonormality residuals and unit singular values of a point (0 for R2)."""
    return per_group(geo, _constraints, x)


def _rank_scale(geo: Any, x: Any) -> float:
    name = base_name(geo)
    if name == "fixed_rank_embedded":
        return _rounding_scale(x[1])
    if name == "fixed_rank_quotient":
        return _rounding_scale(x[0]) ** 2 * _rounding_scale(x[1]) ** 2 / law_u() ** 3
    return 0.0


def rank_scale(geo: Any, x: Any) -> float:
    """The rounding scale of the rank condition: u·κ(S) (R1), u·κ(A)²κ(B)² (R2), inf when the
    rank is lost, 0 where orthonormal factors carry the rank."""
    return max(per_group(geo, _rank_scale, x), 0.0)


# -- conditioning and tolerances ------------------------------------------------------------------
def _conditioning(geo: Any, x: Any) -> float:
    name = base_name(geo)
    if name == "fixed_rank_embedded":
        return float(np.linalg.cond(x[1]) ** 2)
    if name == "fixed_rank_quotient":  # DESIGN §4.2: rounding grows like κ(A)²κ(B)²
        return float(np.linalg.cond(x[0]) ** 2 * np.linalg.cond(x[1]) ** 2)
    return 1.0


def law_tolerance(geo: Any, x: Any) -> float:
    """Bound on the rounding of one law evaluated at these sizes: a law is at most ten products
    of inner dimension k ≤ (largest stacked size) + 2r, each γ_k, doubled for P∘P, times the
    conditioning of the metric's r×r solves (κ(S)² for R1, κ(A)²κ(B)² for R2, 1 otherwise):
    20·γ_k·conditioning."""
    k = max(max(np.shape(p)) for p in parts(x)) + 2 * min(np.shape(p)[-1] for p in parts(x))
    cond = max(per_group(geo, lambda g, xg: _conditioning(g, xg), x), 1.0)
    return 20 * gamma(k) * cond


# -- the projection as an operator -----------------------------------------------------------------
def flat(v: Any) -> np.ndarray:
    return np.concatenate([np.ravel(p) for p in parts(v)])


def unflat(template: Any, vec: np.ndarray) -> Any:
    """The inverse of ``flat`` for vectors shaped like ``template``."""
    ends = np.cumsum([np.size(p) for p in parts(template)])
    chunks = np.split(vec, ends[:-1])
    return like(
        template, [c.reshape(np.shape(p)) for c, p in zip(chunks, parts(template), strict=True)]
    )


def ambient_basis(geo: Any, x: Any) -> list[Any]:
    """Unit vectors of the ambient space: factor space, or R^{m×n} (per group) when embedded."""
    template = geo.to_matrix(x) if geo.embedded else x
    return [unflat(template, e) for e in np.eye(flat(template).size)]


def project(geo: Any, x: Any, z: Any) -> tuple[Any, Any]:
    """(tangent vector, its ambient image) of an ambient z under ``proj``."""
    if geo.embedded:
        u = geo.proj(x, geo.egrad_from_matrix(x, z))
        return u, geo.tangent_to_matrix(x, u)
    u = geo.proj(x, z)
    return u, u


def projection_operator(geo: Any, x: Any, oblique: bool = False):
    """The matrix P of z ↦ proj(x, z) on the ambient basis, the metric's Gram matrix G, and the
    tangent vectors of the columns. ``oblique`` adds P(C⊙(z − Pz)) for a fixed mask C: still
    idempotent, no longer self-adjoint (the negative control of the projector law)."""
    basis = ambient_basis(geo, x)
    mask = np.random.default_rng(7).uniform(0.5, 1.5, flat(basis[0]).size)
    cols, tangents = [], []
    for z in basis:
        u, image = project(geo, x, z)
        if oblique:
            u2, image2 = project(geo, x, unflat(z, mask * (flat(z) - flat(image))))
            u, image = tree_map(np.add, u, u2), tree_map(np.add, image, image2)
        cols.append(flat(image))
        tangents.append(u)
    p = np.array(cols).T
    if geo.embedded:
        gram = np.eye(len(basis))
    else:
        gram = np.array([[geo.inner(x, a, b) for b in basis] for a in basis])
    return p, gram, tangents


def projector_law(geo: Any, x: Any, oblique: bool = False) -> tuple[float, str]:
    """max(‖P² − P‖/‖P‖, ‖GP − PᵀG‖/(‖G‖‖P‖)): P is an orthogonal projector in the metric."""
    p, gram, _ = projection_operator(geo, x, oblique)
    idem = np.linalg.norm(p @ p - p) / np.linalg.norm(p)
    adj = np.linalg.norm(gram @ p - p.T @ gram) / (np.linalg.norm(gram) * np.linalg.norm(p))
    return max(idem, adj), f"idempotence {idem:.1e}, self-adjointness {adj:.1e}"


def range_law(geo: Any, x: Any) -> tuple[float, str]:
    """The range of P is the tangent space: every column is tangent (``tangency``) and
    rank P = dim (a projector's nonzero singular values are ≥ 1, so rank = #σ > ½)."""
    p, _, tangents = projection_operator(geo, x)
    rank = int(np.sum(np.linalg.svd(p, compute_uv=False) > 0.5))
    worst = max(tangency(geo, x, u) for u in tangents if flat(u).any())
    return (
        worst if rank == geo.dim else np.inf
    ), f"rank {rank} (dim {geo.dim}), tangency {worst:.1e}"


# -- Taylor tests ----------------------------------------------------------------------------------
def best_slope(ts: np.ndarray, errs: np.ndarray, floor: float) -> tuple[float | None, str]:
    """Slope of log e against log t on the window of 10 consecutive points, all above the
    rounding floor, whose straight-line fit has the smallest residual (Manopt's rule)."""
    best = None
    for k in range(len(ts) - WINDOW + 1):
        e = errs[k : k + WINDOW]
        if np.any(e <= floor):
            continue
        lt, le = np.log10(ts[k : k + WINDOW]), np.log10(e)
        coef, res, *_ = np.polyfit(lt, le, 1, full=True)
        fit = float(res[0]) if len(res) else 0.0
        if best is None or fit < best[0]:
            best = (fit, float(coef[0]), ts[k], ts[k + WINDOW - 1])
    if best is None:
        return None, "every error at the rounding floor (exact model)"
    return best[1], f"slope {best[1]:.3f} on t ∈ [{best[2]:.0e}, {best[3]:.0e}]"


def smooth_loss(seed: int):
    """F(W) = Σ over matrices of ⟨C, W⟩ + ½‖W‖² + 0.3 Σ cos(2W_ij), with its gradient."""
    rng = np.random.default_rng(seed)
    cache: dict[tuple, np.ndarray] = {}

    def c(shape: tuple) -> np.ndarray:
        return cache.setdefault(shape, rng.standard_normal(shape))

    def f(w: Any) -> float:
        return float(
            sum(
                np.vdot(c(p.shape), p) + 0.5 * np.vdot(p, p) + 0.3 * np.sum(np.cos(2 * p))
                for p in parts(w)
            )
        )

    def grad(w: Any) -> Any:
        return tree_map(lambda p: c(p.shape) + p - 0.6 * np.sin(2 * p), w)

    return f, grad


def gradient_slope(geo: Any, x: Any, seed: int) -> tuple[float | None, str]:
    """e(t) = |f(R_x(tξ)) − f(x) − t·g(grad f, ξ)| for f = F∘to_matrix: slope 2 (or more, along a
    ξ where the second-order term vanishes) when grad f is right, 1 when it is not. Taken along
    three unit tangents, two random and the gradient's own direction, and the smallest slope
    returned: a wrong gradient shows along any ξ not orthogonal to its error, and one random
    ξ can nearly be (seed 121 drew one for P2); its own direction cannot be for a gradient off
    by a factor."""
    f, grad = smooth_loss(seed)
    w = geo.to_matrix(x)
    rg = geo.egrad_to_rgrad(x, geo.egrad_from_matrix(x, grad(w)))
    own = geo.proj_tangent(x, rg)
    norm = geo.norm(x, own)
    directions = [geo.random_tangent(x, np.random.default_rng(seed + k)) for k in (1, 2)]
    if norm > 0:
        directions.append(times(1.0 / norm, own))
    f0 = f(w)
    worst: tuple[float | None, str] = (np.inf, "")
    for xi in directions:
        d0 = geo.inner(x, rg, xi)
        errs = np.array(
            [abs(f(geo.to_matrix(geo.retract(x, times(t, xi)))) - f0 - t * d0) for t in TAYLOR_T]
        )
        slope, detail = best_slope(TAYLOR_T, errs, 1e3 * np.finfo(float).eps * max(1.0, abs(f0)))
        if slope is None or (worst[0] is not None and slope < worst[0]):
            worst = (slope, detail)
        if slope is None:
            break
    return worst[0], f"smallest of {len(directions)} directions: {worst[1]}"


#: The slope rule of the order tests: a claimed order k holds when the order-defining error
#: (``retraction_slopes``) has slope ≥ k + 1 − SLOPE_TOL on its best window (or sits at the
#: rounding floor). The measured slope of an error e(t) = t^{k+1}‖c + t·c' + O(t²)‖ deviates
#: from k + 1 by (i) curvature, the local slope t·⟨c, c'⟩/‖c‖² + O(t²), which the window rule
#: (``best_slope``: the straightest window) keeps at the small-t end, and (ii) rounding: every
#: window lies above the floor 1e3·ε·‖x‖ ≥ 13·``law_tolerance`` (20·γ_13 = 2.9e-14 against
#: 3.8e-13 at St(7, 3)), so each log10 e moves by ≤ log10(1 + 1/13) = 0.032, and the
#: least-squares slope of 10 points spaced 0.16 decades apart by ≤ Σ|w_i|·0.032 =
#: (25/(82.5·0.16))·0.032 = 0.061. A true order k − 1 shows slope k, an order k slope k + 1:
#: 0.1 separates them with room for both; measured, |slope − nearest integer| ≤ 0.0032 over
#: every row of ``tests/test_geometry_laws.py``'s table at seed 0 (both slopes of each).
SLOPE_TOL = 0.1


def expm_skew(s: np.ndarray) -> np.ndarray:
    """expm(S) for a real skew S, as V·diag(e^{−iλ})·Vᴴ from the eigendecomposition of the
    Hermitian iS = V·diag(λ)·Vᴴ (real part taken): another algorithm than the reference's
    ``linalg.expm`` (SciPy's Padé scaling and squaring), accurate to ~n·u·(1 + ‖S‖) since V is
    unitary to rounding."""
    lam, v = np.linalg.eigh(1j * s)
    return ((v * np.exp(-1j * lam)) @ v.conj().T).real


def stiefel_geodesic(metric: str, w: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """γ(1) of the geodesic of St(d, r) with γ(0) = W, γ'(0) = ξ, by formulas other than the
    reference's (``Stiefel.exp``: EAS eq. 2.45; ``Stiefel.canonical_exp``: EAS eq. 2.42 with a
    thin basis), each through a complete basis [W, W⊥] of R^d, A = Wᵀξ, B = W⊥ᵀξ:

    - canonical: expm(X)·W with the d×d skew X = GWᵀ − WGᵀ, G = ξ − ½W(Wᵀξ) (XW = ξ and
      W⊥ᵀXW⊥ = 0: X is horizontal for O(d) → St(d, r) = O(d)/O(d − r), whose bi-invariant
      metric induces the canonical one, so t ↦ expm(tX)W is a geodesic; EAS §2.4.2);
    - embedded: [W, W⊥]·expm([[2A, −Bᵀ], [B, 0]])[:, :r]·expm(−A) (Zimmermann & Hüper 2022,
      the Euclidean member of their family of metrics).

    Every exponential here is of a skew matrix (A is skew for a tangent ξ), taken by
    ``expm_skew``.
    """
    d, r = w.shape
    a = w.T @ xi
    if metric == "canonical":
        g = xi - 0.5 * w @ a
        return expm_skew(g @ w.T - w @ g.T) @ w
    a = skew(a)  # skew up to rounding for a tangent ξ; the formula takes its skew part
    perp = np.linalg.qr(w, mode="complete")[0][:, r:]
    b = perp.T @ xi
    block = np.block([[2 * a, -b.T], [b, np.zeros((d - r, d - r))]])
    return np.hstack([w, perp]) @ expm_skew(block)[:, :r] @ expm_skew(-a)


def metric_geodesic(geo: Any) -> Callable[[Any, Any], Any] | None:
    """(x, u) ↦ γ_x(1) of the geometry's own metric where its order is defined against it and
    its metric is not the one induced by the embedding (St(d, r), either metric:
    ``stiefel_geodesic``); None where the tangential part of R_x(tξ) − x − tξ decides the order
    (a Riemannian submanifold or quotient with the metric of its factor space)."""
    if isinstance(geo, BlockGeometry) or base_name(geo) != "stiefel":
        return None
    return lambda x, u: stiefel_geodesic(geo.metric, x, u)


def retraction_slopes(geo: Any, x: Any, seed: int) -> tuple[float | None, float | None, float, str]:
    """D(t) = R_x(tξ) − x − tξ in the embedding (R^{m×n} when embedded, factor space else):
    ‖D(t)‖ has slope ≥ 2 (first order). The order-defining error has slope k + 1 for a
    retraction of order k: the distance ‖R_x(tξ) − γ(t)‖ to the metric's own geodesic where
    ``metric_geodesic`` gives one (St(d, r): its canonical metric is not induced by the
    embedding), else the tangential part of D(t) (the metric-orthogonal projection; for an
    induced metric the geodesic's acceleration is normal, so the two agree). Taken along three
    random unit tangents, the smallest slope of each kind returned (None where every direction
    sits at the rounding floor: an exact model, or the geodesic itself): a first-order
    retraction's second-order term can nearly vanish along one ξ (seed 168 drew one for the
    block P2). Also returns ‖R_x(0) − x‖."""
    embed = geo.to_matrix if geo.embedded else (lambda p: p)
    geodesic = metric_geodesic(geo)
    x_e = embed(x)
    floor = 1e3 * np.finfo(float).eps * frobenius(flat(x_e))
    worst: list[tuple[float, str] | None] = [None, None]
    for k in (2, 12, 22):
        xi = geo.random_tangent(x, np.random.default_rng(seed + k))
        xi_e = geo.tangent_to_matrix(x, xi) if geo.embedded else xi
        full, second = [], []
        for t in TAYLOR_T:
            y = embed(geo.retract(x, times(t, xi)))
            d = tree_map(lambda a, b, c: a - b - c, y, x_e, times(t, xi_e))
            full.append(frobenius(flat(d)))
            if geodesic is None:
                second.append(frobenius(flat(project(geo, x, d)[1])))
            else:
                second.append(frobenius(flat(y) - flat(geodesic(x, times(t, xi)))))
        for i, errs in enumerate((full, second)):
            slope, detail = best_slope(TAYLOR_T, np.array(errs), floor)
            if slope is not None and (worst[i] is None or slope < worst[i][0]):
                worst[i] = (slope, detail)
    zero = frobenius(flat(tree_map(np.subtract, embed(geo.retract(x, geo.zero_tangent(x))), x_e)))
    (s1, d1), (s2, d2) = (w or (None, "every error at the rounding floor") for w in worst)
    what = "tangential part" if geodesic is None else f"‖R − γ‖ ({geo.metric} geodesic)"
    return s1, s2, zero, f"‖D‖: {d1}; {what}: {d2}; ‖R(0) − x‖ = {zero:.1e}"


def order_shortfall(s2: float | None, order: int) -> float:
    """How far the order-defining slope s2 (``retraction_slopes``) falls short of a claimed
    ``order``: max(0, order + 1 − SLOPE_TOL − s2), 0 when s2 is None (at the floor)."""
    return 0.0 if s2 is None else max(0.0, order + 1 - SLOPE_TOL - s2)


# -- transport, quotients, long runs --------------------------------------------------------------
def transport_law(geo: Any, x: Any, seed: int, identity: bool = False) -> tuple[float, str]:
    """T_{x→y}(u) is tangent at y = R_x(ξ), ‖ξ‖ = 0.3 (``tangency``, relative)."""
    rng = np.random.default_rng(seed + 3)
    u, xi = geo.random_tangent(x, rng), geo.random_tangent(x, rng)
    y = geo.retract(x, times(0.3, xi))
    moved = u if identity else geo.transport(x, y, u)
    res = tangency(geo, y, moved)
    return res, f"tangency of the transported vector {res:.1e}"


def random_group_element(geo: Any, rng: np.random.Generator) -> Any:
    """Per group: a Haar Q ∈ O(r) (partial isometries) or M ∈ GL(r) with κ(M) ≤ e (R2)."""

    def one(g: Any) -> np.ndarray:
        q = ref.linalg.haar_orthogonal(g.r, rng)
        if base_name(g) == "partial_isometry_quotient":
            return q
        return (q * np.exp(rng.uniform(0, 1, g.r))) @ ref.linalg.haar_orthogonal(g.r, rng)

    return tuple(one(f) for f in geo.factors) if isinstance(geo, BlockGeometry) else one(geo)


def quotient_law(geo: Any, x: Any, seed: int) -> tuple[float, str]:
    """For x' = x·M: |f(x') − f(x)|/|f| (loss constant on the fibre), g(grad f, vertical)
    relative (horizontal gradient), and |g_{x'}(ξM, ηM) − g_x(ξ, η)|/(‖ξ‖‖η‖) (invariant
    metric), for random factor vectors ξ, η."""
    rng = np.random.default_rng(seed + 4)
    f, grad = smooth_loss(seed)
    g = random_group_element(geo, rng)
    moved = geo.act(x, g)
    fibre = abs(f(geo.to_matrix(moved)) - f(geo.to_matrix(x))) / max(1.0, abs(f(geo.to_matrix(x))))
    rg = geo.egrad_to_rgrad(x, geo.egrad_from_matrix(x, grad(geo.to_matrix(x))))
    horizontal = tangency(geo, x, rg)
    xi = tree_map(lambda p: rng.standard_normal(p.shape), x)
    eta = tree_map(lambda p: rng.standard_normal(p.shape), x)
    before = geo.inner(x, xi, eta)
    after = geo.inner(moved, geo.act(xi, g), geo.act(eta, g))
    metric = abs(after - before) / (geo.norm(x, xi) * geo.norm(x, eta))
    return max(fibre, horizontal, metric), (
        f"fibre {fibre:.1e}, horizontal gradient {horizontal:.1e}, metric invariance {metric:.1e}"
    )


def long_run(geo: Any, x: Any, seed: int, steps: int) -> tuple[float, float, str]:
    """``steps`` steps of riemannian_adam (lr 1e-2, Δ = 0.1) on Gaussian factor gradients; the
    constraint residual and the rank scale of the last point (inf, inf if a step refused it)."""
    rng = np.random.default_rng(seed + 5)
    opt = ref.optim.riemannian_adam(lr=1e-2, trust_radius=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = opt.init(geo, x)
        for k in range(steps):
            g = tree_map(lambda p: rng.standard_normal(p.shape), x)
            try:
                x, state = opt.step(geo, x, g, state)
            except ValueError as exc:  # the optimizer refused the point: a measured violation
                return np.inf, np.inf, f"step {k} refused the point: {exc}"
    res, scale = constraints(geo, x), rank_scale(geo, x)
    return res, scale, f"after {steps} steps: constraint residual {res:.1e}, rank scale {scale:.1e}"
