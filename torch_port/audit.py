"""Recording a training run's optimizer steps, so that they can be checked against the reference.

``record(optimizer, path, every=1, frames=None)`` hooks ``optimizer.step`` (torch's step pre- and
post-hooks, so schedulers, gradient clipping, accumulation and trainers need nothing special) and
keeps, for every ``every``-th step of each point of each geometry group: the point before the
step, its gradients as the step saw them, the optimizer state before, the group's
hyperparameters in force (lr as a scheduler set it, betas, eps, trust radius, moment, …), how
its geometry is built (name, sizes, options) and the point after. Step numbers are the
optimizer's own counts (``state["step"]`` after the step, from 1).

A point is a batch of elements (a Stiefel parameter: its frames; a group of factors: the points
of its batch). Every array is kept flattened over the batch, (elements, *trailing shape);
``frames=k`` keeps only k elements of each point, evenly spaced (their indices are in the
metadata), so that recording a large model costs little. ``rank`` names the process of a
torch.distributed run: each rank writes its own file (``path`` with ``.rank{R}`` before the
suffix) unless ``ranks=(0,)`` or another subset is asked for.

The file is safe to open from strangers: one NumPy ``.npz`` read with ``allow_pickle=False``
(``load``), its metadata (library and torch versions, devices, dtypes, the groups) a JSON
document stored as bytes. Low-precision tensors (bfloat16, float16) are stored as float32,
which holds them exactly; the metadata keeps their dtype. Each recorded step is written as it
completes, into a temporary file beside ``path`` that the recorder's ``close()`` (or the end of
its ``with`` block) completes and renames to ``path``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_port.optim.optimizer import ChainOptimizer
from torch_port.optim.points import Point

META = "meta.json"
FORMAT = "rattn-audit 1"


def _array(t: torch.Tensor) -> np.ndarray:
    """A CPU NumPy copy; bfloat16/float16 as float32 (exact)."""
    t = t.detach().to("cpu")
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return t.numpy().copy()


def _jsonable(v: Any) -> Any:
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    raise TypeError


def _elements(count: int, frames: int | None) -> list[int]:
    """The indices of the elements kept: all, or ``frames`` of them evenly spaced."""
    if frames is None or frames >= count:
        return list(range(count))
    return sorted({round(i * (count - 1) / max(frames - 1, 1)) for i in range(frames)})


def _rank() -> int | None:
    """This process's rank in an initialised torch.distributed run, else None."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def rank_path(path: str | os.PathLike, rank: int | None) -> Path:
    """The file of one rank: ``run.npz`` -> ``run.rank1.npz`` (``path`` itself without a rank)."""
    path = Path(path)
    return path if rank is None else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


