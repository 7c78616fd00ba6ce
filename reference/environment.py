"""The one recorder of the machine and library versions a result was produced with.

Certificates, benchmarks, port comparisons and experiments all describe the machine with the keys
of ``environment()`` and add their own facts to it (``environment("torch", device="cuda")``), so
that a certificate, a benchmark table and an experiment result can be read side by side. It sits
in ``reference/`` (standard library only) because every other part may import ``reference``.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

#: The distributions whose versions every record carries (None when one is not installed).
LIBRARIES = ("numpy", "scipy", "mpmath", "sympy", "hypothesis", "rattn")

#: The keys every record has, whatever a caller adds.
COMMON_KEYS = ("python", "platform", "machine", "cpu_count", "versions", "git_commit", "created")


def environment(*libraries: str, **extra: Any) -> dict[str, Any]:
    """Versions, platform and (when run from a git checkout) the commit the code came from.

    Returns ``{"python", "platform", "machine", "cpu_count", "versions", "git_commit",
    "created"}``: the Python version, ``platform.platform()``, ``platform.machine()``,
    ``os.cpu_count()``, ``{distribution: version or None}`` for LIBRARIES and then ``libraries``
    (installed versions, from ``importlib.metadata``; None when not installed; nothing is
    imported), the git commit of this checkout or None, and the UTC time (ISO 8601, seconds).

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
        "git_commit": _git_commit(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
