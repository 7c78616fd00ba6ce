"""The four presets of ``reference/optim.py`` as ``ChainOptimizer``s with torch's names.

========================  =====================================================================
``RiemannianAdam``        ``reference.optim.riemannian_adam`` (moment "frame" or "elementwise")
``RiemannianMomentum``    ``reference.optim.riemannian_momentum``
``RSGD``                  ``reference.optim.rsgd``
``NormalizedRSGD``        ``reference.optim.normalized_rsgd``
========================  =====================================================================

Each is its torch hyperparameters and the chain they make (``rule``), the same chain as the
reference preset's, so that float64 trajectories agree with the reference to rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from torch_port.linalg import Tensor
from torch_port.optim import capturable, transforms
from torch_port.optim.guard import values
from torch_port.optim.optimizer import ChainOptimizer
from torch_port.optim.transforms import Transform


def hyperparameters(arguments: dict[str, Any]) -> dict[str, Any]:
    """A preset's keyword arguments as the optimizer's defaults (its ``locals()`` less
    ``self`` and ``params``)."""
    return {k: v for k, v in arguments.items() if k not in ("self", "params", "__class__")}


class RiemannianAdam(ChainOptimizer):
    """Riemannian Adam of Stiefel attention (``reference.optim.riemannian_adam``).

    Per frame (a trailing d×r matrix of a Stiefel group; a moment group of the other
    geometries, with their metric norms and retractions): g = P_W(G); m ← β1·m + (1 − β1)g;
    √v ← hypot(√β2·√v, √(1 − β2)·RMS(g)) (one scalar per frame; RMS computed scaled);
    m̂ = m/(1 − β1^t), √v̂ = √v/sqrt(1 − β2^t); ξ = −lr·m̂/(√v̂ + ε) with 0/0 := 0;
    ξ ← ξ·min(1, Δ/‖ξ‖) when ``trust_radius`` Δ is given; W ← polar(W + ξ); m ← P_W(m).
    ``moment="elementwise"`` keeps one √v per entry and projects the direction back to the
    tangent space (the ablation arm). ``reduction="sum"`` uses ‖g‖ instead of RMS(g).
    Plain groups: AdamW with the group's lr, betas, eps and weight_decay (torch's convention).

    Args:
        params: parameters or parameter groups; a group with ``"geometry": "stiefel"`` holds
            frames (..., d, r), a group naming one of the ten design points holds the factors
            of one batched point (module docstring).
        lr, betas, eps: as ``torch.optim.AdamW``; lr may be a 0-d floating tensor, whose value
            the eager step reads; with ``capturable=True`` it stays on the parameters' device,
            where a scheduler changes it in place (no recompilation of a compiled step, no
            re-capture of a CUDA graph).
        trust_radius: Δ, the cap on ‖ξ‖ per frame (None: no cap).
        weight_decay: decoupled decay of plain parameters; on frames it warns and does nothing.
        moment: "frame" (one scalar √v per frame) or "elementwise".
        reduction: "mean" (RMS, default) or "sum" (‖g‖) for the frame moment.
        skip_nonfinite: skip a step whose gradients have NaN/inf entries (with a warning)
            instead of raising ValueError.
        maximize, foreach, amsgrad, fused, differentiable: torch's flags
            (``ChainOptimizer``): ``maximize`` ascends, the others only as torch's defaults.
        capturable: a step with no host synchronisation, for ``torch.compile(fullgraph=True)``
            and CUDA graphs (``torch_port.optim.capturable``): Stiefel frames (polar
            retraction, embedded metric, frame moment, mean reduction) with a trust radius
            Δ ≤ 0.7 and ε > 0, and plain parameters, all on one device. A step with a
            non-finite gradient changes nothing and is counted in ``skipped_on_device``
            (a device tensor) instead of raising or warning.
    """

    #: A state dict of either step loads into either (the same state); the loading optimizer
    #: keeps its own ``capturable``, as a checkpoint of a capturable GPU run may resume eagerly.
    _OWN_ENTRIES = ("capturable",)

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        trust_radius: float | None = None,
        weight_decay: float = 0.0,
        moment: str = "frame",
        reduction: str = "mean",
        skip_nonfinite: bool = False,
        capturable: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        amsgrad: bool = False,
        fused: bool | None = None,
        differentiable: bool = False,
    ):
        super().__init__(params, **hyperparameters(locals()))
        #: Steps skipped for a non-finite gradient or frame (capturable=True), on the device
        #: of the parameters: made here, so that a compiled first step counts into it too.
        self.skipped_on_device: Tensor | None = None
        if capturable and self.param_groups and self.param_groups[0]["params"]:
            device = self.param_groups[0]["params"][0].device
            self.skipped_on_device = torch.zeros((), dtype=torch.float32, device=device)

    HYPERPARAMETERS: ClassVar[dict[str, Callable[[str, Any], Any]]] = {
        "moment": values.one_of(transforms.MOMENTS),
        "reduction": values.one_of(transforms.REDUCTIONS),
    }

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update (``ChainOptimizer.step``), or with ``capturable=True`` the step of
        ``torch_port.optim.capturable``, which ``torch.compile`` traces as one graph. The
        mode is read from ``defaults`` (every group holds the same): Dynamo sets
        ``capturable=True`` in the param_groups it traces, for torch's own optimizers."""
        if not self.defaults["capturable"]:
            return self._chain_step(closure)
        return capturable.step(self, closure)

    def rule(self, group: dict[str, Any]) -> Transform:
        b1, b2 = (float(b) for b in group["betas"])  # validated by the guard
        steps = [
            transforms.scale_by_adam(b1, b2, group["eps"], group["moment"], group["reduction"]),
            transforms.scale(-group["lr"]),
        ]
        if group["trust_radius"] is not None:
            steps.append(transforms.trust_region(group["trust_radius"]))
        return transforms.chain(*steps)


