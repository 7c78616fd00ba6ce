"""``riemannian_attention`` on Hugging Face models built from configs with random weights
(nothing is downloaded): GPT-2 (fused Conv1D c_attn) and LLaMA (separate projections, grouped
key heads, rotary embeddings). Skipped without ``transformers`` (the ``hf`` extra).

Tolerances as in ``tests/test_convert.py``: an exact conversion moves a float64 forward by at
most 10³·8·k·u·κ of its scale, κ the largest condition number of a head's product.
"""

from __future__ import annotations

import pytest
from conftest import U

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch_port.convert import riemannian_attention  # noqa: E402
from torch_port.nn import build_optimizer, parameter_groups  # noqa: E402
from torch_port.optim.points import Geometries  # noqa: E402

F64 = torch.float64
VOCAB, D, H, K = 61, 32, 4, 8


def gpt2(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=D, n_head=H, vocab_size=VOCAB, n_positions=32,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return _with_biases(transformers.GPT2LMHeadModel(cfg))


def llama(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_attention_heads=H,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        attention_bias=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return _with_biases(transformers.LlamaForCausalLM(cfg))


def _with_biases(model):
    with torch.no_grad():  # non-zero attention biases, so that their mapping is checked
        for name, p in model.named_parameters():
            if "attn" in name and name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return model.eval()


MODELS = {"gpt2": gpt2, "llama": llama}
TOKENS = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))


def kappa(model) -> float:
    """Largest σ_max/σ_min of a head's W_Q^h W_K^gᵀ (read from the fused or separate weights)."""
    worst = 1.0
    for m in model.modules():
        if hasattr(m, "c_attn"):
            q, k = m.c_attn.weight.detach().T[:D], m.c_attn.weight.detach().T[D : 2 * D]
        elif hasattr(m, "q_proj"):
            q, k = m.q_proj.weight.detach(), m.k_proj.weight.detach()
        else:
            continue
        qh = q.reshape(-1, K, D).mT
        kh = k.reshape(-1, K, D).mT.repeat_interleave(qh.shape[0] * K // k.shape[0], dim=0)
        s = torch.linalg.svdvals(qh.double() @ kh.double().mT)[..., :K]
        worst = max(worst, float((s[..., 0] / s[..., -1]).max()))
    return worst


@pytest.mark.parametrize(
    "name, geometry",
    [
        ("gpt2", "fixed_rank_embedded"),
        ("gpt2", "fixed_rank_quotient"),
        ("llama", "fixed_rank_quotient"),
    ],
)
def test_exact_conversions_keep_the_forward(name, geometry):
    model = MODELS[name]().double()
    k = kappa(model)
    with torch.no_grad():
        before = model(TOKENS).logits
    done = riemannian_attention(model, geometry, geometry)
    assert len(done) == 2
    with torch.no_grad():
        after = model(TOKENS).logits
    tol = 1e3 * 8 * K * U * k * float(before.abs().max())
    assert float((after - before).abs().max()) <= tol
    # control: R1 on LLaMA is exact for the content product only: the rotary embedding
    # between projection and product sees other factors, and the forward moves
    if name == "llama":
        other = llama().double()
        riemannian_attention(other, "fixed_rank_embedded")
        with torch.no_grad():
            assert float((other(TOKENS).logits - before).abs().max()) > 1e3 * tol


@pytest.mark.parametrize(
    "name, qk, vo",
    [("gpt2", "stiefel", "fixed_rank_embedded"), ("llama", "fixed_rank_embedded", "stiefel_pair"),
     ("llama", "stiefel", None)],
)  # fmt: skip
def test_converted_models_train_and_decode(name, qk, vo):
    model = MODELS[name]()
    riemannian_attention(model, qk, vo)
    model.train()
    opt = build_optimizer(model, lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=20)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = model(TOKENS, labels=TOKENS).loss
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.1
    groups = parameter_groups(model)
    assert any(g.get("geometry") for g in groups)
    for gi, g in enumerate(groups):  # every frame and point still where the optimizer wants it
        if g.get("geometry") is not None:
            for point in Geometries().points(gi, g, all_=True):
                point.geometry.check_point(point.value())
    # no decay on embeddings, norms and biases
    undecayed = groups[-1]
    assert undecayed["weight_decay"] == 0.0
    assert all("bias" in n or "wte" in n or "wpe" in n or "norm" in n or "ln_" in n
               or "embed" in n for n in undecayed["param_names"])  # fmt: skip
    # decoding with and without the cache gives the same tokens (float64, greedy)
    model = model.double().eval()
    prompt = TOKENS[:, :4]
    cached = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=True)
    full = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False)
    assert cached.shape == (2, 12) and torch.equal(cached, full)


