"""``torch_port.audit``: what a recorded step holds, checked by replaying it (with the port, and
with the reference in float64), and that a trace is read without running code from the file."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402
import torch_port as tp  # noqa: E402
from reference import optim as ro  # noqa: E402
from torch_port import audit  # noqa: E402

LR = 1e-2


def _run(path, every: int, steps: int = 4):
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(7, 3).random_point(gen, (2,)))
    r2 = tp.GEOMETRIES["fixed_rank_quotient"](5, 4, 2)
    a, b = (torch.nn.Parameter(t) for t in r2.random_point(gen, (3,)))
    plain = torch.nn.Parameter(torch.randn(4, generator=gen, dtype=torch.float64))
    groups = [
        {"params": [w], "geometry": "stiefel", "param_names": ["w"]},
        {"params": [a, b], "geometry": "fixed_rank_quotient", "param_names": ["a", "b"]},
        {"params": [plain], "param_names": ["plain"]},
    ]
    opt = tp.RiemannianAdam(groups, lr=LR, trust_radius=0.02)  # the cap acts: ‖ξ₁‖ ≈ lr·√21
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with audit.record(opt, path, every=every):
        for _ in range(steps):
            opt.zero_grad()
            loss = (w**3).sum() + (a @ b.transpose(-1, -2)).square().sum() + plain.square().sum()
            loss.backward()
            opt.step()
            sched.step()
    return opt


def test_every_kth_step_of_every_point_is_recorded(tmp_path) -> None:
    _run(tmp_path / "t.npz", every=2)
    trace = audit.load(tmp_path / "t.npz")
    steps = trace.meta["steps"]
    assert [(s["geometry"], s["step"]) for s in steps] == [
        ("stiefel", 2),
        ("fixed_rank_quotient", 2),
        ("stiefel", 4),
        ("fixed_rank_quotient", 4),
    ]
    # the learning rate as the scheduler set it at that step: 1e-2 · 0.5^(t − 1)
    assert [s["hyperparameters"]["lr"] for s in steps] == pytest.approx(
        [LR * 0.5, LR * 0.5, LR * 0.125, LR * 0.125], rel=0, abs=0
    )
    first = steps[0]
    assert first["names"] == ["w"] and first["taken"] and first["dtypes"] == ["torch.float64"]
    assert [p.shape for p in trace.parts(0, "x")] == [(2, 7, 3)]
    assert [p.shape for p in trace.parts(1, "x")] == [(3, 5, 2), (3, 4, 2)]
    assert set(first["state_keys"]) == {"step", "exp_avg", "sqrt_v"}
    assert trace.parts(0, "state/exp_avg")[0].shape == (2, 7, 3)


def test_a_recorded_step_replays_bitwise_through_the_port(tmp_path) -> None:
    """From the recorded point, gradient, state and hyperparameters a fresh optimizer takes the
    recorded step exactly: the record holds everything the step depended on."""
    _run(tmp_path / "t.npz", every=1, steps=3)
    trace = audit.load(tmp_path / "t.npz")
    k = next(i for i, s in enumerate(trace.meta["steps"]) if s["step"] == 3 and s["group"] == 0)
    s = trace.meta["steps"][k]
    w = torch.nn.Parameter(torch.from_numpy(trace.parts(k, "x")[0]))
    hyper = {n: v for n, v in s["hyperparameters"].items() if n != "initial_lr"}
    opt = tp.RiemannianAdam([{"params": [w], **hyper}])
    state = {
        "step": torch.tensor(float(trace.parts(k, "state/step")[0])),
        "exp_avg": torch.from_numpy(trace.parts(k, "state/exp_avg")[0]),
        "sqrt_v": torch.from_numpy(trace.parts(k, "state/sqrt_v")[0]),
    }
    opt.load_state_dict(
        {"state": {0: state}, "param_groups": [{**opt.param_groups[0], "params": [0]}]}
    )
    w.grad = torch.from_numpy(trace.parts(k, "g")[0])
    opt.step()
    assert np.array_equal(w.detach().numpy(), trace.parts(k, "y")[0])


def test_the_first_recorded_step_agrees_with_the_reference(tmp_path) -> None:
    """Step 1 (zero state) of each recorded frame through reference.optim in float64 lands on
    the recorded point to 1e-14 (one step of the 1e-14-per-step agreement bound)."""
    _run(tmp_path / "t.npz", every=1, steps=1)
    trace = audit.load(tmp_path / "t.npz")
    s = trace.meta["steps"][0]
    assert s["geometry"] == "stiefel" and s["step"] == 1
    x, g, y = (trace.parts(0, what)[0] for what in ("x", "g", "y"))
    st = ref.Stiefel(7, 3)
    hyper = s["hyperparameters"]
    opt = ro.riemannian_adam(
        lr=hyper["lr"],
        betas=tuple(hyper["betas"]),
        eps=hyper["eps"],
        trust_radius=hyper["trust_radius"],
    )
    for i in range(2):
        yi, _ = opt.step(st, x[i], g[i], opt.init(st, x[i]))
        assert np.max(np.abs(yi - y[i])) <= 1e-14
    # negative control: the reference without the trust radius lands elsewhere
    loose = ro.riemannian_adam(lr=hyper["lr"], betas=tuple(hyper["betas"]), eps=hyper["eps"])
    y0, _ = loose.step(st, x[0], g[0], loose.init(st, x[0]))
    assert np.max(np.abs(y0 - y[0])) > 1e-6


def test_refusals(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"needs an optimizer of torch_port\.optim"):
        audit.record(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1), tmp_path / "a")
    opt = tp.RSGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match="every must be an integer ≥ 1, got 0"):
        audit.record(opt, tmp_path / "a", every=0)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"bad\.npz: not an audit trace"):
        audit.load(bad)
    # an object array (a pickle inside the .npz) is refused, not unpickled
    np.savez(tmp_path / "obj.npz", **{"meta.json": np.array([{"x": 1}], dtype=object)})
    with pytest.raises(ValueError, match=r"obj\.npz: not an audit trace"):
        audit.load(tmp_path / "obj.npz")
