"""Record the example of docs/audit.md on a device, in float32 and in bfloat16, for ``rattn audit``.

    python docs/audit_example.py [--device cuda] [--out DIR]

writes DIR/audit-DEVICE-float32.npz and DIR/audit-DEVICE-bfloat16.npz (20 steps each, every step
recorded); exits 2 when the device is not available.
"""

import argparse
import sys
from pathlib import Path

import torch

import torch_port as tp
from torch_port import audit
from torch_port.nn import RiemannianMultiheadAttention, build_optimizer, reproject

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cuda")
parser.add_argument("--out", default=".")
args = parser.parse_args()
if args.device == "cuda" and not torch.cuda.is_available():
    print("audit_example.py: --device cuda, but CUDA is not available", file=sys.stderr)
    sys.exit(2)

for dtype in (torch.float32, torch.bfloat16):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 16),
        RiemannianMultiheadAttention(16, 4, vo_geometry="stiefel"),
        torch.nn.Linear(16, 1),
    ).to(args.device, dtype)
    reproject(model)  # the cast leaves frames off St by its rounding
    opt = build_optimizer(model, tp.RiemannianAdam, lr=1e-2, trust_radius=0.05)
    x = torch.randn(8, 5, 3).to(args.device, dtype)
    y = torch.randn(8, 5, 1).to(args.device, dtype)
    name = str(dtype).removeprefix("torch.")
    path = Path(args.out) / f"audit-{args.device}-{name}.npz"
    with audit.record(opt, path):
        for _ in range(20):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    print(path)
