"""The compiled and graph-captured optimizer step on a device (docs/gpu.md).

Builds a small model (``RiemannianMultiheadAttention`` with Stiefel QK frames, plain VO, a
linear read-out), trains it 10 steps twice from the same start, once with ``opt.step`` and once
with ``torch.compile(opt.step)``, and prints one JSON document: whether the two are bitwise equal,
and what a CUDA-graph capture of the step does (``torch.cuda.graph``; CUDA only). Usage:
``python docs/gpu_compile_check.py [cuda|cpu]`` (default cuda when available).
"""

from __future__ import annotations

import json
import sys

import torch

import torch_port as tp
from torch_port.nn import RiemannianMultiheadAttention, build_optimizer


def run(device: str, compiled: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = torch.nn.Sequential()
    model.attn = RiemannianMultiheadAttention(64, 4, generator=gen).to(device)
    model.out = torch.nn.Linear(64, 1).to(device)
    opt = build_optimizer(model, tp.RiemannianAdam, lr=1e-2, weight_decay=1e-2)
    step = torch.compile(opt.step) if compiled else opt.step
    x = torch.randn(8, 16, 64, generator=gen).to(device)
    for _ in range(10):
        opt.zero_grad()
        model.out(model.attn(x, is_causal=True)).pow(2).mean().backward()
        step()
    return [p.detach().cpu() for p in model.parameters()]


def capture(device: str) -> str:
    """What capturing one step in a CUDA graph does: 'captured' or the error it raises."""
    if device != "cuda":
        return "not tried (CUDA graphs need CUDA)"
    model = RiemannianMultiheadAttention(64, 4).to(device)
    opt = build_optimizer(model, tp.RiemannianAdam, lr=1e-2)
    x = torch.randn(8, 16, 64, device=device)
    model(x).pow(2).mean().backward()
    opt.step()  # states exist before the capture
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            opt.step()
    except Exception as err:  # the step's host synchronisations cannot be captured
        return f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    return "captured"


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    eager, compiled = run(device, False), run(device, True)
    report = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "compiled_equals_eager_bitwise": all(
            torch.equal(a, b) for a, b in zip(eager, compiled, strict=True)
        ),
        "cuda_graph_capture": capture(device),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
