"""The optimizer zoo of the conformance suite (proofs_checks/conformance/zoo.py).

(a) every clean member agrees with its ``reference.optim`` preset over 50 steps, and the faulty
    members that are a documented ablation arm of the reference agree with that arm;
(b) every faulty member departs from its clean rule by more than that tolerance (the negative
    control of (a));
(c) state_dict round trip: a resumed run is bitwise identical;
(d) lr = 0 leaves the point bitwise unchanged (moments still updated); a None grad leaves the
    point and the state unchanged.

Tolerance of (a). One step of either implementation rounds: the Riemannian gradient (WᵀG, an
inner product of length d, then W·sym(·), length r: ≲ (d + r)·u relative to ‖G‖, times lr in ξ),
the moment arithmetic (a few roundings, relative, times lr), and the polar retraction (Gram of
length d, eigh of the r×r Gram, a product of length r, κ(W + ξ) ≤ sqrt(1 + ‖ξ‖²) ≈ 1): a few
(d + r)·u in the new point, for each of the two implementations. The gradient is a smooth
function of the point and lr·‖∂G/∂W‖ ≪ 1, so an error already in the point is carried on with a
factor ≈ 1 per step (polar is a projection: it does not amplify it). After k steps the two
trajectories differ by at most k·c·(d + r)·u per frame (Frobenius), with c = 8 (two
implementations, ≲ 4 (d + r)·u each per step); measured: well below (see the report in the
assertion messages).
"""

from __future__ import annotations

import dataclasses
import io
import warnings

import numpy as np
import pytest
from conftest import U

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402
from proofs_checks.conformance import zoo  # noqa: E402
from reference.optim import FrameDecayWarning  # noqa: E402

STEPS = 50
LR = 2e-2  # set in the groups after construction (the factories' default is 1e-2)
C = 8.0
SHAPES = [(7, 3), (2, 5, 2)]
DTYPES = [torch.float64, torch.float32]


def tolerance(shape: tuple[int, ...], steps: int = STEPS) -> float:
    """k·c·(d + r)·u: the float64 rounding budget of k steps (module docstring)."""
    d, r = shape[-2:]
    return steps * C * (d + r) * U


class Problem:
    """Seeded frames and gradients G_t(W) = 2·A·W·N + B_t per frame (A symmetric d×d,
    N = diag(r, …, 1), B_t Gaussian), a Brockett cost plus a time-varying term."""

    def __init__(self, shape: tuple[int, ...], seed: int = 0):
        rng = np.random.default_rng(seed)
        d, r = shape[-2:]
        self.shape, self.d, self.r = shape, d, r
        self.count = int(np.prod(shape[:-2], dtype=int))
        st = ref.Stiefel(d, r)
        self.w0 = np.stack([st.random_point(rng) for _ in range(self.count)]).reshape(shape)
        m = rng.standard_normal((d, d))
        self.a = (m + m.T) / 2.0
        self.n = np.diag(np.arange(r, 0, -1.0))
        self.b = 0.3 * rng.standard_normal((2 * STEPS, self.count, d, r))

    def frame_grad(self, w: np.ndarray, t: int, k: int) -> np.ndarray:
        return 2.0 * self.a @ w @ self.n + self.b[t, k]

    def grad(self, w: np.ndarray, t: int) -> np.ndarray:
        frames = w.reshape(-1, self.d, self.r)
        return np.stack([self.frame_grad(f, t, k) for k, f in enumerate(frames)]).reshape(
            self.shape
        )


def _set(opt: torch.optim.Optimizer, **hyper: float) -> None:
    for group in opt.param_groups:
        group.update(hyper)


def _grad(problem: Problem, p: torch.Tensor, t: int) -> torch.Tensor:
    w = p.detach().to(torch.float64).numpy()
    return torch.tensor(problem.grad(w, t), dtype=p.dtype)


def run_zoo(name: str, problem: Problem, lr: float, weight_decay: float, steps: int = STEPS):
    """The member's points after each step (float64 array (steps, *shape))."""
    p = torch.nn.Parameter(torch.tensor(problem.w0, dtype=torch.float64))
    opt = zoo.MEMBERS[name].factory([p])
    _set(opt, lr=lr, weight_decay=weight_decay)  # as a harness does, after construction
    path = []
    for t in range(steps):
        p.grad = _grad(problem, p, t)
        opt.step()
        path.append(p.detach().numpy().copy())
    return np.stack(path)


