"""The seeded problems of ``rattn compare``, by geometry (``PROBLEMS[geometry][name]``).

Each problem has a NumPy loss gradient (the reference side) and the same loss in torch (the port
side, differentiated by autograd); ``tests/test_compare.py`` checks that the two gradients agree.
Stiefel: ``brockett`` and ``attention_logits``. The ten design points: ``matrix_fit``,
F = Σ_{(i,j) ∈ E} ½‖A_i B_jᵀ − T_ij‖² over the blocks of the pattern (one block for a plain
geometry: ½‖A Bᵀ − T‖²), on a batch of 2×3 points of sizes (6, 5, 2), T with N(0, 1) entries;
variants for the metrics and retractions of each, and for a GQA pattern of the block variants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import reference as ref
from proofs_checks.port_compare.geometries import (
    GEOMETRY_ADAPTERS,
    FrameAdapter,
    PointAdapter,
    point_adapter,
)

Tensor = torch.Tensor


@dataclass(frozen=True)
class Instance:
    """One seeded instance of a problem.

    ``points``: the starting parameters (float64 arrays, each a batch of points (..., d, r));
    ``data``: the constant arrays of the loss; ``egrad(points, data)``: the Euclidean gradients
    in NumPy (the reference side); ``loss(params, data)``: the same loss in torch (the port
    side, differentiated by autograd), with ``data`` converted to the port's dtype and device.
    """

    points: list[np.ndarray]
    data: dict[str, np.ndarray]
    egrad: Callable[[list[np.ndarray], dict[str, np.ndarray]], list[np.ndarray]]
    loss: Callable[[list[Tensor], dict[str, Tensor]], Tensor]


@dataclass(frozen=True)
class Problem:
    """A seeded problem on one geometry: ``build(seed)`` makes an ``Instance``; ``adapter`` holds
    its points on both sides (``GEOMETRY_ADAPTERS[geometry]`` unless the problem needs other
    options, e.g. a GQA pattern or a retraction)."""

    name: str
    geometry: str
    description: str
    build: Callable[[int], Instance]
    adapter: Any = None

    def __post_init__(self) -> None:
        if self.adapter is None and self.geometry in GEOMETRY_ADAPTERS:
            object.__setattr__(self, "adapter", GEOMETRY_ADAPTERS[self.geometry])


#: geometry name -> problem name -> Problem.
PROBLEMS: dict[str, dict[str, Problem]] = {}


def register_problem(problem: Problem) -> Problem:
    if problem.adapter is None:
        raise ValueError(f"no geometry adapter for {problem.geometry!r}")
    PROBLEMS.setdefault(problem.geometry, {})[problem.name] = problem
    return problem


def _brockett(seed: int) -> Instance:
    """f(W) = Σ_b tr(W_bᵀ A_b W_b N) over a batch of two frames on St(8, 3): A_b symmetric with
    unit spectral norm, N = diag(1, 2, 3); ∇f = 2 A_b W_b N."""
    rng = np.random.default_rng(seed)
    d, r, batch = 8, 3, 2
    a = rng.standard_normal((batch, d, d))
    a = (a + np.swapaxes(a, -1, -2)) / 2.0
    a /= np.linalg.norm(a, 2, axis=(-2, -1))[:, None, None]
    n = np.diag(np.arange(1.0, r + 1.0))
    st = ref.Stiefel(d, r)
    w0 = np.stack([st.random_point(rng) for _ in range(batch)])

    def egrad(points, data):
        return [2.0 * data["a"] @ points[0] @ data["n"]]

    def loss(params, data):
        w = params[0]
        return torch.sum(w * (data["a"] @ w @ data["n"]))

    return Instance([w0], {"a": a, "n": n}, egrad, loss)


def _attention_logits(seed: int) -> Instance:
    """f(W_Q, W_K) = Σ_h ½‖X W_Q^h W_K^hᵀ Xᵀ/√r − L_h‖² for two heads, W_Q^h, W_K^h frames on
    St(8, 3), X six tokens of unit norm, L_h the logits of a teacher pair of frames (so the
    minimum is 0); E_h = X W_Q^h W_K^hᵀ Xᵀ/√r − L_h, ∇_Q = Xᵀ E_h X W_K^h/√r,
    ∇_K = Xᵀ E_hᵀ X W_Q^h/√r."""
    rng = np.random.default_rng(seed)
    d, r, heads, tokens = 8, 3, 2, 6
    st = ref.Stiefel(d, r)
    x = rng.standard_normal((tokens, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    s = math.sqrt(r)
    tq = np.stack([st.random_point(rng) for _ in range(heads)])
    tk = np.stack([st.random_point(rng) for _ in range(heads)])
    target = x @ tq @ np.swapaxes(tk, -1, -2) @ x.T / s
    wq = np.stack([st.random_point(rng) for _ in range(heads)])
    wk = np.stack([st.random_point(rng) for _ in range(heads)])

    def egrad(points, data):
        q, k = points
        x, lt = data["x"], data["target"]
        e = x @ q @ np.swapaxes(k, -1, -2) @ x.T / s - lt
        xex = x.T @ e @ x
        return [xex @ k / s, np.swapaxes(xex, -1, -2) @ q / s]

    def loss(params, data):
        q, k = params
        x = data["x"]
        e = x @ q @ k.transpose(-1, -2) @ x.T / s - data["target"]
        return 0.5 * torch.sum(e * e)

    return Instance([wq, wk], {"x": x, "target": target}, egrad, loss)


register_problem(
    Problem(
        "brockett",
        "stiefel",
        "Brockett cost Σ tr(WᵀAWN) on a batch of 2 frames of St(8, 3)",
        _brockett,
    )
)
#: Retractions and metrics of St(d, r) other than the default (polar, embedded), each a variant of
#: ``brockett``.
STIEFEL_VARIANTS = [
    {"retraction": "polar_svd"},
    {"retraction": "qr"},
    {"retraction": "exp"},
    {"metric": "canonical"},
]


def variant_name(base: str, options: dict[str, Any]) -> str:
    """'brockett' or e.g. 'matrix_fit[metric=balanced]'."""
    if not options:
        return base
    return base + "[" + ",".join(f"{k}={v}" for k, v in options.items()) + "]"


for _options in STIEFEL_VARIANTS:
    register_problem(
        Problem(
            variant_name("brockett", _options),
            "stiefel",
            f"brockett with {_options}",
            _brockett,
            FrameAdapter(**_options),
        )
    )
register_problem(
    Problem(
        "attention_logits",
        "stiefel",
        "½‖X W_Q W_Kᵀ Xᵀ/√r − L‖² per head, 2 heads, W_Q, W_K frames of St(8, 3), 6 tokens",
        _attention_logits,
    )
)


# -- the ten design points ----------------------------------------------------------------------
BATCH = (2, 3)


def matrix_fit(adapter: PointAdapter) -> Callable[[int], Instance]:
    """F = Σ_{(i,j) ∈ E} ½‖A_i B_jᵀ − T_ij‖² for a batch of ``BATCH`` points of the adapter's
    geometry, (A, B) the factor pair of each point (per head for a block variant), T_ij with
    N(0, 1) entries. Reference gradient: ∂F/∂A_i = Σ_j E_ij B_j, ∂F/∂B_j = Σ_i E_ijᵀ A_i,
    E_ij = A_i B_jᵀ − T_ij, turned into the factor gradient by the geometry (``egrad_from_heads``
    or ``egrad_from_matrix``)."""

    def build(seed: int) -> Instance:
        rng = np.random.default_rng(seed)
        rg, tg = adapter.geometries()
        x0 = [rg.random_point(rng) for _ in np.ndindex(*BATCH)]
        block = adapter.block
        shape = (rg.p, rg.q, adapter.m, adapter.n) if block else (adapter.m, adapter.n)
        targets = rng.standard_normal((*BATCH, *shape))
        like = _layout(adapter, tg, x0)
        points = adapter.assemble(x0, like)

        def egrad(arrays, data):
            grads = []
            for (g, x), e in zip(adapter.elements(arrays), np.ndindex(*BATCH), strict=True):
                t = data["targets"][e]
                if not block:
                    grads.append(g.egrad_from_matrix(x, g.to_matrix(x) - t))
                    continue
                a, b = g.head_factors(x)
                ga = [np.zeros_like(a_i) for a_i in a]
                gb = [np.zeros_like(b_j) for b_j in b]
                for i, j in g.pattern:
                    err = a[i] @ b[j].T - t[i, j]
                    ga[i] += err @ b[j]
                    gb[j] += err.T @ a[i]
                grads.append(g.egrad_from_heads(x, ga, gb))
            return adapter.assemble(grads, arrays)

        def loss(params, data):
            t = data["targets"]
            if not block:
                w = tg.to_matrix(tuple(params))
                return 0.5 * ((w - t) ** 2).sum()
            a, b = tg.head_factors(tg.from_params(tuple(params)))
            total = 0.0
            for i, j in rg.pattern:
                blk = a[..., i, :, :] @ b[..., j, :, :].transpose(-1, -2) - t[..., i, j, :, :]
                total = total + 0.5 * (blk**2).sum()
            return total

        return Instance(points, {"targets": targets}, egrad, loss)

    return build


def _layout(adapter: PointAdapter, tg: Any, x0: list) -> list[np.ndarray]:
    """Zero arrays of the port's parameter layout for a batch of reference points."""
    if adapter.block:
        stacked = [
            np.zeros((*BATCH, tg.n_groups, *np.shape(p))) for p in x0[0][0]
        ]  # per group: the base point's parts
    else:
        stacked = [np.zeros((*BATCH, *np.shape(p))) for p in x0[0]]
    return [t.numpy() for t in tg.to_params(tuple(torch.from_numpy(a) for a in stacked))]


