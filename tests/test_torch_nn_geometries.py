"""torch_port.nn with every geometry on the QK and VO products.

Cases: the eleven names of ``ATTENTION_GEOMETRIES`` × {MHA (d_model 8, 4 heads, head_dim 2), GQA
(d_model 8, 4 query heads, 2 key/value heads, head_dim 3) where allowed: "stiefel" and the block_
variants} × {QK only, QK and VO}, all float64.

Forward tolerance. The module computes logits as (x A_h)(x B_g)ᵀ through SDPA; the check computes
x QK_h xᵀ from the d_model×d_model matrix of the point (the geometry's ``to_matrix``). Each logit
is a sum of products over at most n = 2·d_model + head_dim + T + n_heads terms in both, so
(Higham, γ_n = nu/(1 − nu), u = 2^-53) |Δℓ| ≤ 2γ_n L with L = scale·max (|x||A||B|ᵀ|x|ᵀ); the
softmax turns a logit perturbation into ‖Δp‖₁ ≤ 2 max|Δℓ| (its Jacobian diag(p) − ppᵀ has
∞→1 norm ≤ 2) plus its own rounding ≤ γ_n, and the output of a head is a p-weighted mean of rows
of x VO_h, bounded by V = max |x||B||A|ᵀ: |Δout| ≤ Σ_h (2·2γ_n L + 3γ_n) V to first order, doubled
for second-order terms (``rounding_bound``: 2e-12 to 3e-11 for these cases, a worst case). The
observed error is ≤ 3.1e-15 (rounding errors of random sign); the stated tolerance 1e-12 is
asserted as well.

Manifold tolerance. Every retraction re-orthonormalises the orthonormal factors (a polar factor
or an SVD), so rounding does not accumulate; for a polar factor tests/test_torch_nn.py derives
‖FᵀF − I‖ ≤ 4r(r + 1)u + 2(d + r)r·u, ≤ 1.8e-14 for r ≤ 3 and d ≤ 16 (a block stacks two heads:
2·8 rows); ``check_point`` is called with atol 1e-13.
Measured after 20 steps: ≤ 8.5e-16.
"""

from __future__ import annotations

import copy

import pytest
from conftest import train_mse

from proofs_checks.bounds import gamma

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from torch_port.nn import (  # noqa: E402
    ATTENTION_GEOMETRIES,
    BASE_GEOMETRIES,
    RiemannianMultiheadAttention,
    build_optimizer,
    frame_parameters,
    manifold_points,
)

F64 = torch.float64
FORWARD_TOL = 1e-12
MANIFOLD_ATOL = 1e-13
SIZES = {
    "mha": dict(d_model=8, n_heads=4, n_kv_heads=4, head_dim=2),
    "gqa": dict(d_model=8, n_heads=4, n_kv_heads=2, head_dim=3),
}
FACTORS = {  # factor order of each base geometry, by local parameter name (row, [core,] col)
    "qk": {"fixed_rank_embedded": ["w_q", "s_qk", "w_k"], "other": ["w_q", "w_k"]},
    "vo": {"fixed_rank_embedded": ["w_o", "s_vo", "w_v"], "other": ["w_o", "w_v"]},
}


def _allowed(name: str, heads: str) -> bool:
    return heads == "mha" or name == "stiefel" or name.startswith("block_")


CASES = [
    pytest.param(name, heads, vo, id=f"{name}-{heads}-{'qkvo' if vo else 'qk'}")
    for name in ATTENTION_GEOMETRIES
    for heads in SIZES
    for vo in (False, True)
    if _allowed(name, heads)
]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one thread avoids oversubscribing a loaded 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make(name, heads, vo, seed=0, **kw):
    kw.setdefault("vo_geometry", name if vo else None)
    return RiemannianMultiheadAttention(
        **SIZES[heads],
        qk_geometry=name,
        generator=torch.Generator().manual_seed(seed),
        dtype=F64,
        **kw,
    )


def inputs(m, seed=1, batch=3, length=5):
    return torch.randn(
        batch, length, m.d_model, dtype=F64, generator=torch.Generator().manual_seed(seed)
    )


def base_of(name: str) -> str:
    return name.removeprefix("block_")


def factor_names(product: str, name: str) -> list[str]:
    table = FACTORS[product]
    return table.get(base_of(name), table["other"])


