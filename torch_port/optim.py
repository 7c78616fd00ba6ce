"""Riemannian optimizers as ``torch.optim.Optimizer`` subclasses (DESIGN §5, §7).

Each class mirrors a preset of ``reference/optim.py`` with the same formulas, so that float64
trajectories agree with the reference to rounding:

========================  =====================================================================
``RiemannianAdam``        ``reference.optim.riemannian_adam`` (moment "frame" or "elementwise")
``RiemannianMomentum``    ``reference.optim.riemannian_momentum``
``RSGD``                  ``reference.optim.rsgd``
``NormalizedRSGD``        ``reference.optim.normalized_rsgd``
========================  =====================================================================

A parameter group names its geometry (``GEOMETRIES``, the ten design points and "stiefel"):

- ``{"params": [W, ...], "geometry": "stiefel"}``: every parameter is a batch of frames of shape
  (..., d, r), one frame per trailing d×r matrix; options "retraction" ("polar", default;
  "polar_svd", "qr", "exp") and "metric" ("embedded", default; "canonical").
- ``{"params": [U, S, V], "geometry": "fixed_rank_embedded"}`` and the other nine: the group's
  parameters, in order, are the factors of ONE batched point, e.g. R1 (U (..., m, r),
  S (..., r, r), V (..., n, r)), R2 (A, B), P1/P2/P3 (U, V); sizes are inferred from the shapes
  (optional keys "m", "n", "r" are checked against them). Options: "retraction" (R1, P1:
  "projection"/"qr"; P2, P3: as Stiefel), "metric" (R2: "preconditioned"/"balanced"). A block
  variant takes the per-head layout: row factors (..., p, m, r), column factors (..., q, n, r),
  r×r cores (..., G, r, r), e.g. ``{"params": [U, S, V], "geometry":
  "block_fixed_rank_embedded", "n_heads": 12, "n_kv_heads": 4}`` (defaults: n_heads = p,
  n_kv_heads = q), with optional "pattern" and "groups" ("components"/"all").

Groups without a geometry hold plain parameters and are updated, in the same optimizer, by AdamW
with decoupled decay in torch's convention and torch's arithmetic (``torch.optim.AdamW``,
single-tensor path), with that group's lr, betas, eps and weight_decay.

Every step is vectorised over the batch of points (layers × heads): per-frame scalars are
tensors of shape (..., *frame_shape), and there is no Python loop over heads or layers.
Per-frame scalars (√v, the trust-region norm, normalisations) use the geometry's metric norm
exactly as ``reference.optim`` does (``_frame_norms``, ``_frame_rms``); stored tangent state is
transported at every step; the elementwise moment is projected back with ``proj_tangent``.

State. A Stiefel parameter keeps "step", "exp_avg" (the first moment, a tangent vector at the
current frame) and "sqrt_v" (√v, one scalar per frame: shape (...,) for a batch (..., d, r);
full size only for the ``moment="elementwise"`` ablation); ``RiemannianMomentum`` keeps "step"
and "momentum_buffer"; ``RSGD`` and ``NormalizedRSGD`` keep "step". The state of a point of the
other geometries lives with the group's FIRST parameter under the same keys, with tangent
vectors as tuples of tensors in the geometry's tangent layout (R1: (M, U_p, V_p); P1:
(Ω, U_p, V_p); block variants: the stacked group layout of ``blocks.BlockGeometry``) and "sqrt_v"
of shape (..., *frame_shape) (e.g. (..., 2) for a Stiefel pair, (..., G) for a block R1). Plain
parameters keep torch's "step", "exp_avg" and "exp_avg_sq".

Weight decay. On frames (Stiefel, P1, P2, P3 and their block variants) it does nothing: the
Riemannian gradient of (λ/2)‖W‖² on St(d, r) is P_W(λW) = 0 (RA-5); asking for it raises a
``FrameDecayWarning`` and the decay is not applied. On R1 and R2 (and their block variants) it
is the reference's ``decay="coupled"``: λ times the stored factors is added to the factor
gradient before the Riemannian gradient is taken.

Bad input. Before any parameter or state changes, every gradient of the step is checked: a
non-finite gradient raises ValueError naming the parameter and the count of bad entries, or, for
groups built with ``skip_nonfinite=True``, skips the whole step with a
``NonFiniteGradientWarning``. A point is checked to lie on its manifold when its state is
created (the first step), with the measured residual in the error. All updates of points are
computed before any is written, so an error raised while computing one (e.g. a step that
overflows or leaves the rank-r manifold) leaves every parameter and every state as it was.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from torch_port import linalg, validation
from torch_port.blocks import BlockGeometry
from torch_port.geometries import GEOMETRIES, PLAIN
from torch_port.linalg import Tensor, sym, transpose
from torch_port.stiefel import METRICS, RETRACTIONS, Stiefel

MOMENTS = ("frame", "elementwise")
REDUCTIONS = ("mean", "sum")
#: Geometries whose points are frames (orthonormal factors): weight decay does nothing there.
FRAME_GEOMETRIES = frozenset(
    {"stiefel"}
    | {
        prefix + name
        for prefix in ("", "block_")
        for name in ("partial_isometry_embedded", "partial_isometry_quotient", "stiefel_pair")
    }
)


class FrameDecayWarning(UserWarning):
    """Weight decay was requested on a group of frames; it does nothing there (RA-5)."""


class NonFiniteGradientWarning(UserWarning):
    """A step was skipped because a gradient had NaN or inf entries (``skip_nonfinite=True``)."""


_REPROJECT_HINT = (
    "if the parameters were cast or loaded (e.g. model.to(torch.float64) after building in "
    "float32), put them back on their manifold first with torch_port.nn.reproject(model) or "
    "torch_port.optim.reproject(param_groups)"
)

_DECAY_MESSAGE = (
    "weight decay on frames does nothing: the Riemannian gradient of (λ/2)‖W‖² is P_W(λW) = 0 "
    "on St(d, r) (RA-5); weight_decay={wd} is ignored for this group of frames"
)


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the first frame outside torch_port and
    torch (the user's line), whatever path led here."""
    frame, level = sys._getframe(1), 1
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        if "/torch_port/" not in filename and "/torch/" not in filename:
            return level
        frame, level = frame.f_back, level + 1
    return 1


