"""What every experiment shares: run options, devices and seeds, outputs and checkpoints.

An experiment module (``torch_port.experiments.<name>``) defines

- ``PRESETS``: ``{"smoke": {...}, "quick": {...}, "paper": {...}}``, each a plain dict of its
  configuration (``seeds`` included); smoke runs in seconds (the test suite runs it), quick in
  minutes on a 2-core CPU, paper at the scale of the paper it reproduces (and, where the paper's
  setting is too slow for a CPU, ``long``: that setting for as long as fits half an hour);
- ``run(options: RunOptions) -> dict``: runs the preset's configuration, writes its outputs
  under ``options.out / <name>`` and returns the results document;
- ``format_summary(document: dict) -> str``: the few lines ``rattn experiment`` prints.

Outputs of a run in ``<out>/<name>/``: ``results.json`` (see ``results_document``),
``results.md`` (the tables people read), PNG plots, and ``checkpoint-*.pt`` files while a long
run is in progress (removed when it completes).
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import fcntl
import hashlib
import io
import json
import math
import os
import platform
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from reference.environment import environment as recorded_environment


@dataclass(frozen=True)
class RunOptions:
    """How to run one experiment.

    ``seeds`` None means the preset's own seeds; ``overrides`` replaces entries of the preset's
    configuration (unknown keys are refused by ``configure``). ``data_dir`` and ``corpus`` are
    the local data paths of the experiments that take them (others ignore them)."""

    preset: str = "quick"
    device: str = "cpu"
    seeds: tuple[int, ...] | None = None
    out: Path = Path("results")
    data_dir: Path | None = None
    corpus: Path | None = None
    progress: bool = True
    resume: bool = True
    overrides: Mapping[str, Any] = field(default_factory=dict)


def preset_variant(base: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    """A preset written as ``base`` with ``changes`` applied: a new dict in ``base``'s key order
    (new keys last), deep-copied so that no list is shared between presets. A change equal to
    ``base``'s value is refused, so that a variant lists exactly the settings that differ."""
    same = sorted(k for k, v in changes.items() if k in base and base[k] == v)
    if same:
        raise ValueError(f"changes {same} repeat the base preset's values")
    return copy.deepcopy({**base, **changes})


def configure(presets: Mapping[str, Mapping[str, Any]], options: RunOptions) -> dict[str, Any]:
    """The preset's configuration with ``options.seeds`` and ``options.overrides`` applied."""
    if options.preset not in presets:
        raise ValueError(f"unknown preset {options.preset!r}; choose one of {tuple(presets)}")
    config = dict(presets[options.preset])
    unknown = sorted(set(options.overrides) - set(config))
    if unknown:
        raise ValueError(f"unknown configuration keys {unknown}; known: {sorted(config)}")
    config.update(options.overrides)
    if options.seeds is not None:
        if not options.seeds or any(s < 0 for s in options.seeds):
            raise ValueError(f"seeds must be a non-empty list of integers ≥ 0, got {options.seeds}")
        config["seeds"] = list(options.seeds)
    return config


