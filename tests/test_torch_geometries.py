"""The ten geometries of the torch port and their optimizer groups, against reference/.

Agreement bound in float64 (as ``tests/test_torch_port.py``). One step of either side rounds
O((m+n)r²) products, a few r×r or 2r×2r factorisations (QR, SVD, an inverse square root by
eigendecomposition on the reference side and by a polynomial or Newton–Schulz iteration here)
and a handful of per-frame scalars, in different orders, so the two sides may differ by a few
hundred units of roundoff per step (≤ 1e-14 at these sizes); along these smooth, contracting
runs differences add rather than multiply, so 100 steps × 1e-14 = 1e-12 is asserted for the
represented matrices W of every point and, where the factors are defined by the point (not for
the quotients R2 and P2, whose factors are defined up to the group), for the factors too; R1's
factors come out of an SVD whose column signs are LAPACK's choice, so they are compared after
aligning those signs. Measured: ≤ 2e-14 for every geometry × rule (docs/torch_port.md).

Points are batched: one batch of 2×3 points runs through the port as ONE point of each
parameter group, and each element through the reference alone.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402
import torch_port as tp  # noqa: E402
from reference import optim as ro  # noqa: E402
from torch_port import linalg as tl  # noqa: E402
from torch_port.geometries import GEOMETRIES  # noqa: E402

M, N, R = 6, 5, 2
BATCH = (2, 3)
STEPS = 100
TOL_F64 = 1e-12  # 100 steps × 1e-14 per step (module docstring)
NAMES = list(ref.GEOMETRIES)
QUOTIENTS = {name for name in NAMES if name.endswith("_quotient")}
LR = 1e-2


def _rules():
    return {
        "adam_frame": (
            lambda: ro.riemannian_adam(lr=LR, trust_radius=0.05),
            lambda ps: tp.RiemannianAdam(ps, lr=LR, trust_radius=0.05),
        ),
        "adam_elementwise": (
            lambda: ro.riemannian_adam(lr=LR, moment="elementwise"),
            lambda ps: tp.RiemannianAdam(ps, lr=LR, moment="elementwise"),
        ),
        "momentum": (
            lambda: ro.riemannian_momentum(lr=LR, beta=0.9, c=1.0),
            lambda ps: tp.RiemannianMomentum(ps, lr=LR, beta=0.9, c=1.0),
        ),
        "rsgd": (lambda: ro.rsgd(lr=0.1), lambda ps: tp.RSGD(ps, lr=0.1)),
        "normalized_rsgd": (
            lambda: ro.normalized_rsgd(lr=2e-3),
            lambda ps: tp.NormalizedRSGD(ps, lr=2e-3),
        ),
    }


RULES = _rules()


def _options(name, **block):
    if not name.startswith("block_"):
        return {}
    return {"n_heads": 2, "n_kv_heads": 1} | block


def _elements(batch=BATCH):
    return list(np.ndindex(*batch))


# -- layouts: reference points <-> one batched torch point --------------------------------------
def _to_port(tg, points, batch=BATCH):
    """The parameters (per-head layout for a block variant) of the batch of reference points."""
    if hasattr(tg, "base"):  # a block point is a tuple over groups of base points
        parts = [
            torch.stack([torch.stack([torch.from_numpy(xg[k]) for xg in x]) for x in points])
            for k in range(len(points[0][0]))
        ]
        stacked = tuple(p.reshape(*batch, *p.shape[1:]) for p in parts)
        return [torch.nn.Parameter(t.clone()) for t in tg.to_heads(stacked)]
    return [
        torch.nn.Parameter(
            torch.stack([torch.from_numpy(x[k]) for x in points]).reshape(
                *batch, *np.shape(points[0][k])
            )
        )
        for k in range(len(points[0]))
    ]


def _port_point(tg, params):
    """The torch point (stacked group layout for a block variant), detached."""
    x = tuple(p.detach() for p in params)
    return tg.from_heads(x) if hasattr(tg, "base") else x


def _element(tg, x, e):
    """Element e of a batched torch point, as the reference's structure (numpy)."""
    if hasattr(tg, "base"):
        return tuple(tuple(t[(*e, c)].numpy() for t in x) for c in range(tg.n_groups))
    return tuple(t[e].numpy() for t in x)


