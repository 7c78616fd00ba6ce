"""The Entropic-Bound experiments: ``rattn experiment ladder`` and ``rattn experiment native-rank``.

Each smoke preset runs once through the CLI (module fixtures); the tests read its outputs, check
that the measured numbers say what the reconstruction predicts at that size, that a run resumed
from a checkpoint equals the uninterrupted one, that cells are deterministic, and that bad input
is refused with the value named.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from proofs_checks.cli import main  # noqa: E402
from reference import capacity  # noqa: E402
from torch_port.experiments import attention_students as st  # noqa: E402
from torch_port.experiments import (  # noqa: E402
    ladder,
    native_rank,
    native_rank_cells,
    native_rank_report,
    runs,
)
from torch_port.experiments.common import RunOptions  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
TOP_KEYS = {"experiment", "preset", "config", "runs", "summary", "environment"}


def smoke(name: str, out: Path) -> dict[str, Any]:
    assert main(["experiment", name, "--preset", "smoke", "--out", str(out)]) == 0
    return json.loads((out / name / "results.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ladder_run(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("ladder")
    return out / "ladder", smoke("ladder", out)


@pytest.fixture(scope="module")
def native_run(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("native")
    return out / "native-rank", smoke("native-rank", out)


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """The document without timings and machine facts."""
    summary = {k: v for k, v in document["summary"].items() if not k.endswith("_seconds")}
    return {"runs": document["runs"], "summary": summary, "config": document["config"]}


def assert_outputs(directory: Path, document: dict[str, Any], plots: list[str]) -> None:
    assert TOP_KEYS <= set(document)
    assert document["summary"]["plots"] == plots
    for name in plots:
        data = (directory / name).read_bytes()
        assert data[:8] == PNG and len(data) > 2000, name
    assert (directory / "results.md").read_text(encoding="utf-8").startswith("# ")
    assert not list(directory.glob("checkpoint-*"))  # removed when the run completes


# ---------------------------------------------------------------------------------------------
# ladder
# ---------------------------------------------------------------------------------------------
def test_ladder_smoke_outputs(ladder_run) -> None:
    directory, doc = ladder_run
    assert doc["experiment"] == "ladder" and doc["preset"] == "smoke"
    assert_outputs(directory, doc, ["spectra.png", "students.png"])
    summary = doc["summary"]
    assert {"r_star", "seeds", "readings", "students", "wall_seconds", "cpu_seconds"} <= set(
        summary
    )
    rows = {row["reading"]: row for row in summary["readings"]}
    assert list(rows) == [row for row, _, _ in ladder.READINGS]
    for row in rows.values():
        assert set(row["estimators"]) == set(st.ESTIMATORS)
    md = (directory / "results.md").read_text(encoding="utf-8")
    assert "R1 logit inversion" in md and "R2 softmax student" in md


def test_ladder_breaks_at_input_conditioning(ladder_run) -> None:
    """Static rungs: every energy/gap estimator reads r*, and a static mixer explains the output
    (relative excess ≈ σ²-level); input-conditioned rungs: the rank is not recovered and the
    static mixer leaves most of the output unexplained (EB-5)."""
    _, doc = ladder_run
    r = doc["config"]["r_star"]
    rows = {row["reading"]: row for row in doc["summary"]["readings"]}
    for name in ("R0", "R1 logit inversion"):
        est = rows[name]["estimators"]
        assert est["r_0.9"]["mean"] == est["r_0.99"]["mean"] == est["gap"]["mean"] == r
        assert rows[name]["verdict"] == "recovers r*"
        assert rows[name]["static_excess"]["max"] < 1e-3
    assert rows["R1 raw"]["estimators"]["r_0.99"]["min"] > r  # softmax makes A full rank
    for name in ("R3", "R4 raw", "R4 logit inversion"):
        assert rows[name]["verdict"] == "fails"
        assert rows[name]["static_excess"]["min"] > 0.3
    assert rows["R4 raw"]["estimators"]["r_0.9"]["mean"] == 1  # Â ≈ 11ᵀ/n + aI
    for kind in ("linear", "softmax"):
        student = doc["summary"]["students"][kind]
        assert student["plateau_rank"] == [r] and student["verdict"] == "recovers r*"
        excess = [e["mean"] for e in student["excess"]]
        assert excess[0] > 0.05 and excess[r - 1] < 1e-2  # deficient below r*, flat from r*


def test_ladder_resume_equals_uninterrupted(ladder_run, tmp_path, monkeypatch) -> None:
    _, reference_doc = ladder_run
    calls = interrupt_after(ladder, monkeypatch, 2)
    options = RunOptions(preset="smoke", out=tmp_path, progress=False)
    with pytest.raises(RuntimeError, match="interrupted"):
        ladder.run(options)
    # one saved record per finished cell (runs.run_cells), kept until the outputs are written
    assert len(list((tmp_path / "ladder").glob("checkpoint-*.pt"))) == 2
    monkeypatch.undo()
    again = interrupt_after(ladder, monkeypatch, None)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        resumed = ladder.run(options)
        assert torch.get_num_threads() == 2  # restored after the run
    finally:
        torch.set_num_threads(before)
    # the environment records the thread count the cells ran with, not the caller's
    assert resumed["environment"]["torch_threads"] == resumed["config"]["threads"] == 1
    assert comparable(resumed) == comparable(reference_doc)
    total = len(ladder.cells_of(reference_doc["config"]))
    assert len(calls) == 2 and len(again) == total - 2  # finished cells are not recomputed
    assert not list((tmp_path / "ladder").glob("checkpoint-*.pt"))


def interrupt_after(module: Any, monkeypatch: pytest.MonkeyPatch, count: int | None) -> list[Any]:
    """Make ``module.run`` raise after ``count`` cells (never for None); return the list of the
    cells it computes (the ``work`` of its ``EXPERIMENT`` replaced)."""
    real, calls = module.EXPERIMENT.work, []

    def failing(config):
        inner = real(config)

        def one(cell):
            if len(calls) == count:
                raise RuntimeError("interrupted")
            calls.append(cell)
            return inner(cell)

        return one

    monkeypatch.setattr(module, "EXPERIMENT", dataclasses.replace(module.EXPERIMENT, work=failing))
    return calls


def test_ladder_cells_are_deterministic() -> None:
    config = dict(ladder.PRESETS["smoke"])
    with runs.torch_threads(1):
        one = ladder.student_cell(config, "softmax", 2, seed=3)
        two = ladder.student_cell(config, "softmax", 2, seed=3)
        other = ladder.student_cell(config, "softmax", 2, seed=4)
    assert one == two and one["excess"] != other["excess"]
    a, b = ladder.static_cell(config, 3), ladder.static_cell(config, 3)
    assert np.array_equal(a["readings"]["R3"]["spectrum"], b["readings"]["R3"]["spectrum"])


def test_positional_softmax_is_the_row_softmax_of_the_scaled_logits() -> None:
    a = capacity.planted_mixer(6, 2, np.random.default_rng(3))
    logits = 2.0 * math.sqrt(6) * a
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    assert np.allclose(ladder.positional_softmax(a, 2.0), z / z.sum(axis=1, keepdims=True))


def test_logit_inversion_recovers_centred_logits() -> None:
    """log rowsoftmax(L) with row means removed is L·J (J = I − 11ᵀ/n), of rank ≤ rank L."""
    rng = np.random.default_rng(0)
    a = capacity.planted_mixer(7, 2, rng)
    logits = 3.0 * math.sqrt(7) * a
    centred, clipped = ladder.logit_inversion(ladder.positional_softmax(a, 3.0))
    j = np.eye(7) - np.ones((7, 7)) / 7
    assert clipped == 0
    assert np.allclose(centred, logits @ j, atol=1e-12)
    assert capacity.numerical_rank(capacity.singular_values(centred), 1e-9) == 2
    _, clipped = ladder.logit_inversion(np.array([[0.5, -0.1], [0.2, 0.8]]))
    assert clipped == 1


# ---------------------------------------------------------------------------------------------
# native-rank
# ---------------------------------------------------------------------------------------------
def test_native_rank_smoke_outputs(native_run) -> None:
    directory, doc = native_run
    assert doc["experiment"] == "native-rank" and doc["preset"] == "smoke"
    assert_outputs(directory, doc, ["risk_vs_rank.png", "recovery.png", "frontier.png"])
    summary = doc["summary"]
    assert {"r_star", "deficiency", "recovery", "frontier", "wall_seconds"} <= set(summary)
    cfg = doc["config"]
    expected = len(cfg["frontier_n_linear"]) + len(cfg["frontier_n_softmax"]) * len(
        cfg["frontier_betas"]
    )
    assert len(summary["frontier"]) == 2 * expected  # both kernel shapes
    md = (directory / "results.md").read_text(encoding="utf-8")
    assert "(r*−r)₊/r*" in md and "Data-only frontier" in md


def test_native_rank_deficiency_recovery_frontier(native_run) -> None:
    _, doc = native_run
    cfg, s = doc["config"], doc["summary"]
    r, d = cfg["r_star"], cfg["d"]
    for kind in ("linear", "softmax"):
        dfc = s["deficiency"][kind]
        assert dfc["plateau_rank"] == [r]
        excess = dict(zip(dfc["ranks"], (e["mean"] for e in dfc["excess"]), strict=True))
        assert excess[r - 1] > 0.1 and max(excess[k] for k in dfc["ranks"] if k >= r) < 1e-2
        rec = s["recovery"][kind]["estimators"]
        for name in ("r_0.9", "r_0.99", "gap"):
            assert rec[name]["mean"] == r, (kind, name)
        assert abs(rec["erank_E"]["mean"] - r) < 0.05
    lin = s["deficiency"]["linear"]
    i = lin["ranks"].index(r - 1)
    # Eckart–Young: a flat rank-r* kernel loses (r* − r)/r* of the output at rank r
    assert abs(lin["excess"][i]["mean"] - lin["eckart_young"][i]) < 0.1
    # the full-rank recovery student (trained longer) is kept out of the deficiency curve
    assert d not in lin["ranks"] and lin["ranks"] == sorted(cfg["ranks"])
    for kind in ("linear", "softmax"):
        assert s["recovery"][kind]["excess"]["max"] < 1e-2
        assert s["recovery"][kind]["steps"] == cfg["recovery_steps"]
    recovery = [c for c in doc["runs"] if c["type"] == "recovery"]
    assert {c["rank"] for c in recovery} == {d} and len(recovery) == 2
    assert all(c["curve"][-1][0] == cfg["recovery_steps"] for c in recovery)
    assert all(c["curve"][-1][0] == cfg["steps"] for c in doc["runs"] if c["type"] == "student")
    rows = [x for x in s["frontier"] if x["kind"] == "linear" and x["shape"] == "UV^T"]
    rows.sort(key=lambda x: x["n"])
    pops = [x["population_ratio"]["mean"] for x in rows]
    assert pops == sorted(pops, reverse=True) and pops[-1] < pops[0] / 2  # tail ~ 1/n (EB-7)
    assert all(x["estimators"]["gap"]["mean"] == r for x in rows)


def test_native_rank_resume_equals_uninterrupted(native_run, tmp_path, monkeypatch) -> None:
    _, reference_doc = native_run
    calls = interrupt_after(native_rank, monkeypatch, 3)
    options = RunOptions(preset="smoke", out=tmp_path, progress=False)
    with pytest.raises(RuntimeError, match="interrupted"):
        native_rank.run(options)
    monkeypatch.undo()
    again = interrupt_after(native_rank, monkeypatch, None)
    assert comparable(native_rank.run(options)) == comparable(reference_doc)
    total = len(native_rank_cells.cells_of(reference_doc["config"]))
    assert len(calls) == 3 and len(again) == total - 3


def test_native_rank_teacher_clean_output() -> None:
    """``clean`` is the teacher's noiseless output: y − clean is the noise (σ·N(0, 1))."""
    config = dict(native_rank.PRESETS["smoke"])
    for kind in ("linear", "softmax"):
        data = native_rank_cells.teacher(config, kind, 0)
        if kind == "linear":
            mix = capacity.linear_attention_mixing(data["x"], data["kernel"])
        else:
            mix = capacity.softmax_attention_mixing(data["x"], data["kernel"], config["beta"])
        assert np.array_equal(data["clean"], mix @ data["x"] @ data["value"])
        noise = (data["y"] - data["clean"]) / config["noise"]
        assert abs(noise.std() - 1.0) < 0.05


