"""What the distributed tests (tests/test_ddp.py, test_fsdp.py, test_fsdp_audit.py,
test_fsdp_uneven.py) share besides the process group itself (``conftest.run_workers`` and
``conftest.run_as_worker``): the gloo skip mark, the float64 regression batch and each rank's
equal shard of it, and the model of one ``RiemannianMultiheadAttention`` between two linear
layers.

Imported by those test modules after ``pytest.importorskip("torch")``, and by their worker
processes (``python tests/test_X.py RANK PORT OUT_DIR``, which have tests/ on their path).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

F64 = torch.float64

#: Skip a test that starts gloo workers where torch.distributed or its gloo backend is missing.
needs_gloo = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is not available",
)


def regression_batch(size: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): ``size`` sequences of 5 tokens of 3 features, x (size, 5, 3), and their targets,
    y (size, 5), iid N(0, 1) in float64 from ``torch.Generator().manual_seed(seed)``, x first."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 5, 3, generator=gen, dtype=F64)
    y = torch.randn(size, 5, generator=gen, dtype=F64)
    return x, y


def rank_shard(rank: int, world: int, size: int) -> slice:
    """The rows of a batch of ``size`` that rank ``rank`` of ``world`` trains on: equal,
    consecutive shards in rank order."""
    return slice(rank * size // world, (rank + 1) * size // world)


def attention_net(**attention: Any) -> torch.nn.Module:
    """h = Linear(3, 16)(x); h + RiemannianMultiheadAttention(16, 4, **attention)(h, causal);
    Linear(16, 1), squeezed: a float64 model whose linear layers are drawn after
    ``torch.manual_seed(0)`` and whose attention from ``torch.Generator().manual_seed(1)``.
    Its parameters are ``inp.*``, ``attn.*`` and ``out.*``."""
    from torch_port.nn import RiemannianMultiheadAttention

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            gen = torch.Generator().manual_seed(1)
            self.inp = torch.nn.Linear(3, 16, dtype=F64)
            self.attn = RiemannianMultiheadAttention(16, 4, generator=gen, dtype=F64, **attention)
            self.out = torch.nn.Linear(16, 1, dtype=F64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            h = h + self.attn(h, is_causal=True)
            return self.out(h).squeeze(-1)

    return Net()