def _matrix(rg, x):
    w = rg.to_matrix(x)
    return np.stack(w) if isinstance(w, tuple) else w


def _align_r1(xp, xr):
    """R1 factors (U, S, V) of the port with the column signs of the reference's."""
    d = np.sign(np.diag(xp[0].T @ xr[0]))
    d[d == 0] = 1.0
    return xp[0] * d, d[:, None] * xp[1] * d[None, :], xp[2] * d


def _deviation(name, rg, tg, x_port, e, x_ref):
    """(max |W_port − W_ref|, max |factor difference| or None for quotients)."""
    xe = _element(tg, x_port, e)
    w = float(np.max(np.abs(_matrix(rg, xe) - _matrix(rg, x_ref))))
    if name.removeprefix("block_") in QUOTIENTS:
        return w, None
    pairs = list(zip(xe, x_ref, strict=True)) if hasattr(tg, "base") else [(xe, x_ref)]
    worst = 0.0
    for a, b in pairs:
        if name.endswith("fixed_rank_embedded"):
            a = _align_r1(a, b)
        worst = max(worst, max(float(np.max(np.abs(p - q))) for p, q in zip(a, b, strict=True)))
    return w, worst


# -- the seeded problem: F = Σ_{(i,j) ∈ E} ½‖A_i B_jᵀ − T_ij‖² (plain: ½‖A Bᵀ − T‖²) ------------
class SmoothProblem:
    def __init__(self, name, seed=0, batch=BATCH, dtype=torch.float64, options=None, **block):
        self.name, self.batch = name, batch
        rng = np.random.default_rng(seed)
        self.options = dict(options or {})
        opts = _options(name, **block) | self.options
        self.rg = ref.GEOMETRIES[name](M, N, R, **opts)
        self.tg = GEOMETRIES[name](M, N, R, **opts)
        self.block = name.startswith("block_")
        self.x0 = [self.rg.random_point(rng) for _ in _elements(batch)]
        shape = (self.rg.p, self.rg.q, M, N) if self.block else (M, N)
        self.targets = rng.standard_normal((*batch, *shape))
        self.group_options = dict(self.options)
        if self.block:
            self.group_options |= {
                k: opts[k] for k in ("n_heads", "n_kv_heads", "groups") if k in opts
            }
        self.dtype = dtype

    def ref_egrad(self, x, e):
        rg, t = self.rg, self.targets[e]
        if not self.block:
            return rg.egrad_from_matrix(x, rg.to_matrix(x) - t)
        a, b = rg.head_factors(x)
        ga = [np.zeros_like(a_i) for a_i in a]
        gb = [np.zeros_like(b_j) for b_j in b]
        for i, j in rg.pattern:
            g = a[i] @ b[j].T - t[i, j]
            ga[i] += g @ b[j]
            gb[j] += g.T @ a[i]
        return rg.egrad_from_heads(x, ga, gb)

    def run_reference(self, make, steps=STEPS):
        finals, states = [], []
        for e, x in zip(_elements(self.batch), self.x0, strict=True):
            opt = make()
            state = opt.init(self.rg, x)
            for _ in range(steps):
                x, state = opt.step(self.rg, x, self.ref_egrad(x, e), state)
            finals.append(x)
            states.append(state)
        return finals, states

    def params(self):
        return [
            torch.nn.Parameter(p.detach().to(self.dtype))
            for p in _to_port(self.tg, self.x0, self.batch)
        ]

    def group(self, params, **extra):
        return {"params": params, "geometry": self.name} | self.group_options | extra

    def loss(self, params):
        t = torch.from_numpy(self.targets).to(self.dtype)
        if not self.block:
            w = self.tg.to_matrix(tuple(params))
            return 0.5 * ((w - t) ** 2).sum()
        a, b = self.tg.head_factors(self.tg.from_heads(tuple(params)))
        total = 0.0
        for i, j in self.rg.pattern:
            blk = a[..., i, :, :] @ b[..., j, :, :].transpose(-1, -2) - t[..., i, j, :, :]
            total = total + 0.5 * (blk**2).sum()
        return total

    def run_port(self, make, steps=STEPS, params=None, **extra):
        params = self.params() if params is None else params
        opt = make([self.group(params, **extra)])
        for _ in range(steps):
            opt.zero_grad()
            self.loss(params).backward()
            opt.step()
        return params, opt


