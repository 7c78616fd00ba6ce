"""Reliability of the ``rattn`` command line: bad destinations, files, sizes and seeds are refused
before any work with one line on stderr and exit status 2; certificates are written all three or
none; Ctrl-C exits 130 with one line and leaves the previous certificates untouched."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from proofs_checks import bench, certificate, cli, memory
from proofs_checks.certificate import Certificate
from proofs_checks.cli import main, rank
from proofs_checks.cli import parser as cli_parser

CERTIFICATE_FILES = ("certificate.json", "certificate.md", "certificate.tex", "certificate.bib")


def one_error_line(capsys) -> str:
    """stderr of the last call: exactly one line, an error message, no traceback."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rattn: "), err
    assert "Traceback" not in err
    return err


def snapshot(root) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory)."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


def no_checks(*args, **kwargs):
    pytest.fail("the checks ran although the destination is unusable")


# -- certify: the destination is refused before any check runs ------------------------------------
def _out_is_a_file(tmp_path):
    (tmp_path / "out").write_text("x")
    return tmp_path / "out"


def _parent_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    return tmp_path / "file" / "out"


def _target_is_a_directory(name):
    def make(tmp_path):
        (tmp_path / "out" / name).mkdir(parents=True)
        return tmp_path / "out"

    return make


