"""``rattn audit TRACE --rule NAME --set KEY=VALUE``: a recorded run replayed against the rule
the user says it follows (the names of ``rattn conform``), not against the trace's own
metadata. Each row of the table is a claim about one honest Riemannian Adam run and the verdict
it must get; the true claim passes, each wrong one fails at step 1."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from proofs_checks.audit import replay as pa  # noqa: E402
from proofs_checks.audit.rules import Claim  # noqa: E402
from proofs_checks.cli import main  # noqa: E402
from torch_port import audit  # noqa: E402


@pytest.fixture(scope="module")
def adam_run(tmp_path_factory):
    """RiemannianAdam (lr 1e-2, betas (0.9, 0.999), frame moment) on two St(7, 3) frames,
    float64, 5 steps of a Brockett cost."""
    w = torch.nn.Parameter(
        tp.Stiefel(7, 3).random_point(torch.Generator().manual_seed(5), (2,)).double()
    )
    a = torch.randn(7, 7, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    a = a + a.T
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    path = tmp_path_factory.mktemp("rule") / "run.npz"
    with audit.record(opt, path):
        for _ in range(5):
            opt.zero_grad()
            torch.einsum("hdr,de,her->", w, a, w).backward()
            opt.step()
    return path


@pytest.mark.parametrize(
    ("rule", "settings", "verdict", "first"),
    [
        ("riemannian_adam", {}, "passed", None),  # lr from the trace, the rest the defaults
        ("riemannian_adam", {"lr": 1e-2, "betas": [0.9, 0.999]}, "passed", None),
        ("riemannian_adam", {"lr": 1.1e-2}, "failed", 1),
        ("riemannian_adam", {"eps": 1e-1}, "failed", 1),
        ("riemannian_adam", {"moment": "elementwise"}, "failed", 1),
        ("riemannian_adam", {"trust_radius": 1e-3}, "failed", 1),
        ("rsgd", {}, "failed", 1),
        ("normalized_rsgd", {}, "failed", 1),
        ("geoopt_riemannian_adam", {}, "failed", 1),  # geoopt's lr is a step length
        ("geoopt_riemannian_sgd", {"momentum": 0.9}, "failed", 1),
    ],
)
def test_a_claimed_rule_is_what_is_replayed(adam_run, rule, settings, verdict, first) -> None:
    result = pa.audit(adam_run, claim=Claim(rule, settings))
    assert result["verdict"] == verdict
    assert result["first_failure_step"] == first
    assert result["rule"] == {"name": rule, "settings": settings}


def test_the_state_catches_a_second_moment_claim(adam_run) -> None:
    """betas (0.9, 0.99) moves the point little at step 1 (√v̂ is bias-corrected); the state
    after the step (√v) shows it at once."""
    result = pa.audit(adam_run, claim=Claim("riemannian_adam", {"betas": [0.9, 0.99]}))
    assert result["verdict"] == "failed" and result["first_failure_step"] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rule", "geoopt_riemannian_adam", "--set", "moment=frame"], "no setting moment"),
        (["--rule", "adamw"], "unknown rule 'adamw'"),
        (["--rule", "riemannian_adam", "--set", "retraction=qr"], "no setting retraction"),
        (["--set", "lr=1"], "--set needs --rule"),
    ],
)
def test_bad_claims_exit_2(adam_run, argv, message, capsys) -> None:
    assert main(["audit", str(adam_run), *argv, "--json"]) == 2
    assert message in capsys.readouterr().err


def test_the_cli_reports_the_claim(adam_run, capsys) -> None:
    assert main(["audit", str(adam_run), "--rule", "riemannian_adam", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rule"]["name"] == "riemannian_adam"
    code = main(["audit", str(adam_run), "--rule", "riemannian_adam", "--set", "lr=0.02"])
    out = capsys.readouterr().out
    assert code == 1 and "against the claimed rule riemannian_adam (lr=0.02)" in out


def test_along_is_the_relative_error_of_the_step_length(adam_run) -> None:
    """Replayed against lr 1.1e-2, a step taken at 1e-2 falls short along the exact step by
    (1e-2 − 1.1e-2)/1.1e-2 = −1/11 of it, up to the retraction's curvature, second order in
    the step: within Δ² (measured 9e-5 at Δ = 0.05); the honest replay's |along| is within
    its row's bound over Δ (a deviation of at most the bound has at most that component)."""
    claimed = pa.audit(adam_run, claim=Claim("riemannian_adam", {"lr": 1.1e-2}))
    first = [r for r in claimed["steps"] if r["step"] == 1]
    assert first and all(abs(r["along"] + 1 / 11) < r["step_length"] ** 2 for r in first)
    honest = pa.audit(adam_run)
    assert all(abs(r["along"]) <= r["bound"] / r["step_length"] for r in honest["steps"])