def test_native_rank_frontier_floor_is_the_rank_rule() -> None:
    config = dict(native_rank.PRESETS["smoke"])
    cell = native_rank_cells.frontier_cell(config, "linear", 8, None, "UV^T", 0)
    s = np.asarray(cell["spectrum"])
    assert cell["floor"] == capacity.attention_gap_floor(s, cell["noise_edge"], 8)
    assert cell["floor"] == max(cell["noise_edge"], s[0] / 8)


def test_native_rank_cells_are_deterministic() -> None:
    config = dict(native_rank.PRESETS["smoke"])
    with runs.torch_threads(1):
        one = native_rank_cells.student_cell(config, "linear", 1, seed=2)
        two = native_rank_cells.student_cell(config, "linear", 1, seed=2)
        other = native_rank_cells.student_cell(config, "linear", 1, seed=5)
    assert json.dumps(one, default=list) == json.dumps(two, default=list)
    assert one["excess"] != other["excess"]
    f1 = native_rank_cells.frontier_cell(config, "softmax", 8, 0.5, "UU^T", 1)
    f2 = native_rank_cells.frontier_cell(config, "softmax", 8, 0.5, "UU^T", 1)
    assert np.array_equal(f1["spectrum"], f2["spectrum"])


# ---------------------------------------------------------------------------------------------
# Students and helpers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["linear", "softmax"])
def test_qk_student_matches_the_reference_mixing(kind: str) -> None:
    """The student's output equals A(X)·X·W_V computed by ``reference.capacity``."""
    model = st.QKStudent(kind, 5, 2, 3, 1.5, 0.7, torch.Generator().manual_seed(0))
    x = np.random.default_rng(1).standard_normal((4, 6, 5))
    k = model.kernel().detach().numpy()
    w_v = model.w_v.detach().numpy()
    if kind == "linear":
        mix = capacity.linear_attention_mixing(x, k)
    else:
        mix = capacity.softmax_attention_mixing(x, k, 1.5)
    with torch.no_grad():
        got = model(st.as_tensor(x)).numpy()
    assert np.allclose(got, mix @ x @ w_v, rtol=1e-12, atol=1e-12)
    assert np.linalg.matrix_rank(k) == 2