def _first_moment(state):
    first = state[0]
    if isinstance(first, ro.AdamState):
        return first.m, first.sqrt_v
    if isinstance(first, ro.TraceState):
        return first.m, None
    return None, None


# -- registry and geometry methods --------------------------------------------------------------
def test_registry_has_the_ten_names_and_stiefel():
    assert set(GEOMETRIES) == set(ref.GEOMETRIES) | {"stiefel"}
    for name in NAMES:
        tg = GEOMETRIES[name](M, N, R, **_options(name))
        rg = ref.GEOMETRIES[name](M, N, R, **_options(name))
        assert tg.name == rg.name == name
        assert tg.dim == rg.dim
        assert tg.embedded == rg.embedded and tg.quotient == rg.quotient
        assert tg.retraction_order == rg.retraction_order
    assert tp.optim.GEOMETRIES is GEOMETRIES


def _stack_ref(tg, items):
    """A batch of reference points/tangents (list over elements) as one torch tuple."""
    if hasattr(tg, "base"):
        return tuple(
            torch.stack(
                [torch.stack([torch.from_numpy(np.asarray(xg[k])) for xg in x]) for x in items]
            ).reshape(*BATCH, len(items[0]), *np.shape(items[0][0][k]))
            for k in range(len(items[0][0]))
        )
    return tuple(
        torch.stack([torch.from_numpy(np.asarray(x[k])) for x in items]).reshape(
            *BATCH, *np.shape(items[0][k])
        )
        for k in range(len(items[0]))
    )


def _elem(tg, t, e):
    if hasattr(tg, "base"):
        return tuple(tuple(p[(*e, c)].numpy() for p in t) for c in range(tg.n_groups))
    return tuple(p[e].numpy() for p in t)


def _max_diff(a, b):
    if isinstance(a, tuple):
        return max(_max_diff(p, q) for p, q in zip(a, b, strict=True))
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.parametrize("name", NAMES)
def test_geometry_methods_match_reference_per_element(name):
    rng = np.random.default_rng(1)
    rg = ref.GEOMETRIES[name](M, N, R, **_options(name))
    tg = GEOMETRIES[name](M, N, R, **_options(name))
    elems = _elements()
    xs = [rg.random_point(rng) for _ in elems]
    zs = [ref.geometry.tree_map(lambda p: rng.standard_normal(np.shape(p)), x) for x in xs]
    us = [rg.proj(x, z) for x, z in zip(xs, zs, strict=True)]
    xis = [
        ref.geometry.tree_map(lambda p, x=x, u=u: 0.3 * p / rg.norm(x, u), u)
        for x, u in zip(xs, us, strict=True)
    ]
    ys = [rg.retract(x, xi) for x, xi in zip(xs, xis, strict=True)]
    xt, zt, xit, yt = (_stack_ref(tg, v) for v in (xs, zs, xis, ys))
    ut = tg.proj(xt, zt)
    gt = tg.egrad_to_rgrad(xt, zt)
    y_port = tg.retract(xt, xit)
    tt = tg.transport(xt, yt, ut)
    pt = tg.proj_tangent(xt, tuple(2.0 * p for p in ut))
    norms, inners, frames = tg.norm(xt, ut), tg.inner(xt, ut, gt), tg.frame_norms(xt, gt)
    for k, e in enumerate(elems):
        x, u = xs[k], us[k]
        g = rg.egrad_to_rgrad(x, zs[k])
        assert _max_diff(_elem(tg, ut, e), u) <= 1e-13
        assert _max_diff(_elem(tg, gt, e), g) <= 1e-13
        assert _max_diff(_matrix(rg, _elem(tg, y_port, e)), _matrix(rg, ys[k])) <= 1e-13
        assert _max_diff(_elem(tg, tt, e), rg.transport(x, ys[k], u)) <= 1e-13
        two_u = ref.geometry.tree_map(lambda p: 2.0 * p, u)
        assert _max_diff(_elem(tg, pt, e), rg.proj_tangent(x, two_u)) <= 1e-13
        n_ref = ro._frame_norms(rg, x, g)
        assert np.allclose(np.ravel(frames[e].numpy()), n_ref, rtol=1e-13, atol=0)
        if not hasattr(tg, "base"):
            assert abs(float(norms[e]) - rg.norm(x, u)) <= 1e-13 * max(1.0, rg.norm(x, u))
            assert abs(float(inners[e]) - rg.inner(x, u, g)) <= 1e-12
    tg.check_point(y_port)


