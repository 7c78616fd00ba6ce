"""torch_port.nn: RiemannianMultiheadAttention and build_optimizer.

Orthonormality bound. Every frame is either the float64 QR factor of a Gaussian cast to the
working dtype, or the output Y = fl(A·S) of the polar retraction, A = W + ξ stored in the working
dtype (unit roundoff u_w), S = (AᵀA)^{-1/2} computed in float64 from the Gram of the stored A
(formed in float64, or in the frames' own dtype by the Stiefel optimizer: u_g, ``linalg.
gram_dtype``) and cast to the working dtype. The Gram is re-formed at every step, so rounding
does not accumulate across steps; one step contributes
- the d×r product with inner length r and the cast of S: |ΔY| ≤ (γ_r + u_w)|A||S| with
  ‖|A||S|‖_F ≤ ‖A‖_F‖S‖_F ≈ r, so ‖ΔY‖_F ≲ r(r + 1)u_w and ‖YᵀY − I‖ ≲ 2r(r + 1)u_w;
- the Gram (inner length d: ‖ΔG‖ ≤ γ_d(u_g)‖A‖_F² ≈ d·r·u_g) and its inverse square root
  (~ r·u₆₄), which perturb YᵀY by about as much: ≲ (d + r)·r·u_g.
With a factor 2 for second-order terms: 4r(r + 1)u_w + 2(d + r)r·u_g
(``port_compare.geometries.polar_drift_bound``); for (d, r) = (16, 4): 2.7e-14 (float64),
1.4e-5 (float32). Measured after 20 steps of each rule: ≤ 4.7e-15 (float64), ≤ 2.2e-7 (float32).
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
from conftest import train_mse

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from proofs_checks.port_compare.geometries import polar_drift_bound  # noqa: E402
from torch_port import linalg as tl  # noqa: E402
from torch_port.nn import (  # noqa: E402
    RiemannianMultiheadAttention,
    build_optimizer,
    frame_parameters,
    tag_frame,
)

F64 = torch.float64


def maxabs(t) -> float:
    return float(t.detach().abs().max())


def frame_bound(d: int, r: int, dtype: torch.dtype) -> float:
    """4r(r + 1)u_w + 2(d + r)r·u_g (module docstring)."""
    return polar_drift_bound(d, r, dtype, tl.gram_dtype(dtype))


def make(*args, dtype=F64, seed=0, **kw):
    return RiemannianMultiheadAttention(
        *args, generator=torch.Generator().manual_seed(seed), dtype=dtype, **kw
    )


def hand_attention(m, x, mask=None):
    """Softmax attention written out head by head from the module's weights (no SDPA)."""
    b, t, _ = x.shape
    wq, wo = m.query_weights(), m.output_weights()
    out = torch.zeros(b, t, m.d_model, dtype=x.dtype)
    for h in range(m.n_heads):
        g = h // (m.n_heads // m.n_kv_heads)
        q, k, v = x @ wq[h], x @ m.w_k[g], x @ m.w_v[g]
        if m.b_q is not None:
            q, v = q + m.b_q[h], v + m.b_v[g]
        logits = q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        o = torch.softmax(logits, dim=-1) @ v
        out = out + o @ wo[h].T
    return out + (m.b_o if m.b_o is not None else 0.0)


