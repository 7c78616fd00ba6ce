"""``torch_port.convert.riemannian_attention`` on the structures it recognises without
third-party packages (``nn.MultiheadAttention``, a nanoGPT-style fused ``nn.Linear``, separate
q/k/v/o projections with grouped key heads), and ``build_optimizer(no_decay=...)``.

Tolerances. An exact conversion (R1 from the SVD of each product, R2 keeping the factors)
reproduces each product W_Q^h W_K^hᵀ in float64 to a relative error γ ≤ c·k·u·κ (thin QR and
SVD are backward stable; κ = σ_max/σ_min of the product, measured here), so the model's output
moves by at most a Lipschitz factor times γ. ``exact_tol`` takes c = 8 and a Lipschitz factor of
10³ (the models here have two layers of unit-scale weights, O(1) activations). The negative
controls (Stiefel frames, which cannot keep the scale of a product, and an R1 core moved by
1e-9) move the output by orders of magnitude more.
"""

from __future__ import annotations

import copy
import tempfile

import pytest
from conftest import U

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from torch_port import linalg as tl  # noqa: E402
from torch_port.convert import riemannian_attention  # noqa: E402
from torch_port.nn import (  # noqa: E402
    build_optimizer,
    frame_parameters,
    manifold_points,
    parameter_groups,
    reproject,
)
from torch_port.optim.groups import usual_no_decay  # noqa: E402
from torch_port.optim.points import Geometries  # noqa: E402

F64 = torch.float64
D, H = 16, 4


class NanoAttention(nn.Module):
    """nanoGPT's CausalSelfAttention: one fused Linear c_attn (d → 3d), c_proj, n_head."""

    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d, dtype=F64)
        self.c_proj = nn.Linear(d, d, dtype=F64)
        self.n_head, self.n_embd = n_head, d

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class GQAAttention(nn.Module):
    """LLaMA-style separate projections, 4 query heads over 2 key/value heads, q/k/v biases."""

    def __init__(self, d: int, n_heads: int, n_kv: int):
        super().__init__()
        self.head_dim = d // n_heads
        self.q_proj = nn.Linear(d, n_heads * self.head_dim, dtype=F64)
        self.k_proj = nn.Linear(d, n_kv * self.head_dim, dtype=F64)
        self.v_proj = nn.Linear(d, n_kv * self.head_dim, dtype=F64)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d, bias=False, dtype=F64)
        self.n_heads, self.n_kv = n_heads, n_kv

    def forward(self, x):
        b, t, _ = x.shape
        k_ = self.head_dim
        q = self.q_proj(x).view(b, t, self.n_heads, k_).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, k_).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, k_).transpose(1, 2)
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MHABlock(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, n_heads, batch_first=True, dtype=F64)

    def forward(self, x):
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


class Model(nn.Module):
    """Embedding, two attention blocks with LayerNorm and a read-out."""

    def __init__(self, block, vocab: int = 11):
        super().__init__()
        self.emb = nn.Embedding(vocab, D, dtype=F64)
        self.blocks = nn.ModuleList([block() for _ in range(2)])
        self.norm = nn.LayerNorm(D, dtype=F64)
        self.head = nn.Linear(D, vocab, dtype=F64)

    def forward(self, tokens):
        h = self.emb(tokens)
        for blk in self.blocks:
            h = h + blk(self.norm(h))
        return self.head(self.norm(h))


STRUCTURES = {
    "nn.MultiheadAttention": lambda: MHABlock(D, H),
    "fused Linear": lambda: NanoAttention(D, H),
    "separate projections": lambda: GQAAttention(D, H, 2),
}


def make(structure: str, seed: int = 0) -> Model:
    torch.manual_seed(seed)
    model = Model(STRUCTURES[structure])
    with torch.no_grad():  # non-zero biases, so that their mapping is checked too
        for name, p in model.named_parameters():
            if name.endswith("bias") and "norm" not in name:
                p.normal_(0.0, 0.1)
    return model


TOKENS = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(1))


def product_condition(model: nn.Module) -> float:
    """max over heads of σ_max/σ_min of W_Q^h W_K^gᵀ, read from the model before conversion."""
    worst = 1.0
    for m in model.modules():
        for att_q, att_k in _qk_blocks(m):
            s = torch.linalg.svdvals(att_q @ att_k.mT)[..., : att_q.shape[-1]]
            worst = max(worst, float((s[..., 0] / s[..., -1]).max()))
    return worst


