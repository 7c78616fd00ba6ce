"""What a step and a load refuse that earlier checks let through: hyperparameters changed after
construction, parameters appended to a group, a point edited to NaN, a factored point made
singular, a state dict with shared or expanded tensors or without some group entries, and the
capturable step's half-precision frames with a zero gradient. A refused step changes nothing."""

from __future__ import annotations

import copy
import io
import math
import re

import numpy as np
import pytest
import torch

import torch_port as tp


def _model(cap: bool = False, dtype=torch.float64, lr=1e-2, device="cpu", **kw):
    g = torch.Generator().manual_seed(0)
    w = tp.Stiefel(8, 3).random_point(g, (2,), dtype=torch.float64).to(device, dtype)
    w = torch.nn.Parameter(w)
    b = torch.nn.Parameter(torch.ones(4, dtype=dtype, device=device))
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}, {"params": [b]}],
        lr=lr,
        trust_radius=0.5,
        capturable=cap,
        **kw,
    )
    return w, b, opt, g


def _grads(g, *ps) -> None:
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.device, p.dtype)


def _snapshot(opt, *ps) -> list:
    tensors = [p.detach().clone() for p in ps]
    for p in ps:
        tensors += [v.clone() for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
    return tensors


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _refused_step(opt, message: str, *ps) -> None:
    """opt.step() raises ValueError matching ``message`` and changes no parameter of ``ps``
    and none of their state."""
    before = _snapshot(opt, *ps)
    with pytest.raises(ValueError, match=message):
        opt.step()
    assert _same(before, _snapshot(opt, *ps))


AFTER_CONSTRUCTION = {
    "plain lr NaN": (1, "lr", math.nan, r"param_groups\[1\]: lr must be a finite number ≥ 0"),
    "plain beta1 = 1": (1, "betas", (1.0, 0.999), r"param_groups\[1\]: beta1 must lie in \[0, 1\)"),
    "plain eps NaN": (1, "eps", math.nan, r"param_groups\[1\]: eps must be a"),
    "plain weight decay NaN": (1, "weight_decay", math.nan, r"weight_decay must be a finite"),
    "frame lr < 0": (0, "lr", -0.01, r"param_groups\[0\]: lr must be a finite number ≥ 0"),
    "frame trust radius 0": (0, "trust_radius", 0.0, r"param_groups\[0\]: .*trust"),
    "frame moment unknown": (0, "moment", "bogus", r"param_groups\[0\]: .*moment.*'bogus'"),
}


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
@pytest.mark.parametrize("case", sorted(AFTER_CONSTRUCTION))
def test_hyperparameters_set_after_construction_are_refused_before_the_step_writes(case, cap):
    """A value set into a group after construction is checked at the next step, before any
    parameter or state is written (the plain group's error used to come from torch's AdamW
    after the frames had stepped)."""
    gi, key, value, message = AFTER_CONSTRUCTION[case]
    w, b, opt, g = _model(cap)
    _grads(g, w, b)
    opt.step()
    opt.param_groups[gi][key] = value
    _grads(g, w, b)
    _refused_step(opt, message, w, b)


#: Values changed between steady steps where a comparison with the values last checked could
#: miss them (in place, or equal with another type): (model options, the change, message).
CHANGED_UNSEEN = {
    "betas list changed in place": (
        {"betas": [0.9, 0.999]},
        lambda groups: groups[1]["betas"].__setitem__(0, 1.0),
        r"beta1 must lie in \[0, 1\), got 1.0",
    ),
    "tensor lr filled in place": (
        {"lr": torch.tensor(0.01)},
        lambda groups: groups[0]["lr"].fill_(-0.01),
        r"param_groups\[0\]: lr must be a finite number ≥ 0",
    ),
    "lr 1.0 made True (equal, another type)": (
        {"lr": 1.0},
        lambda groups: groups[1].__setitem__("lr", True),
        r"param_groups\[1\]: lr must be a finite number ≥ 0, got True",
    ),
    "a parameter appended again to its own list": (
        {},
        lambda groups: groups[0]["params"].append(groups[0]["params"][0]),
        r"param_groups\[0\]: a parameter group lists the same parameter twice",
    ),
    "tensor lr filled through .data (no version change)": (
        {"lr": torch.tensor(0.01)},
        lambda groups: groups[0]["lr"].data.fill_(-0.01),
        r"param_groups\[0\]: lr must be a finite number ≥ 0",
    ),
    "capturable tensor lr given integer data": (
        {"cap": True, "lr": torch.tensor(0.01)},
        lambda groups: setattr(groups[0]["lr"], "data", torch.tensor(1)),
        r"param_groups\[0\]: a tensor lr must be a 0-d floating tensor",
    ),
    "a parameter given expanded data of its shape": (
        {},
        lambda groups: setattr(
            groups[1]["params"][0], "data", torch.zeros(1, dtype=torch.float64).expand(4)
        ),
        r"param_groups\[1\]: a parameter of shape \(4,\) with strides \(0,\)",
    ),
}


@pytest.mark.parametrize("case", sorted(CHANGED_UNSEEN))
def test_a_change_between_steady_steps_is_checked(case):
    options, change, message = CHANGED_UNSEEN[case]
    w, b, opt, g = _model(**options)
    for _ in range(2):
        _grads(g, w, b)
        opt.step()
    change(opt.param_groups)
    _grads(g, w, b)
    _refused_step(opt, message, w, b)


def test_a_bad_tensor_lr_in_the_eager_step_is_refused_before_it_writes():
    w, b, opt, g = _model()
    _grads(g, w, b)
    opt.step()
    opt.param_groups[1]["lr"] = torch.tensor([0.01])
    _grads(g, w, b)
    _refused_step(opt, r"param_groups\[1\]: a tensor lr must be a 0-d floating tensor", w, b)


def test_a_capturable_tensor_lr_set_to_a_bad_value_skips_the_step_on_the_device():
    """The capturable step reads no tensor on the host: a tensor lr filled with a negative value
    (which would be ascent) makes the step change nothing and count as skipped."""
    w, b, opt, g = _model(True, lr=torch.tensor(0.01))
    _grads(g, w, b)
    opt.step()
    opt.param_groups[0]["lr"].fill_(-0.01)
    _grads(g, w, b)
    before = _snapshot(opt, w, b)
    opt.step()
    assert _same(before, _snapshot(opt, w, b)) and int(opt.skipped_on_device) == 1


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
@pytest.mark.parametrize("shape", [(3, 5), (5,)])
def test_a_parameter_appended_to_a_group_is_checked_at_its_first_step(cap, shape):
    w, b, opt, g = _model(cap)
    _grads(g, w, b)
    opt.step()
    q = torch.nn.Parameter(torch.randn(shape, generator=g, dtype=torch.float64))
    opt.param_groups[0]["params"].append(q)
    _grads(g, w, b, q)
    before = _snapshot(opt, w, b)
    with pytest.raises(
        ValueError, match=rf"frames of shape .* got a parameter of shape {re.escape(str(shape))}"
    ):
        opt.step()
    assert _same(before, _snapshot(opt, w, b)) and not opt.state.get(q)


def test_the_first_capturable_step_refuses_a_point_off_its_manifold():
    w, b, opt, g = _model(True)
    with torch.no_grad():
        w[..., 0] *= 1.5
    _grads(g, w, b)
    with pytest.raises(ValueError, match=r"point is off St\(8, 3\): ‖WᵀW − I‖ = 1.250e\+00"):
        opt.step()
    assert not opt.state.get(w)


def test_a_point_made_non_finite_is_named_as_the_cause():
    w, b, opt, g = _model()
    _grads(g, w, b)
    opt.step()
    with torch.no_grad():
        w[0, 0, 0] = math.nan
    _grads(g, w, b)
    with pytest.raises(ValueError, match=r"the point has 1 non-finite entries \(NaN or inf\)"):
        opt.step()


def test_a_factored_point_made_singular_gives_the_librarys_error_with_its_name():
    """torch's LinAlgError from a singular core S becomes a ValueError naming the point."""
    geo = tp.GEOMETRIES["fixed_rank_embedded"](8, 6, 3)
    g = torch.Generator().manual_seed(0)
    start = geo.random_point(g, batch_shape=(2,), dtype=torch.float64)
    ps = [torch.nn.Parameter(t.clone()) for t in start]
    opt = tp.RiemannianAdam([{"params": ps, "geometry": "fixed_rank_embedded"}], lr=1e-2)
    _grads(g, *ps)
    opt.step()
    with torch.no_grad():
        ps[1][..., 0, :] = 0
        ps[1][..., :, 0] = 0
    _grads(g, *ps)
    _refused_step(opt, r"the fixed_rank_embedded point of param_groups\[0\]", *ps)


def test_a_plain_state_in_another_dtype_is_refused_before_the_frames_step():
    w, b, opt, g = _model()
    _grads(g, w, b)
    opt.step()
    opt.state[b]["exp_avg"] = opt.state[b]["exp_avg"].to(torch.bfloat16)
    _grads(g, w, b)
    _refused_step(opt, r"\['exp_avg'\]: held in torch.bfloat16 on cpu", w, b)


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
def test_a_saved_group_without_an_entry_keeps_this_optimizers_value(cap):
    w, b, opt, g = _model(cap)
    _grads(g, w, b)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    for k in ("betas", "trust_radius", "weight_decay", "capturable"):
        del sd["param_groups"][0][k]
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["trust_radius"] == 0.5 and opt.param_groups[0]["capturable"] is cap
    _grads(g, w, b)
    opt.step()
    assert int(opt.state[w]["step"]) == 2


def _loaded_run(shared: bool, cap: bool, expanded: bool = False) -> list:
    g = torch.Generator().manual_seed(0)
    ws = [
        torch.nn.Parameter(tp.Stiefel(8, 3).random_point(g, (2,), dtype=torch.float64))
        for _ in range(2)
    ]
    opt = tp.RiemannianAdam(
        [{"params": ws, "geometry": "stiefel"}], lr=1e-2, trust_radius=0.5, capturable=cap
    )
    sd = opt.state_dict()
    zero = torch.zeros(8, 3, dtype=torch.float64)
    for i in (0, 1):
        m = zero.expand(2, 8, 3) if expanded else torch.zeros(2, 8, 3, dtype=torch.float64)
        sd["state"][i] = {
            "step": torch.tensor(0.0),
            "exp_avg": sd["state"][0]["exp_avg"] if shared and i else m,
            "sqrt_v": torch.zeros(2, dtype=torch.float64),
        }
    opt.load_state_dict(sd)
    for _ in range(3):
        _grads(g, *ws)
        opt.step()
    return [w.detach().clone() for w in ws]


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
def test_loaded_moments_that_share_or_broadcast_memory_are_owned_copies(cap):
    """One tensor under two parameters' exp_avg (as torch.save keeps it), or an expanded one:
    the trajectory is that of separate tensors (the step writes its state in place)."""
    separate = _loaded_run(False, cap)
    assert _same(separate, _loaded_run(True, cap))
    assert _same(separate, _loaded_run(False, cap, expanded=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_zero_gradient_half_frame_does_not_stop_the_capturable_step(dtype):
    """m = 0 with √v = 0 gives the factor lr/((1 − β1)ε) ≈ 1e7, beyond float16: W + c·m is
    formed in float32, so 0·c = 0 and the other frames keep stepping (the whole step used to
    be skipped, at every step)."""
    g = torch.Generator().manual_seed(0)
    st = tp.Stiefel(16, 4)
    used, idle = (
        torch.nn.Parameter(st.random_point(g, (2,), dtype=torch.float64).to(dtype))
        for _ in range(2)
    )
    opt = tp.RiemannianAdam(
        [{"params": [used, idle], "geometry": "stiefel"}],
        lr=1e-2,
        trust_radius=0.5,
        capturable=True,
    )
    start = used.detach().clone()
    for _ in range(3):
        _grads(g, used)
        idle.grad = torch.zeros_like(idle)
        opt.step()
    assert int(opt.skipped_on_device) == 0 and int(opt.state[used]["step"]) == 3
    assert not torch.equal(start, used.detach())


def test_a_capturable_eps_whose_step_factor_overflows_is_refused():
    with pytest.raises(ValueError, match=r"step factor lr/\(\(1 − β1\)·eps\) = 1.000e\+39"):
        _model(True, dtype=torch.float32, eps=1e-40)


def test_numpy_scalars_as_hyperparameters_are_refused_as_such():
    """np.float32 is a real number but not a Python float: the message says that (it used to say
    'must be a positive finite number' of 0.001)."""
    _, b, _, _ = _model()
    with pytest.raises(ValueError, match=r"lr must be a Python int or float, got numpy.float32"):
        tp.RiemannianAdam([{"params": [b]}], lr=np.float32(1e-3))
    with pytest.raises(ValueError, match=r"beta1 must be a Python int or float, got numpy"):
        tp.RiemannianAdam([{"params": [b]}], betas=(np.float32(0.9), 0.999))


@pytest.mark.parametrize("gi", [0, 1])
@pytest.mark.parametrize("entry", [torch.zeros(3), None], ids=["tensor", "None"])
def test_a_saved_state_entry_that_is_not_a_dict_is_refused_with_its_type(gi, entry):
    w, b, opt, g = _model()
    _grads(g, w, b)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][gi] = entry
    before = _snapshot(opt, w, b)
    kind = type(entry).__name__
    with pytest.raises(ValueError, match=rf"state entries must be dicts; got {{{gi}: '{kind}'}}"):
        opt.load_state_dict(sd)
    assert _same(before, _snapshot(opt, w, b))


@pytest.mark.parametrize(
    ("cap", "tensor_lr"),
    [(False, False), (True, False), (True, True)],
    ids=["eager", "cap", "tensor"],
)
def test_a_schedule_that_ends_at_lr_0_steps_saves_and_loads(cap, tensor_lr):
    """lr = 0 is a value a group in use may hold (a decay to 0, torch.distributed.checkpoint's
    state-making step): the step takes it and leaves the frames bitwise as they are (R_W(0) =
    W, not a polar factor re-formed by rounding), and its checkpoint loads; lr < 0 is still
    refused (test_reliability_torch.py)."""
    w, b, opt, g = _model(cap)
    if tensor_lr:
        for group in opt.param_groups:
            group["lr"] = torch.tensor(group["lr"], dtype=torch.float64)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: max(0.0, 1 - k / 2))
    for _ in range(3):
        _grads(g, w, b)
        opt.step()
        sched.step()
    assert float(opt.param_groups[0]["lr"]) == 0.0
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    opt.load_state_dict(torch.load(buf, weights_only=True))
    _grads(g, w, b)
    before = w.detach().clone()
    opt.step()
    assert torch.equal(w.detach(), before) and int(opt.state[w]["step"]) == 4


def test_a_learning_rate_whose_step_overflows_is_named_as_the_cause():
    """lr = 1e38 on float32 frames without a trust region: W + c·ξ overflows, and the error
    says so (with the step's size) instead of blaming the polar factor's input; nothing is
    written. lr = 1e30 still steps (the polar factor of a finite A is a frame, whatever its
    scale)."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(8, 3).random_point(g, (2,), dtype=torch.float32))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e38)
    _grads(g, w)
    _refused_step(opt, r"the step c·ξ has entries up to inf, beyond √\(larg", w)
    opt.param_groups[0]["lr"] = 1e30
    opt.step()
    assert float(tp.Stiefel(8, 3).residual(w.detach()).max()) <= 1e-5


def test_a_trust_region_caps_a_step_whose_factor_overflows():
    """With a trust radius Δ the step has length min(‖c·u‖, Δ) for any lr: at lr = 1e38 in
    float32 (c·u beyond the dtype) the step is ξ = −Δ·u/‖u‖ per frame, the step it takes at
    lr = 1e20 (c·u finite, capped the usual way). The two agree to float32 rounding: ‖ξ‖ = 0.5,
    so the polar factors of W + ξ differ by a few ulps of entries ≤ 1 (bound 1e-5 ≈ 170 u₃₂).
    (The capturable step refuses such an lr at construction: its step factor overflows.)"""
    frames = []
    for lr in (1e38, 1e20):
        w, b, opt, g = _model(dtype=torch.float32, lr=lr)
        _grads(g, w, b)
        before = w.detach().clone()
        opt.param_groups[1]["lr"] = 1e-3  # AdamW at such an lr is not under test here
        opt.step()
        assert float(tp.Stiefel(8, 3).residual(w.detach()).max()) <= 1e-5
        assert float((w.detach() - before).abs().max()) > 0.05  # a step of length Δ = 0.5
        frames.append(w.detach().clone())
    assert float((frames[0] - frames[1]).abs().max()) <= 1e-5


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
@pytest.mark.parametrize("which", [0, 1], ids=["frame", "plain"])
def test_a_gradient_that_is_not_dense_is_refused_by_name(cap, which):
    """Sparse gradients are refused before anything is written, by both steps (the capturable
    one used to fail inside torch's norm, which has no sparse kernel). (torch itself refuses
    to assign a CSR gradient to a dense parameter.)"""
    w, b, opt, g = _model(cap)
    _grads(g, w, b)
    opt.step()
    _grads(g, w, b)
    p = (w, b)[which]
    p.grad = p.grad.to_sparse()
    _refused_step(opt, r"the gradient of param_groups.* is torch.sparse_coo", w, b)


@pytest.mark.parametrize("saved_cap", [False, True], ids=["eager saved", "capturable saved"])
def test_a_state_dict_loads_into_the_other_step_which_keeps_its_own_mode(saved_cap):
    """A state dict of the capturable step loads into an eager optimizer and the other way
    round, as saved: the loading optimizer keeps its ``capturable`` and steps in its own
    mode, and the two then take the same steps to float64 rounding (their polar factors
    differ: a fixed-degree series against the eager step's, both below 1e-17, so 1e-13 over
    three unit-sized steps)."""
    w, b, opt, g = _model(saved_cap)
    _grads(g, w, b)
    opt.step()
    sd = opt.state_dict()
    w2, b2, opt2, _ = _model(not saved_cap)
    with torch.no_grad():
        w2.copy_(w)
        b2.copy_(b)
    opt2.load_state_dict(sd)
    assert sd["param_groups"][0]["capturable"] is saved_cap  # the caller's dict is unchanged
    assert all(group["capturable"] is (not saved_cap) for group in opt2.param_groups)
    for _ in range(3):
        gen = torch.Generator().manual_seed(len(opt2.state))
        for x, y in ((w, w2), (b, b2)):
            x.grad = torch.randn(x.shape, generator=gen, dtype=torch.float64)
            y.grad = x.grad.clone()
        opt.step()
        opt2.step()
    assert float((w - w2).abs().max()) <= 1e-13 and float((b - b2).abs().max()) <= 1e-13


def test_a_state_saved_in_another_dtype_loads_cast_as_torch_casts_it():
    """A float32 run's state loads into float64 parameters (torch casts each floating entry to
    its parameter's dtype, as torch.optim.AdamW does) and steps."""
    w, b, opt, g = _model(dtype=torch.float32)
    _grads(g, w, b)
    opt.step()
    w2, b2, opt2, g2 = _model(dtype=torch.float64)
    with torch.no_grad():
        w2.copy_(w)
        b2.copy_(b)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.state[b2]["exp_avg_sq"].dtype == torch.float64
    assert opt2.state[w2]["exp_avg"].dtype == torch.float64
    _grads(g2, w2, b2)
    opt2.step()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cap", [False, True])
def test_a_state_loaded_onto_the_cpu_resumes_a_cuda_run_exactly(cap):
    """A checkpoint loaded with map_location="cpu" (Hugging Face's Trainer, the experiments'
    resume) holds its moments on the CPU; the load moves them to the frames' device before it
    checks them, and the resumed run equals the uninterrupted one bitwise."""
    w, b, opt, g = _model(cap, device="cuda")
    _grads(g, w, b)
    opt.step()
    saved = {k: v for k, v in opt.state_dict().items()}
    saved = torch.utils._pytree.tree_map(
        lambda v: v.cpu() if isinstance(v, torch.Tensor) else v, saved
    )
    w2, b2, opt2, _ = _model(cap, device="cuda")
    with torch.no_grad():
        w2.copy_(w)
        b2.copy_(b)
    opt2.load_state_dict(saved)
    assert all(
        v.device.type == "cuda"
        for s in opt2.state.values()
        for k, v in s.items()
        if isinstance(v, torch.Tensor) and (k != "step" or cap)
    )
    gen = torch.Generator().manual_seed(1)
    _grads(gen, w, b)
    w2.grad, b2.grad = w.grad.clone(), b.grad.clone()
    opt.step()
    opt2.step()
    assert torch.equal(w, w2) and torch.equal(b, b2)


def test_a_state_dict_of_a_live_optimizer_shares_nothing_with_it_once_loaded():
    """torch's load keeps the loaded tensors themselves, and both AdamW and the frame steps
    write their state in place (or reuse it as a buffer), so a state dict taken from a live
    optimizer and loaded into another would tie the two. After the load each goes on exactly
    as it would alone: the source equals a run that loaded nothing, bitwise."""
    w, b, opt, g = _model()
    wr, br, ref, _ = _model()
    for x, y in ((w, wr), (b, br)):
        x.grad = torch.randn(x.shape, generator=g, dtype=torch.float64)
        y.grad = x.grad.clone()
    opt.step()
    ref.step()
    w2, b2, opt2, _ = _model()
    with torch.no_grad():
        w2.copy_(w)
        b2.copy_(b)
    opt2.load_state_dict(opt.state_dict())
    for k in range(3):
        gen = torch.Generator().manual_seed(k)
        for xs in ((w, wr, w2), (b, br, b2)):
            grad = torch.randn(xs[0].shape, generator=gen, dtype=torch.float64)
            for x in xs:
                x.grad = grad.clone()
        opt.step()
        opt2.step()
        ref.step()
    assert torch.equal(w, wr) and torch.equal(b, br)
    assert torch.equal(w2, wr) and torch.equal(b2, br)


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
@pytest.mark.parametrize(
    ("sid", "key"), [(0, "exp_avg"), (0, "sqrt_v"), (0, "step"), (1, "step"), (1, "exp_avg_sq")]
)
def test_a_state_on_the_meta_device_is_refused_by_name(cap, sid, key):
    """A meta tensor (shape without values, e.g. from a model built on the meta device) in a
    state dict is refused with its entry's name, instead of torch's "item() cannot be called
    on meta tensors"; nothing is loaded."""
    w, b, opt, g = _model(cap)
    _grads(g, w, b)
    opt.step()
    before = _snapshot(opt, w, b)
    sd = opt.state_dict()  # its entries are opt.state's own dicts: replace, don't edit
    entry = sd["state"][sid]
    sd["state"][sid] = {**entry, key: torch.empty(entry[key].shape, device="meta")}
    with pytest.raises(ValueError, match=rf"\['{key}'\]: a tensor on the meta device"):
        opt.load_state_dict(sd)
    assert _same(before, _snapshot(opt, w, b))


@pytest.mark.parametrize(
    "name",
    [
        "fixed_rank_embedded",
        "fixed_rank_quotient",
        "partial_isometry_embedded",
        "partial_isometry_quotient",
        "stiefel_pair",
    ],
)
def test_a_step_too_large_for_the_dtype_is_named_in_every_geometry(name):
    """lr = 1e38 on float32 points: the retraction's products of the step overflow, and the
    error names the step's size instead of an eigh/SVD/polar failure; nothing is written."""
    geo = tp.GEOMETRIES[name](8, 6, 3)
    g = torch.Generator().manual_seed(0)
    start = geo.random_point(g, batch_shape=(2,), dtype=torch.float32)
    ps = [torch.nn.Parameter(t.clone()) for t in start]
    opt = tp.RiemannianAdam([{"params": ps, "geometry": name}], lr=1e38)
    _grads(g, *ps)
    with pytest.raises(ValueError, match=rf"the {name} point .*: the step c·ξ has entries up to"):
        opt.step()
    assert all(torch.equal(p.detach(), t) for p, t in zip(ps, start, strict=True))
    assert not opt.state


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
@pytest.mark.parametrize("which", [0, 1], ids=["frame", "plain"])
@pytest.mark.parametrize("change", ["dtype", "shape"])
def test_a_gradient_unlike_its_parameter_is_refused_before_anything_is_written(cap, which, change):
    """torch lets a gradient of another dtype (``grad_dtype = None``) or shape (``grad.data
    = ...``) be set; torch's AdamW then failed after the frames had stepped. Both steps now
    refuse it by name first."""
    w, b, opt, g = _model(cap)
    _grads(g, w, b)
    opt.step()
    _grads(g, w, b)
    p = (w, b)[which]
    if change == "dtype":
        p.grad_dtype = None
        p.grad = p.grad.to(torch.float32)
    else:
        p.grad.data = torch.ones(p.shape[0] + 1, *p.shape[1:], dtype=p.dtype)
    _refused_step(opt, r"the gradient of param_groups.* has shape", w, b)


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
def test_a_parameter_whose_entries_share_memory_is_refused(cap):
    """An expanded tensor as a parameter (both of its frames on St, so the point check passes)
    cannot be written in place: refused when the group is built, and when it is appended to a
    group, before a step writes the parameters before it."""
    base = tp.Stiefel(8, 3).random_point(torch.Generator().manual_seed(2), (1,))
    expanded = torch.nn.Parameter(base.expand(2, 8, 3))
    kw = {"trust_radius": 0.5, "capturable": cap}
    with pytest.raises(ValueError, match=r"entries that share memory \(an expanded tensor\)"):
        tp.RiemannianAdam([{"params": [expanded], "geometry": "stiefel"}], **kw)
    with pytest.raises(ValueError, match=r"entries that share memory"):
        tp.RiemannianAdam([{"params": [torch.nn.Parameter(torch.ones(1).expand(3))]}], **kw)
    w, b, opt, g = _model(cap)
    _grads(g, w, b)
    opt.step()
    opt.param_groups[0]["params"].append(expanded)
    _grads(g, w, b, expanded)
    _refused_step(opt, r"param_groups\[0\]: .*entries that share memory", w, b)


@pytest.mark.parametrize(("sid", "key"), [(0, "exp_avg"), (0, "sqrt_v"), (1, "exp_avg_sq")])
def test_a_state_beyond_the_dtype_it_will_be_held_in_is_refused(sid, key):
    """A float64 state whose entries are finite but beyond float32's range, loaded into
    float32 parameters: torch casts the moments to the parameter's dtype and √v is held in
    float32, where they would be inf; the load checks them as they will be held and refuses."""
    w, b, opt, g = _model()
    _grads(g, w, b)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][sid][key] = sd["state"][sid][key] + 1e40  # finite in float64
    w2, _, opt2, _ = _model(dtype=torch.float32)
    with torch.no_grad():
        w2.copy_(w)
    with pytest.raises(ValueError, match=rf"\['{key}'\]: .* once cast to torch.float32"):
        opt2.load_state_dict(sd)
    assert not opt2.state


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_step_count_saved_in_half_precision_is_held_in_float32(dtype):
    """In bfloat16 t + 1 rounds back to t from t = 256, and Adam's bias corrections would stop
    there; a loaded half-precision count is held in float32, torch's dtype for it, and keeps
    counting (and torch's foreach AdamW, which refuses a float16 count, steps)."""
    w, b, opt, g = _model()
    _grads(g, w, b)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    for entry in sd["state"].values():
        entry["step"] = torch.tensor(250.0, dtype=dtype)
    opt.load_state_dict(sd)
    for _ in range(8):
        _grads(g, w, b)
        opt.step()
    for p in (w, b):
        assert opt.state[p]["step"].dtype == torch.float32
        assert float(opt.state[p]["step"]) == 258.0


