"""What the tests share: the unit roundoff, named once.

The rounding bounds themselves (γ_k, ``frame_error``, …) and the geometry laws with their
Taylor-slope rule are owned by ``proofs_checks.bounds`` and ``proofs_checks.geometry_laws``; tests
import them from there rather than copying them, so that a bound derived once reaches every test.
Import from here with ``from conftest import U, unit_roundoff``; ``train_mse`` is the short
training loop the attention-module tests share, ``reference_moments`` the reference optimizer
state the port's is compared with.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from proofs_checks.bounds import FLOAT64_U

# Under pytest-xdist every worker is one of the processes that share the cores: one thread each,
# since torch (imported later) starts one thread per core in every process by default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

#: The float64 unit roundoff u = 2^-53 ≈ 1.1e-16 (Higham §2.1): ``proofs_checks.bounds``' value.
U = FLOAT64_U


def unit_roundoff(dtype: Any = np.float64) -> float:
    """u = eps/2 of a floating dtype: a NumPy dtype (or type), or a ``torch.dtype``."""
    if type(dtype).__module__ == "torch":  # a torch.dtype, which NumPy does not know
        import torch

        return float(torch.finfo(dtype).eps) / 2
    return float(np.finfo(dtype).eps) / 2


def train_mse(model: Any, opt: Any, x: Any, y: Any, steps: int = 20, **forward: Any) -> list:
    """``steps`` optimizer steps on mean((model(x, **forward) − y)²); the losses before each."""
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x, **forward) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def reference_moments(state: Any) -> tuple[Any, Any]:
    """(m, √v) of a ``reference.optim`` chain state whose first transform is Adam, (m, None)
    when it is a trace (momentum), else (None, None): the reference's first-moment array and
    second-moment root, to compare with a port's state."""
    from reference import optim as ro

    first = state[0]
    if isinstance(first, ro.AdamState):
        return first.m, first.sqrt_v
    if isinstance(first, ro.TraceState):
        return first.m, None
    return None, None


def run_workers(script: str, world: int, out_dir: Any, timeout: float, what: str) -> None:
    """Run ``python script RANK PORT OUT_DIR`` for every rank (a free port on 127.0.0.1) by
    ``proofs_checks.propositions.port_gloo.start_and_wait``, which raises with the workers'
    errors unless all exit 0 within ``timeout`` seconds (the distributed tests' workers)."""
    import socket
    import sys

    from proofs_checks.propositions.port_gloo import start_and_wait

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    commands = [
        [sys.executable, script, str(rank), str(port), str(out_dir)] for rank in range(world)
    ]
    start_and_wait(commands, timeout, what)


def run_as_worker(work: Any, world: int) -> None:
    """The body of ``python script RANK PORT OUT_DIR`` (a worker that ``run_workers`` started):
    ``work(rank, out_dir)`` in the gloo group of ``world`` ranks on 127.0.0.1:PORT, by
    ``proofs_checks.propositions.port_gloo.in_gloo_group`` (a barrier after the work, an exit
    at once: 0, or 1 with the traceback if ``work`` raised)."""
    import sys

    from proofs_checks.propositions.port_gloo import in_gloo_group

    rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    init = f"tcp://127.0.0.1:{port}"
    in_gloo_group(rank, world, lambda: work(rank, out), init_method=init)
