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
