"""How often one eager step reads the host: every transfer of a tensor's value to Python
(``aten._local_scalar_dense``, behind ``item``, ``bool`` and ``float`` of a tensor, and
``Tensor.tolist``), counted on the CPU with a dispatch mode. On a GPU each is a synchronisation.

A steady step of frames reads once in all (``torch_port.deferred``): the gradients' finiteness
and every branch of the frame path (the polar series' degree, the transport's and the norms'
overflow tests, the RMS, the step's ratio) are device conditions read together, and the step
counts are known from the tensors the last step wrote; the same holds on each of the eleven
geometries. The step whose conditions fail is computed again by the careful code; its results
equal the careful step's bitwise.
"""

from __future__ import annotations

import collections
import contextlib
import math
import traceback
import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import torch_port as tp  # noqa: E402
from torch_port import deferred, linalg  # noqa: E402
from torch_port.optim import ChainOptimizer  # noqa: E402


class HostReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` calls by the torch_port function that made them;
    those made while a point is recomputed carefully (``_careful_update``, after its
    speculation failed) under "careful recomputation"."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: collections.Counter[str] = collections.Counter()

    def record(self) -> None:
        stack = traceback.extract_stack()
        if any(f.name == "_careful_update" for f in stack):
            self.sites["careful recomputation"] += 1
            return
        site = next(
            (
                f"{f.filename.rsplit('/', 2)[-1]}:{f.name}"
                for f in reversed(stack)
                if "torch_port" in f.filename
            ),
            "elsewhere",
        )
        self.sites[site] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.record()
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counted_reads():
    """Count host reads: the dispatch mode, and ``Tensor.tolist`` (which does not dispatch)."""
    mode = HostReads()
    tolist = torch.Tensor.tolist

    def counting(self, *args, **kwargs):
        mode.record()
        return tolist(self, *args, **kwargs)

    torch.Tensor.tolist = counting
    try:
        with mode:
            yield mode
    finally:
        torch.Tensor.tolist = tolist


def frames_optimizer(count: int, dtype=torch.float32, **options) -> torch.optim.Optimizer:
    st = tp.Stiefel(64, 16)
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(st.random_point(gen, (4,)).to(dtype)) for _ in range(count)]
    opt = tp.RiemannianAdam([{"params": params, "geometry": "stiefel", **options}], lr=1e-3)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, dtype=dtype)
    opt.step()  # the first step makes the state and reads as it goes
    opt.step()  # the second speculates with the choices of the first
    return opt


STEADY = [
    pytest.param(
        count, dtype, options, id=f"{count}-{str(dtype)[6:]}-{'-'.join(options) or 'default'}"
    )
    for count in (1, 4)
    for dtype in (torch.float32, torch.float64)
    for options in ({}, {"trust_radius": 0.1}, {"reduction": "sum"}, {"eps": 0.0})
]


@pytest.mark.parametrize(("count", "dtype", "options"), STEADY)
def test_a_steady_step_of_frames_reads_the_host_once(count, dtype, options) -> None:
    opt = frames_optimizer(count, dtype, **options)
    with counted_reads() as reads:
        opt.step()
    assert reads.sites == {"deferred.py:which_hold": 1}, dict(reads.sites)


def test_the_counter_sees_each_kind_of_read() -> None:
    """Control: ``item``, ``bool``, ``float`` and ``tolist`` are each counted once."""
    a = torch.ones(3)
    with counted_reads() as reads:
        a.sum().item()
        bool(a.any())
        float(a[0])
        a.tolist()
    assert sum(reads.sites.values()) == 4


def snapshot(params: list, opt: torch.optim.Optimizer) -> list:
    """Copies of the parameters and of every tensor of their optimizer states (the parts of
    a tangent vector one by one)."""
    states = [v for p in params for v in opt.state.get(p, {}).values()]
    parts = [t for v in states for t in (v if isinstance(v, tuple) else (v,))]
    return [p.detach().clone() for p in params] + [t.clone() for t in parts]


def brockett_run(dtype, lrs, options, scales=None) -> list:
    """Three parameters of frames stepped under tr(WᵀAW), its gradient at step k times
    ``scales[k]`` (1 when not given), with the lr schedule ``lrs``: the parameters and states
    after each step (``None`` for a refused step, which changes nothing)."""
    st = tp.Stiefel(32, 8)
    gen = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(st.random_point(gen, (2,)).to(dtype)) for _ in range(3)]
    a = torch.randn(32, 32, generator=gen, dtype=dtype)
    opt = tp.RiemannianAdam([{"params": params, "geometry": "stiefel", **options}], lr=lrs[0])
    after = []
    for lr, scale in zip(lrs, scales or [1.0] * len(lrs), strict=True):
        opt.param_groups[0]["lr"] = lr
        opt.zero_grad()
        sum(torch.einsum("hdr,de,her->", w, a, w) for w in params).mul(scale).backward()
        try:
            opt.step()
        except ValueError:
            after.append(None)
            continue
        after.append(snapshot(params, opt))
    return after


def same(fast: list, slow: list) -> bool:
    """The same steps refused (``None``) and every tensor of the others equal bitwise."""
    return all(
        (f is None) == (s is None)
        and (f is None or all(torch.equal(a, b) for a, b in zip(f, s, strict=True)))
        for f, s in zip(fast, slow, strict=True)
    )


def careful_only(monkeypatch) -> None:
    monkeypatch.setattr(ChainOptimizer, "_speculative_updates", lambda self, *args: None)


#: lr schedules whose jumps move the polar series' degree (δ ~ lr²), so that speculation fails
#: and the careful code recomputes some steps.
SCHEDULES = {
    "jumps": [1e-3] * 3 + [0.3] * 3 + [1e-5] * 3 + [1e-3] * 3,
    "warm-up": [1e-4 * 2**k for k in range(12)],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("options", [{}, {"trust_radius": 0.05}], ids=["plain", "trust"])
def test_the_speculative_step_equals_the_careful_step_bitwise(
    monkeypatch, dtype, schedule, options
) -> None:
    recomputed = []
    careful_update = ChainOptimizer._careful_update

    def counting(self, point, t, group):
        recomputed.append(t)
        return careful_update(self, point, t, group)

    monkeypatch.setattr(ChainOptimizer, "_careful_update", counting)
    fast = brockett_run(dtype, SCHEDULES[schedule], options)
    assert any(t > 1 for t in recomputed), "no speculation failed: the test would be vacuous"
    assert len(recomputed) < 3 * len(SCHEDULES[schedule]), "every step was careful"
    careful_only(monkeypatch)
    slow = brockett_run(dtype, SCHEDULES[schedule], options)
    assert same(fast, slow)


def test_control_a_speculation_trusted_without_its_conditions_differs(monkeypatch) -> None:
    """Control: with the conditions ignored (every speculation taken), the degree of the last
    step is used where the careful code would choose another, and the trajectories part."""
    monkeypatch.setattr(deferred, "which_hold", lambda groups, agree=None: [True] * len(groups))
    fast = brockett_run(torch.float64, SCHEDULES["jumps"], {})
    careful_only(monkeypatch)
    slow = brockett_run(torch.float64, SCHEDULES["jumps"], {})
    assert not same(fast, slow)


def test_gradients_whose_sum_overflows_take_the_careful_step_and_equal_it(monkeypatch) -> None:
    """Finite gradients near float32's largest value (the transport's and norms' rescaled
    routes): the speculation fails on the gradients' sum and the careful step decides."""
    fast = brockett_run(torch.float32, [1e-3] * 4, {}, [1e36] * 4)
    careful_only(monkeypatch)
    slow = brockett_run(torch.float32, [1e-3] * 4, {}, [1e36] * 4)
    assert same(fast, slow)


#: Bad gradients at a steady step: (id, what is written into one entry).
BAD_GRADIENTS = [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf)]


def refusal_at_a_steady_step(value: float, skip: bool):
    """The error message (or the warning's, when the step is skipped) of a steady step whose
    gradient has ``value`` in one entry, and whether every parameter and state was kept."""
    opt = frames_optimizer(2, skip_nonfinite=skip)
    params = opt.param_groups[0]["params"]
    before = snapshot(params, opt)
    params[1].grad.view(-1)[7] = value
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            opt.step()
            message = str(caught[-1].message)
        except ValueError as err:
            message = str(err)
    return message, same([before], [snapshot(params, opt)])


@pytest.mark.parametrize("skip", [False, True], ids=["raise", "skip"])
@pytest.mark.parametrize(
    ("value"), [v for _, v in BAD_GRADIENTS], ids=[i for i, _ in BAD_GRADIENTS]
)
def test_a_bad_gradient_at_a_steady_step_is_refused_as_the_careful_step_refuses_it(
    monkeypatch, value, skip
) -> None:
    fast = refusal_at_a_steady_step(value, skip)
    careful_only(monkeypatch)
    slow = refusal_at_a_steady_step(value, skip)
    assert fast == slow
    assert fast[1], "a refused step changed a parameter or a state"
    assert "params'][1]" in fast[0] and "1 non-finite entries" in fast[0], fast[0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_degree_intervals_are_exactly_the_careful_codes_choices(dtype) -> None:
    """``taylor_degree_interval(k)`` = (lo, hi] holds exactly the δ that ``_taylor_degree``
    maps to k: both ends (hi and the next float above it, lo and the next above it), and
    20,000 δ spread log-uniformly over [1e-20, 0.999]."""
    tol = linalg.series_tolerance(dtype)
    for k in range(14):
        lo, hi = linalg.taylor_degree_interval(k, tol)
        assert linalg._taylor_degree(hi, tol) == k
        assert linalg._taylor_degree(math.nextafter(hi, 1.0), tol) == k + 1
        if k:
            assert linalg._taylor_degree(lo, tol) == k - 1
            assert linalg._taylor_degree(math.nextafter(lo, 1.0), tol) == k
    gen = torch.Generator().manual_seed(0)
    deltas = (10 ** (torch.rand(20_000, generator=gen, dtype=torch.float64) * -20)).clamp(max=0.999)
    for delta in deltas.tolist():
        k = linalg._taylor_degree(delta, tol)
        lo, hi = linalg.taylor_degree_interval(k, tol)
        assert lo < delta <= hi, (delta, k, lo, hi)


def attention_run(name: str, dtype, lrs) -> list:
    """An attention module with ``name`` on its QK and VO products (MHA sizes), stepped by
    ``RiemannianAdam`` under mean(out²) with the lr schedule ``lrs``: the parameters and
    states after each step."""
    from torch_port.nn import RiemannianMultiheadAttention, build_optimizer

    gen = torch.Generator().manual_seed(2)
    m = RiemannianMultiheadAttention(
        d_model=8, n_heads=4, n_kv_heads=4, head_dim=2, qk_geometry=name, vo_geometry=name,
        generator=gen, dtype=dtype,
    )  # fmt: skip
    opt = build_optimizer(m, tp.RiemannianAdam, lr=lrs[0])
    x = torch.randn(3, 5, 8, generator=gen, dtype=dtype)
    after = []
    for lr in lrs:
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        (m(x) ** 2).mean().backward()
        opt.step()
        after.append(snapshot(list(m.parameters()), opt))
    return after


GEOMETRY_NAMES = list(tp.geometries.GEOMETRIES)


@pytest.mark.parametrize("name", GEOMETRY_NAMES)
def test_a_steady_step_of_every_geometry_reads_the_host_once(name) -> None:
    from torch_port.nn import RiemannianMultiheadAttention, build_optimizer

    gen = torch.Generator().manual_seed(3)
    m = RiemannianMultiheadAttention(
        d_model=8, n_heads=4, n_kv_heads=4, head_dim=2, qk_geometry=name, vo_geometry=name,
        generator=gen,
    )  # fmt: skip
    opt = build_optimizer(m, tp.RiemannianAdam, lr=1e-3)
    x = torch.randn(3, 5, 8, generator=gen)
    for _ in range(3):
        opt.zero_grad()
        (m(x) ** 2).mean().backward()
        with counted_reads() as reads:
            opt.step()
    assert reads.sites == {"deferred.py:which_hold": 1}, dict(reads.sites)


@pytest.mark.parametrize("name", GEOMETRY_NAMES)
def test_every_geometry_steps_as_the_careful_step_bitwise(monkeypatch, name) -> None:
    """float64, an lr schedule with jumps (1e-3, 0.5, 1e-5), which makes seven of the eleven
    recompute some of their steps carefully (their polar degree moves)."""
    lrs = [1e-3] * 3 + [0.5] * 2 + [1e-5] * 2 + [1e-3] * 2
    fast = attention_run(name, torch.float64, lrs)
    careful_only(monkeypatch)
    assert same(fast, attention_run(name, torch.float64, lrs))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dtype=strategies.sampled_from([torch.float32, torch.float64]),
    lrs=strategies.lists(strategies.floats(1e-6, 2.0), min_size=6, max_size=6),
    scales=strategies.lists(
        strategies.sampled_from([1.0, 1e-3, 1e3, 1e-30, 1e30, 1e-300, 0.0]), min_size=6, max_size=6
    ),
    options=strategies.sampled_from(
        [{}, {"trust_radius": 0.1}, {"eps": 0.0}, {"reduction": "sum"}]
    ),
)
def test_any_schedule_and_gradient_scale_steps_as_the_careful_step(
    monkeypatch, dtype, lrs, scales, options
) -> None:
    """Property: for lr schedules in [1e-6, 2] and gradients scaled by factors from 0 to
    1e±300 (overflowing float32, underflowing it, zero), the speculative step equals the
    careful step bitwise, refusing the same steps."""
    scales = [s if dtype == torch.float64 or s < 1e38 else 1e38 for s in scales]
    fast = brockett_run(dtype, lrs, options, scales)
    with monkeypatch.context() as patch:
        careful_only(patch)
        slow = brockett_run(dtype, lrs, options, scales)
    assert same(fast, slow)


#: A stored state corrupted between two steady steps: (id, change, message pattern).
CORRUPTED_STATES = [
    ("no step", lambda st: st.pop("step"), r"expected the entries .* got \['exp_avg', 'sqrt_v'\]"),
    ("step a string", lambda st: st.__setitem__("step", "7"), r"\['step'\]: expected the step"),
    (
        "step of two entries",
        lambda st: st.__setitem__("step", torch.tensor([1.0, 2.0])),
        r"\['step'\]: expected a one-entry floating tensor, got shape \(2,\)",
    ),
    (
        "moment of another shape",
        lambda st: st.__setitem__("exp_avg", torch.zeros(3, 3)),
        r"\['exp_avg'\]",
    ),
]


@pytest.mark.parametrize(
    ("change", "pattern"), [r[1:] for r in CORRUPTED_STATES], ids=[r[0] for r in CORRUPTED_STATES]
)
def test_a_state_corrupted_at_a_steady_step_is_refused_by_name_before_any_read(
    change, pattern
) -> None:
    """The speculative step checks the stored states before it reads their step counts."""
    opt = frames_optimizer(1)
    (p,) = opt.param_groups[0]["params"]
    before = p.detach().clone()
    change(opt.state[p])
    with pytest.raises(ValueError, match=pattern):
        opt.step()
    assert torch.equal(p.detach(), before)


def test_a_tensor_lr_is_read_once_per_group() -> None:
    """A tensor lr in the eager step: read once per group, where the guard takes and checks
    its value (a change made through ``.data`` moves no version counter, so the value is read
    at every step, as torch's optimizers read it), however many points the group holds;
    besides that, the frames' one read and torch's AdamW's reads of its CPU step count (two
    for the one plain parameter: its two bias corrections)."""
    gen = torch.Generator().manual_seed(5)
    frames = [
        torch.nn.Parameter(tp.Stiefel(16, 4).random_point(gen, (2,)).float()) for _ in range(4)
    ]
    plain = torch.nn.Parameter(torch.randn(5, generator=gen))
    lr = torch.tensor(1e-3)
    opt = tp.RiemannianAdam([{"params": frames, "geometry": "stiefel"}, {"params": [plain]}], lr=lr)
    sites = []
    for k in range(4):
        if k == 3:
            lr.fill_(2e-3)  # a scheduler's change: both groups hold this tensor
        for p in [*frames, plain]:
            p.grad = torch.randn(p.shape, generator=gen)
        with counted_reads() as reads:
            opt.step()
        sites.append(dict(reads.sites))
    steady = {"values.py:tensor_lr": 2, "deferred.py:which_hold": 1, "optimizer.py:_adamw": 2}
    assert sites[1] == sites[2] == sites[3] == steady, sites


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_steady_step_on_cuda_synchronises_once() -> None:
    """On a GPU, CUDA's own count: ``torch.cuda.set_sync_debug_mode("warn")`` warns at every
    operation that synchronises the host with the device; a steady step of frames (and a
    plain group, whose AdamW keeps its step counts on the CPU) warns once."""
    gen = torch.Generator().manual_seed(6)
    frames = [
        torch.nn.Parameter(tp.Stiefel(64, 16).random_point(gen, (4,)).float().cuda())
        for _ in range(4)
    ]
    plain = torch.nn.Parameter(torch.randn(5, generator=gen).cuda())
    opt = tp.RiemannianAdam(
        [{"params": frames, "geometry": "stiefel"}, {"params": [plain]}], lr=1e-3
    )
    for p in [*frames, plain]:
        p.grad = torch.randn(p.shape, generator=gen).cuda()
    opt.step()
    opt.step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, syncs


#: The stored step count changed between steady steps: (id, the change).
STEP_COUNT_CHANGES = [
    ("in place", lambda step: step.fill_(40.0)),
    ("its data replaced", lambda step: setattr(step, "data", torch.tensor(40.0))),
]


@pytest.mark.parametrize(
    "change", [c for _, c in STEP_COUNT_CHANGES], ids=[i for i, _ in STEP_COUNT_CHANGES]
)
def test_a_step_count_changed_through_torch_is_read_again(change) -> None:
    """The count the step uses is the stored one whenever torch changed it: t = 41 after a
    change to 40 (the state's "step" after the step), not the 4 the optimizer remembers."""
    opt = frames_optimizer(1)
    opt.step()  # the third step: the stored count is 3
    (p,) = opt.param_groups[0]["params"]
    change(opt.state[p]["step"])
    opt.step()
    assert float(opt.state[p]["step"]) == 41.0
