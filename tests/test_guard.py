"""The one guard (``torch_port.optim.guard``): a group is validated when it is added and again
only when its values change, and a point is checked once. That each bad change made between
steps is refused before the next step writes anything: ``test_step_refusals`` (its tables
``AFTER_CONSTRUCTION`` and ``CHANGED_UNSEEN``)."""

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
    """Construction validates each group once and each point once; the first step checks the
    points it has seen unchanged no more, and later steps validate nothing."""
    opt, w, b, gen = _setup()
    assert calls == {"hyperparameters": 2, "structure": 2, "point": 1}
    for _ in range(3):
        _grads(w, b, gen)
        opt.step()
    assert calls == {"hyperparameters": 2, "structure": 2, "point": 1}


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


def test_a_point_changed_after_its_check_is_checked_again(calls) -> None:
    """A point checked when its group was added, then moved off its manifold in place before
    the first step, is checked again by that step and refused with its residual (the version
    its check remembered no longer matches)."""
    opt, w, b, gen = _setup()
    with torch.no_grad():
        w.mul_(2.0)
    _grads(w, b, gen)
    off = r"param_groups\[0\]\['params'\]\[0\] \(shape \(2, 8, 3\)\): point is off St\(8, 3\)"
    with pytest.raises(ValueError, match=off + r": ‖WᵀW − I‖ = 5\.196e\+00"):
        opt.step()
    assert calls["point"] == 2 and not opt.state[w]
