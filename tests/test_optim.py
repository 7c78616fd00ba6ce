"""Unit tests of reference.optim (DESIGN §5) against hand-written transcriptions and closed forms.

The transcriptions below use plain NumPy formulas (v rather than √v, np.sqrt, SciPy's polar) so
they share no code with the chain of transformations under test. U is the unit roundoff 2^-53.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
import scipy.linalg
from conftest import U

import reference as ref
from reference import optim

D, R = 6, 3


def _problem(seed=0, steps=4, d=D, r=R):
    rng = np.random.default_rng(seed)
    st = ref.Stiefel(d, r)
    return st, st.random_point(rng), [rng.standard_normal((d, r)) for _ in range(steps)]


def _proj(w, z):
    return z - w @ (w.T @ z + z.T @ w) / 2


def _polar(a):
    return scipy.linalg.polar(a)[0]


def _run(opt, geometry, x, grads):
    """Points and tangent steps ξ of ``opt`` along fixed gradients."""
    state = opt.init(geometry, x)
    xs, xis = [x], []
    for g in grads:
        xi, _ = opt.update(geometry, x, g, state)
        x, state = opt.step(geometry, x, g, state)
        xs.append(x)
        xis.append(xi)
    return xs, xis, state


def _adam_state(state) -> optim.AdamState:
    """The Adam transformation's state: the first entry of the chain's state tuple."""
    assert isinstance(state[0], optim.AdamState)
    return state[0]


@contextlib.contextmanager
def _no_frame_warning():
    """Turn a FrameDecayWarning into an error inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", optim.FrameDecayWarning)
        yield


# -- AdamW on plain arrays ---------------------------------------------------------------------
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch_convention(weight_decay):
    rng = np.random.default_rng(1)
    lr, (b1, b2), eps = 1e-2, (0.9, 0.99), 1e-8
    e = ref.Euclidean(4, 3)
    p0 = rng.standard_normal((4, 3))
    grads = [rng.standard_normal((4, 3)) for _ in range(6)]
    grads[2][0, 0] = 0.0  # an entry with a zero gradient at one step
    opt = optim.adamw(lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay)
    with _no_frame_warning():
        xs, _, _ = _run(opt, e, p0, grads)
    # torch.optim.AdamW: p ← p(1 − lr·λ); p ← p − lr·m̂/(√v̂ + ε).
    p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        p = p * (1 - lr * weight_decay) - lr * m_hat / (np.sqrt(v_hat) + eps)
        # Per step the ratio m̂/(√v̂ + ε) differs by ≲ 10 roundings (relative, |ratio| ≤ ~3),
        # and the decay by ~2·U·|p|: ≤ t·(10·U·lr·3 + 2·U·|p|) with |p| < 4: < 1e-14 for t ≤ 6.
        assert np.max(np.abs(xs[t] - p)) < 1e-14


# -- fixed-step rules --------------------------------------------------------------------------
def test_rsgd_step_is_polar_of_projected_step():
    st, w, grads = _problem()
    lr = 0.1
    xs, xis, _ = _run(optim.rsgd(lr), st, w, grads)
    for t, g in enumerate(grads):
        expected_xi = -lr * _proj(xs[t], g)
        # One projection (two length-≤ d products): ≤ 10·d·U·lr·‖G‖ with ‖G‖ < 8.
        assert np.max(np.abs(xis[t] - expected_xi)) < 10 * D * U * lr * 8
        # Polar of W + ξ with κ ≤ √(1 + ‖ξ‖²) < 1.5: ≲ 10·d·κ²·U ≈ 1.5e-14; rounded up.
        assert np.max(np.abs(xs[t + 1] - _polar(xs[t] + xis[t]))) < 1e-13


@pytest.mark.parametrize("delta", [0.3, 100.0])
def test_rsgd_trust_region(delta):
    st, w, grads = _problem()
    lr = 1.0
    opt = optim.rsgd(lr, trust_radius=delta)
    xi, _ = opt.update(st, w, grads[0], opt.init(st, w))
    full = -lr * _proj(w, grads[0])
    n = np.linalg.norm(full)
    assert 0.3 < n < 100.0  # the cap is active for Δ = 0.3 only
    # ξ = full·min(1, Δ/‖full‖): a norm and a scaling, ≤ 10·d·r·U relative.
    expected = full * min(1.0, delta / n)
    assert np.max(np.abs(xi - expected)) < 10 * D * R * U * np.max(np.abs(expected))
    assert np.linalg.norm(xi) == pytest.approx(min(delta, n), rel=10 * D * R * U)