def test_helpers() -> None:
    assert st.knee_rank([1, 2, 3, 4], [0.5, 0.2, 1e-4, 1e-4], 0.01) == 3
    assert st.knee_rank([3, 1, 2], [1e-4, 0.5, 1e-3], 0.01) == 2  # order of the input is free
    assert st.knee_rank([1, 2], [0.5, 0.2], 0.01) is None
    assert native_rank_report.eckart_young(3, 1) == pytest.approx(2 / 3)
    assert native_rank_report.eckart_young(3, 5) == 0
    est = st.estimators([1.0, 1.0, 1.0, 1e-3])
    assert est["r_0.99"] == 3 and est["num_rank(1e-3)"] == 3 and est["gap"] == 3
    assert math.isclose(st.spread([1.0, 3.0])["mean"], 2.0)
    assert st.cell_text({"mean": 3.0, "min": 3.0, "max": 3.0}, integer=True) == "3"
    assert st.cell_text({"mean": 3.5, "min": 3.0, "max": 4.0}, integer=True) == "3.50 (3–4)"
    before = torch.get_num_threads()
    with runs.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be ≥ 1"), runs.torch_threads(0):
        pass
    cells = [
        {"seed": 0, "rank": 1, "excess": 0.5},
        {"seed": 0, "rank": 2, "excess": 1e-3},
        {"seed": 1, "rank": 1, "excess": 0.5},
        {"seed": 1, "rank": 2, "excess": 0.5},
    ]
    assert st.plateau_ranks(cells, [0, 1], 0.01) == [2, None]
    assert st.student_generator(2, 3, 1).initial_seed() == 1_000_003 * 2 + 1_009 * 3 + 1
    for make in (
        lambda: st.StaticStudent("cubic", 4, 2, 0.1, torch.Generator()),
        lambda: st.QKStudent("cubic", 4, 2, 4, 1.0, 0.1, torch.Generator()),
    ):
        with pytest.raises(ValueError, match="kind must be 'linear' or 'softmax', got 'cubic'"):
            make()


