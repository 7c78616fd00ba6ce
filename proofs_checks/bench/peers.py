"""The peer libraries the benchmarks compare with (pymanopt, geoopt), imported only when asked.

A missing or broken peer never fails a benchmark: its rows are skipped and a note says why.
"""

from __future__ import annotations

import warnings
from typing import Any

PYMANOPT_MISSING = "pymanopt not installed: peer rows skipped"
GEOOPT_MISSING = "geoopt not installed: peer rows skipped"


def _import_pymanopt(notes: list[str]) -> Any:
    """pymanopt (with its manifolds) when importable; otherwise None and a note, never a failure."""
    try:
        import pymanopt
        import pymanopt.manifolds
    except ImportError:
        notes.append(PYMANOPT_MISSING)
    except Exception as exc:  # a broken installation must not break the benchmark
        notes.append(f"pymanopt failed to import ({type(exc).__name__}: {exc}): peer rows skipped")
    else:
        return pymanopt
    return None


def _import_geoopt(notes: list[str]) -> Any:
    """geoopt when importable; otherwise None and a note, never a failure."""
    try:
        with warnings.catch_warnings():  # geoopt 0.5 uses torch.jit.script, deprecated in torch
            warnings.simplefilter("ignore", DeprecationWarning)
            import geoopt
    except ImportError:
        notes.append(GEOOPT_MISSING)
    except Exception as exc:  # a broken installation must not break the benchmark
        notes.append(f"geoopt failed to import ({type(exc).__name__}: {exc}): peer rows skipped")
    else:
        return geoopt
    return None
