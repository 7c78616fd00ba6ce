"""The block variants of the factored geometries (DESIGN §4.4), in torch.

``BlockGeometry`` is the torch mirror of ``reference.blocks.BlockGeometry``: the base geometry
on the stacked factors [A_i; …] and [B_j; …] of each block group. In torch the groups are one
more batch dimension: a block point is a base point whose tensors have shape (..., G, ...) with
G the number of groups, e.g. block R1: (U (..., G, P·m, r), S (..., G, r, r),
V (..., G, Q·n, r)) for groups of P row and Q column factors. This needs every group to have
the same (P, Q) — true for every GQA pattern (MHA, GQA, MQA) under both groupings
("components", "all"); explicit patterns with unequal components are refused. ``from_heads``
and ``to_heads`` convert between this layout and the per-head layout a model stores
(A (..., p, m, r), B (..., q, n, r), r×r cores (..., G, r, r)), which is also the layout of
an optimizer parameter group naming a block geometry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from torch_port.geometry import Parts
from torch_port.linalg import Tensor


def gqa_pattern(n_heads: int, n_kv_heads: int) -> list[tuple[int, int]]:
    """Active blocks (h, g(h)), g(h) = h // (n_heads / n_kv_heads): MHA when equal, MQA for 1."""
    if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(
            f"n_heads must be a positive multiple of n_kv_heads, got {n_heads} and {n_kv_heads}"
        )
    per = n_heads // n_kv_heads
    return [(h, h // per) for h in range(n_heads)]


def components(pattern: Iterable[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """Connected components of the bipartite graph of E, as (rows, columns), sorted (as the
    reference's ``components``)."""
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(v: tuple[str, int]) -> tuple[str, int]:
        parent.setdefault(v, v)
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for i, j in pattern:
        parent[find(("r", i))] = find(("c", j))
    comps: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for v in sorted(parent):
        rows, cols = comps.setdefault(find(v), ([], []))
        (rows if v[0] == "r" else cols).append(v[1])
    return sorted(comps.values())


class BlockGeometry:
    """The block variant of a base geometry, with the groups as a batch dimension.

    A point is a base point (of sizes P·m, Q·n, r) whose tensors carry one more batch dimension,
    the G groups, just before the matrix dimensions; tangent vectors likewise. The metric is the
    sum of the groups' base metrics; per-frame scalars have shape (..., G, *base.frame_shape)
    (the reference's moment groups in the same order: group by group).

    Args:
        base: a constructor ``base(m, n, r, **base_kwargs)`` of a plain torch geometry.
        m, n, r: one block's row size, column size and rank.
        n_heads, n_kv_heads: the GQA pattern (ignored when ``pattern`` is given).
        pattern: explicit active blocks (i, j); every factor 0…p−1 and 0…q−1 must appear, and
            every group must have the same numbers of row and column factors.
        groups: "components" (default) or "all".
    """

    def __init__(
        self,
        base,
        m: int,
        n: int,
        r: int,
        n_heads: int = 2,
        n_kv_heads: int = 1,
        pattern: Sequence[tuple[int, int]] | None = None,
        groups: str = "components",
        **base_kwargs,
    ):
        for name, v in (
            ("m", m),
            ("n", n),
            ("r", r),
            ("n_heads", n_heads),
            ("n_kv_heads", n_kv_heads),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.pattern = sorted(
            {(int(i), int(j)) for i, j in (pattern or gqa_pattern(n_heads, n_kv_heads))}
        )
        rows = sorted({i for i, _ in self.pattern})
        cols = sorted({j for _, j in self.pattern})
        if rows != list(range(len(rows))) or cols != list(range(len(cols))):
            raise ValueError(
                f"every row and column factor must appear in the pattern: rows {rows}, cols {cols}"
            )
        if groups == "components":
            self.groups = components(self.pattern)
        elif groups == "all":
            self.groups = [(rows, cols)]
        else:
            raise ValueError(f"unknown grouping {groups!r}; choose 'components' or 'all'")
        sizes = {(len(gr), len(gc)) for gr, gc in self.groups}
        if len(sizes) != 1:
            raise ValueError(
                "the torch block variants need groups of equal size (every GQA pattern has "
                f"them); this pattern's groups have (row, column) factor counts {sorted(sizes)}"
            )
        self.m, self.n, self.r = int(m), int(n), int(r)
        self.p, self.q = len(rows), len(cols)
        self.n_groups = len(self.groups)
        self.rows_per_group, self.cols_per_group = sizes.pop()
        self.base = base(self.rows_per_group * m, self.cols_per_group * n, r, **base_kwargs)
        self.name = "block_" + self.base.name
        self.embedded, self.quotient = self.base.embedded, self.base.quotient
        self.retraction_order = self.base.retraction_order
        self.moment_groups = self.base.moment_groups
        self.dim = self.n_groups * self.base.dim
        # Index maps: stacked slot (group c, position k) -> factor, and factor -> flat slot.
        self._row_index = torch.tensor([gr for gr, _ in self.groups]).reshape(-1)
        self._col_index = torch.tensor([gc for _, gc in self.groups]).reshape(-1)
        self._row_slot = torch.argsort(self._row_index)
        self._col_slot = torch.argsort(self._col_index)
        self._row_identity = bool(torch.equal(self._row_index, torch.arange(self.p)))
        self._col_identity = bool(torch.equal(self._col_index, torch.arange(self.q)))

    def __repr__(self) -> str:
        return f"{self.name}(m={self.m}, n={self.n}, r={self.r}, groups={self.groups})"

    # -- layout --------------------------------------------------------------------------------
    def _layout(self, kind: str, to_slots: bool) -> tuple[Tensor, bool, int]:
        """(index map, whether it is the identity, rows of a factor) of the "row" or "col"
        factors: slot -> factor (``_stack``), or with ``to_slots`` factor -> slot
        (``_unstack``)."""
        if kind == "row":
            return (self._row_slot if to_slots else self._row_index), self._row_identity, self.m
        return (self._col_slot if to_slots else self._col_index), self._col_identity, self.n

    def _stack(self, t: Tensor, kind: str) -> Tensor:
        if kind == "core":
            return t
        index, identity, size = self._layout(kind, to_slots=False)
        if not identity:
            t = t.index_select(t.ndim - 3, index.to(t.device))
        per = self.rows_per_group if kind == "row" else self.cols_per_group
        return t.reshape(*t.shape[:-3], self.n_groups, per * size, t.shape[-1])

    def _unstack(self, t: Tensor, kind: str) -> Tensor:
        if kind == "core":
            return t
        slot, identity, size = self._layout(kind, to_slots=True)
        heads = t.reshape(*t.shape[:-3], -1, size, t.shape[-1])
        return heads if identity else heads.index_select(heads.ndim - 3, slot.to(t.device))

    def from_heads(self, x: Parts, kinds: Sequence[str] | None = None) -> tuple:
        """Per-head layout (row factors (..., p, m, r), column factors (..., q, n, r), cores
        (..., G, r, r)) to the stacked group layout. ``kinds`` defaults to the point's."""
        kinds = self.base.point_kinds if kinds is None else kinds
        return tuple(self._stack(t, k) for t, k in zip(x, kinds, strict=True))

    def to_heads(self, x: Parts, kinds: Sequence[str] | None = None) -> tuple:
        """The inverse of ``from_heads``."""
        kinds = self.base.point_kinds if kinds is None else kinds
        return tuple(self._unstack(t, k) for t, k in zip(x, kinds, strict=True))

    def from_params(self, params: Parts) -> tuple:
        """The point held by an optimizer group's parameters (per-head layout)."""
        return self.from_heads(params)

    def to_params(self, x: Parts) -> tuple:
        return self.to_heads(x)

    def head_factors(self, x: Parts) -> tuple[Tensor, Tensor]:
        """The per-head factors (A (..., p, m, r), B (..., q, n, r)), block (i, j) = A_i B_jᵀ."""
        a, b = self.base.pair(x)
        return self._unstack(a, "row"), self._unstack(b, "col")

    def egrad_from_heads(self, x: Parts, g_a: Tensor, g_b: Tensor) -> tuple:
        """Stack the per-head gradients (∂L/∂A_i, ∂L/∂B_j) group by group and convert them to the
        base geometry's factor gradient (a shared factor already holds the sum over its blocks)."""
        return self.base.egrad_from_pair(x, (self._stack(g_a, "row"), self._stack(g_b, "col")))

    # -- the protocol: the base geometry, batched over the groups -------------------------------
    def random_point(self, generator=None, batch_shape: Sequence[int] = (), **kwargs) -> tuple:
        """A base point per element of the batch and group (``dtype``, ``device`` as the base's)."""
        return self.base.random_point(generator, (*batch_shape, self.n_groups), **kwargs)

    def __getattr__(self, name: str):
        # proj, proj_tangent, egrad_to_rgrad, retract, transport, inner, norm, zero_tangent,
        # random_tangent, pair, egrad_from_pair, to_matrix, tangent_to_matrix, check_point,
        # vertical, act, frame_norms, frame_sizes, scale_frames, retract_scaled: the base's, with
        # the group dimension as one more batch dimension.
        if name.startswith("_") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return (self.n_groups, *self.base.frame_shape)

    @property
    def point_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple((self.n_groups, *s) for s in self.base.point_shapes)

    @property
    def tangent_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple((self.n_groups, *s) for s in self.base.tangent_shapes)

    def head_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Trailing shapes of the per-head layout of a point (an optimizer group's params)."""
        out = []
        for kind, shape in zip(self.base.point_kinds, self.base.point_shapes, strict=True):
            if kind == "row":
                out.append((self.p, self.m, self.r))
            elif kind == "col":
                out.append((self.q, self.n, self.r))
            else:
                out.append((self.n_groups, *shape))
        return tuple(out)