@pytest.mark.parametrize("grad_scale", [1.0, 1e-100, 1e100])
def test_normalized_rsgd_step_has_rms_lr(grad_scale):
    st, w, grads = _problem()
    lr = 0.05
    opt = optim.normalized_rsgd(lr)
    xs, xis, _ = _run(opt, st, w, [grad_scale * g for g in grads])
    for t, g in enumerate(grads):
        xi = xis[t]
        # RMS(ξ) = lr: a scaled sum of d·r squares, ≤ (d·r + 4)·U relative.
        assert np.sqrt(np.mean(xi * xi)) == pytest.approx(lr, rel=(D * R + 4) * U * 4)
        pg = _proj(xs[t], g)
        # Direction: −lr·P_W(G)/RMS(P_W(G)) (degree zero: the same for every grad_scale).
        expected = -lr * pg / np.sqrt(np.mean(pg * pg))
        assert np.max(np.abs(xi - expected)) < 10 * D * R * U * lr * 4  # |entries| ≤ 4·lr
        assert np.max(np.abs(xs[t + 1] - _polar(xs[t] + xi))) < 1e-13  # as in rsgd


@pytest.mark.parametrize("c", [1e-3, 10.0])
def test_riemannian_momentum(c):
    st, w, grads = _problem()
    lr, beta = 0.1, 0.8
    opt = optim.riemannian_momentum(lr, beta, c)
    xs, xis, _ = _run(opt, st, w, grads)
    m = np.zeros((D, R))
    for t, g in enumerate(grads):
        m = _proj(xs[t], m)  # transport by projection to the current point
        m = beta * m + (1 - beta) * _proj(xs[t], g)
        n = np.linalg.norm(m)
        assert np.linalg.norm(g) < 8 and max(n, c) > 0.3
        # M here and in the chain differ by ≲ (t + 1) projections' rounding, ≤ 10·d·U·‖G‖ each;
        # dividing by max(‖M‖, c) > 0.3 and scaling by lr ≤ 1 bounds each entry of the step's
        # error by `tol`, and its norm by √(d·r)·tol.
        tol = (t + 1) * 10 * D * U * 8 / 0.3
        # Direction −lr·M/max(‖M‖, c) and length lr·min(1, ‖M‖/c): c = 1e-3 always normalises,
        # c = 10 never does here.
        assert np.max(np.abs(xis[t] - (-lr * m / max(n, c)))) < tol
        assert np.linalg.norm(xis[t]) == pytest.approx(
            lr * min(1.0, n / c), abs=np.sqrt(D * R) * tol
        )
        assert np.max(np.abs(xs[t + 1] - _polar(xs[t] + xis[t]))) < 1e-13


# -- Riemannian Adam ---------------------------------------------------------------------------
def _hand_adam(w, grads, lr, b1, b2, eps, delta=None, reduction="mean"):
    """DESIGN §5 written out with v (not √v): g = P_W(G); m ← β1 m + (1 − β1) g;
    v ← β2 v + (1 − β2) s(g); ξ = −lr m̂/(√v̂ + ε); cap; W ← polar(W + ξ); m ← P_W(m)."""
    m, v = np.zeros_like(w), 0.0
    ws, xis = [w], []
    for t, big_g in enumerate(grads, start=1):
        g = _proj(w, big_g)
        m = b1 * m + (1 - b1) * g
        s = np.sum(g * g) / (g.size if reduction == "mean" else 1)
        v = b2 * v + (1 - b2) * s
        xi = -lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        if delta is not None and np.linalg.norm(xi) > delta:
            xi = xi * (delta / np.linalg.norm(xi))
        w = _polar(w + xi)
        m = _proj(w, m)
        ws.append(w)
        xis.append(xi)
    return ws, xis


