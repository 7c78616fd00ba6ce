"""The reference rules a user can name: ``rattn conform --rule NAME --set KEY=VALUE``.

A rule is a float64 step map on St(d, r) with an optimizer state, one per frame:

    init(x) -> state;  step(x, G, state) -> (y, state at y);  transport(x, y, state)

The four presets of DESIGN §5 (``reference.optim``: ``riemannian_adam``,
``riemannian_momentum``, ``rsgd``, ``normalized_rsgd``) and the two field rules of
``reference.field_rules`` (``geoopt_riemannian_adam``, ``geoopt_riemannian_sgd``: geoopt's
optimizers as its source computes them). ``--set`` gives the rule's hyperparameters by their
names in those functions; for the presets the keys "retraction" and "metric" choose the Stiefel
geometry (``reference.Stiefel``) instead. ``implied_claims`` says what a rule promises, which is
what ``rattn conform`` checks unless ``--claims`` says otherwise.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import reference as ref
from reference import optim as ro

Array = np.ndarray

#: Settings that choose the geometry of a preset rather than its hyperparameters.
GEOMETRY_KEYS = ("retraction", "metric")


@dataclass(frozen=True)
class BoundRule:
    """A rule with its hyperparameters and its reference geometry (Stiefel frames of one
    shape, or one of the ten at one size)."""

    name: str
    settings: dict[str, Any]
    geometry: Any  # reference.Stiefel or one of reference.GEOMETRIES
    rule: Any  # reference.optim.Optimizer or a reference.field_rules rule

    def init(self, x: Array) -> Any:
        return self.rule.init(self.geometry, x)

    def step(self, x: Array, egrad: Array, state: Any) -> tuple[Array, Any]:
        return self.rule.step(self.geometry, x, egrad, state)

    def transport(self, x: Array, y: Array, state: Any) -> Any:
        """The state kept at x moved to y (tangent parts by the geometry's transport)."""
        if isinstance(self.rule, ro.Optimizer):
            view = self.rule.view(self.geometry)
            return self.rule.transform.transport(view, x, y, state)
        return self.rule.transport(self.geometry, x, y, state)


@dataclass(frozen=True)
class RuleSpec:
    name: str
    description: str
    constructor: Callable[[], Callable[..., Any]]  # imported when asked: hyperparameters -> rule
    field: bool  # a field rule (its own geometry), not a preset of reference.optim

    def parameters(self) -> tuple[str, ...]:
        """The settings ``--set`` may give: the rule's hyperparameters, and for a preset the
        geometry keys."""
        own = tuple(inspect.signature(self.constructor()).parameters)
        return own if self.field else own + GEOMETRY_KEYS

    def default(self, key: str) -> Any:
        parameter = inspect.signature(self.constructor()).parameters.get(key)
        return None if parameter is None else parameter.default

    def check_settings(self, settings: dict[str, Any], geometry: bool = True) -> None:
        """ValueError naming the settings the rule does not take (without ``geometry``, the
        geometry keys are not taken either: e.g. a recorded run's geometry is its own)."""
        allowed = [k for k in self.parameters() if geometry or k not in GEOMETRY_KEYS]
        unknown = sorted(set(settings) - set(allowed))
        if unknown:
            raise ValueError(
                f"--rule {self.name} has no setting {', '.join(unknown)} here; it takes "
                f"{', '.join(allowed)}"
            )

    def bind(self, settings: dict[str, Any], d: int, r: int) -> BoundRule:
        """The rule with these settings for St(d, r) frames (the geometry keys choose the
        Stiefel geometry); ValueError naming a bad key or value."""
        self.check_settings(settings)
        options = {} if self.field else {k: settings[k] for k in GEOMETRY_KEYS if k in settings}
        try:
            geometry = ref.Stiefel(d, r, **options)
        except TypeError as err:
            raise ValueError(f"--rule {self.name} with {settings}: {err}") from None
        return self.bind_to(settings, geometry)

    def bind_to(self, settings: dict[str, Any], geometry: Any) -> BoundRule:
        """The rule with these settings on a given reference geometry (the geometry keys, if
        any, are the geometry's, not the rule's)."""
        self.check_settings(settings)
        own = {k: v for k, v in settings.items() if self.field or k not in GEOMETRY_KEYS}
        try:
            if "betas" in own:
                own["betas"] = tuple(own["betas"])
            return BoundRule(self.name, dict(settings), geometry, self.constructor()(**own))
        except TypeError as err:
            raise ValueError(f"--rule {self.name} with {settings}: {err}") from None


def _preset(name: str) -> Callable[[], Callable[..., Any]]:
    """The constructor of a preset of ``reference.optim`` (``PRESET_CHAINS`` names them)."""
    return lambda: getattr(ro, name)


def _field(name: str) -> Callable[[], Callable[..., Any]]:
    def constructor() -> Callable[..., Any]:
        from reference import field_rules

        return getattr(field_rules, name)

    return constructor


RULES: dict[str, RuleSpec] = {
    s.name: s
    for s in (
        *(
            RuleSpec(name, f"reference.optim.{name}", _preset(name), False)
            for name in ro.PRESET_CHAINS
        ),
        RuleSpec(
            "geoopt_riemannian_adam",
            "geoopt 0.5.1 RiemannianAdam on its Stiefel (reference.field_rules)",
            _field("GeooptRiemannianAdam"),
            True,
        ),
        RuleSpec(
            "geoopt_riemannian_sgd",
            "geoopt 0.5.1 RiemannianSGD on its Stiefel (reference.field_rules)",
            _field("GeooptRiemannianSGD"),
            True,
        ),
    )
}


def rule_spec(name: str) -> RuleSpec:
    if name not in RULES:
        raise ValueError(f"unknown rule {name!r}; choose one of {', '.join(RULES)}")
    return RULES[name]


def bind(name: str, settings: dict[str, Any], d: int, r: int) -> BoundRule:
    return rule_spec(name).bind(settings, d, r)


def _value(settings: dict[str, Any], key: str, name: str) -> Any:
    """A setting, or the rule's default for it."""
    return settings[key] if key in settings else rule_spec(name).default(key)


def implied_claims(name: str, settings: dict[str, Any], geometry: Any) -> dict[str, Any]:
    """What a rule promises on a reference geometry (Stiefel frames or one of the ten): every
    rule stays on the manifold, steps tangent first-order descent directions, keeps its state
    as torch's optimizers do and agrees with itself (``rule``); a preset also claims
    O(d)-equivariance (not with ``moment="elementwise"``, which breaks it: RA-4), its
    retraction's order (``geometry.retraction_order``, against the metric's geodesics; none on
    a quotient, whose order is not read from W), a degree in the gradient where it has one
    (Adam and the normalized rule 0 when ε = 0, rsgd 1 without a trust radius; none where a
    coupled decay acts, on R1 and R2) and no effect
    of weight decay on frames (RA-5; "fused" where asked), and coupled decay (λ·x added to the
    factor gradients) on the factors of R1 and R2."""
    claims: dict[str, Any] = {"manifold": True, "tangent": True, "state": True, "rule": True}
    claims["direction"] = True
    if _value(settings, "moment", name) != "elementwise":
        claims["equivariant"] = True
    if rule_spec(name).field:
        claims["decay"] = "none"
        claims["metric"] = _value(settings, "stiefel", name)  # geoopt's two Stiefel manifolds
        if claims["metric"] == "euclidean":
            claims["metric"] = "embedded"
        if name == "geoopt_riemannian_adam" and _value(settings, "eps", name) == 0:
            claims["degree"] = 0
        if name == "geoopt_riemannian_sgd":
            claims["degree"] = 1
        return claims
    stiefel = isinstance(geometry, ref.Stiefel)
    if not geometry.name.endswith("_quotient"):
        claims["order"] = geometry.retraction_order
    if stiefel:
        claims["metric"] = geometry.metric
    fused = _value(settings, "decay", name) == "fused" and _value(
        settings, "weight_decay", name
    ) not in (None, 0, 0.0)
    frames = hasattr(geometry, "project_point")  # coupled decay does nothing on frames (RA-5)
    claims["decay"] = "fused" if fused else ("none" if frames else "coupled")
    if not frames and _value(settings, "weight_decay", name) not in (None, 0, 0.0):
        return claims  # coupled decay adds λ·x, which does not scale with G: no degree
    if name == "riemannian_adam" and _value(settings, "eps", name) == 0:
        claims["degree"] = 0
    if name == "normalized_rsgd":
        claims["degree"] = 0
    if name == "rsgd" and _value(settings, "trust_radius", name) is None:
        claims["degree"] = 1
    return claims
