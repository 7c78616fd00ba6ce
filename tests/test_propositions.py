"""Every registered check passes on the implementation and rejects its negative control."""

from __future__ import annotations

import dataclasses

import pytest
import sympy as sp

import reference as ref
from proofs_checks import REGISTRY
from proofs_checks.registry import Check, Context, Outcome, Proposition, run_check

CASES = [
    pytest.param(p, c, id=f"{p.id}-{c.kind}-{i}")
    for p in REGISTRY.values()
    for i, c in enumerate(p.checks)
]


@pytest.mark.parametrize(("proposition", "check"), CASES)
def test_check_passes_and_rejects_its_control(proposition: Proposition, check: Check) -> None:
    if proposition.missing:  # the port propositions without torch
        pytest.skip(proposition.missing)
    result = run_check(check, Context(seed=0, quick=True))
    assert result.outcome.passed, result.outcome.detail
    assert result.control_rejected, f"control not rejected: {result.control_outcome.detail}"
    assert result.passed


def test_the_ids_are_registered_with_their_required_kinds() -> None:
    assert [f"RA-{i}" for i in range(1, 8)] == [i for i in REGISTRY if i.startswith("RA-")]
    for pid, p in REGISTRY.items():
        if pid.startswith("RA-"):
            assert {"float64", "mpmath", "property"} <= set(p.kinds), pid
    geo_ids = {i.removeprefix("GEO-") for i in REGISTRY if i.startswith("GEO-")}
    assert geo_ids == {
        "stiefel",
        *ref.GEOMETRIES,
        "stiefel-canonical",
        "fixed_rank_quotient-balanced",
    }
    assert len(ref.GEOMETRIES) == 10
    assert "symbolic" in REGISTRY["RA-3"].kinds
    assert "symbolic" in REGISTRY["RA-5"].kinds


def test_every_check_states_its_bound() -> None:
    for p in REGISTRY.values():
        for c in p.checks:
            assert c.run.__doc__ and len(c.run.__doc__.split()) >= 8, (p.id, c.name)
            assert c.control, (p.id, c.name)


def test_hash_covers_statement_and_is_stable() -> None:
    p = REGISTRY["RA-1"]
    assert p.hash == REGISTRY["RA-1"].hash and len(p.hash) == 64
    assert dataclasses.replace(p, statement=p.statement + " ").hash != p.hash
    assert dataclasses.replace(p, checks=p.checks[:-1]).hash != p.hash


def _always(passed: bool):
    return lambda ctx, wrong: Outcome(passed, 0.0, 1.0, "fixed")


def test_a_check_whose_control_passes_is_a_failure() -> None:
    vacuous = Check("float64", "vacuous", _always(True), "nothing")
    result = run_check(vacuous, Context())
    assert result.outcome.passed and result.control_outcome.passed and not result.passed


def test_a_crashing_control_is_not_a_rejection() -> None:
    def crash_on_control(ctx, wrong):
        if wrong:
            raise ValueError("boom")
        return Outcome(True, 0.0, 1.0, "fine")

    result = run_check(Check("float64", "c", crash_on_control, "x"), Context())
    assert result.outcome.passed and result.control_outcome.crashed
    assert not result.control_rejected and not result.passed


def test_a_crashing_check_is_reported_not_raised() -> None:
    def crash(ctx, wrong):
        raise ZeroDivisionError("boom")

    result = run_check(Check("float64", "crash", crash, "nothing"), Context())
    assert not result.passed
    assert "ZeroDivisionError: boom" in result.outcome.detail


def test_outcome_bound_rejects_nan() -> None:
    assert not Outcome.bound(float("nan"), 1.0, "").passed
    assert Outcome.bound(1.0, 1.0, "").passed and not Outcome.bound(1.0 + 1e-16 * 4, 1.0, "").passed


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown check kind"):
        Check("numeric", "x", _always(True), "y")


@pytest.mark.parametrize("rule", ["rsgd", "riemannian_adam", "normalized_rsgd"])
def test_ra7_symbolic_identities_fail_at_the_wrong_degree(rule) -> None:
    """RA-7's SymPy identity ξ(cg) − c^k ξ(g) = 0 is not reduced to zero for 1 − k in place of
    k: ``vanishes`` and the maps can reject a wrong degree (the check's own control acts on its
    comparison with the library)."""
    from proofs_checks.harness import vanishes
    from proofs_checks.propositions.ra7_degree import DEGREES, one_step_maps

    steps, g, (c, *_) = one_step_maps()
    v, f = sp.Matrix(g), steps[rule]
    assert vanishes(f(c * v) - c ** DEGREES[rule] * f(v))
    assert not vanishes(f(c * v) - c ** (1 - DEGREES[rule]) * f(v))
