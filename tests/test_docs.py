"""Every Python block of README.md and docs/*.md runs as written: the blocks of one file in
order, as one script file in a fresh interpreter (a later block may use what an earlier one
defined, as a reader would; nothing imported by other tests can help it). A script file, not
``python -c``, so that a block may start processes by ``spawn`` as a real training script does
(the children import the file as ``__mp_main__``)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from proofs_checks.bounds import step_error

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)\n```", path.read_text(encoding="utf-8"), flags=re.S)


#: The two-process DDP/FSDP2 recipes: run with ``-m slow``. Inside the full default suite on a
#: loaded 2-core machine their spawned workers have hung past the 600 s limit (alone: 24 s); the
#: same arithmetic runs by default in tests/test_ddp.py and tests/test_fsdp.py.
SPAWNING = {ROOT / "docs" / "distributed.md"}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.slow) if p in SPAWNING else p
        for p in FILES
        if python_blocks(p)
    ],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_python_blocks_run(path: Path, tmp_path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for package in ("torch", "transformers", "geoopt"):
        if f"import {package}" in text:
            pytest.importorskip(package)
    script = tmp_path / f"{path.stem}_blocks.py"
    script.write_text("\n\n".join(python_blocks(path)), encoding="utf-8")
    # the repository root first on the path, as for ``python -c`` run there
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{path.relative_to(ROOT)}:\n{done.stderr[-3000:]}"


def test_the_docs_have_python_blocks() -> None:
    """The scan finds the blocks it is meant to run (a renamed fence would skip them)."""
    assert len(python_blocks(ROOT / "docs" / "torch_port.md")) >= 3
    assert python_blocks(ROOT / "README.md")


def rattn_commands(path: Path) -> list[str]:
    """The ``rattn`` invocations of a file's bash blocks (commands joined by && or ;, comments
    dropped)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)\n```", path.read_text(encoding="utf-8"), flags=re.S):
        for line in block.splitlines():
            for command in re.split(r"&&|;", line.split(" #")[0]):
                if command.strip().startswith("rattn "):
                    found.append(command.strip())
    return found


def test_every_rattn_command_in_the_docs_parses() -> None:
    """Each shell example names a command and options that ``rattn`` accepts (running them all
    would take the certificate's and the benchmarks' time; the Python blocks above run)."""
    from proofs_checks.cli.parser import _UsageError, build_parser

    commands = [c for p in FILES for c in rattn_commands(p)]
    scripts = sorted((ROOT / "docs").glob("*.sh"))  # the prepared scripts
    assert [s.name for s in scripts] == ["gpu_check.sh", "grokking_paper.sh"]
    text = "\n".join(s.read_text(encoding="utf-8") for s in scripts).replace("\\\n", " ")
    shell = [c.strip() for line in text.splitlines() for c in re.split(r"&&|;|>", line)]
    shell = [re.sub(r'^(\w+=\S+ )*(timeout "\$limit" )?', "", c) for c in shell]
    commands += [c for c in shell if c.startswith("rattn ")]
    assert len(commands) >= 15  # the scan finds them
    parser = build_parser()
    for command in commands:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except _UsageError as e:  # argparse's error (exit 2 through main)
            raise AssertionError(f"{command!r} does not parse: {e}") from None
    with pytest.raises(_UsageError):  # control: a misspelt option is caught
        parser.parse_args(["certify", "--quik"])


def test_the_gpu_compile_check_runs_on_the_cpu() -> None:
    """docs/gpu_compile_check.py (part of docs/gpu_check.sh) runs as written: on the CPU the
    compiled eager step equals the eager one bitwise (it runs eagerly), and the capturable step
    compiled with fullgraph=True is within 10 steps of float32 step rounding of its eager run
    (10·``step_error(64, 16, 2^-24)``: the same formulas, with reductions the compiler may
    reassociate)."""
    pytest.importorskip("torch")
    import json

    done = subprocess.run(
        [sys.executable, "docs/gpu_compile_check.py", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["device"] == "cpu"
    assert report["eager_step"]["compiled_vs_eager"]["bitwise"] is True
    compiled = report["capturable_step"]["compiled_vs_eager"]["max_abs_difference"]
    assert compiled <= 10 * step_error(64, 16, 2.0**-24)
