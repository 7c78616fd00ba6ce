"""The shared machinery of the experiments: options, outputs, checkpoints, the CLI's refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from proofs_checks.cli import main  # noqa: E402
from reference.environment import COMMON_KEYS  # noqa: E402
from torch_port.experiments import EXPERIMENTS, load, runs  # noqa: E402
from torch_port.experiments.common import (  # noqa: E402
    Checkpoint,
    RunOptions,
    check_int,
    configure,
    environment,
    jsonable,
    markdown_table,
    resolve_device,
)
from torch_port.experiments.models import TokenEmbedding, Transformer  # noqa: E402

PRESETS = {"smoke": {"seeds": [0], "steps": 3}, "quick": {"seeds": [0, 1], "steps": 30}}


def test_configure_applies_seeds_and_overrides() -> None:
    config = configure(PRESETS, RunOptions(preset="smoke", seeds=(4, 5), overrides={"steps": 7}))
    assert config == {"seeds": [4, 5], "steps": 7}
    assert PRESETS["smoke"] == {"seeds": [0], "steps": 3}  # the preset itself is not changed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (RunOptions(preset="huge"), "unknown preset 'huge'"),
        (RunOptions(preset="smoke", overrides={"stepz": 1}), "unknown configuration keys"),
        (RunOptions(preset="smoke", seeds=()), "non-empty"),
        (RunOptions(preset="smoke", seeds=(-1,)), "≥ 0"),
    ],
)
def test_configure_refuses_bad_options(options: RunOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        configure(PRESETS, options)


def test_devices() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_environment_builds_on_the_common_recorder() -> None:
    """Every result's ``environment``: the keys of ``reference.environment.environment`` (torch
    among the versions) plus the device, torch's thread count and the CPU kind (CUDA facts on a
    GPU only)."""
    env = environment("cpu")
    assert set(COMMON_KEYS) <= set(env)
    assert set(env) - set(COMMON_KEYS) == {"device", "torch_threads", "cpu"}
    assert env["cpu"].endswith(f", torch {torch.backends.cpu.get_cpu_capability()}")
    assert env["device"] == "cpu" and env["torch_threads"] == torch.get_num_threads()
    assert env["versions"]["torch"] and env["versions"]["numpy"] and env["versions"]["scipy"]
    assert json.loads(json.dumps(env)) == env
    if torch.cuda.is_available():
        gpu = environment("cuda")
        assert gpu["cuda_device"] == torch.cuda.get_device_name(0) and "cuda" in gpu


@pytest.mark.parametrize(
    ("value", "minimum", "message"),
    [
        (0, 1, "k must be a positive integer, got 0"),
        (True, 1, "k must be a positive integer, got True"),
        (2.0, 1, "k must be a positive integer, got 2.0"),
        (-1, 0, "k must be an integer ≥ 0, got -1"),
        (2, 3, "k must be an integer ≥ 3, got 2"),
    ],
)
def test_check_int_names_the_value(value, minimum, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_int({"k": value}, "k", minimum)
    check_int({"k": minimum}, "k", minimum)


def test_jsonable_and_tables() -> None:
    doc = jsonable({"a": torch.tensor([1.0, 2.0]), "b": np.float64(0.5), "c": math.nan})
    assert json.loads(json.dumps(doc)) == {"a": [1.0, 2.0], "b": 0.5, "c": None}
    table = markdown_table(["arm", "acc"], [["A", 0.123456], ["B", math.inf]])
    assert table.splitlines() == ["| arm | acc |", "| --- | --- |", "| A | 0.1235 |", "| B | – |"]


def test_checkpoint_is_keyed_by_configuration(tmp_path) -> None:
    one = Checkpoint(tmp_path, {"steps": 3}, "seed=0")
    assert one.load() is None
    one.save({"step": 2, "w": torch.ones(2)})
    again = Checkpoint(tmp_path, {"steps": 3}, "seed=0").load()
    assert again["step"] == 2 and torch.equal(again["w"], torch.ones(2))
    assert Checkpoint(tmp_path, {"steps": 4}, "seed=0").load() is None  # other configuration
    assert Checkpoint(tmp_path, {"steps": 3}, "seed=1").load() is None  # other key
    one.remove()
    assert one.load() is None


def test_run_cells_reads_finished_cells_back_and_resumes_a_cell(tmp_path) -> None:
    """The one runner: a finished cell is read back (a sweep that grows computes only the new
    cells), an interrupted cell resumes from the progress it saved, ``resume=False`` computes
    afresh, and ``forget_cached`` removes every file."""
    calls: list[str] = []

    def work(cell, checkpoint, bar):
        calls.append(cell.key)
        saved = checkpoint.load()
        if cell.spec == "interrupted" and saved is None:
            checkpoint.save({"step": 1})
            raise KeyboardInterrupt
        return {"key": cell.key, "resumed_from": None if saved is None else saved["step"]}

    cells = [runs.Cell({"c": 1}, key, "ok", units=2) for key in ("a", "b")]
    assert [r["key"] for r in runs.run_cells(tmp_path, cells, work, resume=True)] == ["a", "b"]
    grown = [*cells, runs.Cell({"c": 1}, "c", "interrupted")]
    with pytest.raises(KeyboardInterrupt):
        runs.run_cells(tmp_path, grown, work, resume=True)
    records = runs.run_cells(tmp_path, grown, work, resume=True)
    assert records[-1] == {"key": "c", "resumed_from": 1}
    assert calls == ["a", "b", "c", "c"]  # a and b were read back, never recomputed
    runs.run_cells(tmp_path, cells[:1], work, resume=False)
    assert calls[-1] == "a"
    runs.forget_cached(tmp_path, grown)
    assert not list(tmp_path.glob("checkpoint-*"))


def test_paired_models_share_every_non_attention_weight() -> None:
    def build(geometry):
        return Transformer(
            TokenEmbedding(11, 16), 16, 2, 4, 32, 11, 5, seed=7, qk_geometry=geometry
        )

    a, b, c = (
        build("stiefel"),
        build(None),
        Transformer(TokenEmbedding(11, 16), 16, 2, 4, 32, 11, 5),
    )
    for (name, p), (_, q), (_, s) in zip(
        a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True
    ):
        if ".attn.w_q" in name or ".attn.w_k" in name:
            assert not torch.equal(p, q), name  # frames against plain projections
        elif ".attn." not in name:
            assert torch.equal(p, q), name
            if p.ndim >= 2:
                assert not torch.equal(p, s), name  # another seed draws other weights
    frames = a.blocks[0].attn.query_weights().detach().double()
    eye = torch.eye(4, dtype=torch.float64)
    assert torch.allclose(frames.mT @ frames, eye.expand(4, 4, 4), atol=1e-6)


def test_every_registered_experiment_follows_the_contract() -> None:
    for name in EXPERIMENTS:
        module = load(name)
        assert {"smoke", "quick", "paper"} <= set(module.PRESETS), name
        assert set(module.PRESETS) <= {"smoke", "quick", "long", "paper"}, name
        for preset in module.PRESETS.values():
            assert preset["seeds"], name
        assert callable(module.run) and callable(module.format_summary), name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["experiment", "nonsense", "--preset", "smoke"], "unknown experiment 'nonsense'"),
        (["experiment", "grokking", "--seeds", "a,b"], "--seeds must be comma-separated"),
        (["experiment", "grokking", "--device", "tpu"], "unknown device"),
    ],
)
def test_cli_refuses_bad_usage_with_status_2(argv, message, capsys) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
