"""Factories for ``rattn conform``: the library's four presets and geoopt's two optimizers, each
``factory(params) -> torch.optim.Optimizer`` (docs/conformance.md). The presets' factories take
Stiefel parameters and the ten's parameter groups alike.

The presets use their defaults except lr (1e-2, the lr of ``rattn compare``) and, for the
normalized rule, 2e-3. geoopt chooses a parameter's manifold from its class
(``ManifoldParameter``) or, for a plain ``Parameter``, from the optimizer's default manifold,
which these factories set to geoopt's Stiefel (canonical, geoopt's default, or Euclidean).
"""

from __future__ import annotations

from typing import Any

import torch

import torch_port as tp

LR = 1e-2
LR_NORMALIZED = 2e-3


def _frames(params: list) -> list[dict[str, Any]]:
    """Stiefel parameters as one group; the groups of the ten (``--geometry NAME``) as given."""
    if params and isinstance(params[0], dict):
        return list(params)
    return [{"params": params, "geometry": "stiefel"}]


def riemannian_adam(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch_port.RiemannianAdam (one √v per frame, polar retraction), lr 1e-2."""
    return tp.RiemannianAdam(_frames(params), lr=LR)


def riemannian_adam_eps0(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch_port.RiemannianAdam with eps 0 (degree 0 in the gradient exactly), lr 1e-2."""
    return tp.RiemannianAdam(_frames(params), lr=LR, eps=0.0)


def riemannian_momentum(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch_port.RiemannianMomentum (beta 0.9, c 1), lr 1e-2."""
    return tp.RiemannianMomentum(_frames(params), lr=LR)


def rsgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch_port.RSGD, lr 1e-2."""
    return tp.RSGD(_frames(params), lr=LR)


def normalized_rsgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch_port.NormalizedRSGD, lr 2e-3."""
    return tp.NormalizedRSGD(_frames(params), lr=LR_NORMALIZED)


def _geoopt(optimizer: str, canonical: bool, params: list, **options: Any) -> Any:
    import geoopt

    opt = getattr(geoopt.optim, optimizer)(params, **options)
    opt._default_manifold = geoopt.Stiefel(canonical=canonical)  # geoopt's documented fallback
    return opt


def geoopt_adam(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """geoopt.optim.RiemannianAdam on geoopt.Stiefel() (canonical metric, Cayley), lr 1e-2."""
    return _geoopt("RiemannianAdam", True, params, lr=LR)


def geoopt_adam_euclidean(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """geoopt.optim.RiemannianAdam on geoopt.Stiefel(canonical=False) (QR), lr 1e-2."""
    return _geoopt("RiemannianAdam", False, params, lr=LR)


def geoopt_sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """geoopt.optim.RiemannianSGD with momentum 0.9 on geoopt.Stiefel(), lr 1e-2."""
    return _geoopt("RiemannianSGD", True, params, lr=LR, momentum=0.9)


def geoopt_sgd_euclidean(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """geoopt.optim.RiemannianSGD with momentum 0.9 on geoopt.Stiefel(canonical=False), lr 1e-2."""
    return _geoopt("RiemannianSGD", False, params, lr=LR, momentum=0.9)
