"""``rattn audit`` on traces that are not what the recorder writes: every bad or unreadable trace
exits 2 with one line ``rattn: error: FILE: ...`` (no traceback), a well-formed trace whose step
is wrong exits 1, nothing in a file is ever unpickled; and the recorder keeps a valid file when a
step raises. The second half holds the defects that rewriting a valid trace once found (each a
traceback, a wrong exit code or a wrong trace that passed), now refused."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import warnings
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from proofs_checks.audit import replay as pa  # noqa: E402
from proofs_checks.cli import main  # noqa: E402
from torch_port import audit  # noqa: E402

META = "meta.json"


# -- a valid trace and ways to rewrite it ---------------------------------------------------------
def _record(path, steps: int = 2):
    """Two steps of Riemannian Adam on two frames of St(7, 3) (group 0) and a batch of three
    points of fixed_rank_quotient(5, 4, 2) (group 1): records 0, 1 (step 1) and 2, 3 (step 2)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(7, 3).random_point(gen, (2,)))
    r2 = tp.GEOMETRIES["fixed_rank_quotient"](5, 4, 2)
    a, b = (torch.nn.Parameter(t) for t in r2.random_point(gen, (3,)))
    groups = [
        {"params": [w], "geometry": "stiefel", "param_names": ["w"]},
        {"params": [a, b], "geometry": "fixed_rank_quotient", "param_names": ["a", "b"]},
    ]
    opt = tp.RiemannianAdam(groups, lr=1e-2, trust_radius=0.02)
    with audit.record(opt, path):
        for _ in range(steps):
            opt.zero_grad()
            ((w**3).sum() + (a @ b.transpose(-1, -2)).square().sum()).backward()
            opt.step()
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("base") / "run.npz")


def _read(path):
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads(bytes(arrays.pop(META)).decode()), arrays


def _write(path, meta, arrays, raw: bytes | None = None):
    text = raw if raw is not None else json.dumps(meta).encode()
    np.savez(path, **arrays, **{META: np.frombuffer(text, np.uint8)})
    return path


def _rewrite(base, path, edit):
    """A copy of ``base`` with ``edit(meta, arrays)`` applied (it may return the raw bytes of
    meta.json instead of editing ``meta``)."""
    meta, arrays = _read(base)
    raw = edit(meta, arrays)
    return _write(path, meta, arrays, raw if isinstance(raw, bytes) else None)


def _npy(a) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, a, allow_pickle=False)
    return out.getvalue()


