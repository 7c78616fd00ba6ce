"""A record names the code it came from: ``source_hash`` over the installed sources, and the git
commit with a dirty flag only when the packages' own directory is a checkout's root. Three
layouts, each a copy of the packages run in a fresh interpreter: a plain install (no git), a copy
inside another repository, and a checkout of its own, clean and then edited."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reference.environment import PACKAGES, source_hash

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _copy(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _environment(root: Path) -> dict:
    """``environment()`` as the copy under ``root`` records it, in a fresh interpreter."""
    code = "import json, reference.environment as e; print(json.dumps(e.environment()))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root.parent,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def test_a_plain_install_has_a_source_hash_and_no_commit(tmp_path) -> None:
    site = _copy(tmp_path / "site-packages")
    env = _environment(site)
    assert env["git_commit"] is None and env["git_dirty"] is None
    assert env["source_hash"] == source_hash(site) == source_hash(ROOT)  # an exact copy


def test_a_copy_inside_another_repository_does_not_take_its_commit(tmp_path) -> None:
    outer = tmp_path / "outer"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / "README").write_text("another project\n")
    _git(outer, "add", "README")
    _git(outer, "commit", "-q", "-m", "other")
    vendored = _copy(outer / "vendor")
    env = _environment(vendored)
    assert env["git_commit"] is None and env["git_dirty"] is None


def test_a_checkout_records_its_commit_and_whether_it_was_edited(tmp_path) -> None:
    repo = _copy(tmp_path / "repo")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "snapshot")
    head = _git(repo, "rev-parse", "HEAD")
    clean = _environment(repo)
    assert clean["git_commit"] == head and clean["git_dirty"] is False
    # a comment in the implementation: the same commit, now dirty, another source hash
    optim = repo / "reference" / "optim.py"
    optim.write_text(optim.read_text(encoding="utf-8") + "# an edit\n", encoding="utf-8")
    edited = _environment(repo)
    assert edited["git_commit"] == head and edited["git_dirty"] is True
    assert edited["source_hash"] != clean["source_hash"]
    # an untracked source file counts too
    optim.write_text(optim.read_text(encoding="utf-8").removesuffix("# an edit\n"))
    assert _environment(repo)["git_dirty"] is False
    (repo / "torch_port" / "extra.py").write_text("x = 1\n")
    again = _environment(repo)
    assert again["git_dirty"] is True and again["source_hash"] != clean["source_hash"]
