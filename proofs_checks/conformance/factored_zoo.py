"""Wrong optimizers on the ten design points: the negative controls of ``rattn conform
--geometry NAME``.

Each member is the port's optimizer (``torch_port.optim``, clean on every geometry: the presets pass
all they claim there) with exactly one fault, made the way such faults arise in practice: a plain
``torch.optim.SGD`` that ignores the geometry, a gradient halved before the step, moments forgotten
at every step, a first-order retraction behind a claim of order two, one √v per entry or a fixed
preconditioner of the column factor behind a claim of equivariance, a weight decay read but not
applied, a ``state_dict`` that drops the moments, a change of representative on a quotient whose
moment is projected instead of moved. ``rerepresented`` (the moment moved with the representative)
is the same optimizer as the port's on the quotient: a positive control that must pass. Every
factory takes the parameter groups that ``rattn conform`` gives (``spaces``: one group per point,
``{"params": [...], "geometry": NAME, ...}``).

``FACTORED`` lists each member with the geometry it is run on, what it claims (a rule or
``--claims``) and the property that must flag it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import torch_port as tp

LR = 1e-2


def euclidean_sgd(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """torch.optim.SGD on the factors: the Euclidean gradient, no projection, no retraction."""
    return torch.optim.SGD([{"params": g["params"]} for g in groups], lr=LR)


class _HalvedRSGD(tp.RSGD):
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad = 0.5 * p.grad
        return super().step(closure)


def halved_gradient(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The port's RSGD with every gradient halved before the step."""
    return _HalvedRSGD(groups, lr=LR)


class _ForgetfulAdam(tp.RiemannianAdam):
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        self.state.clear()  # moments and count start again at every step
        return super().step(closure)