# -- float64 trajectories: every geometry × rule, a batch of 2×3 points ------------------------
@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", NAMES)
def test_float64_trajectory_agrees_with_reference_per_element(name, rule):
    problem = SmoothProblem(name)
    make_ref, make_port = RULES[rule]
    finals, states = problem.run_reference(make_ref)
    params, opt = problem.run_port(make_port)
    x_port = _port_point(problem.tg, params)
    state = opt.state[params[0]]
    for k, e in enumerate(_elements()):
        w, f = _deviation(name, problem.rg, problem.tg, x_port, e, finals[k])
        assert w <= TOL_F64, (name, rule, e, w)
        assert f is None or f <= TOL_F64, (name, rule, e, f)
        m_ref, sv_ref = _first_moment(states[k])
        if m_ref is not None and not name.endswith("fixed_rank_embedded"):
            key = "exp_avg" if rule.startswith("adam") else "momentum_buffer"
            m_port = _elem(problem.tg, state[key], e)
            if name.removeprefix("block_") not in QUOTIENTS:
                scale = max(
                    1.0,
                    float(
                        np.max(
                            np.abs(np.concatenate([np.ravel(p) for p in ref.geometry.parts(m_ref)]))
                        )
                    ),
                )
                assert _max_diff(m_port, m_ref) <= TOL_F64 * scale, (name, rule)
        if sv_ref is not None and rule == "adam_frame":
            sv_port = np.ravel(state["sqrt_v"][e].numpy())
            assert np.allclose(sv_port, np.asarray(sv_ref), rtol=1e-12, atol=0), (name, rule)
    assert int(state["step"]) == STEPS
    for p in params[1:]:
        assert len(opt.state[p]) == 0  # the point's state lives with its first factor


OPTIONS = [
    ("fixed_rank_quotient", {"metric": "balanced"}),
    ("block_fixed_rank_quotient", {"metric": "balanced"}),
    ("fixed_rank_embedded", {"retraction": "qr"}),
    ("partial_isometry_embedded", {"retraction": "qr"}),
    ("partial_isometry_quotient", {"retraction": "polar_svd"}),
    ("stiefel_pair", {"retraction": "exp"}),
    ("stiefel_pair", {"retraction": "qr"}),
]


@pytest.mark.parametrize("rule", ["adam_frame", "momentum"])
@pytest.mark.parametrize(("name", "options"), OPTIONS)
def test_metrics_and_retractions_agree_with_reference(name, options, rule):
    problem = SmoothProblem(name, seed=6, options=options)
    make_ref, make_port = RULES[rule]
    finals, _ = problem.run_reference(make_ref, steps=50)
    params, _ = problem.run_port(make_port, steps=50)
    x_port = _port_point(problem.tg, params)
    for k, e in enumerate(_elements()):
        w, f = _deviation(name, problem.rg, problem.tg, x_port, e, finals[k])
        assert w <= TOL_F64 and (f is None or f <= TOL_F64), (name, options, rule, w, f)


