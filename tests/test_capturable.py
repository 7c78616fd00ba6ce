"""``RiemannianAdam(capturable=True)``: the step with no host synchronisation.

Its frames follow the eager step (and so the reference) to float64 rounding, ``torch.compile``
traces it as one graph (``fullgraph=True`` fails on any graph break, so on any host
synchronisation) whose steps equal the eager ones to rounding, a non-finite gradient changes
nothing, float32 frames keep on St(d, r), and what it cannot take it refuses by name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import reference as ref  # noqa: E402
import torch_port as tp  # noqa: E402
from proofs_checks.bounds import step_error  # noqa: E402
from torch_port import deferred  # noqa: E402
from torch_port.optim import capturable  # noqa: E402

D, R, RADIUS, LR = 16, 4, 0.5, 1e-2


def _model(dtype=torch.float64, seed: int = 0) -> list:
    """Two frame parameters of one shape (batched together), one of another, a plain one."""
    g = torch.Generator().manual_seed(seed)
    st = tp.Stiefel(D, R)
    return [
        torch.nn.Parameter(st.random_point(g, (3,), dtype=dtype)),
        torch.nn.Parameter(st.random_point(g, (2, 2), dtype=dtype)),
        torch.nn.Parameter(tp.Stiefel(D, 2).random_point(g, (2,), dtype=dtype)),
        torch.nn.Parameter(torch.randn(5, 3, generator=g, dtype=dtype)),
    ]


def _optimizer(params: list, cap: bool, lr=LR, **kw):
    return tp.RiemannianAdam(
        [{"params": params[:3], "geometry": "stiefel"}, {"params": params[3:]}],
        lr=lr,
        trust_radius=RADIUS,
        weight_decay=0.01,
        capturable=cap,
        **kw,
    )


def _grads(params: list, k: int) -> None:
    g = torch.Generator().manual_seed(100 + k)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


def _run(cap: bool, steps: int, compiled: bool = False) -> tuple[list, object]:
    params = _model()
    opt = _optimizer(params, cap)
    step = torch.compile(opt.step, fullgraph=True) if compiled else opt.step
    for k in range(steps):
        _grads(params, k)
        step()
    return params, opt


def test_the_capturable_step_is_the_eager_step_in_float64():
    """100 steps: frames within 100·step_error(16, 4) of the eager step's (the per-step
    rounding bound of both, accumulated without amplification: 1.2e-11; measured ~1e-15),
    plain parameters within 100 steps of a few ulps of AdamW's (1e-13)."""
    eager, _ = _run(False, 100)
    fused, opt = _run(True, 100)
    for a, b in zip(eager[:3], fused[:3], strict=True):
        assert (a - b).abs().max().item() <= 100 * step_error(D, R)
    assert (eager[3] - fused[3]).abs().max().item() <= 1e-13
    assert int(opt.skipped_on_device) == 0
    assert int(opt.state[fused[0]]["step"]) == 100


def test_the_capturable_step_follows_the_reference():
    """One frame, 20 steps, against ``reference.optim.riemannian_adam`` with the same trust
    radius: within 20·step_error(16, 4)."""
    g = torch.Generator().manual_seed(3)
    w = torch.nn.Parameter(tp.Stiefel(D, R).random_point(g, dtype=torch.float64))
    x = w.detach().numpy().copy()
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}], lr=LR, trust_radius=0.05, capturable=True
    )
    ro = ref.optim.riemannian_adam(LR, trust_radius=0.05)
    geo = ref.Stiefel(D, R)
    state = ro.init(geo, x)
    for k in range(20):
        grad = torch.randn(D, R, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
        w.grad = grad
        opt.step()
        x, state = ro.step(geo, x, grad.numpy(), state)
    assert np.abs(w.detach().numpy() - x).max() <= 20 * step_error(D, R)


def test_torch_compile_traces_the_step_as_one_graph():
    """``torch.compile(opt.step, fullgraph=True)`` (fails on a graph break, hence on a host
    synchronisation): 3 compiled steps equal 3 eager capturable steps within 3·step_error."""
    compiled, _ = _run(True, 3, compiled=True)
    eager, _ = _run(True, 3)
    for a, b in zip(eager, compiled, strict=True):
        assert (a - b).abs().max().item() <= 3 * step_error(D, R)


def test_a_non_finite_gradient_changes_nothing():
    params = _model()
    opt = _optimizer(params, True)
    _grads(params, 0)
    opt.step()
    before = [p.detach().clone() for p in params]
    states = {i: {k: v.clone() for k, v in opt.state[p].items()} for i, p in enumerate(params)}
    _grads(params, 1)
    params[1].grad[0, 1, 2, 3] = float("nan")
    opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, params, strict=True))
    for i, p in enumerate(params):
        assert all(torch.equal(v, opt.state[p][k]) for k, v in states[i].items())
    assert int(opt.skipped_on_device) == 1
    _grads(params, 2)
    opt.step()  # the next finite step proceeds
    assert not torch.equal(before[0], params[0]) and int(opt.state[params[0]]["step"]) == 2


