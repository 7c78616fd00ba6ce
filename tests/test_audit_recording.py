"""Traces that survive and never harm: every step written before a recording stops (a kill, a
termination, a full disk, no ``close()``) stays auditable and is reported as partial; a
recorder failure never escapes from a step that was applied; a path that exists and is not a
regular file is refused before anything is written."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from proofs_checks.audit import replay as pa  # noqa: E402
from proofs_checks.cli import main  # noqa: E402
from torch_port import audit  # noqa: E402

#: A run of 6 steps that records every step and stops as ``how`` says after step 3.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import torch, torch_port as tp
    from torch_port import audit
    how, path = sys.argv[1], sys.argv[2]
    w = torch.nn.Parameter(tp.Stiefel(7, 3).random_point(torch.Generator().manual_seed(5), (2,)))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    rec = audit.record(opt, path)
    for t in range(1, 7):
        opt.zero_grad()
        (w ** 3).sum().backward()
        opt.step()
        if t == 3:
            if how == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)
            if how == "exit without close":
                os._exit(0)
    """
)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "exit without close"])
def test_a_recording_that_stops_keeps_every_step_written(tmp_path, capsys, how) -> None:
    path = tmp_path / "run.npz"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, how, str(path)], capture_output=True, timeout=120
    )
    expected = {"SIGKILL": -signal.SIGKILL, "SIGTERM": -signal.SIGTERM}.get(how, 0)
    assert done.returncode == expected, done.stderr
    assert not path.exists() and audit.parts_dir(path).is_dir()
    result = pa.audit(path)
    assert result["partial"] and result["verdict"] == "passed"
    assert sorted({r["step"] for r in result["steps"]}) == [1, 2, 3]
    assert main(["audit", str(path)]) == 0
    assert "PARTIAL: the recording was not closed" in capsys.readouterr().out


def _frames():
    gen = torch.Generator().manual_seed(5)
    return torch.nn.Parameter(tp.Stiefel(7, 3).random_point(gen, (2,)))


def test_a_full_disk_stops_the_recording_not_the_step(tmp_path, monkeypatch) -> None:
    """The third step's record cannot be written (ENOSPC): the step is applied all the same,
    a warning says recording stopped, training goes on, and steps 1 and 2 stay auditable."""
    w = _frames()
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    real = audit._write_npz
    calls = []

    def full_disk(path, arrays, meta):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, arrays, meta)

    monkeypatch.setattr(audit, "_write_npz", full_disk)
    rec = audit.record(opt, tmp_path / "run.npz")
    for t in range(1, 6):
        opt.zero_grad()
        (w**3).sum().backward()
        before = w.detach().clone()
        if t == 3:
            with pytest.warns(RuntimeWarning, match="No space left on device"):
                opt.step()
        else:
            opt.step()
        assert not torch.equal(before, w.detach())  # every step was applied
    assert int(opt.state[w]["step"]) == 5 and len(calls) == 3
    result = pa.audit(tmp_path / "run.npz")
    assert result["partial"] and sorted({r["step"] for r in result["steps"]}) == [1, 2]
    assert rec.steps and max(s["step"] for s in rec.steps) == 2


def _fifo(path):
    os.mkfifo(path)
    return path


def _link_to_null(path):
    os.symlink("/dev/null", path)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: _fifo(p / "fifo.npz"), "exists and is not a regular file"),
        (lambda p: _link_to_null(p / "null.npz"), "exists and is not a regular file"),
        (lambda p: p.joinpath("run.npz.parts").mkdir() or p / "run.npz", "unfinished recording"),
        (lambda p: p.joinpath("dir.npz").mkdir() or p / "dir.npz", "a directory"),
    ],
    ids=["FIFO", "link to /dev/null", "unfinished recording", "directory"],
)
def test_a_path_that_is_not_a_new_regular_file_is_refused(tmp_path, make, message) -> None:
    path = make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    opt = tp.RSGD([{"params": [_frames()], "geometry": "stiefel"}], lr=1e-2)
    with pytest.raises(ValueError, match=message):
        audit.record(opt, path)
    assert sorted(os.listdir(tmp_path)) == before


def test_dev_null_is_never_written_over(tmp_path) -> None:
    opt = tp.RSGD([{"params": [_frames()], "geometry": "stiefel"}], lr=1e-2)
    with pytest.raises(ValueError, match="not a regular file"):
        audit.record(opt, "/dev/null")
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_a_compiled_capturable_step_records_and_fullgraph_says_why_not(tmp_path) -> None:
    """``torch.compile(opt.step)`` of the capturable step (trust radius 0.5) records every step
    (the hooks run eagerly, as graph breaks) and passes; with ``fullgraph=True`` there can be no
    graph break, and torch refuses to call the recorder's hooks (Dynamo's ``Unsupported``,
    naming ``torch.compiler.disable``), before any step is taken."""
    import torch_port as tp
    from proofs_checks.audit import replay as pa
    from torch_port import audit

    def run(path, fullgraph):
        gen = torch.Generator().manual_seed(0)
        w = torch.nn.Parameter(tp.Stiefel(7, 3).random_point(gen, (2,)).double())
        opt = tp.RiemannianAdam(
            [{"params": [w], "geometry": "stiefel"}], lr=1e-2, capturable=True, trust_radius=0.5
        )
        step = torch.compile(opt.step, fullgraph=fullgraph)
        with audit.record(opt, path):
            for _ in range(3):
                opt.zero_grad()
                (w**3).sum().backward()
                step()
        return w

    run(tmp_path / "c.npz", fullgraph=False)
    result = pa.audit(tmp_path / "c.npz")
    assert result["verdict"] == "passed" and result["counts"]["pass"] == 6
    torch._dynamo.reset()  # a fresh compile: the one above is cached on the same code
    with pytest.raises(Exception, match=r"compiler\.disable"):
        run(tmp_path / "f.npz", fullgraph=True)
