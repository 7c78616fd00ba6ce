"""PORT-9's two-process check: FSDP2 (``fully_shard``) over two gloo processes of this machine
steps a model as one process steps it on the whole batch.

The workers are fresh interpreters (``python -c``) that meet through a file store in a temporary
folder (no port is chosen). Each trains on its half of the batch; rank 0 writes the gathered
parameters as an ``.npz``, read back without pickle. The model holds each of the layouts the
optimizer steps without gathering a frame: a frame whose rows are sharded (``RowShardedFrames``,
per-frame state replicated by ``sharding.wrap``), a stack of frames sharded along its layers,
and an attention module's QK frames and block R1 point under GQA sharded along their heads
(``sharding.local_heads``; the point's tangent state stored as lists by ``sharding.store``).

Under the call tracing of ``proofs_checks/dev/call_trace.py`` (``CHILD_TRACE`` set to a folder)
each worker also writes the functions it called there, so that the call map charges them to
PORT-9 and its implementation hash covers them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from proofs_checks.bounds import sharded_run_tolerance
from proofs_checks.propositions.port_refusals import Row, misbehaviour
from proofs_checks.registry import Context, Outcome

#: Ranks, steps, the batch (split 4 + 4) and the hyperparameters of the run.
WORLD, FSDP_STEPS, BATCH, FSDP_LR, FSDP_DECAY = 2, 5, 8, 1e-2, 1e-2
#: How long the workers may take (seconds) before the check fails as hung.
WORKER_TIMEOUT = 300.0
#: The environment variable naming the folder where a traced worker lists its calls.
CHILD_TRACE = "RATTN_TRACE_CHILD_CALLS"
#: The largest |entry| of the parameters the bound assumes (frames ≤ 1; linear layers and the
#: block point's factors, drawn at the module's scale, ≤ 2).
ENTRY_SIZE = 2.0


def gloo_missing() -> str | None:
    """Why the two-process check cannot run here (torch.distributed or its gloo backend
    missing), or None."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return "needs torch.distributed with the gloo backend"
    return None


def _model() -> Any:
    """Linear(3, 16); attention with QK frames and a block R1 point on VO (4 heads over 2
    key/value heads); a stack of frames (2 layers × 4 heads), a batch of 3 frames and one
    frame, each used as h ↦ h W Wᵀ; Linear(16, 1). float64, drawn from fixed seeds."""
    import torch

    from torch_port import Stiefel
    from torch_port.nn import RiemannianMultiheadAttention

    f64 = torch.float64

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            gen = torch.Generator().manual_seed(1)
            self.inp = torch.nn.Linear(3, 16, dtype=f64)
            self.attn = RiemannianMultiheadAttention(
                16,
                4,
                n_kv_heads=2,
                vo_geometry="block_fixed_rank_embedded",
                generator=gen,
                dtype=f64,
            )
            st = Stiefel(16, 4)
            self.stack = torch.nn.Parameter(st.random_point(gen, batch_shape=(2, 4), dtype=f64))
            self.rows = torch.nn.Parameter(st.random_point(gen, batch_shape=(3,), dtype=f64))
            self.single = torch.nn.Parameter(st.random_point(gen, dtype=f64))
            self.frame_geometries = {"stack": "stiefel", "rows": "stiefel", "single": "stiefel"}
            self.out = torch.nn.Linear(16, 1, dtype=f64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            h = h + self.attn(h, is_causal=True)
            h = h + torch.einsum("btd,lhdk,lhek->bte", h, self.stack, self.stack) / 8
            h = h + torch.einsum("btd,ndk,nek->bte", h, self.rows, self.rows) / 6
            h = h + (h @ self.single) @ self.single.T / 2
            return self.out(h).squeeze(-1)

    return Net()


def _train(model: Any, x: Any, y: Any, during: Any = None) -> Any:
    """``FSDP_STEPS`` steps of ``build_optimizer(model, RiemannianAdam)`` on the mean squared
    error of (x, y), the steps (not the optimizer's construction) inside the context manager
    ``during`` when given; the optimizer."""
    import torch

    from torch_port import RiemannianAdam
    from torch_port.nn import build_optimizer

    opt = build_optimizer(model, RiemannianAdam, lr=FSDP_LR, weight_decay=FSDP_DECAY)
    with during if during is not None else contextlib.nullcontext():
        for _ in range(FSDP_STEPS):
            opt.zero_grad()
            torch.mean((model(x) - y) ** 2).backward()
            opt.step()
    return opt


def state_shapes(model: Any, opt: Any) -> dict[str, dict[str, Any]]:
    """The shape of every optimizer state entry, by parameter name and key (a DTensor's
    global shape; the parts of a tangent vector as a list of shapes)."""

    def shape(v: Any) -> Any:
        return [shape(part) for part in v] if isinstance(v, list | tuple) else list(v.shape)

    return {
        name: {k: shape(v) for k, v in opt.state[p].items()}
        for name, p in model.named_parameters()
        if p in opt.state
    }


def _batch() -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, 5, 3, generator=gen, dtype=torch.float64)
    return x, torch.randn(BATCH, 5, generator=gen, dtype=torch.float64)


