"""The machine-checked checks: Coq proofs that pass only when every lemma is closed, controls
that fail, and a check whose tool is missing listed as not run, never passed."""

from __future__ import annotations

import json

import pytest

from proofs_checks import machine_checked as mc
from proofs_checks.certificate import Certificate
from proofs_checks.registry import REGISTRY, Check, Context, Outcome, PropositionResult, run_check
from proofs_checks.verify import proposition_differences

needs_coq = pytest.mark.skipif(mc.unavailable() is not None, reason=str(mc.unavailable()))
CTX = Context(seed=0)

#: Propositions that carry a machine-checked check, and the proof each runs.
CARRIERS = {
    "GEO-stiefel": "GEO-stiefel",
    "RA-1": "RA-1",
    "RA-3": "RA-3",
    "RA-5": "RA-5",
    "RA-6": "RA-6",
    "GEO-fixed_rank_embedded": "R1/P1",
    "GEO-partial_isometry_embedded": "R1/P1",
}


def _machine_checks(pid: str) -> list[Check]:
    return [c for c in REGISTRY[pid].checks if c.kind == "machine-checked"]


@pytest.mark.parametrize("pid", sorted(CARRIERS))
def test_each_carrier_has_one_machine_checked_check(pid) -> None:
    (check,) = _machine_checks(pid)
    assert check.name == mc.PROOFS_BY_ID[CARRIERS[pid]].name
    assert check.control == mc.PROOFS_BY_ID[CARRIERS[pid]].control


def test_no_other_proposition_claims_a_machine_checked_check() -> None:
    carriers = {pid for pid in REGISTRY if _machine_checks(pid)}
    assert carriers == set(CARRIERS)


CONTROLS = [(key, c) for key, p in sorted(mc.PROOFS_BY_ID.items()) for c in p.controls]


@pytest.mark.parametrize("key", sorted(mc.PROOFS_BY_ID))
def test_every_lemma_has_one_control(key) -> None:
    proof = mc.PROOFS_BY_ID[key]
    assert [c.lemma for c in proof.controls] == list(proof.lemmas)


@pytest.mark.parametrize(("key", "control"), CONTROLS, ids=[c.lemma for _, c in CONTROLS])
def test_every_control_text_occurs_once_and_changes_the_file(key, control) -> None:
    text = mc.source()
    assert text.count(control.old) == 1
    assert mc.variant(text, control) != text
    with pytest.raises(ValueError, match="occurs 0 times"):
        mc.variant(text.replace(control.old, "(* gone *)"), control)


@needs_coq
@pytest.mark.parametrize(("key", "control"), CONTROLS, ids=[c.lemma for _, c in CONTROLS])
def test_each_false_variant_is_refuted_inside_its_own_proof(key, control) -> None:
    inside, status = mc.refuted(mc.source(), control)
    assert inside, status


@needs_coq
@pytest.mark.parametrize(
    ("control", "why"),
    [
        # a slip in another lemma: the file fails, but not in proj_idem's proof
        (mc.Control("proj_idem", "Lemma symD A B :", "Lemma symD A B C :", "slip"), "elsewhere"),
        # an ill-typed statement: fails on the statement's line, not in the proof
        (
            mc.Control(
                "proj_idem",
                "proj W (proj W Z) = proj W Z.",
                "proj W (proj W Z) = W^T.",
                "ill-typed",
            ),
            "statement",
        ),
        # a true variant (a hypothesis added): it still compiles, nothing is refuted
        (
            mc.Control(
                "proj_idem",
                "Lemma proj_idem W Z : W^T *m W = 1%:M ->",
                "Lemma proj_idem W Z : W^T *m W = 1%:M -> Z = Z ->",
                "true",
            ),
            "true",
        ),
    ],
)
def test_a_variant_that_fails_for_another_reason_is_no_refutation(control, why) -> None:
    inside, status = mc.refuted(mc.source(), control)
    assert not inside, (why, status)


@needs_coq
@pytest.mark.parametrize("key", sorted(mc.PROOFS_BY_ID))
def test_the_proof_passes_and_its_false_variants_fail(key) -> None:
    run = mc.check(key)
    good, bad = run(CTX, False), run(CTX, True)
    assert good.passed and good.residual == 0 and good.tolerance == 0
    n = len(mc.PROOFS_BY_ID[key].controls)
    assert not bad.passed and bad.residual == n and bad.tolerance == n - 1
    assert dict(good.exercised)["lemmas"] == ", ".join(mc.PROOFS_BY_ID[key].lemmas)


def _closed(text: str, lemmas: tuple[str, ...]) -> frozenset[str]:
    return mc.closed_lemmas(text, lemmas)[0]


@needs_coq
def test_a_file_that_does_not_compile_closes_nothing() -> None:
    closed, status = mc.closed_lemmas(
        mc.source() + "\nLemma broken : 1 = 2. Proof. by []. Qed.\n", ("gram_step",)
    )
    assert closed == frozenset() and status.startswith("does not compile (line ")


def _never() -> str:
    return "needs a tool that is not here"


