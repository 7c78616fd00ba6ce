"""RiemannianMultiheadAttention: the k/v cache, key padding masks, the key bias and the
initialisation of nn.MultiheadAttention.

Tolerance 1e-12 on float64 outputs of unit scale: SDPA and the hand-written softmax below
differ in summation order only, each output being a convex combination of T ≤ 12 values of
inner products of length ≤ 16, so they agree to a few hundred u = 1.1e-16 (as in
tests/test_torch_nn.py).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch_port.nn import RiemannianMultiheadAttention  # noqa: E402

F64 = torch.float64
TOL = 1e-12

CONFIGS = {
    "stiefel_gqa_bias": dict(d_model=16, n_heads=4, n_kv_heads=2, bias=True, key_bias=True),
    "r1_qk_vo": dict(
        d_model=12, n_heads=3, qk_geometry="fixed_rank_embedded", vo_geometry="stiefel_pair"
    ),
    "block_mqa": dict(d_model=16, n_heads=4, n_kv_heads=1, qk_geometry="block_fixed_rank_quotient"),
    "plain": dict(d_model=12, n_heads=3, qk_geometry=None, bias=True),
}


def make(name: str, seed: int = 0) -> RiemannianMultiheadAttention:
    m = RiemannianMultiheadAttention(
        **CONFIGS[name], generator=torch.Generator().manual_seed(seed), dtype=F64
    )
    with torch.no_grad():
        for b in (m.b_q, m.b_k, m.b_v, m.b_o):
            if b is not None:
                b.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(7))
    return m


def hand_attention(m, x, allowed):
    """Softmax attention head by head from the module's weights; allowed (B, T, S) bool."""
    wq, wo = m.query_weights(), m.output_weights()
    out = torch.zeros(*x.shape[:2], m.d_model, dtype=x.dtype)
    for h in range(m.n_heads):
        g = m.kv_head_of(h)
        q, k, v = x @ wq[h], x @ m.w_k[g], x @ m.w_v[g]
        if m.b_q is not None:
            q, v = q + m.b_q[h], v + m.b_v[g]
        if m.b_k is not None:
            k = k + m.b_k[g]
        logits = (q @ k.mT / math.sqrt(m.head_dim)).masked_fill(~allowed, float("-inf"))
        o = torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v  # an empty row gives 0
        out = out + o @ wo[h].T
    return out + (m.b_o if m.b_o is not None else 0.0)


X = torch.randn(3, 12, 16, dtype=F64, generator=torch.Generator().manual_seed(2))


def inputs(m):
    return X[..., : m.d_model]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("chunks", [[1] * 12, [5, 1, 4, 2]])
def test_decoding_with_the_cache_equals_the_full_causal_forward(name, chunks):
    m = make(name)
    x = inputs(m)
    with torch.no_grad():
        full = m(x, is_causal=True)
        cache, parts, start = None, [], 0
        for n in chunks:
            out, cache = m(
                x[:, start : start + n], is_causal=True, past_key_value=cache, use_cache=True
            )
            parts.append(out)
            start += n
    assert cache[0].shape == (3, m.n_kv_heads, 12, m.head_dim)
    assert float((torch.cat(parts, dim=1) - full).abs().max()) <= TOL
    # control: a cache without causal masking of the new chunk is another function
    with torch.no_grad():
        _, c = m(x[:, :5], is_causal=True, use_cache=True)
        rest = m(x[:, 5:], past_key_value=c)
    assert float((rest - full[:, 5:]).abs().max()) > 1e-3


@pytest.mark.parametrize("name", list(CONFIGS))
def test_key_padding_mask_and_empty_rows(name):
    m = make(name)
    x = inputs(m)
    pad = torch.zeros(3, 12, dtype=torch.bool)
    pad[0, 9:] = True  # right padding
    pad[1, :3] = True  # left padding: causal rows 0-2 of sequence 1 have no key
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    allowed = causal & ~pad[:, None, :]
    with torch.no_grad():
        got = m(x, is_causal=True, key_padding_mask=pad)
        want = hand_attention(m, x, allowed)
        assert torch.isfinite(got).all()
        assert float((got - want).abs().max()) <= TOL
        # rows with no key to attend give the output bias alone (zero attention output)
        bias = m.b_o if m.b_o is not None else torch.zeros(m.d_model, dtype=F64)
        assert float((got[1, :3] - bias).abs().max()) == 0.0
        # the same mask given as attn_mask (True = may attend) and the padding as keys
        assert float((m(x, attn_mask=allowed[:, None]) - want).abs().max()) <= TOL
        # control: without the padding mask the padded keys are attended
        assert float((m(x, is_causal=True) - want).abs().max()) > 1e-3
    with pytest.raises(ValueError, match=r"boolean.*float64"):
        m(x, key_padding_mask=pad.double())


def test_the_key_bias_changes_no_output():
    m = make("stiefel_gqa_bias")
    x = inputs(m)
    out = m(x, is_causal=True)
    (out**2).sum().backward()
    with torch.no_grad():
        saved = m.b_k.clone()
        m.b_k.zero_()
        without = m(x, is_causal=True)
    assert float((out.detach() - without).abs().max()) <= TOL
    # its gradient is zero up to rounding: every row of the softmax Jacobian sums to zero
    scale = float(m.b_q.grad.abs().max())
    assert float(m.b_k.grad.abs().max()) <= 1e3 * 12 * 1.1e-16 * scale
    assert float(saved.abs().max()) > 0.1  # the bias was not zero to begin with


def test_plain_projections_initialise_as_nn_multihead_attention():
    d, h = 64, 4
    ours = RiemannianMultiheadAttention(d, h, qk_geometry=None, bias=True, dtype=F64)
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(d, h, dtype=F64)
    xavier = math.sqrt(6.0 / (d + 3 * d))
    for w in (ours.w_q, ours.w_k, ours.w_v):
        # uniform on ±bound: all inside, the largest of 4096 draws within 0.5% of the bound
        assert xavier * 0.995 < float(w.abs().max()) <= xavier
    assert float(theirs.in_proj_weight.abs().max()) <= xavier
    out_bound = 1.0 / math.sqrt(d)
    assert out_bound * 0.995 < float(ours.w_o.abs().max()) <= out_bound
    assert float(theirs.out_proj.weight.abs().max()) <= out_bound
    # the same spread: std bound/√3 for both, estimated from 4096 (3·4096) draws to ≤ 3%
    ratio = float(ours.w_q.std()) / float(theirs.in_proj_weight.std())
    assert abs(ratio - 1.0) < 0.03
    for b in (ours.b_q, ours.b_v, ours.b_o):
        assert float(b.abs().max()) == 0.0


def test_plain_init_linear_keeps_nn_linear_bounds():
    d, h = 64, 4
    lin = RiemannianMultiheadAttention(d, h, qk_geometry=None, plain_init="linear", dtype=F64)
    bound = 1.0 / math.sqrt(d)
    for w in (lin.w_q, lin.w_k, lin.w_v, lin.w_o):
        assert bound * 0.995 < float(w.abs().max()) <= bound
    with pytest.raises(ValueError, match="plain_init must be"):
        RiemannianMultiheadAttention(d, h, qk_geometry=None, plain_init="xavier")
