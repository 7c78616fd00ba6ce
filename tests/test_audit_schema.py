"""One schema, no torch to replay: the trace's reader and validator (``proofs_checks.audit.trace``)
state the layout the recorder writes, the replay reads every layout from the reference, and
``rattn audit`` runs where torch cannot be imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import reference as ref
from proofs_checks import reference_rules
from proofs_checks.audit import rules, trace
from proofs_checks.audit.elements import elements
from proofs_checks.audit.errors import TraceError
from reference import optim as ro

ROOT = Path(__file__).resolve().parents[1]


# -- what a stored array holds (NumPy only) ------------------------------------------------------
#: (declared dtype, stored array, whether the recorder could have written it). bfloat16 keeps 8
#: significand bits (1 + 2^-7 is exact, 1 + 2^-8 is not), float16 11 (1 + 2^-10 and 65504 are
#: exact, 1 + 2^-11 and 1e5, beyond its range, are not).
HOLDS = [
    ("torch.float64", np.array([1.0 + 2.0**-52]), True),
    ("torch.float64", np.array([1.0], np.float32), False),
    ("torch.float32", np.array([1.0 + 2.0**-23], np.float32), True),
    ("torch.float32", np.array([1.0]), False),
    ("torch.bfloat16", np.array([1.0 + 2.0**-7, -3.0, np.inf], np.float32), True),
    ("torch.bfloat16", np.array([1.0 + 2.0**-8], np.float32), False),
    ("torch.bfloat16", np.array([1.0]), False),
    ("torch.float16", np.array([1.0 + 2.0**-10, 65504.0], np.float32), True),
    ("torch.float16", np.array([1.0 + 2.0**-11], np.float32), False),
    ("torch.float16", np.array([1e5], np.float32), False),
    ("torch.int8", np.array([1.0], np.float32), False),
]


@pytest.mark.parametrize(("declared", "stored", "holds"), HOLDS)
def test_a_stored_array_is_checked_against_its_declared_dtype(declared, stored, holds) -> None:
    assert trace._holds(stored, declared) is holds


def test_the_dtype_constants_are_the_dtypes_own() -> None:
    """u and sqrt(ε) of each declared dtype, against torch's finfo where torch is installed."""
    torch = pytest.importorskip("torch")
    from torch_port.geometry import default_atol

    for name, stored in trace.DTYPES.items():
        dtype = getattr(torch, name.removeprefix("torch."))
        assert stored.roundoff == torch.finfo(dtype).eps / 2
        assert stored.accepted == default_atol(dtype)
        assert np.dtype(stored.array).itemsize >= torch.finfo(dtype).bits // 8


def test_the_recorder_writes_the_layout_the_reader_states(tmp_path) -> None:
    pytest.importorskip("torch")
    from torch_port import audit as recorder

    assert (recorder.FORMAT, recorder.META) == (trace.FORMAT, trace.META)
    assert recorder.parts_dir(tmp_path / "run.npz") == trace.parts_dir(tmp_path / "run.npz")


# -- layouts from the reference -------------------------------------------------------------------
def _spec(name: str) -> dict:
    options = {"n_heads": 4, "n_kv_heads": 2} if name.startswith("block_") else {}
    return {"name": name, "sizes": {"m": 6, "n": 5, "r": 2}, "options": options}


@pytest.mark.parametrize("name", sorted(ref.GEOMETRIES))
def test_the_replay_reads_the_ports_layout_from_the_reference(name) -> None:
    """The shapes, block groups and frames the replay reads off the reference geometry are the
    port's (``torch_port.geometries``), and a geometry counts as made of frames (no weight
    decay replayed) exactly where the port says so."""
    pytest.importorskip("torch")
    from torch_port.geometries import GEOMETRIES
    from torch_port.optim import FRAME_GEOMETRIES

    spec = _spec(name)
    el = elements(spec)
    port = GEOMETRIES[name](6, 5, 2, **spec["options"])
    assert el.shapes == tuple(tuple(s) for s in port.point_shapes)
    assert el.n_groups == getattr(port, "n_groups", 0)
    assert el.orthonormal == tuple(port.orthonormal_factors)
    assert hasattr(el.geometry, "project_point") == (name in FRAME_GEOMETRIES)


def test_an_unknown_geometry_is_refused_by_name() -> None:
    with pytest.raises(TraceError, match="unknown geometry 'sphere'"):
        elements({"name": "sphere", "sizes": {"m": 3, "n": 3, "r": 1}, "options": {}})


