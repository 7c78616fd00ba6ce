"""torch.optim's own flags on the four optimizers: every flag torch's AdamW takes is honoured or
refused by name, never ignored (one table of inputs), ``maximize`` ascends on frames and on
plain parameters as torch's AdamW does, and lr = 0 at construction is a warm-up from zero."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402

CLASSES = {
    "RiemannianAdam": lambda params, **kw: tp.RiemannianAdam(params, lr=1e-2, **kw),
    "RiemannianMomentum": lambda params, **kw: tp.RiemannianMomentum(params, lr=1e-2, **kw),
    "RSGD": lambda params, **kw: tp.RSGD(params, lr=1e-2, **kw),
    "NormalizedRSGD": lambda params, **kw: tp.NormalizedRSGD(params, lr=1e-2, **kw),
}


def _frame(seed: int = 0) -> torch.nn.Parameter:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(7, 3, dtype=torch.float64, generator=g))
    return torch.nn.Parameter(q)


def _groups(**flags) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    plain = torch.nn.Parameter(torch.randn(5, dtype=torch.float64, generator=g))
    return [{"params": [_frame()], "geometry": "stiefel", **flags}, {"params": [plain], **flags}]


#: (keyword, value, None when accepted or the message of the ValueError), given to the
#: constructor and as a group key alike.
FLAGS = [
    ("maximize", False, None),
    ("maximize", True, None),
    ("maximize", "yes", "maximize must be True or False, got 'yes'"),
    ("foreach", None, None),
    ("foreach", False, None),
    ("foreach", True, None),
    ("amsgrad", False, None),
    ("amsgrad", True, "amsgrad=True: torch's amsgrad is not implemented"),
    ("fused", None, None),
    ("fused", False, None),
    ("fused", True, "fused=True: torch's fused is not implemented"),
    ("differentiable", False, None),
    ("differentiable", True, "differentiable=True: torch's differentiable is not implemented"),
]


@pytest.mark.parametrize("where", ["constructor", "group"])
@pytest.mark.parametrize(("key", "value", "message"), FLAGS)
@pytest.mark.parametrize("cls", list(CLASSES))
def test_torch_flags_are_honoured_or_refused_by_name(cls, key, value, message, where) -> None:
    make = CLASSES[cls]
    build = (
        (lambda: make(_groups(), **{key: value}))
        if where == "constructor"
        else (lambda: make(_groups(**{key: value})))
    )
    if message is None:
        opt = build()
        assert all(g[key] == value for g in opt.param_groups)
    else:
        with pytest.raises(ValueError, match=message):
            build()


def _one_step(cls: str, sign: float, maximize: bool) -> list[torch.Tensor]:
    params = _groups()
    opt = CLASSES[cls](params, maximize=maximize)
    for group in opt.param_groups:
        for p in group["params"]:
            g = torch.Generator().manual_seed(p.numel())
            p.grad = sign * torch.randn(p.shape, dtype=p.dtype, generator=g)
    opt.step()
    return [p.detach().clone() for g in opt.param_groups for p in g["params"]]


@pytest.mark.parametrize("cls", list(CLASSES))
def test_maximize_is_the_step_of_the_negated_gradient(cls) -> None:
    """A step with maximize=True and gradient G is the step with −G, bit for bit, on the frame
    and on the plain parameter; control: maximize=False with G is another step."""
    ascended = _one_step(cls, 1.0, True)
    negated = _one_step(cls, -1.0, False)
    assert all(torch.equal(a, b) for a, b in zip(ascended, negated, strict=True))
    descended = _one_step(cls, 1.0, False)
    assert not any(torch.equal(a, b) for a, b in zip(ascended, descended, strict=True))


def test_maximize_on_plain_parameters_is_torchs_adamw() -> None:
    w = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ours, theirs = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    a = tp.RiemannianAdam([ours], lr=1e-2, weight_decay=0.1, maximize=True)
    b = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1, maximize=True)
    for t in range(3):
        g = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(t))
        ours.grad, theirs.grad = g.clone(), g.clone()
        a.step()
        b.step()
    assert torch.equal(ours, theirs)


def test_lr_zero_at_construction_is_a_warm_up_from_zero() -> None:
    """torch's schedulers may start from lr = 0 (LinearLR(start_factor=0) after construction,
    or lr=0 given): the first step leaves the frame bit for bit, the next one moves it."""
    frame = _frame()
    start = frame.detach().clone()
    opt = tp.RiemannianAdam([{"params": [frame], "geometry": "stiefel"}], lr=0.0)
    frame.grad = torch.randn(frame.shape, dtype=frame.dtype)
    opt.step()
    assert torch.equal(frame, start)
    opt.param_groups[0]["lr"] = 1e-2
    opt.step()
    assert not torch.equal(frame, start)


@pytest.mark.parametrize("cls", ["RiemannianMomentum", "RSGD", "NormalizedRSGD"])
def test_capturable_as_a_group_key_is_refused_by_name_where_there_is_no_capturable_step(
    cls,
) -> None:
    """Only RiemannianAdam has a capturable step; the other classes refuse the group key by
    name (their constructors have no such argument: torch's TypeError), and take it as False."""
    with pytest.raises(ValueError, match="capturable=True: torch's capturable is not implemented"):
        CLASSES[cls](_groups(capturable=True))
    with pytest.raises(TypeError, match="capturable"):
        CLASSES[cls](_groups(), capturable=True)
    assert CLASSES[cls](_groups(capturable=False)).param_groups[0]["capturable"] is False


def _adamw_run(opt, param, steps: range) -> None:
    for t in steps:
        g = torch.Generator().manual_seed(100 + t)
        param.grad = torch.randn(param.shape, dtype=param.dtype, generator=g)
        opt.step()


@pytest.mark.parametrize("cls", list(CLASSES))
def test_an_adamw_state_dict_continues_in_the_plain_groups(cls) -> None:
    """Switching an AdamW run to this optimizer: its state dict loads into the plain groups and
    the run continues bit for bit as AdamW would (plain groups are torch's AdamW)."""
    w = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    theirs = torch.nn.Parameter(w.clone())
    adamw = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1)
    _adamw_run(adamw, theirs, range(3))
    ours = torch.nn.Parameter(theirs.detach().clone())
    switched = CLASSES[cls]([ours], weight_decay=0.1)
    switched.load_state_dict(adamw.state_dict())
    _adamw_run(adamw, theirs, range(3, 6))
    _adamw_run(switched, ours, range(3, 6))
    assert torch.equal(ours, theirs)


