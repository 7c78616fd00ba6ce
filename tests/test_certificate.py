"""Certificates: the JSON schema of DESIGN §9, Markdown and LaTeX, and exit statuses."""

from __future__ import annotations

import json

import pytest

from proofs_checks import REGISTRY, certify
from proofs_checks.cli import main
from proofs_checks.registry import Check, Outcome, Proposition


@pytest.fixture(scope="module")
def cert():
    return certify(ids=["RA-7", "RA-5"], quick=True, seed=3)


def test_json_follows_the_schema(cert) -> None:
    doc = json.loads(cert.to_json())
    assert doc["passed"] is True and doc["seed"] == 3
    assert [p["id"] for p in doc["propositions"]] == ["RA-5", "RA-7"]  # registry order
    for p in doc["propositions"]:
        assert set(p) >= {"id", "title", "statement", "passed", "hash", "checks"}
        assert p["hash"] == REGISTRY[p["id"]].hash
        for c in p["checks"]:
            assert c["kind"] in {"symbolic", "float64", "mpmath", "property"}
            assert isinstance(c["passed"], bool) and isinstance(c["detail"], str)
            assert c["residual"] is None or isinstance(c["residual"], float)
            assert c["control"]["rejected"] is True
    env = doc["environment"]
    assert set(env["versions"]) >= {"numpy", "scipy", "mpmath", "sympy"}
    assert env["python"] and env["platform"]


def test_markdown_and_latex_carry_every_check(cert) -> None:
    md, tex = cert.to_markdown(), cert.to_latex()
    for p in cert.results:
        assert f"## {p.proposition.id}" in md and p.proposition.hash in md
        assert p.proposition.hash in tex
        assert all(c.name in md for c in p.checks)
    assert tex.count(r"\begin{proposition}") == 2 and tex.rstrip().endswith(r"\end{document}")


def test_write_produces_three_files(cert, tmp_path) -> None:
    paths = cert.write(tmp_path / "out")
    assert sorted(p.name for p in paths) == [
        "certificate.json",
        "certificate.md",
        "certificate.tex",
    ]
    assert json.loads(paths[0].read_text())["passed"] is True


def test_certify_rejects_unknown_ids() -> None:
    with pytest.raises(ValueError, match="RA-99"):
        certify(ids=["RA-99"])


@pytest.fixture
def failing(monkeypatch):
    """A registered proposition whose only check fails."""

    def never(ctx, wrong):
        return Outcome.bound(1.0, 0.5, "always too large")

    p = Proposition("X-1", "fails", "x", ("none",), (Check("float64", "never", never, "same"),))
    monkeypatch.setitem(REGISTRY, "X-1", p)
    return p


def test_a_failed_check_exits_1(failing, tmp_path, capsys) -> None:
    assert main(["certify", "X-1", "--out", str(tmp_path)]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert json.loads((tmp_path / "certificate.json").read_text())["passed"] is False