def test_a_check_whose_tool_is_missing_is_not_run_and_never_passes() -> None:
    calls = []

    def run(ctx: Context, wrong: bool) -> Outcome:
        calls.append(wrong)
        return Outcome(True, 0.0, 0.0, "would pass")

    check = Check("machine-checked", "a proof", run, "a false variant", unavailable=_never)
    result = run_check(check, CTX)
    assert calls == []  # neither side ran
    assert result.not_run == _never() and not result.passed
    other = run_check(
        Check("float64", "a measurement", lambda c, w: Outcome.bound(float(w), 0.5, ""), "x"), CTX
    )
    prop = REGISTRY["RA-3"]
    both = PropositionResult(prop, [other, result])
    assert both.passed and both.ran == [other]  # the proposition stands on what ran
    alone = PropositionResult(prop, [result])
    assert not alone.passed  # nothing ran: no verdict to give

    cert = Certificate([both], 0, False)
    (entry,) = cert.to_dict()["propositions"]
    assert [c["not_run"] for c in entry["checks"]] == [None, _never()]
    row = next(line for line in cert.to_markdown().splitlines() if "| a proof |" in line)
    assert "| not run |" in row and row.endswith("| not run |")
    assert "not run" in cert.to_latex()
    # the summary names the kinds that ran, and those declared that did not
    summary = next(line for line in cert.to_markdown().splitlines() if line.startswith("| RA-3"))
    ran = {c.kind for c in [other]}
    declared = [k for k in prop.kinds if k not in ran]
    assert f"not run: {', '.join(declared)}" in summary


def test_verify_reports_a_check_recorded_as_not_run_that_runs_here() -> None:
    check = Check("float64", "a measurement", lambda c, w: Outcome.bound(float(w), 0.5, ""), "x")
    here = Certificate([PropositionResult(REGISTRY["RA-3"], [run_check(check, CTX)])], 0, False)
    now = here.to_dict()["propositions"][0]
    forged = json.loads(json.dumps(now))
    forged["checks"][0]["not_run"] = "needs coqc"
    fields = [d["field"] for d in proposition_differences(forged, now)]
    assert "checks[0].not_run" in fields
    assert proposition_differences(now, now) == []


@needs_coq
def test_the_certificate_records_the_tools_it_used() -> None:
    from proofs_checks.certificate import certify

    cert = certify(["RA-5"])
    tools = cert.environment["tools"]
    assert tools["coq"] and tools["coq"][0].isdigit()
    assert "tools" not in certify(["EB-2"], quick=True).environment


#: Attacks a proof file could make, each refused before it is compiled.
ATTACKS = {
    "an admission": "Lemma extra : False. Admitted.",
    "an axiom": "Axiom cheat : False.",
    "a section hypothesis": "Hypothesis oops : False.",
    "a shadowing module": "Module Shadow. Lemma gram_step : True. Proof. exact I. Qed. End Shadow.",
    "a redefined tactic": "From Ltac2 Require Import Ltac2.",
    "a notation": 'Notation "x" := 1.',
    "a kernel check off": "Unset Guard\n  Checking.",
    "a printed verdict": 'Goal True. idtac "Closed under the global context". Abort.',
    "a shadowing definition": "Definition mulmx := 0.",
    "a canonical instance": "Canonical fake := 0.",
    "an inductive type": "Inductive nat := O.",
}


@pytest.mark.parametrize("how", sorted(ATTACKS))
def test_a_file_that_could_fake_its_verdict_is_refused(how) -> None:
    text = mc.source().replace("End Complement.", ATTACKS[how] + "\nEnd Complement.")
    closed, status = mc.closed_lemmas(text, ("gram_step",))
    assert closed == frozenset() and status.startswith("refused"), status


#: Files that compile and close every lemma, but prove something other than what is pinned
#: (``coq_statements``): each (old, new) edit of the proof file, with the lemma it weakens.
EASIER = {
    "a weaker statement under the pinned name": (
        "Lemma steepest W G X : tangent W X -> \\tr (G^T *m X) = \\tr ((proj W G)^T *m X).\n"
        "Proof. by move=> TX; rewrite proj_adjoint proj_tangent. Qed.",
        "Lemma steepest W G X : tangent W X -> \\tr (G^T *m X) = \\tr (G^T *m X).\n"
        "Proof. by []. Qed.",
        "steepest",
    ),
    "skew redefined as 0": (
        "Definition skew (A : 'M[R]_r) : 'M[R]_r := 2^-1 *: (A - A^T).",
        "Definition skew (A : 'M[R]_r) : 'M[R]_r := 0 *: (A - A^T).",
        "gauge_orbit",
    ),
}


@needs_coq
@pytest.mark.parametrize("how", sorted(EASIER))
def test_a_file_proving_something_easier_under_the_pinned_names_fails(how) -> None:
    old, new, lemma = EASIER[how]
    text = mc.source()
    assert text.count(old) == 1, "the attack's text is not in the proof file"
    closed, status = mc.closed_lemmas(text.replace(old, new), (lemma,))
    assert lemma not in closed and status.startswith("compiles"), status
    assert lemma in mc.closed_lemmas(text, (lemma,))[0]
