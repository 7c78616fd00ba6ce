"""``rattn audit`` of geoopt's optimizers (``torch_port.audit_sources.GeooptSource``): honest runs
of geoopt 0.5.1's RiemannianAdam and RiemannianSGD on both of its Stiefel manifolds pass, in
float64 and float32, over 20 seeds; genuine runs of wrong optimizers (subclasses of geoopt's that
depart at one step) fail at that step; a claim (``--rule geoopt_…``) is what is replayed; what
has no reference rule is refused when recording starts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
geoopt = pytest.importorskip("geoopt")

from proofs_checks.audit import replay as pa  # noqa: E402
from proofs_checks.audit.rules import Claim  # noqa: E402
from torch_port import audit  # noqa: E402

STEPS, T = 6, 3  # a run of STEPS steps; a wrong optimizer departs at step T

#: geoopt's optimizers with the options a run may use (lr 1e-2).
OPTIONS = {
    "adam": ("RiemannianAdam", {}),
    "adam_amsgrad_decay": ("RiemannianAdam", {"amsgrad": True, "weight_decay": 0.1}),
    "sgd": ("RiemannianSGD", {}),
    "sgd_momentum": ("RiemannianSGD", {"momentum": 0.9, "dampening": 0.1}),
    "sgd_nesterov_decay": (
        "RiemannianSGD",
        {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    ),
}


def _problem(seed: int, canonical: bool, dtype: torch.dtype):
    """Two St(7, 3) frames (one ManifoldParameter) and a plain bias under a Brockett cost."""
    gen = torch.Generator().manual_seed(seed)
    manifold = geoopt.Stiefel(canonical=canonical)
    start = torch.linalg.qr(torch.randn(2, 7, 3, generator=gen, dtype=torch.float64))[0]
    w = geoopt.ManifoldParameter(start.to(dtype), manifold=manifold)
    bias = torch.nn.Parameter(torch.randn(3, generator=gen, dtype=dtype))
    a = torch.randn(7, 7, generator=gen, dtype=torch.float64)
    return w, bias, (a + a.T).to(dtype)


def _run(path, opt, w, bias, a, steps: int = STEPS, every: int = 1):
    with audit.record(opt, path, every=every):
        for _ in range(steps):
            opt.zero_grad()
            (torch.einsum("hdr,de,her->", w, a, w) + (bias**2).sum()).backward()
            opt.step()
    return path


def _honest(path, option: str, seed: int = 0, canonical: bool = True, dtype=torch.float64):
    name, kwargs = OPTIONS[option]
    w, bias, a = _problem(seed, canonical, dtype)
    opt = getattr(geoopt.optim, name)([w, bias], lr=1e-2, **kwargs)
    return _run(path, opt, w, bias, a)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "euclidean"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_honest_geoopt_runs_pass(tmp_path, option, canonical, dtype) -> None:
    result = pa.audit(_honest(tmp_path / "run.npz", option, 0, canonical, dtype))
    rule = "geoopt_riemannian_adam" if option.startswith("adam") else "geoopt_riemannian_sgd"
    assert result["optimizer"] == rule
    assert result["verdict"] == "passed", [r["reason"] for r in result["steps"] if not r["passed"]]
    assert result["counts"]["pass"] == 2 * STEPS  # both frames at every step


@pytest.mark.parametrize("option", ["adam", "sgd_momentum"])
def test_twenty_seeds_without_a_false_alarm(tmp_path, option) -> None:
    for seed in range(20):
        canonical, dtype = seed % 2 == 0, (torch.float64, torch.float32)[seed // 2 % 2]
        path = _honest(tmp_path / f"run{seed}.npz", option, seed, canonical, dtype)
        assert pa.audit(path)["verdict"] == "passed", (seed, canonical, dtype)


# -- genuine runs of wrong optimizers: subclasses of geoopt's that depart at step T ----------------
class _Wrong:
    """A mixin counting steps; ``depart`` runs around step T."""

    steps = 0

    def step(self, closure=None):
        type(self).steps += 1
        if type(self).steps != T:
            return super().step(closure)
        with torch.no_grad():
            return self.depart(lambda: super(_Wrong, self).step(closure))

    def frames(self):
        return [p for g in self.param_groups for p in g["params"] if hasattr(p, "manifold")]


class LongStep(_Wrong, geoopt.optim.RiemannianAdam):
    def depart(self, step):  # a step 10% longer than the rule's, back onto the manifold
        before = {p: p.detach().clone() for p in self.frames()}
        step()
        for p, x in before.items():
            p.copy_(p.manifold.projx(x + 1.1 * (p - x)))


class LrInside(_Wrong, geoopt.optim.RiemannianAdam):
    def depart(self, step):  # the step runs with 1.1 lr; the group says lr before and after
        for group in self.param_groups:
            group["lr"] *= 1.1
        step()
        for group in self.param_groups:
            group["lr"] /= 1.1


class Nudged(_Wrong, geoopt.optim.RiemannianAdam):
    def depart(self, step):  # the frames moved by 1e-6 along the manifold after the step
        step()
        for p in self.frames():
            p.copy_(p.manifold.retr(p, 1e-6 * p.manifold.proju(p, torch.ones_like(p))))


class SecondMomentOff(_Wrong, geoopt.optim.RiemannianAdam):
    def depart(self, step):  # v one percent high after the step
        step()
        for state in self.state.values():
            if "exp_avg_sq" in state:
                state["exp_avg_sq"].mul_(1.01)


class NotTransported(_Wrong, geoopt.optim.RiemannianSGD):
    def depart(self, step):  # the momentum left where it was formed, not moved to the new point
        kept = {p: self.state[p]["momentum_buffer"].clone() for p in self.frames()}
        step()
        for p, buf in kept.items():  # formed at x and left there: μ·buf + g at x
            self.state[p]["momentum_buffer"].copy_(0.9 * buf + 0.1 * p.grad)


class NoStep(_Wrong, geoopt.optim.RiemannianSGD):
    def depart(self, step):  # the state moves on, the point does not
        before = {p: p.detach().clone() for p in self.frames()}
        step()
        for p, x in before.items():
            p.copy_(x)


@pytest.mark.parametrize(
    ("wrong", "dtype", "by"),
    [
        (LongStep, torch.float32, "point"),
        (LrInside, torch.float32, "point"),
        (Nudged, torch.float64, "point"),
        (SecondMomentOff, torch.float64, "exp_avg_sq"),
        (NotTransported, torch.float64, "momentum_buffer"),
        (NoStep, torch.float32, "point"),
    ],
)
def test_a_wrong_optimizer_fails_at_its_step(tmp_path, wrong, dtype, by) -> None:
    for cls in (geoopt.optim.RiemannianAdam, geoopt.optim.RiemannianSGD):
        cls(_frame(), lr=1.0)  # torch wraps the parent's step too: its hooks fire inside
    wrong.steps = 0
    w, bias, a = _problem(0, True, dtype)
    kwargs = {"momentum": 0.9} if issubclass(wrong, geoopt.optim.RiemannianSGD) else {}
    path = _run(tmp_path / "run.npz", wrong([w, bias], lr=1e-2, **kwargs), w, bias, a)
    result = pa.audit(path)
    assert result["verdict"] == "failed" and result["first_failure_step"] == T
    failed = [r for r in result["steps"] if r["verdict"] == "fail"]
    assert {r["step"] for r in failed} == {T}  # the later steps start from what was recorded
    assert all(by in r["reason"] for r in failed)


def test_a_sampled_geoopt_run_checks_each_recorded_state(tmp_path) -> None:
    """every=3 records steps 3 and 6; the state after step 3 is off, which step 3 shows."""
    SecondMomentOff.steps = 0
    w, bias, a = _problem(1, False, torch.float64)
    path = _run(tmp_path / "run.npz", SecondMomentOff([w, bias], lr=1e-2), w, bias, a, every=3)
    result = pa.audit(path)
    assert sorted({r["step"] for r in result["steps"]}) == [3, 6]
    assert result["first_failure_step"] == T


@pytest.mark.parametrize(
    ("rule", "settings", "verdict", "first"),
    [
        ("geoopt_riemannian_adam", {}, "passed", None),  # lr from the trace, the rest defaults
        ("geoopt_riemannian_adam", {"lr": 1.1e-2}, "failed", 1),
        ("geoopt_riemannian_adam", {"stiefel": "euclidean"}, "failed", 1),
        ("geoopt_riemannian_adam", {"amsgrad": True}, "failed", 1),  # v̄ is not in the state
        ("geoopt_riemannian_sgd", {}, "failed", 1),
        ("riemannian_adam", {}, "failed", 1),
    ],
)
def test_a_claim_about_a_geoopt_run(tmp_path, rule, settings, verdict, first) -> None:
    result = pa.audit(_honest(tmp_path / "run.npz", "adam"), claim=Claim(rule, settings))
    assert (result["verdict"], result["first_failure_step"]) == (verdict, first)


def _sphere_parameter():
    return [geoopt.ManifoldParameter(torch.ones(3) / 3**0.5, manifold=geoopt.Sphere())]


def _frame():
    return [geoopt.ManifoldParameter(torch.eye(7, 3), manifold=geoopt.Stiefel())]


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1),
            ValueError,
            "SGD is neither torch_port.optim's nor geoopt's",
        ),
        (
            lambda: geoopt.optim.SparseRiemannianAdam(_frame(), lr=1),
            ValueError,
            "SparseRiemannianAdam has no reference rule",
        ),
        (
            lambda: geoopt.optim.RiemannianAdam(
                _problem(0, True, torch.float64)[:1], lr=1, stabilize=10
            ),
            ValueError,
            "stabilize=10",
        ),
        (
            lambda: geoopt.optim.RiemannianSGD(_sphere_parameter(), lr=1),
            ValueError,
            "its manifold Sphere has no reference rule",
        ),
        (
            lambda: geoopt.optim.RiemannianSGD([torch.nn.Parameter(torch.ones(2))], lr=1),
            ValueError,
            "nothing to audit",
        ),
    ],
)
def test_what_has_no_reference_is_refused_at_record(tmp_path, make, error, message) -> None:
    with pytest.raises(error, match=message):
        audit.record(make(), tmp_path / "run.npz")
    assert not (tmp_path / "run.npz.parts").exists()