@pytest.mark.parametrize("name", NAMES)
def test_random_gradients_of_every_scale_agree_per_element(name):
    """A fixed sequence of random factor gradients whose scale differs element by element
    (1e-3 … 1e3), with one zero gradient: per-frame scalars are per element."""
    rng = np.random.default_rng(3)
    opts = _options(name, n_heads=4, n_kv_heads=2)
    rg = ref.GEOMETRIES[name](M, N, R, **opts)
    tg = GEOMETRIES[name](M, N, R, **opts)
    elems = _elements()
    xs = [rg.random_point(rng) for _ in elems]
    scales = np.logspace(-3, 3, len(elems))
    steps = 40
    grads = [
        [
            ref.geometry.tree_map(lambda p, s=s: s * rng.standard_normal(np.shape(p)), x)
            for x, s in zip(xs, scales, strict=True)
        ]
        for _ in range(steps)
    ]
    grads[4][2] = ref.geometry.tree_map(np.zeros_like, grads[4][2])
    params = _to_port(tg, xs)
    group = {"params": params, "geometry": name} | (
        {"n_heads": 4, "n_kv_heads": 2} if name.startswith("block_") else {}
    )
    opt = tp.RiemannianAdam([group], lr=LR, trust_radius=0.05)
    for gs in grads:
        g = _stack_ref(tg, gs)
        g = tg.to_heads(g) if hasattr(tg, "base") else g
        for p, gp in zip(params, g, strict=True):
            p.grad = gp.clone()
        opt.step()
    x_port = _port_point(tg, params)
    for k, e in enumerate(elems):
        o = ro.riemannian_adam(lr=LR, trust_radius=0.05)
        x, state = xs[k], o.init(rg, xs[k])
        for gs in grads:
            x, state = o.step(rg, x, gs[k], state)
        w, f = _deviation(name, rg, tg, x_port, e, x)
        assert w <= TOL_F64 and (f is None or f <= TOL_F64), (name, e, w, f)


@pytest.mark.parametrize("groups", ["components", "all"])
@pytest.mark.parametrize("name", ["block_stiefel_pair", "block_fixed_rank_embedded"])
def test_gqa_blocks_agree_with_reference(name, groups):
    """4 query heads sharing 2 key factors (GQA), grouped by components or all together."""
    problem = SmoothProblem(name, seed=5, n_heads=4, n_kv_heads=2, groups=groups)
    make_ref, make_port = RULES["adam_frame"]
    finals, _ = problem.run_reference(make_ref, steps=30)
    params, opt = problem.run_port(make_port, steps=30)
    x_port = _port_point(problem.tg, params)
    for k, e in enumerate(_elements()):
        w, f = _deviation(name, problem.rg, problem.tg, x_port, e, finals[k])
        assert w <= TOL_F64 and f <= TOL_F64
    g = 2 if groups == "components" else 1
    pair = (2,) if name == "block_stiefel_pair" else ()
    assert opt.state[params[0]]["sqrt_v"].shape == (*BATCH, g, *pair)
    if name == "block_stiefel_pair":  # the stacked queries of a group are jointly orthonormal
        u = _port_point(problem.tg, params)[0]
        assert float(tl.orthonormality_residual(u).max()) < 1e-14


@pytest.mark.parametrize("name", ["stiefel_pair", "fixed_rank_embedded", "fixed_rank_quotient"])
def test_block_variant_under_mha_equals_the_plain_geometry(name):
    """Under MHA the default groups are single heads: the block variant's trajectory is the plain
    geometry's, head by head (the per-head layout is the plain batch layout)."""
    block = SmoothProblem("block_" + name, seed=2, batch=(2,), n_heads=3, n_kv_heads=3)
    params_b, _ = block.run_port(RULES["adam_frame"][1], steps=20)
    plain = GEOMETRIES[name](M, N, R)
    x0 = tuple(p.detach().clone() for p in block.params())  # heads (2, 3, ...) = plain batch
    params_p = [torch.nn.Parameter(t) for t in x0]
    opt = tp.RiemannianAdam([{"params": params_p, "geometry": name}], lr=LR, trust_radius=0.05)
    t = torch.from_numpy(block.targets)
    idx = torch.arange(3)
    for _ in range(20):
        opt.zero_grad()
        w = plain.to_matrix(tuple(params_p))
        (0.5 * ((w - t[:, idx, idx]) ** 2).sum()).backward()
        opt.step()
    for a, b in zip(params_b, params_p, strict=True):
        assert float((a - b).detach().abs().max()) <= 1e-14


