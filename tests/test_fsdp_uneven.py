"""FSDP2 with a frame tensor of fewer heads than ranks: an empty shard steps.

Two processes (gloo, CPU) train a model whose attention has one key/value head (MQA,
``n_kv_heads=1``) under ``fully_shard``: its key and value frames, (1, 16, 4) each, sharded
along their heads, leave rank 1 an empty (0, 16, 4) shard, and four query heads give each rank
two. Rank 1 has nothing to move in its empty shards, its step counts advance with rank 0's, and
after the steps the gathered parameters equal a single-process run on the whole batch within
FSDP_BOUND (the bound of tests/test_fsdp.py: the ranks' gradients differ from the full batch's
by the order of summation), every frame on its manifold. A rank with an empty shard also
records a trace that ``rattn audit`` accepts (it holds the frames that rank steps).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import run_as_worker, run_workers

torch = pytest.importorskip("torch")

from distributed_helpers import attention_net, needs_gloo, rank_shard, regression_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 5
WORLD = 2
BATCH = 8
FSDP_BOUND = 1e-12
F64 = torch.float64


def _model():
    return attention_net(n_kv_heads=1, vo_geometry="stiefel")


def _data():
    return regression_batch(BATCH)


def _train(model, x, y, trace=None):
    import contextlib

    from torch_port import RiemannianAdam, audit
    from torch_port.nn import build_optimizer

    opt = build_optimizer(model, RiemannianAdam, lr=1e-2)
    with audit.record(opt, trace) if trace else contextlib.nullcontext():
        for _ in range(STEPS):
            opt.zero_grad()
            torch.mean((model(x) - y) ** 2).backward()
            opt.step()
    return opt


def _worker(rank: int, out: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    x, y = _data()
    shard = rank_shard(rank, WORLD, BATCH)
    model = _model()
    fully_shard(model.attn)
    fully_shard(model)
    opt = _train(model, x[shard], y[shard], trace=Path(out) / "run.npz")
    local = {n: list(p.to_local().shape) for n, p in model.named_parameters()}
    counts = sorted(
        {int(s["step"]) for s in opt.state.values() if "step" in s and torch.is_tensor(s["step"])}
    )
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    torch.save({"local": local, "counts": counts}, Path(out) / f"rank{rank}.pt")
    if rank == 0:
        torch.save(full, Path(out) / "final.pt")


@needs_gloo
def test_a_rank_with_an_empty_shard_steps_with_the_others(tmp_path) -> None:
    run_workers(__file__, WORLD, tmp_path, timeout=240, what="FSDP uneven")

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    assert ranks[1]["local"]["attn.w_k"] == [0, 16, 4]  # the case: an empty shard
    assert ranks[0]["local"]["attn.w_k"] == [1, 16, 4]
    assert all(r["counts"] == [STEPS] for r in ranks), [r["counts"] for r in ranks]

    final = torch.load(tmp_path / "final.pt", weights_only=True)
    model = _model()
    x, y = _data()
    _train(model, x, y)
    single = model.state_dict()
    worst = max(float((final[n] - single[n]).abs().max()) for n in single)
    assert worst <= FSDP_BOUND, worst
    # control: the frames moved, so equality is not that of two untouched models
    assert float((single["attn.w_k"] - _model().attn.w_k.detach()).abs().max()) > 1e-3

    from proofs_checks.audit import replay

    for r in range(WORLD):
        result = replay.audit(tmp_path / f"run.rank{r}.npz")
        assert result["verdict"] == "passed", (r, result["counts"])


if __name__ == "__main__":  # a worker: python tests/test_fsdp_uneven.py RANK PORT OUT_DIR
    sys.path.insert(0, str(ROOT))
    run_as_worker(_worker, WORLD)