def test_a_step_count_saved_as_a_number_loads_and_resumes_bitwise() -> None:
    frame = _frame()
    opt = tp.RiemannianAdam([{"params": [frame], "geometry": "stiefel"}], lr=1e-2)
    _adamw_run(opt, frame, range(2))
    saved = opt.state_dict()
    as_number = {**saved, "state": {0: {**saved["state"][0], "step": 2}}}
    twins = []
    for state in (saved, as_number):
        p = torch.nn.Parameter(frame.detach().clone())
        other = tp.RiemannianAdam([{"params": [p], "geometry": "stiefel"}], lr=1e-2)
        other.load_state_dict(state)
        _adamw_run(other, p, range(2, 4))
        twins.append(p.detach())
    assert torch.equal(*twins)
    fractional = {**saved, "state": {0: {**saved["state"][0], "step": 2.5}}}
    with pytest.raises(ValueError, match="the step count must be an integer"):
        opt.load_state_dict(fractional)


def test_projected_average_is_the_polar_factor_of_the_mean_of_the_iterates() -> None:
    """swa_utils.AveragedModel keeps the entrywise mean of five iterates of a frame (0.05 off
    the manifold); ``projected_average`` gives the nearest frame to it, the polar factor U Vᵀ of
    the mean's SVD computed here in NumPy: equal to 1e-13 (two polar routes in float64, κ ≤ 1.1:
    ~10·d·r·u). A model with R2 points is refused by name."""
    import numpy as np
    from torch.optim.swa_utils import AveragedModel

    from torch_port.nn import RiemannianMultiheadAttention, build_optimizer, projected_average

    torch.manual_seed(0)
    model = RiemannianMultiheadAttention(16, 4, qk_geometry="stiefel", dtype=torch.float64)
    swa = AveragedModel(model)
    opt = build_optimizer(model, lr=5e-2)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    iterates = []
    for _ in range(5):
        opt.zero_grad()
        model(x, x, x)[0].square().sum().backward()
        opt.step()
        swa.update_parameters(model)
        iterates.append(model.w_q.detach().numpy().copy())
    mean = np.mean(iterates, axis=0)
    # a running mean of 5 iterates with entries ≤ 1: ≤ 5 roundings of u = 1.1e-16 apart
    assert np.allclose(swa.module.w_q.detach().numpy(), mean, rtol=0, atol=1e-15)
    u, _, vt = np.linalg.svd(mean, full_matrices=False)
    expected = u @ vt
    got = projected_average(swa).w_q.detach().numpy()
    assert np.abs(got - expected).max() <= 1e-13
    assert np.abs(mean - expected).max() > 1e-3  # the mean itself is not a frame
    r2 = RiemannianMultiheadAttention(16, 4, qk_geometry="fixed_rank_quotient", dtype=torch.float64)
    with pytest.raises(ValueError, match="fixed_rank_quotient, whose factors are fixed only"):
        projected_average(AveragedModel(r2))


