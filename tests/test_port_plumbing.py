"""PORT-6/7/8's checks beyond pass-and-reject (``test_propositions``): their bounds as written,
their refusal to pass vacuously, and the substitution the controls rely on."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from proofs_checks import harness
from proofs_checks.propositions import port_plumbing as plumbing
from proofs_checks.propositions import port_skips, port_state
from proofs_checks.registry import Context

CTX = Context(seed=0, quick=True)


@pytest.mark.parametrize("steps", [2, 300, 1000])
def test_sqrt_v_decay_tolerance_is_gamma_of_two_roundings_a_step(steps: int) -> None:
    k = 2 * (steps - 1) * 2.0**-24
    assert port_state.sqrt_v_decay_tolerance(steps) == pytest.approx(k / (1 - k), rel=1e-15)


def test_the_runs_reach_what_they_claim_to_exercise() -> None:
    """The schedule starts at lr = 0; the quick low-precision run passes step 256 (where a
    bfloat16 count stops); the scripts skip each kind of step they name."""
    assert plumbing.schedule(0) == 0.0 and plumbing.schedule(plumbing.WARMUP) == 1.0
    assert port_state.STATE_STEPS_QUICK > 256
    assert set(port_skips.SKIPS) <= set(port_skips.CAPTURABLE_SCRIPT)
    assert {"nan-frame", "inf-plain"} <= set(port_skips.EAGER_SCRIPT)
    assert "zero-lr" in port_skips.CAPTURABLE_SCRIPT


def test_a_trust_run_where_the_cap_never_binds_does_not_pass(monkeypatch) -> None:
    monkeypatch.setattr(plumbing, "TRUST_RADIUS", 100.0)
    outcome = plumbing.binding_trust_cap(CTX, False)
    assert not outcome.passed and outcome.residual == math.inf
    assert "binds on 0 of" in outcome.detail


def test_a_trust_run_where_the_cap_always_binds_does_not_pass(monkeypatch) -> None:
    monkeypatch.setattr(plumbing, "TRUST_RADIUS", 1e-4)
    assert plumbing.binding_trust_cap(CTX, False).residual == math.inf


def test_a_recorded_lr_off_the_schedule_fails(monkeypatch) -> None:
    """The lrs are compared exactly: the run under the true schedule, checked against one a
    step late, fails even though every replayed step agrees with its recorded lr."""
    import torch

    true, scheduler = plumbing.schedule, torch.optim.lr_scheduler.LambdaLR
    monkeypatch.setattr(plumbing, "schedule", lambda t: true(max(t - 1, 0)))
    monkeypatch.setattr(torch.optim.lr_scheduler, "LambdaLR", lambda opt, _: scheduler(opt, true))
    outcome = plumbing.groups_and_schedule(CTX, False)
    assert outcome.residual == math.inf and "not the group's" in outcome.detail


class _Holder:
    @staticmethod
    def make() -> int:
        return 1


class _Child(_Holder):
    pass


def test_substituted_restores_a_static_method_as_one() -> None:
    with harness.substituted(_Holder, "make", staticmethod(lambda: 2)):
        assert _Holder().make() == 2
    assert _Holder().make() == 1 and isinstance(vars(_Holder)["make"], staticmethod)


def test_substituted_removes_what_it_put_over_an_inherited_name() -> None:
    with harness.substituted(_Child, "make", staticmethod(lambda: 3)):
        assert _Child().make() == 3
    assert "make" not in vars(_Child) and _Child().make() == 1


def test_substituted_refuses_a_name_that_does_not_exist() -> None:
    with pytest.raises(AttributeError), harness.substituted(_Holder, "mkae", None):
        pass
    assert not hasattr(_Holder, "mkae")


def test_the_ascent_run_decays_every_factored_geometry_and_no_frame() -> None:
    from torch_port.optim.guard import values

    exercised = dict(plumbing.ascent(CTX, False).exercised)
    geometries = exercised["geometries"].split(", ")
    factored = [g for g in geometries if g not in values.FRAME_GEOMETRIES]
    assert "stiefel" in geometries and len(factored) == 4
    assert exercised["hyperparameters"].endswith("(coupled) on " + ", ".join(factored))


@pytest.mark.parametrize(
    ("cls_name", "name", "value"),
    [
        ("ChainOptimizer", "lr", 2e-3),
        ("ChainOptimizer", "eps", 2e-8),
        ("RiemannianAdam", "eps", 2e-8),
    ],
)
def test_each_default_is_caught_by_the_row_that_builds_with_it(
    monkeypatch, cls_name: str, name: str, value: float
) -> None:
    """A default doubled in one class's signature (torch's lr 1e-3, ε 1e-8) fails the row
    built with that class's defaults, and only it (RiemannianAdam passes its own to
    ChainOptimizer)."""
    import torch_port as tp
    from torch_port.optim import ChainOptimizer

    cls = ChainOptimizer if cls_name == "ChainOptimizer" else getattr(tp, cls_name)
    monkeypatch.setattr(cls, "__init__", plumbing.default_moved(cls.__init__, name, value))
    outcome = plumbing.defaults(CTX, False)
    rows = dict(part.split(": ", 1) for part in outcome.detail.split(": ", 1)[1].split("; "))
    failing = {
        row for row, text in rows.items() if max(float(v.split()[1]) for v in text.split(", ")) > 1
    }
    assert failing == {cls_name}
