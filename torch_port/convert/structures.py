"""The attention structures ``riemannian_attention`` recognises, by their attributes and shapes
(``torch_port.convert``): where a module keeps its query, key, value and output projections, how
many heads it has, and whether it rotates q and k.

This module imports torch and ``torch_port`` only (DESIGN §2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torch_port.optim.groups import _join

Tensor = torch.Tensor


@dataclass(frozen=True)
class Slot:
    """One weight or bias of an attention module and the roles it holds, in order.

    The weight is read in nn.Linear's convention (out_features, in_features); a Hugging Face
    ``Conv1D`` stores its transpose (``conv1d``). ``local`` is the holder's path relative to the
    attention module ("" for the module itself)."""

    holder: nn.Module
    attr: str
    roles: tuple[str, ...]
    local: str
    conv1d: bool = False


@dataclass
class Attention:
    """A recognised attention module: its sizes and where its projections live."""

    kind: str
    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    weights: list[Slot]
    biases: list[Slot]
    rotary: bool = field(default=False)

    def count(self, role: str) -> int:
        """Heads of a role: n_heads for q and o, n_kv_heads for k and v."""
        return self.n_heads if role in "qo" else self.n_kv_heads


def has_rotary(m: nn.Module) -> bool:
    """Whether the module rotates q and k between projection and product: a rotary module of
    its own, or a config with rotary parameters (LLaMA-family)."""
    if any(hasattr(m, a) for a in ("rotary_emb", "rotary_fn")):
        return True
    config = getattr(m, "config", None)
    return any(getattr(config, a, None) is not None for a in ("rope_parameters", "rope_theta"))


# -- recognition ------------------------------------------------------------------------------
def heads_attribute(module: nn.Module) -> int | None:
    for name in ("num_heads", "n_head", "n_heads", "num_attention_heads"):
        v = getattr(module, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    config = getattr(module, "config", None)
    for name in ("num_attention_heads", "n_head"):
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def is_conv1d(m: Any) -> bool:
    """Hugging Face's Conv1D by structure: nf, nx and a weight (nx, nf)."""
    w = getattr(m, "weight", None)
    nf, nx = getattr(m, "nf", None), getattr(m, "nx", None)
    return isinstance(w, Tensor) and w.ndim == 2 and tuple(w.shape) == (nx, nf)


def sizes(name: str, d: int, n_heads: int | None, head_dim: int | None) -> tuple[int, int]:
    """(heads, head_dim) of d features from either attribute; ValueError when they do not
    split d exactly."""
    if n_heads is None and head_dim is None:
        raise ValueError(
            f"{name}: cannot tell its number of heads (no num_heads, n_head, n_heads, "
            "num_attention_heads or head_dim attribute, nor a config with them)"
        )
    if head_dim is None:
        head_dim = d // n_heads if n_heads > 0 and d % n_heads == 0 else 0
    if n_heads is None:
        n_heads = d // head_dim if head_dim > 0 and d % head_dim == 0 else 0
    if n_heads < 1 or head_dim < 1 or n_heads * head_dim != d:
        raise ValueError(
            f"{name}: {d} features do not split into {n_heads} heads of size {head_dim}"
        )
    return n_heads, head_dim


def recognise(name: str, m: nn.Module) -> Attention | None:
    """The structure of ``m`` if it is an attention module this converter knows, else None."""
    if isinstance(m, nn.MultiheadAttention):
        if not m._qkv_same_embed_dim or m.bias_k is not None:
            raise ValueError(
                f"{name}: nn.MultiheadAttention with kdim/vdim ≠ embed_dim or add_bias_kv=True "
                "is not supported (its projections are not one fused in_proj_weight)"
            )
        d, h = m.embed_dim, m.num_heads
        biases = (
            [Slot(m, "in_proj_bias", ("q", "k", "v"), "")] if m.in_proj_bias is not None else []
        )
        return Attention(
            "nn.MultiheadAttention",
            d,
            h,
            h,
            m.head_dim,
            [
                Slot(m, "in_proj_weight", ("q", "k", "v"), ""),
                Slot(m.out_proj, "weight", ("o",), "out_proj"),
            ],
            biases,
        )
    c_attn, c_proj = getattr(m, "c_attn", None), getattr(m, "c_proj", None)
    if c_attn is not None and c_proj is not None and getattr(m, "q_attn", None) is None:
        conv = is_conv1d(c_attn) and is_conv1d(c_proj)
        linear = isinstance(c_attn, nn.Linear) and isinstance(c_proj, nn.Linear)
        if conv or linear:
            w = c_attn.weight.T if conv else c_attn.weight
            if w.shape[0] == 3 * w.shape[1]:
                d = int(w.shape[1])
                head_dim = getattr(m, "head_dim", None)
                head_dim = head_dim if isinstance(head_dim, int) else None
                h, k = sizes(name, d, heads_attribute(m), head_dim)
                if tuple(c_proj.weight.shape) != (d, d):
                    raise ValueError(
                        f"{name}: c_proj's weight has shape {tuple(c_proj.weight.shape)}, "
                        f"expected ({d}, {d}) after a fused c_attn over {d} features"
                    )
                kind = "fused Conv1D" if conv else "fused Linear"
                slots = [
                    Slot(c_attn, "weight", ("q", "k", "v"), "c_attn", conv),
                    Slot(c_proj, "weight", ("o",), "c_proj", conv),
                ]
                biases = (
                    [] if c_attn.bias is None else [Slot(c_attn, "bias", ("q", "k", "v"), "c_attn")]
                )
                return Attention(kind, d, h, h, k, slots, biases)
    proj = {r: getattr(m, f"{r}_proj", None) for r in "qkv"}
    proj["o"] = getattr(m, "o_proj", None) or getattr(m, "out_proj", None)
    if all(isinstance(p, nn.Linear) for p in proj.values()):
        d = proj["q"].in_features
        head_dim = getattr(m, "head_dim", None)
        n_heads = None if isinstance(head_dim, int) else heads_attribute(m)
        _, k = sizes(name, proj["q"].out_features, n_heads, head_dim)
        h = proj["q"].out_features // k
        g = proj["k"].out_features // k
        out = "o_proj" if getattr(m, "o_proj", None) is not None else "out_proj"
        shapes = {r: tuple(p.weight.shape) for r, p in proj.items()}
        if shapes != {"q": (h * k, d), "k": (g * k, d), "v": (g * k, d), "o": (d, h * k)} or h % g:
            raise ValueError(
                f"{name}: projections of shapes {shapes} do not form {h} query heads and {g} "
                f"key/value heads of size {k} over {d} features"
            )
        local = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": out}
        slots = [Slot(proj[r], "weight", (r,), local[r]) for r in "qkvo"]
        biases = [Slot(proj[r], "bias", (r,), local[r]) for r in "qkv" if proj[r].bias is not None]
        return Attention("separate projections", d, h, g, k, slots, biases, has_rotary(m))
    return None


def check_unshared(found: list[tuple[str, nn.Module, Attention]]) -> None:
    """No projection weight held twice (a Linear shared between roles or modules, or a weight
    tied across layers): each would get its own factors and the tie would break."""
    seen: dict[int, str] = {}
    for name, _, att in found:
        for slot in att.weights:
            t = getattr(slot.holder, slot.attr)
            where = f"{name or '<model>'}: {_join(slot.local, slot.attr)}"
            if id(t) in seen:
                raise ValueError(
                    f"{where} is the same tensor as {seen[id(t)]} (a shared or tied "
                    "projection); the converter gives every projection its own factors, which "
                    "would untie them"
                )
            seen[id(t)] = where