def _not_writable(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(certificate.tempfile, "mkstemp", refuse)
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


DESTINATIONS = {
    "out is a file": (_out_is_a_file, r"'[^']*out': it is a file, not a directory"),
    "parent is a file": (_parent_is_a_file, r"'[^']*file' is a file, not a directory"),
    **{
        f"{name} is a directory": (_target_is_a_directory(name), rf"{name}' is a directory")
        for name in CERTIFICATE_FILES
    },
}


@pytest.mark.parametrize("case", list(DESTINATIONS))
def test_certify_refuses_destination_before_the_checks(case, tmp_path, monkeypatch, capsys):
    make, match = DESTINATIONS[case]
    out = make(tmp_path)
    before = snapshot(tmp_path)
    monkeypatch.setattr(cli, "certify", no_checks)
    assert main(["certify", "RA-7", "--quick", "--out", str(out)]) == 2
    err = one_error_line(capsys)
    assert "cannot write certificates to" in err
    assert re.search(match, err), err
    assert snapshot(tmp_path) == before  # nothing written or changed


def test_certify_refuses_an_unwritable_directory(tmp_path, monkeypatch, capsys):
    out = _not_writable(tmp_path, monkeypatch)
    monkeypatch.setattr(cli, "certify", no_checks)
    assert main(["certify", "RA-7", "--out", str(out)]) == 2
    err = one_error_line(capsys)
    assert f"cannot create files in {str(out)!r} (Permission denied)" in err
    assert list(out.iterdir()) == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores mode bits")
def test_certify_refuses_a_read_only_directory(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o500)
    monkeypatch.setattr(cli, "certify", no_checks)
    try:
        assert main(["certify", "RA-7", "--out", str(out)]) == 2
    finally:
        out.chmod(0o700)
    assert "cannot create files in" in one_error_line(capsys)


@pytest.mark.parametrize("nested", [False, True])
def test_destination_that_can_be_created_is_accepted_and_not_created(tmp_path, nested):
    out = tmp_path / "a" / "b" if nested else tmp_path / "new"
    certificate.check_destination(out)
    assert list(tmp_path.iterdir()) == []  # checked, not created: created only by write


# -- certify: the three files are replaced all together or not at all ------------------------------
def _render_fails(monkeypatch):
    def boom(self):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(Certificate, "to_latex", boom)
    return RuntimeError


def _tex_cannot_be_encoded(monkeypatch):
    monkeypatch.setattr(Certificate, "to_latex", lambda self: "\ud800")  # lone surrogate
    return UnicodeEncodeError


def _interrupted_while_writing_the_tex(monkeypatch):
    calls = []
    real = os.fsync

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 3:  # the third file, certificate.tex, is being written
            raise KeyboardInterrupt
        real(fd)

    monkeypatch.setattr(certificate.os, "fsync", fsync)
    return KeyboardInterrupt


def _rename_fails(monkeypatch):
    def replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(certificate.os, "replace", replace)
    return OSError


FAILURES = {
    "rendering the .tex raises": _render_fails,
    "writing the .tex raises": _tex_cannot_be_encoded,
    "interrupt while writing the .tex": _interrupted_while_writing_the_tex,
    "renaming fails": _rename_fails,
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_write_keeps_the_previous_certificates_on_failure(failure, tmp_path, monkeypatch):
    out = tmp_path / "out"
    Certificate([], seed=1, quick=True).write(out)
    before = snapshot(out)
    assert sorted(before) == sorted(CERTIFICATE_FILES)
    error = FAILURES[failure](monkeypatch)
    with pytest.raises(error):
        Certificate([], seed=2, quick=False).write(out)
    assert snapshot(out) == before  # old three unchanged, no temporary file left


def test_write_replaces_all_three_and_leaves_no_temporary_file(tmp_path):
    out = tmp_path / "out"
    Certificate([], seed=1, quick=True).write(out)
    paths = Certificate([], seed=2, quick=True).write(out)
    assert [p.name for p in paths] == list(CERTIFICATE_FILES)
    assert sorted(p.name for p in out.iterdir()) == sorted(CERTIFICATE_FILES)
    assert '"seed": 2' in (out / "certificate.json").read_text()
    assert "seed 2" in (out / "certificate.md").read_text()
    assert "seed 2" in (out / "certificate.tex").read_text()


# -- Ctrl-C: exit 130, one line, nothing touched ---------------------------------------------------
def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


INTERRUPTS = {
    "certify": (lambda mp: mp.setattr(cli, "certify", _interrupt), ["certify", "RA-7"]),
    "rank": (lambda mp: mp.setattr(cli, "run_rank_command", _interrupt), ["rank", "x.npz"]),
    "bench": (
        lambda mp: mp.setattr(bench, "bench_stiefel", _interrupt),
        ["bench", "stiefel", "--d", "8", "--r", "2"],
    ),
    "geometries": (
        lambda mp: mp.setattr("proofs_checks.geometry_table.describe", _interrupt),
        ["geometries"],
    ),
}


@pytest.mark.parametrize("command", list(INTERRUPTS))
def test_interrupt_exits_130_with_one_line(command, tmp_path, monkeypatch, capsys):
    patch, argv = INTERRUPTS[command]
    out = tmp_path / "out"
    Certificate([], seed=1, quick=True).write(out)
    before = snapshot(out)
    patch(monkeypatch)
    extra = ["--out", str(out)] if command == "certify" else []
    try:
        status = main([*argv, *extra])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main")
    assert status == 130
    assert one_error_line(capsys) == "rattn: interrupted\n"
    assert snapshot(out) == before


def test_interrupt_while_a_bar_is_mid_line_ends_its_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C right after a progress bar was drawn (no newline yet, e.g. inside tqdm's
    constructor, where the bar is drawn before ``with`` can close it): the message still gets a
    line of its own, and ``sys.stderr`` is given back."""
    stderr = sys.stderr

    def drawn_then_interrupted(*args, **kwargs):
        print("\rcertify:   0%|          | 0/138", end="", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "certify", drawn_then_interrupted)
    assert main(["certify", "RA-7", "--out", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err == "\rcertify:   0%|          | 0/138\nrattn: interrupted\n"
    assert sys.stderr is stderr


def test_real_sigint_during_certify(tmp_path):
    """``python -m proofs_checks`` sent SIGINT as soon as its progress bar (on stderr) starts
    to appear, the moment tqdm is still inside its constructor: exit 130, the last line of
    stderr is the message on a line of its own, no traceback, old files kept."""
    out = tmp_path / "out"
    Certificate([], seed=1, quick=True).write(out)
    before = snapshot(out)
    proc = subprocess.Popen(
        [sys.executable, "-m", "proofs_checks", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        # a suite started in the background by a shell inherits SIGINT ignored, and so would
        # the child: give it the default disposition, as a terminal's foreground job has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        seen = b""
        while b"certify" not in seen:
            chunk = proc.stderr.read(1)
            assert chunk, f"no progress bar: {seen!r}"
            seen += chunk
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = (seen + rest).decode()
    assert proc.returncode == 130, err
    assert err.endswith("\nrattn: interrupted\n") and err.count("rattn: interrupted") == 1, err
    assert err.splitlines()[-1] == "rattn: interrupted" and "Traceback" not in err, err
    assert snapshot(out) == before


def test_real_sigint_while_the_command_loads() -> None:
    """The ``rattn`` console script sent SIGINT 0.3 s after it starts, while its modules are
    still being imported (about 2 s, before ``main`` runs): exit 130, one line, no traceback
    (``early_interrupt``)."""
    import shutil

    command = shutil.which("rattn")
    if command is None:
        pytest.skip("the rattn console script is not on PATH")
    proc = subprocess.Popen(
        [command, "geometries"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and err == "rattn: interrupted\n", (proc.returncode, err)


def test_geometries_at_sizes_beyond_memory_are_refused_before_any_work(capsys) -> None:
    assert main(["geometries", "--m", "100000", "--n", "100000", "--r", "50000"]) == 2
    assert re.search(
        r"rattn geometries at m=100000.* needs about .* more than the limit", one_error_line(capsys)
    )


def test_the_geometries_memory_estimate_covers_the_measured_peak() -> None:
    import tracemalloc

    from proofs_checks.geometry_table import describe, describe_bytes

    tracemalloc.start()
    try:
        describe(90, 60, 5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= describe_bytes(90, 60, 5), (peak, describe_bytes(90, 60, 5))


@pytest.mark.parametrize("name", ["results.json", "results.md"])
def test_experiment_refuses_a_results_file_that_is_a_directory_before_training(
    name, tmp_path, capsys
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    (tmp_path / "grokking" / name).mkdir(parents=True)
    argv = ["experiment", "grokking", "--preset", "smoke", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert f"{name}': it exists and is not a regular file" in one_error_line(capsys)
    assert sorted(p.name for p in (tmp_path / "grokking").iterdir()) == [name]  # nothing ran


# -- rank: every unreadable file is named with its problem -----------------------------------------
def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def _good_arrays():
    rng = np.random.default_rng(0)
    return {"X": np.full((20, 6, 4), 1.5), "Y": rng.standard_normal((20, 6, 3))}


def _empty(tmp_path):
    path = tmp_path / "empty.npz"
    path.write_bytes(b"")
    return path


def _directory(tmp_path):
    (tmp_path / "dir.npz").mkdir()
    return tmp_path / "dir.npz"


def _text(tmp_path):
    path = tmp_path / "text.npz"
    path.write_text("S,n,d\n1,2,3\n")
    return path


def _binary(tmp_path):
    path = tmp_path / "pickle.npz"
    path.write_bytes(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94.")
    return path


def _bad_crc(tmp_path):
    path = _npz(tmp_path / "crc.npz", **_good_arrays())
    data = bytearray(path.read_bytes())
    data[data.find(np.float64(1.5).tobytes())] ^= 1  # one bit of X's data, CRC left as it was
    path.write_bytes(bytes(data))
    return path


def _bad_stream(tmp_path):
    path = tmp_path / "stream.npz"
    np.savez_compressed(path, **_good_arrays())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("X.npy")
    data = bytearray(path.read_bytes())
    name_len, extra_len = np.frombuffer(data, "<u2", 2, info.header_offset + 26)  # local header
    start = info.header_offset + 30 + int(name_len) + int(extra_len)
    data[start : start + 8] = b"\xff" * 8  # the start of X's deflate stream
    path.write_bytes(bytes(data))
    return path


def _huge_shape(tmp_path):
    header = io.BytesIO()
    shape = (10**6, 10**6, 10**3)
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("X.npy", header.getvalue() + b"\0" * 64)
        zf.writestr("Y.npy", header.getvalue())
    return path


def _not_npy_member(tmp_path):
    path = tmp_path / "raw.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("X.npy", b"hello, not an array")
        zf.writestr("Y.npy", b"")
    return path


def _bzip2_bomb(tmp_path):
    """bzip2, whose expansion has no bound: refused by its method, whatever its size."""
    path = tmp_path / "bomb.npz"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (2**10, 2**10, 2**7)}
    )
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_BZIP2) as zf:
        with zf.open("X.npy", "w", force_zip64=True) as f:
            f.write(header.getvalue())
            f.write(bytes(2**20))
        zf.writestr("Y.npy", b"")
    return path


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo.npz")
    return tmp_path / "fifo.npz"


def _link_to_zero(tmp_path):
    os.symlink("/dev/zero", tmp_path / "zero.npz")
    return tmp_path / "zero.npz"


FILES = {
    "empty": (_empty, r"'[^']*empty\.npz': it is empty \(0 bytes\)"),
    "bzip2 bomb": (_bzip2_bomb, r"member 'X\.npy' is compressed with method 12"),
    "FIFO": (_fifo, r"'[^']*fifo\.npz': it is not a regular file"),
    "link to /dev/zero": (_link_to_zero, r"'[^']*zero\.npz': it is not a regular file"),
    "directory": (_directory, r"'[^']*dir\.npz': it is a directory"),
    "text": (_text, r"is not a \.npz archive \(it is a text file starting 'S,n,d'\)"),
    "binary": (_binary, r"is not a \.npz archive \(it starts with b'\\x80\\x04\\x95"),
    "bad CRC": (_bad_crc, r"member X\.npy of '[^']*crc\.npz' is corrupted \(CRC check failed\)"),
    "bad deflate stream": (_bad_stream, r"member X\.npy of '[^']*stream\.npz' is corrupted"),
    "huge declared shape": (
        _huge_shape,
        r"member X\.npy of '[^']*huge\.npz' declares shape \(1000000, 1000000, 1000\) float32 "
        r"\(4000000000000000 bytes\).* needs about 12000000000000000 bytes .*more than the limit",
    ),
    "member not .npy": (_not_npy_member, r"member X\.npy of '[^']*' is not a readable \.npy"),
}


@pytest.mark.parametrize("case", list(FILES))
def test_load_sequences_names_the_problem(case, tmp_path):
    make, match = FILES[case]
    with pytest.raises(ValueError, match=match):
        rank.load_sequences(make(tmp_path))


@pytest.mark.parametrize("case", list(FILES))
def test_rank_command_refuses_with_one_line(case, tmp_path, capsys):
    make, match = FILES[case]
    path = make(tmp_path)
    special = not path.is_file() and not path.is_dir()  # a FIFO or a device: not read here
    before = None if special else snapshot(tmp_path)
    assert main(["rank", str(path)]) == 2
    assert re.search(match, one_error_line(capsys))
    assert capsys.readouterr().out == ""
    assert special or snapshot(tmp_path) == before


def test_text_file_is_not_called_pickled(tmp_path):
    with pytest.raises(ValueError) as info:
        rank.load_sequences(_text(tmp_path))
    assert "pickle" not in str(info.value) and "no such file" not in str(info.value)


def test_size_limit_is_checked_from_the_header(tmp_path, monkeypatch):
    """An ordinary archive over a (patched) small limit: refused from its header, with the
    declared shape, its bytes, the bytes with the float64 copy and the limit."""
    arrays = {"X": np.zeros((4, 5, 3), np.float32), "Y": np.zeros((4, 5, 2))}
    path = _npz(tmp_path / "small.npz", **arrays)
    monkeypatch.setattr(memory, "memory_limit", lambda: (300, "a test limit"))
    with pytest.raises(
        ValueError,
        match=r"X \('X'\): member X\.npy .* declares shape \(4, 5, 3\) float32 \(240 bytes\); "
        r"reading it as float64 needs about 720 bytes .*more than the limit of 300 bytes",
    ):
        rank.load_sequences(path)
    monkeypatch.setattr(memory, "memory_limit", lambda: (10**6, "a test limit"))
    x, y = rank.load_sequences(path)
    assert x.dtype == y.dtype == np.float64 and x.shape == (4, 5, 3)


# -- bench: sizes that cannot fit are refused from an estimate -------------------------------------
BENCH_TOO_BIG = {
    "stiefel": ["bench", "stiefel", "--d", "10000000", "--r", "5000"],
    "geometries": ["bench", "geometries", "--m", "10000000", "--n", "10000000", "--r", "500"],
    "port": ["bench", "port", "--d", "10000000", "--r", "5000"],
}


@pytest.mark.parametrize("name", list(BENCH_TOO_BIG))
def test_bench_refuses_sizes_beyond_memory(name, capsys):
    assert main(BENCH_TOO_BIG[name]) == 2
    err = one_error_line(capsys)
    assert f"bench {name} at " in err
    assert "needs about" in err and "bytes" in err and "more than the limit of" in err
    assert "of physical memory" in err or "fallback" in err


@pytest.mark.parametrize("name", list(BENCH_TOO_BIG))
def test_bench_estimate_applies_at_small_sizes(name, monkeypatch, capsys):
    """With a tiny (patched) limit even default-like sizes are refused, before any timing."""
    monkeypatch.setattr(memory, "memory_limit", lambda: (1000, "a test limit"))
    for module in (bench.stiefel, bench.geometries, bench.port):  # each imports it by name
        monkeypatch.setattr(module, "_interleaved_rounds", no_checks)
    argv = {
        "stiefel": ["--d", "16", "--r", "4"],
        "geometries": ["--m", "8", "--n", "6", "--r", "2"],
        "port": ["--d", "16", "--r", "4"],
    }[name]
    assert main(["bench", name, *argv]) == 2
    assert "more than the limit of 1000 bytes (9.31e-07 GiB), a test limit" in one_error_line(
        capsys
    )


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["stiefel", "--d", "8", "--r", "0"], "1 ≤ r ≤ d, got d=8, r=0"),
        (["stiefel", "--d", "-3", "--r", "1"], "1 ≤ r ≤ d, got d=-3, r=1"),
        (["stiefel", "--d", "4", "--r", "5"], "1 ≤ r ≤ d, got d=4, r=5"),
        (["port", "--d", "4", "--r", "5"], "1 ≤ r ≤ d, got d=4, r=5"),
        (["port", "--d", "0", "--r", "0"], "1 ≤ r ≤ d, got d=0, r=0"),
        (["geometries", "--m", "0", "--r", "2"], r"1 ≤ r ≤ min\(m, n\), got m=0, n=512, r=2"),
        (["stiefel", "--d", "8", "--r", "2", "--repeats", "0"], "repeats must be .* got 0"),
    ],
)
def test_bench_refuses_bad_sizes(argv, match, capsys):
    assert main(["bench", *argv]) == 2
    assert re.search(match, one_error_line(capsys))


# -- experiment --seeds: refused at parse time, before torch or any training -----------------------
@pytest.mark.parametrize(
    ("seeds", "match"),
    [
        ("0,0", r"--seeds '0,0' repeats 0"),
        ("3,1,3,1,2", r"repeats 1, 3"),
        ("99999999999999999999", r"0 ≤ s < 2\*\*32 = 4294967296 .*got 99999999999999999999"),
        ("4294967296", r"0 ≤ s < 2\*\*32 .*got 4294967296"),
        ("-1,2", r"0 ≤ s < 2\*\*32 .*got -1"),
        ("1,x", r"comma-separated integers, got '1,x'"),
        ("", r"comma-separated integers, got ''"),
    ],
)
def test_experiment_refuses_bad_seeds_before_anything(seeds, match, tmp_path, monkeypatch, capsys):
    # torch_port.experiments made unimportable: the refusal must come before it is needed
    monkeypatch.setitem(sys.modules, "torch_port.experiments", None)
    out = tmp_path / "results"
    argv = ["experiment", "grokking", "--preset", "smoke", f"--seeds={seeds}", "--out", str(out)]
    assert main(argv) == 2
    assert re.search(match, one_error_line(capsys))
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "seeds"),
    [(None, None), ("0", (0,)), ("2, 0,1", (2, 0, 1)), ("4294967295", (4294967295,))],
)
def test_parse_seeds_accepts_distinct_seeds_in_range(text, seeds):
    assert cli_parser.parse_seeds(text) == seeds
