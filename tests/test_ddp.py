"""DistributedDataParallel with Riemannian attention (DESIGN §7).

Two processes (torch.distributed, gloo backend, CPU, a free port on 127.0.0.1) each train a small
model built on ``RiemannianMultiheadAttention`` (QK and VO frames on St(16, 4), GQA, biases, plain
linear layers around it), wrapped in ``DistributedDataParallel``, for 20 steps of
``build_optimizer(model, RiemannianAdam)`` on their half of a batch of 8 sequences. The parameters
must equal a single-process run on the concatenated batch, in float64, and stay on their
manifolds. Each rank records every 5th step with ``torch_port.audit.record`` into its own file,
and ``rattn audit`` passes both.

Bound. With equal shards, DDP's gradient (the average of the two shard means) is the gradient of
the full-batch mean; the two differ only in the order of summation, by a few units of roundoff u
relative to the gradient's terms. Adam divides by √v̂ + ε, whose scale follows the gradient's, so
the step differs by ~u relative; the frames' polar retraction and AdamW for the rest are
Lipschitz with constant ≈ 1 over these 20 small steps, so differences add. Allowing 100 u per
parameter entry per step (5e-14 for entries of size ≤ 2), 20 steps give DDP_BOUND = 1e-12 on
max |ΔW|. Measured: ~1e-15. The two ranks hold bitwise identical parameters (same reduced
gradient, same arithmetic). Frames: ‖WᵀW − I‖ ≤ 4r(r + 1)u + 2(d + r)r·u = 1.6e-14
(tests/test_torch_nn.py). The test takes ~5–10 s (two interpreter start-ups importing torch).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import run_as_worker, run_workers

torch = pytest.importorskip("torch")

from distributed_helpers import attention_net, needs_gloo, rank_shard, regression_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20
WORLD = 2
BATCH = 8  # split 4 + 4
DDP_BOUND = 1e-12
F64 = torch.float64


def _model():
    return attention_net(n_kv_heads=2, vo_geometry="stiefel", bias=True)


def _data(seed: int = 0):
    return regression_batch(BATCH, 2 + 100 * seed)


def _train(model, x, y, params_owner, trace=None):
    """20 steps; with ``trace``, every 5th recorded by ``torch_port.audit`` (one file a rank)."""
    import contextlib

    from torch_port import RiemannianAdam, audit
    from torch_port.nn import build_optimizer

    opt = build_optimizer(params_owner, RiemannianAdam, lr=1e-2, weight_decay=1e-2)
    recording = audit.record(opt, trace, every=5) if trace else contextlib.nullcontext()
    with recording:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = torch.mean((model(x) - y) ** 2)
            loss.backward()
            opt.step()
    return opt


def _worker(rank: int, out: str) -> None:
    """One DDP process: its shard of the batch, 20 steps, its parameters saved to ``out``."""
    from torch.nn.parallel import DistributedDataParallel

    seed = int(Path(out, "seed").read_text()) if Path(out, "seed").exists() else 0
    model = _model()
    ddp = DistributedDataParallel(model)
    x, y = _data(seed)  # another batch for each seed
    shard = rank_shard(rank, WORLD, BATCH)
    _train(ddp, x[shard], y[shard], ddp, trace=Path(out) / "run.npz")
    torch.save(model.state_dict(), Path(out) / f"rank{rank}.pt")


@needs_gloo
def test_ddp_two_processes_equal_one_process_on_the_concatenated_batch(tmp_path):
    run_workers(__file__, WORLD, tmp_path, timeout=120, what="DDP")

    states = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), name  # ranks agree bitwise

    model = _model()
    x, y = _data()
    _train(model, x, y, model)
    single = model.state_dict()
    worst = max(float((states[0][n] - single[n]).abs().max()) for n in single)
    assert worst <= DDP_BOUND, worst

    # each rank recorded its own trace, and every recorded step is the reference's
    from proofs_checks.audit import replay as audit
    from proofs_checks.audit.report import format_table

    for r in range(WORLD):
        result = audit.audit(tmp_path / f"run.rank{r}.npz")
        assert result["passed"], format_table(result)
        assert sorted({row["step"] for row in result["steps"]}) == [5, 10, 15, 20]

    from torch_port import linalg as tl

    for name in ("attn.w_q", "attn.w_k", "attn.w_v", "attn.w_o"):
        w = states[0][name]
        d, r = w.shape[-2:]
        u = torch.finfo(F64).eps / 2  # the worker processes import this file: keep it light
        bound = 4 * r * (r + 1) * u + 2 * (d + r) * r * u
        assert float(tl.orthonormality_residual(w).max()) <= bound, name


@needs_gloo
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 20))
def test_honest_ddp_runs_pass_over_seeds(tmp_path, seed) -> None:
    """Nineteen more batches: both ranks' traces PASSED, every row passing (seed 0 is the test
    above)."""
    from proofs_checks.audit import replay as audit

    (tmp_path / "seed").write_text(str(seed))
    run_workers(__file__, WORLD, tmp_path, timeout=120, what="DDP")
    for r in range(WORLD):
        result = audit.audit(tmp_path / f"run.rank{r}.npz")
        assert result["verdict"] == "passed", (seed, r, result["counts"])
        assert result["counts"]["pass"] == len(result["steps"])


if __name__ == "__main__":  # a DDP worker: python tests/test_ddp.py RANK PORT OUT_DIR
    sys.path.insert(0, str(ROOT))
    run_as_worker(_worker, WORLD)