def _averaged(original: Any) -> Any:
    """``RowShardedFrames._inner`` made the mean over the ranks of their r×r products, not
    their sum (the control's variant)."""

    def mean(self: Any, a: Any, b: Any) -> Any:
        return original(self, a, b) / WORLD

    return mean


def _placement_rows() -> list[Row]:
    """What the guard refuses of the placements of a DTensor (``guard.values.check_placements``):
    a frame's columns sharded, its rows under a retraction other than polar, the rows of the
    factors of a design point; and a frame's rows sharded, which it takes."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from torch_port import RiemannianAdam, Stiefel
    from torch_port.nn import RiemannianMultiheadAttention, build_optimizer

    f64 = torch.float64

    def frame(placement: Any, **keys: Any) -> Any:
        holder = torch.nn.Module()
        holder.w = torch.nn.Parameter(Stiefel(16, 4).random_point(dtype=f64))
        fully_shard(holder, shard_placement_fn=lambda p: placement)
        return RiemannianAdam([{"params": [holder.w], "geometry": "stiefel", **keys}])

    def factor_rows(_: Any) -> Any:
        r1 = RiemannianMultiheadAttention(16, 4, qk_geometry="fixed_rank_embedded", dtype=f64)
        fully_shard(r1, shard_placement_fn=lambda p: Shard(1))
        return build_optimizer(r1, lr=1e-3)

    return [
        Row(
            "a frame's columns sharded",
            lambda _: frame(Shard(1)),
            ValueError,
            r"placements \(Shard\(dim=1\),\).*or the rows",
        ),
        Row("a frame's rows sharded (accepted)", lambda _: frame(Shard(0)), None),
        Row(
            "a frame's rows sharded under the QR retraction",
            lambda _: frame(Shard(0), retraction="qr"),
            ValueError,
            r"Shard\(dim=0\).*leading \(layer/head\) dims are",
        ),
        Row("the rows of fixed-rank factors", factor_rows, ValueError, r"'w_q'.*need whole rows"),
    ]


def _work(rank: int, out: Path, wrong: bool) -> int:
    """One rank's run (sharded as the module docstring says); rank 0 writes the gathered
    parameters to ``out/params.npz``, the optimizer state's global shapes (``state_shapes``)
    and how the rows of ``_placement_rows`` departed from what they say (``misbehaviour``) to
    ``out/states.json``. Returns how often the control's variant ran."""
    import numpy as np
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from proofs_checks.harness import substituted
    from torch_port.optim.sharding import RowShardedFrames

    calls = [0]
    variant = _averaged(RowShardedFrames._inner)

    def counted(self: Any, a: Any, b: Any) -> Any:
        calls[0] += 1
        return variant(self, a, b)

    x, y = _batch()
    half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    model = _model()
    fully_shard(model.attn)
    # single: (d, r), Shard(0) = its rows; stack: its layers; rows: (3, d, r) by its rows
    fully_shard(model, shard_placement_fn=lambda p: Shard(1) if p is model.rows else None)
    during = substituted(RowShardedFrames, "_inner", counted) if wrong else None
    opt = _train(model, x[half], y[half], during)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if rank == 0:
        np.savez(out / "params.npz", **{k: v.detach().numpy() for k, v in state.items()})
    placements = {row.name: misbehaviour(row) for row in _placement_rows()}
    if rank == 0:
        report = {"shapes": state_shapes(model, opt), "placements": placements}
        (out / "states.json").write_text(json.dumps(report))
    return calls[0]


