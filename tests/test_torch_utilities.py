"""The optimizers with torch's training utilities, eager and capturable: AMP's GradScaler (a
step with an inf gradient is skipped by the scaler and changes nothing), OneCycleLR (which
cycles lr and β1 in the groups), a deep copy of an optimizer (an independent optimizer that
steps as the original) and swa_utils.AveragedModel (a mean of frames is not a frame;
``reproject`` puts it back)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import torch_port as tp  # noqa: E402
from torch_port.optim import reproject  # noqa: E402

ST = tp.Stiefel(8, 3)
#: float64 frames after a few polar steps: ‖WᵀW − I‖ is a few ulps of r = 3 unit columns.
ON_ST = 1e-13


def _model(cap: bool) -> tuple:
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(ST.random_point(g, (2,)))
    b = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}, {"params": [b]}],
        lr=1e-2,
        trust_radius=0.5,
        capturable=cap,
    )
    return w, b, opt, g


def _loss(w, b, g):
    z = torch.randn(2, 8, 3, generator=g, dtype=torch.float64)
    return (w * z).sum() + (b * b).sum()


def _everything(opt, *ps) -> list:
    out = [p.detach().clone() for p in ps]
    for p in ps:
        out += [v.clone() for v in opt.state[p].values()]
    return out


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
def test_grad_scaler_skips_an_inf_step_and_the_others_step(cap):
    w, b, opt, g = _model(cap)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    for i in range(4):
        opt.zero_grad()
        loss = _loss(w, b, g) * (float("inf") if i == 2 else 1.0)
        scaler.scale(loss).backward()
        before = _everything(opt, w, b) if opt.state else None
        scaler.step(opt)
        scaler.update()
        if i == 2:
            after = _everything(opt, w, b)
            assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
            assert scaler.get_scale() == 2.0**7
        assert float(opt.state[w]["step"]) == (i + 1 if i < 2 else i)
    assert float(ST.residual(w.detach()).max()) <= ON_ST


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
def test_one_cycle_sets_lr_and_beta1_and_the_steps_use_them(cap):
    w, b, opt, g = _model(cap)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=6)
    betas = []
    for _ in range(6):
        opt.zero_grad()
        _loss(w, b, g).backward()
        opt.step()
        sched.step()
        betas.append(opt.param_groups[0]["betas"][0])
    assert len(set(betas)) > 2  # β1 cycled in the frame group
    assert float(ST.residual(w.detach()).max()) <= ON_ST
    # twins that never saw the schedule, built with the scheduled lr and β1 (and a control
    # with another lr), take the state and step from the same gradients: the step uses the
    # groups' values, which are not the optimizer's constructor defaults here
    lr, b1 = opt.param_groups[0]["lr"], opt.param_groups[0]["betas"][0]
    assert lr != opt.defaults["lr"] and b1 != opt.defaults["betas"][0]
    grads = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in (w, b)]
    twins = []
    for twin_lr in (lr, 2 * lr):
        tw = torch.nn.Parameter(w.detach().clone())
        tb = torch.nn.Parameter(b.detach().clone())
        twin = tp.RiemannianAdam(
            [{"params": [tw], "geometry": "stiefel"}, {"params": [tb]}],
            lr=twin_lr,
            betas=(b1, 0.999),
            trust_radius=0.5,
            capturable=cap,
        )
        sd = copy.deepcopy(opt.state_dict())
        for group in sd["param_groups"]:
            group.update(lr=twin_lr, betas=(b1, 0.999))
        twin.load_state_dict(sd)
        tw.grad, tb.grad = grads[0].clone(), grads[1].clone()
        twin.step()
        twins.append((tw, tb))
    w.grad, b.grad = grads[0].clone(), grads[1].clone()
    opt.step()
    assert torch.equal(w, twins[0][0]) and torch.equal(b, twins[0][1])
    assert not torch.equal(w, twins[1][0]) and not torch.equal(b, twins[1][1])


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
def test_a_deep_copy_is_an_independent_optimizer_that_steps_as_the_original(cap):
    w, b, opt, g = _model(cap)
    opt.zero_grad()
    _loss(w, b, g).backward()
    opt.step()
    # deepcopy of the optimizer alone copies its parameters too (they are in its groups)
    dup = copy.deepcopy(opt)
    dw, db = dup.param_groups[0]["params"][0], dup.param_groups[1]["params"][0]
    assert dw is not w and torch.equal(dw, w)
    for _ in range(2):
        grads = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in (w, b)]
        for p, q, grad in zip((w, b), (dw, db), grads, strict=True):
            p.grad, q.grad = grad.clone(), grad.clone()
        opt.step()
        dup.step()
    assert torch.equal(w, dw) and torch.equal(b, db)
    dw.grad = torch.randn(dw.shape, generator=g, dtype=torch.float64)
    before = w.detach().clone()
    dup.step()
    assert torch.equal(w, before)  # stepping the copy leaves the original alone


def test_an_averaged_model_of_frames_needs_reproject():
    """swa_utils.AveragedModel averages parameters entry by entry: the mean of two frames is
    off St(d, r) by far more than rounding, and ``torch_port.optim.reproject`` makes it the
    nearest frame (its largest residual before is returned)."""
    w, b, opt, g = _model(False)
    module = torch.nn.Module()
    module.w = w
    avg = torch.optim.swa_utils.AveragedModel(module)
    for _ in range(5):
        opt.zero_grad()
        (_loss(w, b, g) * 50).backward()
        opt.step()
        avg.update_parameters(module)
    mean = avg.module.w
    off = float(ST.residual(mean.detach()).max())
    assert off > 1e-6
    found = reproject([{"params": [mean], "geometry": "stiefel"}])
    assert found["param_groups[0]"] == pytest.approx(off, rel=1e-12)
    assert float(ST.residual(mean.detach()).max()) <= ON_ST


def test_step_hooks_run_once_per_step_whatever_classes_were_built_before():
    """torch wraps the ``step`` of every optimizer class it builds with its hook runner; once a
    plain ``ChainOptimizer`` had been built, RiemannianAdam's step (which calls the chain's)
    ran every pre and post hook twice (an EMA in a post hook moved twice per step)."""
    from torch_port.optim import ChainOptimizer, transforms

    w, b, opt, g = _model(False)
    ChainOptimizer(
        [{"params": [torch.nn.Parameter(ST.random_point(g))], "geometry": "stiefel"}],
        lambda group: transforms.chain(transforms.scale(-group["lr"])),
    )
    w, b, opt, g = _model(False)
    calls: list[str] = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    opt.zero_grad()
    _loss(w, b, g).backward()
    opt.step()
    assert calls == ["pre", "post"]


def test_a_compiled_step_of_the_eager_optimizer_is_the_eager_step():
    """Dynamo sets ``capturable=True`` in the param_groups of an optimizer step it traces;
    the eager RiemannianAdam reads its mode from ``defaults``, so ``torch.compile(opt.step)``
    still runs the eager step: on an R1 point (U, S, V) the compiled steps equal the eager
    ones bitwise (run as the capturable Stiefel step, S was made orthonormal) and a NaN
    gradient raises as it does eagerly."""
    geo = tp.GEOMETRIES["fixed_rank_embedded"](8, 6, 2)
    start = geo.random_point(torch.Generator().manual_seed(0), (2,))

    def make():
        ps = [torch.nn.Parameter(t.clone()) for t in start]
        group = {"params": ps, "geometry": "fixed_rank_embedded"}
        return ps, tp.RiemannianAdam([group], lr=1e-2, trust_radius=0.1)

    (ps, opt), (qs, ref) = make(), make()
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="eager")
    for k in range(2):
        gen = torch.Generator().manual_seed(k)
        for p, q in zip(ps, qs, strict=True):
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            q.grad = p.grad.clone()
        step()
        ref.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, qs, strict=True))
    ps[0].grad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite gradient"):
        step()


@pytest.mark.parametrize("order", ["set_state_dict", "model first"])
def test_torch_distributed_checkpoint_helpers_resume_bitwise(order):
    """``torch.distributed.checkpoint.state_dict`` in one process. ``set_state_dict`` loads
    the optimizer before the model (its moments cannot be checked against the fresh model's
    frames then; the first step checks them), and ``set_optimizer_state_dict`` after the model
    first makes the optimizer's state with a step at lr = 0, which must leave the loaded
    frames as they are (R_W(0) = W, not a polar factor re-formed by rounding). Either way the
    resumed run equals the continued one bitwise."""
    from torch.distributed.checkpoint.state_dict import (
        get_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )

    def make(seed: int):
        module = torch.nn.Module()
        module.w = torch.nn.Parameter(ST.random_point(torch.Generator().manual_seed(seed), (3,)))
        module.b = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        groups = [{"params": [module.w], "geometry": "stiefel"}, {"params": [module.b]}]
        return module, tp.RiemannianAdam(groups, lr=1e-2)

    def grads(module, k: int) -> None:
        gen = torch.Generator().manual_seed(k)
        for p in (module.w, module.b):
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)

    m, opt = make(0)
    for k in range(4):
        grads(m, k)
        opt.step()
    msd, osd = get_state_dict(m, opt)
    msd = {k: v.clone() for k, v in msd.items()}
    m2, opt2 = make(7)
    if order == "set_state_dict":
        set_state_dict(m2, opt2, model_state_dict=msd, optim_state_dict=osd)
    else:
        m2.load_state_dict(msd)
        set_optimizer_state_dict(m2, opt2, osd)
    assert torch.equal(m2.w, msd["w"]) and torch.equal(m2.b, msd["b"])
    for k in range(4, 7):
        grads(m, k)
        grads(m2, k)
        opt.step()
        opt2.step()
    assert torch.equal(m.w, m2.w) and torch.equal(m.b, m2.b)


def test_a_compiled_first_capturable_step_counts_its_skips():
    """``skipped_on_device`` is made with the optimizer: when it was made by the first step,
    a compiled first step lost it (Dynamo does not keep an attribute the traced code sets)
    and the skips of later steps were not counted."""
    w, b, opt, g = _model(True)
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="eager", fullgraph=True)
    for k in range(3):
        opt.zero_grad()
        _loss(w, b, g).backward()
        if k == 1:
            w.grad[0, 0, 0] = float("nan")
        before = w.detach().clone()
        step()
        assert torch.equal(w, before) == (k == 1)
    assert float(opt.skipped_on_device) == 1.0


def test_a_tensor_lr_scheduled_to_zero_reloads_adds_groups_and_resumes_eagerly():
    """A capturable optimizer with a 0-d tensor lr under a schedule that reaches 0: its state
    dict loads back, a group added then (torch gives it the same tensor) is accepted, and the
    checkpoint resumes in an eager optimizer, which steps with the tensor lr's value."""
    w, b, opt, g = _model(True)
    for group in opt.param_groups:
        group["lr"] = torch.tensor(1e-2, dtype=torch.float64)
    sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=2, power=1.0)
    for _ in range(3):
        opt.zero_grad()
        _loss(w, b, g).backward()
        opt.step()
        sched.step()
    assert all(float(group["lr"]) == 0.0 for group in opt.param_groups)
    sd = copy.deepcopy(opt.state_dict())
    opt.load_state_dict(sd)
    opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]})
    w2, b2, eager, _ = _model(False)
    with torch.no_grad():
        w2.copy_(w)
        b2.copy_(b)
    eager.load_state_dict(sd)
    assert all(group["lr"] == 0.0 for group in eager.param_groups)
    eager.zero_grad()
    _loss(w2, b2, g).backward()
    eager.step()  # lr = 0: the frames do not move
    assert torch.equal(w2, w)


