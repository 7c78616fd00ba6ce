"""The attention modules PORT-10 converts, and what its checks read from them: a LLaMA-style
module with separate q/k/v/o projections (``separate_module``), a GPT-2-style one with a
fused ``c_attn`` (``fused_module``, read through ``FusedView``), their logits and
value-output (``maps``) and their per-head factors (``factors``). float64 throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The module's width, head size, tokens and the (query, key/value) head counts converted.
CONVERT_D, CONVERT_K, TOKENS = 12, 3, 5
HEADS = ((4, 4), (4, 2))


def separate_module(seed: int, heads: int, kv_heads: int) -> Any:
    """A LLaMA-style attention module (q/k/v/o projections, q/k/v biases of scale 0.1)."""
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d, k = CONVERT_D, CONVERT_K
            self.q_proj = nn.Linear(d, heads * k, dtype=torch.float64)
            self.k_proj = nn.Linear(d, kv_heads * k, dtype=torch.float64)
            self.v_proj = nn.Linear(d, kv_heads * k, dtype=torch.float64)
            self.o_proj = nn.Linear(heads * k, d, bias=False, dtype=torch.float64)
            self.num_heads, self.head_dim = heads, k

    torch.manual_seed(seed)
    module = Attention()
    with torch.no_grad():
        for p in (module.q_proj.bias, module.k_proj.bias, module.v_proj.bias):
            p.normal_(0.0, 0.1)
    return module


def fused_module(seed: int, heads: int) -> Any:
    """A GPT-2-style attention module: one fused ``c_attn`` Linear(d, 3d) for q, k and v (its
    bias of scale 0.1) and ``c_proj`` Linear(d, d) without bias."""
    import torch
    from torch import nn

    class Fused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(CONVERT_D, 3 * CONVERT_D, dtype=torch.float64)
            self.c_proj = nn.Linear(CONVERT_D, CONVERT_D, bias=False, dtype=torch.float64)
            self.num_heads, self.head_dim = heads, CONVERT_K

    torch.manual_seed(seed)
    module = Fused()
    with torch.no_grad():
        module.c_attn.bias.normal_(0.0, 0.1)
    return module


class _Part:
    """Rows i·d…(i+1)·d of a fused Linear, read at each access, as a projection."""

    def __init__(self, linear: Any, i: int) -> None:
        self.linear, self.rows = linear, slice(i * CONVERT_D, (i + 1) * CONVERT_D)

    @property
    def weight(self) -> Any:
        return self.linear.weight[self.rows]

    @property
    def bias(self) -> Any:
        return self.linear.bias[self.rows]

    def __call__(self, x: Any) -> Any:
        return x @ self.weight.T + self.bias


class FusedView:
    """The q/k/v/o projections of a ``fused_module`` as the measurements here read them."""

    def __init__(self, module: Any) -> None:
        self.o_proj = module.c_proj
        self.q_proj, self.k_proj, self.v_proj = (_Part(module.c_attn, i) for i in range(3))


def per_head(t: Any, n: int) -> Any:
    """(tokens, n·k) projections as (n, tokens, k): head h is columns h·k…(h+1)·k."""
    return t.reshape(t.shape[0], n, CONVERT_K).transpose(0, 1)


def maps(module: Any, x: Any, heads: int, kv_heads: int) -> tuple[Any, Any]:
    """What the module's forward forms from its projections: the logits L_h = q_h k_{h//p}ᵀ
    (heads, tokens, tokens), and the value-output Z = o_proj([v_{h//p}]_h) (tokens, d)."""
    p = heads // kv_heads
    q = per_head(module.q_proj(x), heads)
    k = per_head(module.k_proj(x), kv_heads).repeat_interleave(p, dim=0)
    v = per_head(module.v_proj(x), kv_heads).repeat_interleave(p, dim=0)
    return q @ k.mT, module.o_proj(v.transpose(0, 1).reshape(x.shape[0], -1))


def factors(module: Any, heads: int, kv_heads: int) -> dict[str, np.ndarray]:
    """The per-head factors the forward reads, as NumPy arrays: W_Q^h, W_K^g, W_V^g (d, k) with
    q_h = x W_Q^h, and A_h = W_O^hᵀ (d, k), the output's columns h·k…(h+1)·k."""
    d, k = CONVERT_D, CONVERT_K

    def rows(w: Any, n: int) -> np.ndarray:
        return w.detach().numpy().reshape(n, k, d).transpose(0, 2, 1)

    o = module.o_proj.weight.detach().numpy()
    return {
        "q": rows(module.q_proj.weight, heads),
        "k": rows(module.k_proj.weight, kv_heads),
        "v": rows(module.v_proj.weight, kv_heads),
        "o": np.stack([o[:, h * k : (h + 1) * k] for h in range(heads)]),
    }
