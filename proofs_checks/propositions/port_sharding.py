"""PORT-9: the row-sharded step (FSDP2's layout of a (d, r) frame) is the unsharded step, with
the ranks simulated in one process.

Each simulated rank is a thread holding some rows of every frame and its own optimizer state;
``RowShardedFrames`` is given a simulated all-reduce (every rank's tensor summed in rank order,
the same sum on every rank), and each rank runs the optimizer's own per-point update
(``ChainOptimizer._point_update`` and ``_commit``, what ``step`` runs for each point). So
``rattn certify`` covers the arithmetic of a sharded step without a process group. A third
check runs FSDP2 itself over two gloo processes of this machine (``port_gloo``): the
placements, the sharded state (``sharding.wrap``, ``store``) and the GQA shards of a block
point (``sharding.local_heads``), against one process on the whole batch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from proofs_checks.bounds import trajectory_tolerance
from proofs_checks.harness import substituted
from proofs_checks.propositions.port_frames import brockett, frames_and_costs
from proofs_checks.propositions.port_gloo import FSDP_STEPS, fsdp_against_one_process, gloo_missing
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: The frames (St(d, r)×frames), the rows each simulated rank holds (uneven, as FSDP2's
#: padding-free split of 16 rows over 3 ranks is), the steps and the hyperparameters
#: (lr·√(d·r) ≤ 1/2: ``trajectory_tolerance``'s hypothesis).
SHARD_D, SHARD_R, SHARD_FRAMES, ROW_BLOCKS = 16, 4, 3, (6, 5, 5)
SHARD_STEPS, SHARD_LR, SHARD_RADIUS = 4, 0.05, 0.4
#: How long a simulated rank waits for the others before the run is declared hung (seconds).
RANK_TIMEOUT = 60.0


class SimulatedAllReduce:
    """An in-place sum over ``ranks`` threads: each rank's call deposits its tensor, waits for
    the others, and takes the sum in rank order (so every rank gets the same bits)."""

    def __init__(self, ranks: int):
        self.slots: list[Any] = [None] * ranks
        self.barrier = threading.Barrier(ranks, timeout=RANK_TIMEOUT)

    def of_rank(self, rank: int) -> Callable[[Any], Any]:
        def all_reduce(t: Any) -> Any:
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = self.slots[0].clone()
            for other in self.slots[1:]:
                total += other
            self.barrier.wait()  # every rank has read the slots before any writes them again
            return t.copy_(total)

        return all_reduce


def _on_ranks(work: list[Callable[[], None]], barrier: threading.Barrier) -> None:
    """Run one callable per rank, each in its own thread; the first error is raised (the
    barrier is broken for the others, so that no rank waits for one that failed)."""
    errors: list[BaseException] = []

    def run(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as err:  # re-raised below, in the caller's thread
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(job,)) for job in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _rank_local_inner(self: Any, a: Any, b: Any) -> Any:
    """``RowShardedFrames._inner`` from this rank's rows only (no all-reduce)."""
    return a.transpose(-1, -2) @ b


#: PORT-9's resolution: every sharded frame norm this much relative too large.
SHARD_NEAR_MISS = 1e-11


def _norms_stretched(original: Callable) -> Callable:
    return lambda self, x, u: original(self, x, u) * (1.0 + SHARD_NEAR_MISS)