def resolve_device(name: str) -> torch.device:
    """``torch.device(name)`` for "cpu" or "cuda[:i]"; CUDA without a GPU is a clear error."""
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"unknown device {name!r}; use cpu or cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for but CUDA is not available on this machine")
    return torch.device(name)


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator seeded with ``seed`` (on ``device``), for initialisation and data order,
    so that two runs with the same seed draw the same numbers whatever else ran before."""
    return torch.Generator(device=device).manual_seed(int(seed))


def environment(device: torch.device | str = "cpu") -> dict[str, Any]:
    """The machine and versions recorded with every result: ``reference.environment.environment``
    with torch's version among ``versions`` (its common keys: python, platform, machine,
    cpu_count, versions, git_commit, created), plus ``device``, ``torch_threads`` (torch's
    intra-op thread count at the time), ``cpu`` (``cpu_kind()``) and, on a CUDA device,
    ``cuda_device`` (its name) and ``cuda`` (the CUDA version torch was built with)."""
    extra: dict[str, Any] = {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_kind(),
    }
    if str(device).startswith("cuda"):
        extra["cuda_device"] = torch.cuda.get_device_name(torch.device(device))
        extra["cuda"] = torch.version.cuda
    return recorded_environment("torch", **extra)


def cpu_kind() -> str:
    """The processor's model name and the vector instructions torch's CPU kernels use, e.g.
    "AMD EPYC, torch AVX2": float32 kernels round differently on another kind (MKL and torch
    pick their code paths by processor), so a run reproduces digit for digit only on its own."""
    model = platform.processor()
    try:
        for line in (
            Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines()
        ):
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:  # not Linux: platform.processor() it is
        pass
    return f"{model or 'unknown processor'}, torch {torch.backends.cpu.get_cpu_capability()}"


def check_int(config: Mapping[str, Any], key: str, minimum: int = 1) -> None:
    """Refuse ``config[key]`` unless it is an integer (not a bool) ≥ ``minimum``, naming the
    value: "must be a positive integer" for ``minimum`` 1, "must be an integer ≥ m" otherwise."""
    v = config[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise ValueError(f"{key} must be {what}, got {v!r}")


def jsonable(value: Any) -> Any:
    """``value`` with tensors, NumPy arrays and scalars, paths and dataclasses made JSON-able;
    non-finite floats become None (JSON has no NaN)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().tolist()
    if isinstance(value, np.ndarray | np.generic):
        value = value.tolist()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def results_document(
    name: str,
    options: RunOptions,
    config: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    device: torch.device | str,
) -> dict[str, Any]:
    """The JSON document of a run: ``experiment``, ``preset``, ``config`` (seeds included),
    ``runs`` (one entry per seed and arm, with per-epoch metrics), ``summary`` (the reported
    numbers) and ``environment`` (``environment(device)``: machine, versions, commit, time)."""
    return jsonable(
        {
            "experiment": name,
            "preset": options.preset,
            "config": dict(config),
            "runs": list(runs),
            "summary": dict(summary),
            "environment": environment(device),
        }
    )


#: What every run writes last (``write_results``).
RESULT_FILES = ("results.json", "results.md")

#: Output directories this process holds the lock of: path -> open lock file.
_LOCKS: dict[Path, Any] = {}


