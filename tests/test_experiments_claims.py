"""What the experiments' claims rest on: the trust radius's use (recovered steps, the sweep),
matched initial scales, the grokking validation split by swapped pairs, the gradient scale of the
movement ratios, and the paired statistics' interval and ties."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")

from proofs_checks.cli import main  # noqa: E402
from torch_port import linalg  # noqa: E402
from torch_port.experiments import arms, grokking, patches, runs, training  # noqa: E402
from torch_port.experiments import trust as trust_lib  # noqa: E402
from torch_port.experiments.common import RunOptions, configure  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
U32 = 2.0**-24  # float32 unit roundoff


def _tangent_step(d: int, r: int, norms: list[float], dtype: torch.dtype, seed: int = 0):
    """Frames W (k, d, r) and tangent steps ξ (W ᵀξ skew) with ‖ξ_i‖_F = norms[i] (float64)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.linalg.qr(torch.randn(len(norms), d, r, generator=gen, dtype=torch.float64))[0]
    g = torch.randn(len(norms), d, r, generator=gen, dtype=torch.float64)
    xi = g - w @ linalg.sym(w.mT @ g)
    xi = xi * (torch.tensor(norms, dtype=torch.float64) / linalg.frobenius(xi))[:, None, None]
    return w.to(dtype), xi, linalg.polar(w + xi).to(dtype)


def test_polar_step_norms_recover_the_step() -> None:
    norms = [0.5, 0.04, 1e-3]
    w, _, y = _tangent_step(64, 16, norms, torch.float64)
    got = training.polar_step_norms(w, y)
    want = torch.tensor(norms, dtype=torch.float64)
    # float64 frames: the Lyapunov solve and one product, a few ulps of ‖ξ‖ (≤ 1e-13 relative)
    assert torch.allclose(got, want, rtol=1e-13, atol=0)
    # negative control: ‖W1 − W0‖ is not ‖ξ‖ (it differs at second order in ‖ξ‖)
    naive = linalg.frobenius(y - w)
    assert (naive[0] - want[0]).abs() > 1e-4
    # float32 frames: |Δ‖ξ‖| ≲ 3·u·√r·‖S‖₂ with ‖S‖₂ ≤ 1.5 (the docstring's bound), for both
    # frames rounded (W0 too here: twice the bound)
    w32, _, y32 = _tangent_step(64, 16, norms, torch.float32)
    err = (training.polar_step_norms(w32, y32) - want).abs()
    assert (err <= 2 * 3 * U32 * math.sqrt(16) * 1.5).all(), err


def _trust_run(tau: float, arm: str = "C") -> dict:
    config = configure(grokking.PRESETS, RunOptions(preset="smoke", overrides={"trust_tau": tau}))
    task = grokking.make_task(config, 0)
    return training.train_with(task, config, arm, 0, track_trust=True)


def test_train_run_reports_whether_the_cap_binds() -> None:
    """Δ far below the first step's length lr·√(d·r) (Adam's first direction has RMS 1): every
    frame step is at the cap; Δ far above the largest step: none is."""
    capped = training.trust_metrics(_trust_run(1e-3))  # Δ = 2.8e-3 < 3e-3·√(32·8) = 0.048
    assert capped["at_cap"] == 1.0
    assert abs(capped["max_ratio"] - 1.0) <= training.CAP_BAND
    free = training.trust_metrics(_trust_run(10.0))  # Δ = 28
    assert free["at_cap"] == 0.0 and free["max_ratio"] < 0.01
    assert training.trust_metrics(_trust_run(1e-3, "A"))["at_cap"] is None  # no frames
    assert training.trust_metrics(_trust_run(1e-3, "B"))["at_cap"] is None  # no cap


