"""The rule a recorded step is replayed against: the reference optimizer of each recorded
optimizer (the four presets of ``reference.optim.PRESET_CHAINS``, geoopt's rules as
``reference.field_rules`` states them) with the hyperparameters in force, or the rule a run
is claimed to follow (``Claim``: ``rattn audit --rule NAME --set KEY=VALUE``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from proofs_checks import reference_rules
from proofs_checks.audit.errors import TraceError
from reference import optim as ro

#: The rules of ``proofs_checks.reference_rules`` that another library's optimizer runs (geoopt's:
#: ``reference.field_rules``), recorded under their own names (``torch_port.audit_sources``).
FIELD_RULES = ("geoopt_riemannian_adam", "geoopt_riemannian_sgd")

#: ``torch_port.optim``'s class of each preset of ``reference.optim.PRESET_CHAINS``: the name a
#: trace records for it.
PRESETS = {
    "RiemannianAdam": "riemannian_adam",
    "RiemannianMomentum": "riemannian_momentum",
    "RSGD": "rsgd",
    "NormalizedRSGD": "normalized_rsgd",
}

#: ``rattn audit --rule NAME``: the name a trace records for each rule of
#: ``proofs_checks.reference_rules`` (the optimizers whose state the replay reads).
RECORDED_AS = {
    **{rule: optimizer for optimizer, rule in PRESETS.items()},
    **{name: name for name in FIELD_RULES},
}


def preset_chain(optimizer: str, h: dict[str, Any]) -> ro.Transform:
    """The chain of the preset that the class ``optimizer`` runs, with a group's
    hyperparameters ``h`` (torch's names, the chain's arguments). The frames' β of
    ``RiemannianMomentum`` is its ``beta``, or ``betas[0]`` when ``beta`` is None (how
    ``torch_port.optim.presets.frame_momentum`` reads a group, so that a scheduler cycling
    ``betas`` reaches it)."""
    make = ro.PRESET_CHAINS[PRESETS[optimizer]]
    if optimizer == "RiemannianMomentum" and h.get("beta") is None:
        h = {**h, "beta": h["betas"][0]}
    return make(**{k: h[k] for k in inspect.signature(make).parameters})


@dataclass(frozen=True)
class Claim:
    """``--rule NAME --set KEY=VALUE``: the rule the run is said to follow. Its hyperparameters
    are the settings and, for the rest, the rule's defaults, never the trace's (so a trace
    whose metadata says otherwise is replayed against what was claimed); lr is the recorded
    lr of each step (a schedule's) unless set."""

    rule: str
    settings: dict[str, Any]

    def __post_init__(self) -> None:
        spec = reference_rules.rule_spec(self.rule)
        spec.check_settings(self.settings, geometry=False)  # the geometry is the trace's

    def applied(self, step: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The optimizer name and the step with the claimed hyperparameters in force."""
        spec = reference_rules.rule_spec(self.rule)
        h = {
            k: spec.default(k) for k in spec.parameters() if k not in reference_rules.GEOMETRY_KEYS
        }
        h.update(self.settings, lr=self.settings.get("lr", step["hyperparameters"]["lr"]))
        if "betas" in h:
            h["betas"] = list(h["betas"])
        return RECORDED_AS[self.rule], {**step, "hyperparameters": h}


def reference_optimizer(optimizer: str, step: dict[str, Any], geometry: Any) -> Any:
    """The reference optimizer of one recorded step: the rule's chain with the hyperparameters in
    force, the group's weight decay (coupled; none on frames, where the port applies none: RA-5)
    and its gradient ("riemannian" or "euclidean"); for another library's rule
    (``FIELD_RULES``), its statement in ``reference.field_rules`` with the group's
    hyperparameters."""
    h = step["hyperparameters"]
    if optimizer in FIELD_RULES:
        spec = reference_rules.rule_spec(optimizer)
        own = {k: h[k] for k in spec.parameters() if k in h}
        try:  # its own geometry (geoopt's Stiefel, named by "stiefel"): none to bind
            return spec.bind_to(own, None).rule
        except ValueError as err:
            message = f"step {step['step']}: hyperparameters {h} do not make a rule: {err}"
            raise TraceError(message) from None
    if optimizer not in PRESETS:
        raise TraceError(
            f"no reference rule for optimizer {optimizer!r}; rattn audit replays "
            f"{', '.join([*PRESETS, *FIELD_RULES])}, and any optimizer against the rule "
            "it claims (--rule NAME)"
        )
    frames = hasattr(geometry, "project_point")  # points made of frames only (RA-5)
    decay = 0.0 if frames else float(h.get("weight_decay", 0.0))
    try:
        # the optimizer's own lr only scales decoupled decay, which is not used here: at lr 0
        # the chain's step is 0 and its state moves on (a schedule's first or last step)
        own_lr = 1.0 if h["lr"] == 0 else h["lr"]
        chain = preset_chain(optimizer, h)
        return ro.Optimizer(chain, own_lr, decay, "coupled", step["gradient"])
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        message = f"step {step['step']}: hyperparameters {h} do not make a rule: {err}"
        raise TraceError(message) from None
