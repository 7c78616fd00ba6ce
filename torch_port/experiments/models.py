"""Small transformers built on ``RiemannianMultiheadAttention`` for the experiments.

``Transformer(embed, ...)`` is a stack of blocks x ← x + attn(norm(x)); x ← x + mlp(norm(x))
(pre-norm; ``layernorm=False`` makes every norm the identity, as in the grokking model), then a
final norm and a linear read-out. Positions enter through a learned positional embedding added
to ``embed``'s output, so token rows are not exchangeable. The attention's QK (and optionally VO)
products live on the geometry the caller names; every other weight is plain, and
``torch_port.nn.build_optimizer`` routes them accordingly.
"""

from __future__ import annotations

import torch
from torch import nn

from torch_port.nn import RiemannianMultiheadAttention

Tensor = torch.Tensor

#: The initialisations of ``Transformer``'s plain weights.
INITS = ("scaled", "torch")


class TokenEmbedding(nn.Embedding):
    """Integer tokens (B, T) → vectors (B, T, d_model)."""


class PatchEmbedding(nn.Linear):
    """Flattened patches (B, T, patch_dim) → vectors (B, T, d_model), a linear map."""


class Block(nn.Module):
    """One pre-norm transformer block: ``attn`` (an attention module mapping (B, T, d_model) to
    itself) and a ReLU MLP, each with a residual."""

    def __init__(
        self,
        d_model: int,
        d_mlp: int,
        attn: nn.Module,
        *,
        layernorm: bool = True,
        causal: bool = False,
    ):
        super().__init__()
        self.causal = causal
        self.norm1 = nn.LayerNorm(d_model) if layernorm else nn.Identity()
        self.attn = attn
        self.norm2 = nn.LayerNorm(d_model) if layernorm else nn.Identity()
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.ReLU(), nn.Linear(d_mlp, d_model))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), is_causal=self.causal)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """``embed`` → + positional embedding → ``n_layers`` blocks → norm → linear read-out.

    ``forward(inputs)`` returns logits of shape (B, T, n_out). Initialisation from ``seed``:
    the attention projections (frames or plain) are drawn by the attention modules from one
    stream (seed + 2³¹), every other weight from another (seed), in module order, so that models
    that differ only in their geometries share every non-attention weight exactly (paired
    comparisons), whatever ran before. Plain weights: N(0, 1/fan_in) for linear maps,
    N(0, 1/d_model) for embedding tables, N(0, 0.02²) for the positional table, zero biases,
    unit LayerNorm gains ("scaled", the default, with the attention's plain projections uniform
    in ±1/sqrt(fan-in)); ``init="torch"`` keeps PyTorch's own initialisations instead
    (``_draw_torch``; the attention's plain projections as ``nn.MultiheadAttention``'s). Inputs
    longer than ``max_len`` are refused."""

    def __init__(
        self,
        embed: nn.Module,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_mlp: int,
        n_out: int,
        max_len: int,
        *,
        seed: int = 0,
        n_kv_heads: int | None = None,
        qk_geometry: str | None = None,
        vo_geometry: str | None = None,
        block: bool = False,
        layernorm: bool = True,
        causal: bool = False,
        init: str = "scaled",
    ):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        self.embed = embed
        self.pos = nn.Parameter(torch.zeros(max_len, d_model))
        attention_stream = torch.Generator().manual_seed(seed + 2**31)
        self.blocks = nn.ModuleList(
            Block(
                d_model,
                d_mlp,
                RiemannianMultiheadAttention(
                    d_model,
                    n_heads,
                    n_kv_heads=n_kv_heads,
                    qk_geometry=qk_geometry,
                    vo_geometry=vo_geometry,
                    block=block,
                    generator=attention_stream,
                    plain_init="linear" if init == "scaled" else "multihead",
                ),
                layernorm=layernorm,
                causal=causal,
            )
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model) if layernorm else nn.Identity()
        self.head = nn.Linear(d_model, n_out)
        if init == "scaled":
            self._draw_plain(torch.Generator().manual_seed(seed))
        else:
            self._draw_torch(seed)

    @torch.no_grad()
    def _draw_torch(self, seed: int) -> None:
        """PyTorch's own initialisation of every non-attention module (``reset_parameters``:
        N(0, 1) embedding tables, ``nn.Linear``'s Kaiming-uniform weights and uniform biases),
        drawn from the global generator seeded with ``seed`` and restored afterwards; the
        positional table N(0, 0.02²) as for "scaled"."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for name, module in self.named_modules():
                if ".attn" in f".{name}" or not hasattr(module, "reset_parameters"):
                    continue
                if not any(True for _ in module.parameters(recurse=False)):
                    continue
                module.reset_parameters()
            self.pos.copy_(torch.randn(self.pos.shape) * 0.02)

    @torch.no_grad()
    def _draw_plain(self, gen: torch.Generator) -> None:
        for name, p in self.named_parameters():
            if ".attn." in name:
                continue
            if name == "pos":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()

    def forward(self, inputs: Tensor, last_only: bool = False) -> Tensor:
        """Logits (B, T, n_out); with ``last_only`` those of the last position only, (B, 1,
        n_out), computed from its query alone: exact for one layer (the last position's output
        reads every key and value but no other query; causal or not, the last query sees every
        key); forward and backward 2.1–2.3 × faster on the grokking model (p = 59, 1,740
        pairs, measured). Refused for deeper models, whose later layers
        need every position."""
        if inputs.shape[1] > self.pos.shape[0]:
            raise ValueError(
                f"sequence length {inputs.shape[1]} exceeds max_len={self.pos.shape[0]}"
            )
        x = self.embed(inputs)
        x = x + self.pos[: x.shape[1]]
        if last_only:
            if len(self.blocks) != 1:
                raise ValueError(
                    f"last_only is exact for one layer only, this model has {len(self.blocks)}"
                )
            blk = self.blocks[0]
            h = blk.norm1(x)
            x = x[:, -1:] + blk.attn(h[:, -1:], h, h)
            x = x + blk.mlp(blk.norm2(x))
            return self.head(self.norm(x))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))