# -- the independent computation ----------------------------------------------------------------
def product_matrices(m, product: str) -> torch.Tensor:
    """(n_heads, d, d): QK_h, or VO_h = (point matrix)ᵀ, from the geometry's ``to_matrix`` of the
    module's point, or from the raw frames/projections when the product has no point."""
    h, d, k = m.n_heads, m.d_model, m.head_dim
    kv = [m.kv_head_of(i) for i in range(h)]
    if product in m.point_groups:
        w = m.point_geometry(product).to_matrix(m.point(product)).reshape(h, d, d)
        return w if product == "qk" else w.transpose(-1, -2)
    if product == "qk":
        a, b = m.w_q.detach().reshape(h, d, k), m.w_k.detach()[kv]
        return a @ b.transpose(-1, -2)
    a, b = m.w_o.detach().reshape(h, d, k), m.w_v.detach()[kv]
    return b @ a.transpose(-1, -2)


def hand_forward(x, qk, vo, scale, causal=False):
    """Σ_h softmax(scale·x QK_h xᵀ) x VO_h with the softmax written out."""
    logits = scale * torch.einsum("btd,hde,bse->bhts", x, qk, x)
    if causal:
        t = x.shape[1]
        logits = logits.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    e = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    p = e / e.sum(dim=-1, keepdim=True)
    return torch.einsum("bhts,bsd,hde->bte", p, x, vo)


def rounding_bound(m, x) -> float:
    """2·Σ_h (4γ_n L + 3γ_n) V (module docstring), from absolute values of the factors."""
    h, t = m.n_heads, x.shape[1]
    n = 2 * m.d_model + m.head_dim + t + h
    gamma_n = gamma(n)
    kv = [m.kv_head_of(i) for i in range(h)]
    ax = x.abs()
    qa = torch.einsum("btd,hdk->bhtk", ax, m.query_weights().detach().abs())
    ka = torch.einsum("bsd,hdk->bhsk", ax, m.w_k.detach()[kv].abs())
    big_l = float((m.head_dim**-0.5) * (qa @ ka.transpose(-1, -2)).max())
    va = torch.einsum("bsd,hdk->bhsk", ax, m.w_v.detach()[kv].abs())
    big_v = float(torch.einsum("bhsk,hek->bhse", va, m.output_weights().detach().abs()).max())
    return 2.0 * h * (4.0 * gamma_n * big_l + 3.0 * gamma_n) * big_v


def kinds_of(m, product):
    return m.point_groups[product]["params"] if product in m.point_groups else None


# -- (1) forward ------------------------------------------------------------------------------
@pytest.mark.parametrize("name, heads, vo", CASES)
def test_forward_equals_the_product_matrices(name, heads, vo):
    m = make(name, heads, vo)
    x = inputs(m)
    qk, vo_m = product_matrices(m, "qk"), product_matrices(m, "vo")
    with torch.no_grad():
        # the module's matrices are the points' matrices (inner length head_dim: ≤ γ_3·|A||B|)
        assert float((m.qk_matrices() - qk).abs().max()) <= 1e-14
        assert float((m.vo_matrices() - vo_m).abs().max()) <= 1e-14
        bound = rounding_bound(m, x)
        for causal in (False, True):
            got = m(x, is_causal=causal)
            want = hand_forward(x, qk, vo_m, m.head_dim**-0.5, causal)
            err = float((got - want).abs().max())
            assert err <= bound and err <= FORWARD_TOL, (causal, err, bound)


# -- (2) on the manifold, before and after 20 steps ----------------------------------------------
def assert_on_manifold(m):
    m.check_points(atol=MANIFOLD_ATOL)
    for n, res in m.frame_residuals().items():
        assert res <= MANIFOLD_ATOL, (n, res)


@pytest.mark.parametrize("name, heads, vo", CASES)
def test_points_stay_on_their_manifold_over_20_steps(name, heads, vo):
    n_points = 0 if name == "stiefel" else 1 + vo
    teacher = make(name, heads, vo, seed=100)
    x = inputs(teacher, seed=2, batch=4)
    with torch.no_grad():
        y = teacher(x, is_causal=True)
    m = make(name, heads, vo)
    assert len(m.point_groups) == n_points and (n_points or m.frame_geometries)
    assert_on_manifold(m)
    opt = build_optimizer(m, tp.RiemannianAdam, lr=1e-2)
    losses = train_mse(m, opt, x, y, is_causal=True)
    assert losses[-1] < 0.9 * losses[0], losses
    assert_on_manifold(m)


