"""The peer libraries the benchmarks compare with (pymanopt, geoopt), imported only when asked.

A missing or broken peer never fails a benchmark: its rows are skipped and a note says why.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

PYMANOPT_MISSING = "pymanopt not installed: peer rows skipped"
GEOOPT_MISSING = "geoopt not installed: peer rows skipped"


def _import_peer(name: str, missing: str, notes: list[str], submodules: tuple[str, ...] = ()):
    """The peer package ``name`` (and its ``submodules``) when importable; otherwise None and a
    note, never a failure."""
    try:
        with warnings.catch_warnings():  # geoopt 0.5 uses torch.jit.script, deprecated in torch
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(name)
            for sub in submodules:
                importlib.import_module(f"{name}.{sub}")
    except ImportError:
        notes.append(missing)
    except Exception as exc:  # a broken installation must not break the benchmark
        notes.append(f"{name} failed to import ({type(exc).__name__}: {exc}): peer rows skipped")
    else:
        return module
    return None


def _import_pymanopt(notes: list[str]) -> Any:
    """pymanopt (with its manifolds) when importable; otherwise None and a note."""
    return _import_peer("pymanopt", PYMANOPT_MISSING, notes, ("manifolds",))


def _import_geoopt(notes: list[str]) -> Any:
    """geoopt when importable; otherwise None and a note."""
    return _import_peer("geoopt", GEOOPT_MISSING, notes)
