"""The pooled test of ``rattn audit`` (``proofs_checks.audit.pooled``): on rows drawn from its
model it stays quiet, a departure at one step shared by the frames is flagged at that step, and
a recording it cannot read (sampled, too few frames, steps its rows judged) is not tested, with
the reason; on a recorded bfloat16 run, an honest optimizer is not flagged and one whose lr is
half again the group's at one step is."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from proofs_checks.audit import pooled
from proofs_checks.audit.verdicts import overall

F, T, SIGMA = 24, 30, 1e-3


def _rows(
    along: np.ndarray, state: np.ndarray | None = None, verdict="not auditable", lr=None
) -> list:
    """Replay rows of one group: ``along`` (steps × frames), the state's deviation over its
    bound (``state_ratio``; None: not checked) and the lr of each step (default 1e-3)."""
    lr = np.full(along.shape[0], 1e-3) if lr is None else lr
    return [
        {
            "step": t + 1,
            "group": 0,
            "params": [0],
            "element": [f],
            "along": float(along[t, f]),
            "state_ratio": None if state is None else float(state[t, f]),
            "lr": float(lr[t]),
            "skipped": False,
            "verdict": verdict,
        }
        for t in range(along.shape[0])
        for f in range(along.shape[1])
    ]


def _honest(seed: int) -> np.ndarray:
    """The model's rows: a drift smooth in t shared by the frames plus independent N(0, σ²)."""
    rng = np.random.default_rng(seed)
    drift = -0.02 * (np.arange(T) / T) ** 2
    return drift[:, None] + SIGMA * rng.standard_normal((T, F))


def _shift_for(statistic: float) -> float:
    """The shift of one step's along that gives T_t ≈ ``statistic`` (the second difference's
    spread is σ·sqrt(1.5))."""
    return statistic * pooled.inflation(F) * SIGMA * math.sqrt(1.5) / math.sqrt(F)


def test_the_threshold_is_bonferronis_over_the_steps() -> None:
    result = pooled.pooled_test(_rows(_honest(0)))
    m = result["tested"]
    assert m == T - 2  # every interior step
    assert result["largest"]["threshold"] == pytest.approx(stats.t.isf(1e-3 / (3 * m), F - 1))
    assert pooled.inflation(24) == pytest.approx(math.sqrt((1 + 23 * 0.05) / 0.95))


@pytest.mark.parametrize("seed", range(5))
def test_rows_of_the_model_are_not_flagged(seed: int) -> None:
    result = pooled.pooled_test(_rows(_honest(seed)))
    assert result["tested"] == T - 2 and result["flagged"] == []
    assert abs(result["largest"]["statistic"]) < result["largest"]["threshold"]


def test_a_shared_lr_departure_is_flagged_at_its_step() -> None:
    along = _honest(1)
    threshold = pooled.pooled_test(_rows(along))["largest"]["threshold"]
    along[14] += _shift_for(1.6 * threshold)  # step 15
    result = pooled.pooled_test(_rows(along))
    assert [t["step"] for t in result["flagged"]] == [15]
    assert result["flagged"][0]["statistic"] > threshold
    assert {e["step"] for e in result["echoes"]} <= {
        14,
        16,
    }  # the neighbours move by half, the other way


def test_a_state_left_behind_is_flagged_by_the_state_statistic() -> None:
    """A moment not transported at step 15: every frame's state deviation over its bound grows
    there (measured 12× on bfloat16 runs); the test reads its logarithm, upward only."""
    rng = np.random.default_rng(5)
    ratio = 1.8e-4 * np.exp(0.01 * rng.standard_normal((T, F)))
    assert pooled.pooled_test(_rows(_honest(5), ratio))["flagged"] == []
    ratio[14] *= 1.5
    result = pooled.pooled_test(_rows(_honest(5), ratio))
    assert [t["step"] for t in result["flagged"]] == [15]
    assert result["flagged"][0]["state"] > result["flagged"][0]["threshold"]
    assert "(the state: T = +" in pooled.pooled_line(result)