def _qk_blocks(m):
    """Per-head (W_Q^h, W_K^{g(h)}) in float64 of the test's three structures."""
    k = D // H
    if isinstance(m, nn.MultiheadAttention):
        w = m.in_proj_weight.detach()
        q, kk = w[:D], w[D : 2 * D]
    elif isinstance(m, NanoAttention):
        w = m.c_attn.weight.detach()
        q, kk = w[:D], w[D : 2 * D]
    elif isinstance(m, GQAAttention):
        q, kk = m.q_proj.weight.detach(), m.k_proj.weight.detach()
    else:
        return []
    qh = q.reshape(-1, k, D).mT
    kh = kk.reshape(-1, k, D).mT.repeat_interleave(qh.shape[0] // (kk.shape[0] // k), dim=0)
    return [(qh, kh)]


def exact_tol(kappa: float, scale: float) -> float:
    """10³ · 8·k·u·κ relative to the output's scale (module docstring)."""
    return 1e3 * 8 * (D // H) * U * kappa * scale


@pytest.mark.parametrize("structure", list(STRUCTURES))
@pytest.mark.parametrize("geometry", ["fixed_rank_embedded", "fixed_rank_quotient"])
def test_an_exact_conversion_keeps_the_forward(structure, geometry):
    model = make(structure)
    kappa = product_condition(model)
    with torch.no_grad():
        before = model(TOKENS)
    done = riemannian_attention(model, geometry, geometry)
    assert [c.kind for c in done] == [structure, structure]
    assert all(c.qk_change <= 8 * (D // H) * U * kappa for c in done)
    with torch.no_grad():
        after = model(TOKENS)
    tol = exact_tol(kappa, float(before.abs().max()))
    assert float((after - before).abs().max()) <= tol
    # near-miss control: one R1 core (or R2 factor) moved by a relative 1e-9 is seen
    point = manifold_points(model)[0]
    with torch.no_grad():
        p = model.get_parameter(point["param_names"][1])
        p.mul_(1 + 1e-9)
        moved = model(TOKENS)
    assert float((moved - before).abs().max()) > tol


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_frames_are_polar_factors_and_move_the_forward(structure):
    model = make(structure)
    heads = _qk_blocks(next(m for m in model.modules() if _qk_blocks(m)))[0][0]
    with torch.no_grad():
        before = model(TOKENS)
    done = riemannian_attention(model, "stiefel", "stiefel")
    frames = frame_parameters(model)
    assert len(frames) == 8 and set(frames.values()) == {"stiefel"}
    first = model.get_parameter(next(iter(frames)))
    assert torch.allclose(first, tl.polar(heads), atol=1e-13, rtol=0)
    for name in frames:
        assert float(tl.orthonormality_residual(model.get_parameter(name).detach()).max()) <= 1e-14
    # the negative control of the exact test: frames cannot keep the products' scale
    with torch.no_grad():
        after = model(TOKENS)
    assert float((after - before).abs().max()) > 1e-3
    assert all(c.qk_change > 1e-2 for c in done)


def test_biases_follow_the_factors():
    """q·k logits of an exact conversion, biases included, equal the original ones."""
    model = make("fused Linear")
    att = model.blocks[0]
    x = torch.randn(2, 5, D, dtype=F64, generator=torch.Generator().manual_seed(3))

    def logits(m):
        q, k, _ = m.c_attn(x).split(D, dim=2)
        q = q.view(2, 5, H, -1).transpose(1, 2)
        k = k.view(2, 5, H, -1).transpose(1, 2)
        return q @ k.mT

    with torch.no_grad():
        before = logits(att)
    kappa = product_condition(model)
    riemannian_attention(model, "fixed_rank_embedded")
    with torch.no_grad():
        after = logits(att)
    assert float((after - before).abs().max()) <= exact_tol(kappa, float(before.abs().max()))
    # control: the same factors with the old biases give other logits
    with torch.no_grad():
        att.c_attn.bias.normal_(0.0, 0.1)
        assert float((logits(att) - before).abs().max()) > 1e-3


@pytest.mark.parametrize(
    "qk, vo, expected",
    [
        ("fixed_rank_embedded", None, "block_fixed_rank_embedded"),
        ("stiefel_pair", "partial_isometry_quotient", "block_stiefel_pair"),
        ("stiefel", None, "stiefel"),
    ],
)
def test_grouped_key_heads_get_block_variants(qk, vo, expected):
    model = make("separate projections")
    (first, _) = riemannian_attention(model, qk, vo)
    assert (first.n_heads, first.n_kv_heads, first.qk_geometry) == (4, 2, expected)
    assert all(g["n_heads"] == 4 and g["n_kv_heads"] == 2 for g in manifold_points(model))
    with pytest.raises(ValueError, match=r"plain variant.*n_kv_heads=2"):
        riemannian_attention(make("separate projections"), "fixed_rank_embedded", block=False)


@pytest.mark.parametrize("structure", list(STRUCTURES))
@pytest.mark.parametrize("geometry", ["stiefel", "fixed_rank_embedded", "stiefel_pair"])
def test_converted_models_train_on_their_manifolds(structure, geometry):
    model = make(structure)
    riemannian_attention(model, geometry, geometry)
    opt = build_optimizer(model, lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    target = torch.roll(TOKENS, 1, dims=1)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = F.cross_entropy(model(TOKENS).flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    groups = parameter_groups(model)
    for g in groups:
        if g.get("geometry") == "stiefel":
            for p in g["params"]:
                assert float(tl.orthonormality_residual(p.detach()).max()) <= 1e-12
    for gi, g in enumerate(groups):  # the optimizer's own check of every point
        if g.get("geometry") not in (None, "stiefel"):
            for point in Geometries().points(gi, g, all_=True):
                point.geometry.check_point(point.value())


def test_wrappers_deepcopy_and_dtype_changes():
    model = make("nn.MultiheadAttention")
    riemannian_attention(model, "stiefel", "fixed_rank_quotient")
    names = frame_parameters(model)
    compiled = torch.compile(model)  # not run: the names carry the _orig_mod. prefix
    assert set(frame_parameters(compiled)) == {f"_orig_mod.{n}" for n in names}
    with tempfile.NamedTemporaryFile() as f:
        dist = torch.distributed
        dist.init_process_group("gloo", store=dist.FileStore(f.name, 1), rank=0, world_size=1)
        try:
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            assert set(frame_parameters(ddp)) == {f"module.{n}" for n in names}
            fsdp = torch.distributed.fsdp
            one = fsdp.FullyShardedDataParallel(
                copy.deepcopy(model), device_id=torch.device("cpu"), use_orig_params=True
            )
            assert set(frame_parameters(one)) == {f"_fsdp_wrapped_module.{n}" for n in names}
            two = copy.deepcopy(model)
            fsdp.fully_shard(two)  # FSDP2 adds no prefix
            assert set(frame_parameters(two)) == set(names)
        finally:
            dist.destroy_process_group()
    clone = copy.deepcopy(model)
    assert frame_parameters(clone) == names
    with torch.no_grad():
        assert torch.equal(clone(TOKENS), model(TOKENS))
    # a dtype change leaves the frames off St by float32 rounding: the optimizer refuses them,
    # reproject puts them back
    model.to(torch.float32).to(F64)
    with pytest.raises(ValueError, match="off St"):
        build_optimizer(model, lr=1e-3)
    worst = reproject(model)
    assert max(worst.values()) > 1e-9
    opt = build_optimizer(model, lr=1e-3)
    model(TOKENS).sum().backward()
    opt.step()


def test_bad_input_is_refused_before_anything_changes():
    model = make("fused Linear")
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="unknown qk_geometry"):
        riemannian_attention(model, "grassmann")
    with pytest.raises(ValueError, match="unknown init"):
        riemannian_attention(model, init="svd")
    with pytest.raises(ValueError, match="both None"):
        riemannian_attention(model, None, None)
    with pytest.raises(ValueError, match="no attention module found in Linear"):
        riemannian_attention(nn.Linear(3, 3))
    # the second block's products are of rank < k: refused, and the first block untouched
    with torch.no_grad():
        model.blocks[1].c_attn.weight[: D // H].zero_()
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"blocks\.1 \(qk\).*rank below 4: σ_min/σ_max"):
        riemannian_attention(model, "fixed_rank_embedded")
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    riemannian_attention(model, "stiefel", init="random")  # random points need no rank
    with pytest.raises(ValueError, match="already parametrized"):
        riemannian_attention(model, "stiefel")
    with pytest.raises(ValueError, match="assign the factors"):
        model.blocks[0].c_attn.weight = torch.zeros(3 * D, D, dtype=F64)


def test_no_decay_rule():
    class RMSNorm(nn.Module):  # a model's own norm class, by its name
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(D, D))

    model = make("separate projections")
    model.extra = RMSNorm()
    names = usual_no_decay(model)
    assert "emb.weight" in names and "norm.weight" in names and "extra.weight" in names
    assert "blocks.0.q_proj.bias" in names and "head.bias" in names
    assert "blocks.0.q_proj.weight" not in names and "head.weight" not in names
    groups = parameter_groups(model)
    decayed, undecayed = groups
    assert set(undecayed["param_names"]) == names and undecayed["weight_decay"] == 0.0
    assert "weight_decay" not in decayed  # the optimizer's default
    custom = parameter_groups(model, no_decay=["head.weight"])
    assert custom[-1]["param_names"] == ["head.weight"]
    by_rule = parameter_groups(model, no_decay=lambda name, p: p.ndim == 1)
    assert all(model.get_parameter(n).ndim == 1 for n in by_rule[-1]["param_names"])
    assert len(parameter_groups(model, no_decay=False)) == 1
    with pytest.raises(ValueError, match=r"does not have.*'nope'"):
        parameter_groups(model, no_decay=["nope"])
    with pytest.raises(ValueError, match=r"no_decay must be True, False.*'bias'"):
        parameter_groups(model, no_decay="bias")
    # a decayed step changes a weight by lr·λ·w more than an undecayed one; biases stay out
    opt = build_optimizer(model, torch.optim.AdamW, lr=0.1, weight_decay=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # zero gradients: only decay acts
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {n for n, _ in model.named_parameters()} - names


def test_a_checkpoint_of_a_converted_model_loads_into_one_converted_the_same_way(tmp_path):
    model = make("separate projections")
    riemannian_attention(model, "fixed_rank_embedded", "stiefel")
    opt = build_optimizer(model, lr=1e-2)
    model(TOKENS).sum().backward()
    opt.step()
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    other = make("separate projections", seed=1)
    riemannian_attention(other, "fixed_rank_embedded", "stiefel", init="random")
    other.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    with torch.no_grad():
        assert torch.equal(other(TOKENS), model(TOKENS))
    # an unconverted model has other keys: refused by load_state_dict
    with pytest.raises(RuntimeError, match="parametrizations"):
        make("separate projections").load_state_dict(model.state_dict())


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_plain_state_dict_loads_strictly_into_an_unconverted_model(structure, tmp_path):
    """The export of every structure (the fused weight of nanoGPT, nn.MultiheadAttention's
    in_proj_weight, separate projections under GQA) loads with strict=True into the model as it
    was before conversion, which then computes what the converted model computes: bit for bit,
    except that nn.MultiheadAttention takes another route for a parametrized in_proj_weight
    (the same products summed in another order: inner lengths ≤ 3·D = 48, so each output errs
    by ≤ γ_48·Σ|terms| ≈ 5e-15 of its terms' size; asserted at 1e-13 of max|y|)."""
    from torch_port.convert import plain_state_dict

    model = make(structure)
    riemannian_attention(model, "stiefel", "fixed_rank_embedded")
    opt = build_optimizer(model, lr=1e-2)
    model(TOKENS).sum().backward()
    opt.step()  # the export follows the points, not the weights converted from
    torch.save(plain_state_dict(model), tmp_path / "plain.pt")
    plain = make(structure, seed=1)
    plain.load_state_dict(torch.load(tmp_path / "plain.pt", weights_only=True))
    with torch.no_grad():
        got, expected = plain(TOKENS), model(TOKENS)
    if structure == "nn.MultiheadAttention":
        assert (got - expected).abs().max() <= 1e-13 * expected.abs().max()
    else:
        assert torch.equal(got, expected)
