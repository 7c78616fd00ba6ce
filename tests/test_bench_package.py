"""``proofs_checks.bench`` is a package, one idea per module, whose ``__init__`` keeps the names
the single module had; sizes are refused from the memory estimate before any timing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from proofs_checks import bench, memory
from proofs_checks.bench import geometries, port, stiefel
from proofs_checks.cli import main
from reference.environment import COMMON_KEYS

BENCH_DIR = Path(bench.__file__).resolve().parent


def test_every_exported_name_exists() -> None:
    missing = [name for name in bench.__all__ if not hasattr(bench, name)]
    assert not missing
    for name in ("bench_stiefel", "bench_geometries", "bench_port", "check_port_sizes"):
        assert callable(getattr(bench, name))


def test_modules_stay_small() -> None:
    for path in BENCH_DIR.glob("*.py"):
        assert len(path.read_text(encoding="utf-8").splitlines()) < 450, path.name


def _no_timing(*args, **kwargs):
    pytest.fail("timing started although the sizes were refused")


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("stiefel", ["--d", "16", "--r", "4"]),
        ("geometries", ["--m", "8", "--n", "6", "--r", "2"]),
        ("port", ["--d", "16", "--r", "4"]),
    ],
)
def test_refused_before_any_timing(name, argv, monkeypatch, capsys) -> None:
    monkeypatch.setattr(memory, "memory_limit", lambda: (1000, "a test limit"))
    for module in (stiefel, geometries, port):
        monkeypatch.setattr(module, "_interleaved_rounds", _no_timing)
    assert main(["bench", name, *argv]) == 2
    assert "more than the limit of 1000 bytes" in capsys.readouterr().err


def test_a_result_records_the_common_environment() -> None:
    env = bench.bench_stiefel(8, 2, repeats=1, progress=False)["environment"]
    assert set(COMMON_KEYS) <= set(env) and {"cpu_model", "blas", "env"} <= set(env)


def test_the_audit_benchmark_runs_at_a_small_size_and_says_what_it_measured() -> None:
    """Two layers of two 16×4 frames: every row timed, the overhead formed from the rows as its
    docstring says, the recorded step written (5 arrays of one 16×4 frame, 8 parameters)."""
    pytest.importorskip("torch")
    from proofs_checks.bench.audit import HOOKS_ROW, RECORDED_ROW, STEP_ROW, bench_audit

    result = bench_audit(layers=2, heads=2, d=16, r=4, every=10, frames=1, repeats=3)
    med = {row["name"]: row["median_s"] for row in result["rows"]}
    assert all(v > 0 for v in med.values())
    expected = (9 * med[HOOKS_ROW] + med[RECORDED_ROW] - med[STEP_ROW]) / 10 / med[STEP_ROW]
    assert result["overhead"] == pytest.approx(expected, rel=1e-12)
    assert result["sizes"]["frames"] == 16 and result["fraction_of_frames"] == 0.5
    # x, g, exp_avg, y: 4 frames of 16·4 float32 values; √v: 1 float32 (a zip adds headers)
    assert result["bytes_per_recorded_step"] >= 8 * (4 * 64 * 4 + 4)


def test_the_model_benchmark_counts_gpt2_small_and_runs_at_a_small_size() -> None:
    """GPT-2 small's 12 blocks hold 85.1 M parameters (7.09 M a block), 14.2 M of them in
    W_Q and W_K; a one-block model of width 16 runs both optimizers and forms the ratio from
    its rows."""
    from proofs_checks.bench.model import (
        FLOOR_ROW,
        PASSES_ROW,
        ROUTE_ROW,
        bench_model,
        format_model,
        model_shapes,
    )

    frames, plain = model_shapes()
    count = sum(math.prod(s) for s in frames + plain)
    assert len(frames) == 24 and all(s == (12, 768, 64) for s in frames)
    # W_Q, W_K, W_V, the output (4·768²), the MLP (2·768·3072), two LayerNorms and the
    # output and MLP-output biases (6·768), the q/k/v bias (2304), the MLP bias (3072)
    assert count == 12 * (4 * 768 * 768 + 2 * 768 * 3072 + 6 * 768 + 2304 + 3072) == 85_054_464
    pytest.importorskip("torch")
    result = bench_model(
        repeats=2, progress=False, config={"layers": 1, "d": 16, "heads": 2, "mlp": 32}
    )
    ratio = {t["dtype"]: t["port_over_adamw"] for t in result["targets"]}
    for row in result["rows"]:
        if row["name"].startswith("torch_port"):
            assert row["ratio_to_adamw"] == pytest.approx(ratio[row["dtype"]], rel=1e-12)
    assert result["frame_parameters"] == 2 * 16 * 8 * 2
    assert "target ≤ 1.05" in format_model(result) and "floor / AdamW" in format_model(result)
    for row_name, key in (
        (FLOOR_ROW, "floor_over_adamw"),
        (PASSES_ROW, "floor_with_passes_over_adamw"),
        (ROUTE_ROW, "route_floor_over_adamw"),
    ):
        floor = {r["dtype"]: r["ratio_to_adamw"] for r in result["rows"] if r["name"] == row_name}
        assert {t["dtype"]: t[key] for t in result["targets"]} == floor


def test_the_route_floor_takes_the_steps_route() -> None:
    """One call of ``RouteFloor`` is the step's arithmetic: from a moment m0 (set here to a
    tangent vector other than g, so that β1 and the moment's role are seen), m = β1·m0 +
    (1 − β1)·g with g = P_W(G), A = W − lr·m/RMS(g) per frame, Y = polar(A) and m transported
    to P_Y(m), compared with the same step formed independently (Y = UVᵀ from the SVD of A).
    In float64 both sides agree to rounding: the polar factor of A, κ(A) ≤ 1.1, to about
    κ·r·u ≈ 1e-14, and the rest are a few products of unit-sized frames. Controls: the same
    comparison with β1 taken as 0.1, and without the transport, fails."""
    torch = pytest.importorskip("torch")
    from proofs_checks.bench.floors import PORT_LR, RouteFloor

    gen = torch.Generator().manual_seed(3)
    w = torch.linalg.qr(torch.randn(2, 3, 24, 4, generator=gen, dtype=torch.float64))[0]
    p = torch.nn.Parameter(w.clone())
    p.grad = torch.randn(w.shape, generator=gen, dtype=torch.float64)

    def proj(x, z):
        s = x.transpose(-1, -2) @ z
        return z - x @ (0.5 * (s + s.transpose(-1, -2)))

    m0 = proj(w, torch.randn(w.shape, generator=gen, dtype=torch.float64))
    floor = RouteFloor([p])
    floor.bufs[0][0].copy_(m0.view_as(floor.bufs[0][0]))
    floor.step()
    m_floor, _, _, y_floor = (t.view_as(w) for t in floor.bufs[0])

    g = proj(w, p.grad)
    rms = torch.linalg.vector_norm(g, dim=(-2, -1), keepdim=True) / math.sqrt(24 * 4)

    def step(beta1: float, transport: bool) -> tuple:
        m = beta1 * m0 + (1 - beta1) * g
        u, _, vh = torch.linalg.svd(w - PORT_LR * m / rms, full_matrices=False)
        y = u @ vh
        return y, (proj(y, m) if transport else m)

    def gap(y, m) -> float:
        return max(float((y_floor - y).abs().max()), float((m_floor - m).abs().max()))

    assert gap(*step(0.9, True)) <= 1e-13
    assert gap(*step(0.1, True)) > 1e-3 and gap(*step(0.9, False)) > 1e-3  # controls
    assert float((y_floor - w).abs().max()) > 1e-4  # the step moved the frames
    assert torch.equal(p.detach(), w)  # the floor writes its buffers, not the parameter


TINY = {"layers": 1, "d": 16, "heads": 2, "context": 8, "batch": 2, "vocab": 32}


def test_the_training_benchmark_counts_gpt2_small() -> None:
    """GPT-2 small with its 1,024 positions has 124,439,808 parameters (the published count);
    the benchmark's 512 positions leave out 512 × 768 of them."""
    from proofs_checks.bench.train import SIZES, parameter_count

    full = dict(SIZES["gpt2-small"], context=1024)
    assert parameter_count(full) == 124_439_808
    assert parameter_count(SIZES["gpt2-small"]) == 124_439_808 - 512 * 768