def test_trust_sweep_smoke_through_the_cli(tmp_path: Path) -> None:
    assert main(["experiment", "trust", "--preset", "smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "trust" / "results.json").read_text("utf-8"))
    for task, t in doc["summary"]["tasks"].items():
        rows = {row["tau"]: row for row in t["rows"]}
        assert rows[0.001]["at_cap"] == 1.0 and rows[0.1]["at_cap"] == 0.0, task
        assert rows[0.001]["max_ratio"] == pytest.approx(1.0, abs=training.CAP_BAND)
    assert (tmp_path / "trust" / "trust_sweep.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "trust" / "results.md").read_text("utf-8").startswith("# trust")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"taus": [0.1]}, "taus must be a list of ≥ 2 distinct positive numbers"),
        ({"taus": [0.1, 0.1]}, "taus must be"),
        ({"taus": [0.1, -1.0]}, "taus must be"),
        ({"arms": ["A", "C"]}, "the trust sweep trains one arm"),
        ({"arms": ["B"]}, r"one of \('C', 'F'\); got arms \['B'\]"),
    ],
)
def test_trust_sweep_refuses_bad_settings(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trust_lib.run(RunOptions(preset="smoke", out=tmp_path, progress=False, overrides=change))


def test_match_scale_gives_plain_projections_the_frames_norm() -> None:
    config = configure(patches.PRESETS, RunOptions(preset="smoke"))
    task = patches.make_task(config, patches.load_data(config, None), 1.0)
    plain = arms.prepare_model("A", task.make_model(0, None))
    matched = arms.prepare_model("A", task.make_model(0, None), match_scale=True)
    frames = arms.prepare_model("C", task.make_model(0, "stiefel"), match_scale=True)
    r = config["d_model"] // config["n_heads"]
    for name, w in arms.qk_parameters(matched).items():
        w0 = arms.qk_parameters(plain)[name].detach().double()
        w1 = w.detach().double()
        norms = linalg.frobenius(w1)
        assert torch.allclose(norms, torch.full_like(norms, math.sqrt(r)), rtol=1e-6)
        # the default scale is the one to correct: ‖W‖_F² ≈ r/3 for uniform ±1/√d entries
        assert (linalg.frobenius(w0) < 0.8 * math.sqrt(r)).all()
        cosine = (w0 * w1).sum((-2, -1)) / (linalg.frobenius(w0) * norms)
        assert torch.allclose(cosine, torch.ones_like(cosine), atol=1e-6)  # direction kept
    for w in arms.qk_parameters(frames).values():  # frames are left as they are
        gram = w.detach().double().mT @ w.detach().double()
        assert torch.allclose(gram, torch.eye(r, dtype=torch.float64).expand_as(gram), atol=1e-6)
    with pytest.raises(ValueError, match="match_scale must be true or false, got 'yes'"):
        patches.check_task({**config, "match_scale": "yes"})


def test_grokking_logs_the_swapped_pairs_apart() -> None:
    config = configure(grokking.PRESETS, RunOptions(preset="smoke"))
    task = grokking.make_task(config, 0)
    train = {(int(a), int(b)) for a, b, _ in task.x_train}
    swapped, unseen = task.val_subsets["swap_in_train"], task.val_subsets["unseen"]
    assert bool((swapped ^ unseen).all())  # a partition of the validation set
    assert bool(swapped.any()) and bool(unseen.any())
    for (a, b, _), s in zip(task.x_val.tolist(), swapped.tolist(), strict=True):
        assert s == ((b, a) in train)
    record = training.train_with(task, config, "A", 0)
    last = record["history"][-1]
    n = {k: int(m.sum()) for k, m in task.val_subsets.items()}
    overall = sum(last["val_acc_by_subset"][k] * n[k] for k in n) / len(task.y_val)
    assert overall == pytest.approx(last["val_acc"], abs=1e-12)


def test_movement_reports_the_gradient_scale_of_a_fixed_step() -> None:
    """Arm B steps ξ = −lr·P_W(G), so its movement is lr·‖P_W(G)‖ up to the retraction's
    second-order term (‖R(ξ) − W‖ = ‖ξ‖·(1 + O(‖ξ‖))) and float32 rounding of the two frames'
    difference (≤ 2·u·√r absolute): the bound below."""
    config = configure(patches.PRESETS, RunOptions(preset="smoke"))
    task = patches.make_task(config, patches.load_data(config, None), 1.0)
    record = training.train_with(task, config, "B", 0, track_movement=True)
    r = config["d_model"] // config["n_heads"]
    step = runs.median(record["movement"]["w_q"])
    rgrad = runs.median(record["grads"]["rgrad_w_q"])
    predicted = config["lr"] * rgrad
    bound = 2 * U32 * math.sqrt(r) + 2 * predicted**2
    assert abs(step - predicted) <= bound, (step, predicted, bound)
    # the Euclidean gradient is logged too, and the projection removes part of it
    assert runs.median(record["grads"]["w_q"]) > rgrad


def test_paired_stats_interval_and_ties() -> None:
    # b − a = 1, 2, 3, 4: mean 2.5, SD sqrt(5/3); t_{0.975, 3} = 3.182446305 (tables)
    s = runs.paired_stats([0, 0, 0, 0], [1, 2, 3, 4])
    half = 3.182446305 * math.sqrt(5 / 3) / 2
    assert s["ci_low"] == pytest.approx(2.5 - half, abs=1e-8)
    assert s["ci_high"] == pytest.approx(2.5 + half, abs=1e-8)
    assert runs.interval(s) == f"[{2.5 - half:+.2f}, {2.5 + half:+.2f}]"
    t = runs.paired_stats([1, 1, 2], [1, 2, 1])
    assert (t["wins"], t["ties"], t["losses"]) == (1, 1, 1)
    assert runs.record_of_wins(t) == "1/1/1"
    one = runs.paired_stats([1.0], [2.0])
    assert runs.interval(one) == "–" and one["wins"] == 1


def test_long_preset_is_the_papers_setting() -> None:
    long, paper = grokking.PRESETS["long"], grokking.PRESETS["paper"]
    for key in ("p", "train_fraction", "lr", "d_model", "n_heads", "d_mlp", "weight_decay"):
        assert long[key] == paper[key], key
    assert (long["p"], long["train_fraction"], long["lr"]) == (113, 0.3, 1e-3)
    assert len(long["seeds"]) >= 2 and long["steps"] < paper["steps"]
