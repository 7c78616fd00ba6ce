"""Recording a training run's optimizer steps, so that they can be checked against the reference.

``record(optimizer, path, every=1)`` hooks ``optimizer.step`` (torch's step pre- and post-hooks,
so schedulers, gradient clipping, accumulation and trainers need nothing special) and keeps, for
every ``every``-th step of each point of each geometry group: the point before the step, its
gradients as the step saw them, the optimizer state before, the group's hyperparameters in
force (lr as a scheduler set it, betas, eps, trust radius, moment, …) and the point after.
Step numbers are the optimizer's own counts (``state["step"]`` after the step, from 1).

The file is safe to open from strangers: one NumPy ``.npz`` read with ``allow_pickle=False``
(``load``), its metadata (library and torch versions, devices, dtypes, the groups) a JSON
document stored as bytes. Low-precision tensors (bfloat16, float16) are stored as float32,
which holds them exactly; the metadata keeps their dtype. The file is written when the recorder
is closed (``close()`` or the end of its ``with`` block), to a temporary file then renamed.
"""

from __future__ import annotations

import io
import json
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


@dataclass
class Recorder:
    """The hooks of ``record`` and what they have kept so far (see the module docstring)."""

    optimizer: ChainOptimizer
    path: Path
    every: int = 1
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.optimizer, ChainOptimizer):
            raise TypeError(
                "record() needs an optimizer of torch_port.optim (a ChainOptimizer: "
                f"RiemannianAdam, RSGD, …), got {type(self.optimizer).__name__}"
            )
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every must be an integer ≥ 1, got {self.every!r}")
        self.path = Path(self.path)
        self._pending: list[tuple[int, Point, int]] = []
        self._handles = [
            self.optimizer.register_step_pre_hook(self._before),
            self.optimizer.register_step_post_hook(self._after),
        ]

    def _points(self) -> list[Point]:
        opt = self.optimizer
        return [
            point
            for gi, group in enumerate(opt.param_groups)
            if group.get("geometry") is not None
            for point in opt._geometries.points(gi, group)
        ]

    def _before(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for k, _, _ in self._pending:  # a step that raised: drop what it had recorded
            for name in [n for n in self.arrays if n.startswith(f"r{k}/")]:
                del self.arrays[name]
        self._pending = []
        for point in self._points():
            state = self.optimizer.state.get(point.key) or {}
            t = int(state["step"]) + 1 if "step" in state else 1
            if t % self.every:
                continue
            k = len(self.steps) + len(self._pending)
            prefix = f"r{k}"
            for i, (x, g) in enumerate(zip(point.value(), point.grad(), strict=True)):
                self.arrays[f"{prefix}/x/{i}"] = _array(x)
                self.arrays[f"{prefix}/g/{i}"] = _array(g)
            for key, value in state.items():
                parts = value if isinstance(value, tuple) else (value,)
                for i, part in enumerate(parts):
                    self.arrays[f"{prefix}/state/{key}/{i}"] = _array(part)
            self._pending.append((k, point, t))

    def _after(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for k, point, t in self._pending:
            state = self.optimizer.state.get(point.key) or {}
            done = int(state.get("step", 0)) == t  # False when the step was skipped
            if done:
                for i, y in enumerate(point.value()):
                    self.arrays[f"r{k}/y/{i}"] = _array(y)
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
                    "geometry": point.geometry.name,
                    "gradient": group.get("gradient", "riemannian"),
                    "hyperparameters": hyper,
                    "dtypes": [str(p.dtype) for p in point.params],
                    "device": str(point.params[0].device),
                    "state_keys": sorted(state),
                }
            )
        self._pending = []

    def close(self) -> Path:
        """Remove the hooks and write the file (``path``); returns its path."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        meta = {
            "format": FORMAT,
            "optimizer": type(self.optimizer).__name__,
            "every": self.every,
            "versions": {"rattn": _version("rattn"), "torch": torch.__version__},
            "steps": self.steps,
        }
        buf = io.BytesIO()
        np.savez(buf, **self.arrays, **{META: np.frombuffer(json.dumps(meta).encode(), np.uint8)})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".audit-", suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, self.path)
        return self.path

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def record(optimizer: ChainOptimizer, path: str | os.PathLike, every: int = 1) -> Recorder:
    """Start recording every ``every``-th step of ``optimizer`` into ``path`` (module
    docstring); use as a context manager, or call ``.close()``."""
    return Recorder(optimizer, Path(path), every)


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


__all__ = ["Recorder", "Trace", "load", "record"]