# -- float32 --------------------------------------------------------------------------------------
#: ‖FᵀF − I‖ of orthonormal factors after 100 float32 RiemannianAdam steps (measured ≤ 2e-7).
TOL_F32_ORTHONORMAL = 2e-6
ORTHONORMAL_PARTS = {
    "fixed_rank_embedded": (0, 2),
    "partial_isometry_embedded": (0, 1),
    "partial_isometry_quotient": (0, 1),
    "stiefel_pair": (0, 1),
    "fixed_rank_quotient": (),
}


@pytest.mark.parametrize("name", NAMES)
def test_float32_keeps_the_constraints(name):
    problem = SmoothProblem(name, seed=4, dtype=torch.float32)
    params, opt = problem.run_port(RULES["adam_frame"][1], steps=100)
    assert all(p.dtype == torch.float32 for p in params)
    state = opt.state[params[0]]
    assert state["sqrt_v"].dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in state["exp_avg"])
    x = _port_point(problem.tg, params)
    assert all(bool(torch.isfinite(t).all()) for t in x)
    for k in ORTHONORMAL_PARTS[name.removeprefix("block_")]:
        assert float(tl.orthonormality_residual(x[k]).max()) <= TOL_F32_ORTHONORMAL, name
    problem.tg.check_point(x)
    # and it follows the float64 run to float32 accuracy
    ref64 = SmoothProblem(name, seed=4)
    params64, _ = ref64.run_port(RULES["adam_frame"][1], steps=100)
    w32 = problem.tg.to_matrix(x).double()
    w64 = ref64.tg.to_matrix(_port_point(ref64.tg, params64))
    assert float((w32 - w64).abs().max()) <= 1e-4


# -- optimizer contract -------------------------------------------------------------------------
def test_state_layout():
    cases = {
        "fixed_rank_embedded": ((*BATCH,), [(*BATCH, R, R), (*BATCH, M, R), (*BATCH, N, R)]),
        "partial_isometry_embedded": ((*BATCH,), [(*BATCH, R, R), (*BATCH, M, R), (*BATCH, N, R)]),
        "stiefel_pair": ((*BATCH, 2), [(*BATCH, M, R), (*BATCH, N, R)]),
        "block_fixed_rank_quotient": ((*BATCH, 1), [(*BATCH, 1, 2 * M, R), (*BATCH, 1, N, R)]),
        "block_stiefel_pair": ((*BATCH, 1, 2), [(*BATCH, 1, 2 * M, R), (*BATCH, 1, N, R)]),
    }
    for name, (sv_shape, m_shapes) in cases.items():
        problem = SmoothProblem(name)
        params, opt = problem.run_port(RULES["adam_frame"][1], steps=2)
        state = opt.state[params[0]]
        assert set(state) == {"step", "exp_avg", "sqrt_v"}
        assert state["sqrt_v"].shape == sv_shape, name
        assert [tuple(t.shape) for t in state["exp_avg"]] == m_shapes, name
        p2, o2 = problem.run_port(RULES["adam_elementwise"][1], steps=1)
        assert [tuple(t.shape) for t in o2.state[p2[0]]["sqrt_v"]] == m_shapes


def test_moments_are_transported_at_every_step():
    problem = SmoothProblem("fixed_rank_embedded")
    params, opt = problem.run_port(RULES["adam_frame"][1], steps=5)
    u, _, v = _port_point(problem.tg, params)
    _, u_p, v_p = opt.state[params[0]]["exp_avg"]
    assert float((u.transpose(-1, -2) @ u_p).abs().max()) <= 1e-14
    assert float((v.transpose(-1, -2) @ v_p).abs().max()) <= 1e-14
    problem = SmoothProblem("partial_isometry_quotient")
    params, opt = problem.run_port(RULES["momentum"][1], steps=5)
    x = _port_point(problem.tg, params)
    res = problem.tg.horizontal_residual(x, opt.state[params[0]]["momentum_buffer"])
    assert float(res.max()) <= 1e-14


