"""The corpora of the language-modelling experiment (``lm``): bytes as tokens, split and windowed.

Default corpus: the Python standard library's sources (``.py`` files under
``sysconfig.get_paths()["stdlib"]``, ``site-packages``/``dist-packages``/``__pycache__`` left
out, directories walked in sorted order, files joined by a newline) up to ``corpus_bytes``
bytes (``stdlib_corpus``); ``--corpus FILE`` reads the first ``corpus_bytes`` bytes of that
file instead (``file_corpus``). ``load_corpus`` splits the bytes: the last ``val_fraction`` is
the validation split. Training batches are random windows of ``context + 1`` bytes drawn from a
generator (``train_batch``); validation uses fixed windows spread evenly over the validation
split (``val_windows``).
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Corpus:
    """The bytes of the corpus split into training and validation tokens (int64 tensors)."""

    train: torch.Tensor
    val: torch.Tensor
    info: dict[str, Any]


def stdlib_corpus(limit: int) -> tuple[bytes, dict[str, Any]]:
    """The first ``limit`` bytes of the standard library's ``.py`` sources joined by newlines:
    directories walked top-down in sorted order (third-party and cache directories left out),
    files in sorted order, so the text depends only on the Python installation."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ValueError(
            f"the default corpus needs the standard library sources, but {str(root)!r} is not "
            "a directory; pass --corpus FILE"
        )
    skip = {"site-packages", "dist-packages", "__pycache__"}
    chunks: list[bytes] = []
    size, files = 0, []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for fname in sorted(f for f in filenames if f.endswith(".py")):
            path = Path(dirpath) / fname
            try:
                text = path.read_bytes()
            except OSError:
                continue
            chunks.append(text + b"\n")
            files.append(path.relative_to(root).as_posix())
            size += len(text) + 1
            if size >= limit:
                break
        if size >= limit:
            break
    if not files:
        raise ValueError(f"no .py files found under {str(root)!r}; pass --corpus FILE")
    data = b"".join(chunks)[:limit]
    info = {
        "source": "stdlib",
        "root": str(root),
        "files": len(files),
        "first_file": files[0],
        "last_file": files[-1],
    }
    return data, info


def file_corpus(path: Path, limit: int) -> tuple[bytes, dict[str, Any]]:
    """The first ``limit`` bytes of ``path``; a missing or unreadable file is a clear error."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"--corpus {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"--corpus {str(path)!r} is not a regular file")
    try:
        with path.open("rb") as fh:
            data = fh.read(limit)
    except OSError as exc:
        raise ValueError(f"--corpus {str(path)!r} cannot be read: {exc.strerror}") from None
    return data, {"source": "file", "path": str(path)}


def load_corpus(corpus: Path | None, config: Mapping[str, Any]) -> Corpus:
    """Bytes → tokens, split so that the last ``val_fraction`` is validation; both splits must
    hold at least one window of ``context + 1`` bytes."""
    limit, ctx, frac = int(config["corpus_bytes"]), int(config["context"]), config["val_fraction"]
    if limit < 1:
        raise ValueError(f"corpus_bytes must be ≥ 1, got {limit}")
    if ctx < 1:
        raise ValueError(f"context must be ≥ 1, got {ctx}")
    if not 0.0 < float(frac) < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {frac}")
    data, info = stdlib_corpus(limit) if corpus is None else file_corpus(corpus, limit)
    n_val = int(len(data) * float(frac))
    n_train = len(data) - n_val
    if n_train < ctx + 1 or n_val < ctx + 1:
        need = math.ceil((ctx + 1) / min(float(frac), 1.0 - float(frac)))
        raise ValueError(
            f"corpus too short: {len(data)} bytes give {n_train} training and {n_val} "
            f"validation bytes, but each split needs at least context + 1 = {ctx + 1} "
            f"(about {need} bytes in all with val_fraction={frac})"
        )
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
    info = {
        **info,
        "bytes": len(data),
        "train_bytes": n_train,
        "val_bytes": n_val,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return Corpus(tokens[:n_train].clone(), tokens[n_train:].clone(), info)


def train_batch(
    train: torch.Tensor, context: int, batch_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows: inputs x = t[s : s + context], targets t[s + 1 : s +
    context + 1], with starts s uniform on [0, len − context − 1] drawn from ``gen``."""
    starts = torch.randint(0, len(train) - context, (batch_size,), generator=gen)
    idx = starts[:, None] + torch.arange(context + 1)
    window = train[idx]
    return window[:, :-1], window[:, 1:]


def val_windows(val: torch.Tensor, context: int, count: int) -> torch.Tensor:
    """``count`` fixed windows of ``context + 1`` tokens, starts spread evenly over the split
    (at most one per start position), shape (count', context + 1)."""
    last = len(val) - context - 1
    k = max(1, min(count, last + 1))
    # round(i·last/(k − 1)) in integers (a float32 linspace rounds past ``last`` above 2²⁴)
    starts = [0] if k == 1 else [(2 * i * last + k - 1) // (2 * (k - 1)) for i in range(k)]
    starts = torch.unique(torch.tensor(starts, dtype=torch.int64))
    return val[starts[:, None] + torch.arange(context + 1)]
