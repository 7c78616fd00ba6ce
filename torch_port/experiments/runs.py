"""The one resumable runner of the experiments, its cache keys, and the statistics they report.

A sweep is a list of ``Cell``s (a training run, a student, a rung: whatever an experiment
computes at a time). ``run_cells`` computes them in order, each through ``run_cached``:

- a cell is named by its ``config`` (the settings it depends on, ``run_config``) and its
  ``key`` (what tells it apart from the other cells: seed, arm, …); a finished cell's record is
  saved under that name, so an interrupted sweep reads the finished cells back instead of
  recomputing them; so does one that grows (a seed added) where the cells' config leaves the
  list of seeds out (the Stiefel experiments, ``run_config``; the student sweeps of
  ``attention_students`` key their cells by the whole configuration, so there a new seed
  recomputes every cell);
- a long cell saves its own progress to the checkpoint ``run_cells`` hands it
  (``save_training``, every so many steps) and resumes from it (``resume_training``), so a
  resumed cell equals the uninterrupted one, bit for bit;
- ``resume=False`` discards a cell's saved record and progress before computing it;
- the saved records stay until ``forget_cached``, which an experiment calls once its outputs
  are written (``finish`` does both, in that order: a kill before that loses no finished cell).

Also here: ``torch_threads`` (the thread count a sweep runs under), ``median``, and the paired
statistics of arms over seeds (``paired_stats``, ``stat_cell``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import nn

from torch_port.experiments.common import Checkpoint, progress, write_results


# -- cells and their cache ---------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One unit of a sweep. ``config`` (the configuration the cell depends on, e.g. from
    ``run_config``) and ``key`` (what tells it apart from the sweep's other cells) name its
    cache entry; ``spec`` is what ``work`` computes it from; ``units`` is its share of the
    progress bar (1, or its number of steps when ``work`` advances the bar step by step)."""

    config: Mapping[str, Any]
    key: str
    spec: Any = None
    units: int = 1


def run_config(config: Mapping[str, Any], drop: Iterable[str]) -> dict[str, Any]:
    """The part of ``config`` one run depends on: ``config`` without the ``drop`` keys (the
    seed and arm lists, report-only keys), so the run's cache entry survives changes to them."""
    dropped = set(drop)
    return {k: v for k, v in config.items() if k not in dropped}


def run_cached(
    directory: Any,
    config: Mapping[str, Any],
    key: str,
    resume: bool,
    train: Callable[[Checkpoint], dict[str, Any] | None],
) -> dict[str, Any]:
    """``train(checkpoint)`` for one run, ``config`` being that run's configuration
    (``run_config``) and ``key`` naming its seed and arm, with resumption: a run finished
    earlier under the same (config, key) is read back from its saved record, one interrupted is
    resumed from its checkpoint; ``resume=False`` discards both first. The record stays saved
    until ``forget_cached`` (so an interrupted multi-run experiment skips the finished runs)."""
    running, finished = (
        Checkpoint(directory, config, key),
        Checkpoint(directory, config, key + "/done"),
    )
    if not resume:
        running.remove()
        finished.remove()
    done = finished.load()
    if done is not None:
        return done["record"]
    record = train(running)
    if record is None:
        raise RuntimeError(f"run {key} stopped before its last step")
    finished.save({"record": record})
    running.remove()  # only now: a kill before this line resumes from either file, never retrains
    return record


def run_cells(
    directory: Path,
    cells: Sequence[Cell],
    work: Callable[[Cell, Checkpoint, Any], dict[str, Any] | None],
    *,
    resume: bool,
    desc: str = "",
    show: bool = False,
) -> list[dict[str, Any]]:
    """``[work(cell, checkpoint, bar) for cell in cells]``, each cell through ``run_cached``
    (its record read back when it finished earlier; ``checkpoint`` its own progress file), with
    one progress bar of ``Σ cell.units`` (``bar``: ``work`` may advance it within its cell; it
    stands at the cell's end once the cell is done, cached or computed). The caller calls
    ``forget_cached(directory, cells)`` once its outputs are written."""
    bar = progress(sum(c.units for c in cells), desc, show)
    records, units = [], 0
    try:
        for cell in cells:

            def train(ck: Checkpoint, cell: Cell = cell) -> dict[str, Any] | None:
                return work(cell, ck, bar)

            records.append(run_cached(directory, cell.config, cell.key, resume, train))
            units += cell.units
            bar.update(units - bar.n)
    finally:
        bar.close()
    return records


def forget_cached(directory: Any, cells: Iterable[Cell]) -> None:
    """Remove the saved records (and any progress) of the ``cells`` of ``run_cells`` once the
    experiment's outputs are written."""
    for cell in cells:
        Checkpoint(directory, cell.config, cell.key).remove()
        Checkpoint(directory, cell.config, cell.key + "/done").remove()