def in_gloo_group(rank: int, world: int, work: Callable[[], None], **init: Any) -> NoReturn:
    """The body of a worker process: join the gloo group of ``world`` ranks
    (``init_process_group(**init)``), run ``work()``, meet the other ranks at a barrier, leave,
    and exit at once with 0, or with 1 and the traceback if ``work`` raised.

    The barrier keeps a rank from closing its connections while another still uses them; the
    immediate ``os._exit`` skips the interpreter's teardown, in which gloo's threads can call
    std::terminate after all the work is done and saved."""
    import traceback

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, **init)
    code = 0
    try:
        work()
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def worker(rank: int, store: str, out: str, wrong: bool) -> NoReturn:
    """A worker of ``run_workers``: ``_work`` in the gloo group joined through the file
    ``store`` (``in_gloo_group``); writes ``out/rank{rank}.json`` with the control's variant
    count, and under call tracing (``CHILD_TRACE``) the functions it called."""
    import cProfile

    import torch.distributed as dist

    def work() -> None:
        traced = os.environ.get(CHILD_TRACE)
        profile = cProfile.Profile() if traced else None
        if profile is not None:
            profile.enable()
        count = _work(rank, Path(out), wrong)
        if profile is not None:
            profile.disable()
            _write_calls(profile, Path(traced) / f"rank{rank}-{os.getpid()}.json")
        Path(out, f"rank{rank}.json").write_text(json.dumps({"variant_calls": count}))

    in_gloo_group(rank, WORLD, work, store=dist.FileStore(store, WORLD))


def _write_calls(profile: Any, path: Path) -> None:
    """[file, qualified name, name] of every Python function the profile saw."""
    seen = {
        (e.code.co_filename, e.code.co_qualname, e.code.co_name)
        for e in profile.getstats()
        if not isinstance(e.code, str)
    }
    path.write_text(json.dumps(sorted(seen)), encoding="utf-8")


def start_and_wait(commands: list[list[str]], timeout: float, what: str) -> None:
    """Run the worker ``commands`` at once, this project first on their path and one thread
    each, and wait for them; RuntimeError naming ``what`` with each failed rank's exit code and
    the end of its errors when one exits non-zero, or when they do not finish in ``timeout``
    seconds (all are then killed)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for command in commands
    ]
    errors = []
    for rank, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            for q in procs:
                q.kill()
            raise RuntimeError(f"the {what} workers did not finish in {timeout:g} s") from err
        if p.returncode != 0:
            errors.append(f"rank {rank} (exit {p.returncode}): {err.strip()[-2000:]}")
    if errors:
        raise RuntimeError(f"a {what} worker failed: " + " | ".join(errors))


def run_workers(wrong: bool) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
    """Start the ``WORLD`` workers, wait for them, and return (rank 0's gathered parameters,
    its report (``_work``), each rank's count of the control's variant);
    RuntimeError with the workers' errors when one fails or hangs."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        code = "from proofs_checks.propositions.port_gloo import worker; worker({}, {!r}, {!r}, {})"
        commands = [
            [sys.executable, "-c", code.format(rank, store, tmp, wrong)] for rank in range(WORLD)
        ]
        start_and_wait(commands, WORKER_TIMEOUT, "FSDP2")
        with np.load(Path(tmp) / "params.npz", allow_pickle=False) as saved:
            params = {k: saved[k] for k in saved.files}
        report = json.loads(Path(tmp, "states.json").read_text())
        counts = [
            json.loads(Path(tmp, f"rank{rank}.json").read_text())["variant_calls"]
            for rank in range(WORLD)
        ]
    return params, report, counts


