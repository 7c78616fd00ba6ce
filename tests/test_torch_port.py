"""The torch port (Stiefel) against reference/ and against torch.optim.AdamW.

Agreement bound in float64. Each step of either side rounds O(d·r) products and sums of length
≤ d, one r×r eigendecomposition and a handful of per-frame scalars; the two sides round them in
different orders (numpy's and torch's BLAS, pairwise vs blocked sums, LAPACK eigenvectors up to
sign), so one step can differ by a few hundred units of roundoff u = 1.1e-16 at most, i.e. by
≤ 1e-14 per frame. The maps involved (projection, a step normalised by a scalar moment, the polar
retraction) are Lipschitz with constant ≈ 1 along these short runs, so the differences add rather
than multiply: 100 steps × 1e-14 = 1e-12 is the bound asserted (measured: ≤ ~1e-14, see
docs/torch_port.md).
"""

from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import pytest
from conftest import reference_moments

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402
import torch_port as tp  # noqa: E402
from proofs_checks import port_compare as cmp  # noqa: E402
from reference import optim as ref_optim  # noqa: E402
from torch_port import linalg as tl  # noqa: E402

STEPS = 100
TOL_F64 = 1e-12  # 100 steps × 1e-14 per step (module docstring)
LR = 1e-2
#: Normalized RSGD takes steps of fixed length lr·sqrt(d·r); at lr = 1e-2 it reaches the Brockett
#: minimiser within ~55 steps and then oscillates around it, where the map amplifies any
#: perturbation ~8× per step (see test_normalized_rsgd_oscillation_is_the_problems_sensitivity).
#: Agreement to 1e-12 is asserted at lr = 2e-3, where the trajectory stays in the contracting
#: regime for 100 steps.
LR_NORMALIZED = 2e-3


VARIANTS = [
    ("polar", "embedded"),
    ("polar_svd", "embedded"),
    ("qr", "embedded"),
    ("exp", "embedded"),
    ("polar", "canonical"),
]


def _group(w, retraction="polar", metric="embedded", **extra):
    return {
        "params": [w],
        "geometry": "stiefel",
        "retraction": retraction,
        "metric": metric,
    } | extra


def _frames(shape):
    return [idx for idx in np.ndindex(*shape)]


# -- seeded problems ---------------------------------------------------------------------------
# The float64 trajectories of every rule, retraction and metric against the reference are rows
# of port_compare.RECORDS (tests/test_port_agreement.py).
def test_normalized_rsgd_oscillation_is_the_problems_sensitivity():
    """At lr = 1e-2 normalized RSGD on the Brockett problem enters a 2-cycle around the minimiser
    after ~55 steps, where rounding differences grow ~8× per step. The reference moved by
    1e-16 from its own starting point departs from itself by the same order (~3e-7) as the port
    departs from it (~7e-7): the growth is the problem's, not a port error."""
    problem = cmp.PROBLEMS["stiefel"]["brockett"]
    rule = cmp.Rule(
        "normalized_rsgd_1e-2",
        "",
        lambda: ref_optim.normalized_rsgd(lr=1e-2),
        lambda groups: tp.NormalizedRSGD(groups, lr=1e-2),
    )
    inst, adapter = problem.build(0), problem.adapter
    base = cmp.reference_trajectory(inst, adapter, rule, STEPS)
    rng = np.random.default_rng(3)
    nudged = [
        g.retract(x, 1e-16 * g.random_tangent(x, rng)) for g, x in adapter.elements(inst.points)
    ]
    moved = cmp.Instance(adapter.assemble(nudged, inst.points), inst.data, inst.egrad, inst.loss)
    other = cmp.reference_trajectory(moved, adapter, rule, STEPS)
    self_dev = max(
        float(np.linalg.norm(x - y))
        for xs, ys in zip(base, other, strict=True)
        for x, y in zip(xs, ys, strict=True)
    )
    assert self_dev > 1e-9  # the reference itself amplifies a 1e-16 nudge by > 1e7
    _, port = cmp.port_trajectory(inst, adapter, rule, STEPS, torch.float64, "cpu")
    port_dev = max(
        float(np.linalg.norm(x - y))
        for xs, ys in zip(port, base, strict=True)
        for x, y in zip(xs, ys, strict=True)
    )
    assert port_dev <= 10 * self_dev, (port_dev, self_dev)


