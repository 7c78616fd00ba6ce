"""The pooled test of an audit: a departure at one step that every frame of a group shares (the
learning rate off by a factor 1 + δ, a step not taken, a moment not transported), read from all
the frames of the step at once. It judges steps that the row-by-row bound cannot: in bfloat16 a
step's rounding bound is several times the step itself, so no row can pass or fail on its own.
It can fail a run, never pass one.

For each element (frame) f and recorded step t the replay gives a_{t,f} = ⟨e, Δ⟩/‖Δ‖² (the row's
``along``: e the deviation of the recorded point after the step from the rule's step from the
recorded point, Δ the rule's step). A step taken with lr·(1 + δ) has a_{t,f} = δ plus rounding,
for every frame. In an honest low-precision run a_{t,f} drifts smoothly with t (updates below
half an ulp round back to the stored value, more of them as the moments shrink), so the test
reads the second difference of three consecutive recorded steps,

    D_{t,f} = a_{t,f} − (a_{t−1,f} + a_{t+1,f})/2,

and compares its mean over the F frames of step t with its spread across them:

    T_t = mean_f D_{t,f} / (sd_f D_{t,f} / √F) / c_F,   c_F = sqrt((1 + (F − 1)ρ)/(1 − ρ)).

Model: in an honest run the D_{t,f} of one step are normal with mean 0, a common variance and a
correlation of at most ρ = ``RHO_MAX`` between two frames (each is a weighted sum of the
rounding errors of the frame's d·r entries; frames round independently, and share only the
step's schedule). The mean's variance is then at most (1 + (F − 1)ρ)σ²/F and the spread's
expectation at least (1 − ρ)σ², so T_t is at most as wide as Student's t with F − 1 degrees of
freedom (to the approximation that treats the spread as independent of the mean), and flagging
|T_t| > t_{F−1}(1 − α/(3m)) over the m steps tested in a run, and the same statistic of the
state below, upward, raises a false alarm with probability at most α = ``FALSE_ALARM``
(Bonferroni over the 3m tails). A departure δ at step t moves the mean second difference by δ
there and by −δ/2 at t ± 1; the larger is reported, the other two are its echoes.

The state: the same T_t of log(state deviation / its bound) per frame (the row's
``state_ratio``), flagged upward only. A moment left where the step started (not transported)
multiplies it by about 12 at that step in every frame; its honest second differences are
negative where the moments warm up, which the one-sided test does not count, nor the rises
they cause at the neighbouring steps (``_after_a_drop``). Frames that move exactly alike (no
spread) are not the model's and are not tested; the report counts the steps it could not test.

docs/audit.md gives the model's check on honest runs (the measured correlation, the
distribution of T) and the smallest departures it detects. A point moved off the rule's line at
one step is not seen by it (the deviation's part across the step has an honest level that is
not smooth in t); the row bound judges that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

#: The false-alarm probability of a whole run under the model (module docstring).
FALSE_ALARM = 1e-3
#: The fewest frames a step needs to be tested (the t statistic's spread across frames).
MIN_FRAMES = 8
#: The largest relative change of the learning rate over three steps that are tested (the
#: largest of the three at most 1 + LR_CHANGE times the smallest): the drift
#: of a_t follows the lr (how many entries stagnate), so a warm-up or a jump of the schedule
#: bends it; a step where the lr moves more is not tested.
LR_CHANGE = 0.01
#: The largest average correlation between two frames' second differences the model allows
#: (measured −0.002 to 0.021 on honest bfloat16 runs of three kinds, docs/audit.md).
RHO_MAX = 0.05


def inflation(frames: int, rho: float = RHO_MAX) -> float:
    """The factor by which correlation ρ between frames widens T_t at most: the mean's variance
    grows by 1 + (F − 1)ρ and the spread across frames shrinks by 1 − ρ."""
    return math.sqrt((1 + (frames - 1) * rho) / (1 - rho))


def _frame(row: dict[str, Any]) -> tuple:
    return (row["group"], tuple(row["params"]), str(row["element"]))


def _steady(lrs: Sequence[float]) -> bool:
    """Whether the learning rates of three steps differ by at most ``LR_CHANGE`` (relative)."""
    return min(lrs) > 0 and max(lrs) <= (1 + LR_CHANGE) * min(lrs)


def _second_difference(values: np.ndarray) -> np.ndarray:
    """D_t per frame of three steps' values (rows t − 1, t, t + 1; a column a frame)."""
    return values[1] - 0.5 * (values[0] + values[2])