def _compared(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters as compared: every one entry by entry, except the block R1 point's
    factors (W_V, S, W_O), whose product W_V^g S_g W_O^hᵀ per head h (group g = h // 2) is the
    point; its factors are defined up to a rotation, which the step's SVDs of one group or of
    two may settle differently within rounding."""
    import numpy as np

    w_v, s_vo, w_o = (params.pop(f"attn.{k}") for k in ("w_v", "s_vo", "w_o"))
    size = w_o.shape[0] // w_v.shape[0]
    params["attn.W_V S W_O^T"] = np.stack(
        [w_v[h // size] @ s_vo[h // size] @ w_o[h].T for h in range(w_o.shape[0])]
    )
    return params


def fsdp_against_one_process(ctx: Context, wrong: bool) -> Outcome:
    """``FSDP_STEPS`` steps of ``build_optimizer(model, RiemannianAdam)`` (lr ``FSDP_LR``,
    weight decay ``FSDP_DECAY``) on the model of ``_model`` under ``fully_shard``, on two gloo
    processes each with half of a batch of 8 sequences, against one process on the whole batch:
    the gathered parameters (``_compared``) are within ``sharded_run_tolerance(FSDP_STEPS,
    ENTRY_SIZE)`` of the single process's, entry by entry (residual: the largest difference
    over that bound, tolerance 1); the sharded optimizer state has the single process's
    shapes as its global shapes, which is what a checkpoint of it saves, and the placements of
    ``_placement_rows`` are refused or taken as they say (else the residual is ∞). Control:
    every row-sharded r×r product WᵀZ taken as the mean over the ranks instead of their sum
    (``RowShardedFrames._inner``, substituted in the workers, which report how often it ran).
    The run uses fixed seeds."""
    import numpy as np

    sharded, report, counts = run_workers(wrong)
    if wrong and min(counts) == 0:
        raise RuntimeError(f"the control's variant ran {counts} times on the ranks")
    shapes = report["shapes"]
    model = _model()
    opt = _train(model, *_batch())
    want = state_shapes(model, opt)
    single = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if set(single) != set(sharded):
        raise RuntimeError(f"the gathered parameters are {sorted(sharded)}, not {sorted(single)}")
    single, sharded = _compared(single), _compared(sharded)
    bound = sharded_run_tolerance(FSDP_STEPS, ENTRY_SIZE)
    gaps = {k: float(np.max(np.abs(sharded[k] - single[k]))) for k in single}
    name = max(gaps, key=gaps.get)
    moved = float((model.single.detach() - _model().single.detach()).abs().max())
    wrong_shapes = [
        f"{n}[{k!r}]: {shapes.get(n, {}).get(k)} ≠ {v}"
        for n, entries in want.items()
        for k, v in entries.items()
        if shapes.get(n, {}).get(k) != v
    ] + [f"{name}: {why}" for name, why in report["placements"].items() if why is not None]
    return Outcome.bound(
        math.inf if wrong_shapes else gaps[name] / bound,
        1.0,
        f"max |θ_FSDP − θ| = {gaps[name]:.3g} ({name}) against {bound:.3g} "
        f"(the frames moved {moved:.3g} from their start); "
        + (
            "; ".join(wrong_shapes[:3])
            if wrong_shapes
            else f"state shapes as one process's; {len(report['placements'])} placements as "
            "the guard's table says"
        ),
        {
            "sizes": "attention 16 = 4 heads × 4 over 2 key/value heads (block R1 on VO), "
            "St(16, 4)×(2×4) along layers, St(16, 4)×3 and St(16, 4) along rows",
            "steps": FSDP_STEPS,
            "dtypes": "float64",
            "devices": f"cpu, {WORLD} gloo processes",
            "seeds": "fixed (torch seeds 0, 1, 2)",
        },
    )
