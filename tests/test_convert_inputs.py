"""Bad input to ``riemannian_attention`` and the new attention options: each refused with a
ValueError that names the problem, the model exactly as it was; and the undo.

Each case here was a way to get a half-converted model, a silently wrong result or an unclear
error; the test states what must happen instead.
"""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
from torch.nn.utils import parametrize  # noqa: E402

from torch_port.convert import plain_attention, riemannian_attention  # noqa: E402
from torch_port.nn import (  # noqa: E402
    RiemannianMultiheadAttention,
    build_optimizer,
    frame_parameters,
    manifold_points,
    parameter_groups,
)

F64 = torch.float64


class Sep(nn.Module):
    """LLaMA-style separate projections, d = 16, 4 query heads over g key/value heads."""

    def __init__(self, g: int = 4):
        super().__init__()
        torch.manual_seed(0)
        self.head_dim = 4
        self.q_proj = nn.Linear(16, 16, dtype=F64)
        self.k_proj = nn.Linear(16, 4 * g, dtype=F64)
        self.v_proj = nn.Linear(16, 4 * g, dtype=F64)
        self.o_proj = nn.Linear(16, 16, bias=False, dtype=F64)


class Nano(nn.Module):
    def __init__(self, n_head=4, head_dim=None, proj_out=16):
        super().__init__()
        self.c_attn = nn.Linear(16, 48, dtype=F64)
        self.c_proj = nn.Linear(16, proj_out, dtype=F64)
        if n_head is not None:
            self.n_head = n_head
        if head_dim is not None:
            self.head_dim = head_dim


