"""The stored experiment tables reproduce: each result under docs/results/ has its command in
docs/results.md's "Reproducing the stored tables", that command builds the configuration stored
with the table, and (``-m slow``) rerunning it writes the same results.md, character for
character but for its wall-clock line, on the kind of CPU that made it (``common.cpu_kind``:
float32 kernels round differently on another, so there, or where the result does not record
its CPU, the comparison is not run and says why)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

from proofs_checks.cli.parser import build_parser, parse_overrides, parse_seeds
from torch_port import experiments
from torch_port.experiments.common import RunOptions, configure, cpu_kind

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
SECTION = "## Reproducing the stored tables"


def documented_commands() -> list[str]:
    """The ``rattn experiment`` lines of the section's bash block."""
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    block = re.search(r"```bash\n(.*?)\n```", section, flags=re.S)
    assert block is not None, f"{SECTION} has no bash block"
    return [line for line in block.group(1).splitlines() if line.startswith("rattn experiment")]


def options_of(command: str, out: Path | None = None) -> tuple[str, RunOptions, Path]:
    """(experiment name, its RunOptions, the stored directory it writes) of one command, read
    by the command line's own parser."""
    args = build_parser().parse_args(shlex.split(command)[1:])
    options = RunOptions(
        preset=args.preset,
        seeds=parse_seeds(args.seeds),
        overrides=parse_overrides(args.set),
        out=Path(args.out) if out is None else out,
        progress=False,
    )
    return args.name, options, ROOT / args.out / args.name


def stored_results() -> list[Path]:
    """The directories of every stored result but the paper preset's (a script's, 5.6 CPU-h)."""
    found = []
    for path in sorted(RESULTS.rglob("results.json")):
        if json.loads(path.read_text(encoding="utf-8"))["preset"] != "paper":
            found.append(path.parent)
    return found


COMMANDS = documented_commands()


def test_every_stored_result_has_exactly_one_command() -> None:
    written = [options_of(c)[2] for c in COMMANDS]
    assert len(written) == len(set(written)), "two commands write the same directory"
    stored = stored_results()
    assert len(stored) >= 17  # the scan finds them
    assert sorted(written) == stored


@pytest.mark.parametrize(
    "command", COMMANDS, ids=lambda c: str(options_of(c)[2].relative_to(RESULTS))
)
def test_the_command_builds_the_stored_configuration(command: str) -> None:
    name, options, stored = options_of(command)
    document = json.loads((stored / "results.json").read_text(encoding="utf-8"))
    assert document["experiment"] == name and document["preset"] == options.preset
    assert configure(experiments.load(name).PRESETS, options) == document["config"]
    assert document["environment"]["torch_threads"] == 1


def test_a_changed_preset_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: one preset value changed (the step budget of grokking's quick preset) no longer
    builds the stored configuration."""
    name, options, stored = options_of(COMMANDS[0])
    module = experiments.load(name)
    monkeypatch.setitem(module.PRESETS, "quick", {**module.PRESETS["quick"], "steps": 2801})
    stored_config = json.loads((stored / "results.json").read_text(encoding="utf-8"))["config"]
    assert configure(module.PRESETS, options) != stored_config


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", COMMANDS, ids=lambda c: str(options_of(c)[2].relative_to(RESULTS))
)
def test_rerunning_the_command_writes_the_stored_table(command: str, tmp_path: Path) -> None:
    name, options, stored = options_of(command, out=tmp_path)
    made_on = json.loads((stored / "results.json").read_text(encoding="utf-8"))["environment"]
    if "cpu" not in made_on:
        pytest.skip("not run: the kind of CPU that made this result is not recorded with it")
    if made_on["cpu"] != cpu_kind():
        pytest.skip(f"not run: stored from a {made_on['cpu']} CPU, this one is a {cpu_kind()}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as stored: reductions split over threads round differently
    try:
        experiments.load(name).run(options)
    finally:
        torch.set_num_threads(threads)
    fresh = (tmp_path / name / "results.md").read_text(encoding="utf-8")
    assert timeless(fresh) == timeless((stored / "results.md").read_text(encoding="utf-8"))


def timeless(table: str) -> str:
    """A results.md with its wall-clock seconds blanked ("Compute: 421 s of training steps over
    126 runs …", which no two runs share); every other character is kept."""
    return re.sub(r"^Compute: \d+ s of", "Compute: … s of", table, flags=re.M)


def test_only_the_wall_clock_seconds_are_left_out_of_the_comparison() -> None:
    table = (RESULTS / "lm" / "results.md").read_text(encoding="utf-8")
    assert "Compute: 2758 s of training steps over 228 runs" in table
    assert "Compute: … s of training steps over 228 runs" in timeless(table)
    assert timeless(table.replace("2758 s", "99 s")) == timeless(table)
    assert timeless(table.replace("228 runs", "227 runs")) != timeless(table)
    assert timeless(table.replace("0.", "1.", 1)) != timeless(table)
