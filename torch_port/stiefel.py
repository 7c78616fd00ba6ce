"""The Stiefel manifold St(d, r) in torch, batched over leading dimensions (DESIGN §4.0, §7).

Mirrors ``reference/stiefel.py`` method for method. A tensor of shape (..., d, r) is a batch of
frames, one frame per trailing d×r matrix (e.g. layers × heads × d × r); every per-frame scalar
(a norm, an inner product, a residual) comes back as a tensor of shape (...,).

``StiefelFrames`` is St(d, r) as the optimizers see every geometry (``torch_port.geometry.
PointGeometry``: points are 1-tuples (W,)), with the optimizer's hot path fused.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_port import deferred, linalg
from torch_port.geometry import default_atol
from torch_port.linalg import Tensor, frobenius, sym, transpose

RETRACTIONS = ("polar", "polar_svd", "qr", "exp")
METRICS = ("embedded", "canonical")


def retraction_order(d: int, r: int, retraction: str, metric: str) -> int:
    """The order of a retraction against the chosen metric's geodesics, as the reference's
    ``reference.stiefel.retraction_order``: 2 for r = 1 (QR is the polar map there and the two
    metrics coincide); else 1 for QR; else 2 in the embedded metric, and in the canonical one
    only for r = d (for 2 ≤ r < d its geodesics leave the polar map and the embedded exponential
    at second order)."""
    if r == 1:
        return 2
    if retraction == "qr":
        return 1
    return 2 if metric == "embedded" or r == d else 1


class Stiefel:
    """St(d, r) with 1 ≤ r ≤ d, for batches of frames.

    A point is a real floating tensor W of shape (..., d, r) whose every trailing matrix has
    WᵀW = I_r. A tangent vector at W is a tensor ξ of the same shape with Wᵀξ + ξᵀW = 0 frame by
    frame. The metric is the embedded one, ⟨ξ, η⟩ = tr(ξᵀη), or optionally the canonical one,
    ⟨ξ, η⟩ = tr(ξᵀ(I − ½WWᵀ)η). Euclidean gradients are ∂f/∂W in the layout of W.

    Args:
        d: ambient dimension (rows).
        r: number of orthonormal columns, 1 ≤ r ≤ d.
        retraction: "polar" (default; (W + ξ)(Gram)^{-1/2} with the Gram actually formed, in
            float64 for low-precision frames; second order in the embedded metric, first in the
            canonical one for 2 ≤ r < d: ``retraction_order``), "polar_svd" (the same map
            through the SVD), "qr" (sign-fixed QR, first order for r ≥ 2) or "exp" (the
            exponential map of the embedded metric).
        metric: "embedded" (default) or "canonical".
    """

    name = "stiefel"
    embedded = False
    quotient = False
    moment_groups = ((0,),)  # one frame per trailing d×r matrix

    def __init__(self, d: int, r: int, retraction: str = "polar", metric: str = "embedded"):
        if not (isinstance(d, int) and isinstance(r, int)) or isinstance(d, bool):
            raise TypeError(f"St(d, r) needs integer d and r, got d={d!r}, r={r!r}")
        if r < 1 or d < 1:
            raise ValueError(f"St(d, r) needs d ≥ 1 and r ≥ 1, got d={d}, r={r}")
        if r > d:
            raise ValueError(
                f"St(d, r) needs r ≤ d (at most d orthonormal columns), got r={r} > d={d}"
            )
        if retraction not in RETRACTIONS:
            raise ValueError(f"unknown retraction {retraction!r}; choose one of {RETRACTIONS}")
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; choose one of {METRICS}")
        self.d, self.r = int(d), int(r)
        self.retraction, self.metric = retraction, metric
        self.retraction_order = retraction_order(self.d, self.r, retraction, metric)
        self.dim = self.d * self.r - self.r * (self.r + 1) // 2
        self.shape = (self.d, self.r)

    def __repr__(self) -> str:
        return (
            f"Stiefel({self.d}, {self.r}, retraction={self.retraction!r}, metric={self.metric!r})"
        )

    # -- points and tangent vectors ------------------------------------------------------------
    def random_point(
        self,
        generator: torch.Generator | None = None,
        batch_shape: Sequence[int] = (),
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """Q of the sign-fixed QR of a Gaussian (Haar on St(d, r)), one per frame of the batch.

        Drawn and factorised in float64, then cast to ``dtype``; contiguous (as
        ``fully_shard`` requires of a parameter)."""
        z = torch.randn(
            (*batch_shape, *self.shape), generator=generator, dtype=torch.float64, device=device
        )
        return linalg.qr_signfixed(z)[0].to(dtype).contiguous()

    def random_tangent(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """A unit-norm tangent vector per frame: P_W(Z)/‖P_W(Z)‖ for a Gaussian Z."""
        z = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        u = self.proj(x, z)
        return u / self.norm(x, u)[..., None, None]

    def zero_tangent(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)

    def inner(self, x: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """tr(uᵀv) (embedded) or tr(uᵀv) − ½ tr((Wᵀu)ᵀ(Wᵀv)) (canonical), per frame."""
        value = torch.sum(u * v, dim=(-2, -1))
        if self.metric == "canonical":
            xt = transpose(x)
            value = value - 0.5 * torch.sum((xt @ u) * (xt @ v), dim=(-2, -1))
        return value

    def norm(self, x: Tensor, u: Tensor) -> Tensor:
        """‖u‖ per frame: the scaled Frobenius norm (embedded), sqrt(max(⟨u, u⟩, 0)) (canonical)."""
        if self.metric == "embedded":
            return frobenius(u)
        return torch.sqrt(torch.clamp(self.inner(x, u, u), min=0.0))

    def frame_norm(self, x: Tensor, u: Tensor) -> Tensor:
        """‖u‖ per frame as s·‖u/s‖ with s = max|u| (0 for u = 0): the norm the update rules use
        (reference ``optim_transforms._metric_norm``), free of overflow and underflow in either
        metric. In the embedded metric it is ``norm`` itself (the inner rescaling by max|u/s| = 1
        is exact)."""
        if self.metric == "embedded":
            return frobenius(u)
        s = linalg.max_abs(u)
        safe = torch.where(s == 0, torch.ones_like(s), s)
        return torch.where(s == 0, s, s * self.norm(x, u / safe[..., None, None]))

    # -- projections and gradients -------------------------------------------------------------
    def proj(self, x: Tensor, z: Tensor) -> Tensor:
        """P_W(Z) = Z − W sym(WᵀZ), frame by frame (orthogonal in both metrics)."""
        return z - x @ sym(transpose(x) @ z)

    proj_tangent = proj

    def egrad_to_rgrad(self, x: Tensor, egrad: Tensor) -> Tensor:
        """P_W(G) (embedded metric) or G − W Gᵀ W (canonical metric)."""
        if self.metric == "canonical":
            return egrad - x @ transpose(egrad) @ x
        return self.proj(x, egrad)

    # -- retractions and transport -------------------------------------------------------------
    def retract(self, x: Tensor, u: Tensor) -> Tensor:
        """R_W(ξ) by the retraction chosen at construction, frame by frame."""
        if self.retraction == "polar":
            return linalg.polar(x + u)
        if self.retraction == "polar_svd":
            return linalg.polar_svd(x + u)
        if self.retraction == "qr":
            return linalg.qr_signfixed(x + u)[0]
        return self.exp(x, u)

    def exp(self, x: Tensor, u: Tensor) -> Tensor:
        """Geodesic of the embedded metric at t = 1 (Edelman, Arias & Smith 1998, eq. 2.45):

        Exp_W(ξ) = [W, ξ] expm([[A, −S], [I, A]]) [I; 0] expm(−A),  A = Wᵀξ, S = ξᵀξ.
        """
        a, s = transpose(x) @ u, transpose(u) @ u
        eye = linalg.eye_like(a).expand_as(a)
        block = torch.cat([torch.cat([a, -s], dim=-1), torch.cat([eye, a], dim=-1)], dim=-2)
        return torch.cat([x, u], dim=-1) @ linalg.expm(block)[..., : self.r] @ linalg.expm(-a)

    def transport(self, x: Tensor, y: Tensor, u: Tensor) -> Tensor:
        """Vector transport by projection: P_Y(ξ)."""
        return self.proj(y, u)

    def project_point(self, a: Tensor) -> Tensor:
        """The nearest frame to each full-rank matrix of a batch in Frobenius norm: polar(A)."""
        return linalg.polar(a)

    # -- matrices and validation ---------------------------------------------------------------
    def to_matrix(self, x: Tensor) -> Tensor:
        return x

    def tangent_to_matrix(self, x: Tensor, u: Tensor) -> Tensor:
        return u

    def egrad_from_matrix(self, x: Tensor, g: Tensor) -> Tensor:
        return g

    def residual(self, x: Tensor) -> Tensor:
        """‖WᵀW − I_r‖ per frame, measured in float64 from the stored entries."""
        return linalg.orthonormality_residual(x)

    def _check_layout(self, what: str, x: Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
        if x.ndim < 2 or tuple(x.shape[-2:]) != self.shape:
            raise ValueError(
                f"{what}: expected shape (..., {self.d}, {self.r}), got {tuple(x.shape)}"
            )
        if not x.dtype.is_floating_point:
            raise TypeError(f"{what}: expected a real floating dtype, got {x.dtype}")
        bad = int((~torch.isfinite(x)).sum())
        if bad:
            raise ValueError(f"{what}: {bad} non-finite entries (NaN or inf)")

    def check_point(self, x: Tensor, atol: float | None = None) -> None:
        """Raise ValueError unless x has shape (..., d, r), is finite and every frame has
        ‖WᵀW − I‖ ≤ atol (default sqrt(ε) of x's dtype); the message gives the measured
        residual of the worst frame, its index and how many frames are off."""
        self._check_layout("Stiefel point", x)
        atol = default_atol(x.dtype) if atol is None else float(atol)
        res = self.residual(x)
        off = res > atol
        count = int(off.sum())
        if count:
            worst = int(torch.argmax(res.reshape(-1)))
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), res.shape))
            raise ValueError(
                f"point is off St({self.d}, {self.r}): ‖WᵀW − I‖ = "
                f"{float(res.reshape(-1)[worst]):.3e} > {atol:.1e} (frame {index}; "
                f"{count} of {res.numel()} frames off)"
            )

    def check_tangent(self, x: Tensor, u: Tensor, atol: float | None = None) -> None:
        """Raise ValueError unless ‖Wᵀξ + ξᵀW‖ ≤ atol·max(1, ‖ξ‖) in every frame."""
        self._check_layout("Stiefel tangent", u)
        atol = default_atol(u.dtype) if atol is None else float(atol)
        x64, u64 = x.to(torch.float64), u.to(torch.float64)
        res = frobenius(2.0 * sym(transpose(x64) @ u64))
        bound = atol * torch.clamp(frobenius(u64), min=1.0)
        if bool((res > bound).any()):
            raise ValueError(
                f"vector is not tangent at W: ‖Wᵀξ + ξᵀW‖ = {float(res.max()):.3e} (worst frame)"
            )


# -- the optimizers' view: points (W,), with the fused hot path -------------------------------
class StiefelFrames:
    """A ``Stiefel`` geometry seen as points that are 1-tuples (W,), with the optimizer's hot
    path fused: P_W(G) = G − W sym(WᵀG) as one ``baddbmm`` (embedded metric), the step
    W + c·m as one ``addcmul`` before the polar factor, whose Gram is formed in the frames' own
    dtype (``retraction_gram``), and the transport of the first moment
    P_Y(m) = m − Y sym(Yᵀm) in place, into the moment the step has just made.

    For float32 and float64 frames on the CPU no d×r tensor is allocated per step once a point
    has stepped twice (half-precision frames upcast A for the Gram): W + c·m goes
    into a buffer kept per point (reused when no pending step holds it), and the Riemannian
    gradient into the tangent vector the optimizer's state dropped at the last commit
    (``recycle``). The C library returns freed blocks above 32 MB to the system and faults them
    in again at the next allocation, which cost as much as the step's elementwise passes; a
    CUDA device's caching allocator reuses its blocks itself, so nothing is kept there."""

    moment_groups = ((0,),)
    frame_shape: tuple[int, ...] = ()
    orthonormal_factors = (0,)
    #: ``egrad_to_rgrad`` returns a new tensor, which the rules may overwrite.
    rgrad_is_fresh = True
    #: The sum over the processes holding a frame's rows (``optim.sharding``); None: all here.
    reduce: Callable[[Tensor], Tensor] | None = None

    def __init__(self, st: Stiefel):
        self.st = st
        self.name = st.name
        self.embedded = st.metric == "embedded"
        #: linalg.polar refuses non-finite input itself (one check less per step).
        self.retraction_checks_finite = st.retraction == "polar"
        #: Per point (``_slot``): the buffer of W + c·u with the lazy product holding it, and
        #: a free tangent vector for the next Riemannian gradient.
        self._work: dict[tuple, tuple[Tensor, Callable[[], Any]]] = {}
        self._spare: dict[tuple, Tensor] = {}

    def __repr__(self) -> str:
        return f"StiefelFrames({self.st!r})"

    @staticmethod
    def _slot(w: Tensor) -> tuple:
        """Which point's buffers: its storage, shape, dtype and device."""
        return (w.data_ptr(), tuple(w.shape), w.dtype, w.device)

    @staticmethod
    def _keeps(w: Tensor) -> bool:
        """Buffers are kept for points on the CPU (class docstring), not by the capturable
        step (whose graph holds its own)."""
        return w.device.type == "cpu" and not deferred.on_device()

    def _fits(self, t: Tensor | None, w: Tensor) -> bool:
        return (
            type(t) is torch.Tensor
            and t.is_contiguous()
            and (t.shape, t.dtype, t.device) == (w.shape, w.dtype, w.device)
        )

    def _rgrad_buffer(self, w: Tensor, grad: Tensor) -> Tensor:
        """The recycled tangent vector of the point w (``recycle``), or a new one."""
        out = self._spare.pop(self._slot(w), None) if self._keeps(w) else None
        if self._fits(out, grad):
            return out
        return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)

    def recycle(self, x: Sequence[Tensor], dropped: Any) -> None:
        """Take back a tensor that the optimizer's state of the point x has just dropped (the
        moment before this step) as the buffer of x's next Riemannian gradient, when it has
        x's layout."""
        w = x[0]
        if self._keeps(w) and self._fits(dropped, w) and dropped.data_ptr() != w.data_ptr():
            self._spare[self._slot(w)] = dropped

    def frame_batch(self, x: Sequence[Tensor]) -> tuple[int, ...]:
        return tuple(x[0].shape[:-2])

    def check_point(self, x: Sequence[Tensor], atol: float | None = None) -> None:
        self.st.check_point(x[0], atol)

    def from_params(self, params: Sequence[Tensor]) -> tuple[Tensor]:
        return (params[0],)

    def to_params(self, x: Sequence[Tensor]) -> tuple:
        return tuple(x)

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
        out = self._rgrad_buffer(w, grad)
        out3 = self._flat(out)
        if _all_finite(s):
            torch.baddbmm(g3, w3, s, alpha=-1.0, out=out3)
        else:  # WᵀG overflows the dtype (e.g. float16 gradients near 6e4): P_W is linear
            scale = _power_of_two_scale(g3)
            g_s = g3 / scale
            torch.baddbmm(g_s, w3, sym(transpose(w3) @ g_s), alpha=-1.0, out=out3).mul_(scale)
            _check_representable("the Riemannian gradient P_W(G)", out3, g3)
        return (out,)

    def proj_tangent(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor]:
        return (self.st.proj(x[0], u[0]),)

    def frame_norms(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> Tensor:
        if self.embedded:
            return linalg.frobenius_fast(u[0])
        return self.st.frame_norm(x[0], u[0])

    def frame_sizes(self) -> tuple[int]:
        return (self.st.d * self.st.r,)

    def scale_frames(self, u: Sequence[Tensor], c: Tensor) -> tuple[Tensor]:
        return (u[0] * c[..., None, None].to(u[0].dtype),)

    def retract(self, x: Sequence[Tensor], u: Sequence[Tensor]) -> tuple[Tensor]:
        """R_W(ξ); for the exponential map, refused when the result is off St(d, r) by more
        than sqrt(ε) of the dtype (the point check's tolerance): the matrix exponentials of a
        long step lose orthonormality (‖YᵀY − I‖ = 0.14 at ‖ξ‖ = 1600 in float32), where the
        polar and QR retractions make a frame whatever the step."""
        y = self.st.retract(x[0], u[0])
        if self.st.retraction == "exp":
            res, atol = self.st.residual(y), default_atol(y.dtype)
            if bool((res > atol).any()):  # (NaN is left to the step's finiteness check)
                raise ValueError(
                    f"the exponential retraction's result is off St({self.st.d}, {self.st.r}): "
                    f"‖YᵀY − I‖ = {float(res.max()):.3e} > {atol:.1e} for a step of norm up to "
                    f"{float(frobenius(u[0]).max()):.3e}; take shorter steps (a trust radius) "
                    "or the polar retraction"
                )
        return (y,)

    def retract_scaled(self, x: Sequence[Tensor], u: Sequence[Tensor], c: Tensor) -> tuple:
        """polar(W + c·u), as a lazy product A @ H formed when the step is committed; A goes
        into the point's work buffer, and H comes from ``retraction_gram``."""
        if self.st.retraction != "polar":
            return self.retract(x, self.scale_frames(u, c))
        w = x[0]
        keeps = self._keeps(w)
        slot = self._slot(w) if keeps else None
        held = self._work.pop(slot, None) if keeps else None
        free = held is not None and held[1]() is None and self._fits(held[0], w)
        work = held[0] if free else torch.empty(w.shape, dtype=w.dtype, device=w.device)
        a = torch.addcmul(w, u[0], c[..., None, None].to(u[0].dtype), out=work)
        gram = self.retraction_gram(x, u, c, a)
        inv_sqrt, full = linalg.polar_plan(a, reduce=self.reduce, gram=gram)
        if deferred.on_device():  # formed now, to be selected against W on the device
            return (a @ inv_sqrt,)
        y = full if inv_sqrt is None else LazyProduct(a, inv_sqrt)
        if keeps:
            self._work[slot] = (a, _nobody if inv_sqrt is None else weakref.ref(y))
        return (y,)

    def retraction_gram(
        self, x: Sequence[Tensor], u: Sequence[Tensor], c: Tensor, a: Tensor
    ) -> Tensor:
        """The Gram AᵀA of A = W + c·u that the polar retraction uses: formed from A's stored
        entries (so that W's rounding drift is corrected, not assumed away) in the frames' own
        dtype, float32 or float64 (``linalg.working_gram``); float64 for half precision."""
        gram = linalg.working_gram(a)
        return gram if self.reduce is None else self.reduce(gram)

    def transport(
        self, x: Sequence[Tensor], y: Sequence[Tensor], u: Sequence[Tensor]
    ) -> tuple[Tensor]:
        return (self.st.transport(x[0], y[0], u[0]),)

    def transport_owned(
        self, x: Sequence[Tensor], y: Sequence[Any], u: Sequence[Tensor]
    ) -> tuple[Tensor]:
        """P_Y(m) = m − Y sym(Yᵀm), written into m (which the caller owns; copied first if it is
        not contiguous). For a lazy Y = A H: Yᵀm = H (Aᵀm) and Y S = A (H S)."""
        m, yy = u[0], y[0]
        if not m.is_contiguous():
            m = m.contiguous()
        m3 = self._flat(m)
        if isinstance(yy, LazyProduct):
            basis, h3 = self._flat(yy.a), self._flat(yy.h)

            def coefficient(t: Tensor) -> Tensor:  # Y sym(Yᵀt) = A·(H sym(H Aᵀt))
                return h3 @ sym(h3 @ (transpose(basis) @ t))
        else:
            basis = self._flat(yy)

            def coefficient(t: Tensor) -> Tensor:
                return sym(transpose(basis) @ t)

        c = coefficient(m3)
        if _all_finite(c):
            m3.baddbmm_(basis, c, alpha=-1.0)
        else:  # Yᵀm overflows the dtype: P_Y is linear, apply it at scale 1
            scale = _power_of_two_scale(m3)
            m3.div_(scale).baddbmm_(basis, coefficient(m3), alpha=-1.0).mul_(scale)
            _check_representable("the transported moment P_Y(m)", m3, m3)
        return (m,)


def _all_finite(a: Tensor) -> bool:
    """Every entry finite, decided by the sum accumulated in float64 (one reduction, which
    holds the sum of any count of finite float32 or half-precision entries); the read is
    deferred while a step speculates, and in the capturable step the condition is one of the
    step's (``torch_port.deferred.holds``): a product that overflows the dtype, which only
    entries near its largest value make (float16 gradients near 6e4), skips the step there
    rather than costing every step the rescaled route's passes."""
    return deferred.holds(torch.isfinite(a.sum(dtype=torch.float64)))


def _power_of_two_scale(a: Tensor) -> Tensor:
    """Per matrix of a (n, d, r) batch, the power of two 2^e ≤ max|A| < 2^{e+1} (1 for a zero
    matrix): representable in A's dtype, and dividing by it is exact and brings the entries
    into [−2, 2]."""
    top = linalg.max_abs(a)[:, None, None]
    e = linalg.binary_exponent(torch.where(top > 0, top, torch.ones_like(top)))
    return torch.ldexp(torch.ones_like(top), e - 1)


def _check_representable(what: str, out: Tensor, source: Tensor) -> None:
    if not deferred.holds(torch.isfinite(out).all()):
        raise ValueError(
            f"{what} of this frame is not representable in {out.dtype} (largest |entry| of its "
            f"input {float(linalg.max_abs(source).max()):.3e})"
        )


def _nobody() -> None:
    """The holder of a work buffer that no lazy product holds (a dead reference)."""
    return None


class LazyProduct:
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
