"""The audit trace: its schema, its reader and its validator (NumPy only, so that ``rattn audit``
runs where torch is not installed).

A trace is what ``torch_port.audit.record`` writes: one NumPy ``.npz`` whose members are ``.npy``
arrays, read here with every header checked before its data (no pickle, no member larger than
its bytes: ``reference.safe_files``), or, for a recording that never closed, the folder
``run.npz.parts`` of one such file per recorded step. Its member ``meta.json`` is a JSON
document stored as bytes: ``format`` (``FORMAT``), ``optimizer`` (the class name), ``versions``
and ``steps``, one object per record with the fields of ``STEP_FIELDS``. The arrays of record k
are ``r{k}/x/{i}``, ``r{k}/g/{i}``, ``r{k}/y/{i}`` (the point before, its gradient, the point
after; part i of the point), ``r{k}/state/{KEY}/{i}`` and ``r{k}/after/{KEY}/{i}`` (the
optimizer's state before and after the step), each (elements, *trailing shape) in the port's
layout. A tensor of a declared dtype (``DTYPES``) is stored as float64 or float32, which holds
bfloat16 and float16 values exactly.

The recorder (``torch_port``) writes this layout without importing this module (DESIGN §2:
``torch_port`` never imports ``proofs_checks``); ``tests/test_audit_inputs.py`` checks that its
``FORMAT``, ``META`` and ``parts_dir`` are these.
"""

from __future__ import annotations

import json
import math
import os
import tokenize
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from reference.safe_files import check_member, open_regular

FORMAT = "rattn-audit 2"
META = "meta.json"


def parts_dir(path: Path) -> Path:
    """The folder that holds the steps of a recording until it is closed: ``run.npz.parts``."""
    return path.with_name(path.name + ".parts")


class Stored(NamedTuple):
    """How a tensor of one dtype is stored, and the constants the replay's bounds use."""

    array: type  # the NumPy dtype of its arrays
    eps: float  # machine epsilon ε of the dtype itself (2·u)

    @property
    def roundoff(self) -> float:
        """u = ε/2."""
        return self.eps / 2.0

    @property
    def accepted(self) -> float:
        """sqrt(ε): the orthonormality residual up to which the port accepts a point as on its
        manifold (``torch_port.geometry.default_atol``)."""
        return math.sqrt(self.eps)


#: Declared dtype (torch's name) -> how it is stored. ε: 2^-52, 2^-23, 2^-7 (8 significand bits),
#: 2^-10 (11 bits).
DTYPES = {
    "torch.float64": Stored(np.float64, 2.0**-52),
    "torch.float32": Stored(np.float32, 2.0**-23),
    "torch.bfloat16": Stored(np.float32, 2.0**-7),
    "torch.float16": Stored(np.float32, 2.0**-10),
}


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


def _holds(a: np.ndarray, declared: str) -> bool:
    """Whether ``a`` is what the recorder stores for a tensor of dtype ``declared``: float64 or
    float32 (``DTYPES``), with values exactly representable in it. A float32 holds a bfloat16
    value when its 16 low bits are zero (bfloat16 is float32's upper half), a float16 value
    when it survives the round trip through float16."""
    if declared not in DTYPES or a.dtype != DTYPES[declared].array:
        return False
    if declared == "torch.bfloat16":
        return not np.any(np.ascontiguousarray(a).view(np.uint32) & 0xFFFF)
    if declared == "torch.float16":
        with np.errstate(over="ignore"):
            return bool(np.array_equal(a.astype(np.float16).astype(a.dtype), a, equal_nan=True))
    return True


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
    seen: dict[tuple, int] = {}
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
        # one step of a parameter taken twice: which one ran? (a skipped step keeps its
        # number, and the next one takes it)
        key = (step["step"], step["group"], tuple(step["params"]))
        if step.get("taken") and key in seen:
            raise ValueError(
                f"{where}: step {step['step']} of group {step['group']}, params "
                f"{step['params']}, was taken already (record {seen[key]})"
            )
        if step.get("taken"):
            seen[key] = k
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


__all__ = ["DTYPES", "FORMAT", "STEP_FIELDS", "Trace", "check_trace", "load", "parts_dir"]
