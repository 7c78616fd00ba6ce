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

The file is safe to open from strangers: one NumPy ``.npz`` of ``.npy`` arrays, its metadata
(library and torch versions, devices, dtypes, the groups) a JSON document stored as bytes; its
schema, reader and validator are ``proofs_checks.audit.trace`` (NumPy only). Low-precision
tensors (bfloat16, float16) are stored as float32, which holds them exactly; the metadata keeps
their dtype. Each recorded step is written as it completes, as one complete file of the folder
``path.parts`` (``parts_dir``), so that a run killed, out of disk or never closed keeps every
step written (the reader reads the folder and marks the trace partial); the recorder's
``close()`` (or the end of its ``with`` block) joins them into ``path``. A recorder that cannot
write warns and stops; it never raises out of a
step that was applied. The rule recorded is the one the optimizer runs: a preset of
``torch_port.optim`` or one of geoopt's rules (``audit_sources``, which also says how each
optimizer's points and state are read).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_port.audit_layout import Layout, check_recordable
from torch_port.audit_sources import source_of
from torch_port.optim.groups import label_of

# The layout that ``proofs_checks.audit.trace`` states and reads (its schema): this package does
# not import it (DESIGN §2), and tests/test_audit_inputs.py checks that the two agree.
META = "meta.json"
#: The code of torch's wrapper around every optimizer class's ``step`` (which runs the hooks).
_STEP_WRAPPER = torch.optim.Optimizer.profile_hook_step(lambda *args: None).__code__
FORMAT = "rattn-audit 2"


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


def parts_dir(path: Path) -> Path:
    """The folder that holds the steps of a recording until ``close()``: ``run.npz.parts``."""
    return path.with_name(path.name + ".parts")


def _write_npz(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """An ``.npz`` of ``arrays`` and the JSON ``meta`` (stored, not compressed)."""
    with zipfile.ZipFile(path, "w", allowZip64=True) as z:
        for name, array in [*arrays.items(), (META, _json_bytes(meta))]:
            with z.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array, allow_pickle=False)


