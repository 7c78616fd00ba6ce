"""``torch_port.audit`` and ``rattn audit``: what a recorded step holds; honest runs pass in
float64, float32 and bfloat16 for every geometry and rule, with a schedule, clipping,
accumulation, autocast; and each departure from the rule is flagged at the step where it
happens. The bounds are derived in ``proofs_checks/audit/bounds.py`` (module docstring);
no tolerance is chosen here."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402
import torch_port as tp  # noqa: E402
from proofs_checks.audit import replay as pa  # noqa: E402
from proofs_checks.audit.report import format_table  # noqa: E402
from proofs_checks.audit.verdicts import RESOLUTION  # noqa: E402
from proofs_checks.cli import main  # noqa: E402
from proofs_checks.port_compare.problems import PROBLEMS  # noqa: E402
from proofs_checks.port_compare.rules import RECORDS, RULES  # noqa: E402
from reference import optim as ro  # noqa: E402
from torch_port import audit  # noqa: E402
from torch_port.optim import transforms  # noqa: E402

LR = 1e-2
T = 3  # the step every departure below happens at


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


# -- the recorder ----------------------------------------------------------------------------------
def test_every_kth_step_of_every_point_is_recorded(tmp_path) -> None:
    _run(tmp_path / "t.npz", every=2)
    trace = pa.load(tmp_path / "t.npz")
    steps = trace.meta["steps"]
    assert [(s["geometry"]["name"], s["step"]) for s in steps] == [
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
    assert first["geometry"] == {
        "name": "stiefel",
        "sizes": {"d": 7, "r": 3},
        "options": {"retraction": "polar", "metric": "embedded"},
    }
    assert steps[1]["geometry"]["sizes"] == {"m": 5, "n": 4, "r": 2}
    assert first["elements"] == [0, 1] and first["batch"] == [2]
    assert [p.shape for p in trace.parts(0, "x")] == [(2, 7, 3)]
    assert [p.shape for p in trace.parts(1, "x")] == [(3, 5, 2), (3, 4, 2)]
    assert first["state_keys"] == ["exp_avg", "sqrt_v"]  # the state before step 2
    assert trace.parts(0, "state/exp_avg")[0].shape == (2, 7, 3)
    assert trace.parts(0, "state/sqrt_v")[0].shape == (2,)


def test_frames_keeps_evenly_spaced_elements(tmp_path) -> None:
    """frames=3 of a (3, 4) batch of frames keeps elements 0, 6 and 11 (flattened), exactly."""
    gen = torch.Generator().manual_seed(1)
    w = torch.nn.Parameter(tp.Stiefel(6, 2).random_point(gen, (3, 4)))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=LR)
    before = w.detach().clone()
    with audit.record(opt, tmp_path / "f.npz", frames=3):
        opt.zero_grad()
        (w**3).sum().backward()
        opt.step()
    trace = pa.load(tmp_path / "f.npz")
    s = trace.meta["steps"][0]
    assert s["elements"] == [0, 6, 11] and s["batch"] == [3, 4]
    flat = before.reshape(12, 6, 2).numpy()
    assert np.array_equal(trace.parts(0, "x")[0], flat[[0, 6, 11]])
    assert np.array_equal(trace.parts(0, "y")[0], w.detach().reshape(12, 6, 2).numpy()[[0, 6, 11]])
    assert pa.replay(trace)["passed"]


def test_a_recorded_step_replays_bitwise_through_the_port(tmp_path) -> None:
    """From the recorded point, gradient, state and hyperparameters a fresh optimizer takes the
    recorded step exactly: the record holds everything the step depended on."""
    _run(tmp_path / "t.npz", every=1, steps=3)
    trace = pa.load(tmp_path / "t.npz")
    k = next(i for i, s in enumerate(trace.meta["steps"]) if s["step"] == 3 and s["group"] == 0)
    s = trace.meta["steps"][k]
    w = torch.nn.Parameter(torch.from_numpy(trace.parts(k, "x")[0]))
    hyper = {n: v for n, v in s["hyperparameters"].items() if n != "initial_lr"}
    opt = tp.RiemannianAdam([{"params": [w], **hyper}])
    state = {
        "step": torch.tensor(float(s["step"] - 1)),
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
    the recorded point within the audit's bound; the reference without the trust radius does
    not (a negative control of the same check)."""
    _run(tmp_path / "t.npz", every=1, steps=1)
    trace = pa.load(tmp_path / "t.npz")
    rows = [r for r in pa.replay(trace)["steps"] if r["geometry"] == "stiefel"]
    assert len(rows) == 2 and all(r["passed"] and r["step"] == 1 for r in rows)
    hyper = trace.meta["steps"][0]["hyperparameters"]
    loose = ro.riemannian_adam(lr=hyper["lr"], betas=tuple(hyper["betas"]), eps=hyper["eps"])
    x, g, y = (trace.parts(0, what)[0] for what in ("x", "g", "y"))
    st = ref.Stiefel(7, 3)
    y0, _ = loose.step(st, x[0], g[0], loose.init(st, x[0]))
    assert np.linalg.norm(y0 - y[0]) > rows[0]["bound"]


