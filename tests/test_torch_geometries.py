"""The ten geometries of the torch port and their optimizer groups, against reference/.

The trajectories of every geometry, rule, option and dtype against the reference are the rows of
``port_compare.RECORDS`` (``tests/test_port_agreement.py``); here: the geometry methods element by
element, per-element scalars under gradients of every scale (with the optimizer state), the
block variants under MHA, float32, and the optimizer's contract (state layout, transport,
resume, decay, bad input).

Agreement bound in float64 (as ``tests/test_torch_port.py``). One step of either side rounds
O((m+n)r²) products, a few r×r or 2r×2r factorisations (QR, SVD, an inverse square root by
eigendecomposition on the reference side and by a polynomial here)
and a handful of per-frame scalars, in different orders, so the two sides may differ by a few
hundred units of roundoff per step (≤ 1e-14 at these sizes); along these smooth, contracting
runs differences add rather than multiply, so 40 steps × 1e-14 ≤ 1e-12 is asserted for what
``port_compare`` compares (the factors, or W = A Bᵀ for R1 and the quotients).

Points are batched: one batch of 2×3 points runs through the port as ONE point of each
parameter group, and each element through the reference alone.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from conftest import reference_moments

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402
import torch_port as tp  # noqa: E402
from proofs_checks import port_compare as cmp  # noqa: E402
from proofs_checks.port_compare.geometries import point_adapter  # noqa: E402
from reference import optim as ro  # noqa: E402
from reference import optim_transforms  # noqa: E402
from torch_port import linalg as tl  # noqa: E402
from torch_port.geometries import GEOMETRIES  # noqa: E402
from torch_port.geometry import Ambient, Geometry, PointGeometry  # noqa: E402
from torch_port.stiefel import StiefelFrames  # noqa: E402

M, N, R = 6, 5, 2
BATCH = (2, 3)
STEPS = 100
TOL_F64 = 1e-12  # 100 steps × 1e-14 per step (module docstring)
NAMES = list(ref.GEOMETRIES)
LR = 1e-2


def _options(name, **block):
    if not name.startswith("block_"):
        return {}
    return {"n_heads": 2, "n_kv_heads": 1} | block


def _elements(batch=BATCH):
    return list(np.ndindex(*batch))


#: The port's optimizers of the rules these tests use (``port_compare.RULES``).
PORT = {
    "adam_frame": cmp.RULES["riemannian_adam_capped"].port,
    "adam_elementwise": cmp.RULES["riemannian_adam_elementwise"].port,
    "momentum": cmp.RULES["riemannian_momentum"].port,
}


class SmoothProblem:
    """``port_compare``'s matrix_fit problem of one geometry (a batch of 2×3 points), for the
    port-side tests: parameters, the group, the torch loss, runs of either side."""

    def __init__(self, name, seed=0, dtype=torch.float64, options=None, **block):
        self.name, self.dtype = name, dtype
        block = block if name.startswith("block_") else {}  # block options of block variants
        self.adapter = point_adapter(name, **(options or {}), **block)
        self.rg, self.tg = self.adapter.geometries()
        self.instance = cmp.problems.matrix_fit(self.adapter)(seed)
        self.targets = self.instance.data["targets"]

    def params(self):
        return [
            torch.nn.Parameter(torch.from_numpy(p.copy()).to(self.dtype))
            for p in self.instance.points
        ]

    def group(self, params, **extra):
        return self.adapter.group(params) | extra

    def loss(self, params):
        targets = torch.from_numpy(self.targets).to(self.dtype)
        return self.instance.loss(params, {"targets": targets})

    def point(self, params):
        """The torch point (stacked group layout for a block variant), detached."""
        return self.tg.from_params(tuple(p.detach() for p in params))

    def elements(self, params):
        """The reference's points of the batch, from the port's parameters (float64)."""
        arrays = [p.detach().double().numpy() for p in params]
        return [x for _, x in self.adapter.elements(arrays)]

    def run_reference(self, make, steps=STEPS):
        run = cmp.ReferenceRun(self.instance, self.adapter, cmp.Rule("", "", make, None))
        for _ in range(steps):
            run.step()
        return run.points, run.states

    def run_port(self, make, steps=STEPS, params=None, **extra):
        params = self.params() if params is None else params
        opt = make([self.group(params, **extra)])
        for _ in range(steps):
            opt.zero_grad()
            self.loss(params).backward()
            opt.step()
        return params, opt


def _matrix(rg, x):
    w = rg.to_matrix(x)
    return np.stack(w) if isinstance(w, tuple) else w


def _w_deviation(adapter, a, b):
    """max |W_a − W_b| over the groups of two reference points."""
    wa, wb = (adapter.geometries()[0].to_matrix(x) for x in (a, b))
    pairs = zip(wa, wb, strict=True) if isinstance(wa, tuple) else [(wa, wb)]
    return max(float(np.max(np.abs(p - q))) for p, q in pairs)


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


def test_every_geometry_meets_the_typed_protocols():
    """``torch_port.geometry``'s protocols are the ones the geometries implement: ``Geometry``
    for all eleven, ``PointGeometry`` (the optimizers' view) for the ten, their block variants,
    ``StiefelFrames`` and ``Ambient``. Negative control: a plain object meets neither."""
    for name in GEOMETRIES:
        g = GEOMETRIES[name](6, 2) if name == "stiefel" else GEOMETRIES[name](M, N, R)
        assert isinstance(g, Geometry), name
        if name != "stiefel":
            assert isinstance(g, PointGeometry) and isinstance(Ambient(g), PointGeometry), name
    frames = StiefelFrames(tp.Stiefel(6, 2))
    assert isinstance(frames, PointGeometry) and isinstance(Ambient(frames), PointGeometry)
    assert not isinstance(object(), Geometry) and not isinstance(object(), PointGeometry)


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
        n_ref = optim_transforms._frame_norms(rg, x, g)
        assert np.allclose(np.ravel(frames[e].numpy()), n_ref, rtol=1e-13, atol=0)
        if not hasattr(tg, "base"):
            assert abs(float(norms[e]) - rg.norm(x, u)) <= 1e-13 * max(1.0, rg.norm(x, u))
            assert abs(float(inners[e]) - rg.inner(x, u, g)) <= 1e-12
    tg.check_point(y_port)


@pytest.mark.parametrize("name", NAMES)
def test_random_gradients_of_every_scale_agree_per_element(name):
    """A fixed sequence of random factor gradients whose scale differs element by element
    (1e-3 … 1e3), with one zero gradient: per-frame scalars are per element. The points and,
    where the factors are defined by the point, the first moments agree to 1e-12 (relative to
    max(1, |m|)), and √v to 1e-12 relative."""
    rng = np.random.default_rng(3)
    block = {"n_heads": 4, "n_kv_heads": 2} if name.startswith("block_") else {}
    problem = SmoothProblem(name, **block)
    rg, adapter = problem.rg, problem.adapter
    xs = [rg.random_point(rng) for _ in _elements()]
    like = problem.instance.points
    scales = np.logspace(-3, 3, len(xs))
    steps = 40
    grads = [
        [
            ref.geometry.tree_map(lambda p, s=s: s * rng.standard_normal(np.shape(p)), x)
            for x, s in zip(xs, scales, strict=True)
        ]
        for _ in range(steps)
    ]
    grads[4][2] = ref.geometry.tree_map(np.zeros_like, grads[4][2])
    params = [torch.nn.Parameter(torch.from_numpy(a)) for a in adapter.assemble(xs, like)]
    opt = tp.RiemannianAdam([problem.group(params)], lr=LR, trust_radius=0.05)
    for gs in grads:
        for p, g in zip(params, adapter.assemble(gs, like), strict=True):
            p.grad = torch.from_numpy(g)
        opt.step()
    state = opt.state[params[0]]
    elements = _elements()
    for k, x_port in enumerate(problem.elements(params)):
        o = ro.riemannian_adam(lr=LR, trust_radius=0.05)
        x, s = xs[k], o.init(rg, xs[k])
        for gs in grads:
            x, s = o.step(rg, x, gs[k], s)
        dev = _max_diff(tuple(adapter.compared(x_port)), tuple(adapter.compared(x)))
        assert dev <= TOL_F64, (name, k, dev)
        m_ref, sv_ref = reference_moments(s)
        if not adapter.compares_matrix:
            size = max(1.0, max(float(np.max(np.abs(p))) for p in ref.geometry.parts(m_ref)))
            m_port = _elem(problem.tg, state["exp_avg"], elements[k])
            assert _max_diff(m_port, m_ref) <= TOL_F64 * size, (name, k)
        sv_port = np.ravel(state["sqrt_v"][np.unravel_index(k, BATCH)].numpy())
        assert np.allclose(sv_port, np.asarray(sv_ref), rtol=1e-12, atol=0), (name, k)


@pytest.mark.parametrize("name", ["stiefel_pair", "fixed_rank_embedded", "fixed_rank_quotient"])
def test_block_variant_under_mha_equals_the_plain_geometry(name):
    """Under MHA the default groups are single heads: the block variant's trajectory is the plain
    geometry's, head by head (the per-head layout is the plain batch layout)."""
    block = SmoothProblem("block_" + name, seed=2, n_heads=3, n_kv_heads=3)
    params_b, _ = block.run_port(PORT["adam_frame"], steps=20)
    plain = GEOMETRIES[name](M, N, R)
    x0 = tuple(p.detach().clone() for p in block.params())  # heads (2, 3, ...) = plain batch
    params_p = [torch.nn.Parameter(t) for t in x0]
    opt = tp.RiemannianAdam(
        [{"params": params_p, "geometry": name}], lr=LR, trust_radius=cmp.rules.RADIUS
    )
    t = torch.from_numpy(block.targets)
    idx = torch.arange(3)
    for _ in range(20):
        opt.zero_grad()
        w = plain.to_matrix(tuple(params_p))
        (0.5 * ((w - t[..., idx, idx, :, :]) ** 2).sum()).backward()
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
    params, opt = problem.run_port(PORT["adam_frame"], steps=100)
    assert all(p.dtype == torch.float32 for p in params)
    state = opt.state[params[0]]
    assert state["sqrt_v"].dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in state["exp_avg"])
    x = problem.point(params)
    assert all(bool(torch.isfinite(t).all()) for t in x)
    for k in ORTHONORMAL_PARTS[name.removeprefix("block_")]:
        assert float(tl.orthonormality_residual(x[k]).max()) <= TOL_F32_ORTHONORMAL, name
    problem.tg.check_point(x)
    # and it follows the float64 run to float32 accuracy
    ref64 = SmoothProblem(name, seed=4)
    params64, _ = ref64.run_port(PORT["adam_frame"], steps=100)
    w32 = problem.tg.to_matrix(x).double()
    w64 = ref64.tg.to_matrix(ref64.point(params64))
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
        params, opt = problem.run_port(PORT["adam_frame"], steps=2)
        state = opt.state[params[0]]
        assert set(state) == {"step", "exp_avg", "sqrt_v"}
        assert state["sqrt_v"].shape == sv_shape, name
        assert [tuple(t.shape) for t in state["exp_avg"]] == m_shapes, name
        p2, o2 = problem.run_port(PORT["adam_elementwise"], steps=1)
        assert [tuple(t.shape) for t in o2.state[p2[0]]["sqrt_v"]] == m_shapes