def _json_bytes(meta: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(json.dumps(meta).encode(), np.uint8)


def _written(folder: Path) -> dict[str, np.ndarray]:
    """The arrays of every step file this recorder wrote to its parts folder, in order (its own
    files: ``.npy`` members, read without pickle)."""
    arrays: dict[str, np.ndarray] = {}
    for part in sorted(folder.glob("*.npz")):
        with np.load(part, allow_pickle=False) as z:
            arrays.update((k, z[k]) for k in z.files if k != META)
    return arrays


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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

    optimizer: torch.optim.Optimizer
    path: Path
    every: int = 1
    frames: int | None = None
    ranks: Sequence[int] | None = None
    points: Sequence[torch.Tensor] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.source = source_of(self.optimizer, self.points)  # refuses what it cannot read
        for name, v in (("every", self.every), ("frames", self.frames)):
            if (v is not None or name == "every") and not (_is_int(v) and v >= 1):
                raise ValueError(f"{name} must be an integer ≥ 1, got {v!r}")
        if self.ranks is not None and (
            isinstance(self.ranks, str | bytes)
            or not isinstance(self.ranks, Sequence)
            or not all(_is_int(r) and r >= 0 for r in self.ranks)
        ):
            raise ValueError(
                f"ranks must be a sequence of ranks (integers ≥ 0), got {self.ranks!r}"
            )
        for point in self.source.points():  # shards the recorder cannot read are refused now
            layout = Layout.of(point, len(self.source.trailing(point)), self.frames)
            check_recordable(point, self.source.spec(point)["name"], layout, self.ranks)
        if Path(self.path).is_dir():
            raise ValueError(f"{self.path}: a directory; record() needs a file path (e.g. run.npz)")
        self.rank = _rank()
        self.path = rank_path(self.path, self.rank)
        self.parts = parts_dir(self.path)
        self.active = self.ranks is None or (self.rank or 0) in self.ranks
        self._pending: list[tuple[int, Any, int, Layout, list[str]]] = []
        self._buffer: dict[str, np.ndarray] = {}
        self._handles = []
        self._open = False
        if self.active:
            if os.path.lexists(self.path) and not self.path.is_file():
                raise ValueError(
                    f"{self.path}: exists and is not a regular file; record() writes a new "
                    "trace there, and nothing is written over a device, a FIFO or a link"
                )
            if os.path.lexists(self.parts):
                raise ValueError(
                    f"{self.parts}: an unfinished recording is there (audit it with rattn "
                    f"audit {self.path}, or remove it)"
                )
            self.parts.mkdir(parents=True)
            self._open = True
            # under torch.compile(optimizer.step) the hooks run eagerly, as the step does
            self._handles = [
                self.optimizer.register_step_pre_hook(torch.compiler.disable(self._before)),
                self.optimizer.register_step_post_hook(torch.compiler.disable(self._after)),
            ]

    def _due(self) -> bool:
        """Whether any point may take a recorded step now: a cheap look at the step counts
        (no point is built on the steps that are not recorded)."""
        return any((taken + 1) % self.every == 0 for taken in self.source.counts())

    def _spec(self, point: Any) -> dict[str, Any]:
        spec = self.source.spec(point)
        return {**spec, "options": {k: _jsonable(v) for k, v in spec["options"].items()}}

    def _keep(self, name: str, t: torch.Tensor, layout: Layout) -> None:
        """Buffer t flattened over its batch dims, only the kept elements, whole (``Layout``)."""
        self._buffer[name] = _array(layout.kept_of(t))

    def _meta(self, steps: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "optimizer": self.source.rule,
            "class": f"{type(self.optimizer).__module__}.{type(self.optimizer).__qualname__}",
            "every": self.every,
            "frames": self.frames,
            "rank": self.rank,
            "versions": {"rattn": _version("rattn"), "torch": torch.__version__},
            "steps": steps,
        }

    def _write_part(self, first: int, arrays: dict[str, np.ndarray]) -> None:
        """This step's records as one complete file of the parts folder, written beside and
        renamed into place, so that every step written survives a kill, a full disk or a
        missing ``close()`` (the reader reads the folder of an unclosed recording)."""
        name = self.parts / f"{first:09d}.npz"
        tmp = self.parts / f".{first:09d}.tmp"
        _write_npz(tmp, arrays, self._meta(self.steps[first:]))
        os.replace(tmp, name)

    def _nested(self) -> bool:
        """Whether this step runs inside another step of the same optimizer: a subclass's
        ``step`` that calls its parent's fires the hooks twice (torch wraps each class's
        ``step``), and only the outer step is what the run did (the frames a subclass moves
        after ``super().step()`` included). Read from the call stack, so a step that raised
        leaves nothing behind."""
        frame, outer = sys._getframe(1), 0
        while frame is not None:
            if frame.f_code is _STEP_WRAPPER and frame.f_locals.get("self") is self.optimizer:
                outer += 1
            frame = frame.f_back
        return outer > 1

    def _before(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._nested():
            return
        self._pending, self._buffer = [], {}  # a step that raised leaves nothing
        if not self._due():
            return
        for point in self.source.points():
            state = self.source.state_of(point)
            t = self.source.taken(point) + 1
            if t % self.every:
                continue
            layout = Layout.of(point, len(self.source.trailing(point)), self.frames)
            if not layout.elements:  # an FSDP2 shard that holds none of the point's elements
                continue
            k = len(self.steps) + len(self._pending)
            for i, xi in enumerate(layout.value(point)):  # the gradients after the step
                self._keep(f"r{k}/x/{i}", xi, layout)
            keys = self._keep_state(f"r{k}/state", state, layout)
            self._pending.append((k, point, t, layout, keys))

    def _keep_state(self, prefix: str, state: dict, layout: Layout) -> list[str]:
        """Buffer every entry of a point's state (``Source.state_of``) under ``prefix``; their
        keys."""
        keys = sorted(state)
        for key in keys:
            value = state[key]
            for i, part in enumerate(value if isinstance(value, tuple | list) else (value,)):
                self._keep(f"{prefix}/{key}/{i}", part, layout)
        return keys

    def _nonfinite(self) -> bool:
        """Whether any gradient the optimizer holds has a non-finite entry (why a step with
        ``skip_nonfinite`` was skipped)."""
        return any(
            p.grad is not None and not bool(torch.isfinite(p.grad).all())
            for group in self.optimizer.param_groups
            for p in group["params"]
        )

    def _after(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._nested():
            return
        self.source.stepped()
        nonfinite: bool | None = None
        first = len(self.steps)
        buffered, self._buffer = self._buffer, {}
        for old, point, t, layout, keys in self._pending:
            if all(p.grad is None for p in point.params):
                continue  # no gradient, not stepped (a closure may have made one since the start)
            k = len(self.steps)  # records are numbered as written
            prefix = f"r{old}/"
            self._buffer.update(
                {f"r{k}/{n[len(prefix) :]}": a for n, a in buffered.items() if n.startswith(prefix)}
            )
            state = self.source.state_of(point)
            done = self.source.taken(point) == t  # False when the step was skipped
            for i, gi in enumerate(layout.grad(point)):  # as the step saw them (closures too)
                self._keep(f"r{k}/g/{i}", gi, layout)
            if not done and nonfinite is None:
                nonfinite = self._nonfinite()
            after_keys = []
            if done:
                for i, y in enumerate(layout.value(point)):
                    self._keep(f"r{k}/y/{i}", y, layout)
                after_keys = self._keep_state(f"r{k}/after", state, layout)
            group = self.optimizer.param_groups[point.gi]
            hyper = {}
            for name, v in self.source.hyperparameters(point).items():
                try:
                    hyper[name] = _jsonable(v)
                except TypeError:
                    hyper[name] = repr(v)
            names = group.get("param_names")
            labels = [label_of(p) for p in point.params]  # a conversion's W_Q, W_K, …
            point_names = (
                labels if all(labels) else [names[i] for i in point.pis] if names else None
            )
            self.steps.append(
                {
                    "record": k,
                    "step": t,
                    "taken": done,
                    "group": point.gi,
                    "params": point.pis,
                    "names": point_names,
                    "geometry": self._spec(point),
                    "gradient": group.get("gradient", "riemannian"),
                    "elements": layout.elements,
                    "batch": layout.batch,
                    "hyperparameters": hyper,
                    "dtypes": [str(p.dtype) for p in point.params],
                    "device": str(point.params[0].device),
                    "state_keys": keys,
                    "after_keys": after_keys,
                    "nonfinite_gradient": bool(nonfinite) if not done else False,
                }
            )
        arrays, self._pending, self._buffer = self._buffer, [], {}
        if len(self.steps) > first:
            try:
                self._write_part(first, arrays)
            except OSError as err:  # the step was applied: never raise out of it
                self.steps = self.steps[:first]
                self._stop(
                    f"could not write the step's record ({err}); recording stopped, the steps "
                    f"written so far are kept in {self.parts}"
                )

    def _stop(self, why: str) -> None:
        """Stop recording without raising (the optimizer's step went through): warn, remove
        the hooks; what was written stays auditable."""
        warnings.warn(f"torch_port.audit: {why}", RuntimeWarning, stacklevel=3)
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def close(self) -> Path | None:
        """Remove the hooks and write the trace: the parts folder's steps as one file at
        ``path`` (written beside it and renamed into place), then remove the folder; returns
        its path (None on a rank that does not record, or when already closed)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if not self._open:
            return None
        self._open = False
        arrays = _written(self.parts)
        if os.path.lexists(self.path) and not self.path.is_file():
            raise ValueError(
                f"{self.path} is no longer a regular file; the trace stays in {self.parts}"
            )
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        _write_npz(tmp, arrays, self._meta(self.steps))
        os.replace(tmp, self.path)
        shutil.rmtree(self.parts)
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


def record(
    optimizer: torch.optim.Optimizer,
    path: str | os.PathLike,
    every: int = 1,
    frames: int | None = None,
    ranks: Sequence[int] | None = None,
    points: Sequence[torch.Tensor] | None = None,
) -> Recorder:
    """Start recording every ``every``-th step of ``optimizer`` into ``path``, ``frames``
    elements of each point (all by default), on every rank of a distributed run or on
    ``ranks`` only (module docstring); ``points``: the parameters that are Stiefel frames, for
    an optimizer that is neither ``torch_port.optim``'s nor geoopt's (``audit_sources``). Use
    as a context manager, or call ``.close()``."""
    return Recorder(optimizer, Path(path), every, frames, ranks, points)


__all__ = ["FORMAT", "Recorder", "parts_dir", "rank_path", "record"]
