"""``proofs_checks.port_compare`` and ``rattn compare``: selection, exit status, JSON, the
problems' gradients, a case beyond its bound; and a smoke run of ``rattn bench port``. The table
of cases itself (every geometry, rule and dtype) is run by ``tests/test_port_agreement.py``.

Bounds are those of ``proofs_checks/port_compare`` (package docstring): in float64 the deviation
bound is max(1, S)·N·90·u·s, 1e-14 per step for frames (1e-12 after 100 steps when the measured
amplification S is at most 1).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from proofs_checks import port_compare as cmp  # noqa: E402
from proofs_checks.cli import main  # noqa: E402


def test_bfloat16_uses_the_measured_envelope():
    res = cmp.compare(dtypes=("bfloat16",), steps=100, geometries=["stiefel"])
    assert res["passed"] and res["cases"]
    for c in res["cases"]:
        # the a priori bound N·90·u_w ≈ 35 exceeds the diameter 2·sqrt(3): it says nothing
        assert c["a_priori_deviation_bound"] >= c["diameter"]
        assert c["deviation_bound_kind"] == "envelope"
        assert c["deviation_bound"] == cmp.ENVELOPES[("bfloat16", c["rule"])]
        assert c["max_deviation"] <= c["deviation_bound"] < c["diameter"]


def test_a_case_beyond_its_bound_fails(monkeypatch):
    monkeypatch.setattr(cmp.runner, "LOCAL_ERROR_ULPS", 1e-4)  # bound ≈ 1e-18: below rounding
    res = cmp.compare(dtypes=("float64",), steps=5, rules=["rsgd"], problems=["brockett"])
    assert not res["passed"]
    assert not res["cases"][0]["deviation_passed"] and res["cases"][0]["drift_passed"]
    assert "FAILED: 1 of 1 cases" in cmp.format_table(res)


def test_cli_exit_status(monkeypatch, capsys):
    assert main(["compare", "--dtype", "float64", "--steps", "10", "--geometry", "stiefel"]) == 0
    out = capsys.readouterr().out
    assert "| stiefel | brockett | riemannian_adam | float64 |" in out and "PASSED" in out
    argv = ["compare", "--dtype", "float64", "--steps", "3", "--geometry", "stiefel_pair"]
    assert main(argv) == 0
    assert "| stiefel_pair | matrix_fit | riemannian_adam | float64 |" in capsys.readouterr().out
    monkeypatch.setattr(cmp.runner, "LOCAL_ERROR_ULPS", 1e-4)
    assert main(["compare", "--dtype", "float64", "--steps", "3", "--geometry", "stiefel"]) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtype", "float16"], "unknown dtype float16"),
        (["--dtype", "float64,int8"], "unknown dtype int8"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--steps", "0"], "--steps must be ≥ 1"),
        (["--steps", "x"], "invalid int value"),
        (["--geometry", "nope"], "unknown geometry"),
    ],
)
def test_cli_bad_usage_exits_2(argv, message, capsys):
    assert main(["compare", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cli_cuda_without_cuda_exits_2(capsys):
    assert main(["compare", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_cli_json_is_one_document(capsys):
    argv = ["compare", "--dtype", "float64,float32", "--steps", "5", "--json", "--full"]
    assert main([*argv, "--geometry", "stiefel", "--geometry", "fixed_rank_quotient"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and doc["device"] == "cpu" and doc["steps"] == 5
    assert {c["dtype"] for c in doc["cases"]} == {"float64", "float32"}
    rows = cmp.records(["stiefel", "fixed_rank_quotient"])
    assert {c["rule"] for c in doc["cases"]} == {r.rule for r in rows}
    assert len(doc["cases"]) == sum(len({"float64", "float32"} & set(r.dtypes)) for r in rows)
    assert {c["geometry"] for c in doc["cases"]} == {"stiefel", "fixed_rank_quotient"}
    keys = {"max_deviation", "deviation_bound", "final_drift", "drift_bound", "passed"}
    assert all(keys <= set(c) for c in doc["cases"])
    assert doc["bounds"] and doc["environment"]["versions"]["torch"] == torch.__version__


def test_the_default_table_is_each_geometry_and_rule_once(capsys):
    """Without --full: every rule of the geometry, each once (its first problem), at
    QUICK_STEPS steps; the full table has the same rules over more problems."""
    assert main(["compare", "--dtype", "float64", "--geometry", "stiefel", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and doc["full"] is False and doc["steps"] == cmp.QUICK_STEPS == 20
    rules = [c["rule"] for c in doc["cases"]]
    full = cmp.records(["stiefel"])
    assert sorted(rules) == sorted({r.rule for r in full}) and len(full) > len(rules)
    first = {}
    for r in full:
        first.setdefault(r.rule, r.problem)
    assert all(c["problem"] == first[c["rule"]] for c in doc["cases"])


def test_problem_library_is_keyed_by_geometry_and_name():
    assert set(cmp.PROBLEMS) == set(cmp.GEOMETRY_ADAPTERS)
    assert len(cmp.PROBLEMS) == 11
    assert next(p.name for p in cmp.select(["stiefel"])) == "brockett"
    with pytest.raises(ValueError, match="unknown geometry"):
        cmp.select(["fixed_rank"])
    with pytest.raises(ValueError, match="no geometry adapter"):
        cmp.register_problem(cmp.Problem("x", "fixed_rank", "", lambda seed: None))


def test_reference_and_port_gradients_agree():
    """The NumPy gradient of each problem is the autograd gradient of its torch loss."""
    for problem in cmp.select():
        inst = problem.build(3)
        ps = [torch.tensor(p, requires_grad=True) for p in inst.points]
        data = {k: torch.tensor(v) for k, v in inst.data.items()}
        inst.loss(ps, data).backward()
        for p, g in zip(ps, inst.egrad(inst.points, inst.data), strict=True):
            assert float((p.grad - torch.tensor(g)).abs().max()) <= 1e-13, problem.name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_all_dtypes():
    res = cmp.compare(device="cuda", steps=100)
    assert res["passed"], cmp.format_table(res)


def test_bench_port_small_runs():
    from proofs_checks.bench import (
        ADAMW_ROW,
        FLOOR_ROW,
        LINEARITY_ROW,
        PASSES_ROW,
        PORT_ROW,
        ROUTE_ROW,
        bench_port,
        format_port,
    )

    sizes = [
        {"key": "a", "label": "(a) one 32×4 frame", "params": 1, "batch": [], "d": 32, "r": 4},
        {"key": "b", "label": "(b) small", "params": 2, "batch": [2, 2], "d": 24, "r": 4},
    ]
    res = bench_port(repeats=1, progress=False, sizes=sizes, dtypes=("float32",))
    rows = {(x["size"], x["name"]): x for x in res["rows"]}
    port, adamw = rows[("b", PORT_ROW)], rows[("b", ADAMW_ROW)]
    # one d×r buffer and one scalar per frame against AdamW's two d×r buffers (float32), plus
    # one float32 "step" per parameter on both sides
    entries = 2 * 2 * 24 * 4
    assert port["state_bytes"] == 2 * (4 * entries + 4 * 4 + 4)
    assert adamw["state_bytes"] == 2 * (2 * 4 * entries + 4)
    assert res["targets"][-1]["state_met"]
    floor, passes = rows[("b", FLOOR_ROW)], rows[("b", PASSES_ROW)]
    assert res["targets"][-1]["port_over_floor"] == port["median_s"] / floor["median_s"]
    assert res["targets"][-1]["port_over_floor_with_passes"] == (
        port["median_s"] / passes["median_s"]
    )
    linearity = rows[("b", LINEARITY_ROW)]
    assert res["targets"][-1]["linearity_floor_over_floor"] == (
        linearity["median_s"] / floor["median_s"]
    )
    route = rows[("b", ROUTE_ROW)]
    assert res["targets"][-1]["route_floor_over_floor"] == route["median_s"] / floor["median_s"]
    assert res["targets"][-1]["port_over_route_floor"] == port["median_s"] / route["median_s"]
    text = format_port(res)
    assert "port / AdamW" in text and "Where one port step goes" in text
    assert "port / floor =" in text and "port / floor with passes =" in text
    assert "floor of the linearity route / floor =" in text
    assert "floor of the step's route / floor =" in text
    # operators are charged to torch_port source lines; everything else shares one row (which
    # row is first depends on the machine's timing, so the order is not asserted)
    sites = [x["site"] for x in res["profile"]["float32"]["sites"]]
    inside = [x for x in sites if x.startswith("torch_port/")]
    assert len(inside) >= len(sites) - 1 and set(sites) - set(inside) <= {"outside torch_port"}


@pytest.mark.parametrize("name", sorted(cmp.GEOMETRY_ADAPTERS))
def test_compare_runs_for_every_geometry_name(name, capsys):
    """`rattn compare --geometry NAME` for each of the eleven names: its cases run and pass."""
    assert len(cmp.GEOMETRY_ADAPTERS) == 11
    argv = ["compare", "--dtype", "float64", "--steps", "2", "--geometry", name, "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cases"] and {c["geometry"] for c in doc["cases"]} == {name}
