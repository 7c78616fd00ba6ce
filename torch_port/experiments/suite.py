"""The tasks of the movement and ablation experiments, and the ``run`` they share.

Both experiments train every (task, seed, arm) of a configuration ``{"tasks": {name: task
configuration}, "arms": [...], "seeds": [...]}`` on the tasks of the grokking and patches
experiments (``TASKS``), with task configurations taken from those experiments' presets
(``task_config``). ``run_stiefel_experiment`` is the whole ``run`` of either (each describes
itself by a ``StiefelExperiment``): configure and check, build every task, train the cells
(``training.train_cells``, keyed by the task's configuration, seed and arm), summarise, plot and
write the results. This is the only module that imports the grokking and patches experiments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torch_port.experiments import grokking, patches, runs, training
from torch_port.experiments.arms import check_arms
from torch_port.experiments.common import (
    configure,
    output_dir,
    resolve_device,
    results_document,
)
from torch_port.experiments.training import Task

TASKS = ("grokking", "patches")

#: Per task, its experiment's presets and the keys of those presets that are not task settings.
_PRESETS = {"grokking": grokking.PRESETS, "patches": patches.PRESETS}
_EXPERIMENT_KEYS = {
    "grokking": ("arms", "seeds", "threshold", "last_fraction"),
    "patches": ("arms", "seeds", "fractions", "sweep_seeds"),
}
_CHECKS = {"grokking": grokking.check_task, "patches": patches.check_task}


def task_config(name: str, preset: str, **changes: Any) -> dict[str, Any]:
    """The task settings of experiment ``name``'s ``preset`` (its seed, arm and report keys
    removed), with ``changes`` applied; a change equal to the preset's value is refused (it
    would only hide which settings differ)."""
    base = runs.run_config(_PRESETS[name][preset], _EXPERIMENT_KEYS[name])
    same = sorted(k for k, v in changes.items() if k in base and base[k] == v)
    if same:
        raise ValueError(f"{name} {preset}: changes {same} repeat the preset's values")
    return {**base, **changes}


def check_tasks(config: dict[str, Any]) -> None:
    """Refuse a movement/ablation configuration without tasks, with unknown tasks or arms, or
    with a task configuration that cannot run (each task's ``check_task``)."""
    tasks = config["tasks"]
    if not isinstance(tasks, dict) or not tasks:
        raise ValueError(f"tasks must be a non-empty mapping, got {tasks!r}")
    bad = sorted(set(tasks) - set(TASKS))
    if bad:
        raise ValueError(f"unknown tasks {bad}; choose among {TASKS}")
    for name, tcfg in tasks.items():
        _CHECKS[name](tcfg)
    check_arms(config["arms"])


def apply_data_dir(config: dict[str, Any], data_dir: Any) -> dict[str, Any]:
    """``config`` with its patches task switched to CIFAR-10 when ``data_dir`` is given (a new
    dict; the preset is not changed), so that what is cached and recorded names the dataset."""
    if data_dir is None or "patches" not in config["tasks"]:
        return config
    tasks = {**config["tasks"], "patches": {**config["tasks"]["patches"], "dataset": "cifar10"}}
    return {**config, "tasks": tasks}


def task_factory(
    name: str, config: dict[str, Any], data_dir: Any, device: torch.device | str
) -> Callable[[int], Task]:
    """seed -> Task for the named task ("grokking": a + b mod p, split drawn by the seed;
    "patches": the configured dataset, one fixed split, loaded here) with ``config`` in the
    format of ``task_config``."""
    if name == "grokking":
        grokking.check_task(config)
        return lambda seed: grokking.make_task(config, seed, device)
    if name == "patches":
        patches.check_task(config)
        task = patches.make_task(config, patches.load_data(config, data_dir), 1.0, device)
        return lambda seed: task
    raise ValueError(f"unknown task {name!r}; choose among {TASKS}")


def run_tasks(
    config: dict[str, Any],
    options: Any,
    directory: Any,
    device: torch.device | str,
    track_movement: bool,
) -> tuple[list[dict[str, Any]], list[runs.Cell]]:
    """Every (task, seed, arm) of ``config`` ("tasks": name -> task configuration, "arms",
    "seeds") through ``training.train_cells`` (keyed by the task's configuration, seed and arm);
    every task is built (its data loaded) before the first run. Returns the run records and
    their cells (for ``runs.finish``)."""
    check_arms(config["arms"])
    tasks = {}
    for name, tcfg in config["tasks"].items():
        make = task_factory(name, tcfg, options.data_dir, device)
        for seed in config["seeds"]:
            tasks[(name, seed)] = make(seed)
    cells = []
    for (name, seed), task in tasks.items():
        tcfg = config["tasks"][name]
        cache_config = {"task": name, **tcfg, "track_movement": track_movement}
        for arm in config["arms"]:
            cells.append(runs.Cell(cache_config, f"{name}-{seed}-{arm}", (task, tcfg, arm, seed)))
    records = training.train_cells(directory, cells, options, track_movement=track_movement)
    return records, cells


@dataclass(frozen=True)
class StiefelExperiment:
    """What a movement/ablation-style experiment module supplies to ``run_stiefel_experiment``:
    its ``name`` and ``presets``, its reports (``summarise(config, runs) -> summary``,
    ``markdown(config, summary) -> results.md``, ``plots(directory, config, runs, summary) ->
    file names``) and whether its runs log per-step movement (``track_movement``)."""

    name: str
    presets: dict[str, dict[str, Any]]
    summarise: Callable[[dict[str, Any], list[dict[str, Any]]], dict[str, Any]]
    markdown: Callable[[dict[str, Any], dict[str, Any]], str]
    plots: Callable[[Any, dict[str, Any], list[dict[str, Any]], dict[str, Any]], list[str]]
    track_movement: bool = False


def run_stiefel_experiment(experiment: StiefelExperiment, options: Any) -> dict[str, Any]:
    """The ``run`` of a movement/ablation-style experiment: configure its preset (CIFAR-10 for
    the patches task when ``options.data_dir`` is given), check it, train every (task, seed,
    arm), then ``summarise`` the runs, draw the ``plots`` and write results.json and results.md
    under ``<out>/<name>``."""
    config = apply_data_dir(configure(experiment.presets, options), options.data_dir)
    check_tasks(config)
    device = resolve_device(options.device)
    directory = output_dir(options, experiment.name)
    records, cells = run_tasks(config, options, directory, device, experiment.track_movement)
    summary = experiment.summarise(config, records)
    summary["plots"] = experiment.plots(directory, config, records, summary)
    document = results_document(experiment.name, options, config, records, summary, device)
    return runs.finish(directory, cells, document, experiment.markdown(config, summary))