def _tangent(w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """P_W(Z) = Z − W·sym(WᵀZ), the embedded metric's projection."""
    return z - w @ (w.T @ z + z.T @ w) / 2


def _momentum_step(beta: float | None, schedule) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One RiemannianMomentum step on a frame after ``schedule(opt)`` is built: β in force (from
    the scheduler's betas[0] unless ``beta`` is given), the frame's momentum after the step (at
    the new frame W₁) and P_W₁(P_W(G)), the momentum's direction transported there."""
    frame = _frame()
    opt = tp.RiemannianMomentum([{"params": [frame], "geometry": "stiefel"}], lr=0.1, beta=beta)
    schedule(opt)
    g = torch.Generator().manual_seed(3)
    frame.grad = torch.randn(frame.shape, dtype=frame.dtype, generator=g)
    riemannian = _tangent(frame.detach().clone(), frame.grad)
    opt.step()
    transported = _tangent(frame.detach(), riemannian)
    return opt.param_groups[0]["betas"][0], opt.state[frame]["momentum_buffer"], transported


SCHEDULES = {
    "OneCycleLR": lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.1, total_steps=10, base_momentum=0.5, max_momentum=0.7
    ),
    "CyclicLR": lambda opt: torch.optim.lr_scheduler.CyclicLR(
        opt, base_lr=0.01, max_lr=0.1, base_momentum=0.6, max_momentum=0.7
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedulers_that_cycle_momentum_reach_the_frames(name) -> None:
    """M₁ = P_W₁((1 − β)·P_W(G)) from M₀ = 0, with β the scheduler's momentum (both start at
    max_momentum 0.7), not the default 0.9. The two sides differ by the rounding of two
    projections of inner length ≤ 7 each side: ≤ 4·10·u·‖G‖_F ≈ 4.4e-15·‖G‖_F, under 1e-13 for
    this ‖G‖_F ≈ 3.4. Control: an explicit ``beta=0.9`` keeps β = 0.9 whatever the scheduler
    writes, so its momentum is the 0.7 one's · 1/3 (≥ 1e-2 apart)."""
    scheduled, momentum, riemannian = _momentum_step(None, SCHEDULES[name])
    assert scheduled == pytest.approx(0.7)
    torch.testing.assert_close(momentum, (1 - 0.7) * riemannian, rtol=0, atol=1e-13)
    _, fixed, riemannian = _momentum_step(0.9, SCHEDULES[name])
    torch.testing.assert_close(fixed, (1 - 0.9) * riemannian, rtol=0, atol=1e-13)
    assert (fixed - (1 - 0.7) * riemannian).abs().max() > 1e-2


@pytest.mark.parametrize("cls", list(CLASSES))
def test_a_tensor_lr_steps_as_its_value_in_the_eager_step(cls) -> None:
    """torch's optimizers take a 0-d tensor lr without ``capturable`` (``foreach`` aside): the
    eager step reads its value, so three steps under a halving schedule equal those with the
    same lr as a Python number bitwise, frames and plain parameters alike."""
    runs = []
    for as_tensor in (False, True):
        params = _groups()
        opt = CLASSES[cls](params)
        if as_tensor:
            for group in opt.param_groups:
                group["lr"] = torch.tensor(group["lr"], dtype=torch.float64)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for k in range(3):
            for group in opt.param_groups:
                for p in group["params"]:
                    g = torch.Generator().manual_seed(10 * k + p.numel())
                    p.grad = torch.randn(p.shape, dtype=p.dtype, generator=g)
            opt.step()
            sched.step()
        assert all(isinstance(g["lr"], torch.Tensor) == as_tensor for g in opt.param_groups)
        runs.append([p.detach().clone() for g in opt.param_groups for p in g["params"]])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
    assert not torch.equal(runs[0][0], _frame())  # the frames moved