def test_training_curve_ends_with_the_final_loss() -> None:
    """The curve holds the loss after t updates for t = 0, log_every, …, steps; its last entry
    is the loss of the trained model (after the final update)."""
    gen = torch.Generator().manual_seed(0)
    model = st.StaticStudent("linear", 4, 2, 0.1, gen)
    x = torch.randn(8, 4, 3, dtype=torch.float64, generator=gen)
    y = torch.randn(4, 4, dtype=torch.float64, generator=gen) @ x
    with torch.no_grad():
        initial = float(torch.mean(torch.square(model(x) - y)))
    seen: list[int] = []
    curve = st.train(model, x, y, steps=25, lr=1e-2, log_every=10, on_log=seen.append)
    assert [t for t, _ in curve] == [0, 10, 20, 25] and seen == [0, 10, 20, 25]
    with torch.no_grad():
        final = float(torch.mean(torch.square(model(x) - y)))
    assert curve[0][1] == initial and curve[-1][1] == final and final < initial


def test_training_diverges_loudly() -> None:
    model = st.StaticStudent("linear", 4, 2, 0.1, torch.Generator().manual_seed(0))
    x = torch.randn(3, 4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="diverged at step"):
        st.train(model, x, x * 1e200, steps=5, lr=1e3)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("module", "overrides", "message"),
    [
        (ladder, {"r_star": 99}, "r_star must be in 1…min"),
        (ladder, {"student_ranks": [0, 2]}, r"student ranks must be in 1…n = 8, got \[0, 2\]"),
        (ladder, {"test_sequences": 300}, "sequences − test_sequences"),
        (ladder, {"dtype": "float16"}, "dtype must be one of"),
        (ladder, {"lr": -1.0}, "lr must be finite and > 0, got -1.0"),
        (native_rank, {"r_star": 8}, "r_star must be in 1…d − 1 = 7, got 8"),
        (native_rank, {"ranks": [9]}, r"student ranks must be in 1…d = 8, got \[9\]"),
        (native_rank, {"frontier_betas": [0.0]}, "frontier_betas"),
        (native_rank, {"min_sequences": 4}, "min_sequences must exceed d = 8"),
        (native_rank, {"threads": 0}, "threads must be ≥ 1, got 0"),
        (ladder, {"threads": 1.5}, "threads must be ≥ 1, got 1.5"),
        (native_rank, {"init_std": 0.0}, "init_std must be finite and > 0, got 0.0"),
    ],
)
def test_bad_configurations_are_refused(module, overrides, message, tmp_path) -> None:
    options = RunOptions(preset="smoke", out=tmp_path, progress=False, overrides=overrides)
    with pytest.raises(ValueError, match=message):
        module.run(options)
    assert not list(tmp_path.rglob("results.json"))


@pytest.mark.parametrize("module", [ladder, native_rank])
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "mps"])
def test_cpu_only(module, device: str, tmp_path) -> None:
    """Both experiments run on CPU only and refuse another device before any work."""
    options = RunOptions(preset="smoke", out=tmp_path, progress=False, device=device)
    with pytest.raises(ValueError, match=f"{module.NAME} runs on CPU only: .*'{device}'"):
        module.run(options)
    assert not list(tmp_path.rglob("*"))
    assert "CPU only" in module.__doc__


@pytest.mark.parametrize("name", ["ladder", "native-rank"])
def test_cli_refuses_bad_seeds_and_presets(name: str, tmp_path, capsys) -> None:
    assert (
        main(["experiment", name, "--preset", "smoke", "--seeds", "-1", "--out", str(tmp_path)])
        == 2
    )
    assert "seeds must be" in capsys.readouterr().err
    assert (
        main(["experiment", name, "--preset", "smoke", "--seeds", "a", "--out", str(tmp_path)]) == 2
    )
    assert main(["experiment", name, "--preset", "huge", "--out", str(tmp_path)]) == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err
    assert not list(tmp_path.rglob("results.json"))
