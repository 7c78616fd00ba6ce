"""``Transformer.forward(last_only=True)``: the one-layer model read at its last position,
computed from the last query alone, equals the full forward's last row.

Tolerance: the two paths differ in the SDPA call's shape only (one query row against three), so
in float64 they agree to a few hundred u on logits of unit scale (1e-12, as tests/test_torch_nn.py
states for SDPA against a hand-written softmax).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch_port.experiments import grokking  # noqa: E402
from torch_port.experiments.models import TokenEmbedding, Transformer  # noqa: E402
from torch_port.experiments.training import logits_of  # noqa: E402

TOL = 1e-12


@pytest.mark.parametrize("geometry", [None, "stiefel"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_last_position_alone_equals_the_full_forward(geometry, causal):
    model = Transformer(
        TokenEmbedding(12, 32), 32, 1, 4, 64, 11, 3, seed=3, qk_geometry=geometry, causal=causal
    ).double()
    x = torch.randint(0, 12, (50, 3), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, last = model(x)[:, -1], model(x, last_only=True)
    assert last.shape == (50, 1, 11)
    scale = float(full.abs().max())
    assert float((last[:, -1] - full).abs().max()) <= TOL * max(1.0, scale)
    # control: it reads the other positions' keys and values (changing token 0 moves it)
    y = x.clone()
    y[:, 0] = (y[:, 0] + 1) % 12
    with torch.no_grad():
        assert float((model(y, last_only=True) - last).abs().max()) > 1e-6


def test_the_grokking_task_reads_through_it_and_deeper_models_are_refused():
    config = dict(grokking.PRESETS["smoke"])
    assert all(preset["last_only"] for preset in grokking.PRESETS.values())  # the fast forward
    assert not grokking.make_task({**config, "last_only": False}, 0).last_only
    task = grokking.make_task(config, 0)
    assert task.last_only
    model = task.make_model(0, "stiefel").double()
    with torch.no_grad():
        read = logits_of(task, model, task.x_val)
        full = model(task.x_val)[:, -1]
        assert float((read - full).abs().max()) <= TOL * max(1.0, float(full.abs().max()))
    deep = Transformer(TokenEmbedding(12, 16), 16, 2, 2, 32, 11, 3)
    with pytest.raises(ValueError, match="one layer only, this model has 2"):
        deep(torch.zeros(1, 3, dtype=torch.long), last_only=True)


def test_the_torch_initialisation_is_pytorchs_own_and_paired_by_seed():
    def make(init, seed=0, geometry=None):
        emb = TokenEmbedding(60, 128)
        return Transformer(emb, 128, 1, 4, 512, 59, 3, seed=seed, qk_geometry=geometry, init=init)

    torch_init, scaled = make("torch"), make("scaled")
    # N(0, 1) embedding rows against N(0, 1/d): 7680 entries estimate the std to ~1%
    assert abs(float(torch_init.embed.weight.std()) - 1.0) < 0.05
    assert abs(float(scaled.embed.weight.std()) * 128**0.5 - 1.0) < 0.05
    # nn.Linear's Kaiming-uniform: |w| ≤ 1/sqrt(fan_in), and its bias uniform, not zero
    fc = torch_init.blocks[0].mlp[0]
    assert float(fc.weight.abs().max()) <= 1 / 128**0.5 and float(fc.bias.abs().max()) > 0
    # the attention's plain projections as nn.MultiheadAttention's (Xavier over (3d, d))
    xavier = (6 / (4 * 128)) ** 0.5
    assert 0.995 * xavier < float(torch_init.blocks[0].attn.w_q.abs().max()) <= xavier
    again = make("torch")
    pairs = zip(torch_init.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    frames = make("torch", geometry="stiefel")  # paired: the same non-attention weights
    assert torch.equal(frames.embed.weight, torch_init.embed.weight)
    assert not torch.equal(make("torch", seed=1).embed.weight, torch_init.embed.weight)
    with pytest.raises(ValueError, match="init must be one of"):
        make("xavier")


def test_set_overrides_reach_the_experiment(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("sklearn")
    import json

    from proofs_checks.cli import main
    from proofs_checks.cli.parser import parse_overrides

    assert parse_overrides(["lr=1e-3", "init=torch", "betas=[0.9, 0.95]"]) == {
        "lr": 1e-3,
        "init": "torch",
        "betas": [0.9, 0.95],
    }
    for bad, message in ((["lr"], "KEY=VALUE"), (["lr=1", "lr=2"], "given twice")):
        with pytest.raises(ValueError, match=message):
            parse_overrides(bad)
    argv = ["experiment", "grokking", "--preset", "smoke", "--out", str(tmp_path), "--json"]
    assert main([*argv, "--set", "init=torch", "--set", "steps=8"]) == 0
    config = json.loads((tmp_path / "grokking" / "results.json").read_text())["config"]
    assert config["init"] == "torch" and config["steps"] == 8
    assert main([*argv, "--set", "nope=1"]) == 2  # unknown keys are refused, named


@pytest.mark.parametrize("arm", ["A", "B", "C", "D", "E", "F", "H"])
def test_frames_take_their_own_learning_rate(arm):
    from torch_port.experiments.arms import arm_geometry, make_optimizer, prepare_model

    task = grokking.make_task(dict(grokking.PRESETS["smoke"]), 0)
    model = prepare_model(arm, task.make_model(0, arm_geometry(arm)))
    common = dict(lr=1e-3, betas=(0.9, 0.98), weight_decay=1.0, trust_radius=0.5)
    opt = make_optimizer(arm, model, frame_lr=3e-2, **common)
    lrs = {g.get("geometry"): g["lr"] for g in opt.param_groups}
    assert lrs[None] == 1e-3
    assert lrs.get("stiefel", 3e-2) == 3e-2 and ("stiefel" in lrs) == (arm != "A")
    same = make_optimizer(arm, model, **common)
    assert {g["lr"] for g in same.param_groups} == {1e-3}
