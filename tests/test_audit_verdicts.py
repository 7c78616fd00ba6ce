"""The verdict of ``rattn audit`` is sound by construction: a row passes only when its bound is
at most ``RESOLUTION`` of its own step's length (or, at lr 0, when the point is unchanged bit for
bit), a skipped record passes only with a non-finite gradient in the trace, a run with nothing
replayed is not PASSED, and the state after every recorded step is checked (so sampling with
``every`` keeps the state check). Each case is one row of a table: an edit of an honest trace,
or a genuine run of a wrong optimizer, and the verdict and step it must get."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from proofs_checks.audit import replay as pa  # noqa: E402
from proofs_checks.audit.report import format_table  # noqa: E402
from proofs_checks.audit.rules import Claim  # noqa: E402
from proofs_checks.audit.verdicts import RESOLUTION  # noqa: E402
from torch_port import audit  # noqa: E402

META = "meta.json"
STEPS, T = 6, 3  # an honest run of STEPS steps; edits act on step T


def _brockett_run(path, opt, w, steps: int = STEPS, every: int = 1, schedule=None):
    a = torch.randn(7, 7, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    a = (a + a.T).to(w.dtype)
    with audit.record(opt, path, every=every):
        for _ in range(steps):
            opt.zero_grad()
            torch.einsum("hdr,de,her->", w, a, w).backward()
            opt.step()
            if schedule is not None:
                schedule.step()
    return path


def _frames(dtype=torch.float64):
    gen = torch.Generator().manual_seed(5)
    return torch.nn.Parameter(tp.Stiefel(7, 3).random_point(gen, (2,)).to(dtype))


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """Riemannian Adam (frame moment) on two frames of St(7, 3), float64, 6 steps."""
    w = _frames()
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    return _brockett_run(tmp_path_factory.mktemp("h") / "run.npz", opt, w)


def _read(path):
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads(bytes(arrays.pop(META)).decode()), arrays


def _write(path, meta, arrays):
    np.savez(path, **arrays, **{META: np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    return path


def _edited(path, edit, out):
    """The trace at ``path`` itself when ``edit`` is None, else a copy of it written to ``out``
    with ``edit(meta, arrays)`` applied."""
    if edit is None:
        return path
    meta, arrays = _read(path)
    edit(meta, arrays)
    return _write(out, meta, arrays)


def _at(meta, step: int) -> int:
    return next(k for k, s in enumerate(meta["steps"]) if s["step"] == step)


# -- edits of an honest trace (meta, arrays) -> None -----------------------------------------
def _no_step(meta, arrays):  # the optimizer never moved at step T: y = x
    k = _at(meta, T)
    arrays[f"r{k}/y/0"] = arrays[f"r{k}/x/0"].copy()


def _double_lr(meta, arrays):  # the step taken with twice the lr the trace states
    k = _at(meta, T)
    x, y = arrays[f"r{k}/x/0"], arrays[f"r{k}/y/0"]
    arrays[f"r{k}/y/0"] = np.stack(
        [np.linalg.qr(2 * (b - a) + a)[0] for a, b in zip(x, y, strict=True)]
    )


def _huge_step_count(meta, arrays):  # metadata that would inflate a bound built on it
    meta["steps"][_at(meta, T)]["step"] = 100000


def _negated_frame(meta, arrays):
    k = _at(meta, T)
    _huge_step_count(meta, arrays)
    arrays[f"r{k}/y/0"] = -arrays[f"r{k}/y/0"]


def _skipped_with_finite_gradients(flag: bool):
    def edit(
        meta, arrays
    ):  # a record that says the port skipped the step; its gradients are finite
        k = _at(meta, T)
        meta["steps"][k].update(taken=False, nonfinite_gradient=flag, after_keys=[])
        for name in [n for n in arrays if n.startswith((f"r{k}/y/", f"r{k}/after/"))]:
            del arrays[name]

    return edit


def _state_not_moved(meta, arrays):  # the state after step T is the state before it
    k = _at(meta, T)
    for key in meta["steps"][k]["state_keys"]:
        arrays[f"r{k}/after/{key}/0"] = arrays[f"r{k}/state/{key}/0"].copy()


def _point_left_at_half_step(meta, arrays):  # y halfway to where the step goes
    k = _at(meta, T)
    x, y = arrays[f"r{k}/x/0"], arrays[f"r{k}/y/0"]
    arrays[f"r{k}/y/0"] = np.stack(
        [np.linalg.qr((a + b) / 2)[0] for a, b in zip(x, y, strict=True)]
    )


EDITS = {
    # name: (edit, verdict of the run, the step it names)
    "honest": (None, "passed", None),
    "no step at step T": (_no_step, "failed", T),
    "twice the lr at step T": (_double_lr, "failed", T),
    "half the step at step T": (_point_left_at_half_step, "failed", T),
    "the state after step T not updated": (_state_not_moved, "failed", T),
    "step count 100000 in the metadata": (_huge_step_count, "failed", 100000),
    "step count 100000 and a negated frame": (_negated_frame, "failed", 100000),
    "skipped, finite gradients": (_skipped_with_finite_gradients(False), "failed", T),
    "skipped for a gradient the trace does not keep": (
        _skipped_with_finite_gradients(True),
        "not auditable",
        T,
    ),
}


@pytest.mark.parametrize("name", EDITS)
def test_an_edited_trace_gets_its_verdict_at_its_step(honest, tmp_path, name) -> None:
    edit, expected, step = EDITS[name]
    result = pa.audit(_edited(honest, edit, tmp_path / "edited.npz"))
    assert result["verdict"] == expected, format_table(result)
    first = {"failed": "first_failure_step", "not auditable": "first_unauditable_step"}
    if expected in first:
        assert result[first[expected]] == step, format_table(result)
    for row in result["steps"]:  # sound by construction: a pass resolves a tenth of its step
        assert row["verdict"] != "pass" or row["bound"] <= RESOLUTION * row["step_length"]


# -- genuine runs ------------------------------------------------------------------------------
class _SkipsTransportAt(tp.RiemannianMomentum):
    """The momentum rule whose step ``bad`` leaves its moment where it was (no transport)."""

    bad = 50

    def rule(self, group):
        chain = super().rule(group)
        t = int(next(iter(self.state.values()), {}).get("step", 0)) + 1
        return chain._replace(transported=()) if t == self.bad else chain


_SkipsTransportAt.__name__ = "RiemannianMomentum"  # the rule it claims


@pytest.mark.parametrize(
    ("cls", "verdict"), [(tp.RiemannianMomentum, "passed"), (_SkipsTransportAt, "failed")]
)
def test_sampling_every_10_steps_still_checks_the_state_of_each_recorded_step(
    tmp_path, cls, verdict
) -> None:
    """every=10 records steps 10, 20, …, 60; the momentum left untransported at step 50 is
    flagged there, by the state after it (the point itself is right); the honest rule passes."""
    w = _frames()
    opt = cls([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    result = pa.audit(_brockett_run(tmp_path / "s.npz", opt, w, steps=60, every=10))
    assert sorted({r["step"] for r in result["steps"]}) == [10, 20, 30, 40, 50, 60]
    assert result["verdict"] == verdict, format_table(result)
    if verdict == "failed":
        bad = [r for r in result["steps"] if r["verdict"] == "fail"]
        assert result["first_failure_step"] == 50 and {r["step"] for r in bad} == {50}
        assert all(r["deviation"] <= r["bound"] and r["state_ratio"] > 1 for r in bad)


class _NudgesAfterItsStep(tp.RiemannianAdam):
    """A subclass whose ``step`` calls the preset's, then moves the frames by 1e-6 along the
    manifold at step T (torch runs the hooks of both ``step``s; the outer one is the run's)."""

    def step(self, closure=None):
        loss = super().step(closure)
        if int(next(iter(self.state.values()))["step"]) == T:
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.copy_(torch.linalg.qr(p + 1e-6)[0])
        return loss


@pytest.mark.parametrize(
    ("cls", "verdict"), [(tp.RiemannianAdam, "passed"), (_NudgesAfterItsStep, "failed")]
)
def test_a_subclass_that_moves_the_frames_after_its_parents_step_fails(tmp_path, cls, verdict):
    tp.RiemannianAdam([torch.nn.Parameter(torch.eye(3, 2))], lr=1.0)  # torch wraps its step
    w = _frames()
    opt = cls([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    result = pa.audit(_brockett_run(tmp_path / "n.npz", opt, w))
    assert result["verdict"] == verdict
    assert result["first_failure_step"] == (T if verdict == "failed" else None)


def _moved(meta, arrays):  # the point at step 1 (lr 0) moved by 1e-3
    k = _at(meta, 1)
    x = arrays[f"r{k}/x/0"]
    arrays[f"r{k}/y/0"] = np.stack([np.linalg.qr(a + 1e-3 * np.ones_like(a))[0] for a in x])


@pytest.mark.parametrize(("edit", "verdict"), [(None, "passed"), (_moved, "failed")])
def test_steps_at_lr_0_are_audited(tmp_path, edit, verdict) -> None:
    """A linear warm-up from lr 0 (a schedule's first step): the step at lr 0 must leave the
    point unchanged bit for bit, and passes when it does; a point that moved there fails at
    step 1."""
    w = _frames()
    opt = tp.RSGD([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: min(t / 3, 1.0))
    path = _brockett_run(tmp_path / "w.npz", opt, w, schedule=schedule)
    result = pa.audit(_edited(path, edit, tmp_path / "e.npz"))
    assert result["verdict"] == verdict, format_table(result)
    first = [r for r in result["steps"] if r["step"] == 1]
    if verdict == "passed":
        assert first and all(r["reason"] == "lr 0: the point is unchanged" for r in first)
    else:
        assert result["first_failure_step"] == 1


def test_a_bfloat16_run_is_not_auditable_step_by_step_and_never_passes(tmp_path) -> None:
    """In bfloat16 the rounding bound of a step exceeds a tenth of it: an honest run and one
    that never moves both get "not auditable" or "fail", never "pass"."""
    w = _frames(torch.bfloat16)
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    path = _brockett_run(tmp_path / "b.npz", opt, w)
    for edit in (None, _no_step):
        result = pa.audit(_edited(path, edit, tmp_path / "e.npz"))
        assert result["verdict"] != "passed" and result["counts"]["pass"] == 0
        assert all(
            r["bound"] > RESOLUTION * r["step_length"]
            for r in result["steps"]
            if r["verdict"] == "not auditable" and r["step_length"]
        )
        assert all(math.isfinite(r["bound"]) for r in result["steps"])


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_step_with_a_closure_records_the_closures_gradient(tmp_path, set_to_none) -> None:
    """``opt.step(closure)`` (Lightning's pattern: the closure zeroes, evaluates, backpropagates)
    records the gradient the step used, so an honest run passes, every step of it."""
    w = _frames()
    a = torch.randn(7, 7, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)

    def closure():
        opt.zero_grad(set_to_none=set_to_none)
        loss = torch.einsum("hdr,de,her->", w, a + a.T, w)
        loss.backward()
        return loss

    with audit.record(opt, tmp_path / "c.npz"):
        for _ in range(STEPS):
            opt.step(closure)
    result = pa.audit(tmp_path / "c.npz")
    assert result["verdict"] == "passed", format_table(result)
    assert sorted({r["step"] for r in result["steps"]}) == list(range(1, STEPS + 1))


@pytest.mark.parametrize("retraction", ["polar", "polar_svd", "qr", "exp"])
def test_at_gpt2_head_size_every_retraction_flags_one_percent_of_lr(tmp_path, retraction):
    """Two frames of St(768, 64) in float32 under Riemannian Adam at lr 1e-3, three steps: the
    honest run passes, and the same trace claimed at lr ×1.01 fails at step 1 (the factoring
    retractions' bound is the probabilistic one there: ``bounds.factoring_constant``)."""
    gen = torch.Generator().manual_seed(1)
    w = torch.nn.Parameter(tp.Stiefel(768, 64).random_point(gen, (2,)).float())
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel", "retraction": retraction}], lr=1e-3
    )
    x = torch.randn(32, 768, generator=gen)
    path = tmp_path / "big.npz"
    with audit.record(opt, path, frames=1):
        for _ in range(3):
            opt.zero_grad()
            (torch.einsum("bd,hdr->bhr", x, w) ** 2).sum().backward()
            opt.step()
    honest = pa.audit(path)
    assert honest["verdict"] == "passed"
    assert max(r["bound"] / r["step_length"] for r in honest["steps"]) < 0.01
    claimed = pa.audit(path, claim=Claim("riemannian_adam", {"lr": 1.01e-3}))
    assert claimed["first_failure_step"] == 1
