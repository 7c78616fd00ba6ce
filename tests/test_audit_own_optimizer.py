"""``rattn audit`` of an optimizer that is neither the library's nor geoopt's
(``torch_port.audit_sources.FramesSource``): ``record(..., points=[...])`` names its frames, and
the trace is replayed against the rule it claims. A user's Stiefel SGD claimed as ``rsgd``
passes, the same with the canonical metric's gradient fails at step 1; a stateless normalized
step claimed as Riemannian Adam passes its first step with the state listed as not checked,
and is not auditable after it (the step needs a state the optimizer does not keep)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from proofs_checks.audit import replay as pa  # noqa: E402
from proofs_checks.audit.rules import Claim  # noqa: E402
from proofs_checks.cli import main  # noqa: E402
from torch_port import audit  # noqa: E402

LR, STEPS = 1e-2, 4


def _polar(a: torch.Tensor) -> torch.Tensor:
    u, _, vh = torch.linalg.svd(a, full_matrices=False)
    return u @ vh


class StiefelSGD(torch.optim.Optimizer):
    """A user's own: W ← polar(W − lr·ξ), ξ the embedded metric's gradient P_W(G) =
    G − W sym(WᵀG) (``canonical``: G − W GᵀW; ``normalized=ε``: ξ/(RMS(ξ) + ε))."""

    def __init__(self, params, lr, canonical=False, normalized=None):
        super().__init__(params, {"lr": lr})
        self.canonical, self.normalized = canonical, normalized

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for w in group["params"]:
                g, wt = w.grad, w.transpose(-1, -2)
                wtg = wt @ g
                xi = g - w @ (wtg.transpose(-1, -2) if self.canonical else (wtg + wtg.mT) / 2)
                if self.normalized is not None:
                    rms = xi.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt()
                    xi = xi / (rms + self.normalized)
                w.copy_(_polar(w - group["lr"] * xi))


def _run(tmp_path, dtype=torch.float64, **options):
    gen = torch.Generator().manual_seed(3)
    w = torch.nn.Parameter(torch.linalg.qr(torch.randn(2, 7, 3, generator=gen, dtype=dtype))[0])
    a = torch.randn(7, 7, generator=gen, dtype=dtype)
    c = torch.randn(7, 3, generator=gen, dtype=dtype)  # WᵀG not symmetric: the metrics differ
    opt = StiefelSGD([w], lr=LR, **options)
    path = tmp_path / "own.npz"
    with audit.record(opt, path, points=[w]):
        for _ in range(STEPS):
            opt.zero_grad()
            (torch.einsum("hdr,de,her->", w, a + a.T, w) + (w * c).sum()).backward()
            opt.step()
    return path


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_users_stiefel_sgd_claimed_as_rsgd_passes(tmp_path, dtype) -> None:
    result = pa.audit(_run(tmp_path, dtype), claim=Claim("rsgd", {}))
    assert result["optimizer"] == "StiefelSGD"
    assert result["verdict"] == "passed" and result["counts"]["pass"] == 2 * STEPS


@pytest.mark.parametrize(
    ("options", "claim", "verdict", "first"),
    [
        ({"canonical": True}, ("rsgd", {}), "failed", 1),  # the wrong metric's gradient
        ({}, ("rsgd", {"lr": 1.1 * LR}), "failed", 1),
        ({}, ("normalized_rsgd", {}), "failed", 1),
        ({"normalized": 0.0}, ("normalized_rsgd", {}), "passed", None),
        ({"normalized": 1e-8}, ("normalized_rsgd", {}), "failed", 1),  # an ε the rule has not
    ],
)
def test_a_claim_is_what_is_replayed(tmp_path, options, claim, verdict, first) -> None:
    result = pa.audit(_run(tmp_path, **options), claim=Claim(*claim))
    assert (result["verdict"], result["first_failure_step"]) == (verdict, first)


def test_what_the_claim_needs_and_the_optimizer_lacks_is_not_checked(tmp_path) -> None:
    """Adam's first step from its fresh state is the normalized step with its ε (m̂ = g,
    √v̂ = RMS(g)):
    it passes by the point, the state after it listed as not checked; from step 2 the step
    needs m and √v, which this optimizer does not keep: not auditable."""
    result = pa.audit(_run(tmp_path, normalized=1e-8), claim=Claim("riemannian_adam", {}))
    assert result["verdict"] == "not auditable" and result["first_unauditable_step"] == 2
    first = [r for r in result["steps"] if r["step"] == 1]
    assert all(r["verdict"] == "pass" and "not checked" in r["reason"] for r in first)
    later = [r for r in result["steps"] if r["step"] > 1]
    assert all(r["verdict"] == "not auditable" and "'exp_avg'" in r["reason"] for r in later)


def test_without_a_claim_the_audit_asks_for_one(tmp_path, capsys) -> None:
    assert main(["audit", str(_run(tmp_path))]) == 2
    assert "no reference rule for optimizer 'StiefelSGD'" in capsys.readouterr().err
    assert main(["audit", str(tmp_path / "own.npz"), "--rule", "rsgd"]) == 0


@pytest.mark.parametrize(
    ("points", "message"),
    [
        (lambda w: None, "give record\\(\\.\\.\\., points=\\[\\.\\.\\.\\]\\)"),
        (lambda w: [], "must name the optimizer's frames, each once"),
        (lambda w: [w, w], "each once"),
        (lambda w: [torch.nn.Parameter(torch.eye(3, 2))], "points\\[0\\] is not a parameter"),
        (lambda w: [w.view(-1)], "points\\[0\\] is not a parameter"),
    ],
)
def test_bad_points_are_refused_at_record(tmp_path, points, message) -> None:
    w = torch.nn.Parameter(torch.eye(7, 3))
    with pytest.raises(ValueError, match=message):
        audit.record(StiefelSGD([w], lr=LR), tmp_path / "r.npz", points=points(w))
    assert not (tmp_path / "r.npz.parts").exists()


def test_a_wide_parameter_is_not_a_frame(tmp_path) -> None:
    w = torch.nn.Parameter(torch.eye(3, 7))
    with pytest.raises(ValueError, match=r"shape \(3, 7\) is not a batch of d×r frames"):
        audit.record(StiefelSGD([w], lr=LR), tmp_path / "r.npz", points=[w])


def test_points_are_for_other_optimizers(tmp_path) -> None:
    import torch_port as tp

    w = torch.nn.Parameter(torch.eye(7, 3))
    opt = tp.RSGD([{"params": [w], "geometry": "stiefel"}], lr=LR)
    with pytest.raises(ValueError, match="points are read from its parameter groups"):
        audit.record(opt, tmp_path / "r.npz", points=[w])