def test_float32_frames_stay_on_the_manifold():
    """2000 steps of float32 frames: ‖WᵀW − I‖ ≤ 5e-6 (the Gram is formed in float64 and the
    series truncates below float64's rounding, so the drift is the float32 rounding of one
    step, not a sum over steps)."""
    g = torch.Generator().manual_seed(1)
    w = torch.nn.Parameter(tp.Stiefel(64, 16).random_point(g, (4,), dtype=torch.float32))
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}], lr=LR, trust_radius=RADIUS, capturable=True
    )
    for _ in range(2000):
        w.grad = torch.randn(w.shape, generator=g)
        opt.step()
    assert tp.linalg.orthonormality_residual(w.detach()).max().item() <= 5e-6


def test_the_state_moves_between_the_capturable_and_the_eager_step():
    """The same state layout: 5 capturable steps, then the state loaded into an eager
    optimizer, then 5 more steps, equal 10 capturable steps to rounding."""
    params, opt = _run(True, 5)
    eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    eager = _optimizer(eager_params, False)
    sd = opt.state_dict()
    for group in sd["param_groups"]:
        group["capturable"] = False
    eager.load_state_dict(sd)
    for k in range(5, 10):
        _grads(eager_params, k)
        eager.step()
    straight, _ = _run(True, 10)
    for a, b in zip(eager_params[:3], straight[:3], strict=True):
        assert (a - b).abs().max().item() <= 10 * step_error(D, R)


def test_the_series_degree_truncates_below_float64_rounding(monkeypatch):
    """At ‖E‖₂ = δ = Δ² + η for Δ = 0.7 (the largest radius taken): A = W Q diag(√μ) Qᵀ with
    the eigenvalues μ of AᵀA spread over [1 − δ, 1 + δ] (so α = 1 and E's eigenvalues reach
    ±δ). The series the step takes for Δ (``polar_series``: the degree for ``series_bound``)
    gives polar(A) within 1e-14 of the eigendecomposition's (truncation ≤ 1e-17, the rest
    float64 rounding at κ = 1.7); the degree for Δ²/2 + η leaves a truncation of about 1e-10
    (the control)."""
    g = torch.Generator().manual_seed(5)
    w = tp.Stiefel(D, R).random_point(g, (4,), dtype=torch.float64)
    delta = 0.7**2 + capturable.DRIFT_SLACK
    q = torch.linalg.qr(torch.randn(4, R, R, generator=g, dtype=torch.float64))[0]
    mu = torch.linspace(1.0 - delta, 1.0 + delta, R, dtype=torch.float64)
    a = w @ (q * torch.sqrt(mu)) @ q.transpose(-1, -2)
    exact = tp.linalg.polar(a)
    assert (capturable.polar_series(a, 0.7) - exact).abs().max().item() <= 1e-14
    monkeypatch.setattr(capturable, "series_bound", lambda r: r**2 / 2 + capturable.DRIFT_SLACK)
    assert (capturable.polar_series(a, 0.7) - exact).abs().max().item() > 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_step_is_captured_in_a_cuda_graph():
    """Warm-up steps on a side stream, one captured step, three replays: the step count and
    the frames of three more eager capturable steps."""
    params = [torch.nn.Parameter(p.detach().cuda()) for p in _model()]
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, ref_opt = _optimizer(params, True), _optimizer(twin, True)
    for p in params + twin:
        p.grad = torch.zeros_like(p)

    def new_gradients() -> None:  # in place: the captured step reads these tensors
        for p, t in zip(params, twin, strict=True):
            p.grad.normal_()
            t.grad.copy_(p.grad)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            new_gradients()
            opt.step()
            ref_opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for _ in range(3):
        new_gradients()
        graph.replay()
        ref_opt.step()
    torch.cuda.synchronize()
    assert int(opt.state[params[0]]["step"]) == 6
    for a, b in zip(params, twin, strict=True):
        assert (a - b).abs().max().item() <= 6 * step_error(D, R)