@pytest.mark.parametrize(
    ("eps", "delta", "reduction"),
    [(1e-8, None, "mean"), (0.0, None, "mean"), (1e-8, 0.02, "mean"), (0.0, None, "sum")],
)
def test_riemannian_adam_matches_hand_transcription(eps, delta, reduction):
    st, w, grads = _problem(steps=6)
    lr, betas = 0.03, (0.9, 0.99)
    opt = optim.riemannian_adam(lr, betas, eps, trust_radius=delta, reduction=reduction)
    xs, xis, _ = _run(opt, st, w, grads)
    ws, hxis = _hand_adam(w, grads, lr, *betas, eps, delta, reduction)
    # Per step both sides round ~10 operations on O(lr) numbers plus one polar (≲ 1e-14, see
    # rsgd); errors propagate with factor ≲ 1 + ‖ξ‖, so after ≤ 6 steps < 6·2e-14: use 1e-13.
    for t in range(len(grads)):
        assert np.max(np.abs(xis[t] - hxis[t])) < 1e-13
        assert np.max(np.abs(xs[t + 1] - ws[t + 1])) < 1e-13
    if delta is not None:  # capped steps have norm Δ up to a norm and a scaling: ≤ 30·U
        assert max(np.linalg.norm(x) for x in xis) == pytest.approx(delta, rel=30 * U)


@pytest.mark.parametrize("eps", [0.0, 1e-8])
def test_riemannian_adam_zero_gradient(eps):
    st, w, grads = _problem()
    lr, (b1, b2) = 0.05, (0.9, 0.999)
    opt = optim.riemannian_adam(lr, (b1, b2), eps)
    state = opt.init(st, w)
    zero = np.zeros((D, R))
    xi, _ = opt.update(st, w, zero, state)
    assert not np.any(xi)  # 0/0 := 0: exactly zero
    w1, state = opt.step(st, w, zero, state)
    adam = _adam_state(state)
    assert adam.count == 1 and adam.sqrt_v == (0.0,) and not np.any(adam.m)
    assert np.max(np.abs(w1 - w)) < 10 * D * U  # polar(W) = W up to refactoring rounding
    # After one zero step: m = (1 − β1)g, √v = √(1 − β2)·RMS(g) at t = 2, so
    # ξ = −lr·[(1 − β1)/(1 − β1²)]·g / ([√(1 − β2)/√(1 − β2²)]·RMS(g) + ε).
    g = _proj(w1, grads[0])
    rms = np.sqrt(np.mean(g * g))
    denom = np.sqrt(1 - b2) / np.sqrt(1 - b2**2) * rms + eps
    expected = -lr * (1 - b1) / (1 - b1**2) * g / denom
    xi, new = opt.update(st, w1, grads[0], state)
    assert np.all(np.isfinite(_adam_state(new).sqrt_v))
    assert np.max(np.abs(xi - expected)) < 10 * D * R * U * lr * 4  # |ξ_ij| ≤ 4·lr


@pytest.mark.parametrize("scale", [1e150, 1e-150, 1e300, 1e-300])
def test_riemannian_adam_gradient_scale_independence(scale):
    """With ε = 0 the steps are degree zero in the gradient: finite and the same for G and sG."""
    st, w, grads = _problem(steps=4)
    opt = optim.riemannian_adam(0.05, eps=0.0)
    xs1, xis1, s1 = _run(opt, st, w, grads)
    xss, xiss, ss = _run(opt, st, w, [scale * g for g in grads])
    for t in range(len(grads)):
        assert np.all(np.isfinite(xiss[t]))
        # Every operation is homogeneous; the scaled run differs by the rounding of sG (one U
        # per entry) pushed through ~20 roundings per step: < 4·20·U·‖ξ‖ with ‖ξ‖ ≤ 0.4.
        assert np.max(np.abs(xiss[t] - xis1[t])) < 4 * 20 * U * 0.4 * 10
        assert np.max(np.abs(xss[t + 1] - xs1[t + 1])) < 1e-13  # + polar, as in rsgd
    sv_scaled, sv = _adam_state(ss).sqrt_v[0], _adam_state(s1).sqrt_v[0]
    assert np.isfinite(sv_scaled) and sv_scaled > 0
    # √v after 4 steps: 4 hypot updates of scaled RMS values, ≲ 4·(d·r + 6)·U relative each side,
    # and the rounding of s·√v: < 1e-13.
    assert sv_scaled == pytest.approx(scale * sv, rel=1e-13)