def _statistic(d: np.ndarray) -> float | None:
    """T_t of the frames' second differences ``d``, divided by ``inflation``; None when a value
    is not finite or the frames do not spread (identical frames are not the model's independent
    ones: nothing to compare the mean with)."""
    if not np.isfinite(d).all():
        return None
    spread, mean = float(np.std(d, ddof=1)), float(np.mean(d))
    if spread <= 16 * np.finfo(float).eps * float(np.max(np.abs(d))):  # alike but for rounding
        return None
    return mean / (spread / math.sqrt(d.size)) / inflation(d.size)


def pooled_test(rows: Sequence[dict[str, Any]], false_alarm: float = FALSE_ALARM) -> dict:
    """The pooled test (module docstring) of a replay's rows: for every group, the steps t with
    a row the row test could not judge ("not auditable") whose neighbours t − 1 and t + 1 were
    recorded with the same ≥ ``MIN_FRAMES`` frames and a learning rate within ``LR_CHANGE``
    of t's; for each, T_t (``statistic``), the mean
    second difference (``shift``), the threshold for ``false_alarm`` per run; the steps flagged
    (a flagged step's neighbours that are its echoes, ``_departures``, listed apart). ``tested`` is
    0, with the reason, when no step could be tested (sampled recording, fewer than three
    consecutive steps, too few frames, every step judged by its rows)."""
    values: dict[int, dict[int, dict[tuple, tuple[float, float]]]] = {}
    unjudged: set[tuple[int, int]] = set()
    lrs: dict[tuple[int, int], float] = {}
    for r in rows:
        if r.get("along") is None or r["skipped"]:
            continue
        lrs[r["group"], r["step"]] = r["lr"]
        ratio = r.get("state_ratio")
        state = math.log(ratio) if ratio and ratio > 0 else math.nan  # unchecked or exact
        values.setdefault(r["group"], {}).setdefault(r["step"], {})[_frame(r)] = (
            r["along"],
            state,
        )
        if r["verdict"] == "not auditable":
            unjudged.add((r["group"], r["step"]))
    tests = []
    for group, by_step in sorted(values.items()):
        for t in sorted(by_step):
            frames = set(by_step[t])
            if (
                (group, t) not in unjudged
                or len(frames) < MIN_FRAMES
                or any(set(by_step.get(s, {})) != frames for s in (t - 1, t + 1))
                or not _steady([lrs[group, s] for s in (t - 1, t, t + 1)])
            ):
                continue
            keys = sorted(frames)
            v = np.array([[by_step[s][k] for k in keys] for s in (t - 1, t, t + 1)])
            along, state = _second_difference(v[..., 0]), _second_difference(v[..., 1])
            statistic = _statistic(along)
            if statistic is None:
                continue
            state_t = _statistic(state)
            tests.append(
                {
                    "group": group,
                    "step": t,
                    "frames": len(keys),
                    "statistic": statistic,
                    "shift": float(np.mean(along)),
                    "state": state_t,
                    "state_shift": (None if state_t is None else float(np.mean(state))),
                }
            )
    untested = len(unjudged) - len(tests)  # steps the rows could not judge, nor this test
    if not tests:
        return {
            "tested": 0,
            "untested": untested,
            "false_alarm": false_alarm,
            "flagged": [],
            "reason": (
                "no step that its rows could not judge with its two neighbours recorded for "
                f"the same ≥ {MIN_FRAMES} frames at a steady lr (record every step, with every "
                "frame)"
            ),
        }
    m = len(tests)
    for test in tests:  # three tails a step (along: both; the state: up), α/(3m) each
        test["threshold"] = float(stats.t.isf(false_alarm / (3 * m), test["frames"] - 1))
    by_step = {(t["group"], t["step"]): t for t in tests}
    for test in tests:
        test["flagged"] = abs(test["statistic"]) > test["threshold"] or (
            test["state"] is not None
            and test["state"] > test["threshold"]
            and not _after_a_drop(test, by_step)
        )
    largest = max(tests, key=lambda t: abs(t["statistic"]))
    departed, echoes = _departures(tests)
    return {
        "tested": m,
        "untested": untested,
        "false_alarm": false_alarm,
        "largest": largest,
        "flagged": departed,
        "echoes": echoes,
        "tests": tests,
        "reason": None,
    }