def _snapshot(opt, params):
    buf = io.BytesIO()
    torch.save({"params": [p.detach() for p in params], "opt": opt.state_dict()}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("name", ["fixed_rank_embedded", "block_stiefel_pair"])
@pytest.mark.parametrize("rule", ["adam_frame", "adam_elementwise", "momentum"])
def test_resume_equals_continue_bitwise(name, rule):
    make = RULES[rule][1]
    problem = SmoothProblem(name, n_heads=4, n_kv_heads=2)
    full, _ = problem.run_port(make, steps=12)
    params, opt = problem.run_port(make, steps=6)
    saved = _snapshot(opt, params)
    resumed = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt2 = make([problem.group(resumed)])
    opt2.load_state_dict(saved["opt"])
    for _ in range(6):
        opt2.zero_grad()
        problem.loss(resumed).backward()
        opt2.step()
    for a, b in zip(full, resumed, strict=True):
        assert torch.equal(a, b)


def test_weight_decay_is_coupled_on_fixed_rank_and_refused_on_frames():
    # R2: the reference's decay="coupled" (λ·x added to the factor gradient).
    problem = SmoothProblem("fixed_rank_quotient")
    finals, _ = problem.run_reference(lambda: ro.riemannian_adam(lr=LR, weight_decay=0.5), steps=30)
    params, _ = problem.run_port(
        lambda ps: tp.RiemannianAdam(ps, lr=LR, weight_decay=0.5), steps=30
    )
    x = _port_point(problem.tg, params)
    for k, e in enumerate(_elements()):
        w, _ = _deviation("fixed_rank_quotient", problem.rg, problem.tg, x, e, finals[k])
        assert w <= TOL_F64
    # P1: frames, decay warns and is not applied.
    problem = SmoothProblem("partial_isometry_embedded")
    plain, _ = problem.run_port(lambda ps: tp.RiemannianAdam(ps, lr=LR), steps=10)
    with pytest.warns(tp.FrameDecayWarning, match="RA-5"):
        decayed, _ = problem.run_port(
            lambda ps: tp.RiemannianAdam(ps, lr=LR, weight_decay=0.3), steps=10
        )
    for a, b in zip(plain, decayed, strict=True):
        assert torch.equal(a, b)


def test_a_factor_without_gradient_counts_as_zero():
    problem = SmoothProblem("fixed_rank_embedded")
    a, b = problem.params(), problem.params()
    oa, ob = tp.RSGD([problem.group(a)], lr=0.1), tp.RSGD([problem.group(b)], lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        gu, gv = (torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in (a[0], a[2]))
        a[0].grad, a[1].grad, a[2].grad = gu, None, gv
        b[0].grad, b[1].grad, b[2].grad = gu.clone(), torch.zeros_like(b[1]), gv.clone()
        oa.step()
        ob.step()
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p, q)


def test_bad_groups_and_inputs_are_refused_before_any_change():
    problem = SmoothProblem("fixed_rank_embedded")
    u, s, v = problem.params()
    with pytest.raises(ValueError, match=r"factors of one point.*3 parameters"):
        tp.RiemannianAdam([{"params": [u, v], "geometry": "fixed_rank_embedded"}])
    with pytest.raises(ValueError, match="m=7 given"):
        tp.RiemannianAdam([{"params": [u, s, v], "geometry": "fixed_rank_embedded", "m": 7}])
    thin, short = (torch.nn.Parameter(t.detach().clone()) for t in (s[..., :1], s[:1]))
    with pytest.raises(ValueError, match="trailing shapes"):
        tp.RiemannianAdam([{"params": [u, thin, v], "geometry": "fixed_rank_embedded"}])
    with pytest.raises(ValueError, match="batch shapes differ"):
        tp.RiemannianAdam([{"params": [u, short, v], "geometry": "fixed_rank_embedded"}])
    with pytest.raises(ValueError, match="retraction"):
        tp.RiemannianAdam(
            [{"params": [u, s, v], "geometry": "fixed_rank_embedded", "retraction": "polar"}]
        )
    with pytest.raises(ValueError, match="equal size"):
        GEOMETRIES["block_stiefel_pair"](M, N, R, pattern=[(0, 0), (1, 0), (2, 1)])
    # a non-finite gradient names the parameter; nothing changes
    opt = tp.RiemannianAdam([problem.group([u, s, v])], lr=LR)
    before = [p.detach().clone() for p in (u, s, v)]
    u.grad, s.grad, v.grad = torch.zeros_like(u), torch.zeros_like(s), torch.zeros_like(v)
    s.grad[1, 2, 0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"params'\]\[1\].*1 non-finite"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip((u, s, v), before, strict=True))
    assert len(opt.state) == 0
    # a point off the manifold is refused at its first step, with the measured residual
    with torch.no_grad():
        u[0, 1] *= 1.1
    s.grad = torch.zeros_like(s)
    with pytest.raises(ValueError, match=r"factor U is not orthonormal: ‖UᵀU − I‖ = 2\.\d+e-01"):
        opt.step()
    # a step that leaves the rank-r manifold raises and changes nothing: with (G_U, G_S, G_V) =
    # (0, S, 0) the Riemannian gradient is (M, U_p, V_p) = (S, 0, 0), and RSGD with lr 1 asks
    # for S + M = 0.
    problem = SmoothProblem("fixed_rank_embedded")
    u, s, v = problem.params()
    opt = tp.RSGD([problem.group([u, s, v])], lr=1.0)
    u.grad, s.grad, v.grad = torch.zeros_like(u), s.detach().clone(), torch.zeros_like(v)
    before = [p.detach().clone() for p in (u, s, v)]
    with pytest.raises(ValueError, match=r"leaves the rank-2 manifold.*no parameter or state"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip((u, s, v), before, strict=True))
    assert len(opt.state) == 0


# -- linear algebra ------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1e-6, 1e-3, 3e-2, 0.3, 2.0])
def test_polar_routes_agree_with_the_reference(size):
    """linalg.polar takes a polynomial, Newton–Schulz or eigh route by the Gram's distance from
    I; every route agrees with reference.linalg.polar (eigh of the formed Gram)."""
    rng = np.random.default_rng(7)
    w = np.stack([ref.Stiefel(20, 5).random_point(rng) for _ in range(4)])
    a = w + size * rng.standard_normal(w.shape)
    got = tl.polar(torch.from_numpy(a)).numpy()
    want = np.stack([ref.linalg.polar(x) for x in a])
    assert np.max(np.abs(got - want)) <= 1e-13
    assert float(tl.orthonormality_residual(torch.from_numpy(got)).max()) <= 1e-14
    got32 = tl.polar(torch.from_numpy(a).float())
    assert got32.dtype == torch.float32
    assert float(tl.orthonormality_residual(got32).max()) <= 2e-6
    # scale: polar(cA) = polar(A) over the float64 range, by the scaled fallback
    for c in (1e-160, 1e160):
        assert np.max(np.abs(tl.polar(torch.from_numpy(c * a)).numpy() - want)) <= 1e-13


def test_norm_of_parts_is_scaled_where_it_must_be():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)
    b = torch.randn(3, 2, 2, generator=gen, dtype=torch.float64)
    want = np.array(
        [ref.linalg.frobenius(np.concatenate([a[i].ravel(), b[i].ravel()])) for i in range(3)]
    )
    for c in (1.0, 1e-170, 1e170, 1e300):
        got = tl.norm_of_parts([c * a, c * b]).numpy()
        assert np.allclose(got, c * want, rtol=1e-14, atol=0), c
    z = tl.norm_of_parts([torch.zeros(2, 3, 3, dtype=torch.float64)])
    assert torch.equal(z, torch.zeros(2, dtype=torch.float64))
    bad = a.clone()
    bad[1, 0, 0] = float("inf")
    assert torch.isinf(tl.norm_of_parts([bad])[1])
    assert torch.isfinite(tl.norm_of_parts([bad])[[0, 2]]).all()


def test_no_warnings_from_a_plain_run():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SmoothProblem("block_partial_isometry_quotient").run_port(RULES["momentum"][1], steps=3)