CONFIGS = {
    "mha_stiefel_qk": dict(d_model=12, n_heads=3),
    "gqa_stiefel_qk_vo_bias": dict(
        d_model=16, n_heads=4, n_kv_heads=2, vo_geometry="stiefel", bias=True
    ),
    "mqa_head_dim": dict(d_model=10, n_heads=4, n_kv_heads=1, head_dim=5, vo_geometry="stiefel"),
    "plain": dict(d_model=12, n_heads=3, qk_geometry=None, bias=True),
    "block_gqa": dict(d_model=8, n_heads=4, n_kv_heads=2, vo_geometry="stiefel", block=True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shapes_and_frames_on_the_manifold_at_init(name):
    kw = CONFIGS[name]
    m = make(**kw)
    h, g, d = m.n_heads, m.n_kv_heads, m.d_model
    k = m.head_dim
    stacked = m.block and m.group_size > 1
    assert m.w_q.shape == ((g, m.group_size * d, k) if stacked else (h, d, k))
    assert m.w_k.shape == m.w_v.shape == (g, d, k)
    assert m.query_weights().shape == m.output_weights().shape == (h, d, k)
    x = torch.randn(2, 7, d, dtype=F64, generator=torch.Generator().manual_seed(1))
    assert m(x).shape == (2, 7, d)
    expected = set()
    if kw.get("qk_geometry", "stiefel"):
        expected |= {"w_q", "w_k"}
    if kw.get("vo_geometry"):
        expected |= {"w_v", "w_o"}
    assert set(m.frame_geometries) == expected
    for n in expected:
        assert getattr(m, n)._rattn_geometry == "stiefel"
        assert m.frame_residuals()[n] <= frame_bound(d, k, F64)
    for n, p in m.named_parameters():
        if n not in expected:
            assert not hasattr(p, "_rattn_geometry"), n


def test_float32_init_is_on_the_manifold():
    m = make(64, 4, n_kv_heads=2, vo_geometry="stiefel", dtype=torch.float32)
    assert m.w_q.dtype == torch.float32
    assert max(m.frame_residuals().values()) <= frame_bound(64, 16, torch.float32)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("causal", [False, True])
def test_output_equals_hand_written_softmax_attention(name, causal):
    m = make(**CONFIGS[name])
    if m.b_q is not None:  # non-zero biases, so that they are checked too
        with torch.no_grad():
            for b in (m.b_q, m.b_v, m.b_o):
                b.copy_(torch.randn(b.shape, dtype=F64, generator=torch.Generator().manual_seed(5)))
    x = torch.randn(3, 6, m.d_model, dtype=F64, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(6, 6, dtype=torch.bool).tril() if causal else None
    with torch.no_grad():
        got = m(x, is_causal=causal)
        want = hand_attention(m, x, mask)
    assert maxabs(got - want) <= 1e-12
    # an explicit boolean mask gives the same as is_causal
    if causal:
        with torch.no_grad():
            assert maxabs(m(x, attn_mask=mask) - want) <= 1e-12


def test_cross_attention_with_a_different_key_length():
    m = make(12, 3, n_kv_heads=1)
    x = torch.randn(2, 4, 12, dtype=F64)
    ctx = torch.randn(2, 9, 12, dtype=F64)
    out = m(x, ctx)
    b, t = 2, 4
    want = torch.zeros(b, t, 12, dtype=F64)
    for h in range(3):
        q, k, v = x @ m.w_q[h], ctx @ m.w_k[0], ctx @ m.w_v[0]
        o = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v
        want = want + o @ m.w_o[h].T
    assert out.shape == (2, 4, 12) and maxabs(out - want) <= 1e-12


def test_gqa_heads_of_a_group_share_their_key_frame():
    m = make(16, 4, n_kv_heads=2)
    assert [m.kv_head_of(h) for h in range(4)] == [0, 0, 1, 1]
    x = torch.randn(2, 5, 16, dtype=F64, generator=torch.Generator().manual_seed(3))
    before = m.heads(x).detach()
    with torch.no_grad():  # move the second key/value group only
        m.w_k[1].copy_(tp.Stiefel(16, 4).random_point(torch.Generator().manual_seed(9)))
    after = m.heads(x).detach()
    assert torch.equal(before[:, :2], after[:, :2])  # heads 0, 1 read key frame 0: untouched
    assert maxabs(before[:, 2:] - after[:, 2:]) > 1e-3
    # the gradient of a shared key frame is the sum over the heads of its group
    m.zero_grad()
    m.heads(x)[:, 0].sum().backward()
    g0 = m.w_k.grad[0].clone()
    assert maxabs(m.w_k.grad[1]) == 0.0
    m.zero_grad()
    m.heads(x)[:, 1].sum().backward()
    g1 = m.w_k.grad[0].clone()
    m.zero_grad()
    m.heads(x)[:, :2].sum().backward()
    assert maxabs(m.w_k.grad[0] - (g0 + g1)) <= 1e-12


def test_block_frames_are_jointly_orthonormal_per_group():
    m = make(8, 4, n_kv_heads=2, block=True)
    per_head = m.query_weights()  # (4, 8, 2)
    assert m.w_q.shape == (2, 16, 2)
    for g in range(2):
        blocks = per_head[2 * g : 2 * g + 2]
        gram = sum(b.T @ b for b in blocks)
        assert maxabs(gram - torch.eye(2, dtype=F64)) <= 1e-14
        # a single head's block alone is not orthonormal
        assert float(tl.orthonormality_residual(blocks[0].detach())) > 1e-2
    # under MHA a group is one head: block equals plain (same layout)
    mha = make(8, 4, block=True)
    assert mha.w_q.shape == (4, 8, 2)


def test_gradient_reaches_every_parameter():
    m = make(**CONFIGS["gqa_stiefel_qk_vo_bias"])
    x = torch.randn(2, 5, 16, dtype=F64, generator=torch.Generator().manual_seed(4))
    (m(x, is_causal=True) ** 2).sum().backward()
    names = {n for n, _ in m.named_parameters()}
    assert names == {"w_q", "w_k", "w_v", "w_o", "b_q", "b_v", "b_o"}
    for n, p in m.named_parameters():
        assert p.grad is not None and maxabs(p.grad) > 0.0, n


def _teacher_task(student_kw, dtype, seed=0):
    teacher = make(**student_kw, dtype=dtype, seed=seed + 100)
    x = torch.randn(8, 6, student_kw["d_model"], dtype=dtype)
    x = x.to(dtype)
    with torch.no_grad():
        y = teacher(x, is_causal=True)
    return x, y


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "opt_cls, opt_kw",
    [
        (tp.RiemannianAdam, dict(lr=1e-2)),
        (tp.RiemannianMomentum, dict(lr=5e-2)),
        (tp.RSGD, dict(lr=1e-1)),
        (tp.NormalizedRSGD, dict(lr=1e-2)),
    ],
)
def test_frames_stay_on_the_manifold_over_20_steps(dtype, opt_cls, opt_kw):
    kw = dict(d_model=16, n_heads=4, n_kv_heads=2, vo_geometry="stiefel", bias=True)
    torch.manual_seed(0)
    x, y = _teacher_task(kw, dtype)
    m = make(**kw, dtype=dtype)
    opt = build_optimizer(m, opt_cls, **opt_kw)
    losses = train_mse(m, opt, x, y, is_causal=True)
    assert losses[-1] < losses[0]
    bound = frame_bound(m.d_model, m.head_dim, dtype)
    for n, res in m.frame_residuals().items():
        assert res <= bound, (n, res, bound)


def test_block_frames_stay_on_their_stacked_manifold_over_20_steps():
    kw = dict(d_model=8, n_heads=4, n_kv_heads=2, vo_geometry="stiefel", block=True)
    torch.manual_seed(0)
    x, y = _teacher_task(kw, F64)
    m = make(**kw)
    opt = build_optimizer(m, lr=1e-2)
    train_mse(m, opt, x, y)
    assert max(m.frame_residuals().values()) <= frame_bound(
        m.d_model * m.group_size, m.head_dim, F64
    )


def test_build_optimizer_groups():
    m = make(**CONFIGS["gqa_stiefel_qk_vo_bias"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no FrameDecayWarning: frames get weight_decay 0
        opt = build_optimizer(m, lr=3e-3, weight_decay=0.1, frame_options={"trust_radius": 0.2})
    frames, plain = opt.param_groups
    assert frames["geometry"] == "stiefel" and frames["weight_decay"] == 0.0
    assert frames["trust_radius"] == 0.2
    assert frames["param_names"] == ["w_q", "w_k", "w_v", "w_o"]
    # biases are kept out of decay by the usual rule; no_decay=False decays them too
    assert plain.get("geometry") is None and plain["weight_decay"] == 0.0
    assert plain["param_names"] == ["b_q", "b_v", "b_o"]
    decayed = build_optimizer(m, lr=3e-3, weight_decay=0.1, no_decay=False).param_groups[-1]
    assert decayed["param_names"] == ["b_q", "b_v", "b_o"] and decayed["weight_decay"] == 0.1
    # plain AdamW baseline: the same groups, geometry ignored
    base = build_optimizer(make(12, 3, qk_geometry=None), torch.optim.AdamW, lr=1e-3)
    assert len(base.param_groups) == 1


def test_build_optimizer_survives_deepcopy_and_finds_tagged_parameters():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = make(12, 3)
            self.proj = torch.nn.Linear(12, 12, dtype=F64)
            self.frame = tag_frame(
                torch.nn.Parameter(tp.Stiefel(12, 3).random_point(torch.Generator()))
            )
            self.frozen = torch.nn.Parameter(torch.zeros(3, dtype=F64), requires_grad=False)

    model = Model()
    assert frame_parameters(model) == {
        "attn.w_q": "stiefel",
        "attn.w_k": "stiefel",
        "frame": "stiefel",
    }
    opt = build_optimizer(model, lr=1e-3)
    frames, plain, undecayed = (g["param_names"] for g in opt.param_groups)
    assert frames == ["frame", "attn.w_q", "attn.w_k"]  # named_parameters order
    assert plain == ["attn.w_v", "attn.w_o", "proj.weight"]  # not "frozen"
    assert undecayed == ["proj.bias"]
    # copy.deepcopy drops attributes of parameters (the tag); the module's own list
    # (frame_geometries) survives, so the attention frames are still routed. A loosely tagged
    # parameter must be tagged again after a deepcopy (documented in tag_frame).
    clone = copy.deepcopy(model)
    assert frame_parameters(clone) == {"attn.w_q": "stiefel", "attn.w_k": "stiefel"}


def test_dropout_only_in_training():
    m = make(12, 3, dropout=0.5)
    x = torch.randn(2, 4, 12, dtype=F64)
    m.eval()
    assert torch.equal(m(x), m(x))
    m.train()
    torch.manual_seed(0)
    a = m(x)
    torch.manual_seed(1)
    assert not torch.equal(a, m(x))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(d_model=12, n_heads=5), "not divisible"),
        (dict(d_model=12, n_heads=4, n_kv_heads=3), "must divide"),
        (dict(d_model=4, n_heads=1, head_dim=8), "head_dim ≤ d_model"),
        (dict(d_model=12, n_heads=3, qk_geometry="fixed_rank"), "unknown qk_geometry"),
        (dict(d_model=12, n_heads=3, qk_geometry=None, block=True), "block=True"),
        (dict(d_model=12, n_heads=3, dropout=1.0), "dropout"),
    ],
)
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        RiemannianMultiheadAttention(**kw)


def test_bad_input_shape():
    m = make(12, 3)
    with pytest.raises(ValueError, match="d_model=12"):
        m(torch.randn(2, 4, 10, dtype=F64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_forward_and_step_float32():
    m = make(64, 4, n_kv_heads=2, vo_geometry="stiefel", dtype=torch.float32).cuda()
    opt = build_optimizer(m, lr=1e-2)
    x = torch.randn(4, 16, 64, device="cuda")
    for _ in range(5):
        opt.zero_grad()
        (m(x, is_causal=True) ** 2).mean().backward()
        opt.step()
    assert max(m.frame_residuals().values()) <= frame_bound(64, 16, torch.float32)