def test_moments_are_transported_at_every_step():
    problem = SmoothProblem("fixed_rank_embedded")
    params, opt = problem.run_port(PORT["adam_frame"], steps=5)
    u, _, v = problem.point(params)
    _, u_p, v_p = opt.state[params[0]]["exp_avg"]
    assert float((u.transpose(-1, -2) @ u_p).abs().max()) <= 1e-14
    assert float((v.transpose(-1, -2) @ v_p).abs().max()) <= 1e-14
    problem = SmoothProblem("partial_isometry_quotient")
    params, opt = problem.run_port(PORT["momentum"], steps=5)
    x = problem.point(params)
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
    make = PORT[rule]
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
    for x_port, x_ref in zip(problem.elements(params), finals, strict=True):
        assert _w_deviation(problem.adapter, x_port, x_ref) <= TOL_F64
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
    """linalg.polar takes a polynomial or the eigh route by the Gram's distance from
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
        SmoothProblem("block_partial_isometry_quotient").run_port(PORT["momentum"], steps=3)


def test_the_port_stiefel_accepts_square_frames_and_refuses_r_above_d() -> None:
    """St(d, d) (r = d, the orthogonal group) is allowed; r = d + 1 is refused."""
    from torch_port.stiefel import Stiefel as PortStiefel

    assert PortStiefel(3, 3).r == 3
    with pytest.raises(ValueError, match=r"r ≤ d .* got r=4 > d=3"):
        PortStiefel(3, 4)


def test_r2_random_points_have_the_stated_scale() -> None:
    """R2's random A, B are Gaussian scaled by 1/√m and 1/√n: E‖A‖_F² = E‖B‖_F² = r. Over a
    batch of N = 400 points the mean of ‖A‖_F² (variance 2r/m per point) has standard
    deviation sqrt(2r/(m·N)) ≈ 0.041 at (m, r) = (6, 2); a tolerance of 6 of them fails an
    honest draw with probability below 2e-9."""
    g = GEOMETRIES["fixed_rank_quotient"](M, N, R)
    a, b = g.random_point(torch.Generator().manual_seed(0), (400,))
    for f, rows in ((a, M), (b, N)):
        mean = float((f**2).sum((-2, -1)).mean())
        assert abs(mean - R) <= 6 * (2 * R / (rows * 400)) ** 0.5, (rows, mean)


@pytest.mark.parametrize("k, refused", [(0.99, True), (1.01, False)])
def test_r1_retraction_refuses_a_step_to_the_edge_of_its_rank_test(k, refused):
    """A step whose new core has σ_r/σ_1 = k·r·ε is refused below 1 and taken above, with
    σ_1 = 3 (a ratio taken as a product, σ_r·σ_1, decides otherwise). The core is diagonal, so
    the SVD returns its entries exactly: S + M = diag(3, 1, 6a) + diag(0, 0, −3a), a = k·r·ε."""
    m, n, r = 6, 5, 3
    geo = tp.GEOMETRIES["fixed_rank_embedded"](m, n, r)
    a = k * r * torch.finfo(torch.float64).eps
    point = (
        torch.eye(m, r, dtype=torch.float64),
        torch.diag(torch.tensor([3.0, 1.0, 6 * a], dtype=torch.float64)),
        torch.eye(n, r, dtype=torch.float64),
    )
    step = (
        torch.diag(torch.tensor([0.0, 0.0, -3 * a], dtype=torch.float64)),
        torch.zeros(m, r, dtype=torch.float64),
        torch.zeros(n, r, dtype=torch.float64),
    )
    if refused:
        with pytest.raises(ValueError, match="leaves the rank-3 manifold"):
            geo.retract(point, step)
    else:
        assert geo.retract(point, step)[1].shape == (r, r)


def test_r2_refusals_report_sigma_min_over_sigma_max():
    """A rank-deficient factor of an R2 point, or one that a step makes rank deficient, is
    refused with σ_min/σ_max itself in the message (the square root of the Gram's ratio):
    A = diag(2, 1, 2e-20) gives 1.000e-20, where the Gram's ratio would read 1.000e-40, and a
    step to diag(2, 1, 1e-10) gives 5.000e-11 (the entry 1 − (1 − 1e-10) is 1e-10 to 1e-7)."""
    m, n, r = 6, 5, 3
    geo = tp.GEOMETRIES["fixed_rank_quotient"](m, n, r)
    a = torch.zeros(m, r, dtype=torch.float64)
    a[0, 0], a[1, 1], a[2, 2] = 2.0, 1.0, 2e-20
    b = torch.eye(n, r, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"factor A: σ_min/σ_max = 1\.000e-20"):
        geo.check_point((a, b))
    good = torch.eye(m, r, dtype=torch.float64) * torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64)
    step = (torch.zeros(m, r, dtype=torch.float64), torch.zeros(n, r, dtype=torch.float64))
    step[0][2, 2] = -1.0 + 1e-10  # A + ξ = diag(2, 1, 1e-10): σ_min/σ_max = 5e-11
    with pytest.raises(ValueError, match=r"factor A: σ_min/σ_max = 5\.000e-11"):
        geo.retract((good, b), step)
