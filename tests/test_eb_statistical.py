"""The statistical Entropic-Bound propositions EB-3, EB-4, EB-6 and EB-8.

``test_propositions.py`` runs every check at certificate seed 0; here the statistical checks run
at further certificate seeds (the docs claim seeds 0–10 pass and reject their controls), and the
registry is checked for what a statistical proposition must state: its seeds, sample sizes and
pass criterion ("at least 9 of 10 replicates").
"""

from __future__ import annotations

import pytest

from proofs_checks import REGISTRY
from proofs_checks.propositions import eb_data, eb_native, eb_recovery, eb_softmax
from proofs_checks.registry import Context, run_check

STATISTICAL = ("EB-3", "EB-4", "EB-6", "EB-8")
MODULES = {"EB-3": eb_recovery, "EB-4": eb_data, "EB-6": eb_native, "EB-8": eb_softmax}

CASES = [
    pytest.param(pid, i, seed, id=f"{pid}-{i}-seed{seed}")
    for pid in STATISTICAL
    for i, c in enumerate(REGISTRY[pid].checks)
    if c.kind == "float64"
    for seed in (4, 10)
]


@pytest.mark.parametrize(("pid", "index", "seed"), CASES)
def test_statistical_check_passes_and_rejects_its_control_at_other_seeds(pid, index, seed):
    result = run_check(REGISTRY[pid].checks[index], Context(seed=seed, quick=False))
    assert result.outcome.passed, result.outcome.detail
    assert result.control_rejected, f"control not rejected: {result.control_outcome.detail}"


def test_the_eb_ids_are_registered_in_citation_order():
    eb = [i for i in REGISTRY if i.startswith("EB-")]
    assert eb == [f"EB-{k}" for k in range(1, 9)]


@pytest.mark.parametrize("pid", STATISTICAL)
def test_statistical_propositions_state_seeds_sizes_and_criterion(pid):
    p = REGISTRY[pid]
    module = MODULES[pid]
    assert module.REPLICATES == 10 and module.MAX_MISSES == 1
    assert "9 of 10" in p.statement
    assert "default_rng" in p.seeds and "replicate" in p.seeds
    assert any("10 replicates" in h or "9" in h for h in p.hypotheses) or pid == "EB-6"
    for c in p.checks:
        doc = " ".join(c.run.__doc__.split())
        if c.kind == "float64":
            assert "10" in doc and ("9 of 10" in doc or "bound" in doc or "≥" in doc), c.name
        assert c.control


def test_counts_are_the_residual_of_the_statistical_checks():
    """A statistical check reports the number of failing replicates against the allowed one:
    residual ≤ 1 passes, so a control with 2 or more failing replicates is rejected."""
    result = run_check(REGISTRY["EB-4"].checks[0], Context(seed=0))
    assert result.outcome.tolerance == 1.0
    assert result.outcome.residual <= 1.0 < result.control_outcome.residual