@dataclass
class Recorder:
    """The hooks of ``record`` and what they have kept so far (see the module docstring).

    Each recorded step's arrays are written to the file (a temporary one beside ``path``) when
    the step has completed, so memory holds one step's record at most; a step that raised
    leaves nothing. ``close`` adds the metadata and moves the file to ``path``."""

    optimizer: ChainOptimizer
    path: Path
    every: int = 1
    frames: int | None = None
    ranks: Sequence[int] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.optimizer, ChainOptimizer):
            raise TypeError(
                "record() needs an optimizer of torch_port.optim (a ChainOptimizer: "
                f"RiemannianAdam, RSGD, …), got {type(self.optimizer).__name__}"
            )
        for name, v in (("every", self.every), ("frames", self.frames)):
            if v is None and name == "frames":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer ≥ 1, got {v!r}")
        self.rank = _rank()
        self.path = rank_path(self.path, self.rank)
        self.active = self.ranks is None or (self.rank or 0) in self.ranks
        self._pending: list[tuple[int, Point, int, list[int], int, list[str]]] = []
        self._buffer: dict[str, np.ndarray] = {}
        self._handles = []
        self._zip: zipfile.ZipFile | None = None
        if self.active:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".audit-", suffix=".npz")
            os.close(fd)
            self._zip = zipfile.ZipFile(self._tmp, "w", allowZip64=True)
            self._handles = [
                self.optimizer.register_step_pre_hook(self._before),
                self.optimizer.register_step_post_hook(self._after),
            ]

    def _due(self) -> bool:
        """Whether any point may take a recorded step now: a cheap look at the step counts
        (no point is built on the steps that are not recorded)."""
        state = self.optimizer.state
        for group in self.optimizer.param_groups:
            if group.get("geometry") is None:
                continue
            keys = group["params"] if group["geometry"] == "stiefel" else group["params"][:1]
            for p in keys:
                step = state[p]["step"] if p in state and "step" in state[p] else None
                if (1 if step is None else int(step) + 1) % self.every == 0:
                    return True
        return False

    def _points(self) -> list[Point]:
        opt = self.optimizer
        return [
            point
            for gi, group in enumerate(opt.param_groups)
            if group.get("geometry") is not None
            for point in opt._geometries.points(gi, group)
        ]

    def _spec(self, point: Point) -> dict[str, Any]:
        group = self.optimizer.param_groups[point.gi]
        geometries = self.optimizer._geometries
        if group["geometry"] == "stiefel":
            spec = geometries.stiefel_spec(group, point.params[0])
        else:
            spec = geometries.factored_spec(group)
        return {**spec, "options": {k: _jsonable(v) for k, v in spec["options"].items()}}

    def _keep(self, name: str, t: torch.Tensor, batch: int, kept: list[int]) -> None:
        """Buffer t flattened over its ``batch`` leading dims, only the kept elements."""
        t = t.reshape(-1, *t.shape[batch:])[kept] if batch else t[None]
        self._buffer[name] = _array(t)

    def _write(self, name: str, array: np.ndarray) -> None:
        assert self._zip is not None
        with self._zip.open(name + ".npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, array, allow_pickle=False)

    def _before(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._pending, self._buffer = [], {}  # a step that raised leaves nothing
        if not self._due():
            return
        for point in self._points():
            state = self.optimizer.state.get(point.key) or {}
            t = int(state["step"]) + 1 if "step" in state else 1
            if t % self.every:
                continue
            x = point.value()
            batch = x[0].ndim - len(_trailing(point))
            count = math.prod(x[0].shape[:batch])
            kept = _elements(count, self.frames)
            k = len(self.steps) + len(self._pending)
            for i, (xi, gi) in enumerate(zip(x, point.grad(), strict=True)):
                self._keep(f"r{k}/x/{i}", xi, batch, kept)
                self._keep(f"r{k}/g/{i}", gi, batch, kept)
            for key, value in state.items():
                if key == "step":
                    continue
                parts = value if isinstance(value, tuple) else (value,)
                for i, part in enumerate(parts):
                    self._keep(f"r{k}/state/{key}/{i}", part, batch, kept)
            keys = sorted(key for key in state if key != "step")
            self._pending.append((k, point, t, kept, batch, keys))

    def _after(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for k, point, t, kept, batch, keys in self._pending:
            state = self.optimizer.state.get(point.key) or {}
            done = int(state.get("step", 0)) == t  # False when the step was skipped
            x = point.value()
            if done:
                for i, y in enumerate(x):
                    self._keep(f"r{k}/y/{i}", y, batch, kept)
            group = self.optimizer.param_groups[point.gi]
            hyper = {}
            for name, v in group.items():
                if name in ("params", "param_names"):
                    continue
                try:
                    hyper[name] = _jsonable(v)
                except TypeError:
                    hyper[name] = repr(v)
            names = group.get("param_names")
            self.steps.append(
                {
                    "record": k,
                    "step": t,
                    "taken": done,
                    "group": point.gi,
                    "params": point.pis,
                    "names": [names[i] for i in point.pis] if names else None,
                    "geometry": self._spec(point),
                    "gradient": group.get("gradient", "riemannian"),
                    "elements": kept,
                    "batch": list(x[0].shape[:batch]),
                    "hyperparameters": hyper,
                    "dtypes": [str(p.dtype) for p in point.params],
                    "device": str(point.params[0].device),
                    "state_keys": keys,
                }
            )
        for name, array in self._buffer.items():
            self._write(name, array)
        self._pending, self._buffer = [], {}

    def close(self) -> Path | None:
        """Remove the hooks, add the metadata and move the file to ``path``; returns its path
        (None on a rank that does not record, or when already closed)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._zip is None:
            return None
        meta = {
            "format": FORMAT,
            "optimizer": type(self.optimizer).__name__,
            "every": self.every,
            "frames": self.frames,
            "rank": self.rank,
            "versions": {"rattn": _version("rattn"), "torch": torch.__version__},
            "steps": self.steps,
        }
        self._write(META, np.frombuffer(json.dumps(meta).encode(), np.uint8))
        self._zip.close()
        self._zip = None
        os.replace(self._tmp, self.path)
        return self.path

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _trailing(point: Point) -> tuple[int, ...]:
    """The trailing shape of a point's first part (what is not batch)."""
    geometry = getattr(point.geometry, "geometry", point.geometry)  # through an Ambient view
    shapes = getattr(geometry, "point_shapes", None)
    return tuple(shapes[0]) if shapes else tuple(point.params[0].shape[-2:])


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def record(
    optimizer: ChainOptimizer,
    path: str | os.PathLike,
    every: int = 1,
    frames: int | None = None,
    ranks: Sequence[int] | None = None,
) -> Recorder:
    """Start recording every ``every``-th step of ``optimizer`` into ``path``, ``frames``
    elements of each point (all by default), on every rank of a distributed run or on
    ``ranks`` only (module docstring); use as a context manager, or call ``.close()``."""
    return Recorder(optimizer, Path(path), every, frames, ranks)


@dataclass(frozen=True)
class Trace:
    """A recorded run: ``meta`` (the JSON metadata) and ``arrays`` (name -> array)."""

    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]

    def parts(self, record: int, what: str) -> Sequence[np.ndarray]:
        """The arrays ``what`` ("x", "g", "y" or "state/KEY") of a record, in order."""
        out, i = [], 0
        while f"r{record}/{what}/{i}" in self.arrays:
            out.append(self.arrays[f"r{record}/{what}/{i}"])
            i += 1
        return out


def load(path: str | os.PathLike) -> Trace:
    """A recorded run, read without running any code from the file (``allow_pickle=False``);
    ValueError naming the file for anything that is not one."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(bytes(arrays.pop(META)).decode())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not an audit trace ({type(err).__name__}: {err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not an audit trace of format {FORMAT!r}")
    return Trace(meta, arrays)


__all__ = ["Recorder", "Trace", "load", "rank_path", "record"]
