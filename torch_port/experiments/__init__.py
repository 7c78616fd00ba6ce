"""The experiments of DESIGN §8, each ``rattn experiment NAME`` (see ``common`` for the contract).

Experiments may use ``reference`` (e.g. rank estimators on learned kernels); the core modules of
``torch_port`` never do (DESIGN §2). Modules are imported when an experiment is asked for.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Experiment name -> module that implements it.
EXPERIMENTS: dict[str, str] = {
    "grokking": "torch_port.experiments.grokking",
    "patches": "torch_port.experiments.patches",
    "lm": "torch_port.experiments.lm",
    "movement": "torch_port.experiments.movement",
    "ablation": "torch_port.experiments.ablation",
    "trust": "torch_port.experiments.trust",
    "ladder": "torch_port.experiments.ladder",
    "native-rank": "torch_port.experiments.native_rank",
    "rank-edge": "torch_port.experiments.rank_edge",
}


def load(name: str) -> ModuleType:
    """The module of experiment ``name``; an unknown name lists the known ones."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {sorted(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[name])


__all__ = ["EXPERIMENTS", "load"]
