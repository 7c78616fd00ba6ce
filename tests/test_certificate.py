"""Certificates: the JSON schema of DESIGN §9, Markdown and LaTeX, and exit statuses."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from proofs_checks import REGISTRY, certify, latex
from proofs_checks.certificate import Certificate
from proofs_checks.cli import main
from proofs_checks.registry import Check, CheckResult, Outcome, Proposition, PropositionResult


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
            assert c["kind"] in {"symbolic", "float64", "mpmath", "property", "machine-checked"}
            assert isinstance(c["passed"], bool) and isinstance(c["detail"], str)
            assert c["residual"] is None or isinstance(c["residual"], float)
            assert c["control"]["rejected"] is True
    env = doc["environment"]
    assert set(env["versions"]) >= {"numpy", "scipy", "mpmath", "sympy"}
    assert env["python"] and env["platform"]


def test_markdown_and_latex_carry_every_check(cert) -> None:
    md, tex = cert.to_markdown(), cert.to_latex().replace(latex.BREAK, "")
    for p in cert.results:
        assert f"## {p.proposition.id}" in md and p.proposition.hash in md
        assert p.proposition.hash in tex and p.proposition.implementation_hash in tex
        assert p.proposition.implementation_hash in md
        assert all(c.name in md for c in p.checks)
        assert all(latex.text(c.name).replace(latex.BREAK, "") in tex for c in p.checks)
    assert tex.count(r"\textbf{Proposition (") == 2 and tex.rstrip().endswith(r"\rattnend")


def test_the_latex_is_ascii_for_pdflatex_and_works_both_ways(cert) -> None:
    """ASCII only (pdflatex without inputenc tricks); every symbol a command in math mode
    (``\\ensuremath``); one file that a paper can ``\\input`` (the preamble is skipped once a
    \\documentclass has run, as LaTeX then sets it to \\@twoclasseserror) and that compiles on
    its own (\\documentclass ... \\begin{document} ... \\end{document} through \\rattnend)."""
    tex = cert.to_latex()
    assert tex.isascii()
    guard = tex.index(r"\ifx\documentclass\@twoclasseserror")
    assert guard < tex.index(r"\documentclass[10pt]{article}") < tex.index(r"\begin{document}")
    assert tex.index(r"\gdef\rattnend{\end{document}}") < tex.index(r"\fi")
    assert tex.count("{") == tex.count("}")  # balanced (no unescaped brace from a name)
    assert r"\usepackage{fontspec}" not in tex and "unicode-math" not in tex


def test_every_text_of_the_registry_has_latex_for_its_symbols() -> None:
    from proofs_checks import REGISTRY

    for p in REGISTRY.values():
        texts = [p.title, p.statement, *p.hypotheses]
        texts += [t for c in p.checks for t in (c.name, c.control)]
        missing = set().union(*(latex.unknown(t) for t in texts))
        assert not missing, (p.id, missing)
        assert all(latex.text(t).isascii() for t in texts)


def test_latex_text_escapes_and_writes_symbols() -> None:
    assert latex.text("‖ξ‖ ≤ Δ_1 & 50%") == (
        r"\ensuremath{\|}\ensuremath{\xi}\ensuremath{\|} \ensuremath{\le} "
        r"\ensuremath{\Delta}\_\allowbreak{}1 \& 50\%"
    )
    assert latex.text("x\u0302 — WᵀW") == r"\ensuremath{\hat{x}} --- W\ensuremath{^{\top}}W"
    assert latex.text("ש") == r"\textbf{?}" and latex.unknown("aשb") == {"ש"}


def test_write_produces_the_four_files(cert, tmp_path) -> None:
    paths = cert.write(tmp_path / "out")
    assert sorted(p.name for p in paths) == [
        "certificate.bib",
        "certificate.json",
        "certificate.md",
        "certificate.tex",
    ]
    assert json.loads(paths[0].read_text())["passed"] is True
    bib = (tmp_path / "out" / "certificate.bib").read_text()
    source = cert.environment["source_hash"]
    assert bib.startswith(f"@misc{{rattn-{source[:8]}-s{cert.seed},") and source in bib
    assert bib.isascii() and bib.count("{") == bib.count("}")


@pytest.mark.parametrize(
    ("ids", "title"),
    [
        (["RA-5"], "Certificate of {RA-5}"),
        (["RA-7", "RA-5"], "Certificate of {RA-7} and {RA-5}"),
        (
            ["RA-1", "GEO-stiefel_pair", "EB-3"],
            r"Certificate of {RA-1}, {GEO-stiefel\_\allowbreak{}pair} and {EB-3}",
        ),
        (["RA-1", "RA-2", "RA-3", "RA-4"], "Certificate of 4 propositions"),
        (list(REGISTRY), f"Certificate of {len(REGISTRY)} propositions"),
    ],
)
def test_the_bib_title_is_short_with_its_ids_in_braces(ids, title) -> None:
    """BibTeX styles change a title's case except inside braces: every id is braced, in the
    title (at most three) and in the note (all of them, in order)."""
    cert = Certificate([PropositionResult(REGISTRY[i]) for i in ids], seed=3, quick=True)
    lines = cert.to_bib().splitlines()
    assert f"  title = {{{title}}}," in lines
    note = next(line for line in lines if line.startswith("  note = {"))
    braced = ", ".join("{" + latex.text(i) + "}" for i in ids)
    assert note.startswith(f"  note = {{Propositions {braced}; rattn ")
    assert note.count("{") == note.count("}")


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


def test_a_proposition_whose_modules_are_missing_is_listed_as_not_run(tmp_path, monkeypatch):
    """A proposition that requires a module which is not installed is not run: the certificate
    lists it with the reason and passes on the others (the port propositions without torch)."""
    from proofs_checks import registry

    fake = registry.Proposition(
        id="ZZ-1",
        title="needs a module that is not installed",
        statement="$1=1$",
        hypotheses=("none",),
        checks=REGISTRY["RA-7"].checks,
        requires=("surely_not_an_installed_module",),
    )
    monkeypatch.setitem(REGISTRY, "ZZ-1", fake)
    cert = certify(["RA-7", "ZZ-1"], quick=True)
    assert [r.proposition.id for r in cert.results] == ["RA-7"] and cert.passed
    assert cert.not_run == [
        {
            "id": "ZZ-1",
            "title": "needs a module that is not installed",
            "reason": "needs surely_not_an_installed_module, which is not installed",
        }
    ]
    assert json.loads(cert.to_json())["not_run"][0]["id"] == "ZZ-1"
    assert "Not run: ZZ-1" in cert.to_markdown() and "Not run: ZZ-1" in cert.to_latex()
    assert REGISTRY["PORT-1"].requires == ("torch",) and REGISTRY["PORT-1"].missing is None


def _every_proposition() -> Certificate:
    """A certificate of the whole registry with made-up outcomes (each check passing, each
    control rejected) and one proposition listed as not run: every text the LaTeX sets, without
    running a check."""
    results = []
    for p in REGISTRY.values():
        r = PropositionResult(p)
        for c in p.checks:
            passed = Outcome(True, 1.25e-16, 2.5e-12, "1.25e-16 against 2.5e-12")
            rejected = Outcome(False, 0.5, 2.5e-12, "0.5 against 2.5e-12")
            r.checks.append(CheckResult(c.kind, c.name, passed, c.control, rejected))
        results.append(r)
    not_run = [{"id": "PORT-1", "title": REGISTRY["PORT-1"].title, "reason": "no torch"}]
    return Certificate(results, 0, True, not_run=not_run)


def _pdflatex(directory: Path, name: str) -> str:
    """Run pdflatex on ``name``.tex in ``directory`` and return its log (pdflatex failing is an
    assertion naming the first error)."""
    run = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", f"{name}.tex"],
        cwd=directory,
        capture_output=True,
        timeout=300,
    )
    log = (directory / f"{name}.log").read_text(errors="replace")
    errors = [line for line in log.splitlines() if line.startswith("!")]
    assert run.returncode == 0 and (directory / f"{name}.pdf").exists(), errors[:3]
    return log


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_the_latex_compiles_with_pdflatex_alone_and_in_a_paper(tmp_path: Path) -> None:
    """Every proposition's text compiles with pdflatex, on its own and ``\\input`` in a paper
    that loads only amsmath and amssymb, with no line over the margin (Overfull) and no glyph
    lost: ``\\tracinglostchars=3`` makes a character missing from the font an error."""
    tex = _every_proposition().to_latex()
    (tmp_path / "certificate.tex").write_text(tex, encoding="ascii")
    log = _pdflatex(tmp_path, "certificate")
    assert "Overfull" not in log
    paper = (
        "\\documentclass{article}\n\\usepackage{amsmath,amssymb}\n\\tracinglostchars=3\n"
        "\\begin{document}\nThe paper.\n\\input{certificate}\nAfter it.\n\\end{document}\n"
    )
    (tmp_path / "paper.tex").write_text(paper, encoding="ascii")
    log = _pdflatex(tmp_path, "paper")
    assert "Overfull" not in log and "Missing character" not in log
    # controls: a glyph missing from its font stops the same paper, and a line that cannot
    # break is reported as Overfull
    lost = tex.replace("Certificate}", r"Certificate {\usefont{U}{msa}{m}{n}\char255}}", 1)
    (tmp_path / "certificate.tex").write_text(lost, encoding="ascii")
    with pytest.raises(AssertionError):
        _pdflatex(tmp_path, "paper")
    wide = tex.replace("Certificate}", "Certificate}" + r"\texttt{" + "x" * 120 + "}", 1)
    (tmp_path / "certificate.tex").write_text(wide, encoding="ascii")
    assert "Overfull" in _pdflatex(tmp_path, "certificate")


#: The propositions held to the referee's reading: every check records what it exercised, and
#: at least one control is a near miss.
REFEREED = list(REGISTRY)


@pytest.fixture(scope="module")
def refereed():
    """A quick certificate of ``REFEREED`` at seed 3, by id."""
    return {r.proposition.id: r for r in certify(ids=REFEREED, quick=True, seed=3).results}


@pytest.mark.parametrize("pid", REFEREED)
def test_every_check_records_what_it_exercised(refereed, pid) -> None:
    """Each check's passing run names the instances (sizes and options), points, seeds and
    dtypes it ran, and the certificate prints them beside the statement (Markdown: per check
    and per proposition; LaTeX and JSON: per proposition, JSON per check too)."""
    result = refereed[pid]
    assert result.passed and result.exercised_by == len(result.ran)
    for c in result.ran:  # a check whose tool is missing here (coqc) is not run
        ran = dict(c.outcome.exercised)
        assert ran.get("seeds") and ran.get("dtypes") and len(ran) >= 3, (c.name, ran)
    cert = Certificate([result], seed=3, quick=True)
    doc = json.loads(cert.to_json())["propositions"][0]
    assert doc["exercised"] == result.exercised and all(c["exercised"] for c in doc["checks"])
    md, tex = cert.to_markdown(), cert.to_latex().replace(latex.BREAK, "")
    assert "\nExercised: " in md and "not recorded" not in md
    assert r"\noindent Exercised: " in tex


@pytest.mark.parametrize("pid", REFEREED)
def test_a_control_of_every_proposition_is_a_near_miss(refereed, pid) -> None:
    """At least one control is rejected at no more than 100× its tolerance (or, for an exact
    count, is a threshold moved by a small amount), and the certificate says which."""
    result = refereed[pid]
    near = [c for c in result.checks if c.near_miss]
    assert near, [(c.name, c.control_ratio) for c in result.checks]
    md = Certificate([result], seed=3, quick=True).to_markdown()
    assert "near miss)" in md


def test_a_gross_control_is_no_near_miss() -> None:
    """Control: a control rejected at 1e10× its tolerance, or an exact check's control not
    named a near miss, or one not rejected, is no near miss; one at 30× is."""

    def result(control: str, residual: float, tolerance: float) -> CheckResult:
        ok = Outcome.bound(0.0, tolerance, "ok")
        return CheckResult("float64", "c", ok, control, Outcome.bound(residual, tolerance, ""))

    assert result("a bug", 30.0, 1.0).near_miss
    assert not result("a bug", 1e10, 1.0).near_miss
    assert not result("a bug", 0.5, 1.0).near_miss  # not rejected
    assert not result("a threshold moved", 1.0, 0.0).near_miss
    assert result("near miss: a threshold moved", 1.0, 0.0).near_miss


def test_a_check_that_records_nothing_is_said_to_record_nothing() -> None:
    """Control: a proposition whose checks record nothing says so, and one recorded by some of
    its checks says by how many."""
    bare = Outcome.bound(0.0, 1.0, "ok")
    recorded = Outcome.bound(0.0, 1.0, "ok", {"sizes": "St(7, 3)"})
    p = Proposition("X-1", "t", "s", (), ())
    none = PropositionResult(p, [CheckResult("float64", "a", bare, "c", Outcome.bound(2, 1, ""))])
    some = PropositionResult(
        p, [*none.checks, CheckResult("float64", "b", recorded, "c", Outcome.bound(2, 1, ""))]
    )
    from proofs_checks.certificate import exercised_text

    assert exercised_text(none) == "not recorded by its checks"
    assert exercised_text(some) == "sizes St(7, 3) (recorded by 1 of the 2 checks that ran)"
