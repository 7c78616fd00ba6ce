"""The timing machinery the benchmarks share, and the record of the machine the timings depend on.

Timings are wall-clock (``time.perf_counter``) and so depend on the machine, its BLAS and its load:
every result records the environment next to the numbers (``machine_environment``), and the
candidates are interleaved round by round (``_interleaved_rounds``) so that machine noise hits all
of them alike. A row reports the median and the interquartile range of the rounds.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from tqdm import tqdm

from reference.environment import environment

#: Shortest wall time of one timed sample; a sample repeats the call until it lasts about this long,
#: so timer resolution and loop overhead stay negligible against the call itself.
SAMPLE_TARGET_S = 2e-3

_ENV_VARS = (
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def _cpu_model() -> str | None:
    """The CPU model named in /proc/cpuinfo (Linux), else ``platform.processor()`` or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _blas_info() -> Any:
    """The BLAS NumPy uses: threadpoolctl's per-library info if importable, else NumPy's build
    configuration (name, version, configuration string), else None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        pass
    else:
        keys = ("internal_api", "version", "num_threads", "threading_layer", "architecture")
        libs = [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]
        return [{k: lib.get(k) for k in keys} for lib in libs]
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except Exception:  # older NumPy without mode="dicts", or a changed layout
        return None
    return {k: blas.get(k) for k in ("name", "version", "openblas configuration") if k in blas}


def machine_environment(*libraries: str, **extra: Any) -> dict[str, Any]:
    """``reference.environment.environment(*libraries, **extra)`` (versions, platform, CPU
    count, git commit, time) plus what timings depend on: ``cpu_model``, ``blas`` (the BLAS NumPy
    uses) and ``env`` (the BLAS and OpenMP thread variables that are set)."""
    return environment(
        *libraries,
        cpu_model=_cpu_model(),
        blas=_blas_info(),
        env={k: os.environ[k] for k in _ENV_VARS if k in os.environ},
        **extra,
    )


def _calls_per_sample(fn: Callable[[], object]) -> int:
    """How many back-to-back calls of ``fn`` make one sample of at least SAMPLE_TARGET_S."""
    fn()  # warm-up: caches, lazy imports, BLAS thread start-up
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-9)
    return max(1, math.ceil(SAMPLE_TARGET_S / once))


def _time_sample(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of ``fn``, averaged over ``number`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _interleaved_rounds(
    fns: dict[str, Callable[[], object]], repeats: int, *, desc: str, progress: bool
) -> tuple[dict[str, int], dict[str, list[float]]]:
    """Warm every candidate up and fix its calls per sample (``_calls_per_sample``), then run
    ``repeats`` rounds, each taking one sample (``_time_sample``) of every candidate in an order
    rotated by one each round, with the garbage collector off. Returns (calls per sample,
    per-call seconds of each round) by candidate name."""
    names = list(fns)
    numbers = {name: _calls_per_sample(fns[name]) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for k in tqdm(
            range(repeats), desc=desc, unit="round", file=sys.stderr, disable=not progress
        ):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                samples[name].append(_time_sample(fns[name], numbers[name]))
    finally:
        if gc_was_enabled:
            gc.enable()
    return numbers, samples


def _iqr(values: list[float]) -> float:
    """Interquartile range (75th − 25th percentile)."""
    q25, q75 = np.percentile(values, [25.0, 75.0])
    return float(q75 - q25)


def _check_repeats(repeats: object) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int | np.integer) or repeats < 1:
        raise ValueError(f"repeats must be an integer ≥ 1, got {repeats!r}")


def _median_rows(
    samples: dict[str, list[float]], numbers: dict[str, int], extra: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    for name, values in samples.items():
        rows.append(
            {
                "name": name,
                **extra.get(name, {}),
                "median_s": float(np.median(values)),
                "iqr_s": _iqr(values),
                "calls_per_sample": numbers[name],
            }
        )
    return rows
