"""The Stiefel frame step's own arithmetic (``torch_port.stiefel.StiefelFrames``): the Gram of
W + ξ in the frames' dtype, and the d×r buffers kept between steps.

Bounds. A float32 Gram AᵀA of a d×r matrix differs from the exact one by
‖E‖_F ≤ γ_d(u₃₂)·‖A‖_F² (a dot product of length d has absolute error ≤ γ_d Σ|a_i b_i|, and
‖|A|ᵀ|A|‖_F ≤ ‖A‖_F²; Higham, *Accuracy and Stability of Numerical Algorithms*, §3.5); the
exact H = (AᵀA + E)^{-1/2} gives (AH)ᵀ(AH) − I = −HEH, which float64 evaluates to within
(d + 3r)·r·u₆₄·‖A‖₂²‖H‖₂² (the products A·H, (AH)ᵀ(AH) and H·E·H, each ≤ γ_k ‖·‖‖·‖).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from proofs_checks.bounds import gamma  # noqa: E402
from torch_port import linalg as tl  # noqa: E402
from torch_port.stiefel import StiefelFrames  # noqa: E402

U32 = torch.finfo(torch.float32).eps / 2


def _frames(d, r, batch, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return tp.Stiefel(d, r).random_point(gen, batch, dtype=dtype), gen


@pytest.mark.parametrize("d, r", [(64, 16), (768, 64), (5, 5), (7, 1)])
def test_working_gram_of_float32_is_within_its_bound(d, r):
    w, gen = _frames(d, r, (6,))
    a = w + 0.1 * torch.randn(w.shape, generator=gen)
    exact = tl.gram64(a)
    err = tl.frobenius(tl.working_gram(a) - exact)
    bound = gamma(d, U32) * tl.frobenius(a.double()) ** 2
    assert bool((err <= bound).all()), (err.max(), bound.min())
    assert float(err.max()) > 0  # it is the float32 product, not an upcast one


def test_working_gram_dtypes():
    w, _ = _frames(32, 8, (3,), dtype=torch.float64)
    assert torch.equal(tl.working_gram(w), tl.gram64(w))  # float64: the same product
    half = w.to(torch.bfloat16)
    assert torch.equal(tl.working_gram(half), tl.gram64(half))  # half: upcast to float64
    assert tl.gram_dtype(torch.float32) == torch.float32
    assert tl.gram_dtype(torch.float16) == torch.float64


def test_polar_with_an_inexact_gram_leaves_exactly_minus_heh():
    """(AH)ᵀ(AH) − I = −HEH for the H that ``polar_plan`` makes from a given Gram AᵀA + E,
    whatever A's drift: the identity behind PORT-2's bound (module docstring; H is within
    the series' 1e-17 of (AᵀA + E)^{-1/2}). Control: the same with E's sign flipped is off."""
    gen = torch.Generator().manual_seed(1)
    d, r = 40, 6
    w, _ = _frames(d, r, (3,), seed=1, dtype=torch.float64)
    a = w + 0.05 * torch.randn(w.shape, generator=gen, dtype=torch.float64)
    e = tl.sym(torch.randn(3, r, r, generator=gen, dtype=torch.float64)) * 1e-3
    h, full = tl.polar_plan(a, gram=tl.gram64(a) + e)
    assert full is None  # the Taylor route, the one that takes a given Gram
    y = a @ h
    lhs = tl.transpose(y) @ y - tl.eye_like(y)
    bound = (
        (d + 3 * r)
        * r
        * gamma(1)
        * float((torch.linalg.matrix_norm(a, 2) ** 2 * torch.linalg.matrix_norm(h, 2) ** 2).max())
    )
    assert float(tl.frobenius(lhs + h @ e @ h).max()) <= bound + 1e-16
    assert float(tl.frobenius(lhs - h @ e @ h).min()) > 1e6 * bound


def test_a_given_gram_off_the_float32_scale_is_formed_again_in_float64():
    """A float32 Gram of entries near 1e-20 has underflowed products: ``polar_plan`` forms the
    float64 Gram again (trace outside (1e-30, 1e30)), and the factor is orthonormal to float32
    rounding (it was 2.5e-4 off when the float32 Gram was used)."""
    w, _ = _frames(64, 8, (2,))
    a = w * 1e-20
    h, full = tl.polar_plan(a, gram=tl.working_gram(a))
    y = full if h is None else a @ h
    assert float(tl.orthonormality_residual(y).max()) <= 4 * 8 * 9 * U32 + 2 * 72 * 8 * U32


def test_the_retraction_of_float32_frames_uses_their_float32_gram(monkeypatch):
    """The step's polar factor takes its Gram from ``working_gram`` of A = W + c·m, formed in
    float32 (the route PORT-2 bounds), not the float64 Gram of ``linalg.polar``."""
    seen = []
    original = tl.working_gram

    def spy(a):
        seen.append(a.dtype)
        return original(a)

    monkeypatch.setattr(tl, "working_gram", spy)
    w0, gen = _frames(16, 4, (3,))
    w = torch.nn.Parameter(w0)
    opt = _adam(w)
    w.grad = torch.randn(w.shape, generator=gen)
    opt.step()
    assert seen == [torch.float32]
    assert tl.gram_dtype(torch.float32) == torch.float32


def test_a_work_buffer_held_by_a_pending_step_is_not_reused():
    """Two retractions at one storage before either is committed (parameters that share
    memory): the second gets a new buffer, the first's A is intact."""
    w, gen = _frames(12, 3, (2,))
    frames = StiefelFrames(tp.Stiefel(12, 3))
    u = tuple(tp.Stiefel(12, 3).proj(w, torch.randn(w.shape, generator=gen)) for _ in range(2))
    c = torch.full((2,), 0.1)
    (first,) = frames.retract_scaled((w,), (u[0],), c)
    kept = first.a.clone()
    (second,) = frames.retract_scaled((w,), (u[1],), c)
    assert second.a.data_ptr() != first.a.data_ptr()
    assert torch.equal(first.a, kept)
    del first, second  # now nothing holds it: the next retraction reuses the kept buffer
    (third,) = frames.retract_scaled((w,), (u[0],), c)
    assert torch.equal(third.a, kept)


def test_loading_a_state_that_shares_tensors_with_the_optimizer_stays_exact():
    """torch's ``load_state_dict`` keeps the caller's tensors: a shallow snapshot loaded back
    may hold the tensor kept for the next gradient. The loaded run must equal one loaded from a
    deep copy (the buffers are dropped at load)."""
    import copy

    def run(deep):
        w0, gen = _frames(20, 4, (2,))
        w = torch.nn.Parameter(w0.clone())
        opt = _adam(w)
        grads = [torch.randn(w.shape, generator=gen) for _ in range(4)]
        for g in grads[:2]:
            w.grad = g.clone()
            opt.step()
        sd = opt.state_dict()
        snap = (
            copy.deepcopy(sd)
            if deep
            else {
                "state": {k: dict(v) for k, v in sd["state"].items()},
                "param_groups": sd["param_groups"],
            }
        )
        point = w.detach().clone()
        w.grad = grads[2].clone()
        opt.step()
        with torch.no_grad():
            w.copy_(point)
        opt.load_state_dict(snap)
        w.grad = grads[3].clone()
        opt.step()
        return w.detach(), opt.state[w]["exp_avg"]

    for a, b in zip(run(False), run(True), strict=True):
        assert torch.equal(a, b)


def _adam(w, **kw):
    return tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2, **kw)