def _batch_problem(seed=1, shape=(3, 2), d=7, r=3, steps=STEPS):
    """A batch of frames (3, 2, d, r) and a fixed random gradient sequence whose scale differs
    frame by frame (1e-3 … 1e3), so per-frame scalars are exercised."""
    rng = np.random.default_rng(seed)
    st = ref.Stiefel(d, r)
    w0 = np.stack([st.random_point(rng) for _ in _frames(shape)]).reshape(*shape, d, r)
    scales = np.logspace(-3, 3, int(np.prod(shape))).reshape(*shape, 1, 1)
    grads = [scales * rng.standard_normal((*shape, d, r)) for _ in range(steps)]
    grads[5][1, 0] = 0.0  # a zero gradient on one frame at one step: 0/0 := 0
    return w0, grads


@pytest.mark.parametrize("rule", list(cmp.RULES))
def test_frame_batch_float64_agrees_with_reference_per_frame(rule):
    w0, grads = _batch_problem()
    shape, (d, r) = w0.shape[:-2], w0.shape[-2:]
    make_ref, make_port = cmp.RULES[rule].reference, cmp.RULES[rule].port
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    port = make_port([_group(p)])
    port_points = []
    for g in grads:
        p.grad = torch.from_numpy(g)
        port.step()
        port_points.append(p.detach().numpy().copy())
    st = ref.Stiefel(d, r)
    state_port = port.state[p]
    for idx in _frames(shape):
        opt = make_ref()
        w, state = w0[idx], opt.init(st, w0[idx])
        worst = 0.0
        for k, g in enumerate(grads):
            w, state = opt.step(st, w, g[idx], state)
            worst = max(worst, float(np.linalg.norm(port_points[k][idx] - w)))
        assert worst <= TOL_F64, (rule, idx, worst)
        m_ref, sv_ref = reference_moments(state)
        key = "momentum_buffer" if "momentum" in rule else "exp_avg"
        if m_ref is not None:
            m_port = state_port[key][idx].numpy()
            assert np.linalg.norm(m_port - m_ref) <= TOL_F64 * max(1.0, np.linalg.norm(m_ref))
        if sv_ref is not None:
            sv_port = state_port["sqrt_v"][idx].numpy()
            sv_ref = np.asarray(sv_ref[0])
            assert np.max(np.abs(sv_port - sv_ref)) <= 1e-13 * max(1.0, float(np.max(sv_ref)))
        assert int(state_port["step"]) == len(grads)


# -- float32 drift -----------------------------------------------------------------------------
@pytest.mark.slow
def test_float32_drift_stays_below_5e_6_over_10000_steps():
    """Issue 4 item 1: 10,000 float32 RiemannianAdam steps at St(64, 16), lr 1e-2, random
    gradients, keep ‖WᵀW − I‖ ≤ 5e-6 (measured in float64 every 100 steps; ≤ 6.9e-7, flat)."""
    d, r = 64, 16
    st = tp.Stiefel(d, r)
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(st.random_point(gen, dtype=torch.float32))
    opt = tp.RiemannianAdam([_group(w)], lr=1e-2)
    worst = 0.0
    for k in range(10_000):
        w.grad = torch.randn(d, r, generator=gen, dtype=torch.float32)
        opt.step()
        if k % 100 == 99:
            worst = max(worst, float(st.residual(w.detach())))
    assert w.dtype == torch.float32
    assert worst <= 5e-6, worst


def test_low_precision_polar_goes_through_a_float64_gram():
    gen = torch.Generator().manual_seed(3)
    st = tp.Stiefel(32, 8)
    w = st.random_point(gen, batch_shape=(4,), dtype=torch.float32)
    xi = 0.05 * st.proj(w, torch.randn(w.shape, generator=gen, dtype=torch.float32))
    # Corrupt orthonormality by 1e-4: the Gram actually formed removes it in one retraction.
    w_off = w * (1 + 1e-4)
    y = st.retract(w_off, xi)
    assert y.dtype == torch.float32
    assert float(st.residual(y).max()) < 2e-6
    yb = st.retract(w.to(torch.bfloat16), xi.to(torch.bfloat16))
    assert yb.dtype == torch.bfloat16
    assert float(st.residual(yb).max()) < 0.1


