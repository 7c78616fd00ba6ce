"""The properties ``rattn conform`` checks on an optimizer it knows only by its steps.

Each property is a registered, citable proposition (``PROPERTIES``, ids ``CONF-…``) about the
step map W ↦ W⁺ of the optimizer under test, driven by the seeded problem of ``problem``. Its
check returns an ``Outcome``: passed (or ``None`` when it cannot be measured, e.g. the
optimizer has no ``weight_decay``), the measured value against its bound, and a detail line.
A claimed property passes only on evidence; an unclaimed one is measured and reported.

The checks: ``first_order`` (CONF-TANGENT, CONF-DIRECTION, CONF-ORDER: finite differences of
the step map, in float64), ``trajectories`` (CONF-DEGREE, CONF-EQUIVARIANCE, CONF-DECAY: two
float64 runs that must agree), ``drift`` (CONF-MANIFOLD), ``torch_state`` (CONF-STATE) and
``rule_agreement`` (CONF-RULE); what each is given and returns: ``context``. The iterates'
drift (CONF-MANIFOLD), the state (CONF-STATE) and the agreement with a rule (CONF-RULE, step by
step, so nothing accumulates) are checked in the dtype of the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proofs_checks.audit.verdicts import RESOLUTION
from proofs_checks.conformance.context import Context, Outcome, _Unmeasurable
from proofs_checks.conformance.drift import DRIFT_STEPS, check_manifold
from proofs_checks.conformance.first_order import check_direction, check_order, check_tangent
from proofs_checks.conformance.problem import TargetError
from proofs_checks.conformance.rule_agreement import NONE_AT, RULE_STEPS, check_rule
from proofs_checks.conformance.torch_state import check_state
from proofs_checks.conformance.trajectories import (
    EQUIVARIANCE_STEPS,
    check_decay,
    check_degree,
    check_equivariance,
)


@dataclass(frozen=True)
class Property:
    id: str
    claim: str  # the --claims key
    title: str
    statement: str
    check: Callable[[Context, Any], Outcome]


PROPERTIES: dict[str, Property] = {
    p.id: p
    for p in (
        Property(
            "CONF-MANIFOLD",
            "manifold",
            "iterates stay on the manifold",
            f"Over {DRIFT_STEPS} steps of the problem, max ‖WᵀW − I‖ stays within the rounding of "
            "one orthonormalisation in the run's dtype (polar_drift_bound): no drift accumulates.",
            check_manifold,
        ),
        Property(
            "CONF-TANGENT",
            "tangent",
            "the first-order step is tangent and descends",
            "D = dW⁺/d lr at lr = 0 satisfies ‖sym(WᵀD)‖ ≤ τ_D‖D‖ and ⟨G, D⟩ < 0 in every frame.",
            check_tangent,
        ),
        Property(
            "CONF-DIRECTION",
            "direction",
            "the first-order step is the claimed rule's",
            "D equals the claimed rule's first-order step within 2τ_D (length included); without "
            "a rule, D is a positive multiple of −grad f in the claimed metric, frame by frame.",
            check_direction,
        ),
        Property(
            "CONF-ORDER",
            "order",
            "retraction order as claimed",
            "The second-order term of the step map equals half the claimed metric's geodesic "
            "acceleration along D within τ_C‖D‖² (order 2), or does not (order 1).",
            check_order,
        ),
        Property(
            "CONF-DEGREE",
            "degree",
            "behaviour under gradient scaling as claimed",
            "Degree 0: the trajectory under G → cG (c = 2^±24) is unchanged within the "
            "accumulated rounding bound; degree 1: a step with cG equals a step with c·lr.",
            check_degree,
        ),
        Property(
            "CONF-EQUIVARIANCE",
            "equivariant",
            "O(d)-equivariance",
            f"The {EQUIVARIANCE_STEPS}-step trajectory from (QW, QG_t) equals Q times the one "
            "from (W, G_t) within the accumulated rounding bound (on the ten: from "
            "(QWPᵀ, QG_tPᵀ), P ∈ O(n) acting on the column factor).",
            check_equivariance,
        ),
        Property(
            "CONF-DECAY",
            "decay",
            "weight decay as claimed",
            "none: a run with weight_decay λ = 0.1 equals the run without; fused: it equals the "
            "run at lr/(1 − lr·λ) without decay (polar(W + ξ/(1 − lr·λ)), DESIGN §5); "
            "coupled: it equals the run without decay fed G + λ·x.",
            check_decay,
        ),
        Property(
            "CONF-STATE",
            "state",
            "state as torch's optimizers keep it",
            "A run saved with state_dict() and one resumed from it continue bit for bit as a twin "
            "never saved; zero_grad() sets gradients to None; a parameter whose grad is None "
            "keeps its point and state; lr 0 moves nothing.",
            check_state,
        ),
        Property(
            "CONF-RULE",
            "rule",
            "agreement with the claimed reference rule",
            f"For {RULE_STEPS} steps (lr falling to half, one grad None at step {NONE_AT}) the "
            "reference rule, shadowing the optimizer's own points, reaches each next point "
            f"within the audit's per-step bound, which resolves the step (≤ {RESOLUTION:g} of "
            "its length), in the run's dtype and in float64; the first departing step is named.",
            check_rule,
        ),
    )
}

CLAIM_KEYS = (*(p.claim for p in PROPERTIES.values()), "metric")


def evaluate(prop: Property, ctx: Context) -> Outcome:
    """Run one property; an unmeasurable one is an ``Outcome`` with passed None."""
    claim = ctx.claims.get(prop.claim)
    try:
        return prop.check(ctx, claim)
    except _Unmeasurable as why:
        return Outcome(None, f"not measured: {why}")
    except TargetError:
        raise
    except Exception as err:  # a foreign optimizer may raise anything
        return Outcome(False, f"the optimizer raised {type(err).__name__}: {err}")