def test_a_step_of_the_schedule_is_not_read_as_a_departure() -> None:
    """An honest lr drop ×0.1 from step 15 changes how many entries stagnate, so a_t jumps
    there: the steps whose neighbours' lr differs by more than 1% (14 and 15) are not tested,
    and nothing is flagged; a linear warm-up from 0 is not tested until the lr is steady."""
    along, lr = _honest(6), np.full(T, 1e-3)
    along[14:] += 0.05  # what the drop does to a_t
    lr[14:] = 1e-4
    result = pooled.pooled_test(_rows(along, lr=lr))
    assert result["tested"] == T - 4 and result["flagged"] == []
    control = pooled.pooled_test(_rows(along))  # the same a_t read as a steady-lr run
    assert [t["step"] for t in control["flagged"]] in ([14], [15])  # a jump: two equal shifts
    warm = np.minimum(1.0, np.arange(T) / 10) * 1e-3  # lr 0 at step 1, 1e-3 from step 11
    tested = {t["step"] for t in pooled.pooled_test(_rows(_honest(6), lr=warm))["tests"]}
    assert tested == set(range(12, T))


def test_a_departure_of_one_frame_only_is_not_a_shared_shift() -> None:
    """Control of what the test reads: the same total shift put on one frame moves the spread
    as much as the mean, so it is not flagged."""
    along = _honest(3)
    along[14, 0] += F * _shift_for(1.6 * 5.0)
    assert pooled.pooled_test(_rows(along))["flagged"] == []


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda rows: [r for r in rows if r["step"] % 2], "neighbours recorded"),
        (lambda rows: [r for r in rows if r["element"][0] < 7], "≥ 8 frames"),
        (lambda rows: [dict(r, verdict="pass") for r in rows], "could not judge"),
    ],
    ids=["sampled", "seven frames", "judged by its rows"],
)
def test_what_it_cannot_read_is_not_tested(edit, reason: str) -> None:
    result = pooled.pooled_test(edit(_rows(_honest(0))))
    assert result["tested"] == 0 and result["flagged"] == [] and reason in result["reason"]
    assert "pooled test: not run" in pooled.pooled_line(result)


def test_a_flag_fails_the_run_and_nothing_else_passes_it() -> None:
    along = _honest(4)
    rows = _rows(along)
    quiet = pooled.pooled_test(rows)
    assert overall(rows, quiet)["verdict"] == "not auditable"  # never "passed"
    along[14] += _shift_for(2 * quiet["largest"]["threshold"])
    rows = _rows(along)
    result = overall(rows, pooled.pooled_test(rows))
    assert result["verdict"] == "failed" and result["first_failure_step"] == 15


def _bf16_run(tmp_path, factor: float) -> dict:
    """8 frames of St(64, 16) in bfloat16 under RiemannianAdam, 12 steps all recorded, the lr
    multiplied by ``factor`` inside step 6 (the recorder sees the group's lr); replayed."""
    torch = pytest.importorskip("torch")
    import torch_port as tp
    from proofs_checks.audit.replay import audit
    from torch_port.audit import record

    class Departed(tp.RiemannianAdam):
        steps = 0

        def step(self, closure=None):
            self.steps += 1
            scale = factor if self.steps == 6 else 1.0
            for g in self.param_groups:
                g["lr"] *= scale
            try:
                return super().step(closure)
            finally:
                for g in self.param_groups:
                    g["lr"] /= scale

    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(
        tp.Stiefel(64, 16).random_point(g, (8,), dtype=torch.float64).to(torch.bfloat16)
    )
    a = torch.randn(w.shape, generator=g, dtype=torch.float64)
    opt = Departed([{"params": [w], "geometry": "stiefel"}], lr=1e-3)
    path = tmp_path / "trace.npz"
    with record(opt, path):
        for _ in range(12):
            w.grad = (a + 0.3 * torch.randn(a.shape, generator=g, dtype=torch.float64)).to(
                torch.bfloat16
            )
            opt.step()
    return audit(path)


def test_a_recorded_bfloat16_run_is_judged_by_the_pooled_test(tmp_path) -> None:
    honest = _bf16_run(tmp_path, 1.0)
    assert honest["counts"]["pass"] == 0  # no row can judge a bfloat16 step here
    assert honest["pooled"]["tested"] == 10 and honest["pooled"]["flagged"] == []
    assert honest["verdict"] == "not auditable"
    departed = _bf16_run(tmp_path, 1.5)
    assert [t["step"] for t in departed["pooled"]["flagged"]] == [6]
    assert departed["verdict"] == "failed" and departed["first_failure_step"] == 6


