"""Files from strangers and interrupted processes (docs/reliability.md, kinds 1 and 5).

Nothing read from a file runs code: a planted CIFAR-10 batch or checkpoint whose unpickling
would call a function (here: create a marker file) is refused before the call, with the file's
name. A corrupted or truncated checkpoint is refused with its name and the way to start afresh.
Two runs cannot share an output directory; a kill between saving a finished record and removing
the running checkpoint loses no work.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from proofs_checks.cli import main  # noqa: E402
from torch_port.experiments import grokking, patch_data, runs  # noqa: E402
from torch_port.experiments.common import (  # noqa: E402
    Checkpoint,
    CheckpointError,
    RunOptions,
    output_dir,
    release_output_dir,
)


class _Planted:
    """Unpickling this object calls ``Path.touch`` on ``marker``: code from the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _batch(n: int = 4, changes: dict | None = None) -> dict:
    gen = np.random.default_rng(0)
    batch = {
        b"batch_label": b"training batch 1 of 5",
        b"data": gen.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"labels": [int(v) for v in gen.integers(0, 10, n)],
        b"filenames": [b"img%d.png" % i for i in range(n)],
    }
    batch.update(changes or {})
    return batch


# -- CIFAR-10 batches --------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_batch_of_every_protocol_loads(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "data_batch_1"
    batch = _batch()
    path.write_bytes(pickle.dumps(batch, protocol=protocol))
    images, labels = patch_data._read_cifar_batch(path)
    expected = batch[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    assert np.array_equal(images, expected) and labels.tolist() == batch[b"labels"]


@pytest.mark.parametrize(
    "payload",
    [
        lambda m: {b"data": _Planted(m), b"labels": [0]},  # a call through __reduce__
        lambda m: _Planted(m),  # the whole file
        lambda m: {b"data": np.array([_Planted(m)], dtype=object), b"labels": [0]},
    ],
)
def test_planted_cifar_batch_runs_no_code(tmp_path: Path, payload) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps(payload(marker)))
    with pytest.raises(ValueError, match=r"data_batch_1.*not a python pickle batch.*refused"):
        patch_data._read_cifar_batch(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {b"data": np.full((4, 3072), 1e6)},
            r"12288 pixel values are not integers in 0…255 \(e.g. 1000000.0\)",
        ),
        ({b"data": np.full((4, 3072), np.nan)}, r"pixel values are not integers in 0…255"),
        ({b"data": np.full((4, 3072), 0.5)}, r"pixel values are not integers"),
        ({b"labels": ["cat", "dog", "cat", "dog"]}, r"'labels' must be numeric"),
        ({b"labels": [0, 1, 2, 10]}, r"1 labels are not integers in 0…9"),
        ({b"labels": [[0], [1, 2], [3], [4]]}, r"'labels'"),
        ({b"data": np.zeros((4, 10), dtype=np.uint8)}, r"expected \(N, 3072\)"),
    ],
)
def test_bad_cifar_values_are_refused(tmp_path: Path, changes: dict, message: str) -> None:
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps(_batch(changes=changes)))
    with pytest.raises(ValueError, match=message):
        patch_data._read_cifar_batch(path)


# -- checkpoints -------------------------------------------------------------------------------
def _saved(tmp_path: Path) -> Checkpoint:
    ck = Checkpoint(tmp_path, {"steps": 3}, "seed=0")
    ck.save({"model": {"w": torch.arange(6.0)}, "history": [{"step": 1, "loss": 0.5}]})
    return ck


def test_checkpoint_round_trip_holds_numpy_results(tmp_path: Path) -> None:
    ck = Checkpoint(tmp_path, {}, "k")
    ck.save({"done": [{"a": np.float64(0.25), "b": np.arange(3), "t": torch.ones(2)}]})
    done = ck.load()["done"][0]
    assert done["a"] == 0.25 and np.array_equal(done["b"], np.arange(3))
    assert torch.equal(done["t"], torch.ones(2))