@pytest.mark.parametrize("value", [torch.tensor(1), 1.0], ids=["int64 tensor", "Python float"])
def test_a_plain_step_count_of_another_kind_is_refused_before_the_frames_step(value):
    """A plain parameter's step count set to an integer tensor or a Python number (torch's
    layout before 1.12): torch's foreach AdamW refuses it, after the frames had stepped; the
    step now checks it first."""
    w, b, opt, g = _model()
    _grads(g, w, b)
    opt.step()
    opt.state[b]["step"] = value
    _grads(g, w, b)
    before = [w.detach().clone(), *(v.clone() for v in opt.state[w].values())]
    with pytest.raises(ValueError, match=r"param_groups\[1\].*\['step'\]: expected"):
        opt.step()
    assert _same(before, [w.detach().clone(), *(v.clone() for v in opt.state[w].values())])


def test_load_hooks_see_and_change_what_is_checked_and_kept():
    """torch runs load pre-hooks inside its own load, after the library had checked the
    caller's dict: a pre-hook's NaN moments were loaded unchecked, a migrating pre-hook never
    ran (the old dict was refused first) and a post-hook's √v was overwritten. Now the
    pre-hooks run first and their result is checked, and the post-hooks run last."""
    w, b, opt, g = _model()
    _grads(g, w, b)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())

    def poison(_, d):
        d = copy.deepcopy(d)
        d["state"][0]["exp_avg"] = torch.full_like(d["state"][0]["exp_avg"], math.nan)
        return d

    handle = opt.register_load_state_dict_pre_hook(poison)
    before = _snapshot(opt, w, b)
    with pytest.raises(ValueError, match=r"\['exp_avg'\]: 48 non-finite entries"):
        opt.load_state_dict(sd)
    assert _same(before, _snapshot(opt, w, b))
    handle.remove()

    old = copy.deepcopy(sd)  # an earlier layout: √v saved as "v_root"
    old["state"][0]["v_root"] = old["state"][0].pop("sqrt_v")

    def migrate(_, d):
        d = copy.deepcopy(d)
        d["state"][0]["sqrt_v"] = d["state"][0].pop("v_root")
        return d

    opt.register_load_state_dict_pre_hook(migrate)
    opt.register_load_state_dict_post_hook(lambda o: o.state[w]["sqrt_v"].mul_(2.0))
    opt.load_state_dict(old)
    assert torch.equal(opt.state[w]["sqrt_v"], 2.0 * sd["state"][0]["sqrt_v"])