def frame_momentum(group: dict[str, Any]) -> float:
    """β of ``RiemannianMomentum``'s frames in ``group``: its ``beta``, or ``betas[0]`` when
    ``beta`` is None."""
    return group["betas"][0] if group["beta"] is None else group["beta"]


class RiemannianMomentum(ChainOptimizer):
    """The low-rank template (``reference.optim.riemannian_momentum``): on a frame,
    M ← β·M + (1 − β)·P_W(G); ξ = −lr·M/max(‖M‖, c) per frame; W ← polar(W + ξ); M ← P_W(M).
    Plain groups: AdamW with the group's lr, betas, eps and weight_decay.

    β is the group's ``beta``, or ``betas[0]`` when ``beta`` is None (the default): the entry
    that schedulers cycling momentum write (``OneCycleLR``, ``CyclicLR`` set ``betas[0]`` of every
    group of an optimizer whose defaults have ``betas``), so they reach the frames' momentum as
    they reach AdamW's. An explicit ``beta`` fixes the frames' β whatever ``betas`` becomes."""

    def __init__(
        self,
        params: Iterable,
        lr: float,
        beta: float | None = None,
        c: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        skip_nonfinite: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        amsgrad: bool = False,
        fused: bool | None = None,
        differentiable: bool = False,
    ):
        super().__init__(params, **hyperparameters(locals()))

    HYPERPARAMETERS: ClassVar[dict[str, Callable[[str, Any], Any]]] = {
        "beta": values.optional(values.beta),
        "c": values.positive,
    }

    def rule(self, group: dict[str, Any]) -> Transform:
        return transforms.chain(
            transforms.trace(frame_momentum(group)),
            transforms.normalize_by_max(group["c"]),
            transforms.scale(-group["lr"]),
        )


class RSGD(ChainOptimizer):
    """Fixed-step Riemannian gradient descent (``reference.optim.rsgd``): ξ = −lr·P_W(G), capped
    per frame at ‖ξ‖ ≤ Δ when ``trust_radius`` is given. Plain groups: AdamW."""

    def __init__(
        self,
        params: Iterable,
        lr: float,
        trust_radius: float | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        skip_nonfinite: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        amsgrad: bool = False,
        fused: bool | None = None,
        differentiable: bool = False,
    ):
        super().__init__(params, **hyperparameters(locals()))

    def rule(self, group: dict[str, Any]) -> Transform:
        steps = [transforms.scale(-group["lr"])]
        if group["trust_radius"] is not None:
            steps.append(transforms.trust_region(group["trust_radius"]))
        return transforms.chain(*steps)


class NormalizedRSGD(ChainOptimizer):
    """ξ = −lr·P_W(G)/RMS(P_W(G)) per frame, 0/0 := 0 (``reference.optim.normalized_rsgd``).
    Plain groups: AdamW."""

    def __init__(
        self,
        params: Iterable,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        skip_nonfinite: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        amsgrad: bool = False,
        fused: bool | None = None,
        differentiable: bool = False,
    ):
        super().__init__(params, **hyperparameters(locals()))

    def rule(self, group: dict[str, Any]) -> Transform:
        return transforms.chain(transforms.normalize_by_rms(), transforms.scale(-group["lr"]))
