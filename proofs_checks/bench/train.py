"""A whole training step (``rattn bench train``): forward, backward and optimizer step of a
GPT-2-shaped language model whose QK products are converted to Stiefel frames
(``torch_port.convert.riemannian_attention(model, "stiefel")``) and trained by
``build_optimizer(model)`` with its defaults, against the same model unconverted under torch's
AdamW (fused on CUDA, foreach on the CPU), both from the same initial weights and batch.

The model is Hugging Face's ``GPT2LMHeadModel`` when ``transformers`` is installed, else a
GPT-2-shaped model built here from ``nn.MultiheadAttention`` (pre-LayerNorm blocks, causal
mask, GELU MLP of width 4d, tied read-out). On CUDA the forward and backward run under bfloat16
autocast and every timed call ends with a synchronisation; peak memory is CUDA's allocator peak
over one step of each candidate (on the CPU it is not measured: the process's resident set
mixes the candidates). torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from proofs_checks.bench.timing import (
    _check_repeats,
    _interleaved_rounds,
    _iqr,
    machine_environment,
)
from proofs_checks.memory import require_memory

#: Model sizes: GPT-2 small (124 M parameters, the target's) and a small one for the CPU.
SIZES: dict[str, dict[str, int]] = {
    "small": {"layers": 2, "d": 256, "heads": 4, "context": 128, "batch": 4, "vocab": 2048},
    "gpt2-small": {
        "layers": 12,
        "d": 768,
        "heads": 12,
        "context": 512,
        "batch": 8,
        "vocab": 50257,
    },
}
#: The target: the whole training step at most this many times AdamW's.
TRAIN_TARGET_VS_ADAMW = 1.05
PORT_ROW = "QK on Stiefel frames, build_optimizer(model) defaults"
ADAMW_ROW = "torch AdamW, all plain"
LR = 1e-3


def parameter_count(c: dict[str, int]) -> int:
    """Parameters of the GPT-2-shaped model of size ``c``: tied embeddings, positions, per
    block two LayerNorms, the q/k/v and output maps with biases, the MLP; a final LayerNorm."""
    d = c["d"]
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return c["vocab"] * d + c["context"] * d + c["layers"] * block + 2 * d


def check_train_memory(size: str, config: dict[str, int] | None = None) -> None:
    """Refuse, before torch is imported, a run whose estimate exceeds the memory limit: per
    candidate its float32 parameters, gradients and two optimizer states (16 bytes an entry),
    twice, plus the activations of one forward and backward (about 40 floats per token per
    block and width, and the logits of every token, twice)."""
    if size not in SIZES:
        raise ValueError(f"bench train --size must be one of {', '.join(SIZES)}, got {size!r}")
    c = SIZES[size] if config is None else config
    tokens = c["batch"] * c["context"]
    activations = 4 * tokens * (40 * c["layers"] * c["d"] + 2 * c["vocab"])
    require_memory("bench train", 2 * (16 * parameter_count(c) + activations))


def _model(c: dict[str, int], seed: int) -> Any:
    """The GPT-2-shaped language model of size ``c`` (module docstring), initialised from
    ``seed`` (the global generator left as it was)."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            return _built_gpt(c)
        config = GPT2Config(
            vocab_size=c["vocab"],
            n_positions=c["context"],
            n_embd=c["d"],
            n_layer=c["layers"],
            n_head=c["heads"],
            bos_token_id=0,
            eos_token_id=0,
        )
        return GPT2LMHeadModel(config)


def _loss(model: Any, tokens: Any) -> Any:
    """The next-token cross-entropy of ``tokens`` under either model."""
    if hasattr(model, "lm_loss"):
        return model.lm_loss(tokens)
    return model(tokens, labels=tokens).loss


def _built_gpt(c: dict[str, int]) -> Any:
    import torch
    from torch import nn

    d = c["d"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, c["heads"], batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: Any, mask: Any) -> Any:
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(c["vocab"], d)
            self.position = nn.Embedding(c["context"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(c["layers"]))
            self.ln = nn.LayerNorm(d)

        def lm_loss(self, tokens: Any) -> Any:
            t = tokens.shape[1]
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=tokens.device), 1)
            x = self.embed(tokens) + self.position(torch.arange(t, device=tokens.device))
            for block in self.blocks:
                x = block(x, mask)
            logits = self.ln(x) @ self.embed.weight.T
            return nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
            )

    return GPT()


def _candidate(name: str, c: dict[str, int], device: str, seed: int) -> tuple[Any, Any]:
    """(model, optimizer) of ``name``: the model of ``seed`` converted (the port's) or as it
    is (AdamW's), so both start from the same weights."""
    import torch

    from torch_port.convert import riemannian_attention
    from torch_port.optim.groups import build_optimizer

    model = _model(c, seed).to(device)
    if name == PORT_ROW:
        riemannian_attention(model, "stiefel")
        return model, build_optimizer(model, lr=LR)
    fused = {"fused": True} if device == "cuda" else {"foreach": True}
    return model, torch.optim.AdamW(model.parameters(), lr=LR, **fused)