@pytest.mark.parametrize("flips", [1, 16])
def test_flipped_bits_are_refused_with_the_file_name(tmp_path: Path, flips: int) -> None:
    ck = _saved(tmp_path)
    blob = bytearray(ck.path.read_bytes())
    gen = np.random.default_rng(flips)
    start = len(Checkpoint.MAGIC) + 65
    for pos in gen.choice(np.arange(start, len(blob)), size=flips, replace=False):
        blob[pos] ^= 1 << int(gen.integers(8))
    ck.path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=rf"{ck.path.name}.*corrupted.*--no-resume"):
        ck.load()


@pytest.mark.parametrize("keep", [0.5, 0.01, 0.0])
def test_truncated_checkpoint_is_refused(tmp_path: Path, keep: float) -> None:
    ck = _saved(tmp_path)
    blob = ck.path.read_bytes()
    ck.path.write_bytes(blob[: int(len(blob) * keep)])
    with pytest.raises(CheckpointError, match=rf"{ck.path.name}.*(truncated|corrupted|header)"):
        ck.load()


def test_planted_checkpoint_with_a_valid_checksum_runs_no_code(tmp_path: Path) -> None:
    """The checksum is no defence against a planted file (anyone can compute it); the
    weights-only loader is: it refuses the planted global before calling it."""
    import hashlib

    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save({"model": _Planted(marker)}, buffer)
    payload = buffer.getvalue()
    ck = Checkpoint(tmp_path, {"steps": 3}, "seed=0")
    digest = hashlib.sha256(payload).hexdigest().encode()
    ck.path.write_bytes(Checkpoint.MAGIC + digest + b"\n" + payload)
    with pytest.raises(CheckpointError, match="does not load as plain data"):
        ck.load()
    assert not marker.exists()


def test_old_style_pickle_checkpoint_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    ck = Checkpoint(tmp_path, {"steps": 3}, "seed=0")
    torch.save({"model": _Planted(marker)}, ck.path)  # what a planted file of the old format is
    with pytest.raises(CheckpointError, match="is not a rattn checkpoint"):
        ck.load()
    assert not marker.exists()


def test_corrupted_checkpoint_on_the_command_line_exits_2(tmp_path: Path, capsys) -> None:
    args = ["experiment", "grokking", "--preset", "smoke", "--out", str(tmp_path), "--json"]
    config = grokking.PRESETS["smoke"]
    cache = runs.run_config(dict(config), ("seeds", "arms", "threshold", "last_fraction"))
    seed, arm = config["seeds"][0], config["arms"][0]
    ck = Checkpoint(tmp_path / "grokking", cache, f"{seed}-{arm}")
    ck.path.parent.mkdir(parents=True)
    ck.path.write_bytes(Checkpoint.MAGIC + b"0" * 64 + b"\nnot a payload")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert ck.path.name in err and "--no-resume" in err and "Traceback" not in err
    assert main([*args, "--no-resume"]) == 0  # starting afresh works


# -- processes ---------------------------------------------------------------------------------
def test_two_runs_cannot_share_an_output_directory(tmp_path: Path) -> None:
    holder = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from torch_port.experiments.common import RunOptions, output_dir
        output_dir(RunOptions(out=Path({str(tmp_path)!r})), "grokking")
        print("locked", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=rf"another run \(pid {proc.pid}\) is writing"):
            output_dir(RunOptions(out=tmp_path), "grokking")
    finally:
        proc.kill()
        proc.wait()
    path = output_dir(RunOptions(out=tmp_path), "grokking")  # released when the holder died
    release_output_dir(path)


def test_kill_between_record_and_cleanup_loses_no_work(tmp_path: Path, monkeypatch) -> None:
    """run_cached saves the finished record before it removes the running checkpoint: a kill
    (here: an exception) in between leaves both, and the next call trains nothing."""
    calls = []

    def train(ck: Checkpoint) -> dict:
        calls.append(1)
        ck.save({"partial": True})
        return {"history": [1, 2, 3]}

    def killed(self: Checkpoint) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "remove", killed)
    with pytest.raises(KeyboardInterrupt):
        runs.run_cached(tmp_path, {"c": 1}, "0-C", True, train)
    monkeypatch.undo()
    assert runs.run_cached(tmp_path, {"c": 1}, "0-C", True, train) == {"history": [1, 2, 3]}
    assert len(calls) == 1
