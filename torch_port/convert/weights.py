"""Reading per-head factors out of a projection weight, and the parametrization that assembles
the weight back from the factors the optimizer steps (``torch_port.convert``).

Head h of an input projection (q, k, v) is the d×k matrix W^h with q_h = x W^h: rows
h·k…(h+1)·k of the weight in ``nn.Linear``'s convention (out, in), transposed; the output
projection's columns h·k…(h+1)·k give A_h = W_O^hᵀ. A Hugging Face ``Conv1D`` stores the
transpose of ``nn.Linear``'s weight.

This module imports torch only (DESIGN §2).
"""

from __future__ import annotations

import torch
from torch import nn

from torch_port.convert.structures import Attention, Slot

Tensor = torch.Tensor


def linear_view(slot: Slot) -> Tensor:
    t = getattr(slot.holder, slot.attr).detach()
    return t.T if slot.conv1d else t


def split(att: Attention, slot: Slot, t: Tensor) -> dict[str, Tensor]:
    """A weight (Linear convention) or bias as per-role blocks: input roles stacked along the
    rows, (n·k, d) each (a bias: (n·k,)); the output role is the whole (d, h·k)."""
    if slot.roles == ("o",):
        return {"o": t}
    sizes = [att.count(r) * att.head_dim for r in slot.roles]
    return dict(zip(slot.roles, torch.split(t, sizes, dim=0), strict=True))


def to_heads(role: str, block: Tensor, n: int, d: int, k: int) -> Tensor:
    """Per-head factors (n, d, k) of a role's block: q_h = x W^h for an input role (W^h = rows
    h·k…(h+1)·k, transposed); A_h = W_O^hᵀ (columns h·k…(h+1)·k) for the output role."""
    if role == "o":
        return block.reshape(d, n, k).permute(1, 0, 2)
    return block.reshape(n, k, d).transpose(-1, -2)


def from_heads(role: str, heads: Tensor, n: int, d: int, k: int) -> Tensor:
    """The inverse of ``to_heads``: per-head factors (n, d, k) to the role's block."""
    if role == "o":
        return heads.permute(1, 0, 2).reshape(d, n * k)
    return heads.transpose(-1, -2).reshape(n * k, d)


def with_core(heads: Tensor, cores: Tensor) -> Tensor:
    """A_h = W^h S_{h // (n/c)}: n per-head factors (n, d, k) times c R1 cores (c, k, k), each
    core shared by the n/c consecutive heads of its GQA group."""
    return heads @ cores.repeat_interleave(heads.shape[0] // cores.shape[0], dim=0)


class AssembledWeight(nn.Module):
    """Parametrization: a projection weight assembled from the factors that the optimizer steps.

    ``pieces`` lists, per role in the weight's order, (role, source, heads): source "raw" takes
    one original, the role's block as it was (Linear convention); "heads" one original of
    per-head factors (n, d, k), or stacked per GQA group (g, p·d, k); "heads_core" two,
    the factors and the R1 cores (c, k, k): A_h = W^h S_{h // (n/c)}. The weight is the
    concatenation of the blocks (transposed for a Conv1D). The first ``right_inverse`` call
    (made by ``register_parametrization``) returns the initial factors; assigning a new weight
    afterwards is refused, since a weight does not determine a point (assign the factors)."""

    def __init__(
        self,
        pieces: list[tuple[str, str, int]],
        d: int,
        k: int,
        conv1d: bool,
        initial: tuple[Tensor, ...],
    ):
        super().__init__()
        self.pieces, self.d, self.k, self.conv1d = pieces, d, k, conv1d
        self._initial: tuple[Tensor, ...] | None = initial

    def forward(self, *originals: Tensor) -> Tensor:
        blocks, i = [], 0
        for role, source, n in self.pieces:
            if source == "raw":
                blocks.append(originals[i])
                i += 1
                continue
            heads = originals[i].reshape(n, self.d, self.k)
            if source == "heads_core":
                heads = with_core(heads, originals[i + 1])
                i += 1
            i += 1
            blocks.append(from_heads(role, heads, n, self.d, self.k))
        w = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=0)
        return w.T if self.conv1d else w

    def right_inverse(self, weight: Tensor) -> tuple[Tensor, ...]:
        if self._initial is None:
            raise ValueError(
                "a converted attention weight is assembled from its factors; assign the "
                "factors (module.parametrizations.<name>.original<i>), not the weight"
            )
        initial, self._initial = self._initial, None
        return initial