def _step(model: Any, opt: Any, tokens: Any, device: str) -> Callable[[], None]:
    """One training step: forward, backward, step, gradients set to None."""
    import torch

    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")

    def step() -> None:
        with autocast:
            loss = _loss(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    return step


def _peak_bytes(name: str, c: dict[str, int], device: str, seed: int, tokens: Any) -> int:
    """CUDA's allocator peak over two steps of ``name`` built alone on the device (its model,
    gradients, optimizer state and activations; nothing of the other candidate)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, opt = _candidate(name, c, device, seed)
    step = _step(model, opt, tokens, device)
    step()  # the first step makes the optimizer's state
    step()
    peak = int(torch.cuda.max_memory_allocated())
    del model, opt, step
    return peak


def bench_train(
    repeats: int = 5,
    seed: int = 0,
    *,
    size: str = "small",
    device: str = "cpu",
    progress: bool = True,
    config: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Time the two candidates' training steps (``_step``), interleaved round by round, after
    (on CUDA) two steps of each alone on the device that measure its peak memory, at the
    model size ``size`` (or ``config``,
    a dict of ``SIZES``' keys); returns ``{"size", "config", "device",
    "repeats", "parameters", "frame_parameters", "model", "rows": [{"name", "median_s", "iqr_s",
    "ratio_to_adamw", "peak_bytes"}], "target": {"train_over_adamw", "met"}, "notes",
    "environment"}``."""
    _check_repeats(repeats)
    check_train_memory(size, config)
    import torch

    from torch_port.experiments.common import resolve_device

    device = resolve_device(device).type  # "cpu" or "cuda"; CUDA without a GPU refused
    c = SIZES[size] if config is None else config
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(c["vocab"], (c["batch"], c["context"]), generator=gen).to(device)
    names = (PORT_ROW, ADAMW_ROW)
    peaks = {
        n: _peak_bytes(n, c, device, seed, tokens) if device == "cuda" else None for n in names
    }
    cands = {name: _candidate(name, c, device, seed) for name in names}
    fns = {name: _step(model, opt, tokens, device) for name, (model, opt) in cands.items()}
    _, samples = _interleaved_rounds(fns, repeats, desc=f"bench train {size}", progress=progress)
    adamw = float(np.median(samples[ADAMW_ROW]))
    rows = [
        {
            "name": name,
            "median_s": float(np.median(samples[name])),
            "iqr_s": _iqr(samples[name]),
            "ratio_to_adamw": float(np.median(samples[name])) / adamw,
            "peak_bytes": peaks[name],
        }
        for name in fns
    ]
    ratio = rows[0]["ratio_to_adamw"]
    model = type(cands[ADAMW_ROW][0]).__name__
    frames = [p for g in cands[PORT_ROW][1].param_groups if g.get("geometry") for p in g["params"]]
    return {
        "size": size,
        "config": dict(c),
        "device": device,
        "repeats": int(repeats),
        "parameters": sum(p.numel() for p in cands[ADAMW_ROW][0].parameters()),
        "frame_parameters": sum(p.numel() for p in frames),
        "model": model,
        "rows": rows,
        "target": {"train_over_adamw": ratio, "met": ratio <= TRAIN_TARGET_VS_ADAMW},
        "notes": [
            f"lr {LR:g} for both, every other setting each optimizer's default: AdamW "
            f"{'fused' if device == 'cuda' else 'foreach'} with weight decay 1e-2 on every "
            "parameter; RiemannianAdam as build_optimizer(model, lr=lr) makes it (weight "
            "decay 0, the frames with moment='frame' and the polar retraction).",
            "bfloat16 autocast on CUDA; float32 on the CPU.",
        ],
        "environment": machine_environment(
            "torch",
            loadavg_at_end=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            torch_threads=torch.get_num_threads(),
        ),
    }


def format_train(result: dict[str, Any]) -> str:
    """Markdown for a ``bench_train`` result."""
    c = result["config"]
    lines = [
        f"Training step of a GPT-2-shaped model ({result['model']}, size {result['size']}: "
        f"{c['layers']} blocks of width {c['d']}, {c['heads']} heads, batch {c['batch']} × "
        f"{c['context']}, {result['parameters'] / 1e6:.1f} M parameters, "
        f"{result['frame_parameters'] / 1e6:.2f} M of them in frames) on {result['device']}, "
        f"{result['repeats']} interleaved rounds:",
        "",
        "| optimizer | median (ms) | IQR (ms) | × AdamW | peak memory (MB) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for x in result["rows"]:
        peak = "–" if x["peak_bytes"] is None else f"{x['peak_bytes'] / 2**20:.0f}"
        lines.append(
            f"| {x['name']} | {1e3 * x['median_s']:.1f} | {1e3 * x['iqr_s']:.1f} "
            f"| {x['ratio_to_adamw']:.2f} | {peak} |"
        )
    t = result["target"]
    verdict = "met" if t["met"] else "NOT met"
    lines += [
        "",
        f"- training step / AdamW's = {t['train_over_adamw']:.2f} (target ≤ "
        f"{TRAIN_TARGET_VS_ADAMW:g}: {verdict})",
        "",
        *result["notes"],
    ]
    return "\n".join(lines)
