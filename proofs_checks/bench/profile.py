"""Where one step of the port's optimizer spends its time (``rattn bench port``'s profile).

torch and torch_port are imported inside the function (``rattn certify`` runs without torch).
"""

from __future__ import annotations

import linecache
import sys
import time
from typing import Any

#: Rows of the profile tables kept.
PROFILE_TOP = 12
#: Learning rate of the profiled step (as ``rattn bench port``'s).
PROFILE_LR = 1e-3


def port_inputs(
    size: dict[str, Any], dtype: Any, seed: int, device: str = "cpu"
) -> tuple[list[Any], list[Any]]:
    """The frames (``torch_port.Stiefel.random_point``) and Gaussian gradients of a size, drawn
    on the CPU in float64 (the same values on every device), then cast and moved."""
    import torch

    import torch_port as tp

    gen = torch.Generator().manual_seed(seed)
    st = tp.Stiefel(size["d"], size["r"])
    points = [st.random_point(gen, size["batch"]) for _ in range(size["params"])]
    grads = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in points]
    return [t.to(device, dtype) for t in points], [t.to(device, dtype) for t in grads]


def port_attribution(size: dict[str, Any], dtype: Any, seed: int) -> dict[str, Any]:
    """Where one ``RiemannianAdam`` step spends its time, by source line of ``torch_port`` and
    by torch operator.

    After two warm-up steps, one step runs under a ``TorchDispatchMode`` that times every
    operator call (CPU operators are synchronous, so the wall time around the call is its
    cost) and charges it to the innermost ``torch_port`` source line on the Python stack. This
    instruments the real step, whatever its code is at the time, not a replica; the overhead is
    a few µs per operator call (the step makes a few hundred). Returns ``{"step_s" (the same
    step uninstrumented), "instrumented_s", "ops_s" (sum of the timed operator calls),
    "sites": [{"site", "calls", "seconds", "share"}], "operators": [...]}``, each list sorted
    by time and cut at PROFILE_TOP."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import torch_port as tp

    class _Timer(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sites: dict[str, list[float]] = {}
            self.ops: dict[str, list[float]] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            frame, site = sys._getframe(1), "outside torch_port"
            while frame is not None:
                path = frame.f_code.co_filename.replace("\\", "/")
                if "/torch_port/" in path:
                    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
                    site = (
                        f"torch_port/{path.rsplit('/torch_port/', 1)[1]}:{frame.f_lineno} "
                        f"({frame.f_code.co_name}) `{code[:70]}`"
                    )
                    break
                frame = frame.f_back
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            spent = time.perf_counter() - start
            for table, key in ((self.sites, site), (self.ops, str(func.overloadpacket))):
                entry = table.setdefault(key, [0, 0.0])
                entry[0] += 1
                entry[1] += spent
            return out

    points, grads = port_inputs(size, dtype, seed)
    ps = [torch.nn.Parameter(p) for p in points]
    for p, g in zip(ps, grads, strict=True):
        p.grad = g
    opt = tp.RiemannianAdam([{"params": ps, "geometry": "stiefel"}], lr=PROFILE_LR)
    opt.step()
    opt.step()
    start = time.perf_counter()
    opt.step()
    plain = time.perf_counter() - start
    timer = _Timer()
    start = time.perf_counter()
    with timer:
        opt.step()
    instrumented = time.perf_counter() - start
    total = sum(v[1] for v in timer.sites.values()) or 1.0

    def rows(table: dict[str, list[float]], label: str) -> list[dict[str, Any]]:
        ranked = sorted(table.items(), key=lambda kv: kv[1][1], reverse=True)[:PROFILE_TOP]
        return [
            {label: k, "calls": int(c), "seconds": float(t), "share": float(t / total)}
            for k, (c, t) in ranked
        ]

    return {
        "step_s": plain,
        "instrumented_s": instrumented,
        "ops_s": total,
        "sites": rows(timer.sites, "site"),
        "operators": rows(timer.ops, "op"),
    }
