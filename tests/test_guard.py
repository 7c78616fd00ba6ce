"""The one guard (``torch_port.optim.guard``): a group is validated when it is added and again
only when its values change, and a point when its group is added and at its first step. That
each bad change made between steps is refused before the next step writes anything:
``test_step_refusals`` (its tables ``AFTER_CONSTRUCTION`` and ``CHANGED_UNSEEN``)."""

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from torch_port.optim.guard import Guard  # noqa: E402
from torch_port.stiefel import StiefelFrames  # noqa: E402


def _setup(lr=1e-2):
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(8, 3).random_point(gen, (2,)))
    b = torch.nn.Parameter(torch.randn(4, generator=gen))
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel", "betas": [0.9, 0.999]}, {"params": [b]}], lr=lr
    )
    return opt, w, b, gen


def _grads(w, b, gen):
    w.grad = torch.randn(w.shape, generator=gen, dtype=w.dtype)
    b.grad = torch.randn(b.shape, generator=gen, dtype=b.dtype)


@pytest.fixture
def calls(monkeypatch):
    """How often each check of the guard runs (hyperparameters, structure, a point)."""
    counts = {"hyperparameters": 0, "structure": 0, "point": 0}

    def counting(name, original):
        def run(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)

        return run

    monkeypatch.setattr(
        Guard, "_check_hyperparameters", counting("hyperparameters", Guard._check_hyperparameters)
    )
    monkeypatch.setattr(Guard, "_check_structure", counting("structure", Guard._check_structure))
    monkeypatch.setattr(StiefelFrames, "check_point", counting("point", StiefelFrames.check_point))
    return counts


def test_a_steady_step_validates_nothing_again(calls) -> None:
    """Construction validates each group once and each point once, the first step checks the
    point again (whatever changed it need not have been seen by torch), and later steps
    validate nothing."""
    opt, w, b, gen = _setup()
    assert calls == {"hyperparameters": 2, "structure": 2, "point": 1}
    for _ in range(3):
        _grads(w, b, gen)
        opt.step()
    assert calls == {"hyperparameters": 2, "structure": 2, "point": 2}


@pytest.mark.parametrize(
    "change, hyperparameters, structure",
    [
        ("float lr", 1, 0),
        ("tensor lr", 1, 0),
        ("betas in place", 1, 0),
        ("appended parameter", 1, 1),
        ("parameter's data", 1, 1),
    ],
)
def test_a_change_between_steps_is_validated_once(calls, change, hyperparameters, structure):
    """The control of the test above: each kind of change makes the guard validate the group it
    touched, once, at the next step (the hyperparameters of a changed group, and its structure
    too where a parameter changed), and then no more."""
    opt, w, b, gen = _setup(lr=torch.tensor(1e-2) if change == "tensor lr" else 1e-2)
    _grads(w, b, gen)
    opt.step()
    before = dict(calls)
    group = opt.param_groups[0]
    if change == "float lr":
        group["lr"] = 2e-2
    elif change == "tensor lr":
        group["lr"].fill_(2e-2)  # a scheduler's in-place change: both groups hold the tensor
    elif change == "betas in place":
        group["betas"][0] = 0.8
    elif change == "appended parameter":
        group["params"].append(torch.nn.Parameter(tp.Stiefel(8, 3).random_point(gen)))
    else:  # the same values in another memory layout (column-major frames)
        w.data = w.data.transpose(-1, -2).contiguous().transpose(-1, -2)
    for _ in range(2):
        _grads(w, b, gen)
        opt.step()
    groups = 2 if change == "tensor lr" else 1
    assert calls["hyperparameters"] - before["hyperparameters"] == groups * hyperparameters
    assert calls["structure"] - before["structure"] == structure


def test_a_point_changed_unseen_after_its_check_is_refused_at_its_first_step(calls) -> None:
    """A point checked when its group was added, then moved off its manifold through ``.data``
    (which moves no version counter) before the first step, is refused by that step with its
    residual ‖WᵀW − I‖ = ‖4I − I‖_F = 3√3 for W doubled."""
    opt, w, b, gen = _setup()
    w.data.mul_(2.0)
    _grads(w, b, gen)
    off = r"param_groups\[0\]\['params'\]\[0\] \(shape \(2, 8, 3\)\): point is off St\(8, 3\)"
    with pytest.raises(ValueError, match=off + r": ‖WᵀW − I‖ = 5\.196e\+00"):
        opt.step()
    assert calls["point"] == 2 and not opt.state[w]


def test_the_same_factors_under_another_geometry_are_checked_as_its_points() -> None:
    """A group whose geometry is changed in place before its first step: its factors are
    checked as points of the new geometry (R2's free factors are not a Stiefel pair's
    frames)."""
    gen = torch.Generator().manual_seed(1)
    u, v = (
        torch.nn.Parameter(torch.randn(n, 2, generator=gen, dtype=torch.float64)) for n in (6, 5)
    )
    opt = tp.RiemannianAdam([{"params": [u, v], "geometry": "fixed_rank_quotient"}], lr=1e-2)
    opt.param_groups[0]["geometry"] = "stiefel_pair"
    u.grad, v.grad = torch.ones_like(u), torch.ones_like(v)
    before = (u.detach().clone(), v.detach().clone())
    with pytest.raises(ValueError, match=r"stiefel_pair"):
        opt.step()
    assert torch.equal(u, before[0]) and torch.equal(v, before[1]) and not opt.state


def test_a_tensor_lr_made_under_inference_mode_steps() -> None:
    """A tensor lr made under ``torch.inference_mode`` (which keeps no version counter) is
    taken as any other."""
    with torch.inference_mode():
        lr = torch.tensor(1e-2)
    opt, w, b, gen = _setup()
    opt.param_groups[1]["lr"] = lr
    _grads(w, b, gen)
    before = b.detach().clone()
    opt.step()
    assert not torch.equal(b, before)
