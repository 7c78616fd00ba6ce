"""Recording under FSDP2 (``torch_port.audit_layout``): two processes (gloo, CPU) train the model
of tests/test_fsdp.py under ``fully_shard``, with its first attention's VO on Stiefel frames
(frames and P3 points sharded along their heads or layers, VO frames and a single frame along
their rows), and record every step on each rank. Each rank's trace holds its own whole frames
and points, numbered by their place in the whole parameter, and the row-sharded frames gathered
whole (only the kept ones); ``rattn audit`` passes both files, and a point moved in one of them
fails at its step. A block point sharded along its heads is refused at ``record()``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_as_worker, run_workers

torch = pytest.importorskip("torch")

from distributed_helpers import needs_gloo, rank_shard, regression_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4


def _worker(rank: int, out: str) -> None:
    import test_fsdp as f
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from torch_port import audit
    from torch_port.nn import RiemannianMultiheadAttention

    seed = int(Path(out, "seed").read_text()) if Path(out, "seed").exists() else 0
    # another batch (and VO frames) for each seed
    x, y = regression_batch(f.BATCH, 100 + seed) if seed else f._data()
    shard = rank_shard(rank, f.WORLD, f.BATCH)
    model = f._model()
    gen = torch.Generator().manual_seed(3 + seed)
    model.a1 = RiemannianMultiheadAttention(
        16, 4, n_kv_heads=2, vo_geometry="stiefel", generator=gen, dtype=f.F64
    )
    rows = {id(model.a2.w_v), id(model.a2.w_o)}
    fully_shard(model.a1)
    fully_shard(model.a2, shard_placement_fn=lambda p: Shard(1) if id(p) in rows else None)
    fully_shard(model)
    opt = f._optimizer(model)
    with audit.record(opt, Path(out) / "run.npz"):
        f._steps(model, opt, x[shard], y[shard], STEPS)
    if rank == 0:
        local = {n: list(p.to_local().shape) for n, p in model.named_parameters()}
        Path(out, "local.json").write_text(json.dumps(local))


@needs_gloo
def test_each_rank_records_its_whole_frames_and_the_audit_passes(tmp_path) -> None:
    from proofs_checks.audit import replay as pa

    run_workers(__file__, 2, tmp_path, timeout=240, what="FSDP audit")
    seen: dict[str, list[int]] = {}
    for rank in (0, 1):
        path = tmp_path / f"run.rank{rank}.npz"
        result = pa.audit(path)
        assert result["verdict"] == "passed", result["counts"]
        assert {r["step"] for r in result["steps"]} == set(range(1, STEPS + 1))
        for step in pa.load(path).meta["steps"]:
            if step["step"] == 1:
                for name in step["names"]:
                    seen.setdefault(name, []).extend(step["elements"])
    local = json.loads((tmp_path / "local.json").read_text())
    assert local["stack"] == [1, 4, 16, 4] and local["single"] == [8, 4]  # sharded both ways
    # sharded along the heads or layers: each frame of the whole parameter once, over the ranks
    assert sorted(seen["stack"]) == list(range(8))
    assert sorted(seen["a1.w_q"]) == list(range(4))
    # sharded along the rows: gathered whole on each rank
    assert sorted(seen["single"]) == [0, 0] and sorted(seen["a2.w_v"]) == [0, 0, 1, 1, 2, 2, 3, 3]

    # control: the frame after step 2 moved by 1e-6 in rank 1's file fails there
    with np.load(tmp_path / "run.rank1.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(bytes(arrays.pop("meta.json")).decode())
    k = next(i for i, s in enumerate(meta["steps"]) if s["step"] == 2 and "stack" in s["names"])
    y = arrays[f"r{k}/y/0"]
    arrays[f"r{k}/y/0"] = np.stack([np.linalg.qr(a + 1e-6)[0] for a in y])
    edited = tmp_path / "edited.npz"
    np.savez(edited, **arrays, **{"meta.json": np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    assert pa.audit(edited)["first_failure_step"] == 2


@needs_gloo
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 20))
def test_honest_fsdp_runs_pass_over_seeds(tmp_path, seed) -> None:
    """Nineteen more batches and VO frames: both ranks' traces PASSED, every row passing."""
    from proofs_checks.audit import replay as pa

    (tmp_path / "seed").write_text(str(seed))
    run_workers(__file__, 2, tmp_path, timeout=240, what="FSDP audit")
    for rank in (0, 1):
        result = pa.audit(tmp_path / f"run.rank{rank}.npz")
        assert result["verdict"] == "passed", (seed, rank, result["counts"])


@needs_gloo
def test_what_the_recorder_cannot_read_is_refused_at_record(tmp_path) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from torch_port import RiemannianAdam, Stiefel, audit

    store = dist.FileStore(str(tmp_path / "s"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        holder = torch.nn.Module()
        holder.w = torch.nn.Parameter(Stiefel(16, 4).random_point(dtype=torch.float64))
        fully_shard(holder)  # along the rows d
        opt = RiemannianAdam([{"params": [holder.w], "geometry": "stiefel"}], lr=1e-2)
        with pytest.raises(ValueError, match=r"gathered by every rank.*ranks=None"):
            audit.record(opt, tmp_path / "r.npz", ranks=[0])
        from torch_port.nn import RiemannianMultiheadAttention, build_optimizer

        block = RiemannianMultiheadAttention(
            16, 4, vo_geometry="block_fixed_rank_embedded", dtype=torch.float64
        )
        fully_shard(block)  # along the heads
        with pytest.raises(ValueError, match=r"'block_fixed_rank_embedded' point sharded along"):
            audit.record(build_optimizer(block, lr=1e-2), tmp_path / "b.npz")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # a worker: python tests/test_fsdp_audit.py RANK PORT OUT_DIR
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    run_as_worker(_worker, 2)