def test_a_compiled_capturable_step_refuses_moments_that_await_the_tangency_check():
    """A load defers the tangency check of moments not tangent at the points it saw to the
    next step, which a compiled step cannot make: it refuses to step (through Dynamo's error,
    before anything is written) until ``check_loaded_moments`` has passed."""
    w, b, opt, g = _model(True)
    opt.zero_grad()
    _loss(w, b, g).backward()
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    w2, b2, fresh, _ = _model(True)
    fresh.load_state_dict(sd)  # torch's set_state_dict order: the optimizer first
    torch._dynamo.reset()
    step = torch.compile(fresh.step, backend="eager", fullgraph=True)
    fresh.zero_grad()
    _loss(w2, b2, g).backward()
    before = w2.detach().clone()
    # Dynamo wraps the ValueError in its own error, whose text carries the message
    with pytest.raises(Exception, match=r"a loaded state holds moments not tangent"):
        step()
    assert torch.equal(w2, before)
    with pytest.raises(ValueError, match=r"not tangent .* after the state was loaded"):
        fresh.check_loaded_moments()  # the fresh model's weights are not the checkpoint's
    with torch.no_grad():
        w2.copy_(w)
        b2.copy_(b)
    fresh.check_loaded_moments()
    step()
    assert not torch.equal(w2, w)


def test_a_refused_capturable_step_makes_no_state_for_new_frames():
    """The capturable step made the state of new frames before it checked the existing
    states' layouts; a refusal then left it, and the next step skipped those frames' point
    check. Every existing layout is now checked first."""
    w, b, opt, g = _model(True)
    opt.zero_grad()
    _loss(w, b, g).backward()
    opt.step()
    w3 = torch.nn.Parameter(ST.random_point(g, (2,)))
    opt.add_param_group({"params": [w3], "geometry": "stiefel"})
    opt.state[b]["exp_avg"] = opt.state[b]["exp_avg"][:2]  # a layout the step refuses
    w3.grad = torch.randn(w3.shape, generator=g, dtype=torch.float64)
    b.grad = torch.randn(b.shape, generator=g, dtype=torch.float64)
    with pytest.raises(ValueError, match="capturable=True expects"):
        opt.step()
    assert not opt.state.get(w3)
