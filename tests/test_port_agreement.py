"""The port against the reference over the table of records ``port_compare.RECORDS``: every
geometry (Stiefel and the ten), every rule (the four presets, the capped, elementwise and
summed variants, ablation arms E and H), the retractions and metrics, float64, float32 and
bfloat16, the same table ``rattn compare`` runs.

Each case must meet its bounds (``proofs_checks/port_compare``, package docstring): the a
priori deviation bound max(1, S)·(e_0 + N·90·u_w·s), the measured envelope for bfloat16, and the
drift bound 4r(r + 1)·u_w + 2(d + r)r·u where the retraction ends in a polar factor. float64
cases must also meet DESIGN §7's number whatever the amplification: ‖x_port − x_ref‖ ≤ 1e-12
after 100 steps (measured ≤ 4.1e-14, docs/compare.md). Negative controls: a port that differs
from the reference by one hyperparameter in the 4th digit fails the same checks on both families.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from proofs_checks import port_compare as cmp  # noqa: E402

DESIGN_F64 = 1e-12  # DESIGN §7: float64 agreement after 100 steps


@pytest.fixture(scope="module")
def cache() -> dict:
    return {}


def _case(record: cmp.Record, dtype: str, cache: dict, rule: cmp.Rule | None = None) -> dict:
    problem = cmp.PROBLEMS[record.geometry][record.problem]
    rule = cmp.RULES[record.rule] if rule is None else rule
    return cmp.run_case(problem, rule, dtype, steps=record.steps, _cache=cache)


def _ids(record: cmp.Record) -> str:
    return f"{record.geometry}-{record.problem}-{record.rule}"


@pytest.mark.parametrize("record", cmp.RECORDS, ids=_ids)
def test_record_agrees_with_the_reference(record: cmp.Record, cache: dict) -> None:
    for dtype in record.dtypes:
        case = _case(record, dtype, cache)
        assert case["passed"], case
        if dtype == "float64":
            assert case["initial_deviation"] == 0.0
            assert case["deviation_bound_kind"] == "a priori"
            assert case["max_deviation"] <= DESIGN_F64 * record.steps / 100, case
        elif dtype == "float32":
            assert case["deviation_bound_kind"] == "a priori"
        else:
            assert case["deviation_bound_kind"] == "envelope"
        if case["drift_bound"] is not None:
            assert case["final_drift"] <= case["drift_bound"]


def test_the_table_covers_every_geometry_rule_and_dtype() -> None:
    geometries = {r.geometry for r in cmp.RECORDS}
    assert geometries == set(cmp.GEOMETRY_ADAPTERS) and len(geometries) == 11
    assert {r.rule for r in cmp.RECORDS} == set(cmp.RULES)
    for name in geometries:
        rules = {r.rule for r in cmp.RECORDS if r.geometry == name}
        assert set(cmp.rules.PRESETS) <= rules, name
    assert {d for r in cmp.RECORDS for d in r.dtypes} == set(cmp.DTYPES)
    # every option variant of the ten is a problem of the table
    variants = {(r.geometry, r.problem) for r in cmp.RECORDS if "[" in r.problem}
    assert len(variants) == sum(len(v) for v in cmp.VARIANTS.values()) + len(
        cmp.problems.STIEFEL_VARIANTS
    )


def _off_by_one_digit(rule: cmp.Rule) -> cmp.Rule:
    """The port of riemannian_adam with β2 = 0.9991 instead of 0.999 (reference unchanged)."""
    return dataclasses.replace(
        rule, port=lambda groups: tp.RiemannianAdam(groups, lr=cmp.rules.LR, betas=(0.9, 0.9991))
    )


@pytest.mark.parametrize("geometry", ["stiefel", "fixed_rank_quotient", "block_stiefel_pair"])
def test_negative_control_a_wrong_port_fails(geometry: str, cache: dict) -> None:
    problem = "brockett" if geometry == "stiefel" else "matrix_fit"
    record = cmp.Record(geometry, problem, "riemannian_adam", ("float64",), steps=30)
    good = _case(record, "float64", cache)
    bad = _case(record, "float64", {}, _off_by_one_digit(cmp.RULES["riemannian_adam"]))
    assert good["passed"] and not bad["passed"]
    assert bad["max_deviation"] > 100 * bad["deviation_bound"]


@pytest.mark.parametrize("geometry", sorted(cmp.GEOMETRY_ADAPTERS))
def test_the_capped_rules_are_capped(geometry: str) -> None:
    """The trust radius of the capped rows acts on every geometry: the capped reference
    trajectory leaves the uncapped one (else those rows would only repeat riemannian_adam's)."""
    problem = next(iter(cmp.PROBLEMS[geometry].values()))
    inst, adapter = problem.build(0), problem.adapter
    runs = [
        cmp.reference_trajectory(inst, adapter, cmp.RULES[r], 5)[-1]
        for r in ("riemannian_adam", "riemannian_adam_capped")
    ]
    assert cmp.runner.distance(adapter, *runs) > 1e-4
