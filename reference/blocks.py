"""Block variants (DESIGN §4.4): a base geometry applied to the stacked factors of block groups.

A layer has row factors A_1 … A_p (m×r, e.g. query heads) and column factors B_1 … B_q (n×r,
e.g. key heads); the loss sees the blocks A_i B_jᵀ of an active pattern E (MHA: (h, h); GQA:
(h, g(h)); MQA: (h, 1)). A *group* is a set of row and column factors; the block variant is the
base geometry on the stacked factors [A_i; …] and [B_j; …] of each group (rank r, sizes p_c·m and
q_c·n). Groups default to the connected components of E; ``groups="all"`` puts every factor of the
layer in one group. Gradients of the stack are the stacked per-factor gradients, a factor shared by
several blocks receiving their sum, so nothing larger than the factors is formed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from reference.geometry import Point, Tangent, check_sizes, is_integer
from reference.linalg import Array
from reference.product import Product


def gqa_pattern(n_heads: int, n_kv_heads: int) -> list[tuple[int, int]]:
    """Active blocks (h, g(h)), g(h) = h // (n_heads / n_kv_heads): MHA when equal, MQA for 1."""
    check_sizes("gqa_pattern", n_heads=n_heads, n_kv_heads=n_kv_heads)
    if n_heads % n_kv_heads:
        raise ValueError(
            f"n_heads must be a positive multiple of n_kv_heads, got {n_heads} and {n_kv_heads}"
        )
    per = n_heads // n_kv_heads
    return [(h, h // per) for h in range(n_heads)]


def components(pattern: Iterable[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """Connected components of the bipartite graph of E, as (rows, columns), sorted."""
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


class BlockGeometry(Product):
    """The block variant of a base geometry.

    A point is the tuple over groups of base points of the stacked factors; a tangent vector the
    tuple of base tangent vectors; the metric is the sum of the groups' base metrics. Moments are
    per stored frame of each group (the base geometry's moment groups).

    Args:
        base: a constructor ``base(m, n, r, **base_kwargs)`` of a plain geometry.
        m, n, r: one block's row size, column size and rank.
        n_heads, n_kv_heads: the GQA pattern (ignored when ``pattern`` is given).
        pattern: explicit active blocks (i, j); every factor 0…p−1 and 0…q−1 must appear.
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
        check_sizes(f"the block variant of {getattr(base, '__name__', base)}", m=m, n=n, r=r)
        if pattern is None:
            pattern = gqa_pattern(n_heads, n_kv_heads)
        blocks = [tuple(b) if isinstance(b, tuple | list | np.ndarray) else b for b in pattern]
        for b in blocks:
            if not (isinstance(b, tuple) and len(b) == 2 and all(map(is_integer, b))):
                raise TypeError(f"pattern entries must be pairs (i, j) of integers, got {b!r}")
            if min(b) < 0:
                raise ValueError(f"pattern entries must be ≥ 0, got {b!r}")
        if not blocks:
            raise ValueError("pattern names no active block")
        self.pattern = sorted({(int(i), int(j)) for i, j in blocks})
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
        self.m, self.n, self.r = m, n, r
        self.p, self.q = len(rows), len(cols)
        bases = [base(len(gr) * m, len(gc) * n, r, **base_kwargs) for gr, gc in self.groups]
        super().__init__(*bases)
        first = bases[0]
        self.name = "block_" + first.name
        self.embedded, self.quotient = first.embedded, first.quotient
        self.retraction_order = first.retraction_order

    def __repr__(self) -> str:
        return f"{self.name}(m={self.m}, n={self.n}, r={self.r}, groups={self.groups})"

    # -- per-factor views (what a model's loss sees) ------------------------------------------
    def head_factors(self, x: Point) -> tuple[list[Array], list[Array]]:
        """The row factors A_1 … A_p and column factors B_1 … B_q with block (i, j) = A_i B_jᵀ."""
        a_all, b_all = [None] * self.p, [None] * self.q
        for (rows, cols), f, xg in zip(self.groups, self.factors, x, strict=True):
            a, b = f.pair(xg)
            for k, i in enumerate(rows):
                a_all[i] = a[k * self.m : (k + 1) * self.m]
            for k, j in enumerate(cols):
                b_all[j] = b[k * self.n : (k + 1) * self.n]
        return a_all, b_all

    def egrad_from_heads(self, x: Point, g_a: Sequence[Array], g_b: Sequence[Array]) -> Tangent:
        """Stack the per-factor gradients (∂L/∂A_i, ∂L/∂B_j) group by group and convert them
        to each base geometry's factor gradient."""
        return tuple(
            f.egrad_from_pair(
                xg, (np.vstack([g_a[i] for i in rows]), np.vstack([g_b[j] for j in cols]))
            )
            for (rows, cols), f, xg in zip(self.groups, self.factors, x, strict=True)
        )

    # -- checks only --------------------------------------------------------------------------
    def to_matrix(self, x: Point) -> tuple[Array, ...]:
        """Each group's stacked matrix [A_i; …][B_j; …]ᵀ (checks only)."""
        return self._each("to_matrix", x)

    def egrad_from_matrix(self, x: Point, g: tuple[Array, ...]) -> Tangent:
        return self._each("egrad_from_matrix", x, g)

    def vertical(self, x: Point, omega: tuple[Array, ...]) -> Tangent:
        return self._each("vertical", x, omega)

    def act(self, x: Point, g: tuple[Array, ...]) -> Point:
        return self._each("act", x, g)
