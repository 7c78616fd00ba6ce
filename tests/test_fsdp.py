"""FSDP2 (``torch.distributed.fsdp.fully_shard``) with Riemannian attention (DESIGN §7).

Two processes (gloo, CPU, a free port on 127.0.0.1) train a small model under ``fully_shard``:
two ``RiemannianMultiheadAttention`` modules — Stiefel frames on QK with a block R1 point on VO
under GQA, a P3 point on QK with frames on VO — and a stack of frames (2 layers × 4 heads) of the
model itself, every one sharded along its leading (layer/head) dimension, so that each rank
steps its own whole frames and points. After 20 steps of ``build_optimizer(model,
RiemannianAdam)`` on each rank's half of a batch of 8 sequences, the gathered parameters must
equal a single-process run on the whole batch, in float64, and stay on their manifolds. A
checkpoint written with ``torch.distributed.checkpoint`` after 10 steps and loaded into a fresh
sharded model and optimizer must continue to the same parameters, bitwise. The bytes the
optimizer's step sends are counted.

Bound (as tests/test_ddp.py). FSDP2's gradient, the average of the ranks' shard means
(reduce-scatter), is the gradient of the full-batch mean up to the order of summation, a few u
relative; the steps differ by ~u relative and add over 20 steps: FSDP_BOUND = 1e-12 on
max |ΔW| for entries of size ≤ 2 (100 u per entry per step). Frames: ‖WᵀW − I‖ ≤ 4r(r + 1)u +
2(d + r)r·u (tests/test_torch_nn.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_as_worker, run_workers

torch = pytest.importorskip("torch")

from distributed_helpers import needs_gloo, rank_shard, regression_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS, RESUME_AT = 20, 10
WORLD = 2
BATCH = 8  # split 4 + 4
FSDP_BOUND = 1e-12
F64 = torch.float64


def _model():
    from torch_port import Stiefel
    from torch_port.nn import RiemannianMultiheadAttention

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            gen = torch.Generator().manual_seed(1)
            kw = dict(generator=gen, dtype=F64)
            self.inp = torch.nn.Linear(3, 16, dtype=F64)
            self.a1 = RiemannianMultiheadAttention(
                16, 4, n_kv_heads=2, vo_geometry="block_fixed_rank_embedded", bias=True, **kw
            )
            self.a2 = RiemannianMultiheadAttention(
                16, 4, qk_geometry="stiefel_pair", vo_geometry="stiefel", **kw
            )
            frames = Stiefel(16, 4).random_point(gen, batch_shape=(2, 4), dtype=F64)
            self.stack = torch.nn.Parameter(frames)  # (layers, heads, d, r)
            self.single = torch.nn.Parameter(Stiefel(16, 4).random_point(gen, dtype=F64))
            # declared by the module: survives fully_shard's new parameters
            self.frame_geometries = {"stack": "stiefel", "single": "stiefel"}
            self.out = torch.nn.Linear(16, 1, dtype=F64)

        def forward(self, x):
            h = self.inp(x)
            h = h + self.a1(h, is_causal=True)
            h = h + self.a2(h, is_causal=True)
            h = h + torch.einsum("btd,lhdk,lhek->bte", h, self.stack, self.stack) / 8
            h = h + (h @ self.single) @ self.single.T / 2
            return self.out(h).squeeze(-1)

    return Net()


def _data():
    return regression_batch(BATCH)


def _steps(model, opt, x, y, n):
    for _ in range(n):
        opt.zero_grad()
        loss = torch.mean((model(x) - y) ** 2)
        loss.backward()
        opt.step()


def _optimizer(model):
    from torch_port import RiemannianAdam
    from torch_port.nn import build_optimizer

    return build_optimizer(model, RiemannianAdam, lr=1e-2, weight_decay=1e-2)


def _sharded():
    """Frames sharded both ways: ``stack`` and a1's along their heads or layers (dim 0), a2's
    VO frames and ``single`` along their rows d (a2's P3 point along its heads)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    model = _model()
    rows = {id(model.a2.w_v), id(model.a2.w_o)}
    fully_shard(model.a1)
    fully_shard(model.a2, shard_placement_fn=lambda p: Shard(1) if id(p) in rows else None)
    fully_shard(model)  # single: (d, r), Shard(0) = its rows
    return model


def _worker(rank: int, out: str) -> None:
    """One FSDP2 process: 20 steps on its half of the batch with a checkpoint after 10; then a
    fresh model resumed from the checkpoint; full state dicts and byte counts saved to out."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from test_host_reads import counted_reads
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_state_dict,
    )

    x, y = _data()
    shard = rank_shard(rank, WORLD, BATCH)
    x, y = x[shard], y[shard]
    model = _sharded()
    opt = _optimizer(model)
    # the bytes the optimizer's step sends (all-reduces), counted over one step
    sent = []
    all_reduce = dist.all_reduce

    def counting(t, *args, **kwargs):
        sent.append(t.numel() * t.element_size())
        return all_reduce(t, *args, **kwargs)

    _steps(model, opt, x, y, RESUME_AT - 1)
    opt.zero_grad()
    torch.mean((model(x) - y) ** 2).backward()
    dist.all_reduce = counting
    try:
        with counted_reads() as reads:
            opt.step()
    finally:
        dist.all_reduce = all_reduce
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"{out}/ckpt")
    _steps(model, opt, x, y, STEPS - RESUME_AT)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    final = get_model_state_dict(model, options=full)

    resumed = _sharded()
    opt2 = _optimizer(resumed)
    model_sd, optim_sd = get_state_dict(resumed, opt2)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=f"{out}/ckpt")
    set_state_dict(resumed, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    _steps(resumed, opt2, x, y, STEPS - RESUME_AT)
    again = get_model_state_dict(resumed, options=full)
    # control: the rows' projection without the sum over ranks is another map
    from torch_port.optim.points import Geometries

    group = opt.param_groups[[g.get("geometry") for g in opt.param_groups].index("stiefel")]
    sharded = Geometries().stiefel(group, model.single)
    alone = Geometries().stiefel(group, torch.empty(16, 4, dtype=F64))
    w = model.single.to_local().detach()
    g = torch.randn(w.shape, dtype=F64, generator=torch.Generator().manual_seed(rank))
    control = float(
        (sharded.egrad_to_rgrad((w,), (g,))[0] - alone.egrad_to_rgrad((w,), (g,))[0]).abs().max()
    )
    if rank == 0:
        torch.save({"final": final, "resumed": again}, Path(out) / "states.pt")
        locals_ = {n: list(p.to_local().shape) for n, p in model.named_parameters()}
        report = {"sent": sent, "local": locals_, "control": control, "reads": dict(reads.sites)}
        Path(out, "bytes.json").write_text(json.dumps(report))


@needs_gloo
def test_fsdp2_two_processes_equal_one_process_and_resume_bitwise(tmp_path):
    run_workers(__file__, WORLD, tmp_path, timeout=240, what="FSDP")

    saved = torch.load(tmp_path / "states.pt", weights_only=True)
    final, resumed = saved["final"], saved["resumed"]
    for name in final:  # resumed from the checkpoint: bitwise the uninterrupted run
        assert torch.equal(final[name], resumed[name]), name

    model = _model()
    opt = _optimizer(model)
    x, y = _data()
    _steps(model, opt, x, y, STEPS)
    single = model.state_dict()
    assert set(single) == set(final)
    worst = max(float((final[n] - single[n]).abs().max()) for n in single)
    assert worst <= FSDP_BOUND, worst
    # control: the two runs are not trivially equal (the frames moved)
    assert float((single["stack"] - _model().stack.detach()).abs().max()) > 1e-3

    # each rank held half the heads (or layers) of some frames, half the rows of the others
    report = json.loads((tmp_path / "bytes.json").read_text())
    assert report["local"]["stack"] == [1, 4, 16, 4]
    assert report["local"]["a1.w_q"] == [2, 16, 4]
    assert report["local"]["a2.w_v"] == [4, 8, 4] and report["local"]["single"] == [8, 4]
    # what the optimizer's step sends: per row-sharded frame tensor of n frames its r×r
    # products (WᵀG, the Gram of the retraction, Yᵀm: 3·n·r² float64) and its n squared norms
    # (Adam's), never a frame; then the step's conditions, one int32 for the gradients'
    # finiteness and one per point (8: stack, single, a1's two QK frames and VO point, a2's QK
    # point and two VO frames), which every rank must agree on
    per_frames = [8 * n * (3 * 4 * 4 + 1) for n in (4, 4, 1)]  # a2.w_v, a2.w_o, single
    assert sorted(report["sent"][:-1]) == sorted(
        8 * n * k for n in (4, 4, 1) for k in (16, 1, 16, 16)
    ), report["sent"]
    assert report["sent"][-1] == 4 * (1 + 8)
    # the step reads once, beside torch's AdamW of the plain parameters (their CPU step
    # counts) and the careful recomputation of the points whose conditions failed
    reads = {k: v for k, v in report["reads"].items() if k != "careful recomputation"}
    assert reads == {"deferred.py:which_hold": 1, "optimizer.py:_adamw": 14}, reads
    assert sum(report["sent"]) == sum(per_frames) + 4 * (1 + 8)
    assert report["control"] > 1e-3  # the sums over ranks are what makes it the same step

    from torch_port import linalg as tl

    for name in ("stack", "single", "a1.w_q", "a1.w_k", "a2.w_v", "a2.w_o"):
        w = final[name]
        d, r = w.shape[-2:]
        u = torch.finfo(F64).eps / 2
        bound = 4 * r * (r + 1) * u + 2 * (d + r) * r * u
        assert float(tl.orthonormality_residual(w).max()) <= bound, name


@needs_gloo
def test_columns_and_factor_rows_sharded_are_refused(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from torch_port import RiemannianAdam, Stiefel

    store = dist.FileStore(str(tmp_path / "s"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        holder = torch.nn.Module()
        holder.w = torch.nn.Parameter(Stiefel(16, 4).random_point(dtype=F64))
        fully_shard(holder, shard_placement_fn=lambda p: Shard(1))  # along the columns r
        with pytest.raises(ValueError, match=r"placements \(Shard\(dim=1\),\).*or the rows"):
            RiemannianAdam([{"params": [holder.w], "geometry": "stiefel"}])
        rows = torch.nn.Module()
        rows.w = torch.nn.Parameter(Stiefel(16, 4).random_point(dtype=F64))
        fully_shard(rows)  # along the rows d: accepted, but not under the QR retraction
        RiemannianAdam([{"params": [rows.w], "geometry": "stiefel"}])
        with pytest.raises(ValueError, match=r"Shard\(dim=0\).*leading \(layer/head\) dims are"):
            RiemannianAdam([{"params": [rows.w], "geometry": "stiefel", "retraction": "qr"}])
        from torch_port.nn import RiemannianMultiheadAttention, build_optimizer

        r1 = RiemannianMultiheadAttention(16, 4, qk_geometry="fixed_rank_embedded", dtype=F64)
        fully_shard(r1, shard_placement_fn=lambda p: Shard(1))  # the factors' rows
        with pytest.raises(ValueError, match=r"'w_q'.*need whole rows"):
            build_optimizer(r1, lr=1e-3)
    finally:
        dist.destroy_process_group()


@needs_gloo
def test_a_model_wrapped_before_conversion_is_refused_by_name(tmp_path):
    """riemannian_attention on a model DDP or fully_shard already wraps: refused with "convert
    before wrapping" (DDP would fail at its second step, FSDP2 would convert one rank's shard),
    and the model is left as it was; converted first and wrapped after, it trains."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from torch_port.convert import riemannian_attention

    class SelfAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(16, 4, dtype=F64)

        def forward(self, x):
            return self.attn(x, x, x)[0]

    def model():
        torch.manual_seed(0)
        return SelfAttention()

    store = dist.FileStore(str(tmp_path / "s"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(model())
        with pytest.raises(ValueError, match="DistributedDataParallel: convert before wrapping"):
            riemannian_attention(wrapped, "stiefel")
        assert not any("parametrizations" in n for n, _ in wrapped.named_parameters())
        sharded = model()
        fully_shard(sharded)
        with pytest.raises(ValueError, match=r"fully_shard \(parameter 'attn.in_proj_weight'"):
            riemannian_attention(sharded, "stiefel")
        ordered = model()
        riemannian_attention(ordered, "stiefel")  # convert, then wrap
        ddp = torch.nn.parallel.DistributedDataParallel(ordered)
        from torch_port.nn import build_optimizer

        opt = build_optimizer(ddp, lr=1e-2)
        x = torch.randn(5, 2, 16, dtype=F64)
        for _ in range(2):  # DDP's reducer fails at the second step when wrapped first
            opt.zero_grad()
            ddp(x).square().sum().backward()
            opt.step()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # an FSDP worker: python tests/test_fsdp.py RANK PORT OUT_DIR
    sys.path.insert(0, str(ROOT))
    run_as_worker(_worker, WORLD)
