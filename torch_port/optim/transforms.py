"""Update rules as chains of small transformations, the torch mirror of ``reference/optim.py``.

A transformation acts on the step of one batched point, held as ``Step(u, c)``: the tangent step
is ξ = c·u frame by frame, so that scaling a step (a learning rate, a trust-region cap, a
normalisation) multiplies per-frame scalars and never a d×r tensor:

    init(geometry, x) -> dict            the transformation's state entries at x
    update(geometry, x, step, state, t) -> (step, dict)     t: the step number, from 1

``transported`` names the entries that are tangent vectors (moved to the new point after every
step) and ``parts`` the entries that are tuples over the point's parts. ``chain`` composes
transformations; ``torch_port.optim.ChainOptimizer`` runs a chain per parameter group and
retracts. The presets are chains of these, as in the reference:

    RiemannianAdam       chain(scale_by_adam(β1, β2, ε, moment, reduction), scale(−lr)
                               [, trust_region(Δ)])
    RiemannianMomentum   chain(trace(β), normalize_by_max(c), scale(−lr))
    RSGD                 chain(scale(−lr)[, trust_region(Δ)])
    NormalizedRSGD       chain(normalize_by_rms(), scale(−lr))

Per-frame scalars (√v, the trust-region norm, normalisations) use the geometry's metric norm
(``frame_norms``) exactly as ``reference.optim`` does; they are tensors of shape
(..., *frame_shape), with no Python loop over heads or layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from torch_port import deferred, linalg
from torch_port.geometry import PointGeometry
from torch_port.linalg import Tensor

MOMENTS = ("frame", "elementwise")
REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class Step:
    """The step ξ = c·(num/den)·u of one point, frame by frame.

    u: the tangent parts; c: a number or a per-frame tensor (..., *frame_shape); ``ratio``: a
    per-frame factor num/den not yet formed (num a number, den a tensor), formed by ``resolve``
    together with c so that it never overflows. ``fresh``: u's tensors were made for this step
    (a new Riemannian gradient), so a rule may write into them. ``eager``: u is a direction
    materialised anyway (the elementwise moment's ratios), so ``scale`` multiplies u itself, as
    the reference does, rather than c."""

    u: tuple[Tensor, ...]
    c: float | Tensor = 1.0
    ratio: tuple[float | Tensor, Tensor] | None = None
    fresh: bool = False
    eager: bool = False

    def tangent(self, geometry: PointGeometry, x: Sequence[Tensor]) -> Step:
        """The step as a bare tangent vector c·u (c = 1): itself when it is one already."""
        if self.ratio is None and isinstance(self.c, float) and self.c == 1.0:
            return self
        u, c = self.resolve(geometry, x)
        return Step(tuple(u) if c is None else tuple(geometry.scale_frames(u, c)), fresh=True)

    def scaled(self, factor: float) -> Step:
        """The step times a number."""
        if self.eager and self.ratio is None and isinstance(self.c, float) and self.c == 1.0:
            return replace(self, u=tuple(factor * p for p in self.u))
        return replace(self, c=factor * self.c)

    def formed(self, geometry: PointGeometry) -> Step:
        """The same step with ``ratio`` folded into c (``_ratio_step``: finite in u's dtype)."""
        if self.ratio is None:
            return self
        num, den = self.ratio
        u, k = _ratio_step(geometry, self.u, num, den, self.c)
        return Step(u, self.c * k, None, False, self.eager)

    def resolve(self, geometry: PointGeometry, x: Sequence[Tensor]) -> tuple[tuple, Tensor | None]:
        """(u, c) with ξ = c·u per frame, c a tensor of the frames' shape or None for ξ = u."""
        step = self.formed(geometry)
        if isinstance(step.c, Tensor):
            return step.u, step.c
        if step.eager and step.c == 1.0:
            return step.u, None
        u0 = step.u[0]
        return step.u, torch.full(geometry.frame_batch(x), step.c, dtype=u0.dtype, device=u0.device)


class Transform(NamedTuple):
    init: Callable[[PointGeometry, Sequence[Tensor]], dict[str, Any]]
    update: Callable[..., tuple[Step, dict[str, Any]]]
    transported: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()


def _stateless(update: Callable[[PointGeometry, Sequence[Tensor], Step], Step]) -> Transform:
    return Transform(
        init=lambda geometry, x: {},
        update=lambda geometry, x, step, state, t: (update(geometry, x, step), {}),
    )


# -- per-frame helpers -------------------------------------------------------------------------
def sqrt_v_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a frame moment's √v: at least float32 (in bfloat16 √β2·√v rounds back to
    √v, 0.9995 being 1 to bfloat16's 8 bits, so √v would never decay)."""
    return torch.promote_types(dtype, torch.float32)


def _col(s: Tensor) -> Tensor:
    """Per-frame scalars (...,) broadcast against frames (..., d, r)."""
    return s[..., None, None]


def _rdiv(num: float | Tensor, den: Tensor) -> Tensor:
    """num/den for a Python number (or a tensor) over a tensor, as one IEEE division
    (``number / tensor`` in torch is reciprocal-then-multiply: two roundings)."""
    return (num if isinstance(num, Tensor) else torch.full_like(den, num)) / den


def bias_corrections(b1: float, b2: float, t: int | Tensor) -> tuple[Any, Any]:
    """Adam's 1 − β1^t and sqrt(1 − β2^t): Python numbers for a step count t, float64 tensors
    for a tensor of counts (the capturable step's, one per frame)."""
    if isinstance(t, Tensor):
        t64 = t.to(torch.float64)
        return 1.0 - torch.pow(b1, t64), torch.sqrt(1.0 - torch.pow(b2, t64))
    return 1.0 - b1**t, math.sqrt(1.0 - b2**t)


def _safe_ratio(num: float | Tensor, den: Tensor) -> Tensor:
    """num/den with 0/0 := 0 (a zero gradient gives a zero step)."""
    return torch.where(den == 0, torch.zeros_like(den), _rdiv(num, den))


def frame_rms(geometry: PointGeometry, x: Sequence[Tensor], g: Sequence[Tensor]) -> Tensor:
    """RMS(g) = ‖g‖/sqrt(entries) per frame in the geometry's metric (reference
    ``optim_transforms._frame_rms``). The norm comes from ``geometry.frame_norms`` (unscaled
    where that is safe); only where it overflows is it recomputed as s·(‖g/s‖/sqrt(entries)),
    s = max|g| over the point, dividing before multiplying so that entries near the largest
    float do not overflow (the reference multiplies first and overflows there). The
    capturable step skips the step where the norm overflows (``deferred.holds``), which only
    gradients near the dtype's largest value make."""
    n = geometry.frame_norms(x, g)
    sizes = geometry.frame_sizes()
    if len(sizes) == 1:  # made on the device (a CUDA graph captures no host-to-device copy)
        root = torch.full((), math.sqrt(sizes[0]), dtype=n.dtype, device=n.device)
    else:
        root = torch.tensor([math.sqrt(k) for k in sizes], dtype=n.dtype, device=n.device)
    if deferred.holds(~torch.isinf(n).any()):
        return n / root
    s = torch.stack([linalg.max_abs(p) for p in g]).amax(dim=0)
    safe = torch.where(s == 0, torch.ones_like(s), s)
    scaled = geometry.frame_norms(x, tuple(p / _col(safe).to(p.dtype) for p in g))
    extra = scaled.ndim - s.ndim
    s = s.reshape(tuple(s.shape) + (1,) * extra).to(n.dtype)
    return torch.where(torch.isinf(n), s * (scaled / root), n / root)


def _lerp(step: Step, m: Sequence[Tensor], weight: float) -> tuple:
    """m + weight·(g − m) part by part (β·m + (1 − β)·g for weight = 1 − β), g = step.u,
    written into g when the step owns it (``Step.fresh``): no new d×r tensor."""
    return tuple(
        torch.lerp(mi, gi, weight, out=gi) if step.fresh else torch.lerp(mi, gi, weight)
        for mi, gi in zip(m, step.u, strict=True)
    )


def _ratio_step(
    geometry: PointGeometry,
    u: Sequence[Tensor],
    num: float | Tensor,
    den: Tensor,
    c: float | Tensor,
) -> tuple[tuple, Tensor]:
    """(u', k) with k·u' = (num/den)·u frame by frame (0/0 := 0) and c·k finite in u's dtype,
    so that a gradient of any representable scale gives a finite step ξ = c·k·u' (DESIGN §5).
    k = num/den where c·k is representable; where den is so small that it is not (subnormal
    gradients with ε = 0, or a float16 frame whose step factor exceeds 65504), u is first
    multiplied by the exact power of two 2^e, den = f·2^{−e} with f ∈ [½, 1), in two halves
    (each a representable factor), and k = num/(den·2^e) = num/f. Powers of two scale without
    rounding, so the step is the one the formula gives."""
    k = _safe_ratio(num, den)
    ok = torch.isfinite((c * k).to(u[0].dtype))
    if deferred.fast(ok.all()):
        return tuple(u), k
    e = torch.where(ok, 0.0, -linalg.binary_exponent(den))
    one = torch.ones_like(den)
    h1, h2 = torch.ldexp(one, e // 2), torch.ldexp(one, e - e // 2)
    u = geometry.scale_frames(geometry.scale_frames(u, h1), h2)
    return tuple(u), _safe_ratio(num, den * h1 * h2)


def _trust_factor(norm: Tensor, radius: float) -> Tensor:
    """min(1, Δ/‖ξ‖) per frame with min(1, Δ/0) := 1."""
    return torch.where(norm > 0, torch.clamp(_rdiv(radius, norm), max=1.0), torch.ones_like(norm))


def _trust_capped(c: Tensor, n: Tensor, radius: float) -> Tensor:
    """The step factor of ξ = c·u capped at ‖ξ‖ ≤ Δ (n = ‖u‖ per frame): c where |c|·n ≤ Δ,
    sign(c)·Δ/n beyond, written as sign(c)·min(|c|, Δ/n) so that |c|·n, which overflows or
    leaves Δ/(|c|·n) subnormal for a learning rate near the dtype's largest value, is never
    formed; 0 where n = 0 (the step is 0 whatever c, even an infinite one)."""
    capped = torch.sign(c) * torch.minimum(c.abs(), _rdiv(radius, n))
    return torch.where(n > 0, capped, torch.zeros_like(capped))


def frame_scalars(geometry: PointGeometry, x: Sequence[Tensor]) -> Tensor:
    """Zeros of the shape of x's per-frame scalars, in ``sqrt_v_dtype``."""
    return x[0].new_zeros(geometry.frame_batch(x), dtype=sqrt_v_dtype(x[0].dtype))


# -- transformations ---------------------------------------------------------------------------
def scale_by_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    moment: str = "frame",
    reduction: str = "mean",
) -> Transform:
    """Adam direction m̂/(√v̂ + ε) with a scalar second moment per frame (reference
    ``optim.scale_by_adam``).

    m ← β1·m + (1 − β1)·g;  √v ← hypot(√β2·√v, √(1 − β2)·√s(g));
    s(g) = ‖g‖²/(entries) ("mean") or ‖g‖² ("sum");  m̂ = m/(1 − β1^t), √v̂ = √v/sqrt(1 − β2^t).

    State: "exp_avg" (m, a tangent vector, transported) and "sqrt_v" (√v: per frame, at least
    float32; per entry for ``moment="elementwise"``, which projects the direction back to the
    tangent space). The frame moment's direction is the step (m, ratio (1/(1 − β1^t),
    √v̂ + ε)): no d×r tensor is formed for it."""
    if moment not in MOMENTS:
        raise ValueError(f"unknown moment {moment!r}; choose one of {MOMENTS}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose one of {REDUCTIONS}")
    rb2, r1mb2 = math.sqrt(b2), math.sqrt(1.0 - b2)

    def init(geometry: PointGeometry, x: Sequence[Tensor]) -> dict[str, Any]:
        zero = geometry.zero_tangent(x)
        if moment == "frame":
            sqrt_v: Any = frame_scalars(geometry, x)
        else:
            sqrt_v = tuple(torch.zeros_like(t) for t in zero)
        return {"exp_avg": tuple(zero), "sqrt_v": sqrt_v}

    def update(geometry, x, step: Step, state: dict[str, Any], t: int):
        step = step.tangent(geometry, x)
        g = step.u
        c1, c2 = bias_corrections(b1, b2, t)
        sv = state["sqrt_v"]
        if moment == "frame":
            if reduction == "mean":
                root = frame_rms(geometry, x, g)
            else:
                root = geometry.frame_norms(x, g)
            sqrt_v = torch.hypot(rb2 * sv, r1mb2 * root.to(sv.dtype))
            if eps == 0.0 and not deferred.holds(~((sqrt_v == 0) & (root > 0)).any()):
                raise ValueError(
                    f"√v = √(1 − β2)·RMS(g) underflows to 0 in {sqrt_v.dtype} for a nonzero "
                    f"gradient (RMS(g) = {float(root[sqrt_v == 0].max()):.3e}), so with eps = 0 "
                    "the step is undefined; use eps > 0 or float64 parameters"
                )
            m = _lerp(step, state["exp_avg"], 1.0 - b1)  # may overwrite g
            num = _rdiv(1.0, c1) if isinstance(c1, Tensor) else 1.0 / c1
            out = Step(m, 1.0, (num, sqrt_v / c2 + eps))
        else:
            sqrt_v = tuple(
                torch.hypot(rb2 * s, r1mb2 * torch.abs(gi)) for s, gi in zip(sv, g, strict=True)
            )
            m = _lerp(step, state["exp_avg"], 1.0 - b1)
            ratios = []
            for mi, s in zip(m, sqrt_v, strict=True):
                den = s / c2 + eps
                ratios.append(torch.where(den > 0, (mi / c1) / den, torch.zeros_like(mi)))
            out = Step(tuple(geometry.proj_tangent(x, tuple(ratios))), eager=True)
        return out, {"exp_avg": m, "sqrt_v": sqrt_v}

    parts = ("exp_avg",) if moment == "frame" else ("exp_avg", "sqrt_v")
    return Transform(init, update, transported=("exp_avg",), parts=parts)


def trace(beta: float) -> Transform:
    """Damped momentum M ← β·M + (1 − β)·g (state "momentum_buffer", transported)."""

    def init(geometry: PointGeometry, x: Sequence[Tensor]) -> dict[str, Any]:
        return {"momentum_buffer": tuple(geometry.zero_tangent(x))}

    def update(geometry, x, step: Step, state: dict[str, Any], t: int):
        m = _lerp(step.tangent(geometry, x), state["momentum_buffer"], 1.0 - beta)
        return Step(m), {"momentum_buffer": m}

    return Transform(init, update, ("momentum_buffer",), ("momentum_buffer",))


def scale(factor: float) -> Transform:
    """ξ ↦ factor·ξ (a number times c)."""
    return _stateless(lambda geometry, x, step: step.scaled(factor))


def trust_region(radius: float) -> Transform:
    """Per frame, ξ ← ξ·min(1, Δ/‖ξ‖) with min(1, Δ/0) := 1, where ‖ξ‖ = |c|·‖u‖."""

    def update(geometry: PointGeometry, x: Sequence[Tensor], step: Step) -> Step:
        step = step.formed(geometry)
        n = geometry.frame_norms(x, step.u)
        c = step.c
        if not isinstance(c, Tensor):
            if step.eager and c == 1.0:
                return replace(step, c=_trust_factor(n, radius))
            u0 = step.u[0]
            c = torch.full(geometry.frame_batch(x), c, dtype=u0.dtype, device=u0.device)
        return replace(step, c=_trust_capped(c, n.to(c.dtype), radius))

    return _stateless(update)


def normalize_by_max(c: float) -> Transform:
    """Per frame, M ↦ M / max(‖M‖, c): a step of length min(1, ‖M‖/c)."""

    def update(geometry: PointGeometry, x: Sequence[Tensor], step: Step) -> Step:
        step = step.tangent(geometry, x)
        return replace(step, ratio=(1.0, torch.clamp(geometry.frame_norms(x, step.u), min=c)))

    return _stateless(update)


def normalize_by_rms() -> Transform:
    """Per frame, g ↦ g / RMS(g), with 0/0 := 0."""

    def update(geometry: PointGeometry, x: Sequence[Tensor], step: Step) -> Step:
        step = step.tangent(geometry, x)
        return replace(step, ratio=(1.0, frame_rms(geometry, x, step.u)))

    return _stateless(update)


def chain(*transforms: Transform) -> Transform:
    """Apply the transformations in order; the state is the union of their entries (which must
    have distinct names)."""

    def init(geometry: PointGeometry, x: Sequence[Tensor]) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for t in transforms:
            entries = t.init(geometry, x)
            clash = set(entries) & set(state)
            if clash:
                raise ValueError(f"two transformations of a chain keep state {sorted(clash)}")
            state.update(entries)
        return state

    def update(geometry, x, step: Step, state: dict[str, Any], t: int):
        new: dict[str, Any] = {}
        for transform in transforms:  # each reads its own entries of the state
            step, entries = transform.update(geometry, x, step, state, t)
            new.update(entries)
        return step, new

    return Transform(
        init,
        update,
        tuple(k for t in transforms for k in t.transported),
        tuple(k for t in transforms for k in t.parts),
    )