def test_steps_reuse_two_moment_buffers_and_one_work_buffer():
    """From the third step on no d×r tensor is made: the new moment goes into the one the
    state dropped a step before, and W + c·m into the point's work buffer."""
    w0, gen = _frames(48, 8, (5,))
    w = torch.nn.Parameter(w0.clone())
    opt = _adam(w)
    frames = opt._geometries.stiefel(opt.param_groups[0], w)
    moments, works = [], []
    for _ in range(6):
        w.grad = torch.randn(w.shape, generator=gen)
        opt.step()
        moments.append(opt.state[w]["exp_avg"].data_ptr())
        works.append(frames._work[frames._slot(w.detach())][0].data_ptr())
    assert len(set(moments[1:])) == 2 and moments[1] == moments[3] == moments[5]
    assert len(set(works)) == 1


def _polar_plan_failing_for(shape):
    """``linalg.polar_plan`` that raises for a matrix batch of ``shape`` (a retraction refusing
    one point's input)."""
    original = tl.polar_plan

    def failing(a, *args, **kwargs):
        if a.shape == shape:
            raise ValueError("polar factor of a rank-deficient matrix (injected)")
        return original(a, *args, **kwargs)

    return failing


def _run(w0, grads, monkeypatch=None, fail_at=None):
    w = torch.nn.Parameter(w0.clone())
    v = torch.nn.Parameter(w0.clone()[:2])
    opt = tp.RiemannianAdam([{"params": [w, v], "geometry": "stiefel"}], lr=1e-2, trust_radius=0.3)
    for k, g in enumerate(grads):
        w.grad, v.grad = g.clone(), g[:2].clone()
        if k == fail_at:  # the second point's polar factor raises: nothing may change
            before = (w.detach().clone(), opt.state[w]["exp_avg"].clone())
            with monkeypatch.context() as patch:
                patch.setattr(tl, "polar_plan", _polar_plan_failing_for(v.shape))
                with pytest.raises(ValueError, match="injected"):
                    opt.step()
            assert torch.equal(w.detach(), before[0])
            assert torch.equal(opt.state[w]["exp_avg"], before[1])
        opt.step()
    return w.detach(), v.detach(), opt.state[w]["exp_avg"]


