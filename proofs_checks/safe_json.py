"""Read a JSON file named on the command line without trusting it.

``read_json(path)`` is for files a user hands to ``rattn`` (``rattn verify CERT.json``): it
reads a regular file only (a device such as ``/dev/zero``, a FIFO, a directory, or a symlink to
one of these is refused before a byte is read: the path is ``stat``-ed first, then opened with
``O_NONBLOCK`` so that opening a FIFO swapped in meanwhile cannot block, and the opened
descriptor is ``fstat``-ed again), at most ``max_bytes`` of it (a larger file is refused by its
size, and a file that grows while it is read by the bytes read), as UTF-8, nested at most
``max_depth`` arrays and objects deep, with no NaN or Infinity (literals, or numbers such as
``1e999`` that overflow to one), no integer of more than MAX_INT_DIGITS digits and no object
with a key twice. Every refusal is a ValueError whose message is one line naming the file and
the problem.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

#: The largest file read by default (64 MiB): a quick certificate of every proposition is 160 KiB.
MAX_BYTES = 64 * 2**20
#: The deepest nesting of arrays and objects accepted by default (a certificate nests 6 deep).
MAX_DEPTH = 200
#: The longest integer accepted, in digits (with its sign): a seed is far shorter.
MAX_INT_DIGITS = 100


def read_json(
    path: str | Path, *, max_bytes: int | None = None, max_depth: int | None = None
) -> Any:
    """The JSON document in the file at ``path`` (module docstring); ValueError naming the file
    and the problem otherwise. ``max_bytes`` and ``max_depth`` default to MAX_BYTES and
    MAX_DEPTH (read when called)."""
    path = Path(path)
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    max_depth = MAX_DEPTH if max_depth is None else max_depth
    data = _read_regular_file(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{label(path)}: not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start})"
        ) from None
    try:
        doc = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:
        raise ValueError(
            f"{label(path)}: nested too deep to parse (past Python's recursion limit, "
            f"{sys.getrecursionlimit()}; at most {max_depth} levels are accepted)"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{label(path)}: not valid JSON ({err})") from None
    except _Refused as err:
        raise ValueError(f"{label(path)}: {err}") from None
    depth = nesting_depth(doc)
    if depth > max_depth:
        raise ValueError(
            f"{label(path)}: nested {depth} arrays and objects deep, more than {max_depth}"
        )
    return doc


def nesting_depth(doc: Any) -> int:
    """How many arrays and objects deep ``doc`` nests (0 for a number or a string), counted
    without recursion."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in children)
    return deepest


def label(path: str | Path) -> str:
    """``path`` as a message names it: as it is, or as Python's ``ascii`` writes it when it
    holds a character that does not print (a newline would split the one-line message)."""
    name = str(path)
    return name if name.isprintable() else ascii(name)


class _Refused(Exception):
    """A value the parser met that ``read_json`` refuses (its message says which)."""


def _read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file (a symlink is followed) of at most ``max_bytes``."""
    try:
        _require_regular(path, os.stat(path), max_bytes)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise ValueError(f"{label(path)}: cannot be read ({err.strerror or err})") from None
    try:
        _require_regular(path, os.fstat(fd), max_bytes)  # the file opened is the one checked
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(2**20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as err:
        raise ValueError(f"{label(path)}: cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise ValueError(f"{label(path)}: grew past {max_bytes} bytes while it was read")
    return b"".join(chunks)


def _require_regular(path: Path, st: os.stat_result, max_bytes: int) -> None:
    """ValueError unless ``st`` is a regular file of at most ``max_bytes`` bytes."""
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{label(path)}: not a regular file (it is {_kind(st.st_mode)})")
    if st.st_size > max_bytes:
        raise ValueError(
            f"{label(path)}: {st.st_size} bytes, more than the {max_bytes} read at most"
        )


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _refuse_constant(name: str) -> float:
    """json's hook for NaN, Infinity and -Infinity: refused."""
    raise _Refused(f"the non-finite number {name} (JSON has no such number)")


def _finite_float(text: str) -> float:
    """json's hook for a number with a fraction or exponent: refused when it overflows."""
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise _Refused(f"the number {shown} overflows to {value}")
    return value


def _bounded_int(text: str) -> int:
    """json's hook for an integer: refused past MAX_INT_DIGITS characters."""
    if len(text) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's hook for an object: refused when a key appears twice (json would keep the last,
    a reader might see the first)."""
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            shown = key if len(key) <= 40 else key[:37] + "..."
            raise _Refused(f"an object has the key {json.dumps(shown)} twice")
        doc[key] = value
    return doc