def test_refusals(tmp_path, monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"neither torch_port\.optim's nor geoopt's: give"):
        audit.record(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1), tmp_path / "a")
    opt = tp.RSGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match="every must be an integer ≥ 1, got 0"):
        audit.record(opt, tmp_path / "a", every=0)
    with pytest.raises(ValueError, match="frames must be an integer ≥ 1, got 0"):
        audit.record(opt, tmp_path / "a", frames=0)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"bad\.npz: not an audit trace"):
        pa.load(bad)
    # an object array (a pickle inside the .npz) is refused, not unpickled
    np.savez(tmp_path / "obj.npz", **{"meta.json": np.array([{"x": 1}], dtype=object)})
    with pytest.raises(ValueError, match=r"obj\.npz: not an audit trace"):
        pa.load(tmp_path / "obj.npz")


def test_each_rank_writes_its_own_file_or_only_the_ranks_asked_for(tmp_path, monkeypatch) -> None:
    assert audit.rank_path(tmp_path / "run.npz", 1) == tmp_path / "run.rank1.npz"
    assert audit.rank_path(tmp_path / "run.npz", None) == tmp_path / "run.npz"
    monkeypatch.setattr(audit, "_rank", lambda: 1)
    w = torch.nn.Parameter(tp.Stiefel(5, 2).random_point(torch.Generator().manual_seed(0)))
    opt = tp.RSGD([{"params": [w], "geometry": "stiefel"}], lr=LR)
    for ranks, written in (((0,), None), (None, tmp_path / "run.rank1.npz")):
        rec = audit.record(opt, tmp_path / "run.npz", ranks=ranks)
        opt.zero_grad()
        w.sum().backward()
        opt.step()
        assert rec.close() == written
        assert rec.close() is None  # closed once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rank1.npz"]


# -- honest runs pass ------------------------------------------------------------------------------
CASES = sorted(
    {(r.geometry, r.problem, r.rule, dt) for r in RECORDS for dt in r.dtypes},
)


@pytest.mark.parametrize(("geometry", "problem", "rule", "dtype"), CASES)
def test_an_honest_run_passes(tmp_path, geometry, problem, rule, dtype) -> None:
    """Three steps of every case of ``rattn compare`` (every geometry, rule, option, dtype),
    recorded and replayed: no step or state fails its bound, and the run passes (every bound
    ≤ RESOLUTION of its step) in float64 and float32 for the rules whose direction is well
    conditioned. In bfloat16, and for the elementwise moment (whose direction is scale-free
    entry by entry, so that an entry of the gradient at rounding level decides its own sign),
    the bound can exceed a tenth of the step: such rows are "not auditable", never "pass"."""
    prob = PROBLEMS[geometry][problem]
    inst = prob.build(0)
    dt = getattr(torch, dtype)
    params = [torch.nn.Parameter(torch.tensor(p).to(dt)) for p in inst.points]
    data = {k: torch.tensor(v).to(dt) for k, v in inst.data.items()}
    opt = RULES[rule].port([prob.adapter.group(params)])
    with audit.record(opt, tmp_path / "h.npz"):
        for _ in range(3):
            opt.zero_grad()
            inst.loss(params, data).backward()
            opt.step()
    result = pa.audit(tmp_path / "h.npz")
    assert result["counts"]["fail"] == 0, format_table(result)
    if dtype != "bfloat16" and "elementwise" not in rule:
        assert result["passed"], format_table(result)
    for row in result["steps"]:  # a pass is sound by construction
        assert row["verdict"] != "pass" or row["bound"] <= RESOLUTION * row["step_length"]
    assert {r["step"] for r in result["steps"]} == {1, 2, 3}
    # the state after every step was checked against the reference's
    assert all(r["state_ratio"] is not None for r in result["steps"])


