"""The rules of ``rattn compare`` (``RULES``: each a reference optimizer and the port's) and the
table of cases it runs (``RECORDS``), which ``tests/test_port_agreement.py`` runs too.

A rule is the same chain of transformations on both sides: a preset of ``reference.optim`` and
of ``torch_port.optim``, or an arm of the step-rule ablation (E: Adam with one second moment per
frame on the Euclidean gradient, capped, then polar; H: Adam per entry on the Euclidean
gradient, then polar), the reference's ``Optimizer(..., gradient="euclidean")`` against the
experiments' own ``ChainOptimizer`` (``torch_port.experiments.arms.arm_rule``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import reference as ref
import torch_port as tp
from proofs_checks.port_compare.problems import STIEFEL_VARIANTS, VARIANTS, variant_name
from reference import optim as ro


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    reference: Callable[[], Any]
    port: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]


#: lr of the normalized rule: its steps have fixed length lr·sqrt(d·r); at 1e-2 it reaches the
#: Brockett minimiser within ~55 steps and then oscillates, amplifying any perturbation ~8× per
#: step (docs/torch_port.md); at 2e-3 it stays in the contracting regime for 100 steps.
LR = 1e-2
LR_NORMALIZED = 2e-3
#: The trust radius of the capped rules: below the first steps of every problem at lr 1e-2
#: (lr·sqrt(entries of a frame) ≥ 0.035), so the cap acts (tests/test_port_agreement.py).
RADIUS = 0.02
BETAS = (0.9, 0.999)


def _arm(moment: str, radius: float | None) -> Callable[[list[dict[str, Any]]], Any]:
    """The port's optimizer of ablation arm E (moment "frame", capped) or H ("elementwise")
    over the given (geometry) groups."""

    def make(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        frames = [
            {**g, "gradient": "euclidean", "moment": moment, "trust_radius": radius} for g in groups
        ]
        return tp.RiemannianAdam(frames, lr=LR, betas=BETAS, eps=1e-8)

    return make


def _reference_arm(moment: str, radius: float | None) -> ro.Optimizer:
    steps = [ro.scale_by_adam(*BETAS, 1e-8, moment=moment), ro.scale(-LR)]
    if radius is not None:
        steps.append(ro.trust_region(radius))
    return ro.Optimizer(ro.chain(*steps), LR, gradient="euclidean")


#: The port's optimizer class of each preset of ``reference.optim`` (DESIGN §5).
_PORT_PRESETS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "riemannian_adam": tp.RiemannianAdam,
    "riemannian_momentum": tp.RiemannianMomentum,
    "rsgd": tp.RSGD,
    "normalized_rsgd": tp.NormalizedRSGD,
}


def _preset(name: str, description: str, preset: str, **hyper: Any) -> Rule:
    """The rule ``name``: the preset ``preset`` with the same hyperparameters on both sides,
    ``reference.optim.<preset>(**hyper)`` against the port's class of it over the groups."""
    reference = getattr(ro, preset)
    port = _PORT_PRESETS[preset]
    return Rule(name, description, lambda: reference(**hyper), lambda groups: port(groups, **hyper))


RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        _preset(
            "riemannian_adam",
            f"lr {LR:g}, betas (0.9, 0.999), eps 1e-8, one √v per frame",
            "riemannian_adam",
            lr=LR,
        ),
        _preset(
            "riemannian_momentum",
            f"lr {LR:g}, beta 0.9, c 1",
            "riemannian_momentum",
            lr=LR,
            beta=0.9,
            c=1.0,
        ),
        _preset("rsgd", f"lr {LR:g}", "rsgd", lr=LR),
        _preset("normalized_rsgd", f"lr {LR_NORMALIZED:g}", "normalized_rsgd", lr=LR_NORMALIZED),
        _preset(
            "riemannian_adam_capped",
            f"riemannian_adam with trust radius {RADIUS:g}",
            "riemannian_adam",
            lr=LR,
            trust_radius=RADIUS,
        ),
        _preset(
            "riemannian_adam_elementwise",
            f"lr {LR:g}, one √v per entry, direction projected back (ablation arm F)",
            "riemannian_adam",
            lr=LR,
            moment="elementwise",
        ),
        _preset(
            "riemannian_adam_sum",
            f"lr {LR:g}, eps 1e-3, √v of ‖g‖ (reduction 'sum') rather than RMS(g)",
            "riemannian_adam",
            lr=LR,
            eps=1e-3,
            reduction="sum",
        ),
        _preset(
            "riemannian_momentum_small_c",
            f"lr {LR:g}, beta 0.5, c 1e-3 (normalised steps of length lr)",
            "riemannian_momentum",
            lr=LR,
            beta=0.5,
            c=1e-3,
        ),
        _preset("rsgd_capped", f"lr {LR:g}, trust radius 0.01", "rsgd", lr=LR, trust_radius=0.01),
        Rule(
            "arm_e",
            f"ablation arm E: frame Adam on the Euclidean gradient, trust radius {RADIUS:g}, polar",
            lambda: _reference_arm("frame", RADIUS),
            _arm("frame", RADIUS),
        ),
        Rule(
            "arm_h",
            "ablation arm H: Adam per entry on the Euclidean gradient (AdamW, no decay), polar",
            lambda: _reference_arm("elementwise", None),
            _arm("elementwise", None),
        ),
    )
}

#: The four presets of DESIGN §5.
PRESETS = ("riemannian_adam", "riemannian_momentum", "rsgd", "normalized_rsgd")
#: Every rule the ten design points are run with.
POINT_RULES = (*PRESETS, "riemannian_adam_capped", "riemannian_adam_elementwise")


@dataclass(frozen=True)
class Record:
    """One row of the agreement table: a problem (geometry, name), a rule, the dtypes it is run
    in, and the number of steps. Every case is checked against the bounds of ``runner``
    (a priori, or a measured envelope for bfloat16); float64 cases must also meet DESIGN §7's
    ~1e-12 after 100 steps."""

    geometry: str
    problem: str
    rule: str
    dtypes: tuple[str, ...]
    steps: int = 100


def _point_dtypes(name: str, rule: str) -> tuple[str, ...]:
    """float64 and float32, except the elementwise moment on R1 (and block R1): its first steps
    are sign-like (m̂/√v̂ = sign(g) at t = 1), so the trajectory amplifies a 1e-7 perturbation
    of the start by S ≈ 1e7 (measured) and no a priori float32 bound is informative; float64
    agreement is still asserted (measured 4e-14)."""
    if rule == "riemannian_adam_elementwise" and name.endswith("fixed_rank_embedded"):
        return ("float64",)
    return ("float64", "float32")


def _records() -> list[Record]:
    stiefel = [
        Record("stiefel", problem, rule, ("float64", "float32", "bfloat16"))
        for problem in ("brockett", "attention_logits")
        for rule in PRESETS
    ] + [
        Record("stiefel", problem, rule, ("float64", "float32"))
        for problem in ("brockett", "attention_logits")
        for rule in ("riemannian_adam_capped", "riemannian_adam_elementwise", "arm_e", "arm_h")
    ]
    stiefel += [
        Record("stiefel", "brockett", rule, ("float64",))
        for rule in ("riemannian_adam_sum", "riemannian_momentum_small_c", "rsgd_capped")
    ] + [
        Record("stiefel", variant_name("brockett", options), rule, ("float64",))
        for options in STIEFEL_VARIANTS
        for rule in ("riemannian_adam_capped", "riemannian_momentum", "rsgd")
    ]
    points = [
        Record(name, "matrix_fit", rule, _point_dtypes(name, rule))
        for name in ref.GEOMETRIES
        for rule in POINT_RULES
    ]
    variants = [
        Record(name, variant_name("matrix_fit", options), rule, ("float64",), steps=50)
        for name, options_list in VARIANTS.items()
        for options in options_list
        for rule in ("riemannian_adam_capped", "riemannian_momentum")
    ]
    return stiefel + points + variants


RECORDS: list[Record] = _records()