def snapshot(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def unchanged(model: nn.Module, before: dict) -> bool:
    """The same keys and the same values, NaN included."""
    now = model.state_dict()
    return now.keys() == before.keys() and all(
        torch.allclose(now[k], before[k], rtol=0.0, atol=0.0, equal_nan=True) for k in now
    )


def _mixed():
    m = Sep()
    m.o_proj.to(torch.float32)
    return m


def _shared():
    m = Sep()
    m.k_proj = m.q_proj
    return m


def _nonfinite():
    m = Sep()
    with torch.no_grad():
        m.q_proj.weight[0, 0] = float("nan")
    return m


def _tied():
    a, b = Sep(), Sep()
    b.q_proj.weight = a.q_proj.weight
    return nn.ModuleList([a, b])


class Twice(nn.Module):
    def forward(self, b):
        return 2 * b

    def right_inverse(self, b):
        return b / 2


def _parametrized_bias():
    m = Sep()
    parametrize.register_parametrization(m.q_proj, "bias", Twice())
    return m


def _meta():
    with torch.device("meta"):
        return Sep()


BAD = {
    "mixed dtypes": (_mixed, {}, r"share one dtype and device.*float32.*float64"),
    "shared Linear": (_shared, {}, r"k_proj\.weight is the same tensor as .*q_proj\.weight"),
    "non-finite": (_nonfinite, {"init": "random"}, r"q_proj\.weight has 1 non-finite entries"),
    "tied across layers": (_tied, {}, r"1: q_proj\.weight is the same tensor as 0: q_proj"),
    "parametrized bias": (_parametrized_bias, {}, r"q_proj\.bias is already parametrized"),
    "meta device": (_meta, {}, r"meta device: materialise the model first"),
    "head_dim only, not dividing": (
        lambda: Nano(n_head=None, head_dim=5),
        {},
        r"16 features do not split into 0 heads",
    ),
    "n_head·head_dim ≠ d": (lambda: Nano(head_dim=8), {}, r"into 4 heads of size 8"),
    "c_proj of another shape": (lambda: Nano(proj_out=32), {}, r"c_proj's weight has shape"),
    "generator not a Generator": (Sep, {"generator": 5}, r"generator must be a torch.Generator"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_models_are_refused_and_left_as_they_were(case):
    make, kwargs, message = BAD[case]
    model = make()
    before = None if case == "meta device" else snapshot(model)
    with pytest.raises(ValueError, match=message):
        riemannian_attention(model, "fixed_rank_embedded", **kwargs)
    if before is not None:
        assert unchanged(model, before)
        assert not any(parametrize.is_parametrized(m, "weight") for m in model.modules())


def test_a_rank_deficient_head_is_named_for_frames_too():
    m = Sep()
    with torch.no_grad():
        m.q_proj.weight[4:8] = 0.0  # head 1 of the queries
    before = snapshot(m)
    with pytest.raises(
        ValueError, match=r"^Sep \(qk\): a head's weight has no nearest frame.*random"
    ):
        riemannian_attention(m, "stiefel")
    assert unchanged(m, before)
    riemannian_attention(m, "stiefel", init="random")  # a fresh point needs no rank


def test_a_compiled_wrapper_is_converted_through_the_module_it_wraps():
    m = Sep()
    compiled = torch.compile(m)  # not run
    (done,) = riemannian_attention(compiled, "fixed_rank_quotient")
    assert done.name == "_orig_mod" and done.module is m
    assert next(g.get("geometry") for g in parameter_groups(m)) == "fixed_rank_quotient"
    assert manifold_points(copy.deepcopy(m))  # the declarations live on the module itself


def test_qk_then_vo_on_separate_projections_and_the_undo():
    m = Sep()
    x = torch.randn(3, 16, dtype=F64)

    def product(model):
        q = model.q_proj.weight.reshape(4, 4, 16)
        k = model.k_proj.weight.reshape(4, 4, 16)
        return q.mT @ k

    riemannian_attention(m, "fixed_rank_embedded")
    assert not parametrize.is_parametrized(m.v_proj)  # untouched: nothing of it converted
    riemannian_attention(m, None, "stiefel")  # so VO can follow
    assert set(frame_parameters(m).values()) == {"fixed_rank_embedded", "stiefel"}
    with torch.no_grad():
        qk, out = product(m).clone(), m.o_proj(x)
    made = plain_attention(m)
    assert sorted(made) == ["k_proj.weight", "o_proj.weight", "q_proj.weight", "v_proj.weight"]
    assert frame_parameters(m) == {} and manifold_points(m) == []
    with torch.no_grad():
        assert torch.equal(product(m), qk) and torch.equal(m.o_proj(x), out)
    assert [g.get("geometry") for g in parameter_groups(m)] == [None, None]
    riemannian_attention(m, "stiefel")  # and it converts again


def test_a_declaration_left_behind_is_named():
    m = Sep()
    riemannian_attention(m, "fixed_rank_embedded")
    for name in ("q_proj", "k_proj"):
        parametrize.remove_parametrizations(getattr(m, name), "weight")
    with pytest.raises(ValueError, match=r"declared in point_groups of 'Sep'.*plain_attention"):
        build_optimizer(m, lr=1e-3)


def test_rotary_models_warn_when_the_factors_change():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, max_position_embeddings=32,
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"rotates q and k.*fixed_rank_quotient"):
        done = riemannian_attention(transformers.LlamaForCausalLM(cfg), "fixed_rank_embedded")
    assert done[0].rotary
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # R2 keeps the factors: no warning
        riemannian_attention(transformers.LlamaForCausalLM(cfg), "fixed_rank_quotient")


def test_attention_masks_are_checked():
    a = RiemannianMultiheadAttention(16, 4, dtype=F64)
    x = torch.randn(2, 5, 16, dtype=F64)
    for bad in (torch.ones(2, 1, dtype=torch.bool), torch.zeros(1, 5, dtype=torch.bool)):
        with pytest.raises(ValueError, match=r"shape \(batch, keys\) = \(2, 5\)"):
            a(x, key_padding_mask=bad)
    _, cache = a(x, use_cache=True)
    with pytest.raises(ValueError, match=r"\(2, 6\) \(cached keys included\)"):
        a(x[:, :1], past_key_value=cache, key_padding_mask=torch.zeros(2, 1, dtype=torch.bool))
    pad = torch.zeros(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="either a float attn_mask or is_causal"):
        a(x, attn_mask=torch.zeros(5, 5, dtype=F64), is_causal=True, key_padding_mask=pad)
    # without a cache, causal with fewer keys than queries is SDPA's top-left alignment
    mem = torch.randn(2, 3, 16, dtype=F64)
    with torch.no_grad():
        ours = a(x, mem, is_causal=True, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
        sdpa = a(x, mem, is_causal=True)
    assert float((ours - sdpa).abs().max()) <= 1e-12


def test_no_decay_names_tied_aliases_and_refuses_numbers():
    m = Sep()
    m.alias = m.q_proj  # the same Linear under a second name
    groups = parameter_groups(m, no_decay=["alias.weight"])
    assert groups[-1]["param_names"] == ["q_proj.weight"] and groups[-1]["weight_decay"] == 0.0
    with pytest.raises(ValueError, match="no_decay must be True, False"):
        parameter_groups(m, no_decay=0)


def test_an_eps_that_rounds_to_zero_in_float16_is_refused():
    w = nn.Parameter(torch.zeros(3, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"eps=1e-08 rounds to 0 in torch.float16.*6.1e-05"):
        build_optimizer(nn.ParameterList([w]), lr=1e-3)
    build_optimizer(nn.ParameterList([w]), lr=1e-3, eps=1e-4)