def _after_a_drop(test: dict[str, Any], by_step: dict[tuple[int, int], dict]) -> bool:
    """Whether the state's rise at this step is the echo of a larger drop at a neighbour (a drop
    by L at t raises the second differences at t ± 1 by L/2: honest, as the moments settle)."""
    rise = test["state_shift"]
    for d in (-1, 1):
        other = by_step.get((test["group"], test["step"] + d))
        if other is not None and other["state_shift"] is not None and other["state_shift"] < -rise:
            return True
    return False


def _departures(tests: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict]]:
    """(the flagged steps that departed, the flagged steps that are their echoes). A departure
    δ at t moves the mean second difference by δ at t and by −δ/2 at t ± 1 (a lasting change
    by ±δ/2 at t − 1 and t), so flags come in runs of consecutive steps: of each run, the step
    with the largest mean second difference (``shift`` when ``along`` flagged one of them, else
    the state's) departed. T itself does not tell: a departure also widens the spread at its
    own step. The step named can be one off where the departure's own step was not tested (the
    first or last of a run, a moving lr) or two departures lie two steps apart: the run fails
    either way."""
    flagged = [t for t in tests if t["flagged"]]
    runs: list[list[dict[str, Any]]] = []
    for t in flagged:  # ``tests`` is sorted by group, then step
        last = runs[-1][-1] if runs else None
        if last is not None and last["group"] == t["group"] and t["step"] == last["step"] + 1:
            runs[-1].append(t)
        else:
            runs.append([t])
    departed, echoes = [], []
    for run in runs:
        along = any(abs(t["statistic"]) > t["threshold"] for t in run)
        key = "shift" if along else "state_shift"
        top = max(run, key=lambda t: abs(t[key]))
        departed.append(top)
        echoes += [{"group": t["group"], "step": t["step"]} for t in run if t is not top]
    return departed, echoes


def _flag(test: dict[str, Any]) -> str:
    if test["state"] is not None and test["state"] > test["threshold"]:
        return f"{test['step']} (the state: T = {test['state']:+.3g})"
    return f"{test['step']} (T = {test['statistic']:+.3g})"


def pooled_line(pooled: dict[str, Any]) -> str:
    """One line for the report."""
    if not pooled["tested"]:
        return f"pooled test: not run ({pooled['reason']})"
    big = pooled["largest"]
    head = (
        f"pooled test (false alarm ≤ {pooled['false_alarm']:g} per run under its model): "
        f"{pooled['tested']} steps tested (threshold |T| > {big['threshold']:.2f})"
        + (
            f", {pooled['untested']} not (a frame missing or not finite at it or a neighbour, "
            "no spread, an end of the run or a moving lr)"
            if pooled["untested"]
            else ""
        )
    )
    if not pooled["flagged"]:
        return head + (
            f", largest |T| = {abs(big['statistic']):.2g} at step {big['step']}: "
            "no departure flagged"
        )
    flagged = ", ".join(_flag(t) for t in pooled["flagged"])
    groups = sorted({e["group"] for e in pooled["echoes"]})
    echoes = "; ".join(
        ", ".join(str(e["step"]) for e in pooled["echoes"] if e["group"] == g)
        + (f" (group {g})" if len(groups) > 1 else "")
        for g in groups
    )
    tail = f"; steps {echoes} are their echoes" if echoes else ""
    return head + f": FLAGGED at step {flagged}{tail}"