def run_reference(opt: ref.optim.Optimizer, problem: Problem, steps: int = STEPS) -> np.ndarray:
    """The reference's points after each step, one independent run per frame."""
    st = ref.Stiefel(problem.d, problem.r)
    out = np.empty((steps, problem.count, problem.d, problem.r))
    for k, w in enumerate(problem.w0.reshape(-1, problem.d, problem.r)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FrameDecayWarning)  # asserted in its own test
            state = opt.init(st, w)
        for t in range(steps):
            w, state = opt.step(st, w, problem.frame_grad(w, t, k), state)
            out[t, k] = w
    return out.reshape(steps, *problem.shape)


def deviation(a: np.ndarray, b: np.ndarray) -> float:
    """max over steps and frames of ‖a − b‖_F."""
    d, r = a.shape[-2:]
    diff = (a - b).reshape(a.shape[0], -1, d, r)
    return float(np.max(np.linalg.norm(diff, axis=(-2, -1))))


def _coupled(opt: ref.optim.Optimizer, lam: float, **kw) -> ref.optim.Optimizer:
    return dataclasses.replace(opt, weight_decay=lam, **kw)


#: name, λ, the reference optimizer it must equal (clean members, and faulty members that are a
#: documented ablation arm of the reference).
REFERENCE_CASES = [
    ("clean_adam", 0.0, lambda lr, lam: ref.optim.riemannian_adam(lr, moment="frame")),
    (
        "clean_adam",
        0.1,
        lambda lr, lam: ref.optim.riemannian_adam(lr, reduction="mean", weight_decay=lam),
    ),
    (
        "clean_adam_fused_decay",
        0.1,
        lambda lr, lam: ref.optim.riemannian_adam(lr, weight_decay=lam, decay="fused"),
    ),
    ("clean_rsgd", 0.0, lambda lr, lam: ref.optim.rsgd(lr)),
    ("clean_rsgd", 0.1, lambda lr, lam: _coupled(ref.optim.rsgd(lr), lam)),
    ("clean_momentum", 0.0, lambda lr, lam: ref.optim.riemannian_momentum(lr, 0.9, 1.0)),
    (
        "clean_momentum",
        0.1,
        lambda lr, lam: _coupled(ref.optim.riemannian_momentum(lr, 0.9, 1.0), lam),
    ),
    # faulty members that are exactly an ablation arm of the reference
    (
        "raw_gradient_rsgd",
        0.1,
        lambda lr, lam: _coupled(ref.optim.rsgd(lr), lam, gradient="euclidean"),
    ),
    (
        "raw_gradient_adam",
        0.0,
        lambda lr, lam: dataclasses.replace(ref.optim.riemannian_adam(lr), gradient="euclidean"),
    ),
    (
        "elementwise_moment",
        0.0,
        lambda lr, lam: ref.optim.riemannian_adam(lr, moment="elementwise"),
    ),
    ("halved_gradient", 0.0, lambda lr, lam: ref.optim.rsgd(lr / 2)),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    ("name", "lam", "make"), REFERENCE_CASES, ids=[f"{n}-wd{w}" for n, w, _ in REFERENCE_CASES]
)
def test_agrees_with_reference(name, lam, make, shape):
    problem = Problem(shape)
    got = run_zoo(name, problem, LR, lam)
    want = run_reference(make(LR, lam), problem)
    dev, tol = deviation(got, want), tolerance(shape)
    assert dev <= tol, f"{name} λ={lam} {shape}: deviation {dev:.3e} > {tol:.3e}"


def test_reference_warns_on_frame_decay():
    st = ref.Stiefel(7, 3)
    w = st.random_point(np.random.default_rng(0))
    with pytest.warns(FrameDecayWarning):
        ref.optim.riemannian_adam(LR, weight_decay=0.1, decay="fused").init(st, w)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", zoo.FAULTY)
def test_fault_departs_from_clean(name, shape):
    member = zoo.MEMBERS[name]
    problem = Problem(shape)
    lam = member.weight_decay
    faulty = run_zoo(name, problem, LR, lam)
    clean = run_zoo(member.clean, problem, LR, lam)
    dev, tol = deviation(faulty, clean), tolerance(shape)
    assert dev > tol, f"{name} ({member.fault}) {shape}: deviation {dev:.3e} ≤ {tol:.3e}"


