"""The compiled and graph-captured optimizer step on a device (docs/gpu.md).

Builds a small model (``RiemannianMultiheadAttention`` with Stiefel QK frames, plain VO, a
linear read-out) and trains it 10 steps from one start four ways: the eager step, the eager step
under ``torch.compile(opt.step)`` (it runs eagerly), the capturable step
(``RiemannianAdam(capturable=True)``, trust radius 0.5), and the capturable step under
``torch.compile(opt.step, fullgraph=True)``. It prints one JSON document: whether each compiled
run equals its eager run (bitwise, and the largest difference), and what a CUDA-graph capture
of each step does (``torch.cuda.graph``; CUDA only; replayed for 10 steps and compared with
10 eager capturable steps). Usage: ``python docs/gpu_compile_check.py [cuda|cpu]`` (default
cuda when available).
"""

from __future__ import annotations

import json
import sys

import torch

import torch_port as tp
from torch_port.nn import RiemannianMultiheadAttention, build_optimizer

STEPS = 10


def setup(device: str, capturable: bool):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = torch.nn.Sequential()
    model.attn = RiemannianMultiheadAttention(64, 4, generator=gen).to(device)
    model.out = torch.nn.Linear(64, 1).to(device)
    extra = {"capturable": True, "trust_radius": 0.5} if capturable else {}
    opt = build_optimizer(model, tp.RiemannianAdam, lr=1e-2, weight_decay=1e-2, **extra)
    x = torch.randn(8, 16, 64, generator=gen).to(device)
    return model, opt, x


def backward(model, opt, x) -> None:
    opt.zero_grad(set_to_none=False)
    model.out(model.attn(x, is_causal=True)).pow(2).mean().backward()


def run(device: str, capturable: bool, compiled: bool) -> list[torch.Tensor]:
    model, opt, x = setup(device, capturable)
    step = opt.step
    if compiled:
        step = torch.compile(opt.step, fullgraph=capturable)
    for _ in range(STEPS):
        backward(model, opt, x)
        step()
    return [p.detach().cpu() for p in model.parameters()]


def capture(device: str, capturable: bool) -> dict:
    """Capture one step in a CUDA graph after 3 warm-up steps on a side stream, then replay it
    (forward and backward eager) and compare with the eager run of the same number of steps."""
    if device != "cuda":
        return {"result": "not tried (CUDA graphs need CUDA)"}
    model, opt, x = setup(device, capturable)
    backward(model, opt, x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            backward(model, opt, x)
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            opt.step()
    except Exception as err:  # a step that synchronises with the host cannot be captured
        return {"result": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
    for _ in range(STEPS - 3):
        backward(model, opt, x)
        graph.replay()
    torch.cuda.synchronize()
    replayed = [p.detach().cpu() for p in model.parameters()]
    eager = run(device, capturable, compiled=False)
    diff = max((a - b).abs().max().item() for a, b in zip(replayed, eager, strict=True))
    return {"result": "captured", "max_abs_difference_to_eager": diff}


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    return {
        "bitwise": all(torch.equal(x, y) for x, y in zip(a, b, strict=True)),
        "max_abs_difference": max((x - y).abs().max().item() for x, y in zip(a, b, strict=True)),
    }


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    report = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for name, cap in (("eager_step", False), ("capturable_step", True)):
        report[name] = {
            "compiled_vs_eager": compare(run(device, cap, False), run(device, cap, True)),
            "cuda_graph_capture": capture(device, cap),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