# -- checkpoints that travel: a plain copy of a converted model --------------------------------
@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize(("qk", "vo"), [("stiefel", "fixed_rank_quotient"), ("stiefel_pair", None)])
def test_plain_state_dict_loads_into_a_plain_model_with_the_same_logits(family, qk, vo, tmp_path):
    """Converted → ``save_pretrained(state_dict=plain_state_dict(model))`` → a plain
    ``from_pretrained`` reads the very weights the converted model reads, bit for bit, and its
    logits agree to rounding. Control: the converted model's own state dict (its factors under new
    names) leaves the plain copy's attention at its random initialisation."""
    from torch_port.convert import plain_state_dict

    transformers.logging.set_verbosity_error()
    model = MODELS[family]()
    riemannian_attention(model, qk, vo)
    with torch.no_grad():
        expected = model(TOKENS).logits
    exported = plain_state_dict(model)
    assert not any("parametrizations" in k for k in exported)
    model.save_pretrained(tmp_path / "plain", state_dict=exported)
    cls = type(model)
    plain = cls.from_pretrained(tmp_path / "plain").eval()
    assert not any(hasattr(m, "parametrizations") for m in plain.modules())
    for name, value in exported.items():  # the very weights the converted model reads
        assert torch.equal(plain.state_dict()[name], value), name
    with torch.no_grad():
        got = plain(TOKENS).logits
    # the same weights in another memory layout: only the products' summation order differs,
    # 2 layers of inner length ≤ 4·D = 128 in float32, far below the control's O(1) change
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    # the converted model is unchanged: it still saves and resumes in its own layout
    assert any("parametrizations" in k for k in model.state_dict())
    # the control: its own layout, loaded leniently, re-initialises the plain attention
    fresh = MODELS[family](seed=1)
    fresh.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        assert not torch.allclose(fresh(TOKENS).logits, expected, atol=1e-3)


@pytest.mark.parametrize(("qk", "vo"), [("stiefel", "fixed_rank_embedded")])
def test_audit_rows_name_the_converted_factors(qk, vo, tmp_path):
    """A converted GPT-2's frames and points are labelled as a reader knows them (module path,
    then W_Q, W_K, W_V, W_O, S_VO), and ``rattn audit``'s rows say so, not
    "….c_attn.parametrizations.weight.original1"."""
    from proofs_checks.audit import replay as pa
    from proofs_checks.audit.report import format_table
    from torch_port import audit
    from torch_port.nn import build_optimizer

    model = gpt2().double()
    riemannian_attention(model, qk, vo)
    opt = build_optimizer(model, lr=1e-3)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0)
    )
    with audit.record(opt, tmp_path / "gpt2.npz", frames=1):
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
    result = pa.audit(tmp_path / "gpt2.npz")
    names = {", ".join(r["names"]) for r in result["steps"]}
    assert {"transformer.h.0.attn W_Q", "transformer.h.1.attn W_K"} <= names
    assert "transformer.h.0.attn W_O, transformer.h.0.attn S_VO, transformer.h.0.attn W_V" in names
    assert "| transformer.h.0.attn W_O, S_VO, W_V |" in format_table(result)
    assert not any("parametrizations" in n for n in names)