def test_a_step_that_fails_after_computing_changes_nothing_and_corrupts_no_buffer(monkeypatch):
    """The first point's new moment and work buffer are made, then the second point's
    retraction raises: the parameters and states are as before, and the steps after it are
    bitwise those of a run that never failed (no buffer still held by the dead step is
    written into a live state)."""
    w0, gen = _frames(24, 4, (3,))
    grads = [torch.randn(w0.shape, generator=gen) for _ in range(6)]
    clean = _run(w0, grads)
    failed = _run(w0, grads, monkeypatch, fail_at=3)
    for a, b in zip(clean, failed, strict=True):
        assert torch.equal(a, b)


def test_a_state_tensor_shared_with_the_parameter_is_not_recycled():
    w0, _ = _frames(10, 3, ())
    frames = StiefelFrames(tp.Stiefel(10, 3))
    frames.recycle((w0,), w0)
    assert not frames._spare
    frames.recycle((w0,), torch.zeros(10, 3, dtype=torch.float64))  # another dtype
    assert not frames._spare
    frames.recycle((w0,), torch.zeros(10, 3))
    assert len(frames._spare) == 1
    meta = torch.empty(10, 3, device="meta")  # off the CPU nothing is kept (caching allocators)
    frames.recycle((meta,), torch.empty(10, 3, device="meta"))
    assert len(frames._spare) == 1


def _float32_drift(d, r, frames, steps, lr):
    w0, gen = _frames(d, r, (frames,))
    w = torch.nn.Parameter(w0)
    opt = _adam(w)
    opt.param_groups[0]["lr"] = lr
    worst = 0.0
    for k in range(steps):
        w.grad = torch.randn(w.shape, generator=gen)
        opt.step()
        if k % 50 == 49:
            worst = max(worst, float(tl.orthonormality_residual(w.detach()).max()))
    return worst


def test_float32_drift_at_attention_size():
    """W_Q-sized float32 frames (768×64), 1,000 steps of Adam at lr 1e-3 with Gaussian
    gradients: ‖WᵀW − I‖ ≤ 5e-6 (the float32 Gram's error, measured ≈ 2e-6; it does not add
    up over steps: PORT-2)."""
    assert _float32_drift(768, 64, 4, 1000, 1e-3) <= 5e-6


@pytest.mark.slow
def test_float32_drift_at_attention_size_over_10000_steps():
    assert _float32_drift(768, 64, 12, 10_000, 1e-3) <= 5e-6


@pytest.mark.parametrize("degree", range(20))
def test_the_taylor_evaluation_is_the_polynomial_of_its_degree(degree):
    """For E = Q diag(λ) Qᵀ, p_k(E) = Q diag(p_k(λ)) Qᵀ with p_k(x) = Σ_{j≤k} binom(−1/2, j) x^j,
    the coefficients from exact rationals: Paterson–Stockmeyer's blocks (the top one included)
    give that polynomial to float64 rounding, (k + 2)·r·u₆₄ per product on entries ≤ 1.3
    (≤ 1e-13 here). Control: the evaluation one degree lower is off by |binom(−1/2, k)|·0.3^k
    ≥ 1.3e-11 (k ≤ 19)."""
    from fractions import Fraction

    gen = torch.Generator().manual_seed(degree)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    lam = torch.linspace(-0.3, 0.3, 6, dtype=torch.float64)

    def p(k):
        coef, c = [], Fraction(1)
        for j in range(k + 1):
            coef.append(c)
            c = c * (Fraction(-1, 2) - j) / (j + 1)
        values = [
            float(sum(cj * Fraction(float(x)) ** j for j, cj in enumerate(coef))) for x in lam
        ]
        return q @ torch.diag(torch.tensor(values, dtype=torch.float64)) @ q.T

    e = q @ torch.diag(lam) @ q.T
    assert float(tl.frobenius(tl._inv_sqrt_taylor(e, degree) - p(degree))) <= 1e-13
    if degree >= 1:
        assert float(tl.frobenius(tl._inv_sqrt_taylor(e, degree - 1) - p(degree))) > 1e-11


@pytest.mark.parametrize("degree", range(31))
def test_the_series_costs_the_products_it_is_charged(degree):
    """``_paterson_stockmeyer_cost(k)`` is the number of batched products ``_inv_sqrt_taylor``
    makes (counted at the dispatcher), on which the choice between the series and ``eigh``
    rests."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        products = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm_):
                Count.products += 1
            return func(*args, **(kwargs or {}))

    e = tl.sym(torch.randn(2, 4, 4, dtype=torch.float64)) * 0.01
    with Count():
        tl._inv_sqrt_taylor(e, degree)
    assert Count.products == tl._paterson_stockmeyer_cost(degree)[0]


def test_the_largest_entry_of_an_empty_batch_has_the_batch_shape():
    """``max_abs`` of matrices with no entries is 0 per matrix, one value per batch element
    (the reduced dims left out, counted from the end)."""
    assert tl.max_abs(torch.zeros(4, 0, 2)).shape == (4,)
    assert tl.max_abs(torch.zeros(2, 3, 0, 5)).shape == (2, 3)
    assert tl.max_abs(torch.zeros(0, 3, 2)).shape == (0,)
    assert torch.equal(tl.max_abs(torch.zeros(4, 0, 2)), torch.zeros(4))