def forgetful_adam(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The port's RiemannianAdam whose moments are dropped before every step."""
    return _ForgetfulAdam(groups, lr=LR)


def qr_retraction(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The port's RSGD with the first-order QR retraction (its geometry's option)."""
    return tp.RSGD([{**g, "retraction": "qr"} for g in groups], lr=LR)


def elementwise_adam(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The port's RiemannianAdam with one √v per entry."""
    return tp.RiemannianAdam(groups, lr=LR, moment="elementwise")


class _DecayIgnored(tp.RiemannianAdam):
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        kept = [g["weight_decay"] for g in self.param_groups]
        for g in self.param_groups:
            g["weight_decay"] = 0.0
        try:
            return super().step(closure)
        finally:
            for g, wd in zip(self.param_groups, kept, strict=True):
                g["weight_decay"] = wd


def decay_ignored(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The port's RiemannianAdam that keeps weight_decay in its groups but never applies it."""
    return _DecayIgnored(groups, lr=LR)


class _LossyState(tp.RiemannianAdam):
    def state_dict(self) -> dict[str, Any]:
        saved = super().state_dict()
        return {**saved, "state": {}}


def lossy_state(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The port's RiemannianAdam whose state_dict() leaves the moments out."""
    return _LossyState(groups, lr=LR)


class _ColumnWeighted(tp.RiemannianAdam):
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        for group in self.param_groups:
            p = group["params"][-1]
            if p.grad is not None:
                p.grad = p.grad * torch.linspace(1.0, 2.0, p.shape[-2], dtype=p.dtype)[:, None]
        return super().step(closure)


def column_weighted(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The port's RiemannianAdam with the column factor's gradient rows weighted 1…2 (a fixed
    preconditioner: not O(n)-equivariant)."""
    return _ColumnWeighted(groups, lr=LR)


class _Rerepresented(tp.RiemannianAdam):
    """After each step, another representative of the same point of a quotient: (A M, B M^{-ᵀ})
    on R2, (U Q, V Q) on P2, with the moment either moved the same way (``mapped``: the same
    optimizer, correct) or projected at the new factors (a tangent vector of another point)."""

    mapped = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = super().step(closure)
        with torch.no_grad():
            for group in self.param_groups:
                a, b = group["params"]
                if a.grad is None or group["lr"] == 0:
                    continue
                name = group["geometry"]
                g = torch.tensor([[0.8, -0.6], [0.6, 0.8]], dtype=a.dtype)  # a rotation
                if "fixed_rank" in name:
                    g = torch.tensor([[1.3, 0.4], [-0.2, 0.9]], dtype=a.dtype)
                g_b = torch.linalg.inv(g).mT if "fixed_rank" in name else g
                m_a, m_b = self.state[a]["exp_avg"]
                new_a, new_b = a @ g, b @ g_b
                if self.mapped:
                    moment = (m_a @ g, m_b @ g_b)
                else:
                    geometry = tp.geometries.GEOMETRIES[name](a.shape[-2], b.shape[-2], a.shape[-1])
                    moment = tuple(geometry.proj((new_a, new_b), (m_a, m_b)))
                self.state[a]["exp_avg"] = moment
                a.copy_(new_a)
                b.copy_(new_b)
        return loss


class _RerepresentedProjected(_Rerepresented):
    mapped = False


def rerepresented(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The port's RiemannianAdam moved to another representative after each step, its moment
    moved with it: the same optimizer on the quotient (a positive control)."""
    return _Rerepresented(groups, lr=LR)


def rerepresented_projected(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The same, with the moment projected at the new factors instead of moved."""
    return _RerepresentedProjected(groups, lr=LR)


def riemannian_adam(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The clean control: the port's RiemannianAdam, lr 1e-2."""
    return tp.RiemannianAdam(groups, lr=LR)


@dataclass(frozen=True)
class Member:
    name: str
    factory: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]
    geometry: str
    flagged_by: str  # the property that names the fault
    rule: str | None = None
    claims: dict[str, Any] = field(default_factory=dict)


FACTORED: dict[str, Member] = {
    m.name: m
    for m in (
        Member(
            "euclidean_sgd",
            euclidean_sgd,
            "stiefel_pair",
            "CONF-MANIFOLD",
            claims={"manifold": True},
        ),
        Member(
            "euclidean_sgd_tangent",
            euclidean_sgd,
            "block_stiefel_pair",
            "CONF-TANGENT",
            claims={"tangent": True},
        ),
        Member(
            "euclidean_sgd_direction",
            euclidean_sgd,
            "fixed_rank_quotient",
            "CONF-DIRECTION",
            claims={"direction": True},
        ),
        Member(
            "halved_gradient", halved_gradient, "fixed_rank_embedded", "CONF-DIRECTION", rule="rsgd"
        ),
        Member(
            "forgetful_adam",
            forgetful_adam,
            "partial_isometry_quotient",
            "CONF-RULE",
            rule="riemannian_adam",
        ),
        Member(
            "qr_retraction",
            qr_retraction,
            "partial_isometry_embedded",
            "CONF-ORDER",
            claims={"order": 2},
        ),
        Member(
            "elementwise_adam",
            elementwise_adam,
            "block_fixed_rank_embedded",
            "CONF-EQUIVARIANCE",
            claims={"equivariant": True},
        ),
        Member(
            "decay_ignored",
            decay_ignored,
            "block_fixed_rank_quotient",
            "CONF-DECAY",
            claims={"decay": "coupled"},
        ),
        Member("lossy_state", lossy_state, "stiefel_pair", "CONF-STATE", claims={"state": True}),
        Member(
            "column_weighted",
            column_weighted,
            "stiefel_pair",
            "CONF-EQUIVARIANCE",
            claims={"equivariant": True},
        ),
        Member(
            "rerepresented_projected",
            rerepresented_projected,
            "partial_isometry_quotient",
            "CONF-RULE",
            rule="riemannian_adam",
        ),
        Member(
            "rerepresented_projected_r2",
            rerepresented_projected,
            "fixed_rank_quotient",
            "CONF-RULE",
            rule="riemannian_adam",
        ),
    )
}