def test_riemannian_adam_sum_vs_mean():
    st, w, grads = _problem(steps=1)  # one step: both runs see the same point and gradient
    lr = 0.05
    _, xis_m, s_m = _run(optim.riemannian_adam(lr, eps=0.0, reduction="mean"), st, w, grads)
    _, xis_s, s_s = _run(optim.riemannian_adam(lr, eps=0.0, reduction="sum"), st, w, grads)
    k = np.sqrt(D * R)
    # √v(sum) = √(d·r)·√v(mean): both are scaled sums of the same squares, ≤ 10·d·r·U relative.
    ratio = _adam_state(s_s).sqrt_v[0] / _adam_state(s_m).sqrt_v[0]
    assert ratio == pytest.approx(k, rel=10 * D * R * U)
    # First step (same point): ξ_sum = ξ_mean/√(d·r).
    assert np.max(np.abs(xis_s[0] * k - xis_m[0])) < 10 * D * R * U * lr * 4


@pytest.mark.parametrize("eps_factor", [0.1, 1.0, 10.0])
def test_riemannian_adam_eps_identity(eps_factor):
    """‖ξ_ε − ξ_0‖ = ‖ξ_0‖·ε/(√v̂ + ε) from the same state (DESIGN §5); at t = 1, √v̂ = RMS(g)."""
    st, w, grads = _problem()
    g = _proj(w, grads[0])
    rms = np.sqrt(np.mean(g * g))
    eps = eps_factor * rms
    opt0, opte = optim.riemannian_adam(0.05, eps=0.0), optim.riemannian_adam(0.05, eps=eps)
    xi0, _ = opt0.update(st, w, grads[0], opt0.init(st, w))
    xie, _ = opte.update(st, w, grads[0], opte.init(st, w))
    expected = np.linalg.norm(xi0) * eps / (rms + eps)
    # Two directions of size ≤ ‖ξ_0‖ ≈ 0.2, each with ≲ 30 roundings: 1e-14 absolute.
    assert np.linalg.norm(xie - xi0) == pytest.approx(expected, abs=1e-14)
    assert np.linalg.norm(xi0) == pytest.approx(0.05 * np.sqrt(D * R), rel=1e-14)


def test_riemannian_adam_elementwise_first_step():
    """moment="elementwise", ε = 0, t = 1: m̂/√v̂ = sign(g) entrywise, then projected."""
    st, w, grads = _problem()
    lr = 0.05
    opt = optim.riemannian_adam(lr, eps=0.0, moment="elementwise")
    xi, _ = opt.update(st, w, grads[0], opt.init(st, w))
    g = _proj(w, grads[0])
    expected = -lr * _proj(w, np.sign(g))
    # m̂/√v̂ = g/|g| up to 3 roundings (hypot, two bias corrections): then one projection.
    assert np.max(np.abs(xi - expected)) < 10 * D * U * lr * 4
    assert np.linalg.norm(w.T @ xi + xi.T @ w) < 10 * D * U * lr * 4


def test_riemannian_adam_transports_moment():
    st, w, grads = _problem()
    opt = optim.riemannian_adam(0.05)
    state = opt.init(st, w)
    _, pre = opt.update(st, w, grads[0], state)
    y, post = opt.step(st, w, grads[0], state)
    m_pre, m_post = _adam_state(pre).m, _adam_state(post).m
    # The stored first moment is P_Y(m): tangent at the new point (one projection's rounding).
    assert np.max(np.abs(m_post - _proj(y, m_pre))) < 10 * D * U * 8
    assert np.linalg.norm(y.T @ m_post + m_post.T @ y) < 10 * D * U * 8
    assert _adam_state(post).count == 1


def test_product_frames_have_separate_moments():
    """Per-frame √v: scaling one factor's gradient leaves both first steps unchanged; with one
    shared moment the steps are −lr·g_i/RMS(g_1, g_2) (closed form at t = 1, ε = 0)."""
    rng = np.random.default_rng(2)
    lr = 0.05
    p = ref.Product(ref.Stiefel(5, 2), ref.Stiefel(4, 3))
    x = p.random_point(rng)
    g = (rng.standard_normal((5, 2)), rng.standard_normal((4, 3)))
    g_scaled = (1e3 * g[0], g[1])
    opt = optim.riemannian_adam(lr, eps=0.0)
    xi, _ = opt.update(p, x, g, opt.init(p, x))
    xi_s, _ = opt.update(p, x, g_scaled, opt.init(p, x))
    # The scaled frame's step is homogeneous (≲ 20 roundings, relative to |ξ_ij| ≤ 4·lr), the
    # other frame's is computed identically: < 100·U·4·lr.
    for a, b in zip(xi, xi_s, strict=True):
        assert np.max(np.abs(a - b)) < 100 * U * lr * 4
    shared = ref.Product(*p.factors, shared_moment=True)
    xi_sh, _ = opt.update(shared, x, g_scaled, opt.init(shared, x))
    rg = [_proj(xi_, gi) for xi_, gi in zip(x, g_scaled, strict=True)]
    rms = np.sqrt(np.mean(np.concatenate([a.ravel() for a in rg]) ** 2))
    # |ξ_ij| ≤ lr·max|P_W(G)|/RMS ≤ lr·4e3/RMS; ≲ 100 roundings relative (two RMS of 22 terms).
    for a, b in zip(xi_sh, rg, strict=True):
        assert np.max(np.abs(a - (-lr * b / rms))) < 100 * U * lr * 1e3 * 4 / rms