# -- geometry against reference ----------------------------------------------------------------
@pytest.mark.parametrize(("retraction", "metric"), VARIANTS)
def test_stiefel_geometry_matches_reference_frame_by_frame(retraction, metric):
    rng = np.random.default_rng(5)
    d, r, shape = 6, 3, (2, 3)
    ref_st = ref.Stiefel(d, r, retraction=retraction, metric=metric)
    st = tp.Stiefel(d, r, retraction=retraction, metric=metric)
    x = np.stack([ref_st.random_point(rng) for _ in _frames(shape)]).reshape(*shape, d, r)
    z = rng.standard_normal(x.shape)
    v = rng.standard_normal(x.shape)
    xt, zt, vt = map(torch.from_numpy, (x, z, v))
    u = st.proj(xt, zt)
    y = st.retract(xt, 0.1 * u)
    rg = st.egrad_to_rgrad(xt, zt)
    tv = st.transport(xt, y, st.proj(xt, vt))
    inner, norm = st.inner(xt, u, rg), st.norm(xt, u)
    assert inner.shape == shape and norm.shape == shape
    for idx in _frames(shape):
        ux = ref_st.proj(x[idx], z[idx])
        assert np.allclose(u[idx].numpy(), ux, rtol=0, atol=1e-14)
        yx = ref_st.retract(x[idx], 0.1 * ux)
        assert np.allclose(y[idx].numpy(), yx, rtol=0, atol=1e-14)
        rx = ref_st.egrad_to_rgrad(x[idx], z[idx])
        assert np.allclose(rg[idx].numpy(), rx, rtol=0, atol=1e-14)
        tx = ref_st.transport(x[idx], yx, ref_st.proj(x[idx], v[idx]))
        assert np.allclose(tv[idx].numpy(), tx, rtol=0, atol=1e-13)
        assert abs(float(inner[idx]) - ref_st.inner(x[idx], ux, rx)) <= 1e-13
        assert abs(float(norm[idx]) - ref_st.norm(x[idx], ux)) <= 1e-13
    assert float(st.residual(y).max()) < 1e-14
    st.check_tangent(y, tv)


def test_exp_and_polar_svd_and_qr_stay_on_the_manifold_in_batches():
    gen = torch.Generator().manual_seed(2)
    for retraction in ("polar", "polar_svd", "qr", "exp"):
        st = tp.Stiefel(9, 4, retraction=retraction)
        x = st.random_point(gen, batch_shape=(2, 5))
        u = st.random_tangent(x, gen)
        assert torch.allclose(st.norm(x, u), torch.ones(2, 5, dtype=torch.float64))
        st.check_point(st.retract(x, 0.3 * u))
        assert torch.equal(st.retract(x, st.zero_tangent(x)), st.retract(x, 0 * u))


def test_check_point_reports_the_measured_residual():
    st = tp.Stiefel(5, 2)
    x = st.random_point(torch.Generator().manual_seed(0), batch_shape=(3,))
    st.check_point(x)
    bad = x.clone()
    bad[1] *= 1.01
    with pytest.raises(ValueError, match=r"‖WᵀW − I‖ = 2\.8\d\de-02 .*frame \(1,\); 1 of 3"):
        st.check_point(bad)
    with pytest.raises(ValueError, match=r"expected shape \(\.\.\., 5, 2\)"):
        st.check_point(torch.zeros(3, 2, 5, dtype=torch.float64))
    nan = x.clone()
    nan[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="1 non-finite"):
        st.check_point(nan)
    with pytest.raises(ValueError, match="r ≤ d"):
        tp.Stiefel(2, 3)


def test_expm_of_one_matrix_avoids_torchs_unbatched_t8_path():
    """pytorch/pytorch#196592: torch's unbatched matrix_exp is off by ~8e-11 for a rotation by
    0.04 rad; ``linalg.expm`` goes through the batched path."""
    theta = 0.04
    a = torch.tensor([[0.0, -theta], [theta, 0.0]], dtype=torch.float64)
    want = torch.tensor(
        [[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]], dtype=torch.float64
    )
    assert float((tl.expm(a) - want).abs().max()) <= 1e-15
    assert float((tl.expm(a[None]) - want).abs().max()) <= 1e-15
    assert float((tl.expm(a.expand(3, 2, 2)) - want).abs().max()) <= 1e-15