class _NoHostReads(TorchDispatchMode):
    """Raises on every read of a tensor's value by the host: ``.item()``, ``float(t)``,
    ``bool(t)`` and a Python ``if`` on a tensor all dispatch ``aten._local_scalar_dense``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            raise AssertionError("the step read a tensor's value on the host")
        return func(*args, **(kwargs or {}))


def _step_reads_the_host(opt) -> bool:
    try:
        with _NoHostReads():
            opt.step()
    except AssertionError:
        return True
    return False


def test_the_step_never_reads_a_tensor_on_the_host(monkeypatch):
    """Steps 2 and 3 from a fresh optimizer under a dispatch mode that refuses host reads (the
    first, which creates the state, checks each new point on its manifold on the host, as the
    eager step does); ``.tolist()`` does not dispatch, so the module is also free
    of it. Control: the same step reading its step count with ``.item()``, as the eager step
    does."""
    params = _model()
    opt = _optimizer(params, True)
    _grads(params, 0)
    opt.step()
    for k in range(1, 3):
        _grads(params, k)
        assert not _step_reads_the_host(opt)
    assert ".tolist(" not in Path(capturable.__file__).read_text(encoding="utf-8")
    real = capturable.step_numbers

    def reads_the_count(states, frames):
        t = real(states, frames)
        return t + 0 * t.reshape(-1)[0].item()

    monkeypatch.setattr(capturable, "step_numbers", reads_the_count)
    assert _step_reads_the_host(opt)


def test_frames_batched_together_keep_their_own_step_counts():
    """Two parameters of one shape, the second without a gradient for its first 3 steps: each
    frame's bias corrections use its own count, as two separate capturable optimizers do."""
    g = torch.Generator().manual_seed(7)
    start = [tp.Stiefel(D, R).random_point(g, (2,), dtype=torch.float64) for _ in range(2)]
    grads = [torch.randn(2, D, R, generator=g, dtype=torch.float64) for _ in range(12)]
    together = [torch.nn.Parameter(s.clone()) for s in start]
    apart = [torch.nn.Parameter(s.clone()) for s in start]
    opt = tp.RiemannianAdam(
        [{"params": together, "geometry": "stiefel"}], lr=LR, trust_radius=RADIUS, capturable=True
    )
    opts = [
        tp.RiemannianAdam(
            [{"params": [p], "geometry": "stiefel"}], lr=LR, trust_radius=RADIUS, capturable=True
        )
        for p in apart
    ]
    for k in range(6):
        for i, (a, b) in enumerate(zip(together, apart, strict=True)):
            has = i == 0 or k >= 3
            a.grad = grads[2 * k + i].clone() if has else None
            b.grad = grads[2 * k + i].clone() if has else None
        opt.step()
        for o, b in zip(opts, apart, strict=True):
            if b.grad is not None:
                o.step()
    assert [int(opt.state[p]["step"]) for p in together] == [6, 3]
    for a, b in zip(together, apart, strict=True):
        assert (a - b).abs().max().item() <= 6 * step_error(D, R)


def test_a_state_of_the_wrong_layout_is_refused_before_anything_changes():
    """A plain parameter's moment replaced by one of another shape (the second plain
    parameter, so the first would already have been written by a step that checked as it
    went): ValueError naming the layout, and every parameter and state as it was."""
    params = _model()
    extra = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    opt = tp.RiemannianAdam(
        [{"params": params[:3], "geometry": "stiefel"}, {"params": [params[3], extra]}],
        lr=LR,
        trust_radius=RADIUS,
        capturable=True,
    )
    for k in range(2):
        _grads([*params, extra], k)
        opt.step()
    opt.state[extra]["exp_avg"] = torch.zeros(5, dtype=torch.float64)
    before = [p.detach().clone() for p in params]
    _grads([*params, extra], 2)
    with pytest.raises(ValueError, match="capturable=True expects"):
        opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, params, strict=True))