# -- (3) optimizer groups --------------------------------------------------------------------------
@pytest.mark.parametrize("name, heads, vo", CASES)
def test_build_optimizer_makes_one_group_per_point(name, heads, vo):
    m = make(name, heads, vo, bias=True)
    opt = build_optimizer(m, lr=1e-3, weight_decay=0.1)
    groups = opt.param_groups
    plain = [g for g in groups if g.get("geometry") is None]
    geo_groups = [g for g in groups if g.get("geometry") is not None]
    products = ["qk", "vo"] if vo else ["qk"]
    h, g, k = m.n_heads, m.n_kv_heads, m.head_dim
    if name == "stiefel":
        (frames,) = geo_groups
        assert frames["geometry"] == "stiefel"
        assert frames["param_names"] == ["w_q", "w_k", "w_v", "w_o"][: 2 * len(products)]
    else:
        block = name.startswith("block_")
        expected = "block_" + base_of(name) if block else name
        assert len(geo_groups) == len(products)
        for product, group in zip(products, geo_groups, strict=True):
            names = factor_names(product, name)
            assert group["geometry"] == expected and group["weight_decay"] == 0.0
            assert group["param_names"] == names
            assert all(p is getattr(m, n) for p, n in zip(group["params"], names, strict=True))
            shapes = [tuple(p.shape) for p in group["params"]]
            want = [(h, 8, k), (g, 8, k)]
            if len(names) == 3:
                want.insert(1, (g if block else h, k, k))
            assert shapes == want
            if block:
                assert (group["n_heads"], group["n_kv_heads"]) == (h, g)
            else:
                assert "n_heads" not in group
    *decayed, undecayed = plain  # the usual rule keeps the biases out of decay
    assert [n for grp in decayed for n in grp["param_names"]] == ([] if vo else ["w_v", "w_o"])
    assert all(grp["weight_decay"] == 0.1 for grp in decayed)
    assert undecayed["weight_decay"] == 0.0
    assert undecayed["param_names"] == ["b_q", "b_v", "b_o"]
    every = [n for grp in groups for n in grp["param_names"]]
    assert sorted(every) == sorted(n for n, _ in m.named_parameters())  # each exactly once


def test_block_name_equals_block_true_and_mha_block_equals_plain():
    for base in BASE_GEOMETRIES:
        a = make(f"block_{base}", "gqa", True)
        b = make(base, "gqa", True, block=True)
        assert a.qk_geometry == b.qk_geometry == f"block_{base}"
        assert a.point_groups == b.point_groups
        for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            assert na == nb and torch.equal(pa, pb)
        # under MHA a group is one head: the block variant draws and stores the plain point
        plain, block = make(base, "mha", True), make(base, "mha", True, block=True)
        for (_, pa), (_, pb) in zip(
            plain.named_parameters(), block.named_parameters(), strict=True
        ):
            assert torch.equal(pa, pb)
        x = inputs(plain)
        assert torch.equal(plain(x), block(x))


def test_wrapped_and_deep_copied_models_keep_their_point_groups():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = make("block_fixed_rank_embedded", "gqa", True)
            self.proj = torch.nn.Linear(8, 8, dtype=F64)

    model = copy.deepcopy(Model())
    names = [p["param_names"] for p in manifold_points(model)]
    assert names == [["attn.w_q", "attn.s_qk", "attn.w_k"], ["attn.w_o", "attn.s_vo", "attn.w_v"]]
    assert frame_parameters(model)["attn.s_vo"] == "block_fixed_rank_embedded"
    opt = build_optimizer(model, lr=1e-3)
    assert [g["param_names"] for g in opt.param_groups] == [*names, ["proj.weight"], ["proj.bias"]]
    # a whole frozen point is left out; a partly frozen one is refused
    model.attn.w_o.requires_grad_(False)
    with pytest.raises(ValueError, match=r"partly frozen.*attn\.w_o"):
        build_optimizer(model, lr=1e-3)
    model.attn.s_vo.requires_grad_(False)
    model.attn.w_v.requires_grad_(False)
    assert len(build_optimizer(model, lr=1e-3).param_groups) == 3


def test_geometry_options_reach_their_groups():
    m = make("fixed_rank_quotient", "mha", False, vo_geometry="stiefel")
    opt = build_optimizer(
        m,
        lr=1e-3,
        frame_options={"trust_radius": 0.5},
        geometry_options={"fixed_rank_quotient": {"metric": "balanced"}},
    )
    r2, st = (g for g in opt.param_groups if g.get("geometry"))
    assert (r2["geometry"], r2["metric"], r2["trust_radius"]) == (
        "fixed_rank_quotient",
        "balanced",
        0.5,
    )
    assert st["geometry"] == "stiefel" and "metric" not in st and st["trust_radius"] == 0.5


# -- (4) refusals -------------------------------------------------------------------------------
@pytest.mark.parametrize("base", BASE_GEOMETRIES)
@pytest.mark.parametrize("product", ["qk_geometry", "vo_geometry"])
def test_plain_variant_under_gqa_is_refused(base, product):
    kw = {"qk_geometry": None, product: base}
    with pytest.raises(ValueError) as err:
        RiemannianMultiheadAttention(8, 4, n_kv_heads=2, **kw)
    msg = str(err.value)
    for part in (product, base, "n_heads=4", "n_kv_heads=2", "block=True", f"block_{base}"):
        assert part in msg, (part, msg)
    with pytest.raises(ValueError, match="n_kv_heads=1"):  # MQA too
        RiemannianMultiheadAttention(8, 4, n_kv_heads=1, **kw)