def test_polar_refuses_rank_deficient_and_non_finite_input():
    a = torch.zeros(2, 4, 2, dtype=torch.float64)
    a[..., 0, 0] = 1.0
    a[0, 1, 1] = 1.0
    with pytest.raises(ValueError, match="rank-deficient"):
        tl.polar(a)
    with pytest.raises(ValueError, match="non-finite"):
        tl.polar(torch.full((4, 2), float("inf"), dtype=torch.float64))
    ill = torch.tensor([[1.0, 0.0], [0.0, 1e-3], [0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(tl.polar(ill), torch.eye(3, 2, dtype=torch.float64), atol=1e-15)


def test_the_rank_refusal_reports_the_smallest_eigenvalue_over_the_largest():
    """The message gives λ_min/λ_max of the Gram as ``eigh`` computed it (λ_max = 4 here, so a
    product or the middle eigenvalue in its place reads 16 or 4 times off)."""
    gen = torch.Generator().manual_seed(2)
    q = torch.linalg.qr(torch.randn(10, 3, generator=gen, dtype=torch.float64))[0]
    a = q * torch.sqrt(torch.tensor([4.0, 1.0, 4e-17], dtype=torch.float64))
    lam = torch.linalg.eigvalsh(tl.sym(tl.gram64(a)))
    with pytest.raises(ValueError, match=f"value {float(lam[0] / lam[-1]):.3e} relative"):
        tl.polar(a)


# -- optimizer contract ------------------------------------------------------------------------
OPTIMIZERS = {
    "RiemannianAdam": lambda ps: tp.RiemannianAdam(ps, lr=LR, trust_radius=0.05),
    "RiemannianAdam_elementwise": lambda ps: tp.RiemannianAdam(ps, lr=LR, moment="elementwise"),
    "RiemannianMomentum": lambda ps: tp.RiemannianMomentum(ps, lr=LR, beta=0.9, c=0.5),
    "RSGD": lambda ps: tp.RSGD(ps, lr=LR, trust_radius=0.02),
    "NormalizedRSGD": lambda ps: tp.NormalizedRSGD(ps, lr=LR),
}


def _model(seed=0):
    """A batch of frames (3, 2, 7, 3) and a plain weight (decayed), float64."""
    gen = torch.Generator().manual_seed(seed)
    frames = torch.nn.Parameter(tp.Stiefel(7, 3).random_point(gen, batch_shape=(3, 2)))
    plain = torch.nn.Parameter(torch.randn(4, 5, generator=gen, dtype=torch.float64))
    return frames, plain


def _groups(frames, plain):
    return [_group(frames), {"params": [plain], "weight_decay": 0.1}]


def _grads(steps, seed=7):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(3, 2, 7, 3, generator=gen, dtype=torch.float64),
            torch.randn(4, 5, generator=gen, dtype=torch.float64),
        )
        for _ in range(steps)
    ]


def _train(opt, frames, plain, grads):
    for gf, gp in grads:
        frames.grad, plain.grad = gf.clone(), gp.clone()
        opt.step()


def _trained(name, frames, plain, grads):
    """``OPTIMIZERS[name]`` over (frames, plain), stepped through ``grads`` (``_train``)."""
    opt = OPTIMIZERS[name](_groups(frames, plain))
    _train(opt, frames, plain, grads)
    return opt


def _snapshot(opt, *params):
    return [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict())


def _same(a, b) -> bool:
    """Bitwise equality of nested state_dicts / lists of tensors."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_resume_equals_continue_bitwise(name):
    grads = _grads(20)
    f1, p1 = _model()
    opt1 = _trained(name, f1, p1, grads)

    f2, p2 = _model()
    opt2 = _trained(name, f2, p2, grads[:10])
    buf = io.BytesIO()
    torch.save({"frames": f2.detach(), "plain": p2.detach(), "opt": opt2.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    f3 = torch.nn.Parameter(saved["frames"].clone())
    p3 = torch.nn.Parameter(saved["plain"].clone())
    opt3 = OPTIMIZERS[name](_groups(f3, p3))
    opt3.load_state_dict(saved["opt"])
    assert _same(opt3.state_dict(), saved["opt"])  # the round trip
    _train(opt3, f3, p3, grads[10:])
    assert torch.equal(f3, f1) and torch.equal(p3, p1)
    assert _same(opt3.state_dict(), opt1.state_dict())


def test_state_layout_scalar_second_moment_per_frame():
    frames, plain = _model()
    opt = tp.RiemannianAdam(_groups(frames, plain), lr=LR)
    _train(opt, frames, plain, _grads(2))
    s = opt.state[frames]
    assert set(s) == {"step", "exp_avg", "sqrt_v"}
    assert s["sqrt_v"].shape == (3, 2) and s["sqrt_v"].dtype == torch.float64
    assert s["exp_avg"].shape == frames.shape
    assert sum(v.numel() for v in s.values()) == frames.numel() + 6 + 1  # no full-size v
    assert set(opt.state[plain]) == {"step", "exp_avg", "exp_avg_sq"}
    # One frame (d, r): √v is a 0-d tensor.
    w = torch.nn.Parameter(tp.Stiefel(5, 2).random_point(torch.Generator().manual_seed(1)))
    opt1 = tp.RiemannianAdam([_group(w)], lr=LR)
    w.grad = torch.ones_like(w)
    opt1.step()
    assert opt1.state[w]["sqrt_v"].shape == ()
    # The elementwise ablation arm keeps a full-size √v.
    opt2 = tp.RiemannianAdam([_group(w)], lr=LR, moment="elementwise")
    opt2.step()
    assert opt2.state[w]["sqrt_v"].shape == w.shape
    assert float(tp.Stiefel(5, 2).residual(w.detach())) < 1e-14


def test_momentum_is_transported_at_every_step():
    frames, plain = _model()
    opt = tp.RiemannianAdam(_groups(frames, plain), lr=LR)
    _train(opt, frames, plain, _grads(3))
    st = tp.Stiefel(7, 3)
    st.check_tangent(frames.detach(), opt.state[frames]["exp_avg"], atol=1e-14)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("warm", [0, 3])
def test_non_finite_gradient_raises_and_changes_nothing(name, warm):
    frames, plain = _model()
    opt = _trained(name, frames, plain, _grads(warm))
    before = _snapshot(opt, frames, plain)
    gf, gp = _grads(1, seed=11)[0]
    gf[2, 1, 0, 0] = float("nan")
    gf[0, 0, 3, 2] = float("inf")
    frames.grad, plain.grad = gf, gp
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\].*2 non-finite"):
        opt.step()
    assert _same(_snapshot(opt, frames, plain), before)
    # a plain parameter is named too
    frames.grad, plain.grad = _grads(1, seed=12)[0]
    plain.grad[0, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\].*1 non-finite"):
        opt.step()
    assert _same(_snapshot(opt, frames, plain), before)


def test_named_parameters_are_named_in_the_error():
    frames, _ = _model()
    opt = tp.RSGD([{"params": [("blocks.0.wq", frames)], "geometry": "stiefel"}], lr=LR)
    frames.grad = torch.full_like(frames, float("nan"))
    with pytest.raises(ValueError, match=r"'blocks\.0\.wq'.*126 non-finite"):
        opt.step()


def test_skip_nonfinite_warns_and_skips():
    grads = _grads(6)
    f1, p1 = _model()
    opt1 = tp.RiemannianAdam(_groups(f1, p1), lr=LR, skip_nonfinite=True)
    _train(opt1, f1, p1, grads)

    f2, p2 = _model()
    opt2 = tp.RiemannianAdam(_groups(f2, p2), lr=LR, skip_nonfinite=True)
    _train(opt2, f2, p2, grads[:3])
    before = _snapshot(opt2, f2, p2)
    f2.grad, p2.grad = grads[3][0].clone(), grads[3][1].clone()
    p2.grad[1, 1] = float("nan")
    with pytest.warns(tp.NonFiniteGradientWarning, match="1 non-finite.*skipped"):
        opt2.step()
    assert _same(_snapshot(opt2, f2, p2), before)
    assert opt2.skipped_steps == 1
    _train(opt2, f2, p2, grads[3:])
    assert torch.equal(f2, f1) and torch.equal(p2, p1)


def test_frame_decay_warns_and_does_nothing():
    grads = _grads(5)
    f1, p1 = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", tp.FrameDecayWarning)
        opt1 = tp.RiemannianAdam(_groups(f1, p1), lr=LR)  # decay on the plain group only
    _train(opt1, f1, p1, grads)
    f2, p2 = _model()
    with pytest.warns(tp.FrameDecayWarning, match="RA-5") as record:
        opt2 = tp.RiemannianAdam(
            [_group(f2), {"params": [p2], "weight_decay": 0.1}], lr=LR, weight_decay=0.3
        )
    assert record[0].filename == __file__  # attributed to the caller's line
    _train(opt2, f2, p2, grads)
    assert torch.equal(f2, f1) and torch.equal(p2, p1)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("cls", ["RiemannianAdam", "RSGD", "RiemannianMomentum", "NormalizedRSGD"])
def test_plain_groups_match_torch_adamw(cls, weight_decay):
    gen = torch.Generator().manual_seed(4)
    x0 = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    grads = [torch.randn(6, 5, generator=gen, dtype=torch.float64) for _ in range(20)]
    grads[3][0, 0] = 0.0
    a = torch.nn.Parameter(x0.clone())
    b = torch.nn.Parameter(x0.clone())
    kw = dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=weight_decay)
    ours = getattr(tp, cls)([a], **kw)
    theirs = torch.optim.AdamW([b], **kw)
    for g in grads:
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert float((a - b).detach().abs().max()) <= 1e-15
    for key in ("exp_avg", "exp_avg_sq"):
        assert float((ours.state[a][key] - theirs.state[b][key]).abs().max()) <= 1e-15
    # and the reference's adamw (a different order of operations) to rounding
    e = ref.Euclidean(6, 5)
    opt = ref_optim.adamw(**kw)
    x, state = x0.numpy().copy(), opt.init(e, x0.numpy().copy())
    for g in grads:
        x, state = opt.step(e, x, g.numpy(), state)
    assert np.max(np.abs(a.detach().numpy() - x)) <= 1e-13


def test_a_chain_optimizer_needs_a_rule():
    """A bare ChainOptimizer without ``rule`` is refused at construction; a preset defines its
    own, and a given rule is the one that runs (its step equals the preset's, bitwise)."""
    w = torch.nn.Parameter(tp.Stiefel(5, 2).random_point(torch.Generator().manual_seed(0), (2,)))
    group = {"params": [w], "geometry": "stiefel"}
    with pytest.raises(TypeError, match="ChainOptimizer needs a rule"):
        tp.optim.ChainOptimizer([group], lr=LR)
    preset = tp.RSGD([group], lr=LR)
    chained = tp.optim.ChainOptimizer([group], preset.rule, lr=LR)
    assert chained.rule(chained.param_groups[0]) is not None
    w0 = w.detach().clone()
    w.grad = torch.ones_like(w)
    preset.step()
    w_preset = w.detach().clone()
    with torch.no_grad():
        w.copy_(w0)
    chained.step()
    assert torch.equal(w.detach(), w_preset) and not torch.equal(w_preset, w0)


def test_frame_off_the_manifold_is_refused_before_any_change():
    frames, plain = _model()
    opt = tp.RiemannianAdam(_groups(frames, plain), lr=LR)  # on St when the group is added
    with torch.no_grad():
        frames[0, 1] *= 1.5
    before = frames.detach().clone()
    frames.grad, plain.grad = _grads(1)[0]
    with pytest.raises(ValueError, match=r"off St\(7, 3\).*frame \(0, 1\)"):
        opt.step()
    assert torch.equal(frames, before) and len(opt.state) == 0


def test_zero_gradient_gives_a_zero_step():
    frames, _ = _model()
    before = frames.detach().clone()
    for make in OPTIMIZERS.values():
        opt = make([_group(frames)])
        frames.grad = torch.zeros_like(frames)
        opt.step()
        assert torch.allclose(frames, before, rtol=0, atol=1e-15)


def test_closure_and_float32_batches():
    gen = torch.Generator().manual_seed(9)
    st = tp.Stiefel(16, 4)
    w = torch.nn.Parameter(st.random_point(gen, batch_shape=(2, 3), dtype=torch.float32))
    target = torch.randn(2, 3, 16, 4, generator=gen)
    opt = tp.RiemannianAdam([_group(w)], lr=5e-2)

    def closure():
        opt.zero_grad()
        loss = ((w - target) ** 2).sum()
        loss.backward()
        return loss

    first = float(opt.step(closure).detach())
    for _ in range(50):
        last = float(opt.step(closure).detach())
    assert last < first
    assert w.dtype == torch.float32 and opt.state[w]["sqrt_v"].dtype == torch.float32
    assert float(st.residual(w.detach()).max()) < 2e-6


# -- GPU ---------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_cuda_float64_matches_cpu(name):
    grads = _grads(20)
    f1, p1 = _model()
    _trained(name, f1, p1, grads)
    f2, p2 = (torch.nn.Parameter(t.detach().cuda()) for t in _model())
    _trained(name, f2, p2, [(a.cuda(), b.cuda()) for a, b in grads])
    assert float((f2.cpu() - f1).abs().max()) <= 1e-12
    assert float((p2.cpu() - p1).abs().max()) <= 1e-12


@cuda
def test_cuda_float32_drift():
    d, r = 64, 16
    st = tp.Stiefel(d, r)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.nn.Parameter(st.random_point(batch_shape=(12,), dtype=torch.float32).cuda())
    opt = tp.RiemannianAdam([_group(w)], lr=1e-2)
    for _ in range(2000):
        w.grad = torch.randn(w.shape, generator=gen, device="cuda")
        opt.step()
    assert float(st.residual(w.detach()).max()) <= 5e-6


def test_bfloat16_frames_keep_a_decaying_second_moment():
    """√v is kept in float32 for bfloat16 frames: in bfloat16, √β2·√v = 0.9995·√v rounds back
    to √v and the moment would never decay. With gradients of RMS 1 then zero, √v must fall
    like √β2^t: 0.951 after 100 steps (float32 rounding of 100 multiplications is far below the
    0.5% asserted; a bfloat16 √v would stay at its first value, 5% off)."""
    st = tp.Stiefel(16, 4)
    gen = torch.Generator().manual_seed(3)
    w = torch.nn.Parameter(st.random_point(gen, dtype=torch.bfloat16))
    opt = tp.RiemannianAdam([_group(w)], lr=1e-3)
    w.grad = torch.randn(16, 4, generator=gen).to(torch.bfloat16)
    opt.step()
    first = opt.state[w]["sqrt_v"].clone()
    assert first.dtype == torch.float32
    for _ in range(100):
        w.grad = torch.zeros(16, 4, dtype=torch.bfloat16)
        opt.step()
    expected = first * 0.999 ** (100 / 2)
    assert torch.allclose(opt.state[w]["sqrt_v"], expected, rtol=5e-3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("delta", [1e-300, 1e-9, 1e-3, 1.9e-3, 0.1, 0.3, 0.5])
def test_the_taylor_degree_is_the_least_whose_tail_bound_is_below_the_tolerance(delta, dtype):
    """``_taylor_degree(δ, tol)`` = min{k : δ^{k+1}/(1 − δ) ≤ tol}, in exact rationals (a bound
    ×(1 − δ) instead of ÷ gives a degree too small at δ = 0.5), with the tolerance of the
    dtype the inverse square root is cast to: 1e-17 for float64, ε/16 below."""
    from fractions import Fraction

    tol = tl.series_tolerance(dtype)
    assert tol == (1e-17 if dtype == torch.float64 else torch.finfo(dtype).eps / 16)
    d = Fraction(delta)
    want = next(k for k in range(200) if d ** (k + 1) / (1 - d) <= Fraction(tol))
    assert tl._taylor_degree(delta, tol) == want
    if dtype == torch.float64:  # the default, which the capturable step's degree is chosen by
        assert tl._taylor_degree(delta) == want


def test_the_smallest_stiefel_manifold_is_accepted_by_both_libraries():
    """St(1, 1) = {±1} is inside the stated domain d ≥ 1, r ≥ 1 (a test d ≤ 1 would refuse it);
    its random point is ±1 in both libraries."""
    import torch

    x = tp.Stiefel(1, 1).random_point(generator=torch.Generator().manual_seed(0))
    assert abs(float(x)) == 1.0
    assert abs(float(ref.Stiefel(1, 1).random_point(np.random.default_rng(0))[0, 0])) == 1.0