# -- weight decay on frames (RA-5) -------------------------------------------------------------
def _decay_pair(decay, lam=0.2, lr=0.05):
    st, w, grads = _problem(steps=3)
    plain = optim.riemannian_adam(lr)
    decayed = optim.riemannian_adam(lr, weight_decay=lam, decay=decay)
    return st, w, grads, plain, decayed, lr * lam


@pytest.mark.parametrize("decay", ["coupled", "after"])
def test_frame_decay_does_nothing(decay):
    st, w, grads, plain, decayed, _ = _decay_pair(decay)
    with pytest.warns(optim.FrameDecayWarning, match="RA-5"):
        xs_d, _, _ = _run(decayed, st, w, grads)
    xs_p, _, _ = _run(plain, st, w, grads)
    # coupled: P_W(λW) = λW(I − WᵀW) ≈ λ·r·U, amplified by 1/√v̂ ≈ 1 and lr;
    # after: polar(c·polar(W + ξ)) = polar(W + ξ) up to refactoring (≤ 10·d·U per step).
    for a, b in zip(xs_d, xs_p, strict=True):
        assert np.max(np.abs(a - b)) < 3 * 10 * D * U * 2


def test_frame_decay_fused_inflates_step():
    st, w, grads, plain, decayed, lr_lam = _decay_pair("fused")
    with pytest.warns(optim.FrameDecayWarning, match="inflates"):
        state = decayed.init(st, w)
    xi, _ = plain.update(st, w, grads[0], plain.init(st, w))
    y, _ = decayed.step(st, w, grads[0], state)
    # polar((1 − lr·λ)W + ξ) = polar(W + ξ/(1 − lr·λ)) exactly; SciPy's polar of the right-hand
    # side, κ ≤ 1.5: both ≲ 10·d·κ²·U, rounded up to 1e-13.
    assert np.max(np.abs(y - _polar(w + xi / (1 - lr_lam)))) < 1e-13
    # It is not the undecayed step (the difference is O(lr·λ·‖ξ‖) ≈ 1e-3 here).
    assert np.max(np.abs(y - _polar(w + xi))) > 1e-5


def test_no_frame_warning_without_decay():
    st, w, _ = _problem()
    with _no_frame_warning():
        optim.riemannian_adam(0.05, weight_decay=0.0, decay="fused").init(st, w)


@pytest.mark.parametrize("decay", ["coupled", "after", "fused"])
def test_euclidean_decay_acts_and_does_not_warn(decay):
    """Plain SGD with decay on R^n: closed forms, and no FrameDecayWarning."""
    rng = np.random.default_rng(3)
    e = ref.Euclidean(5)
    x, g = rng.standard_normal(5), rng.standard_normal(5)
    lr, lam = 0.1, 0.5
    opt = optim.Optimizer(optim.chain(optim.scale(-lr)), lr, weight_decay=lam, decay=decay)
    with _no_frame_warning():
        state = opt.init(e, x)
        optim.riemannian_adam(lr, weight_decay=lam, decay=decay).init(e, x)
    y, _ = opt.step(e, x, g, state)
    expected = {
        "coupled": x - lr * (g + lam * x),
        "after": (1 - lr * lam) * (x - lr * g),
        "fused": (1 - lr * lam) * x - lr * g,
    }[decay]
    assert np.max(np.abs(y - expected)) < 8 * U * 4  # ≤ 4 roundings of numbers below ~4


def test_adamw_no_frame_warning():
    e = ref.Euclidean(3)
    with _no_frame_warning():
        optim.adamw(weight_decay=0.1).init(e, np.ones(3))