def output_dir(options: RunOptions, name: str) -> Path:
    """``<out>/<name>``, created and locked for this process; an unusable directory, or one
    that another running process holds, is a clear error before any work.

    The lock is ``fcntl.flock`` on ``<out>/<name>/.lock``, which holds the owner's pid: the
    system releases it when the owner exits, however it exits, so a killed run leaves no stale
    lock. ``write_results`` (a run's last write) gives it up; a run that fails keeps it until
    this process ends."""
    path = Path(options.out) / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write results to {str(path)!r}: {exc.strerror}") from None
    for target in (path / f for f in RESULT_FILES):  # written last: refused before the run
        if os.path.lexists(target) and not target.is_file():
            raise ValueError(
                f"cannot write results to {str(target)!r}: it exists and is not a regular file "
                "(a directory?); remove it or choose another --out"
            )
    key = path.resolve()
    if key in _LOCKS:
        return path
    lock_path = path / ".lock"
    try:
        fh = open(lock_path, "a+")
    except OSError as exc:
        raise ValueError(f"cannot write results to {str(path)!r}: {exc.strerror}") from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        owner = fh.read().strip() or "unknown"
        fh.close()
        raise ValueError(
            f"another run (pid {owner}) is writing to {str(path)!r}; wait for it to finish or "
            "choose another --out"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    _LOCKS[key] = fh
    return path


def release_output_dir(path: Path) -> None:
    """Give up this process's lock on an output directory of ``output_dir`` (if held)."""
    fh = _LOCKS.pop(Path(path).resolve(), None)
    if fh is not None:
        fh.close()


@atexit.register
def _release_all() -> None:
    for path in list(_LOCKS):
        release_output_dir(path)


def write_results(directory: Path, document: Mapping[str, Any], markdown: str) -> list[Path]:
    """Write ``results.json`` and ``results.md`` into ``directory`` and release its lock
    (``output_dir``); return their paths."""
    json_path, md_path = (directory / f for f in RESULT_FILES)
    json_path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", "utf-8")
    md_path.write_text(markdown.rstrip() + "\n", "utf-8")
    release_output_dir(directory)
    return [json_path, md_path]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; floats are written with 4 significant digits."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "–" if not math.isfinite(v) else f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def progress(total: int, desc: str, enabled: bool = True) -> tqdm:
    """A progress bar on stderr (disabled with ``enabled=False``, e.g. under ``--json``)."""
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


def require_matplotlib() -> None:
    """Refuse, before any work, a run that would fail at its plots."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(
            "the experiments write PNG plots and need matplotlib: pip install 'rattn[experiments]'"
        ) from None


@contextmanager
def figure(path: Path, ncols: int = 1, width: float = 5.0, height: float = 3.6) -> Iterator[Any]:
    """A matplotlib figure with ``ncols`` axes (Agg backend, no screen needed), saved as PNG at
    ``path`` when the block ends. Yields the array of axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    try:
        yield axes[0]
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def _plain(value: Any) -> Any:
    """``value`` with NumPy scalars as Python numbers (equal values; pickled NumPy scalars
    would need one more allowed global), containers rebuilt, everything else as it is."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


#: What ``weights_only`` loading may build besides tensors and containers: NumPy arrays and
#: scalars of numeric and bool dtypes (results of finished cells); no object arrays.
_NUMPY_GLOBALS = [
    np.zeros(1).__reduce__()[0],  # numpy's array reconstructor (its module moved in NumPy 2)
    np.ndarray,
    np.dtype,
    *(type(np.dtype(code)) for code in "?bBhHiIlLqQefdg"),
]


class CheckpointError(ValueError):
    """A checkpoint file that cannot be trusted: not one of ours, corrupted or unreadable."""


class Checkpoint:
    """Resumable progress of a long run: a dict of tensors and plain values, saved atomically.

    The file name carries a hash of the configuration and of the key (e.g. seed and arm), so a
    checkpoint is only ever resumed by the same configuration.

    File format (no code runs when it is read): the line ``MAGIC``, the SHA-256 of the payload
    in hex and a newline, then the payload, ``torch.save`` of the dict. It is read back with
    ``torch.load(weights_only=True)``, which admits tensors, containers and numbers only, after
    the checksum has been verified, so a flipped bit or a truncated file is refused with the
    file's name (``CheckpointError``) instead of resuming to different results."""

    MAGIC = b"rattn-checkpoint 1\n"

    def __init__(self, directory: Path, config: Mapping[str, Any], key: str):
        digest = hashlib.sha256(
            json.dumps([jsonable(dict(config)), key], sort_keys=True).encode()
        ).hexdigest()[:16]
        self.path = Path(directory) / f"checkpoint-{digest}.pt"

    def _refuse(self, problem: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {str(self.path)!r} {problem}; delete it or rerun with --no-resume to "
            "start this run afresh"
        )

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when there is none; CheckpointError for a file that is not
        a checkpoint of this format, fails its checksum or does not load as plain data."""
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._refuse(f"cannot be read ({exc.strerror})") from None
        head = len(self.MAGIC) + 65  # magic, 64 hex digits, newline
        if not blob.startswith(self.MAGIC):
            raise self._refuse("is not a rattn checkpoint (its first bytes are not the header)")
        if len(blob) < head:
            raise self._refuse(f"is truncated ({len(blob)} bytes, shorter than its header)")
        digest, payload = blob[len(self.MAGIC) : head - 1], blob[head:]
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            raise self._refuse(
                f"is corrupted: the SHA-256 of its {len(payload)}-byte payload does not match "
                "the one recorded in it (flipped bits or a truncated file)"
            )
        try:
            with torch.serialization.safe_globals(_NUMPY_GLOBALS):
                state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise self._refuse(f"does not load as plain data ({type(exc).__name__})") from None
        if not isinstance(state, dict):
            raise self._refuse(f"holds a {type(state).__name__}, not a dict")
        return state

    def save(self, state: Mapping[str, Any]) -> None:
        """Write ``state`` to a temporary file of this process, then rename it into place."""
        buffer = io.BytesIO()
        torch.save(_plain(dict(state)), buffer)
        payload = buffer.getvalue()
        digest = hashlib.sha256(payload).hexdigest().encode()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(self.MAGIC + digest + b"\n" + payload)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