@pytest.mark.parametrize("retraction", ["polar", "polar_svd", "qr", "exp"])
def test_a_step_too_large_for_the_dtype_is_named_for_every_stiefel_retraction(retraction):
    """The QR and exponential retractions do not raise on an overflowing step: they make a
    non-finite point, which the step then names by the step's size, as it names a retraction
    that raises."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(8, 3).random_point(g, (2,), dtype=torch.float32))
    group = {"params": [w], "geometry": "stiefel", "retraction": retraction}
    opt = tp.RiemannianAdam([group], lr=1e38)
    _grads(g, w)
    before = w.detach().clone()
    with pytest.raises(ValueError, match=r"the step c·ξ has entries up to .*, beyond √"):
        opt.step()
    assert torch.equal(w, before) and not opt.state


def test_the_step_size_is_taken_frame_by_frame():
    """ξ = c·u per frame: a large |u| in one frame with a small c there, and a large c where
    u = 0, is a small step, which the check does not blame (max|c|·max|u| would be 1e25)."""
    from torch_port.optim import checks
    from torch_port.optim.points import Geometries

    geometry = Geometries().stiefel({"geometry": "stiefel"}, torch.zeros(2, 8, 3))
    x = (tp.Stiefel(8, 3).random_point(torch.Generator().manual_seed(0), (2,)),)
    u = torch.zeros(2, 8, 3)
    u[0, 0, 0] = 1e15
    c = torch.tensor([1e-10, 1e10])  # float32: the limit is √(3.4e38) = 1.8e19
    checks.step_size(geometry, x, (u,), c)  # returns: the step's largest entry is 1e5
    with pytest.raises(ValueError, match=r"entries up to 1\.000e\+25"):
        checks.step_size(geometry, x, (u,), c.flip(0))


@pytest.mark.parametrize(
    ("cap", "edit", "message"),
    [
        (
            False,
            lambda sd: sd["state"][1].update(exp_avg=sd["state"][1]["exp_avg"].to_sparse()),
            r"\['exp_avg'\]: a torch.sparse_coo tensor, where the state is held dense",
        ),
        (
            False,
            lambda sd: sd["param_groups"][1].update(params=[[1]]),
            r"param_groups\[1\] of the state dict: params\[0\] is \[1\], not a parameter id",
        ),
        (
            True,
            lambda sd: sd["param_groups"][0].update(lr=torch.tensor(1e300, dtype=torch.float64)),
            r"param_groups\[0\] of the state dict: capturable=True: the step factor "
            r"lr/\(\(1 − β1\)·eps\) = inf overflows torch.float64",
        ),
    ],
    ids=["sparse state", "unhashable id", "capturable tensor lr whose step overflows"],
)
def test_hand_edited_state_dicts_are_refused_by_name(cap, edit, message):
    """A sparse state tensor and a parameter id that is a list gave raw internal errors; a
    saved tensor lr is read where the load checks it (lr/((1 − β1)·ε) = 1e300/(0.1·1e-8)
    overflows the float64 frames)."""
    w, b, opt, g = _model(cap)
    _grads(g, w, b)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    edit(sd)
    before = _snapshot(opt, w, b)
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(sd)
    assert _same(before, _snapshot(opt, w, b))


def test_a_one_entry_step_count_of_shape_1_loads_as_0_d_for_both_steps():
    """A step count of shape (1,) passed the load and then failed the capturable step's layout
    check; it is held 0-d, as torch's optimizers hold it."""
    w, b, opt, g = _model(True)
    _grads(g, w, b)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["step"] = sd["state"][0]["step"].reshape(1)
    opt.load_state_dict(sd)
    assert opt.state[w]["step"].shape == ()
    _grads(g, w, b)
    opt.step()
    assert float(opt.state[w]["step"]) == 2.0