def _graphs_of_a_scheduled_run(lr, gamma: float) -> tuple[int, list]:
    """Graphs compiled over 4 steps with StepLR(γ) after each (the step compiled before the
    scheduler wraps it), and the parameters reached."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    params = _model()
    opt = _optimizer(params, True, lr=lr)
    step = torch.compile(opt.step, fullgraph=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=gamma)
    for k in range(4):
        _grads(params, k)
        step()
        sched.step()
    return counters["stats"]["unique_graphs"], params


def test_a_tensor_lr_changes_under_a_scheduler_without_recompiling():
    """With lr a 0-d tensor the scheduler's in-place fill_ reaches the compiled step: four
    learning rates cost no more graphs than one (the first step, which creates the state, and
    the later ones), while a float lr that Dynamo specialises on (``specialize_float=True``)
    compiles again for each new value (the negative control: the count sees recompilations).
    The scheduled steps equal eager steps with the same float learning rates within
    4·step_error."""
    constant, _ = _graphs_of_a_scheduled_run(torch.tensor(LR, dtype=torch.float64), 1.0)
    scheduled, params = _graphs_of_a_scheduled_run(torch.tensor(LR, dtype=torch.float64), 0.5)
    with torch._dynamo.config.patch(specialize_float=True):
        floats, _ = _graphs_of_a_scheduled_run(LR, 0.5)
    assert scheduled == constant and floats > constant, (constant, scheduled, floats)
    eager = _model()
    opt = _optimizer(eager, True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for k in range(4):
        _grads(eager, k)
        opt.step()
        sched.step()
    for a, b in zip(params, eager, strict=True):
        assert float((a - b).abs().max()) <= 4 * step_error(D, R)


@pytest.mark.parametrize(
    ("lr", "cap", "message"),
    [
        (torch.tensor([1e-2]), True, "0-d floating tensor"),
        (torch.tensor(1), True, "0-d floating tensor"),
        (torch.tensor(-1e-2), True, "lr must be a finite number ≥ 0"),
        (torch.tensor(float("nan")), True, "lr must be a finite number ≥ 0"),
    ],
)
def test_a_tensor_lr_is_checked(lr, cap, message):
    with pytest.raises(ValueError, match=message):
        _optimizer(_model(), cap, lr=lr)


def _half_frames(grads: list[float]) -> tuple:
    """A float16 St(16, 4) parameter of len(grads) frames, frame i with gradient grads[i]·Z
    (capturable optimizer, lr 1e-2: its step factor lr/((1 − β1)ε) = 1e7 exceeds float16's
    largest value 65504 wherever √v = 0)."""
    g = torch.Generator().manual_seed(11)
    w = torch.nn.Parameter(tp.Stiefel(D, R).random_point(g, (len(grads),), dtype=torch.float16))
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}], lr=1e-2, trust_radius=RADIUS, capturable=True
    )
    scale = torch.tensor(grads, dtype=torch.float32)[:, None, None]
    w.grad = (torch.randn(w.shape, generator=g) * scale).to(torch.float16)
    return w, opt


def test_a_half_precision_frame_with_a_zero_gradient_steps(monkeypatch):
    """A frame whose gradient is zero (√v = 0, so the step factor overflows float16) beside one
    that moves: the step is taken (the branch-free ratio route rescales u by powers of two, as
    the eager step does where it must), the zero-gradient frame stays within one float16 ulp in
    [½, 1) (2⁻¹¹) of where it was, the other moves, both on St(16, 4). Control: the fast route
    taken on the device with its failure skipping the step skips this one."""
    w, opt = _half_frames([0.0, 1.0])
    before = w.detach().clone()
    opt.step()
    assert int(opt.skipped_on_device) == 0 and int(opt.state[w]["step"]) == 1
    assert (w.detach()[0] - before[0]).abs().max().item() <= 2.0**-11
    assert (w.detach()[1] - before[1]).abs().max().item() > 1e-3
    assert tp.linalg.orthonormality_residual(w.detach()).max().item() <= 1e-2
    monkeypatch.setattr(deferred, "fast", deferred.holds)
    w, opt = _half_frames([0.0, 1.0])
    opt.step()
    assert int(opt.skipped_on_device) == 1


def test_a_gradient_whose_projection_overflows_skips_the_step():
    """A float16 gradient 4e4·sign(W) (finite) makes the diagonal of WᵀG, 4e4·Σ|W_ij|, overflow
    float16: the eager step rescales it, the capturable step skips (documented), changing
    nothing and counting the skip."""
    w, opt = _half_frames([1.0, 1.0])
    w.grad = 4e4 * torch.sign(w.detach())
    assert bool(torch.isfinite(w.grad).all())
    assert not bool(torch.isfinite(w.detach().transpose(-1, -2) @ w.grad).all())
    before = w.detach().clone()
    opt.step()
    assert int(opt.skipped_on_device) == 1 and torch.equal(w.detach(), before)
    eager = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}], lr=1e-2, trust_radius=RADIUS
    )
    eager.step()
    assert not torch.equal(w.detach(), before)


def test_half_precision_tensors_whose_entries_sum_beyond_65504_step():
    """A float16 plain parameter of 70,000 entries and a float16 frame batch of 2048 St(16, 4)
    frames, every gradient entry about 1: their sums (and the batch's WᵀG summed) exceed
    float16's largest value 65504 although every entry is far below it. The finiteness sums
    are accumulated in float64, so the step is taken, as the eager step takes it. Control: the
    sums taken in float16 (as ``Tensor.sum`` does by default) skip it."""
    g = torch.Generator().manual_seed(2)
    w = torch.nn.Parameter(tp.Stiefel(D, R).random_point(g, (2048,), dtype=torch.float16))
    b = torch.nn.Parameter(torch.zeros(70_000, dtype=torch.float16))

    def step() -> tuple:
        opt = tp.RiemannianAdam(
            [{"params": [w], "geometry": "stiefel"}, {"params": [b], "eps": 1e-4}],
            lr=1e-3,
            trust_radius=RADIUS,
            capturable=True,
        )
        w.grad = (0.6 + 0.1 * torch.randn(w.shape, generator=g)).to(torch.float16)
        b.grad = torch.ones_like(b)
        before = (w.detach().clone(), b.detach().clone())
        opt.step()
        return opt, before

    opt, (w0, b0) = step()
    assert int(opt.skipped_on_device) == 0
    assert not torch.equal(w.detach(), w0) and not torch.equal(b.detach(), b0)
    real_sum = torch.Tensor.sum

    def half_sums(t, *args, dtype=None, **kw):
        return real_sum(t, *args, **kw)  # the dtype argument dropped: summed in float16

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "sum", half_sums)
        opt, _ = step()
    assert int(opt.skipped_on_device) == 1


def test_a_plain_group_with_maximize_ascends_as_the_eager_step():
    """maximize=True on a plain group: the capturable AdamW ascends, equal to the eager step's
    (``torch.optim.adamw``) within a few ulps over 5 steps."""
    runs = []
    for cap in (False, True):
        b = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
        opt = tp.RiemannianAdam([{"params": [b]}], lr=0.1, maximize=True, capturable=cap)
        for _ in range(5):
            b.grad = torch.ones_like(b)
            opt.step()
        runs.append(b.detach().clone())
    assert bool((runs[1] > 0.4).all())  # five ascending steps of about lr each
    assert (runs[0] - runs[1]).abs().max().item() <= 1e-15


def test_a_float32_tensor_lr_steps_float64_plain_parameters_as_its_value():
    """A float32 0-d tensor lr (torch's default dtype) with float64 plain parameters and weight
    decay: the capturable AdamW takes the lr in float64, as the eager step takes its value, so
    the two agree within a few float64 ulps (a decay factor 1 − lr·λ formed in float32 would
    leave them 1e-7 apart)."""
    runs = []
    for cap in (False, True):
        b = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
        opt = tp.RiemannianAdam(
            [{"params": [b]}], lr=torch.tensor(1e-2), weight_decay=0.01, capturable=cap
        )
        for k in range(4):
            b.grad = torch.full_like(b, 0.1 * (k + 1))
            opt.step()
        runs.append(b.detach().clone())
    assert (runs[0] - runs[1]).abs().max().item() <= 1e-15
