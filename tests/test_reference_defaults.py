"""The reference's presets keep their documented defaults, and a decay mode is only checked
when there is decay.

Defaults (DESIGN §5 and torch's documented ``torch.optim.AdamW``): Adam's ε = 1e-8 and betas
(0.9, 0.999); AdamW's lr 1e-3, ε 1e-8 and weight decay 1e-2. A changed default would change
every run that leaves it out, which no check with explicit arguments can see.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import reference as ref
from reference import optim as ro


def defaults(fn) -> dict:
    return {
        k: p.default
        for k, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def test_the_presets_keep_their_documented_defaults():
    assert defaults(ro.scale_by_adam)["eps"] == 1e-8
    adam = defaults(ro.riemannian_adam)
    assert adam["eps"] == 1e-8 and adam["betas"] == (0.9, 0.999)
    assert defaults(ro.adamw) == {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 1e-2,
    }
    assert defaults(ro.riemannian_momentum) == {"beta": 0.9, "c": 1.0}


def test_a_decay_mode_is_checked_only_with_decay():
    rng = np.random.default_rng(0)
    geo = ref.GEOMETRIES["fixed_rank_embedded"](5, 4, 2)
    x = geo.random_point(rng)
    ro.riemannian_adam(1e-3, weight_decay=0.0, decay="after").init(geo, x)  # no decay: fine
    with pytest.raises(ValueError, match="decay='after' is not defined"):
        ro.riemannian_adam(1e-3, weight_decay=0.1, decay="after").init(geo, x)