def test_a_step_recorded_twice_is_refused_by_name(tmp_path, capsys) -> None:
    """Two records of one step of a parameter: which ran? A trace holding both is refused
    (exit 2), not read as the last one (which could hide a departure)."""
    from proofs_checks.cli import main

    _bf16_run(tmp_path, 1.5)
    path = tmp_path / "trace.npz"
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(bytes(arrays.pop("meta.json")).decode())
    k, n = 5, len(meta["steps"])  # record 5 is step 6
    meta["steps"].append(dict(meta["steps"][k], record=n))
    for key in [key for key in arrays if key.startswith(f"r{k}/")]:
        arrays[f"r{n}/" + key.split("/", 1)[1]] = arrays[key]
    twice = tmp_path / "twice.npz"
    np.savez(twice, **arrays, **{"meta.json": np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    assert main(["audit", str(twice)]) == 2
    err = capsys.readouterr().err
    assert "step 6 of group 0" in err and "was taken already (record 5)" in err


def test_the_command_fails_a_flagged_run_and_says_where(tmp_path, capsys) -> None:
    from proofs_checks.cli import main

    _bf16_run(tmp_path, 1.5)
    assert main(["audit", str(tmp_path / "trace.npz")]) == 1
    out = capsys.readouterr().out
    assert "FAILED: the pooled test flagged step 6" in out
    assert "FLAGGED at step 6 (" in out


def test_identical_frames_are_not_tested() -> None:
    """Frames that move exactly alike (copies of one frame given one gradient) are not the
    model's independent frames: no spread, nothing to compare the mean with, so the step is not
    tested (an honest run of copies is not failed), and the report says so."""
    along = np.tile(np.linspace(0.0, -0.05, T)[:, None] ** 2, (1, F))
    result = pooled.pooled_test(_rows(along))
    assert result["tested"] == 0 and result["flagged"] == [] and result["untested"] == T


def test_departures_in_two_groups_are_named_with_their_groups() -> None:
    along = _honest(8)
    threshold = pooled.pooled_test(_rows(along))["largest"]["threshold"]
    moved = along.copy()
    moved[9] += _shift_for(3 * threshold)  # step 10 of group 1
    rows = _rows(along) + [dict(r, group=1) for r in _rows(moved)]
    result = pooled.pooled_test(rows)
    assert [(t["group"], t["step"]) for t in result["flagged"]] == [(1, 10)]
    assert {e["group"] for e in result["echoes"]} <= {1}
    line = pooled.pooled_line(result)
    assert "FLAGGED at step 10" in line and result["tested"] == 2 * (T - 2)


def test_a_frame_missing_at_one_step_is_counted_as_untested() -> None:
    rows = [r for r in _rows(_honest(9)) if not (r["step"] == 15 and r["element"] == [3])]
    result = pooled.pooled_test(rows)
    assert result["tested"] == T - 2 - 3 and result["untested"] == 5  # 14, 15, 16 and the ends
    assert f"{T - 5} steps tested" in pooled.pooled_line(result)
    assert ", 5 not (" in pooled.pooled_line(result)


def test_the_state_statistic_is_one_sided() -> None:
    """A drop of the state's ratio (moments warming up) is not a departure; a rise is."""
    rng = np.random.default_rng(10)
    ratio = 1.8e-4 * np.exp(0.01 * rng.standard_normal((T, F)))
    ratio[14] /= 1.5
    down = pooled.pooled_test(_rows(_honest(10), ratio))
    assert (
        down["flagged"] == []
        and min(t["state"] for t in down["tests"]) < -down["largest"]["threshold"]
    )


def test_the_result_is_valid_json_without_a_state() -> None:
    """A rule whose state is not checked (None) or exact (ratio 0) leaves no NaN behind."""
    ratio = np.zeros((T, F))
    result = pooled.pooled_test(_rows(_honest(11), ratio))
    json.dumps(result, allow_nan=False)
    assert all(t["state"] is None and t["state_shift"] is None for t in result["tests"])
