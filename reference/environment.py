"""The one recorder of the machine and library versions a result was produced with.

Certificates, benchmarks, port comparisons and experiments all describe the machine with the keys
of ``environment()`` and add their own facts to it (``environment("torch", device="cuda")``), so
that a certificate, a benchmark table and an experiment result can be read side by side. It sits
in ``reference/`` (standard library only) because every other part may import ``reference``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

#: The distributions whose versions every record carries (None when one is not installed).
LIBRARIES = ("numpy", "scipy", "mpmath", "sympy", "hypothesis", "rattn")

#: The keys every record has, whatever a caller adds.
COMMON_KEYS = (
    "python",
    "platform",
    "machine",
    "cpu_count",
    "versions",
    "source_hash",
    "git_commit",
    "git_dirty",
    "created",
)

#: The directory holding the project's packages (a checkout's root, or site-packages), and the
#: packages whose sources ``source_hash`` covers.
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reference", "proofs_checks", "torch_port")


def environment(*libraries: str, **extra: Any) -> dict[str, Any]:
    """Versions, platform and the code a result came from.

    Returns ``{"python", "platform", "machine", "cpu_count", "versions", "source_hash",
    "git_commit", "git_dirty", "created"}``: the Python version, ``platform.platform()``,
    ``platform.machine()``, ``os.cpu_count()``, ``{distribution: version or None}`` for
    LIBRARIES and then ``libraries`` (installed versions, from ``importlib.metadata``; None when
    not installed; nothing is imported), ``source_hash()`` of the code as it is installed, the
    git commit and whether the project's sources differ from it (``git_state``: both None
    unless the packages' own directory is the root of a git checkout), and the UTC time (ISO
    8601, seconds).

    ``extra`` adds the caller's own keys (e.g. ``device="cuda"``, ``torch_threads=4``) after the
    common ones. A key that would replace a common key is refused (ValueError), so every record
    keeps the same meaning for those keys; record a library's version through ``libraries``.
    """
    clash = sorted(set(extra) & set(COMMON_KEYS))
    if clash:
        raise ValueError(
            f"environment() keys {clash} are recorded by environment() itself; "
            "pass library names positionally to add their versions"
        )
    versions = {}
    for name in (*LIBRARIES, *libraries):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "versions": versions,
        "source_hash": source_hash(),
        **dict(zip(("git_commit", "git_dirty"), git_state(), strict=True)),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def source_hash(root: Path = ROOT) -> str:
    """SHA-256 over the ``.py`` files of the project's packages under ``root`` as they are on
    disk (each file's path relative to ``root`` and its bytes, in sorted order): the code a
    result came from, whether it was installed from a checkout, a wheel or an edited tree."""
    h = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout whose root is ``root``; (None, None) when ``root``
    is not the root of one (a plain install, or a copy inside some other repository, whose
    HEAD says nothing about this code). ``dirty``: whether a tracked file of the packages or
    ``pyproject.toml`` differs from the commit, or an untracked ``.py`` file sits in them."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != root.resolve():
        return None, None
    commit = _git(root, "rev-parse", "HEAD") or None
    status = _git(
        root, "status", "--porcelain", "--untracked-files=all", "--", *PACKAGES, "pyproject.toml"
    )
    if status is None:
        return commit, None
    changed = [
        line
        for line in status.splitlines()
        if not line.startswith("??") or line.endswith(".py")  # not caches or build files
    ]
    return commit, bool(changed)