class _Model(torch.nn.Module):
    """A linear layer, then attention-like scores through two Stiefel frames."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.inp = torch.nn.Linear(4, 8)
        self.q = torch.nn.Parameter(tp.Stiefel(8, 3).random_point(gen, (2,)).float())
        self.k = torch.nn.Parameter(tp.Stiefel(8, 3).random_point(gen, (2,)).float())

    def forward(self, x):
        h = self.inp(x)
        s = torch.einsum("bi,hir,hjr,bj->bh", h, self.q, self.k, h)
        return s.sum(-1)


def test_a_training_loop_with_schedule_clipping_accumulation_and_autocast_passes(tmp_path):
    """float32 parameters, bfloat16 autocast, gradient clipping, two micro-batches per step and
    a LambdaLR schedule: the recorder needs nothing special, and every step passes."""
    model = _Model()
    groups = [
        {"params": [model.q, model.k], "geometry": "stiefel"},
        {"params": list(model.inp.parameters())},
    ]
    opt = tp.RiemannianAdam(groups, lr=1e-2, trust_radius=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + t))
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(16, 4, generator=gen), torch.randn(16, generator=gen)
    with audit.record(opt, tmp_path / "loop.npz"):
        for _ in range(6):
            opt.zero_grad()
            for half in (slice(0, 8), slice(8, 16)):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = ((model(x[half]) - y[half]) ** 2).mean() / 2
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()
    result = pa.audit(tmp_path / "loop.npz")
    assert result["passed"], format_table(result)
    steps = pa.load(tmp_path / "loop.npz").meta["steps"]
    lrs = [s["hyperparameters"]["lr"] for s in steps if s["params"] == [0]]
    assert lrs == pytest.approx([1e-2 / (1 + t) for t in range(6)], rel=1e-15)
    assert {r["dtype"] for r in result["steps"]} == {"torch.float32"}


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ),
    ],
)
def test_the_device_example_of_the_docs_passes(tmp_path, device) -> None:
    """docs/audit_example.py (float32 and bfloat16, every step of 20 recorded) on the CPU and,
    where there is one, on a CUDA device: the float32 trace passes ``rattn audit``; the
    bfloat16 one fails nowhere and is not auditable step by step (its rounding bound exceeds a
    tenth of the step)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "docs" / "audit_example.py"
    done = subprocess.run(
        [sys.executable, str(script), "--device", device, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for dtype, verdict in (("float32", "passed"), ("bfloat16", "not auditable")):
        result = pa.audit(tmp_path / f"audit-{device}-{dtype}.npz")
        assert result["verdict"] == verdict, format_table(result)
        assert result["counts"]["fail"] == 0
        assert max(r["step"] for r in result["steps"]) == 20


def test_a_run_under_a_grad_scaler_passes(tmp_path) -> None:
    """AMP's GradScaler (scale 2^10, CPU): the recorder sees the unscaled gradients the step
    used (RSGD's step is linear in the gradient, so a scaled one would replay 1024 times too
    long), and every recorded step passes."""
    model = _Model()
    opt = tp.RSGD(
        [
            {"params": [model.q, model.k], "geometry": "stiefel"},
            {"params": [*model.inp.parameters()]},
        ],
        lr=1e-2,
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    gen = torch.Generator().manual_seed(6)
    x, y = torch.randn(8, 4, generator=gen), torch.randn(8, generator=gen)
    with audit.record(opt, tmp_path / "amp.npz"):
        for _ in range(4):
            opt.zero_grad()
            scaler.scale(((model(x) - y) ** 2).mean()).backward()
            scaler.step(opt)
            scaler.update()
    result = pa.audit(tmp_path / "amp.npz")
    assert result["passed"], format_table(result)
    assert sorted({r["step"] for r in result["steps"]}) == [1, 2, 3, 4]


# -- departures are flagged at their step --------------------------------------------------------
def _stiefel_run(path, opt_class=tp.RiemannianAdam, dtype=torch.float64, hook=None, **kw):
    """Six steps on a Brockett-like cost over two frames of St(7, 3); ``hook(opt, w, t, x)``
    runs after each step, before the recorder reads the new point (x: the point before)."""
    gen = torch.Generator().manual_seed(5)
    w = torch.nn.Parameter(tp.Stiefel(7, 3).random_point(gen, (2,)).to(dtype))
    a = torch.randn(7, 7, generator=gen, dtype=torch.float64).to(dtype)
    opt = opt_class([{"params": [w], "geometry": "stiefel"}], lr=LR, **kw)
    saved = {}
    if hook is not None:
        opt.register_step_pre_hook(lambda o, *_: saved.update(x=w.detach().clone()))
        opt.register_step_post_hook(lambda o, *_: hook(o, w, int(o.state[w]["step"]), saved["x"]))
    with audit.record(opt, path):
        for _ in range(6):
            opt.zero_grad()
            torch.einsum("hdr,de,her->", w, a, w).backward()
            opt.step()
    return pa.audit(path)


def _assert_flagged_at(result, step: int) -> None:
    assert not result["passed"]
    assert result["first_failure_step"] == step
    assert all(r["passed"] for r in result["steps"] if r["step"] < step)


@torch.no_grad()
def _nudge(w, size: float, seed: int = 0) -> None:
    """w ← polar(w + size·Z/‖Z‖) frame by frame: a move of ≈ size along the manifold."""
    z = torch.randn(w.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    z = z / torch.linalg.norm(z, dim=(-2, -1), keepdim=True)
    w.copy_(tp.linalg.polar(w.double() + size * z).to(w.dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_an_honest_stiefel_run_passes(tmp_path, dtype) -> None:
    """The baseline of the departures below: the same run without one passes (in bfloat16:
    fails nowhere, and is not auditable step by step)."""
    result = _stiefel_run(tmp_path / "ok.npz", dtype=dtype)
    expected = "not auditable" if dtype == torch.bfloat16 else "passed"
    assert result["verdict"] == expected and result["counts"]["fail"] == 0, format_table(result)


def test_a_perturbation_of_1e_6_in_float64_is_flagged_at_its_step(tmp_path) -> None:
    def hook(opt, w, t, x):
        if t == T:
            _nudge(w, 1e-6)

    _assert_flagged_at(_stiefel_run(tmp_path / "p.npz", hook=hook), T)


def test_a_perturbation_of_1e_3_of_the_step_in_float32_is_flagged_at_its_step(tmp_path) -> None:
    def hook(opt, w, t, x):
        if t == T:
            length = float(torch.linalg.norm((w.detach() - x).double(), dim=(-2, -1)).min())
            _nudge(w, 1e-3 * length)

    _assert_flagged_at(_stiefel_run(tmp_path / "p.npz", dtype=torch.float32, hook=hook), T)


class _DroppedBiasCorrection(tp.RiemannianAdam):
    """Riemannian Adam whose step T forgets the bias correction: m/(√v + ε), not m̂/(√v̂ + ε)."""

    def rule(self, group):
        chain = super().rule(group)
        eps = group["eps"]

        def update(geometry, x, step, state, t):
            out, new = chain.update(geometry, x, step, state, t)
            if t == T:  # (1/(1 − β1^t), √v/sqrt(1 − β2^t) + ε) -> (1, √v + ε)
                out = replace(out, ratio=(1.0, new["sqrt_v"] + eps))
            return out, new

        return chain._replace(update=update)


class _SkippedTransport(tp.RiemannianMomentum):
    """The momentum template whose step T leaves M where it was (no transport to the new
    point)."""

    def rule(self, group):
        chain = super().rule(group)
        t = int(next(iter(self.state.values()), {}).get("step", 0)) + 1
        return chain._replace(transported=()) if t == T else chain


class _WrongLearningRate(tp.RSGD):
    """Riemannian SGD whose step T uses 1.1·lr instead of the group's lr."""

    def rule(self, group):
        t = int(next(iter(self.state.values()), {}).get("step", 0)) + 1
        return super().rule({**group, "lr": group["lr"] * (1.1 if t == T else 1.0)})


for _cls, _name in (
    (_DroppedBiasCorrection, "RiemannianAdam"),
    (_SkippedTransport, "RiemannianMomentum"),
    (_WrongLearningRate, "RSGD"),
):
    _cls.__name__ = _name  # the trace names the rule the optimizer claims to run


@pytest.mark.parametrize(
    "opt_class", [_DroppedBiasCorrection, _SkippedTransport, _WrongLearningRate], ids=str
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_departure_from_the_rule_is_flagged_at_its_step(tmp_path, opt_class, dtype) -> None:
    result = _stiefel_run(tmp_path / "d.npz", opt_class, dtype)
    _assert_flagged_at(result, T)
    if opt_class is _SkippedTransport:  # the point is right; the state it leaves is not
        bad = [r for r in result["steps"] if not r["passed"]]
        assert all(r["deviation"] <= r["bound"] and r["state_ratio"] > 1 for r in bad)


def test_the_plain_rule_classes_pass_the_same_run(tmp_path) -> None:
    """Negative control of the three departures: their parent classes pass."""
    for cls in (tp.RiemannianAdam, tp.RiemannianMomentum, tp.RSGD):
        assert _stiefel_run(tmp_path / f"{cls.__name__}.npz", cls)["passed"]


# -- the command -----------------------------------------------------------------------------------
def test_the_command_exit_codes_json_and_plot(tmp_path, capsys) -> None:
    _run(tmp_path / "ok.npz", every=1, steps=3)
    assert main(["audit", str(tmp_path / "ok.npz"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is True and doc["first_failure_step"] is None
    assert {"step", "group", "deviation", "bound", "passed"} <= set(doc["steps"][0])
    assert all(math.isfinite(r["bound"]) for r in doc["steps"])

    def hook(opt, w, t, x):
        if t == T:
            _nudge(w, 1e-6)

    _stiefel_run(tmp_path / "bad.npz", hook=hook)
    pytest.importorskip("matplotlib")
    assert main(["audit", str(tmp_path / "bad.npz"), "--plot", str(tmp_path / "a.png")]) == 1
    out = capsys.readouterr().out
    assert f"FAILED: 2 of 12 elements, first at step {T}" in out
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a folder: the plot goes into it as audit.png, and the command says where
    assert main(["audit", str(tmp_path / "bad.npz"), "--plot", str(tmp_path)]) == 1
    assert capsys.readouterr().out.endswith(f"plot: {tmp_path / 'audit.png'}\n")
    assert (tmp_path / "audit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    (tmp_path / "junk.npz").write_bytes(b"junk")
    assert main(["audit", str(tmp_path / "junk.npz")]) == 2
    assert "junk.npz: not an audit trace" in capsys.readouterr().err


def test_a_rule_without_a_reference_is_refused_when_recording_starts(tmp_path) -> None:
    """A ChainOptimizer of a rule of one's own has no reference: record() refuses it before
    any step, and leaves nothing behind."""
    w = torch.nn.Parameter(tp.Stiefel(5, 2).random_point(torch.Generator().manual_seed(0)))
    opt = tp.optim.ChainOptimizer(
        [{"params": [w], "geometry": "stiefel"}],
        rule=lambda group: transforms.chain(transforms.scale(-group["lr"])),
        lr=LR,
    )
    with pytest.raises(ValueError, match="ChainOptimizer is none of them nor a subclass"):
        audit.record(opt, tmp_path / "c.npz")
    assert list(tmp_path.iterdir()) == []


def test_a_step_skipped_for_a_nonfinite_gradient_is_reported_and_passes(tmp_path) -> None:
    """skip_nonfinite=True: step 2 sees a NaN gradient and is skipped; the trace says so, the
    audit passes it (that is why it was skipped) and checks the others, and the optimizer's own
    count (the recorded step number) does not advance on the skipped step."""
    w = torch.nn.Parameter(tp.Stiefel(5, 2).random_point(torch.Generator().manual_seed(0)))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=LR, skip_nonfinite=True)
    with pytest.warns(UserWarning), audit.record(opt, tmp_path / "s.npz"):
        for i in range(3):
            opt.zero_grad()
            (w**3).sum().backward()
            if i == 1:
                w.grad[0, 0] = float("nan")
            opt.step()
    result = pa.audit(tmp_path / "s.npz")
    assert result["passed"], format_table(result)
    assert [(r["step"], r["skipped"]) for r in result["steps"]] == [
        (1, False),
        (2, True),
        (2, False),
    ]


# -- torch.compile ---------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_compiled_step_is_the_eager_step(tmp_path) -> None:
    """torch.compile(optimizer.step) over 10 steps of frames and plain parameters (AdamW with
    decay) gives the eager trajectory bitwise."""
    out = []
    for compiled in (False, True):
        gen = torch.Generator().manual_seed(0)
        w = torch.nn.Parameter(tp.Stiefel(8, 3).random_point(gen, (2,)).float())
        p = torch.nn.Parameter(torch.randn(5, generator=gen))
        opt = tp.RiemannianAdam(
            [{"params": [w], "geometry": "stiefel"}, {"params": [p], "weight_decay": 0.01}],
            lr=3e-3,
        )
        step = torch.compile(opt.step) if compiled else opt.step
        for _ in range(10):
            opt.zero_grad()
            ((w**3).sum() + (p**3).sum()).backward()
            step()
        out.append((w.detach().clone(), p.detach().clone()))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_compiled_step_is_recorded_and_passes_the_audit(tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(8, 3).random_point(gen, (2,)).float())
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=3e-3)
    step = torch.compile(opt.step)
    with audit.record(opt, tmp_path / "c.npz"):
        for _ in range(5):
            opt.zero_grad()
            (w**3).sum().backward()
            step()
    result = pa.audit(tmp_path / "c.npz")
    assert result["passed"] and [r["step"] for r in result["steps"]] == [
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
        5,
        5,
    ]