# -- validation of hyperparameters -------------------------------------------------------------
def _is_real(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _positive(name: str, v: Any) -> float:
    if not (_is_real(v) and math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    return float(v)


def _nonnegative(name: str, v: Any) -> float:
    if not (_is_real(v) and math.isfinite(v) and v >= 0.0):
        raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
    return float(v)


def _beta(name: str, v: Any) -> float:
    if not (_is_real(v) and 0.0 <= v < 1.0):
        raise ValueError(f"{name} must lie in [0, 1), got {v!r}")
    return float(v)


def _betas(v: Any) -> tuple[float, float]:
    if not (isinstance(v, tuple | list) and len(v) == 2):
        raise ValueError(f"betas must be a pair of numbers (beta1, beta2), got {v!r}")
    return _beta("beta1", v[0]), _beta("beta2", v[1])


# -- per-frame helpers -------------------------------------------------------------------------
def _col(s: Tensor) -> Tensor:
    """Per-frame scalars (...,) broadcast against frames (..., d, r)."""
    return s[..., None, None]


def _rdiv(num: float, den: Tensor) -> Tensor:
    """num/den for a Python number over a tensor, as one IEEE division (``num / tensor`` in torch
    is reciprocal-then-multiply: two roundings)."""
    return torch.full_like(den, num) / den


def _safe_ratio(num: float, den: Tensor) -> Tensor:
    """num/den with 0/0 := 0 (a zero gradient gives a zero step)."""
    return torch.where(den == 0, torch.zeros_like(den), _rdiv(num, den))


def _frame_rms(geometry, x: Sequence[Tensor], g: Sequence[Tensor]) -> Tensor:
    """RMS(g) = ‖g‖/sqrt(entries) per frame in the geometry's metric (reference
    ``optim._frame_rms``). The norm comes from ``geometry.frame_norms`` (unscaled where that is
    safe); only where it overflows is it recomputed as s·(‖g/s‖/sqrt(entries)), s = max|g| over
    the point, dividing before multiplying so that entries near the largest float do not overflow
    (the reference multiplies first and overflows there)."""
    n = geometry.frame_norms(x, g)
    root = torch.tensor(
        [math.sqrt(k) for k in geometry.frame_sizes()], dtype=n.dtype, device=n.device
    )
    if len(geometry.frame_sizes()) == 1:
        root = root[0]
    if not bool(torch.isinf(n).any()):
        return n / root
    s = torch.stack([linalg.max_abs(p) for p in g]).amax(dim=0)
    safe = torch.where(s == 0, torch.ones_like(s), s)
    scaled = geometry.frame_norms(x, tuple(p / _col(safe).to(p.dtype) for p in g))
    extra = scaled.ndim - s.ndim
    s = s.reshape(tuple(s.shape) + (1,) * extra).to(n.dtype)
    return torch.where(torch.isinf(n), s * (scaled / root), n / root)


def _lerp(geometry, m: Sequence[Tensor], g: Sequence[Tensor], weight: float) -> tuple:
    """m + weight·(g − m) part by part (β·m + (1 − β)·g for weight = 1 − β), written into g when
    the geometry made g for this step (``rgrad_is_fresh``): no new d×r tensor."""
    fresh = getattr(geometry, "rgrad_is_fresh", False)
    return tuple(
        torch.lerp(mi, gi, weight, out=gi) if fresh else torch.lerp(mi, gi, weight)
        for mi, gi in zip(m, g, strict=True)
    )


def _ratio_step(
    geometry, u: Sequence[Tensor], num: float, den: Tensor, lr: float
) -> tuple[tuple, Tensor]:
    """(u', k) with k·u' = (num/den)·u frame by frame (0/0 := 0) and lr·k finite in u's dtype,
    so that a gradient of any representable scale gives a finite step ξ = −lr·k·u' (DESIGN
    §5). k = num/den where lr·k is representable; where den is so small that it is not
    (subnormal gradients with ε = 0, or a float16 frame whose step factor exceeds 65504), u is
    first multiplied by the exact power of two 2^e, den = f·2^{−e} with f ∈ [½, 1), in two
    halves (each a representable factor), and k = num/(den·2^e) = num/f. Powers of two scale
    without rounding, so the step is the one the formula gives."""
    k = _safe_ratio(num, den)
    ok = torch.isfinite((lr * k).to(u[0].dtype))
    if bool(ok.all()):
        return tuple(u), k
    e = torch.where(ok, 0, -torch.frexp(den).exponent)
    one = torch.ones_like(den)
    h1, h2 = torch.ldexp(one, e // 2), torch.ldexp(one, e - e // 2)
    u = geometry.scale_frames(geometry.scale_frames(u, h1), h2)
    return tuple(u), _safe_ratio(num, den * h1 * h2)


def _trust_factor(norm: Tensor, radius: float) -> Tensor:
    """min(1, Δ/‖ξ‖) per frame with min(1, Δ/0) := 1."""
    return torch.where(norm > 0, torch.clamp(_rdiv(radius, norm), max=1.0), torch.ones_like(norm))


class _StiefelFrames:
    """A ``Stiefel`` geometry seen as points that are 1-tuples (W,), with the optimizer's hot
    path fused: P_W(G) = G − W sym(WᵀG) as one ``baddbmm`` (embedded metric), the step
    W + c·m as one ``addcmul`` before the polar factor, and the transport of the first moment
    P_Y(m) = m − Y sym(Yᵀm) in place, into the moment the step has just made."""

    moment_groups = ((0,),)
    frame_shape: tuple[int, ...] = ()
    #: ``egrad_to_rgrad`` returns a new tensor, which the rules may overwrite.
    rgrad_is_fresh = True

    def __init__(self, st: Stiefel):
        self.st = st
        self.name = st.name
        self.embedded = st.metric == "embedded"
        self._upcast: dict[tuple, Tensor] = {}

    def _upcast_buffer(self, a: Tensor) -> Tensor | None:
        """A float64 work buffer of A's shape for the Gram of a low-precision A, kept between
        steps (one per parameter shape and device)."""
        if a.dtype == torch.float64:
            return None
        key = (tuple(a.shape), a.device)
        if key not in self._upcast:
            self._upcast[key] = torch.empty(a.shape, dtype=torch.float64, device=a.device)
        return self._upcast[key]

    def frame_batch(self, x: Sequence[Tensor]) -> tuple[int, ...]:
        return tuple(x[0].shape[:-2])

    def check_point(self, x: Sequence[Tensor]) -> None:
        self.st.check_point(x[0])

    def zero_tangent(self, x: Sequence[Tensor]) -> tuple[Tensor]:
        return (torch.zeros_like(x[0], memory_format=torch.contiguous_format),)

    @staticmethod
    def _flat(t: Tensor) -> Tensor:
        return t.reshape(-1, *t.shape[-2:])

    def egrad_to_rgrad(self, x: Sequence[Tensor], g: Sequence[Tensor]) -> tuple[Tensor]:
        w, grad = x[0], g[0]
        if not self.embedded:
            return (self.st.egrad_to_rgrad(w, grad),)
        w3, g3 = self._flat(w), self._flat(grad)
        s = sym(transpose(w3) @ g3)
        if bool(torch.isfinite(s).all()):
            out = torch.baddbmm(g3, w3, s, alpha=-1.0)
        else:  # WᵀG overflows the dtype (e.g. float16 gradients near 6e4): P_W is linear
            scale = _power_of_two_scale(g3)
            g_s = g3 / scale
            out = torch.baddbmm(g_s, w3, sym(transpose(w3) @ g_s), alpha=-1.0).mul_(scale)
            _check_representable("the Riemannian gradient P_W(G)", out, g3)
        return (out.reshape(grad.shape),)

    def proj_tangent(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor]:
        return (self.st.proj(x[0], u[0]),)

    def frame_norms(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> Tensor:
        if self.embedded:
            return linalg.frobenius_fast(u[0])
        return self.st.frame_norm(x[0], u[0])

    def frame_sizes(self) -> tuple[int]:
        return (self.st.d * self.st.r,)

    def scale_frames(self, u: Sequence[Tensor], c: Tensor) -> tuple[Tensor]:
        return (u[0] * _col(c).to(u[0].dtype),)

    def retract(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor]:
        return (self.st.retract(x[0], u[0]),)

    def retract_scaled(self, x: Sequence[Tensor], u: Sequence[Tensor], c: Tensor) -> tuple:
        """polar(W + c·u), as a lazy product A @ H formed when the step is committed."""
        if self.st.retraction == "polar":
            a = torch.addcmul(x[0], u[0], _col(c).to(u[0].dtype))
            inv_sqrt, full = linalg.polar_plan(a, self._upcast_buffer(a))
            return (full if inv_sqrt is None else _LazyProduct(a, inv_sqrt),)
        return self.retract(x, self.scale_frames(u, c))

    def transport(self, x, y, u) -> tuple[Tensor]:
        return (self.st.transport(x[0], y[0], u[0]),)

    def transport_owned(self, x, y, u) -> tuple[Tensor]:
        """P_Y(m) = m − Y sym(Yᵀm), written into m (which the caller owns; copied first if it is
        not contiguous). For a lazy Y = A H: Yᵀm = H (Aᵀm) and Y S = A (H S)."""
        m, yy = u[0], y[0]
        if not m.is_contiguous():
            m = m.contiguous()
        m3 = self._flat(m)
        if isinstance(yy, _LazyProduct):
            basis, h3 = self._flat(yy.a), self._flat(yy.h)

            def coefficient(t: Tensor) -> Tensor:  # Y sym(Yᵀt) = A·(H sym(H Aᵀt))
                return h3 @ sym(h3 @ (transpose(basis) @ t))
        else:
            basis = self._flat(yy)

            def coefficient(t: Tensor) -> Tensor:
                return sym(transpose(basis) @ t)

        c = coefficient(m3)
        if bool(torch.isfinite(c).all()):
            m3.baddbmm_(basis, c, alpha=-1.0)
        else:  # Yᵀm overflows the dtype: P_Y is linear, apply it at scale 1
            scale = _power_of_two_scale(m3)
            m3.div_(scale).baddbmm_(basis, coefficient(m3), alpha=-1.0).mul_(scale)
            _check_representable("the transported moment P_Y(m)", m3, m3)
        return (m,)


def _sqrt_v_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a frame moment's √v: at least float32 (in bfloat16 √β2·√v rounds back to
    √v, 0.9995 being 1 to bfloat16's 8 bits, so √v would never decay)."""
    return torch.promote_types(dtype, torch.float32)


def _power_of_two_scale(a: Tensor) -> Tensor:
    """Per matrix of a (n, d, r) batch, the power of two 2^e ≤ max|A| < 2^{e+1} (1 for a zero
    matrix): representable in A's dtype, and dividing by it is exact and brings the entries
    into [−2, 2]."""
    top = linalg.max_abs(a)[:, None, None]
    e = torch.frexp(torch.where(top > 0, top, torch.ones_like(top))).exponent
    return torch.ldexp(torch.ones_like(top), e - 1)


def _check_representable(what: str, out: Tensor, source: Tensor) -> None:
    if not bool(torch.isfinite(out).all()):
        raise ValueError(
            f"{what} of this frame is not representable in {out.dtype} (largest |entry| of its "
            f"input {float(linalg.max_abs(source).max()):.3e})"
        )


class _LazyProduct:
    """A new frame Y = A @ H (A d×r, H r×r), formed when the step is committed, straight into
    the parameter: the polar retraction's last product needs no temporary and no copy."""

    def __init__(self, a: Tensor, h: Tensor):
        self.a, self.h = a, h

    def write_into(self, p: Tensor) -> None:
        out = p.detach()
        if out.is_contiguous() and self.a.shape == out.shape:
            d, r = out.shape[-2:]
            torch.bmm(self.a.reshape(-1, d, r), self.h.reshape(-1, r, r), out=out.view(-1, d, r))
        else:
            out.copy_(self.a @ self.h)


class _Factored:
    """Adapter of a torch geometry (plain or block) whose points are tuples of tensors."""

    rgrad_is_fresh = False  # e.g. R1's rgrad returns the gradient's S part itself

    def __init__(self, geometry):
        self.g = geometry
        self.name = geometry.name
        self.block = isinstance(geometry, BlockGeometry)
        inner = geometry.base if self.block else geometry
        self._frame_tail = tuple(inner.frame_shape)
        self.moment_groups = geometry.moment_groups

    def frame_batch(self, x: Sequence[Tensor]) -> tuple[int, ...]:
        return (*x[0].shape[:-2], *self._frame_tail)

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "g":
            raise AttributeError(name)
        return getattr(self.g, name)

    def transport_owned(self, x, y, u) -> tuple:
        return self.g.transport(x, y, u)


class _Point:
    """One batched point of a parameter group: the parameters holding its factors, the layout
    map to the geometry's point (identity, or per-head ↔ stacked groups for a block variant)."""

    def __init__(self, geometry, params: Sequence[Tensor], gi: int, pis: Sequence[int]):
        self.geometry = geometry
        self.params = list(params)
        self.gi, self.pis = gi, list(pis)
        self.block = getattr(geometry, "block", False)

    @property
    def key(self) -> Tensor:
        """The parameter whose ``state`` entry holds the point's state."""
        return self.params[0]

    def value(self) -> tuple[Tensor, ...]:
        x = tuple(p.detach() for p in self.params)
        return self.geometry.g.from_heads(x) if self.block else x

    def grad(self) -> tuple[Tensor, ...]:
        g = tuple(torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in self.params)
        return self.geometry.g.from_heads(g) if self.block else g

    def unpack(self, y: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return self.geometry.g.to_heads(y) if self.block else tuple(y)


class _Geometries:
    """The geometries of parameter groups, built from the groups' shapes and options and
    cached, and the points of a group (shared by the optimizers and ``reproject``)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, Any] = {}

    def stiefel(self, group: dict[str, Any], p: Tensor) -> _StiefelFrames:
        key = (
            "stiefel",
            int(p.shape[-2]),
            int(p.shape[-1]),
            group.get("retraction", "polar"),
            group.get("metric", "embedded"),
        )
        if key not in self._cache:
            _, d, r, retraction, metric = key
            self._cache[key] = _StiefelFrames(Stiefel(d, r, retraction=retraction, metric=metric))
        return self._cache[key]

    def factored(self, group: dict[str, Any]) -> _Factored:
        """The geometry of a group of factors, built from the parameters' shapes and the group's
        options (and cached); raises ValueError on a group that does not fit it."""
        name = group["geometry"]
        params = group["params"]
        block = name.startswith("block_")
        cls = PLAIN[name.removeprefix("block_")]
        kinds = cls.point_kinds
        label = f"a {name!r} group"
        if len(params) != len(kinds):
            raise ValueError(
                f"{label} holds the factors of one point, in order ({len(kinds)} parameters: "
                f"{', '.join(kinds)} factors), got {len(params)} parameters"
            )
        lead = 3 if block else 2
        for p, kind in zip(params, kinds, strict=True):
            if p.ndim < (lead if kind != "core" or not block else 3):
                raise ValueError(f"{label}: a factor of shape {tuple(p.shape)} has too few dims")
        if len({p.dtype for p in params}) > 1 or len({p.device for p in params}) > 1:
            raise ValueError(f"{label}: the factors must share one dtype and one device")
        row = params[kinds.index("row")]
        col = params[kinds.index("col")]
        sizes = {"m": int(row.shape[-2]), "n": int(col.shape[-2]), "r": int(row.shape[-1])}
        for k, v in sizes.items():
            if k in group and group[k] != v:
                raise ValueError(f"{label}: {k}={group[k]!r} given, but the shapes say {k}={v}")
        options: dict[str, Any] = {}
        for k in ("retraction", "metric"):
            if k in group:
                options[k] = group[k]
        if block:
            options["n_heads"] = int(group.get("n_heads", row.shape[-3]))
            options["n_kv_heads"] = int(group.get("n_kv_heads", col.shape[-3]))
            if group.get("pattern") is not None:
                options["pattern"] = tuple(tuple(int(i) for i in e) for e in group["pattern"])
            options["groups"] = group.get("groups", "components")
        key = (name, tuple(tuple(p.shape) for p in params), tuple(sorted(options.items())))
        if key in self._cache:
            return self._cache[key]
        try:
            geometry = GEOMETRIES[name](sizes["m"], sizes["n"], sizes["r"], **options)
        except TypeError as err:
            raise ValueError(f"{label}: {err}") from None
        expected = geometry.head_shapes() if block else geometry.point_shapes
        batches = set()
        for p, shape in zip(params, expected, strict=True):
            k = len(shape)
            if tuple(p.shape[p.ndim - k :]) != tuple(shape):
                raise ValueError(
                    f"{label}: expected factors of trailing shapes {list(expected)}, got "
                    f"{[tuple(q.shape) for q in params]}"
                )
            batches.add(tuple(p.shape[: p.ndim - k]))
        if len(batches) > 1:
            raise ValueError(
                f"{label}: the factors' batch shapes differ: {[tuple(q.shape) for q in params]}"
            )
        self._cache[key] = _Factored(geometry)
        return self._cache[key]

    def points(self, gi: int, group: dict[str, Any], all_: bool = False) -> list[_Point]:
        """The points of a geometry group that have a gradient (every point with ``all_``):
        each parameter of a Stiefel group, or the group's one point when any of its factors has
        a gradient (a factor without one counts as zero)."""
        params = group["params"]
        if group["geometry"] == "stiefel":
            return [
                _Point(self.stiefel(group, p), [p], gi, [pi])
                for pi, p in enumerate(params)
                if all_ or p.grad is not None
            ]
        if not all_ and all(p.grad is None for p in params):
            return []
        return [_Point(self.factored(group), params, gi, range(len(params)))]


# -- the base class ----------------------------------------------------------------------------
class _RiemannianOptimizer(torch.optim.Optimizer):
    """Shared machinery: group validation, the bad-gradient check, AdamW for plain groups, and
    the compute-all-then-commit step of points. Subclasses define ``_init_point_state`` and
    ``_rule`` (the step of a point as (u, c): ξ = c·u frame by frame, c None for ξ = u) and list
    the state entries that are tangent vectors in ``_transported``."""

    _transported: tuple[str, ...] = ()

    def __init__(self, params: Iterable, defaults: dict[str, Any]):
        self._geometries = _Geometries()
        self._layouts: dict[tuple, dict[str, Any]] = {}
        #: How many steps were skipped for non-finite gradients (``skip_nonfinite=True``).
        self.skipped_steps = 0
        super().__init__(params, defaults)

    # -- groups ------------------------------------------------------------------------------
    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        """Validate the hyperparameters of one group (subclasses extend)."""
        _positive("lr", group["lr"])
        _betas(group["betas"])
        _nonnegative("eps", group["eps"])
        _nonnegative("weight_decay", group["weight_decay"])
        if group.get("trust_radius") is not None:
            _positive("trust_radius", group["trust_radius"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, then the group's checks (hyperparameters, geometry,
        shapes, every point on its manifold); a refused group leaves the optimizer as it was."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._check_group(group)
            if group.get("geometry") is not None:
                self._check_points(
                    self._geometries.points(len(self.param_groups) - 1, group, all_=True)
                )
        except Exception:
            self.param_groups.pop()
            raise

    def _check_points(self, points: Sequence[_Point]) -> None:
        for point in points:
            try:
                point.geometry.check_point(point.value())
            except ValueError as err:
                raise ValueError(f"{self._point_name(point)}: {err}; {_REPROJECT_HINT}") from None

    def _check_group(self, group: dict[str, Any]) -> None:
        self._check_hyperparameters(group)
        name = group.get("geometry")
        for p in group["params"]:
            if not p.dtype.is_floating_point or p.is_complex():
                raise TypeError(f"parameters must have a real floating dtype, got {p.dtype}")
        if name is None:
            return
        if name not in GEOMETRIES:
            raise ValueError(
                f"unknown geometry {name!r} for a parameter group; choose one of "
                f"{tuple(GEOMETRIES)} (or none, for plain parameters updated by AdamW)"
            )
        if name == "stiefel":
            self._check_stiefel_group(group)
        else:
            self._geometries.factored(group)  # builds it from the shapes: validates the group
        if name in FRAME_GEOMETRIES and group["weight_decay"] > 0.0:
            warnings.warn(
                _DECAY_MESSAGE.format(wd=group["weight_decay"]),
                FrameDecayWarning,
                stacklevel=_caller_stacklevel(),
            )

    @staticmethod
    def _check_stiefel_group(group: dict[str, Any]) -> None:
        if group.get("retraction", "polar") not in RETRACTIONS:
            raise ValueError(
                f"unknown retraction {group['retraction']!r}; choose one of {RETRACTIONS}"
            )
        if group.get("metric", "embedded") not in METRICS:
            raise ValueError(f"unknown metric {group['metric']!r}; choose one of {METRICS}")
        for p in group["params"]:
            if p.ndim < 2 or p.shape[-1] > p.shape[-2] or p.shape[-1] < 1:
                raise ValueError(
                    "a Stiefel group holds frames of shape (..., d, r) with 1 ≤ r ≤ d, got a "
                    f"parameter of shape {tuple(p.shape)}"
                )

    @staticmethod
    def _new_step() -> Tensor:
        dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        return torch.tensor(0.0, dtype=dtype)

    # -- the step ----------------------------------------------------------------------------
    def _param_name(self, gi: int, pi: int, p: Tensor) -> str:
        names = self.param_groups[gi].get("param_names")
        if names is not None and pi < len(names):
            return f"{names[pi]!r} (param_groups[{gi}], shape {tuple(p.shape)})"
        return f"param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)})"

    def _point_name(self, point: _Point) -> str:
        if len(point.params) == 1:
            return self._param_name(point.gi, point.pis[0], point.params[0])
        names = [
            self._param_name(point.gi, pi, p) for pi, p in zip(point.pis, point.params, strict=True)
        ]
        return f"the {point.geometry.name} point of " + ", ".join(names)

    def _validate(self, items: list[tuple[int, int, Tensor]], points: list[_Point]) -> bool:
        """Check every gradient and every point that has no state yet. Returns False when the
        step is to be skipped; raises on bad input. Nothing has been changed when this raises or
        returns False.

        The gradient check costs one reduction per gradient (its sum, which is finite unless an
        entry is NaN/inf or the sum overflows) and one host synchronisation per device; the
        entries are counted only for a gradient whose sum is not finite."""
        for gi, pi, p in items:
            if p.grad.is_sparse:
                raise ValueError(
                    f"sparse gradient for {self._param_name(gi, pi, p)}: not supported"
                )
        counts: list[int] = [0] * len(items)
        by_device: dict[torch.device, list[int]] = {}
        for k, (_, _, p) in enumerate(items):
            by_device.setdefault(p.grad.device, []).append(k)
        for ks in by_device.values():
            sums = torch.stack([items[k][2].grad.sum().to(torch.float64) for k in ks])
            finite = torch.isfinite(sums).tolist()
            for k, ok in zip(ks, finite, strict=True):
                if not ok:
                    counts[k] = int((~torch.isfinite(items[k][2].grad)).sum())
        bad = [(item, c) for item, c in zip(items, counts, strict=True) if c]
        if bad:
            lines = [
                f"{self._param_name(gi, pi, p)}: {c} non-finite entries (NaN or inf) of "
                f"{p.grad.numel()}"
                for (gi, pi, p), c in bad
            ]
            message = "non-finite gradient for " + "; ".join(lines)
            if all(self.param_groups[gi].get("skip_nonfinite", False) for (gi, _, _), _ in bad):
                warnings.warn(
                    message + "; the step was skipped (no parameter or state changed)",
                    NonFiniteGradientWarning,
                    stacklevel=_caller_stacklevel(),
                )
                return False
            raise ValueError(
                message + "; no parameter or state was changed (pass skip_nonfinite=True to "
                "skip such steps with a warning instead)"
            )
        self._check_points([point for point in points if not self.state.get(point.key)])
        for point in points:
            if self.state.get(point.key):
                self._check_state(point, self.state[point.key], deep=False)
        for gi, pi, p in items:
            if self.param_groups[gi].get("geometry") is None and self.state.get(p):
                self._check_plain_state(gi, pi, p, self.state[p], deep=False)
        return True

    # -- state checks (before a step writes anything, and on load) ------------------------------
    def _expected_state(self, point: _Point) -> dict[str, Any]:
        """The layout (key -> shape, or tuple of shapes) of the state of ``point``, from the
        state this optimizer would create for it (computed once per layout)."""
        group = self.param_groups[point.gi]
        key = (
            point.geometry.name,
            tuple(tuple(p.shape) for p in point.params),
            group.get("moment"),
        )
        if key not in self._layouts:
            fresh = self._init_point_state(group, point.geometry, point)
            del fresh["step"]
            self._layouts[key] = {k: validation.shape_of(v) for k, v in fresh.items()}
        return self._layouts[key]

    def _check_state(self, point: _Point, state: Any, deep: bool) -> None:
        """The stored state of ``point`` has this optimizer's keys and layout; with ``deep``
        also finite entries, √v ≥ 0, an integer step and tangent moments (``validation``)."""
        where = f"state of {self._point_name(point)}"
        expected = self._expected_state(point)
        if not isinstance(state, dict) or set(state) != {"step", *expected}:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"{where}: expected the entries {sorted({'step', *expected})} of "
                f"{type(self).__name__}, got {got}"
            )
        for k, shape in expected.items():
            validation.check_layout(f"{where}['{k}']", state[k], shape)
        if not deep:
            return
        validation.check_step(f"{where}['step']", state["step"])
        for k in expected:
            validation.check_values(f"{where}['{k}']", state[k], nonnegative=k == "sqrt_v")
        single = isinstance(point.geometry, _StiefelFrames)
        for k in self._transported:
            u = (state[k],) if single else tuple(state[k])
            validation.check_tangent(f"{where}['{k}']", point.geometry, point.value(), u)

    def _check_plain_state(self, gi: int, pi: int, p: Tensor, state: Any, deep: bool) -> None:
        """The AdamW state of a plain parameter: step, exp_avg and exp_avg_sq of p's shape
        (with ``deep``: finite, exp_avg_sq ≥ 0, an integer step)."""
        where = f"state of {self._param_name(gi, pi, p)}"
        keys = {"step", "exp_avg", "exp_avg_sq"}
        if not isinstance(state, dict) or set(state) != keys:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{where}: expected the AdamW entries {sorted(keys)}, got {got}")
        for k in ("exp_avg", "exp_avg_sq"):
            validation.check_layout(f"{where}['{k}']", state[k], tuple(p.shape))
            if deep:
                validation.check_values(f"{where}['{k}']", state[k], k == "exp_avg_sq")
        if deep:
            validation.check_step(f"{where}['step']", state["step"])

    # -- loading state -------------------------------------------------------------------------
    #: Group entries that fix the geometry of a group's points and the layout of their state.
    _STRUCTURE = (
        "geometry",
        "retraction",
        "metric",
        "moment",
        "n_heads",
        "n_kv_heads",
        "pattern",
        "groups",
    )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict`` after checking everything it would load: the groups
        (same geometry and options as this optimizer's, valid hyperparameters), and the state
        of every parameter (this optimizer's entries and shapes, finite values, √v ≥ 0, integer
        steps, moments tangent at the current points within sqrt(ε) of their dtype — load the
        model's state first). A refused state dict changes nothing. √v keeps its documented
        dtype (at least float32; torch would cast it to the parameter's dtype, and in bfloat16
        √β2·√v rounds back to √v, so √v would stop decaying)."""
        if not (
            isinstance(state_dict, dict)
            and isinstance(state_dict.get("state"), dict)
            and isinstance(state_dict.get("param_groups"), list | tuple)
        ):
            raise ValueError(
                "not an optimizer state dict: expected {'state': ..., 'param_groups': [...]}"
            )
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the state dict has {len(saved_groups)} parameter groups, this optimizer "
                f"{len(self.param_groups)}"
            )
        ids: dict[Any, tuple[int, int]] = {}
        for gi, (saved, group) in enumerate(zip(saved_groups, self.param_groups, strict=True)):
            self._check_saved_group(gi, saved, group)
            for pi, sid in enumerate(saved["params"]):
                ids[sid] = (gi, pi)
        unknown = [k for k in state_dict["state"] if k not in ids]
        if unknown:
            raise ValueError(
                f"the state dict has state for parameter ids {unknown} that no group lists"
            )
        saved = state_dict["state"]
        self._check_saved_state(saved, ids, saved_groups)
        sqrt_v = {ids[sid]: entry["sqrt_v"] for sid, entry in saved.items() if "sqrt_v" in entry}
        super().load_state_dict(state_dict)
        for (gi, pi), value in sqrt_v.items():
            group = self.param_groups[gi]
            p = group["params"][pi]
            if group.get("moment", "frame") == "frame":
                self.state[p]["sqrt_v"] = value.to(p.device, _sqrt_v_dtype(p.dtype)).clone()

    def _check_saved_group(self, gi: int, saved: Any, group: dict[str, Any]) -> None:
        where = f"param_groups[{gi}] of the state dict"
        if not isinstance(saved, dict) or not isinstance(saved.get("params"), list | tuple):
            raise ValueError(f"{where}: expected a dict with a 'params' list")
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(
                f"{where}: {len(saved['params'])} parameters, this optimizer's group "
                f"{len(group['params'])}"
            )
        for k in self._STRUCTURE:
            if saved.get(k) != group.get(k):
                raise ValueError(
                    f"{where}: {k}={saved.get(k)!r}, but this optimizer's group has "
                    f"{k}={group.get(k)!r} (a state dict of another optimizer or another "
                    "model layout; e.g. loading torch.optim.AdamW's would train frames as plain "
                    "parameters)"
                )
        merged = {**group, **{k: v for k, v in saved.items() if k != "params"}}
        try:
            self._check_hyperparameters(merged)
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{where}: {err}") from None

    def _check_saved_state(
        self, saved: dict[Any, Any], ids: dict[Any, tuple[int, int]], saved_groups: Sequence
    ) -> None:
        """Every saved state entry against the current parameters (``_check_state``)."""
        for gi, group in enumerate(self.param_groups):
            sids = list(saved_groups[gi]["params"])
            if group.get("geometry") is None:
                for pi, p in enumerate(group["params"]):
                    entry = saved.get(sids[pi])
                    if entry:
                        self._check_plain_state(gi, pi, p, entry, deep=True)
                continue
            for point in self._geometries.points(gi, group, all_=True):
                owners = [sids[pi] for pi in point.pis]
                entry = saved.get(owners[0])
                stray = [sid for sid in owners[1:] if saved.get(sid)]
                if stray:
                    raise ValueError(
                        f"state of {self._point_name(point)}: a point's state lives with its "
                        f"first factor, got state for parameter ids {stray} too"
                    )
                if entry:
                    self._check_state(point, entry, deep=True)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient (see the module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        items = [
            (gi, pi, p)
            for gi, group in enumerate(self.param_groups)
            for pi, p in enumerate(group["params"])
            if p.grad is not None
        ]
        if not items:
            return loss
        points = [
            point
            for gi, group in enumerate(self.param_groups)
            if group.get("geometry") is not None
            for point in self._geometries.points(gi, group)
        ]
        if not self._validate(items, points):
            self.skipped_steps += 1
            return loss
        # Points: compute every new point and state first, then write them all.
        pending = []
        for point in points:
            try:
                pending.append((point, *self._point_update(point)))
            except ValueError as err:
                raise ValueError(
                    f"{self._point_name(point)}: {err}; no parameter or state was changed"
                ) from err
        for point, values, new in pending:
            for p, v in zip(point.params, values, strict=True):
                if isinstance(v, _LazyProduct):
                    v.write_into(p)
                else:
                    p.copy_(v)
            self.state[point.key].update(new)
        # Plain parameters: AdamW, in place, with torch's arithmetic.
        for gi, _, p in items:
            group = self.param_groups[gi]
            if group.get("geometry") is None:
                self._adamw(group, p)
        return loss

    def _point_update(self, point: _Point) -> tuple[tuple[Tensor, ...], dict]:
        """The new factors (in the parameters' layout) and the new state of one point, computed
        without writing anything."""
        group = self.param_groups[point.gi]
        geometry = point.geometry
        single = isinstance(geometry, _StiefelFrames)
        stored = self.state.get(point.key) or self._init_point_state(group, geometry, point)
        state = {k: ((v,) if single and k in self._transported else v) for k, v in stored.items()}
        if single and group.get("moment") == "elementwise":
            state["sqrt_v"] = (state["sqrt_v"],)
        x, egrad = point.value(), point.grad()
        wd = group["weight_decay"]
        if wd > 0.0 and group["geometry"] not in FRAME_GEOMETRIES:  # reference decay="coupled"
            egrad = tuple(gi + wd * xi for gi, xi in zip(egrad, x, strict=True))
        g = geometry.egrad_to_rgrad(x, egrad)
        u, c, new = self._rule(group, geometry, x, g, state)
        y = geometry.retract(x, u) if c is None else geometry.retract_scaled(x, u, c)
        if not (single and geometry.st.retraction == "polar"):  # polar refuses non-finite input
            sums = torch.stack([t.sum().to(torch.float64) for t in y])
            if not bool(torch.isfinite(sums).all()):
                bad = int(sum((~torch.isfinite(t)).sum() for t in y))
                if bad:
                    raise ValueError(f"the point after this step has {bad} non-finite entries")
        for key in self._transported:
            new[key] = geometry.transport_owned(x, y, new[key])
        if single:
            for key in self._transported:
                new[key] = new[key][0]
            if isinstance(new.get("sqrt_v"), tuple):
                new["sqrt_v"] = new["sqrt_v"][0]
        return point.unpack(y), new

    # -- AdamW (torch.optim.AdamW, single-tensor path, decoupled decay) -----------------------
    def _adamw(self, group: dict[str, Any], p: Tensor) -> None:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = self._new_step()
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        grad, exp_avg, exp_avg_sq = p.grad, state["exp_avg"], state["exp_avg_sq"]
        lr, (beta1, beta2) = group["lr"], group["betas"]
        eps, weight_decay = group["eps"], group["weight_decay"]
        state["step"] += 1
        if weight_decay != 0:
            p.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = state["step"].item()
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-step_size)

    # -- what subclasses define ---------------------------------------------------------------
    def _init_point_state(self, group: dict[str, Any], geometry, point: _Point) -> dict:
        return {"step": self._new_step()}

    def _frame_scalars(self, geometry, point: _Point, x=None) -> Tensor:
        """Zeros of the shape of the point's per-frame scalars, in ``_sqrt_v_dtype``."""
        x = point.value() if x is None else x
        return x[0].new_zeros(geometry.frame_batch(x), dtype=_sqrt_v_dtype(x[0].dtype))

    def _store(self, geometry, tangent: Sequence[Tensor]):
        """A tangent vector as stored: the tensor itself for a Stiefel parameter, else a tuple."""
        return tangent[0] if isinstance(geometry, _StiefelFrames) else tuple(tangent)


# -- re-projection -------------------------------------------------------------------------------
@torch.no_grad()
def reproject(param_groups: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Put every point of the geometry groups back on its manifold, in place, and return the
    largest orthonormality residual ‖FᵀF − I‖ found before, per group (``"param_groups[i]"``).

    Each orthonormal factor F (a Stiefel frame; U and V of R1, P1, P2, P3; the stacked factors
    of a block variant) becomes polar(F) = F(FᵀF)^{-1/2}, the nearest frame in Frobenius norm,
    computed in float64 and cast back to F's dtype; the other factors (S of R1, R2's A and B)
    are left as they are. Use it after a dtype cast (``model.to(torch.float64)`` of a model
    built in float32 leaves frames off St by float32 rounding, which the optimizer refuses) or
    after loading weights made elsewhere; ``param_groups`` are those given to an optimizer (or
    ``torch_port.nn.parameter_groups(model)``). Groups without a geometry are skipped."""
    geometries = _Geometries()
    worst: dict[str, float] = {}
    for gi, group in enumerate(param_groups):
        if group.get("geometry") is None:
            continue
        group = {**group, "params": list(group["params"])}
        for point in geometries.points(gi, group, all_=True):
            x = list(point.value())
            inner = point.geometry.g if isinstance(point.geometry, _Factored) else None
            indices = (0,) if inner is None else _orthonormal_factors(inner)
            for i in indices:
                res = float(linalg.orthonormality_residual(x[i]).max()) if x[i].numel() else 0.0
                worst[f"param_groups[{gi}]"] = max(worst.get(f"param_groups[{gi}]", 0.0), res)
                x[i] = linalg.polar(x[i].to(torch.float64)).to(x[i].dtype)
            for p, v in zip(point.params, point.unpack(tuple(x)), strict=True):
                p.copy_(v)
    return worst


def _orthonormal_factors(geometry: Any) -> tuple[int, ...]:
    base = geometry.base if isinstance(geometry, BlockGeometry) else geometry
    return tuple(base.orthonormal_factors)


# -- the four presets ----------------------------------------------------------------------------
class RiemannianAdam(_RiemannianOptimizer):
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
        lr, betas, eps: as ``torch.optim.AdamW``.
        trust_radius: Δ, the cap on ‖ξ‖ per frame (None: no cap).
        weight_decay: decoupled decay of plain parameters; on frames it warns and does nothing.
        moment: "frame" (one scalar √v per frame) or "elementwise".
        reduction: "mean" (RMS, default) or "sum" (‖g‖) for the frame moment.
        skip_nonfinite: skip a step whose gradients have NaN/inf entries (with a warning)
            instead of raising ValueError.
    """

    _transported = ("exp_avg",)

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
    ):
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            trust_radius=trust_radius,
            weight_decay=weight_decay,
            moment=moment,
            reduction=reduction,
            skip_nonfinite=skip_nonfinite,
        )
        super().__init__(params, defaults)

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        super()._check_hyperparameters(group)
        if group["moment"] not in MOMENTS:
            raise ValueError(f"unknown moment {group['moment']!r}; choose one of {MOMENTS}")
        if group["reduction"] not in REDUCTIONS:
            raise ValueError(
                f"unknown reduction {group['reduction']!r}; choose one of {REDUCTIONS}"
            )

    def _init_point_state(self, group: dict[str, Any], geometry, point: _Point) -> dict:
        x = point.value()
        zero = geometry.zero_tangent(x)
        if group["moment"] == "frame":
            sqrt_v = self._frame_scalars(geometry, point, x)
        else:
            sqrt_v = self._store(geometry, tuple(torch.zeros_like(t) for t in zero))
        return {
            "step": self._new_step(),
            "exp_avg": self._store(geometry, zero),
            "sqrt_v": sqrt_v,
        }

    def _rule(self, group, geometry, x, g, state):
        lr, (b1, b2), eps = group["lr"], _betas(group["betas"]), group["eps"]
        t = int(state["step"].item()) + 1
        c1, c2 = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
        rb2, r1mb2 = math.sqrt(b2), math.sqrt(1.0 - b2)
        sv = state["sqrt_v"]
        radius = group["trust_radius"]
        if group["moment"] == "frame":
            if group["reduction"] == "mean":
                root = _frame_rms(geometry, x, g)
            else:
                root = geometry.frame_norms(x, g)
            sqrt_v = torch.hypot(rb2 * sv, r1mb2 * root.to(sv.dtype))
            if eps == 0.0 and bool(((sqrt_v == 0) & (root > 0)).any()):
                raise ValueError(
                    f"√v = √(1 − β2)·RMS(g) underflows to 0 in {sqrt_v.dtype} for a nonzero "
                    f"gradient (RMS(g) = {float(root[sqrt_v == 0].max()):.3e}), so with eps = 0 "
                    "the step is undefined; use eps > 0 or float64 parameters"
                )
            m = _lerp(geometry, state["exp_avg"], g, 1.0 - b1)  # may overwrite g
            u, k = _ratio_step(geometry, m, 1.0 / c1, sqrt_v / c2 + eps, lr)
            c = -lr * k  # ξ = c·u per frame
            if radius is not None:
                c = c * _trust_factor(c.abs() * geometry.frame_norms(x, u).to(c.dtype), radius)
        else:
            sqrt_v = tuple(
                torch.hypot(rb2 * s, r1mb2 * torch.abs(gi)) for s, gi in zip(sv, g, strict=True)
            )
            m = _lerp(geometry, state["exp_avg"], g, 1.0 - b1)
            ratios = []
            for mi, s in zip(m, sqrt_v, strict=True):
                den = s / c2 + eps
                ratios.append(torch.where(den > 0, (mi / c1) / den, torch.zeros_like(mi)))
            u = tuple(-lr * d for d in geometry.proj_tangent(x, tuple(ratios)))
            c = None if radius is None else _trust_factor(geometry.frame_norms(x, u), radius)
        step = torch.full_like(state["step"], t)
        return u, c, {"step": step, "exp_avg": m, "sqrt_v": sqrt_v}


class RiemannianMomentum(_RiemannianOptimizer):
    """The low-rank template (``reference.optim.riemannian_momentum``): on a frame,
    M ← β·M + (1 − β)·P_W(G); ξ = −lr·M/max(‖M‖, c) per frame; W ← polar(W + ξ); M ← P_W(M).
    Plain groups: AdamW with the group's lr, betas, eps and weight_decay."""

    _transported = ("momentum_buffer",)

    def __init__(
        self,
        params: Iterable,
        lr: float,
        beta: float = 0.9,
        c: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        skip_nonfinite: bool = False,
    ):
        defaults = dict(
            lr=lr,
            beta=beta,
            c=c,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            skip_nonfinite=skip_nonfinite,
        )
        super().__init__(params, defaults)

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        super()._check_hyperparameters(group)
        _beta("beta", group["beta"])
        _positive("c", group["c"])

    def _init_point_state(self, group: dict[str, Any], geometry, point: _Point) -> dict:
        return {
            "step": self._new_step(),
            "momentum_buffer": self._store(geometry, geometry.zero_tangent(point.value())),
        }

    def _rule(self, group, geometry, x, g, state):
        lr, beta, c_min = group["lr"], group["beta"], group["c"]
        m = _lerp(geometry, state["momentum_buffer"], g, 1.0 - beta)
        n = geometry.frame_norms(x, m)
        c = -lr * _rdiv(1.0, torch.clamp(n, min=c_min))
        return m, c, {"step": state["step"] + 1, "momentum_buffer": m}


class RSGD(_RiemannianOptimizer):
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
    ):
        defaults = dict(
            lr=lr,
            trust_radius=trust_radius,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            skip_nonfinite=skip_nonfinite,
        )
        super().__init__(params, defaults)

    def _rule(self, group, geometry, x, g, state):
        lr, radius = group["lr"], group["trust_radius"]
        c = torch.full(geometry.frame_batch(x), -lr, dtype=g[0].dtype, device=g[0].device)
        if radius is not None:
            c = c * _trust_factor(lr * geometry.frame_norms(x, g).to(c.dtype), radius)
        return g, c, {"step": state["step"] + 1}


class NormalizedRSGD(_RiemannianOptimizer):
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
    ):
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, skip_nonfinite=skip_nonfinite
        )
        super().__init__(params, defaults)

    def _rule(self, group, geometry, x, g, state):
        u, k = _ratio_step(geometry, g, 1.0, _frame_rms(geometry, x, g), group["lr"])
        return u, -group["lr"] * k, {"step": state["step"] + 1}


__all__ = [
    "GEOMETRIES",
    "RSGD",
    "FrameDecayWarning",
    "NonFiniteGradientWarning",
    "NormalizedRSGD",
    "RiemannianAdam",
    "RiemannianMomentum",
    "reproject",
]