#: Option variants of the ten (each also a problem): metrics and retractions other than the
#: defaults, and a GQA pattern (4 query heads sharing 2 key factors) under both groupings.
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "fixed_rank_embedded": [{"retraction": "qr"}],
    "fixed_rank_quotient": [{"metric": "balanced"}],
    "block_fixed_rank_quotient": [{"metric": "balanced"}],
    "partial_isometry_embedded": [{"retraction": "qr"}],
    "partial_isometry_quotient": [{"retraction": "polar_svd"}],
    "stiefel_pair": [{"retraction": "exp"}, {"retraction": "qr"}],
    "block_stiefel_pair": [
        {"n_heads": 4, "n_kv_heads": 2, "groups": "components"},
        {"n_heads": 4, "n_kv_heads": 2, "groups": "all"},
    ],
    "block_fixed_rank_embedded": [
        {"n_heads": 4, "n_kv_heads": 2, "groups": "components"},
        {"n_heads": 4, "n_kv_heads": 2, "groups": "all"},
    ],
}


for _name in ref.GEOMETRIES:
    for _options in [{}, *VARIANTS.get(_name, [])]:
        _adapter = point_adapter(_name, **_options)
        register_problem(
            Problem(
                variant_name("matrix_fit", _options),
                _name,
                f"Σ ½‖A_i B_jᵀ − T_ij‖² over the blocks, batch 2×3 of ({_adapter.m}, "
                f"{_adapter.n}, {_adapter.r}) points" + (f", {_options}" if _options else ""),
                matrix_fit(_adapter),
                _adapter,
            )
        )