@pytest.mark.parametrize("name", ["decay_on_frames", "decay_does_nothing"])
def test_decay_faults_need_decay(name):
    """Without λ the decay faults are invisible: bitwise equal to their clean rule."""
    problem = Problem(SHAPES[0])
    member = zoo.MEMBERS[name]
    steps = 10
    faulty = run_zoo(name, problem, LR, 0.0, steps)
    clean = run_zoo(member.clean, problem, LR, 0.0, steps)
    assert np.array_equal(faulty, clean)


def test_members_table():
    assert set(zoo.CLEAN) == {
        "clean_adam",
        "clean_adam_fused_decay",
        "clean_rsgd",
        "clean_momentum",
    }
    assert len(zoo.FAULTY) == 9
    for name, member in zoo.MEMBERS.items():
        assert getattr(zoo, name) is member.factory
        assert member.factory.__doc__
        assert (member.fault is None) == (name in zoo.CLEAN)
        assert zoo.MEMBERS[member.clean].fault is None


# -- state round trip, lr = 0, None grads ------------------------------------------------------
def _params(dtype: torch.dtype) -> tuple[list[torch.nn.Parameter], list[Problem]]:
    problems = [Problem(shape, seed=1 + i) for i, shape in enumerate(SHAPES)]
    params = [torch.nn.Parameter(torch.tensor(pr.w0, dtype=dtype)) for pr in problems]
    return params, problems


def _member(name: str, dtype: torch.dtype, lr: float = LR):
    """(optimizer, params, problems): zoo member ``name`` over fresh ``_params(dtype)``, its
    groups set to ``lr`` and weight decay 0.1."""
    params, problems = _params(dtype)
    opt = zoo.MEMBERS[name].factory(params)
    _set(opt, lr=lr, weight_decay=0.1)
    return opt, params, problems


def _steps(opt, params, problems, start: int, count: int) -> None:
    for t in range(start, start + count):
        for p, pr in zip(params, problems, strict=True):
            p.grad = _grad(pr, p, t)
        opt.step()


def _state_equal(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key, x in a.items():
        y = b[key]
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def _snapshot(state: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(zoo.MEMBERS))
def test_state_dict_round_trip(name, dtype):
    opt, params, problems = _member(name, dtype, lr=3e-2)
    _steps(opt, params, problems, 0, 5)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    clones = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = zoo.MEMBERS[name].factory(clones)  # default lr and λ: the state dict restores them
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["lr"] == 3e-2
    assert resumed.param_groups[0]["weight_decay"] == 0.1
    _steps(opt, params, problems, 5, 5)
    _steps(resumed, clones, problems, 5, 5)
    for p, q in zip(params, clones, strict=True):
        assert p.dtype == q.dtype == dtype
        assert torch.equal(p, q)
        assert _state_equal(opt.state[p], resumed.state[q])
        assert all(v.dtype == dtype for v in opt.state[p].values() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(zoo.MEMBERS))
def test_lr_zero_leaves_point(name, dtype):
    opt, params, problems = _member(name, dtype)
    _steps(opt, params, problems, 0, 3)
    before = [p.detach().clone() for p in params]
    states = [_snapshot(opt.state[p]) for p in params]
    _set(opt, lr=0.0)
    _steps(opt, params, problems, 3, 1)
    for p, w, s in zip(params, before, states, strict=True):
        assert torch.equal(p, w)
        assert opt.state[p]["step"] == s["step"] + 1
        for key in ("exp_avg", "sqrt_v", "momentum_buffer"):  # the moments are still updated
            if key in s:
                assert not torch.equal(opt.state[p][key], s[key]), key


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(zoo.MEMBERS))
def test_none_grad_leaves_point_and_state(name, dtype):
    opt, params, problems = _member(name, dtype)
    # never given a gradient: no state, point unchanged
    start = params[1].detach().clone()
    params[0].grad = _grad(problems[0], params[0], 0)
    params[1].grad = None
    opt.step()
    assert torch.equal(params[1], start)
    assert not opt.state.get(params[1])
    # given gradients, then none: point and state as they were
    _steps(opt, params, problems, 1, 3)
    point, state = params[1].detach().clone(), _snapshot(opt.state[params[1]])
    moved = params[0].detach().clone()
    params[0].grad = _grad(problems[0], params[0], 4)
    params[1].grad = None
    opt.step()
    assert torch.equal(params[1], point)
    assert _state_equal(opt.state[params[1]], state)
    assert not torch.equal(params[0], moved)
