"""``rattn rank DATA.npz``: the intrinsic rank of a user's sequences, estimated before training.

DATA.npz holds X of shape (S, n, d) and Y of shape (S, n, d_v); this module reads it safely
(regular files only, sizes checked before anything is allocated), runs
``reference.capacity.recommend.estimate`` and prints, writes or plots its report.
"""

from __future__ import annotations

import argparse
import codecs
import importlib.util
import json
import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from proofs_checks.memory import require_memory
from reference.capacity.recommend import ATTENTION, estimate
from reference.safe_files import check_member, open_regular

#: Spectrum values shown in the text table (all of them go to the JSON document and the plot).
SHOWN = 12


# ---------------------------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------------------------
#: Readers of the .npy header by format version; 3.0 is written only for structured dtypes with
#: Unicode field names, which are not real numeric data.
_NPY_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def load_sequences(
    path: str | Path, x_key: str = "X", y_key: str = "Y"
) -> tuple[np.ndarray, np.ndarray]:
    """X (S, n, d) and Y (S, n, d_v) from a .npz archive, as float64. Raises ValueError naming
    the problem and the measured value: a missing file, a directory, an empty file, a file that
    is not a .npz archive (a text file, other bytes, a single .npy array), a missing key, a
    corrupted member (bad CRC), a member whose .npy header declares non-numeric data, the wrong
    number of axes or more bytes than ``memory.memory_limit`` (checked from the header, before
    anything is allocated), non-finite data, mismatched (S, n)."""
    path = Path(path)
    name = repr(str(path))
    if not path.exists():
        raise ValueError(f"cannot read {name}: no such file")
    if path.is_dir():
        raise ValueError(f"cannot read {name}: it is a directory, not a .npz archive")
    if not path.is_file():
        raise ValueError(f"cannot read {name}: it is not a regular file")
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise ValueError(f"cannot read {name}: {exc.strerror}") from None
    if size == 0:
        raise ValueError(f"cannot read {name}: it is empty (0 bytes)")
    if head.startswith(np.lib.format.MAGIC_PREFIX):
        raise ValueError(f"{name} holds a single array, not a .npz archive with X and Y")
    try:
        raw = open_regular(path)  # the file checked above cannot be swapped for a device
    except OSError as exc:
        raise ValueError(f"cannot read {name}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"cannot read {name}: {exc}") from None
    try:
        archive = zipfile.ZipFile(raw)
    except zipfile.BadZipFile:
        raw.close()
        raise ValueError(
            f"cannot read {name} as a .npz archive: it is not a .npz archive "
            f"({_describe_start(head)})"
        ) from None
    with raw, archive:
        members = archive.namelist()
        arrays = {}
        for role, key, option in (("X", x_key, "--x"), ("Y", y_key, "--y")):
            member = next((m for m in (f"{key}.npy", key) if m in members), None)
            if member is None:
                listed = sorted(m.removesuffix(".npy") for m in members)
                raise ValueError(
                    f"{name} has no array {key!r} for {role} (arrays: "
                    f"{', '.join(map(repr, listed)) or 'none'}); choose one with {option}"
                )
            arrays[role] = _read_member(archive, member, role, key, name)
    x, y = arrays["X"], arrays["Y"]
    if x.shape[:2] != y.shape[:2]:
        raise ValueError(
            f"X and Y must have the same number of sequences and tokens (S, n): X has shape "
            f"{x.shape}, Y has shape {y.shape}"
        )
    return x, y


def _describe_start(head: bytes) -> str:
    """How the start of a file that is not a zip archive reads: as text, or as bytes."""
    try:  # an incremental decoder accepts a character cut off at the end of ``head``
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
    except UnicodeDecodeError:
        text = ""
    if text.strip() and all(c.isprintable() or c.isspace() for c in text):
        return f"it is a text file starting {text.strip().splitlines()[0][:40]!r}"
    return f"it starts with {head[:16]!r}"


def _read_member(
    archive: zipfile.ZipFile, member: str, role: str, key: str, name: str
) -> np.ndarray:
    """Array ``key`` (``role`` X or Y, stored as ``member`` of archive ``name``) as float64.
    Its .npy header is read first and checked, so that nothing is allocated for data that would
    be refused or could not fit: a format version of numeric data, a real numeric dtype, shape
    (S, n, ·) with no empty axis, and the bytes of the data and of its float64 copy within
    ``memory.memory_limit`` (``memory.require_memory``). A member whose CRC or compressed stream
    is damaged is reported as corrupted."""
    where, label = f"member {member} of {name}", f"{role} ({key!r})"
    try:
        check_member(archive.getinfo(member), os.fstat(archive.fp.fileno()).st_size)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    try:
        with archive.open(member) as fp:
            try:
                version = np.lib.format.read_magic(fp)
                if version not in _NPY_HEADERS:
                    raise ValueError(f"unsupported .npy format version {version}")
                shape, _, dtype = _NPY_HEADERS[version](fp)
            except ValueError as exc:
                raise ValueError(f"{where} is not a readable .npy array: {exc}") from None
            real = np.issubdtype(dtype, np.number) or dtype == np.bool_
            if not real or np.issubdtype(dtype, np.complexfloating):
                raise ValueError(f"{label} must be a real numeric array, got dtype {dtype}")
            if len(shape) != 3:
                last = "d" if role == "X" else "d_v"
                raise ValueError(f"{label} must have shape (S, n, {last}), got {shape}")
            if min(shape) < 1:
                raise ValueError(f"{label} is empty: shape {shape}")
            count = math.prod(shape)
            stored = count * dtype.itemsize
            needed = stored + (0 if dtype == np.float64 else 8 * count)
            require_memory(
                f"{label}: {where} declares shape {shape} {dtype} ({stored} bytes); reading it "
                "as float64",
                needed,
            )
            fp.seek(0)
            try:
                a = np.lib.format.read_array(fp, allow_pickle=False)
            except ValueError as exc:  # e.g. fewer bytes than the header declares
                raise ValueError(f"{where} is corrupted: {exc}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        if "CRC" in str(exc):
            problem = "CRC check failed"
        elif isinstance(exc, zlib.error):
            problem = f"its compressed data do not decompress: {exc}"
        else:
            problem = str(exc) or type(exc).__name__
        raise ValueError(f"{where} is corrupted ({problem})") from None
    a = a.astype(np.float64, copy=False)
    bad = int(np.sum(~np.isfinite(a)))
    if bad:
        raise ValueError(f"{label} has {bad} non-finite entries (NaN or inf)")
    return a


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------
def format_report(report: dict[str, Any]) -> str:
    """The human-readable table."""
    spec = report["spectrum"]
    shown = " ".join(f"{v:.4g}" for v in spec[:SHOWN]) + (" …" if len(spec) > SHOWN else "")
    lines = [
        f"rattn rank: {report.get('file', '<arrays>')} (S = {report['S']} sequences, "
        f"n = {report['n']} tokens, d = {report['d']}, d_v = {report['d_v']}), "
        f"attention: {report['attention']}",
        f"operator: {report['operator']}",
        f"spectrum: {shown}",
        "",
        f"{'estimator':<34} value",
        f"{'-' * 34} -----",
    ]
    for name, value in report["estimators"].items():
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"{name:<34} {text}")
    if "naive_static_token_gram_count" in report:
        lines.append(
            f"{'naive_static_token_gram_count':<34} {report['naive_static_token_gram_count']}"
        )
    lines += ["", f"recommended rank: {report['recommended_rank']} ({report['recommended_by']})"]
    if report["recommended_rank"] == 0:
        lines.append(f"  0 means: {report['zero_means']}")
    lines += ["assumptions:", *(f"  - {c}" for c in report["assumptions"])]
    lines += ["caveats:", *(f"  - {c}" for c in report["caveats"] or ["none measured"])]
    if "plot" in report:
        lines.append(f"plot: {report['plot']}")
    return "\n".join(lines)


def require_matplotlib() -> None:
    """Raise a clear ValueError when matplotlib (the ``experiments`` extra) is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(
            "--plot needs matplotlib, which is not installed (pip install 'rattn[experiments]')"
        )


def plot_destination(plot: str | Path, default_name: str) -> Path:
    """Where ``--plot`` writes, decided before the work: the file given, or ``default_name``
    inside it when it names a directory; ValueError when its folder does not exist."""
    path = Path(plot)
    if path.is_dir():
        path = path / default_name
    folder = path.resolve().parent
    if not folder.is_dir():
        raise ValueError(f"--plot {plot}: the folder {folder} does not exist")
    return path


def plot_spectrum(report: dict[str, Any], path: str | Path) -> None:
    """A PNG of the spectrum on a log scale, the floor/threshold, and the recommended rank."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    spec = np.asarray(report["spectrum"])
    k = np.arange(1, spec.size + 1)
    fig, ax = plt.subplots(figsize=(6, 4))
    positive = spec > 0
    ax.semilogy(k[positive], spec[positive], "o-", label=report["spectrum_of"])
    level = report.get("threshold", report.get("noise_floor"))
    if level:
        ax.axhline(
            level, color="gray", ls="--", label="threshold" if "threshold" in report else "floor"
        )
    r = report["recommended_rank"]
    ax.axvline(r + 0.5, color="C3", ls=":", label=f"recommended rank {r}")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("index i")
    ax.set_ylabel("value")
    ax.set_title(f"rattn rank ({report['attention']} attention)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise ValueError(f"cannot write the plot to {str(path)!r}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def run_rank(
    path: str | Path,
    x_key: str = "X",
    y_key: str = "Y",
    attention: str = "linear",
    plot: str | Path | None = None,
    as_json: bool = False,
) -> int:
    """``rattn rank``: load, estimate, print a table (or one JSON document whose key
    ``recommended_rank`` is an integer), optionally write a PNG plot; returns 0. Bad input
    raises ValueError with a one-line message (the CLI turns it into exit status 2)."""
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    if plot is not None:
        require_matplotlib()  # refuse before the work, not after
        plot = plot_destination(plot, "rank.png")
    x, y = load_sequences(path, x_key, y_key)
    report = {"file": str(path), **estimate(x, y, attention)}
    if plot is not None:
        plot_spectrum(report, plot)
        report["plot"] = str(plot)
    print(json.dumps(report, indent=2, ensure_ascii=False) if as_json else format_report(report))
    return 0


def add_rank_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``rattn rank``."""
    parser.add_argument("data", metavar="DATA.npz", help="archive with X (S, n, d), Y (S, n, d_v)")
    parser.add_argument(
        "--x", default="X", dest="x_key", metavar="KEY", help="key of X (default X)"
    )
    parser.add_argument(
        "--y", default="Y", dest="y_key", metavar="KEY", help="key of Y (default Y)"
    )
    parser.add_argument(
        "--attention", choices=ATTENTION, default="linear", help="mixing kind (default linear)"
    )
    parser.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="write a PNG of the spectrum (a folder: rank.png in it)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run_rank_command(args: argparse.Namespace) -> int:
    """``rattn rank`` from parsed arguments (see ``add_rank_arguments``)."""
    return run_rank(args.data, args.x_key, args.y_key, args.attention, args.plot, args.json)
