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
completes, as one complete file of the folder ``path.parts`` (``parts_dir``), so that a run
killed, out of disk or never closed keeps every step written (``load`` reads the folder and
marks the trace partial); the recorder's ``close()`` (or the end of its ``with`` block) joins
them into ``path``. A recorder that cannot write warns and stops; it never raises out of a
step that was applied. The rule recorded is the one the optimizer runs: a preset of
``torch_port.optim`` or one of geoopt's rules (``audit_sources``, which also says how each
optimizer's points and state are read).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import sys
import tokenize
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
        missing ``close()`` (``load`` reads the folder of an unclosed recording)."""
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
        arrays = _read_parts(self.parts).arrays if self.steps else {}  # no step recorded
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


# torch_port does not import reference (DESIGN §2): the reader's two guards, as in
# reference.safe_files.
#: The most a deflated member can expand: deflate's largest ratio is 1032:1.
DEFLATE_RATIO = 1032


def open_regular(path: Path) -> Any:
    """``path`` opened for reading if it is a regular file (a device such as /dev/zero, a FIFO,
    a directory or a link to one is refused before a byte is read: opened without blocking,
    then the descriptor itself ``fstat``-ed); ValueError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file (a device, a FIFO or a directory)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def check_member(info: zipfile.ZipInfo, length: int, suffix: str = ".npy") -> None:
    """A member the reader may decompress: not a .npy, encrypted, compressed otherwise than
    stored or deflated (bzip2 and lzma have no bound on their expansion), or declaring more
    bytes than its compressed data can hold or than the file has, is refused by name."""
    name = info.filename
    if not name.endswith(suffix):
        raise ValueError(f"member {name!r} is not a {suffix} array")
    if info.flag_bits & 0x1:
        raise ValueError(f"member {name!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ValueError(
            f"member {name!r} is compressed with method {info.compress_type}; a trace's "
            "members are stored or deflated"
        )
    if info.header_offset + info.compress_size > length:
        raise ValueError(f"member {name!r} declares {info.compress_size} bytes past the file's end")
    most = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED else DEFLATE_RATIO)
    if info.file_size > most:
        raise ValueError(
            f"member {name!r} declares {info.file_size} bytes, more than its "
            f"{info.compress_size} compressed bytes can hold"
        )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every member of the ``.npz`` at ``path`` as an array, each header checked before its data
    is read: a ``.npy`` member with a well-formed header, no object dtype (nothing is
    unpickled), and a declared size that the member's bytes hold (so no header can make the
    loader allocate more than the file has); member names unique. ValueError otherwise."""
    arrays: dict[str, np.ndarray] = {}
    with open_regular(path) as raw, zipfile.ZipFile(raw) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise ValueError("a member name appears twice")
        length = os.fstat(raw.fileno()).st_size
        for info in infos:
            check_member(info, length, ".npy")
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                headers = {
                    (1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0,
                }
                if version not in headers:
                    raise ValueError(f"member {info.filename!r}: .npy version {version}")
                read_header = headers[version]
                shape, fortran, dtype = read_header(f)
                if dtype.hasobject:
                    raise ValueError(f"member {info.filename!r} holds Python objects")
                start = f.tell()
                size = math.prod(shape) * dtype.itemsize
                if size != info.file_size - start:
                    raise ValueError(
                        f"member {info.filename!r} declares {size} bytes of data but holds "
                        f"{info.file_size - start}"
                    )
                data = f.read(size)
            array = np.frombuffer(data, dtype=dtype)
            order = "F" if fortran else "C"
            arrays[info.filename.removesuffix(".npy")] = array.reshape(shape, order=order).copy()
    return arrays


def _read_one(path: Path) -> Trace:
    """One ``.npz`` of the recorder: its arrays and its metadata (not yet checked)."""
    arrays = _read_npz(path)
    return Trace(json.loads(bytes(arrays.pop(META)).decode()), arrays)


def _read_parts(folder: Path) -> Trace:
    """The steps written to the parts folder of a recording, in order, as one trace."""
    files = sorted(p for p in folder.iterdir() if p.suffix == ".npz" and p.is_file())
    if not files:
        raise ValueError(f"{folder}: a recording's folder that holds no recorded step")
    pieces = [_read_one(p) for p in files]
    meta = {**pieces[0].meta, "steps": [s for piece in pieces for s in piece.meta["steps"]]}
    if any(
        {k: v for k, v in p.meta.items() if k != "steps"}
        != {k: v for k, v in pieces[0].meta.items() if k != "steps"}
        for p in pieces
    ):
        raise ValueError(f"{folder}: its files are not parts of one recording")
    return Trace(meta, {k: v for piece in pieces for k, v in piece.arrays.items()})


def load(path: str | os.PathLike) -> Trace:
    """A recorded run, read without running any code from the file (``_read_npz``: no pickle,
    every header checked before its data) and checked (``check_trace``); ValueError naming the
    file for anything that is not one. A recording that was never closed (killed, out of disk,
    no ``close()``) is read from its parts folder (``run.npz.parts``, or that folder named
    itself) with every step written before it stopped; its metadata says ``partial``."""
    path = Path(path)
    folder = path if path.name.endswith(".parts") else parts_dir(path)
    partial = not os.path.lexists(path) or path == folder
    try:
        if partial and folder.is_dir():
            trace = _read_parts(folder)
            trace.meta["partial"] = True
        else:
            trace = _read_one(path)
        meta = trace.meta
    except (
        OSError,
        ValueError,
        KeyError,
        EOFError,
        OverflowError,
        RecursionError,
        SyntaxError,
        tokenize.TokenError,
        zipfile.BadZipFile,
        UnicodeDecodeError,
        TypeError,
        AttributeError,
    ) as err:
        raise ValueError(f"{path}: not an audit trace ({type(err).__name__}: {err})") from None
    if isinstance(meta, dict) and meta.get("format") == "rattn-audit 1":
        raise ValueError(
            f"{path}: an audit trace of format 'rattn-audit 1', which keeps no state after a "
            f"step and so cannot show the state's update; record the run again ({FORMAT!r})"
        )
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not an audit trace of format {FORMAT!r}")
    try:
        check_trace(trace)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return trace


#: The fields of a recorded step and their types (``Recorder._after``).
STEP_FIELDS: dict[str, Any] = {
    "record": int,
    "step": int,
    "taken": bool,
    "group": int,
    "params": list,
    "names": (list, type(None)),
    "geometry": dict,
    "gradient": str,
    "elements": list,
    "batch": list,
    "hyperparameters": dict,
    "dtypes": list,
    "device": str,
    "state_keys": list,
    "after_keys": list,
    "nonfinite_gradient": bool,
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: Declared dtype -> (the stored NumPy dtype, the torch dtype its values must be exact in).
STORED = {
    "torch.float64": (np.float64, torch.float64),
    "torch.float32": (np.float32, torch.float32),
    "torch.bfloat16": (np.float32, torch.bfloat16),
    "torch.float16": (np.float32, torch.float16),
}


def _holds(a: np.ndarray, declared: str) -> bool:
    """Whether ``a`` is what the recorder stores for a tensor of dtype ``declared``: float64 or
    float32 (``STORED``), with values exactly representable in it (bfloat16, float16)."""
    if declared not in STORED or a.dtype != STORED[declared][0]:
        return False
    low = STORED[declared][1]
    if low in (torch.float64, torch.float32):
        return True
    t = torch.from_numpy(np.ascontiguousarray(a))
    return bool(torch.equal(t.to(low).to(t.dtype), t))


def check_trace(trace: Trace) -> None:
    """ValueError naming the record and the field unless the metadata has the recorder's
    layout (``STEP_FIELDS``, a geometry with a name, integer sizes and options, step numbers
    ≥ 1) and every record has its arrays: x and g (and y when the step was taken) with one
    entry per kept element, y of x's shapes, every state entry named, all of them real floating
    arrays, x finite, x and y of the declared dtype (bfloat16 and float16 values exact)."""
    meta = trace.meta
    if (
        not isinstance(meta.get("optimizer"), str)
        or not isinstance(meta.get("steps"), list)
        or not isinstance(meta.get("versions"), dict)
    ):
        raise ValueError("the metadata has no optimizer name, no list of steps or no versions")
    for k, step in enumerate(meta["steps"]):
        where = f"record {k}"
        if not isinstance(step, dict):
            raise ValueError(f"{where}: not a JSON object")
        for name, kind in STEP_FIELDS.items():
            value = step.get(name)
            ok = _is_int(value) if kind is int else isinstance(value, kind)
            if not ok:
                raise ValueError(f"{where}: field {name!r} is {value!r}")
        if step["record"] != k or step["step"] < 1:
            raise ValueError(f"{where}: record {step['record']!r}, step {step['step']!r}")
        geometry = step["geometry"]
        sizes = geometry.get("sizes")
        if (
            not isinstance(geometry.get("name"), str)
            or not isinstance(sizes, dict)
            or not all(_is_int(v) and v > 0 for v in sizes.values())
            or not isinstance(geometry.get("options"), dict)
        ):
            raise ValueError(f"{where}: geometry {geometry!r} has no name, sizes or options")
        count = len(step["elements"])
        elements = step["elements"]
        if (
            not count
            or not all(_is_int(e) and e >= 0 for e in elements)
            or (len(set(elements)) != count)
        ):
            raise ValueError(f"{where}: elements {elements!r} (distinct integers ≥ 0 expected)")
        if not step["params"] or not all(_is_int(i) and i >= 0 for i in step["params"]):
            raise ValueError(f"{where}: params {step['params']!r} (parameter indices expected)")
        if step["names"] is not None and not all(isinstance(n, str) for n in step["names"]):
            raise ValueError(f"{where}: names {step['names']!r}")
        if not step["dtypes"] or not all(isinstance(d, str) for d in step["dtypes"]):
            raise ValueError(f"{where}: dtypes {step['dtypes']!r}")
        parts = {what: trace.parts(k, what) for what in ("x", "g", "y")}
        for kind, keys in (("state", step["state_keys"]), ("after", step["after_keys"])):
            for key in keys:
                if not isinstance(key, str) or not trace.parts(k, f"{kind}/{key}"):
                    raise ValueError(f"{where}: the {kind} entry {key!r} has no arrays")
                parts[f"{kind}/{key}"] = trace.parts(k, f"{kind}/{key}")
        if step["taken"] and not step["after_keys"] and step["state_keys"]:
            raise ValueError(f"{where}: a step taken from a state keeps no state after it")
        if not parts["x"] or len(parts["g"]) != len(parts["x"]):
            raise ValueError(f"{where}: {len(parts['x'])} point arrays, {len(parts['g'])} gradient")
        if step["taken"] != bool(parts["y"]):
            raise ValueError(
                f"{where}: taken is {step['taken']} but it has {len(parts['y'])} new points"
            )
        if parts["y"] and [a.shape for a in parts["y"]] != [a.shape for a in parts["x"]]:
            raise ValueError(f"{where}: the new point's shapes differ from the point's")
        for what, arrays in parts.items():
            for i, a in enumerate(arrays):
                if a.dtype.kind != "f" or a.ndim < 1 or a.shape[0] != count:
                    raise ValueError(
                        f"{where}: {what}/{i} has dtype {a.dtype} and shape {a.shape}, expected "
                        f"a real floating array of {count} elements"
                    )
        if not all(np.isfinite(a).all() for a in parts["x"]):
            raise ValueError(f"{where}: the point has non-finite entries")
        declared = step["dtypes"][0]
        for what in ("x", "y"):
            for i, a in enumerate(parts[what]):
                if not _holds(a, declared):
                    raise ValueError(
                        f"{where}: {what}/{i} ({a.dtype}) is not what a {declared} point stores"
                    )


__all__ = ["STEP_FIELDS", "Recorder", "Trace", "check_trace", "load", "rank_path", "record"]