def row_sharded_step(ctx: Context, wrong: bool, control: str = "local") -> Outcome:
    """RiemannianAdam (lr ``SHARD_LR``, trust radius ``SHARD_RADIUS``) on float64 frames
    St(16, 4)×3 under a Brockett cost, ``SHARD_STEPS`` steps, once unsharded and once with the
    rows split over three simulated ranks (``ROW_BLOCKS``), each rank stepping its rows by the
    optimizer's per-point update with ``RowShardedFrames`` and the simulated all-reduce, the
    gradient's rows given to each rank as FSDP2's reduce-scatter does: after step t the
    assembled frames are within ``trajectory_tolerance``(16, 4, t) of the unsharded ones
    (residual: the largest ratio, tolerance 1). Control: the r×r products WᵀZ taken from each
    rank's own rows, substituted for ``RowShardedFrames._inner`` (or, ``control="norms"``, a
    near miss: every sharded frame norm ``SHARD_NEAR_MISS`` relative too large)."""
    import torch

    import torch_port as tp
    from torch_port.optim.points import Point
    from torch_port.optim.sharding import RowShardedFrames

    gen = torch.Generator().manual_seed(ctx.seed)
    (w,), (a,) = frames_and_costs(gen, ((SHARD_FRAMES, SHARD_D, SHARD_R),), torch.float64)
    hyper = {"lr": SHARD_LR, "trust_radius": SHARD_RADIUS}
    whole = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], **hyper)
    starts = [sum(ROW_BLOCKS[:i]) for i in range(len(ROW_BLOCKS))]
    rows = [slice(s, s + n) for s, n in zip(starts, ROW_BLOCKS, strict=True)]
    blocks = [w.detach()[..., rr, :].clone() for rr in rows]
    reduce = SimulatedAllReduce(len(rows))
    st = tp.Stiefel(SHARD_D, SHARD_R)
    ranks = []
    for i, block in enumerate(blocks):
        # each rank's optimizer holds the group's hyperparameters (built on a whole frame,
        # which its checks accept); its point is the rank's rows under RowShardedFrames
        opt = tp.RiemannianAdam([{"params": [w.detach().clone()], "geometry": "stiefel"}], **hyper)
        geometry = RowShardedFrames(st, None, all_reduce=reduce.of_rank(i))
        ranks.append((opt, Point(geometry, [block], 0, [0])))

    def step_rank(opt: Any, point: Any) -> None:
        values, new = opt._point_update(point)
        opt._commit(point, values, new, int(new["step"]))

    if control == "local":
        patch = substituted(RowShardedFrames, "_inner", _rank_local_inner)
    else:
        patch = substituted(
            RowShardedFrames, "frame_norms", _norms_stretched(RowShardedFrames.frame_norms)
        )
    worst, where = 0.0, 0
    with patch if wrong else contextlib.nullcontext(), torch.no_grad():
        for t in range(1, SHARD_STEPS + 1):
            with torch.enable_grad():
                whole.zero_grad()
                brockett([w], [a]).backward()
                gathered = torch.cat(blocks, dim=-2).requires_grad_()
                brockett([gathered], [a]).backward()
            for block, rr in zip(blocks, rows, strict=True):
                block.grad = gathered.grad[..., rr, :].clone()
            whole.step()
            _on_ranks([lambda o=o, p=p: step_rank(o, p) for o, p in ranks], reduce.barrier)
            gap = float(torch.linalg.matrix_norm(torch.cat(blocks, dim=-2) - w).max())
            ratio = gap / trajectory_tolerance(SHARD_D, SHARD_R, t)
            if ratio > worst:
                worst, where = ratio, t
    return Outcome.bound(
        worst,
        1.0,
        f"max_t ‖W_sharded − W‖_F/trajectory_tolerance(16, 4, t) = {worst:.3g} (step {where})",
        {
            "sizes": f"St({SHARD_D}, {SHARD_R})×{SHARD_FRAMES}, rows {ROW_BLOCKS} on 3 ranks",
            "steps": SHARD_STEPS,
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def row_sharded_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``row_sharded_step`` whose control is the near miss of the sharded frame norms."""
    return row_sharded_step(ctx, wrong, control="norms")


def row_sharded_operations(ctx: Context, wrong: bool) -> Outcome:
    """The operations of ``RowShardedFrames`` that the step does not take (the step projects
    into buffers and retracts by scaled steps), on float64 frames St(16, 4)×3 with their rows
    on three simulated ranks: ``check_point`` accepts each rank's rows, and ``proj_tangent``
    P_W(Z), ``transport`` P_Y(Z) and ``retract`` polar(W + ξ) (‖Z‖_F = ‖ξ‖_F = √r per frame)
    assembled from the ranks are within 2·``step_error(16, 4)`` of ``StiefelFrames``' on the
    whole frames (both within one step's rounding of the exact value; residual: the largest
    difference over that bound, tolerance 1). Control: the r×r products from each rank's own
    rows (``_rank_local_inner`` for ``RowShardedFrames._inner``)."""
    import torch

    import torch_port as tp
    from proofs_checks.bounds import step_error
    from torch_port.optim.sharding import RowShardedFrames
    from torch_port.stiefel import StiefelFrames

    gen = torch.Generator().manual_seed(ctx.seed)
    st = tp.Stiefel(SHARD_D, SHARD_R)
    w, y = (st.random_point(gen, (SHARD_FRAMES,), dtype=torch.float64) for _ in range(2))

    def per_frame(z: Any) -> Any:  # ‖Z‖_F = √r for each frame
        return z * (SHARD_R**0.5 / torch.linalg.matrix_norm(z))[..., None, None]

    z = per_frame(torch.randn(w.shape, generator=gen, dtype=torch.float64))
    whole = StiefelFrames(st)
    xi = per_frame(whole.proj_tangent((w,), (z,))[0])
    want = {
        "proj_tangent": whole.proj_tangent((w,), (z,))[0],
        "transport": whole.transport((w,), (y,), (z,))[0],
        "retract": whole.retract((w,), (xi,))[0],
    }
    starts = [sum(ROW_BLOCKS[:i]) for i in range(len(ROW_BLOCKS))]
    rows = [slice(s, s + n) for s, n in zip(starts, ROW_BLOCKS, strict=True)]
    reduce = SimulatedAllReduce(len(rows))
    got: list[dict[str, Any]] = [{} for _ in rows]

    def on_rank(i: int, rr: slice) -> None:
        geometry = RowShardedFrames(st, None, all_reduce=reduce.of_rank(i))
        wi, yi, zi, xii = (t[..., rr, :] for t in (w, y, z, xi))
        geometry.check_point((wi,))
        got[i]["proj_tangent"] = geometry.proj_tangent((wi,), (zi,))[0]
        got[i]["transport"] = geometry.transport((wi,), (yi,), (zi,))[0]
        got[i]["retract"] = torch.as_tensor(geometry.retract((wi,), (xii,))[0])

    bound = 2 * step_error(SHARD_D, SHARD_R)
    with (
        substituted(RowShardedFrames, "_inner", _rank_local_inner)
        if wrong
        else (contextlib.nullcontext())
    ):
        _on_ranks([lambda i=i, rr=rr: on_rank(i, rr) for i, rr in enumerate(rows)], reduce.barrier)
    gaps = {
        op: float(torch.linalg.matrix_norm(torch.cat([g[op] for g in got], -2) - v).max())
        for op, v in want.items()
    }
    op = max(gaps, key=gaps.get)
    return Outcome.bound(
        gaps[op] / bound,
        1.0,
        f"max ‖op_sharded − op‖_F/(2·step_error(16, 4)) = {gaps[op] / bound:.3g} ({op}); "
        "check_point accepted every rank's rows",
        {
            "sizes": f"St({SHARD_D}, {SHARD_R})×{SHARD_FRAMES}, rows {ROW_BLOCKS} on 3 ranks",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


register(
    Proposition(
        id="PORT-9",
        title="The row-sharded step is the unsharded step",
        statement=(
            r"When the rows of every frame are split over ranks (FSDP2's layout of a $(d, r)$ "
            r"parameter) and each rank steps its rows by \texttt{RowShardedFrames}, every "
            r"$r\times r$ product $W^\top Z$, Gram and squared norm summed over the ranks, the "
            r"frames the ranks hold together after $t$ steps of \texttt{RiemannianAdam} are "
            r"within $2(2^t-1)\,\mathrm{step\_error}(d,r)$ of the unsharded run's. Under "
            r"\texttt{fully\_shard} over two processes, rows, layers and GQA heads sharded, "
            r"$T$ steps of \texttt{build\_optimizer(model, RiemannianAdam)} on half a batch "
            r"each end within $100\,T u$ per unit entry of one process on the whole batch."
        ),
        hypotheses=(
            "float64 frames; lr·√(d·r) ≤ 1/2; the all-reduce an exact-order sum (simulated: "
            "the ranks are threads of one process)",
            f"St({SHARD_D}, {SHARD_R}), rows {ROW_BLOCKS} on three ranks, {SHARD_STEPS} steps",
            f"two gloo processes (torch.distributed on this machine), {FSDP_STEPS} steps, "
            "float64, entries ≤ 2; the block R1 point compared as W_V S W_Oᵀ",
        ),
        checks=(
            Check(
                "float64",
                "three simulated ranks against the unsharded run",
                row_sharded_step,
                "the r×r products from each rank's own rows, substituted into the port",
            ),
            Check(
                "float64",
                f"resolution: sharded frame norms {SHARD_NEAR_MISS:g} relative too large are "
                "caught",
                row_sharded_resolution,
                f"near miss: every sharded frame norm times 1 + {SHARD_NEAR_MISS:g}, "
                "substituted into the port",
            ),
            Check(
                "float64",
                "the sharded projection, transport, retraction and point check",
                row_sharded_operations,
                "the r×r products from each rank's own rows, substituted into the port",
            ),
            Check(
                "float64",
                "FSDP2 over two gloo processes against one process",
                fsdp_against_one_process,
                "the row-sharded r×r products averaged over the ranks instead of summed, "
                "substituted into the port in both processes",
                unavailable=gloo_missing,
            ),
        ),
        requires=("torch",),
    )
)