def finish(
    directory: Path, cells: Iterable[Cell], document: dict[str, Any], markdown: str
) -> dict[str, Any]:
    """The last step of a sweep: write results.json and results.md (``common.write_results``,
    which releases the output directory), then ``forget_cached`` the cells — in this order, so a
    kill before the results are written loses no finished cell. Returns ``document``."""
    write_results(directory, document, markdown)
    forget_cached(directory, cells)
    return document


# -- the state of a training loop --------------------------------------------------------------
def save_training(
    checkpoint: Checkpoint,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    gen: torch.Generator,
    **loop: Any,
) -> None:
    """Save a training loop's progress: the model's and the optimizer's state, the data
    generator's state (keys "model", "optimizer", "generator") and the loop's own values
    ``loop`` (step, history, …)."""
    checkpoint.save(
        dict(
            model=model.state_dict(),
            optimizer=optimizer.state_dict(),
            generator=gen.get_state(),
            **loop,
        )
    )


def resume_training(
    checkpoint: Checkpoint | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    gen: torch.Generator,
) -> dict[str, Any] | None:
    """The progress ``save_training`` saved to ``checkpoint``, with the model, the optimizer and
    the generator restored from it (onto the model's device); None (nothing restored) when there
    is none; a checkpoint without those states (e.g. another run's file) is a
    ``CheckpointError`` naming it."""
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None:
        missing = sorted({"model", "optimizer", "generator"} - set(saved))
        if missing:
            raise checkpoint._refuse(f"holds no training state (no {', '.join(missing)})")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        gen.set_state(saved["generator"])
    return saved


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(count)`` and restore the previous count (the
    presets of ``lm``, ``ladder`` and ``native-rank`` fix their thread count).

    The students' matrices are 16×16: a second intra-op thread only adds synchronisation, and
    on a shared machine its spinning costs several times the work (measured: 1.1 ms per Adam
    step of a static student with one thread, 8–70 ms with two under load)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"threads must be ≥ 1, got {count}")
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- statistics --------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (NaN for an empty one)."""
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else math.nan


def paired_stats(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Paired comparison of b against a over seeds: mean difference d̄ = mean(b − a), its sample
    SD, t = d̄/(SD/√n) with its two-sided p (``scipy.stats.ttest_rel(b, a)``), the ``level``
    confidence interval of the mean difference d̄ ± t_{(1+level)/2, n−1}·SD/√n ("ci_low",
    "ci_high"), and the counts of seeds where b > a ("wins"), b = a ("ties") and b < a
    ("losses"). SD 0: t = ±inf and p = 0 when d̄ ≠ 0 (every seed moved by the same non-zero
    amount), t = p = NaN when d̄ = 0, and the interval is the point d̄; n < 2: t = p = NaN and
    no interval."""

    a_arr, b_arr = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = b_arr - a_arr
    n = len(diff)
    mean = float(diff.mean()) if n else math.nan
    sd = float(diff.std(ddof=1)) if n > 1 else math.nan
    if n > 1 and sd > 0:
        res = stats.ttest_rel(b_arr, a_arr)
        t, p = float(res.statistic), float(res.pvalue)
    elif n > 1 and mean != 0:
        t, p = math.copysign(math.inf, mean), 0.0
    else:
        t = p = math.nan
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n) if n > 1 else math.nan
    return {
        "n": n,
        "mean_diff": mean,
        "sd_diff": sd,
        "t": t,
        "p": p,
        "ci_level": level,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "wins": int((diff > 0).sum()),
        "ties": int((diff == 0).sum()),
        "losses": int((diff < 0).sum()),
    }


def record_of_wins(s: Mapping[str, Any]) -> str:
    """ "wins/ties/losses" of a ``paired_stats`` result, e.g. "9/1/2"."""
    return f"{s['wins']}/{s['ties']}/{s['losses']}"


def interval(s: Mapping[str, Any], spec: str = "+.2f") -> str:
    """The confidence interval of a ``paired_stats`` result as "[lo, hi]" ("–" without one)."""
    lo, hi = s.get("ci_low"), s.get("ci_high")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "–"
    return f"[{lo:{spec}}, {hi:{spec}}]"


def stat_cell(v: float | None) -> Any:
    """A table cell for t or p: "+∞"/"−∞" for infinite values (``markdown_table`` writes every
    non-finite float as "–"), the value itself otherwise."""
    if isinstance(v, float) and math.isinf(v):
        return "+∞" if v > 0 else "−∞"
    return v