@pytest.mark.parametrize("geometry", ["stiefel", None])
def test_parameters_on_the_meta_device_are_refused_by_name(geometry):
    """A model built on the meta device has no values to check or step (the point check read
    one and failed inside torch); the optimizer is refused until the model is materialised."""
    p = torch.nn.Parameter(torch.empty(2, 8, 3, device="meta"))
    group = {"params": [p]} if geometry is None else {"params": [p], "geometry": geometry}
    with pytest.raises(ValueError, match=r"shape \(2, 8, 3\) is on the meta device"):
        tp.RiemannianAdam([group], lr=1e-2)


@pytest.mark.parametrize(("dtype", "lr"), [(torch.float32, 100.0), (torch.float64, 1e4)])
def test_an_exponential_step_that_leaves_the_manifold_is_refused(dtype, lr):
    """The matrix exponentials of a long step lose orthonormality (float32: ‖YᵀY − I‖ = 0.14
    at ‖ξ‖ = 1600; float64: 3.5e-6 at 1.6e5); the step was written off St. It is refused
    against the point check's tolerance sqrt(ε), which a step of lr = 1 passes in float32
    (1.3e-5 at ‖ξ‖ = 16)."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(64, 4).random_point(g, (2,), dtype=dtype))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel", "retraction": "exp"}], lr=lr)
    _grads(g, w)
    before = w.detach().clone()
    with pytest.raises(ValueError, match=r"the exponential retraction's result is off St\(64, 4\)"):
        opt.step()
    assert torch.equal(w, before) and not opt.state
    opt.param_groups[0]["lr"] = 1.0
    opt.step()
    assert float(tp.Stiefel(64, 4).residual(w.detach()).max()) <= 3.5e-4