def _zip(base, path, replace: dict[str, bytes | None], extra: dict[str, bytes] | None = None):
    """``base`` re-zipped member by member: each recorder name in ``replace`` (no ``.npy``) given
    those bytes as its member (None: dropped), then the members of ``extra`` added as named."""
    meta, arrays = _read(base)
    members = {k + ".npy": _npy(v) for k, v in arrays.items()}
    members[META + ".npy"] = _npy(np.frombuffer(json.dumps(meta).encode(), np.uint8))
    for name, data in replace.items():
        members.pop(name + ".npy")
        if data is not None:
            members[name + ".npy"] = data
    members.update(extra or {})
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _header(text: str) -> bytes:
    """An npy (version 1.0) header of this text, padded as NumPy pads it."""
    h = text.encode()
    h += b" " * (64 - (10 + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h


def _cli(capsys, path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["audit", str(path), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _assert_refused(capsys, path, *args: str) -> str:
    """Exit 2 and one line ``rattn: error: PATH: ...`` on stderr (no traceback)."""
    rc, _, err = _cli(capsys, path, "--json", *args)
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"rattn: error: {path}"), err
    return lines[0]


def _set(*keys, value):
    def edit(meta, arrays):
        obj = meta
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value

    return edit


def _del(*keys):
    def edit(meta, arrays):
        obj = meta
        for k in keys[:-1]:
            obj = obj[k]
        del obj[keys[-1]]

    return edit


def _arr(name, f):
    def edit(meta, arrays):
        if f is None:
            del arrays[name]
        else:
            arrays[name] = f(arrays[name])

    return edit


def _first(value):
    def f(a):
        a = a.copy()
        a.flat[0] = value
        return a

    return f


S0 = ("steps", 0)
H0 = (*S0, "hyperparameters")
H2 = ("steps", 2, "hyperparameters")
G0 = (*S0, "geometry")


# -- the baseline -------------------------------------------------------------------------------
def test_the_base_trace_and_an_unchanged_copy_pass(base, tmp_path, capsys) -> None:
    assert _cli(capsys, base, "--json")[0] == 0
    copy = _rewrite(base, tmp_path / "copy.npz", lambda m, a: None)
    rc, out, _ = _cli(capsys, copy, "--json")
    assert rc == 0 and json.loads(out)["passed"] is True


# -- bad metadata: exit 2, the file named --------------------------------------------------------
BAD_META = {
    "optimizer unknown": _set("optimizer", value="Foo"),
    "optimizer not a string": _set("optimizer", value=3),
    "no steps": _set("steps", value=[]),
    "steps not a list": _set("steps", value={}),
    "no format": _del("format"),
    "step is a bool": _set(*S0, "step", value=True),
    "step 0": _set(*S0, "step", value=0),
    "step negative": _set(*S0, "step", value=-1),
    "step a float": _set(*S0, "step", value=1.0),
    "step far beyond the state": _set(*S0, "step", value=10**30),
    "record index wrong": _set(*S0, "record", value=5),
    "taken an int": _set(*S0, "taken", value=1),
    "geometry unknown": _set(*G0, "name", value="nope"),
    "geometry name an int": _set(*G0, "name", value=1),
    "sizes missing": _set(*G0, "sizes", value={}),
    "sizes do not match the arrays": _set(*G0, "sizes", value={"d": 9, "r": 3}),
    "sizes r > d": _set(*G0, "sizes", value={"d": 3, "r": 7}),
    "sizes huge": _set(*G0, "sizes", value={"d": 10**12, "r": 3}),
    "size a bool": _set(*G0, "sizes", value={"d": True, "r": 3}),
    "retraction nope": _set(*G0, "options", "retraction", value="nope"),
    "metric nope": _set(*G0, "options", "metric", value="nope"),
    "unknown option": _set(*G0, "options", "zzz", value=1),
    "options a list": _set(*G0, "options", value=[]),
    "factored geometry with Stiefel sizes": _set("steps", 1, "geometry", "name", value="stiefel"),
    "no lr": _del(*H0, "lr"),
    "lr a string": _set(*H0, "lr", value="0.1"),
    "lr negative": _set(*H0, "lr", value=-0.01),
    "lr NaN": _set(*H0, "lr", value=float("nan")),
    "lr inf": _set(*H0, "lr", value=float("inf")),
    "lr null": _set(*H0, "lr", value=None),
    "lr a bool": _set(*H0, "lr", value=True),
    "betas of length 1": _set(*H0, "betas", value=[0.9]),
    "betas of length 3": _set(*H0, "betas", value=[0.9, 0.9, 0.9]),
    "betas a string": _set(*H0, "betas", value="ab"),
    "beta1 = 1": _set(*H2, "betas", value=[1.0, 0.999]),
    "beta2 = 1": _set(*H2, "betas", value=[0.9, 1.0]),
    "no eps": _del(*H0, "eps"),
    "eps negative": _set(*H2, "eps", value=-1e-3),
    "moment nope": _set(*H0, "moment", value="nope"),
    "reduction nope": _set(*H0, "reduction", value="nope"),
    "trust radius a string": _set(*H0, "trust_radius", value="x"),
    "trust radius 0": _set(*H2, "trust_radius", value=0.0),
    "no trust radius": _del(*H0, "trust_radius"),
    "weight decay a list": _set("steps", 1, "hyperparameters", "weight_decay", value=[1]),
    "gradient nope": _set(*S0, "gradient", value="nope"),
    "dtype unknown": _set(*S0, "dtypes", value=["torch.int8"]),
    "no dtypes": _set(*S0, "dtypes", value=[]),
    "elements empty": _set(*S0, "elements", value=[]),
    "elements negative": _set(*S0, "elements", value=[-1, 0]),
    "elements strings": _set(*S0, "elements", value=["a", "b"]),
    "more elements than arrays": _set(*S0, "elements", value=[0, 1, 2]),
    "a state key without arrays": _set(*S0, "state_keys", value=["zzz"]),
    "no state at step 2": _set("steps", 2, "state_keys", value=[]),
    "names a string": _set(*S0, "names", value="w"),
    "params unhashable": _set(*S0, "params", value=[[1]]),
    "meta.json a list": lambda m, a: b"[1, 2]",
    "meta.json not JSON": lambda m, a: b"{",
    "meta.json not UTF-8": lambda m, a: b"\xff\xfe",
}


@pytest.mark.parametrize("case", list(BAD_META))
def test_bad_metadata_is_refused_with_exit_2_naming_the_file(base, tmp_path, capsys, case):
    path = _rewrite(base, tmp_path / "bad.npz", BAD_META[case])
    _assert_refused(capsys, path)


# -- bad arrays: exit 2, the file named -----------------------------------------------------------
BAD_ARRAYS = {
    "no x": _arr("r0/x/0", None),
    "no g": _arr("r0/g/0", None),
    "no y of a taken step": _arr("r0/y/0", None),
    "no second factor of y": _arr("r1/y/1", None),
    "no second factor of x": _arr("r1/x/1", None),
    "no exp_avg": _arr("r2/state/exp_avg/0", None),
    "no sqrt_v": _arr("r2/state/sqrt_v/0", None),
    "no second factor of exp_avg": _arr("r3/state/exp_avg/1", None),
    "an extra exp_avg part": lambda m, a: a.__setitem__(
        "r2/state/exp_avg/1", a["r2/state/exp_avg/0"]
    ),
    "x of int dtype": _arr("r0/x/0", lambda a: a.astype(np.int64)),
    "g of int dtype": _arr("r0/g/0", lambda a: a.astype(np.int64)),
    "y of int dtype": _arr("r0/y/0", lambda a: a.astype(np.int64)),
    "state of int dtype": _arr("r2/state/exp_avg/0", lambda a: a.astype(np.int32)),
    "x complex": _arr("r0/x/0", lambda a: a.astype(np.complex128)),
    "x bool": _arr("r0/x/0", lambda a: a.astype(bool)),
    "x strings": _arr("r0/x/0", lambda a: np.array(["a", "b"])),
    "x a scalar": _arr("r0/x/0", lambda a: np.float64(1.0)),
    "x one element too many": _arr("r0/x/0", lambda a: np.concatenate([a, a[:1]])),
    "x, g, y one element short": lambda m, a: [
        a.__setitem__(f"r0/{w}/0", a[f"r0/{w}/0"][:1]) for w in "xgy"
    ],
    "x and y of the wrong shape": lambda m, a: [
        a.__setitem__(f"r0/{w}/0", a[f"r0/{w}/0"][:, :5]) for w in "xy"
    ],
    "g of the wrong shape": _arr("r0/g/0", lambda a: a[:, :5]),
    "x with a NaN": _arr("r0/x/0", _first(np.nan)),
    "x with an inf": _arr("r0/x/0", _first(np.inf)),
    "a factor of x with a NaN": _arr("r3/x/1", _first(np.nan)),
    "x zero (not a frame)": _arr("r0/x/0", lambda a: 0 * a),
    "a factor of x zero (rank deficient)": _arr("r1/x/0", lambda a: 0 * a),
    "g with a NaN in a taken step": _arr("r0/g/0", _first(np.nan)),
    "g with an inf in a taken step": _arr("r3/g/1", _first(np.inf)),
    "exp_avg with a NaN": _arr("r2/state/exp_avg/0", _first(np.nan)),
    "sqrt_v with an inf": _arr("r3/state/sqrt_v/0", _first(np.inf)),
    "sqrt_v negative": _arr("r2/state/sqrt_v/0", lambda a: -a),
    "sqrt_v of two values per frame": _arr("r2/state/sqrt_v/0", lambda a: np.stack([a, a], 1)),
    "exp_avg of the wrong shape": _arr("r2/state/exp_avg/0", lambda a: a[:, :5]),
    "taken false but y present": _set(*S0, "taken", value=False),
}


@pytest.mark.parametrize("case", list(BAD_ARRAYS))
def test_bad_arrays_are_refused_with_exit_2_naming_the_file(base, tmp_path, capsys, case):
    path = _rewrite(base, tmp_path / "bad.npz", BAD_ARRAYS[case])
    _assert_refused(capsys, path)


# -- well-formed but wrong: exit 1 -----------------------------------------------------------------
WRONG = {
    "y off by 1 in every entry": _arr("r0/y/0", lambda a: a + 1.0),
    "y wildly off": _arr("r0/y/0", lambda a: a * 1e150),
    "y zero": _arr("r0/y/0", lambda a: 0 * a),
    "y with a NaN": _arr("r0/y/0", _first(np.nan)),
    "y with an inf": _arr("r0/y/0", _first(np.inf)),
    "a factor of y with a NaN": _arr("r3/y/1", _first(np.nan)),
    "y off by 1e-6": _arr("r0/y/0", lambda a: a + 1e-6),
    "a factored y off by 1": _arr("r1/y/0", lambda a: a + 1.0),
    "the state before step 2 tampered": _arr("r2/state/exp_avg/0", lambda a: 1.01 * a),
    "sqrt_v before step 2 tampered": _arr("r2/state/sqrt_v/0", lambda a: 1.01 * a),
    "the wrong rule named": _set("optimizer", value="RSGD"),
    "a descent recorded as maximize": _set(*H0, "maximize", value=True),
    "a skipped step with a finite gradient": lambda m, a: (
        m["steps"][0].__setitem__("taken", False),
        a.pop("r0/y/0"),
    ),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_but_well_formed_step_exits_1(base, tmp_path, capsys, case) -> None:
    path = _rewrite(base, tmp_path / "wrong.npz", WRONG[case])
    rc, out, err = _cli(capsys, path, "--json")
    assert rc == 1, err
    assert json.loads(out)["passed"] is False
    rc, out, _ = _cli(capsys, path)  # the table too
    assert rc == 1 and "FAILED" in out


# -- files that are not traces --------------------------------------------------------------------
def test_files_that_are_not_traces_exit_2(base, tmp_path, capsys) -> None:
    raw = base.read_bytes()
    (tmp_path / "dir.npz").mkdir()
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    (tmp_path / "half.npz").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "short.npz").write_bytes(raw[:-10])
    flipped = bytearray(raw)
    flipped[len(raw) // 3] ^= 0xFF
    (tmp_path / "flipped.npz").write_bytes(bytes(flipped))
    for name in ("missing.npz", "dir.npz", "junk.npz", "half.npz", "short.npz", "flipped.npz"):
        _assert_refused(capsys, tmp_path / name)


class _Marker:
    """Unpickling this creates the file ``path``: proof that code from the file ran."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_is_refused_and_never_unpickled(base, tmp_path, capsys) -> None:
    marker = tmp_path / "PWNED"
    with open(tmp_path / "pickle.npz", "wb") as f:
        pickle.dump(_Marker(marker), f)
    _assert_refused(capsys, tmp_path / "pickle.npz")
    meta, arrays = _read(base)
    arrays["r0/x/0"] = np.array([_Marker(marker)], dtype=object)
    _write(tmp_path / "object.npz", meta, arrays)
    _assert_refused(capsys, tmp_path / "object.npz")
    np.savez(tmp_path / "objmeta.npz", **{META: np.array([_Marker(marker)], dtype=object)})
    _assert_refused(capsys, tmp_path / "objmeta.npz")
    assert not marker.exists()


def test_malformed_npy_headers_are_refused(base, tmp_path, capsys) -> None:
    marker = tmp_path / "PWNED"
    for i, text in enumerate(
        [
            "{'descr':'<f8','fortran_order':False,'shape':(-1,),}",
            "{'descr':'<f8','fortran_order':False,'shape':(2.5,),}",
            f"{{'descr':__import__('os').system('touch {marker}'),'fortran_order':False,"
            "'shape':(1,),}",
            "{'descr':'zz','fortran_order':False,'shape':(1,),}",
            "{'descr':'|O','fortran_order':False,'shape':(1,),}",
            "{'descr':'<f8','fortran_order':'yes','shape':(2,7,3),}",
        ]
    ):
        path = _zip(base, tmp_path / f"h{i}.npz", {"r0/x/0": _header(text) + b"\0" * 400})
        _assert_refused(capsys, path)
    assert not marker.exists()


# -- the command, in a process of its own ----------------------------------------------------------
def _rattn(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("rattn")
    if exe is None:
        pytest.skip("the rattn console script is not installed")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def test_the_console_script_refuses_a_bad_trace_without_a_traceback(base, tmp_path) -> None:
    path = _rewrite(base, tmp_path / "bad.npz", _set(*G0, "options", "retraction", value="nope"))
    done = _rattn("audit", str(path), "--json")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"rattn: error: {path}")


# -- the recorder ----------------------------------------------------------------------------------
def test_a_step_that_raises_inside_the_block_leaves_a_valid_trace_of_the_completed_steps(
    tmp_path,
) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(6, 2).random_point(gen, (2,)))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)

    def boom():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"), audit.record(opt, tmp_path / "r.npz") as rec:
        for i in range(4):
            opt.zero_grad()
            (w**3).sum().backward()
            opt.step(boom if i == 2 else None)
    assert rec.close() is None  # closed once, by the block
    trace = pa.load(tmp_path / "r.npz")
    assert [s["step"] for s in trace.meta["steps"]] == [1, 2]
    assert not [k for k in trace.arrays if k.startswith("r2/")]  # nothing of the raised step
    assert pa.audit(tmp_path / "r.npz")["passed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.npz"]  # no temporary file left


def test_a_step_refused_by_the_optimizer_is_not_recorded_and_recording_goes_on(tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(6, 2).random_point(gen, (2,)))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    rec = audit.record(opt, tmp_path / "r.npz")
    for i in range(3):
        opt.zero_grad()
        (w**3).sum().backward()
        if i == 1:  # refused (skip_nonfinite=False): nothing changes, nothing is recorded
            w.grad[0, 0, 0] = float("nan")
            with pytest.raises(ValueError, match="non-finite gradient"):
                opt.step()
            opt.zero_grad()
            (w**3).sum().backward()
        opt.step()
    assert rec.close() == tmp_path / "r.npz"
    assert rec.close() is None
    result = pa.audit(tmp_path / "r.npz")
    assert result["passed"] and sorted({r["step"] for r in result["steps"]}) == [1, 2, 3]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"every": True},
        {"every": 1.5},
        {"every": "2"},
        {"every": 0},
        {"frames": True},
        {"frames": -1},
    ],
)
def test_the_recorder_refuses_bad_arguments_and_leaves_no_file(tmp_path, kwargs) -> None:
    w = torch.nn.Parameter(torch.zeros(2))
    opt = tp.RSGD([w], lr=0.1)
    with pytest.raises(ValueError, match="must be an integer ≥ 1"):
        audit.record(opt, tmp_path / "a.npz", **kwargs)
    assert list(tmp_path.iterdir()) == []


# == defects found by rewriting a valid trace, now refused ====================================
def test_metadata_without_versions_is_refused(base, tmp_path, capsys) -> None:
    _assert_refused(capsys, _rewrite(base, tmp_path / "v.npz", _del("versions")))


def test_a_deeply_nested_meta_json_is_refused(base, tmp_path, capsys) -> None:
    path = _rewrite(base, tmp_path / "deep.npz", lambda m, a: b"[" * 100_000 + b"]" * 100_000)
    _assert_refused(capsys, path)


@pytest.mark.parametrize(
    "where",
    [
        (*H0, "eps"),
        (*H0, "trust_radius"),
        ("steps", 1, "hyperparameters", "weight_decay"),
        ("steps", 2, "step"),
    ],
    ids=["eps", "trust_radius", "weight_decay", "step"],
)
def test_an_integer_too_large_for_a_float_is_refused(base, tmp_path, capsys, where) -> None:
    def edit(meta, arrays):
        _set(*where, value="__BIG__")(meta, arrays)
        return json.dumps(meta).replace('"__BIG__"', "1" + "0" * 400).encode()

    _assert_refused(capsys, _rewrite(base, tmp_path / "big.npz", edit))


def test_names_that_are_not_strings_are_refused_or_printed(base, tmp_path, capsys) -> None:
    path = _rewrite(base, tmp_path / "n.npz", _set(*S0, "names", value=[1]))
    rc, _, err = _cli(capsys, path)
    assert rc in (0, 2), err


def test_an_empty_file_is_refused(tmp_path, capsys) -> None:
    (tmp_path / "empty.npz").write_bytes(b"")
    _assert_refused(capsys, tmp_path / "empty.npz")


def test_the_console_script_refuses_an_empty_file_without_a_traceback(tmp_path) -> None:
    (tmp_path / "empty.npz").write_bytes(b"")
    done = _rattn("audit", str(tmp_path / "empty.npz"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("member", ["r0/x/0", META])
def test_a_huge_declared_array_is_refused(base, tmp_path, capsys, member) -> None:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out,
        {"descr": "|u1" if member == META else "<f8", "fortran_order": False, "shape": (10**14,)},
    )
    path = _zip(base, tmp_path / "huge.npz", {member: out.getvalue() + b"\0" * 64})
    _assert_refused(capsys, path)


@pytest.mark.parametrize("member", ["r0/x/0.npy", "r0/x/0", "r0/y/0.npy", "r2/state/sqrt_v/0.npy"])
def test_a_member_that_is_not_npy_is_refused(base, tmp_path, capsys, member) -> None:
    name = member.removesuffix(".npy")
    path = _zip(base, tmp_path / "raw.npz", {name: None}, {member: b"raw bytes, no npy header"})
    _assert_refused(capsys, path)


@pytest.mark.parametrize(
    "header",
    [
        b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f8' ",
        _header("{'descr':'<f8','fortran_order':False,'shape':(" + "9" * 200 + ",),}"),
    ],
    ids=["unterminated", "huge-literal"],
)
def test_a_garbled_npy_header_is_refused(base, tmp_path, capsys, header) -> None:
    path = _zip(base, tmp_path / "h.npz", {"r0/x/0": header + b"\0" * 400})
    _assert_refused(capsys, path)


def test_duplicate_elements_are_refused(base, tmp_path, capsys) -> None:
    path = _rewrite(base, tmp_path / "dup.npz", _set(*S0, "elements", value=[0, 0]))
    _assert_refused(capsys, path)


def test_parts_the_geometry_does_not_have_are_refused(base, tmp_path, capsys) -> None:
    rng = np.random.default_rng(0)

    def edit(meta, arrays):
        for what in "xgy":
            arrays[f"r0/{what}/1"] = rng.standard_normal(arrays["r0/x/0"].shape)

    _assert_refused(capsys, _rewrite(base, tmp_path / "extra.npz", edit))


@pytest.mark.parametrize("scale", [2.0, 1e6])
def test_a_point_off_its_manifold_does_not_make_any_step_pass(base, tmp_path, capsys, scale):
    rng = np.random.default_rng(0)

    def edit(meta, arrays):
        arrays["r0/x/0"] = scale * arrays["r0/x/0"]
        arrays["r0/y/0"] = np.linalg.qr(rng.standard_normal(arrays["r0/y/0"].shape))[0]

    rc, _, err = _cli(capsys, _rewrite(base, tmp_path / "off.npz", edit), "--json")
    assert rc in (1, 2), err


def test_a_dtype_the_arrays_do_not_have_does_not_loosen_the_bound(base, tmp_path, capsys) -> None:
    def edit(meta, arrays):
        meta["steps"][0]["dtypes"] = ["torch.bfloat16"]
        arrays["r0/y/0"] = arrays["r0/y/0"] + 1e-3

    rc, _, err = _cli(capsys, _rewrite(base, tmp_path / "bf16.npz", edit), "--json")
    assert rc in (1, 2), err


def test_duplicate_zip_members_are_refused(base, tmp_path, capsys) -> None:
    meta, arrays = _read(base)
    path = tmp_path / "dup.npz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile: "Duplicate name"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("r0/y/0.npy", _npy(arrays["r0/y/0"] + 1.0))
            for k, v in arrays.items():
                z.writestr(k + ".npy", _npy(v))
            z.writestr(META + ".npy", _npy(np.frombuffer(json.dumps(meta).encode(), np.uint8)))
    _assert_refused(capsys, path)


def _skipped_run(path, frames: int | None = None, steps: int = 3):
    """skip_nonfinite=True on three frames of St(6, 2); step 2 has a NaN in frame 0 only, so the
    port skips the whole step (every frame)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(6, 2).random_point(gen, (3,)))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2, skip_nonfinite=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NonFiniteGradientWarning
        with audit.record(opt, path, frames=frames):
            for i in range(steps):
                opt.zero_grad()
                (w**3).sum().backward()
                if i == 1:
                    w.grad[0, 0, 0] = float("nan")
                opt.step()
    return path


def test_an_honest_run_with_a_skipped_step_passes(tmp_path, capsys) -> None:
    path = _skipped_run(tmp_path / "skip.npz")
    rc, _, err = _cli(capsys, path, "--json")
    assert rc == 0, err


def test_the_plot_of_a_trace_of_skipped_steps(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    path = _skipped_run(tmp_path / "skip.npz", frames=1, steps=2)
    meta, arrays = _read(path)  # keep only the skipped step 2 (its NaN frame, kept: frame 0)
    meta["steps"] = [dict(meta["steps"][1], record=0)]
    arrays = {k.replace("r1/", "r0/"): v for k, v in arrays.items() if k.startswith("r1/")}
    _write(path, meta, arrays)
    rc, out, _ = _cli(capsys, path, "--json")  # nothing was replayed: nothing was shown
    assert rc == 1 and json.loads(out)["verdict"] == "not auditable"
    rc, out, err = _cli(capsys, path, "--plot", str(tmp_path / "a.png"))
    assert rc == 1 and (tmp_path / "a.png").exists(), err
    assert "NOT AUDITABLE: no step was replayed" in out


def test_a_plot_that_cannot_be_written_exits_2(base, tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    rc, _, err = _cli(capsys, base, "--json", "--plot", str(tmp_path / "no" / "a.png"))
    assert rc == 2 and "a.png" in err, err


def test_recording_to_a_folder_leaves_no_temporary_file(tmp_path) -> None:
    (tmp_path / "out").mkdir()
    w = torch.nn.Parameter(tp.Stiefel(5, 2).random_point(torch.Generator().manual_seed(0)))
    opt = tp.RSGD([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    with pytest.raises(ValueError, match="out: a directory; record"):
        audit.record(opt, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert os.listdir(tmp_path / "out") == []


def _rezip(base, path, *, compression=zipfile.ZIP_STORED, flag_bits=0, declare=None):
    """``base`` re-zipped with every member compressed by ``compression``, with ``flag_bits``
    set (1: "encrypted"), and, with ``declare``, a first member whose central directory claims
    ``declare`` uncompressed bytes."""
    with zipfile.ZipFile(base) as src, zipfile.ZipFile(path, "w") as dst:
        for k, info in enumerate(src.infolist()):
            out = zipfile.ZipInfo(info.filename)
            out.compress_type = compression
            dst.writestr(out, src.read(info))
            dst.filelist[-1].flag_bits |= flag_bits  # in the central directory, which is read
            if k == 0 and declare is not None:
                dst.filelist[-1].file_size = declare
    return path


def _special(kind, tmp_path):
    if kind == "FIFO":
        os.mkfifo(tmp_path / "f.npz")
        return tmp_path / "f.npz"
    if kind == "a link to /dev/zero":
        os.symlink("/dev/zero", tmp_path / "z.npz")
        return tmp_path / "z.npz"
    return "/dev/zero"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda b, p: _rezip(b, p, compression=zipfile.ZIP_BZIP2), "compressed with method 12"),
        (lambda b, p: _rezip(b, p, compression=zipfile.ZIP_LZMA), "compressed with method 14"),
        (lambda b, p: _rezip(b, p, flag_bits=0x1), "is encrypted"),
        (
            lambda b, p: _rezip(b, p, compression=zipfile.ZIP_DEFLATED, declare=2**30),
            "declares 1073741824 bytes, more than",
        ),
        (lambda b, p: _special("/dev/zero", p.parent), "not a regular file"),
        (lambda b, p: _special("a link to /dev/zero", p.parent), "not a regular file"),
        (lambda b, p: _special("FIFO", p.parent), "not a regular file"),
    ],
    ids=["bzip2", "lzma", "encrypted", "deflate declared 1 GiB", "/dev/zero", "link", "FIFO"],
)
def test_files_a_stranger_could_hand_over_are_refused_in_one_line(
    base, tmp_path, capsys, make, message
) -> None:
    """Nothing is decompressed without a bound, read without end, or blocked on: each exits 2
    with one line naming the file and the problem."""
    path = make(base, tmp_path / "bad.npz")
    rc, _, err = _cli(capsys, path)
    assert rc == 2 and message in err and str(path) in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_deflated_trace_is_read(base, tmp_path) -> None:
    """Control: deflate is a trace's other member method, and reads as the stored original."""
    path = _rezip(base, tmp_path / "deflated.npz", compression=zipfile.ZIP_DEFLATED)
    assert pa.audit(path)["verdict"] == pa.audit(base)["verdict"] == "passed"