@pytest.mark.parametrize("hide_transformers", [False, True], ids=["hugging face", "built"])
def test_the_training_benchmark_converts_and_times_both_models(
    hide_transformers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With or without ``transformers``: W_Q and W_K of every head are frames (2·d² entries a
    block), the model has the counted parameters, both rows are timed and the ratio is the
    port row's."""
    pytest.importorskip("torch")
    if hide_transformers:
        monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    else:
        pytest.importorskip("transformers")
    from proofs_checks.bench.train import ADAMW_ROW, PORT_ROW, bench_train, parameter_count

    result = bench_train(repeats=1, progress=False, config=TINY)
    assert result["model"] == ("GPT" if hide_transformers else "GPT2LMHeadModel")
    assert result["parameters"] == parameter_count(TINY)
    assert result["frame_parameters"] == 2 * 16 * 16
    rows = {row["name"]: row for row in result["rows"]}
    assert set(rows) == {PORT_ROW, ADAMW_ROW} and rows[ADAMW_ROW]["ratio_to_adamw"] == 1.0
    assert result["target"]["train_over_adamw"] == rows[PORT_ROW]["ratio_to_adamw"] > 0
    assert all(row["median_s"] > 0 and row["peak_bytes"] is None for row in rows.values())


def test_the_training_benchmark_starts_both_from_the_same_weights() -> None:
    """Every weight the converter leaves as it is (all but W_Q and W_K) is the same in both
    candidates, and the port's W_Q, W_K are frames: orthonormal columns per head."""
    torch = pytest.importorskip("torch")
    from proofs_checks.bench.train import ADAMW_ROW, PORT_ROW, _candidate

    port, _ = _candidate(PORT_ROW, TINY, "cpu", 0)
    plain, _ = _candidate(ADAMW_ROW, TINY, "cpu", 0)
    kept = {k: v for k, v in plain.state_dict().items() if "c_attn.weight" not in k}
    converted = port.state_dict()
    assert all(torch.equal(v, converted[k]) for k, v in kept.items())
    frames = [v for k, v in converted.items() if "original" in k and v.ndim == 3]
    assert len(frames) == 2  # W_Q and W_K of the one block, (heads, d, d/heads) each
    eye = torch.eye(TINY["d"] // TINY["heads"])
    assert all(
        torch.allclose(f.mT @ f, eye.expand(TINY["heads"], -1, -1), atol=1e-6) for f in frames
    )
    values = converted["transformer.h.0.attn.c_attn.parametrizations.weight.original2"]
    # W_V as it was (stored (out, in), as nn.Linear does; GPT-2's Conv1D holds (in, out))
    assert torch.equal(values, plain.state_dict()["transformer.h.0.attn.c_attn.weight"][:, 32:].T)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "huge"], "--size must be one of small, gpt2-small, got 'huge'"),
        (["--device", "tpu"], "unknown device 'tpu'; use cpu or cuda"),
    ],
)
def test_the_training_benchmark_refuses_bad_options(argv, message, capsys) -> None:
    pytest.importorskip("torch")
    assert main(["bench", "train", "--repeats", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_training_benchmark_is_refused_beyond_memory(monkeypatch, capsys) -> None:
    monkeypatch.setattr(memory, "memory_limit", lambda: (1000, "a test limit"))
    assert main(["bench", "train", "--size", "gpt2-small"]) == 2
    assert "bench train needs about" in capsys.readouterr().err
