"""How often one eager step reads the host: every transfer of a tensor's value to Python
(``aten._local_scalar_dense``, behind ``item``, ``bool`` and ``float`` of a tensor, and
``Tensor.tolist``), counted on the CPU with a dispatch mode. On a GPU each is a synchronisation.

Measured (docs/performance.md): one read per step for the gradients' finiteness and one for
the points' step counts (``ChainOptimizer._next_counts``), then seven per frame parameter: the
polar retraction's route (``linalg.polar_plan``) and six choices between a fast route and its
rescaled rescue (two overflow tests of the transport, two of the norms, one of the RMS, one of
the step's ratio). The redesign of the one step folds
those into one flag per step (open work); these counts guard against new reads meanwhile.
"""

from __future__ import annotations

import collections
import contextlib
import traceback

import pytest

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import torch_port as tp  # noqa: E402


class HostReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` calls by the torch_port line that made them."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: collections.Counter[str] = collections.Counter()

    def record(self) -> None:
        stack = traceback.extract_stack()
        site = next(
            (
                f"{f.filename.rsplit('/', 2)[-1]}:{f.name}"
                for f in reversed(stack)
                if "torch_port" in f.filename
            ),
            "elsewhere",
        )
        self.sites[site] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.record()
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counted_reads():
    """Count host reads: the dispatch mode, and ``Tensor.tolist`` (which does not dispatch)."""
    mode = HostReads()
    tolist = torch.Tensor.tolist

    def counting(self, *args, **kwargs):
        mode.record()
        return tolist(self, *args, **kwargs)

    torch.Tensor.tolist = counting
    try:
        with mode:
            yield mode
    finally:
        torch.Tensor.tolist = tolist


def frames_optimizer(count: int) -> torch.optim.Optimizer:
    st = tp.Stiefel(64, 16)
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(st.random_point(gen, (4,)).float()) for _ in range(count)]
    opt = tp.RiemannianAdam([{"params": params, "geometry": "stiefel"}], lr=1e-3)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()  # the first step makes the state; the second is the one counted
    return opt


@pytest.mark.parametrize("count", [1, 4])
def test_reads_of_one_eager_step_of_frames(count) -> None:
    opt = frames_optimizer(count)
    with counted_reads() as reads:
        opt.step()
    assert reads.sites == {
        "input_checks.py:_validate": 1,
        "optimizer.py:_next_counts": 1,
        "stiefel.py:_all_finite": 2 * count,
        "linalg.py:norm_of_parts": 2 * count,
        "linalg.py:polar_plan": count,
        "transforms.py:frame_rms": count,
        "transforms.py:_ratio_step": count,
    }, dict(reads.sites)


def test_the_counter_sees_each_kind_of_read() -> None:
    """Control: ``item``, ``bool``, ``float`` and ``tolist`` are each counted once."""
    a = torch.ones(3)
    with counted_reads() as reads:
        a.sum().item()
        bool(a.any())
        float(a[0])
        a.tolist()
    assert sum(reads.sites.values()) == 4