# -- one preset table ---------------------------------------------------------------------------
def test_one_preset_table_names_the_presets_everywhere() -> None:
    presets = set(ro.PRESET_CHAINS)
    assert presets == set(rules.PRESETS.values())
    assert presets == {n for n, s in reference_rules.RULES.items() if not s.field}
    assert all(callable(getattr(ro, name)) for name in presets)


def _one_step(optimizer: ro.Optimizer, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    st = ref.Stiefel(7, 3)
    x, g = st.random_point(rng), rng.standard_normal((7, 3))
    state = optimizer.init(st, x)
    for _ in range(3):  # three steps, so that the momentum's β shows
        x, state = optimizer.step(st, x, g, state)
    return x


@pytest.mark.parametrize(
    ("group", "preset", "wrong"),
    [
        (
            {"lr": 0.05, "beta": None, "betas": [0.5, 0.999], "c": 1.0},
            ro.riemannian_momentum(0.05, beta=0.5),
            ro.riemannian_momentum(0.05, beta=0.9),
        ),
        (
            {"lr": 0.05, "beta": 0.7, "betas": [0.5, 0.999], "c": 1.0},
            ro.riemannian_momentum(0.05, beta=0.7),
            ro.riemannian_momentum(0.05, beta=0.5),
        ),
        (
            {"lr": 0.05, "betas": [0.8, 0.99], "eps": 1e-8, "trust_radius": 0.01}
            | {"moment": "frame", "reduction": "mean"},
            ro.riemannian_adam(0.05, betas=(0.8, 0.99), trust_radius=0.01),
            ro.riemannian_adam(0.05, betas=(0.8, 0.99)),
        ),
    ],
)
def test_a_recorded_group_replays_as_its_preset(group, preset, wrong) -> None:
    """The chain the replay builds from a group's hyperparameters steps as the preset does
    (bit for bit: the same transformations), and not as a near variant (the control)."""
    optimizer = "RiemannianMomentum" if "c" in group else "RiemannianAdam"
    replayed = ro.Optimizer(rules.preset_chain(optimizer, group), group["lr"])
    assert np.array_equal(_one_step(replayed), _one_step(preset))
    assert not np.allclose(_one_step(replayed), _one_step(wrong), rtol=0, atol=1e-12)


# -- rattn audit without torch -----------------------------------------------------------------
def test_the_audit_package_never_imports_torch() -> None:
    for path in (ROOT / "proofs_checks" / "audit").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m.split(".")[0] for m in names} & {"torch", "torch_port"}, path


#: Runs ``rattn audit`` with every import of torch (and of the port) refused.
WITHOUT_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torch_port", "geoopt"):
            raise ImportError(f"{name} is not installed here")

sys.meta_path.insert(0, NoTorch())
from proofs_checks.cli import main
code = main(sys.argv[1:])
assert "torch" not in sys.modules
sys.exit(code)
"""


def _audit_without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, "audit", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_rattn_audit_runs_where_torch_cannot_be_imported(tmp_path) -> None:
    """A trace of Stiefel frames and of fixed-rank points, recorded with torch, is replayed by a
    process that cannot import torch: PASSED (exit 0); claimed with an lr 10% high, FAILED
    there (exit 1)."""
    torch = pytest.importorskip("torch")
    import torch_port as tp
    from torch_port import audit as recorder

    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(7, 3).random_point(gen, (2,)).double())
    r1 = tp.GEOMETRIES["fixed_rank_embedded"](6, 5, 2)
    u, s, v = (torch.nn.Parameter(t.double()) for t in r1.random_point(gen, (2,)))
    groups = [
        {"params": [w], "geometry": "stiefel"},
        {"params": [u, s, v], "geometry": "fixed_rank_embedded"},
    ]
    opt = tp.RiemannianAdam(groups, lr=1e-2)
    path = tmp_path / "run.npz"
    with recorder.record(opt, path):
        for _ in range(3):
            opt.zero_grad()
            ((w**3).sum() + ((u @ s @ v.transpose(-1, -2)) ** 2).sum()).backward()
            opt.step()

    honest = _audit_without_torch(str(path))
    assert honest.returncode == 0 and "PASSED" in honest.stdout, honest.stdout + honest.stderr
    claimed = _audit_without_torch(str(path), "--rule", "riemannian_adam", "--set", "lr=0.011")
    assert claimed.returncode == 1 and "FAILED" in claimed.stdout, claimed.stdout + claimed.stderr