def test_unknown_geometry_lists_the_valid_names():
    for kw in ({"qk_geometry": "fixed_rank"}, {"vo_geometry": "block_stiefel"}):
        with pytest.raises(ValueError) as err:
            RiemannianMultiheadAttention(8, 4, **kw)
        msg = str(err.value)
        assert repr(next(iter(kw.values()))) in msg and next(iter(kw)) in msg
        assert all(repr(n) in msg for n in ATTENTION_GEOMETRIES), msg


@pytest.mark.parametrize("name", ATTENTION_GEOMETRIES)
def test_head_dim_larger_than_d_model_is_refused(name):
    with pytest.raises(ValueError, match=r"head_dim=9 > d_model=8"):
        RiemannianMultiheadAttention(8, 2, head_dim=9, qk_geometry=name)
    with pytest.raises(ValueError, match=r"head_dim=9 > d_model=8"):
        RiemannianMultiheadAttention(8, 2, head_dim=9, qk_geometry=None, vo_geometry=name)
    RiemannianMultiheadAttention(8, 2, head_dim=9, qk_geometry=None)  # plain: allowed


def test_other_refusals():
    with pytest.raises(ValueError, match="block=True"):
        RiemannianMultiheadAttention(8, 4, qk_geometry=None, block=True)
    m = make("partial_isometry_embedded", "mha", False)
    with pytest.raises(ValueError, match=r"'vo'.*\['qk'\]"):
        m.point("vo")


# -- (5) negative controls -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, heads",
    [
        ("fixed_rank_embedded", "mha"),
        ("block_fixed_rank_embedded", "mha"),
        ("block_fixed_rank_embedded", "gqa"),
    ],
)
def test_control_a_swapped_factor_order_changes_the_step(name, heads):
    """build_optimizer's group takes the same step as a hand-made group [U, S, V] (bitwise); a
    group with U and V swapped takes another step under MHA (the shapes fit, so the optimizer
    accepts it; S enters transposed, so the step differs) and is refused under GQA (the row and
    column factor counts differ): the group test above would notice a swap. (For P1/P2/P3 a swap
    is the transpose of the same point and gives the same step, so no control there.)"""
    x = inputs(make(name, heads, False), seed=3)

    def one_step(order):
        m = make(name, heads, False)
        if order is None:
            opt = build_optimizer(m, lr=1e-2)
        else:
            opt = tp.RiemannianAdam(
                [
                    {
                        "params": [getattr(m, n) for n in order],
                        "geometry": m.qk_geometry,
                        "weight_decay": 0.0,
                        **{k: v for k, v in m.point_groups["qk"].items() if k.startswith("n_")},
                    },
                    {"params": [m.w_v, m.w_o]},
                ],
                lr=1e-2,
            )
        (m(x, is_causal=True) ** 2).mean().backward()
        opt.step()
        return m.qk_matrices().detach()

    built, hand = one_step(None), one_step(["w_q", "s_qk", "w_k"])
    assert torch.equal(built, hand)
    if heads == "gqa":
        with pytest.raises(ValueError, match="expected factors of trailing shapes"):
            one_step(["w_k", "s_qk", "w_q"])
    else:
        assert float((built - one_step(["w_k", "s_qk", "w_q"])).abs().max()) > 1e-4


@pytest.mark.parametrize("heads", ["mha", "gqa"])
def test_control_a_forward_without_the_core_or_untransposed_vo_fails_the_check(heads):
    """The forward check of (1) would notice a forward that dropped the R1 core S (QK_h = U Vᵀ)
    or used the VO point's matrix untransposed: both differ from the module by ≫ 1e-12."""
    m = make("block_fixed_rank_embedded", heads, True)
    x = inputs(m)
    qk, vo_m = product_matrices(m, "qk"), product_matrices(m, "vo")
    h, d, k = m.n_heads, m.d_model, m.head_dim
    u, v = m.w_q.detach(), m.w_k.detach()[[m.kv_head_of(i) for i in range(h)]]
    no_core = u @ v.transpose(-1, -2)
    with torch.no_grad():
        got = m(x)
    assert float((got - hand_forward(x, qk, vo_m, k**-0.5)).abs().max()) <= FORWARD_TOL
    assert float((got - hand_forward(x, no_core, vo_m, k**-0.5)).abs().max()) > 1e-3
    assert float((got - hand_forward(x, qk, vo_m.transpose(-1, -2), k**-0.5)).abs().max()) > 1e-3
    assert d == 8
