"""Every Python block of README.md and docs/*.md runs as written: the blocks of one file in
order, as one script in a fresh interpreter (a later block may use what an earlier one defined,
as a reader would; nothing imported by other tests can help it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)\n```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize(
    "path", [p for p in FILES if python_blocks(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_python_blocks_run(path: Path) -> None:
    if "import torch" in path.read_text(encoding="utf-8"):
        pytest.importorskip("torch")
    script = "\n\n".join(python_blocks(path))
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{path.relative_to(ROOT)}:\n{done.stderr[-3000:]}"


def test_the_docs_have_python_blocks() -> None:
    """The scan finds the blocks it is meant to run (a renamed fence would skip them)."""
    assert len(python_blocks(ROOT / "docs" / "torch_port.md")) >= 3
    assert python_blocks(ROOT / "README.md")
