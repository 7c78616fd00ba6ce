"""A zoo of small, honest Stiefel optimizers: one clean member per rule of ``reference.optim`` and
members that carry exactly ONE deliberate fault each, the negative controls of a conformance suite.

Every public factory has the contract ``factory(params) -> torch.optim.Optimizer``. A parameter
is a Stiefel frame of shape (d, r), or a batch of frames (..., d, r) (one frame per trailing d×r
matrix), float64 or float32; everything is computed in the parameter's dtype. The optimizers:

- read every hyperparameter from ``group[...]`` at every step (every group has "lr" and
  "weight_decay", default λ = 0.0), so a harness may change them after construction;
- skip a parameter whose ``.grad`` is None (point and state unchanged);
- keep their state as tensors and ints in ``self.state[p]``, replaced (never updated in place), so
  ``state_dict()``/``load_state_dict()`` round-trip and a resumed run is bitwise identical even
  when the loaded state aliases the saved one;
- work under ``torch.no_grad()``;
- at lr = 0 leave the point bit-for-bit unchanged (no retraction), while the moments are still
  updated (as torch's Adam does) and transported to the (unchanged) point.

The clean rules are those of ``reference.optim`` (DESIGN §4.0, §5), embedded metric, with the
Riemannian gradient P_W(Z) = Z − W sym(WᵀZ), sym(A) = (A + Aᵀ)/2, and the polar retraction
polar(A) = A (AᵀA)^{-1/2} with the Gram AᵀA actually formed (eigh of the r×r Gram, after dividing
A by its largest entry as ``reference.linalg.polar`` does; the SVD when κ(A) > 10):

- adam (``riemannian_adam(lr, moment="frame", reduction="mean")``): g = P_W(G + λW) (coupled
  decay, which P_W removes); m ← β1·m + (1 − β1)·g; √v ← hypot(√β2·√v, √(1 − β2)·RMS(g)), i.e.
  √v = sqrt(β2·v + (1 − β2)·mean(g²)), ONE scalar per frame (stored, shape (...,)), RMS(g) formed
  as s·RMS(g/s) with s = max|g|; m̂ = m/(1 − β1^t), √v̂ = √v/sqrt(1 − β2^t);
  ξ = −lr·m̂/(√v̂ + ε) (0/0 := 0); W ← polar(W + ξ); m ← P_{W_new}(m).
- rsgd (``rsgd(lr)``): ξ = −lr·P_W(G + λW); W ← polar(W + ξ).
- momentum (``riemannian_momentum(lr, beta, c)``): M ← β·M + (1 − β)·g;
  ξ = −lr·M/max(‖M‖_F, c) per frame; W ← polar(W + ξ); M ← P_{W_new}(M).
- adam with fused decay (``riemannian_adam(lr, weight_decay=λ, decay="fused")``): g = P_W(G) (no
  coupled term), W ← polar((1 − lr·λ)W + ξ) (needs lr·λ < 1).

``MEMBERS`` lists every factory with its clean counterpart, its one-line fault and the weight
decay its fault needs to show.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

RULES = ("adam", "rsgd", "momentum")
FAULTS = (
    "raw_gradient",
    "bias_correction_off_by_one",
    "halved_gradient",
    "skipped_transport",
    "drifting_retraction",
    "elementwise_moment",
    "decay_on_frames",
    "decay_does_nothing",
)
#: Which rule each fault may be applied to.
_FAULT_RULES = {
    "raw_gradient": ("adam", "rsgd"),
    "bias_correction_off_by_one": ("adam",),
    "halved_gradient": ("rsgd",),
    "skipped_transport": ("momentum",),
    "drifting_retraction": ("rsgd",),
    "elementwise_moment": ("adam",),
    "decay_on_frames": ("adam",),
    "decay_does_nothing": ("adam",),
}
#: Above this condition number of W + ξ the polar factor is taken through the SVD (as reference).
_POLAR_GRAM_MAX_COND = 10.0


# -- linear algebra on the trailing d×r matrices ------------------------------------------------
def _t(a: torch.Tensor) -> torch.Tensor:
    return a.transpose(-1, -2)


def _sym(a: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a + _t(a))


def _proj(w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """P_W(Z) = Z − W sym(WᵀZ), per frame."""
    return z - w @ _sym(_t(w) @ z)


def _polar(a: torch.Tensor) -> torch.Tensor:
    """A (AᵀA)^{-1/2} per frame, with the Gram actually formed (``reference.linalg.polar``)."""
    scale = a.abs().amax(dim=(-2, -1), keepdim=True)
    if not bool(torch.isfinite(scale).all()):
        raise ValueError("polar factor of a matrix with non-finite entries")
    if bool((scale == 0).any()):
        raise ValueError("polar factor of a rank-deficient matrix: the matrix is zero")
    a = a / scale
    lam, q = torch.linalg.eigh(_sym(_t(a) @ a))
    lo, hi = lam[..., 0], lam[..., -1]
    if bool((lo <= torch.finfo(a.dtype).eps * hi * a.shape[-2]).any()):
        raise ValueError("polar factor of a rank-deficient matrix")
    if bool((hi > _POLAR_GRAM_MAX_COND**2 * lo).any()):
        u, _, vh = torch.linalg.svd(a, full_matrices=False)
        return u @ vh
    return a @ ((q / torch.sqrt(lam).unsqueeze(-2)) @ _t(q))


def _frame_rms(g: torch.Tensor) -> torch.Tensor:
    """Per-frame RMS, s·sqrt(mean((g/s)²)) with s = max|g| (0 for a zero frame); shape (...,)."""
    s = g.abs().amax(dim=(-2, -1))
    safe = torch.where(s > 0, s, torch.ones_like(s))
    v = g / safe[..., None, None]
    k = g.shape[-2] * g.shape[-1]
    rms = s * (torch.sqrt((v * v).sum(dim=(-2, -1))) / math.sqrt(k))
    return torch.where(s > 0, rms, torch.zeros_like(s))


def _ratio(num: torch.Tensor | float, den: torch.Tensor) -> torch.Tensor:
    """num/den with 0/0 := 0 (a zero gradient gives a zero step)."""
    num = torch.as_tensor(num, dtype=den.dtype, device=den.device)
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, num / safe, torch.zeros_like(num / safe))


# -- the shared implementation ------------------------------------------------------------------
class _StiefelRule(torch.optim.Optimizer):
    """One Stiefel rule (``rule`` in ``RULES``) with at most one deliberate ``fault``.

    ``decay`` is "coupled" (λW added to the Euclidean gradient, removed by P_W) or "fused"
    (W ← polar((1 − lr·λ)W + ξ), adam only). The hyperparameters live in the param groups.
    """

    def __init__(
        self,
        params: Iterable[Any],
        rule: str,
        fault: str | None = None,
        decay: str = "coupled",
        **defaults: Any,
    ):
        if rule not in RULES:
            raise ValueError(f"unknown rule {rule!r}; choose one of {RULES}")
        if fault is not None and rule not in _FAULT_RULES.get(fault, ()):
            raise ValueError(f"fault {fault!r} is not defined for rule {rule!r}")
        if decay not in ("coupled", "fused") or (decay == "fused" and rule != "adam"):
            raise ValueError(f"decay {decay!r} is not defined for rule {rule!r}")
        defaults.setdefault("lr", 1e-2)
        defaults.setdefault("weight_decay", 0.0)
        if defaults["lr"] < 0 or defaults["weight_decay"] < 0:
            raise ValueError("lr and weight_decay must be ≥ 0")
        self.rule, self.fault, self.decay = rule, fault, decay
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2 or p.shape[-2] < p.shape[-1] or not p.is_floating_point():
                    raise ValueError(
                        f"a Stiefel parameter is a float tensor (..., d, r) with r ≤ d, "
                        f"got {tuple(p.shape)} {p.dtype}"
                    )

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("sparse gradients are not supported")
                p.copy_(self._update(p, p.grad, group))
        return loss

    # The state is replaced, never updated in place: load_state_dict may alias the saved tensors.
    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> torch.Tensor:
        lr, lam = float(group["lr"]), float(group["weight_decay"])
        fault, rule = self.fault, self.rule
        w = p.detach().clone()
        egrad = grad.detach().to(w.dtype)
        state = self.state[p]
        if not state:
            self._init_state(state, w)

        if self.decay == "fused" and lr * lam >= 1.0:
            raise ValueError(f"fused decay needs lr·λ < 1, got {lr * lam}")
        # Coupled decay: λW added to the Euclidean gradient (the rgrad of (λ/2)‖W‖², zero on
        # the manifold). "fused" decay acts in the retraction instead (the reference adds no
        # coupled term then), and the member that ignores λ adds nothing either.
        if self.decay == "coupled" and fault != "decay_does_nothing" and lam != 0.0:
            egrad = egrad + lam * w
        g = egrad if fault == "raw_gradient" else _proj(w, egrad)
        if fault == "halved_gradient":
            g = g / 2

        if rule == "rsgd":
            xi = -lr * g
        elif rule == "momentum":
            beta, c = float(group["beta"]), float(group["c"])
            buf = beta * state["momentum_buffer"] + (1.0 - beta) * g
            norm = torch.linalg.matrix_norm(buf)  # Frobenius, per frame
            den = torch.clamp(norm, min=c)
            xi = -lr * (buf * (1.0 / den)[..., None, None])
        else:
            xi, buf = self._adam_step(w, g, state, group, lr)

        w_new = self._move(w, xi, lr, lam)

        if rule != "rsgd":
            # Transport by projection onto the new point; the ambient (raw-gradient) adam keeps
            # its moment in R^{d×r}, where the transport is the identity.
            if fault not in ("skipped_transport", "raw_gradient"):
                buf = _proj(w_new, buf)
            state["exp_avg" if rule == "adam" else "momentum_buffer"] = buf
        state["step"] = int(state["step"]) + 1
        return w_new

    def _init_state(self, state: dict, w: torch.Tensor) -> None:
        state["step"] = 0
        if self.rule == "momentum":
            state["momentum_buffer"] = torch.zeros_like(w)
        elif self.rule == "adam":
            state["exp_avg"] = torch.zeros_like(w)
            if self.fault == "elementwise_moment":
                state["sqrt_v"] = torch.zeros_like(w)
            else:
                state["sqrt_v"] = torch.zeros(w.shape[:-2], dtype=w.dtype, device=w.device)

    def _adam_step(
        self, w: torch.Tensor, g: torch.Tensor, state: dict, group: dict, lr: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b1, b2 = (float(b) for b in group["betas"])
        eps = float(group["eps"])
        t = int(state["step"]) + 1
        if self.fault == "bias_correction_off_by_one":
            t_corr = t + 1
        else:
            t_corr = t
        c1, c2 = 1.0 - b1**t_corr, math.sqrt(1.0 - b2**t_corr)
        rb2, r1mb2 = math.sqrt(b2), math.sqrt(1.0 - b2)
        m = b1 * state["exp_avg"] + (1.0 - b1) * g
        if self.fault == "elementwise_moment":
            sqrt_v = torch.hypot(rb2 * state["sqrt_v"], r1mb2 * g.abs())
            direction = _proj(w, _ratio(m / c1, sqrt_v / c2 + eps))
        else:
            sqrt_v = torch.hypot(rb2 * state["sqrt_v"], r1mb2 * _frame_rms(g))
            q = _ratio(1.0 / c1, sqrt_v / c2 + eps)
            direction = m * q[..., None, None]
        state["sqrt_v"] = sqrt_v
        return -lr * direction, m

    def _move(self, w: torch.Tensor, xi: torch.Tensor, lr: float, lam: float) -> torch.Tensor:
        """The new point; the point itself when lr = 0 (bit for bit)."""
        if lr == 0.0:
            return w
        if self.fault == "drifting_retraction":
            # (W + ξ)(I − ½ξᵀξ): the first terms of (I + ξᵀξ)^{-1/2}, assuming WᵀW = I.
            eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
            return (w + xi) @ (eye - 0.5 * (_t(xi) @ xi))
        base = w
        if self.decay == "fused" and self.fault != "decay_does_nothing" and lam != 0.0:
            base = (1.0 - lr * lam) * w
        w_new = _polar(base + xi)
        if self.fault == "decay_on_frames" and lam != 0.0:
            w_new = (1.0 - lr * lam) * w_new
        return w_new


def _adam(params: Iterable[Any], fault: str | None = None, decay: str = "coupled", **kw: Any):
    kw.setdefault("lr", 1e-2)
    kw.setdefault("betas", (0.9, 0.999))
    kw.setdefault("eps", 1e-8)
    kw.setdefault("weight_decay", 0.0)
    return _StiefelRule(params, "adam", fault, decay, **kw)


def _rsgd(params: Iterable[Any], fault: str | None = None, **kw: Any):
    kw.setdefault("lr", 1e-2)
    kw.setdefault("weight_decay", 0.0)
    return _StiefelRule(params, "rsgd", fault, **kw)


def _momentum(params: Iterable[Any], fault: str | None = None, **kw: Any):
    kw.setdefault("lr", 1e-2)
    kw.setdefault("beta", 0.9)
    kw.setdefault("c", 1.0)
    kw.setdefault("weight_decay", 0.0)
    return _StiefelRule(params, "momentum", fault, **kw)


# -- clean members -------------------------------------------------------------------------------
def clean_adam(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """Riemannian Adam, no fault: ``reference.optim.riemannian_adam(lr, moment="frame",
    reduction="mean")`` with coupled decay. g = P_W(G + λW); m ← β1·m + (1 − β1)·g;
    √v ← sqrt(β2·v + (1 − β2)·mean(g²)) one scalar per frame; ξ = −lr·m̂/(√v̂ + ε);
    W ← polar(W + ξ); m ← P_{W_new}(m). Defaults lr 1e-2, betas (0.9, 0.999), eps 1e-8, λ 0."""
    return _adam(params, **hyper)


def clean_adam_fused_decay(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """Riemannian Adam with fused decay, no fault: ``riemannian_adam(lr, weight_decay=λ,
    decay="fused")``. g = P_W(G) (no coupled term), the adam direction ξ as ``clean_adam``,
    W ← polar((1 − lr·λ)W + ξ) with λ = group["weight_decay"] (lr·λ < 1, else ValueError);
    m ← P_{W_new}(m). On frames this only inflates the step (RA-5), but it is what it claims."""
    return _adam(params, decay="fused", **hyper)


def clean_rsgd(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """Riemannian SGD, no fault: ``reference.optim.rsgd(lr)`` with coupled decay.
    ξ = −lr·P_W(G + λW); W ← polar(W + ξ). Defaults lr 1e-2, λ 0."""
    return _rsgd(params, **hyper)


def clean_momentum(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """Riemannian momentum, no fault: ``reference.optim.riemannian_momentum(lr, beta, c)``.
    M ← β·M + (1 − β)·P_W(G + λW); ξ = −lr·M/max(‖M‖_F, c) per frame; W ← polar(W + ξ);
    M ← P_{W_new}(M). Defaults lr 1e-2, beta 0.9, c 1.0, λ 0."""
    return _momentum(params, **hyper)


# -- faulty members (one fault each) -------------------------------------------------------------
def raw_gradient_rsgd(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_rsgd`` with ONE fault, the gradient is not projected: ξ = −lr·(G + λW),
    W ← polar(W + ξ) (``reference.optim`` rsgd with ``gradient="euclidean"``)."""
    return _rsgd(params, fault="raw_gradient", **hyper)


def raw_gradient_adam(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_adam`` with ONE fault, the moments are of the unprojected gradient: the Adam
    pipeline runs in the ambient R^{d×r} (``reference.optim`` riemannian_adam with
    ``gradient="euclidean"``): m and the per-frame √v of G + λW, ξ = −lr·m̂/(√v̂ + ε) not
    projected, W ← polar(W + ξ); m is an ambient vector, so its transport is the identity."""
    return _adam(params, fault="raw_gradient", **hyper)


def bias_correction_off_by_one(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_adam`` with ONE fault, the bias corrections use t + 1 instead of t:
    m̂ = m/(1 − β1^(t+1)), √v̂ = √v/sqrt(1 − β2^(t+1))."""
    return _adam(params, fault="bias_correction_off_by_one", **hyper)


def halved_gradient(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_rsgd`` with ONE fault, a factor ½ missing: ξ = −lr·P_W(G + λW)/2."""
    return _rsgd(params, fault="halved_gradient", **hyper)


def skipped_transport(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_momentum`` with ONE fault, M is not transported to the new point: the stored
    M stays tangent at the old point (it leaves the tangent space as the point moves)."""
    return _momentum(params, fault="skipped_transport", **hyper)


def drifting_retraction(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_rsgd`` with ONE fault, the retraction is (W + ξ)(I − ½ξᵀξ), the first terms of
    the closed form (I + ξᵀξ)^{-1/2} that assumes WᵀW = I: an error O(‖ξ‖⁴) per step that is
    never corrected, so the point drifts slowly off the manifold."""
    return _rsgd(params, fault="drifting_retraction", **hyper)


def elementwise_moment(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_adam`` with ONE fault, one √v per ENTRY (state shape (..., d, r)):
    ξ = −lr·P_W(m̂/(√v̂ + ε)) elementwise, projected back to the tangent space before the
    retraction (``riemannian_adam(moment="elementwise")``; breaks O(d)-equivariance)."""
    return _adam(params, fault="elementwise_moment", **hyper)


def decay_on_frames(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_adam`` with ONE fault, decay acting on the frame: after the retraction
    W_new ← (1 − lr·λ)·polar(W + ξ), never re-projected, so the point leaves the manifold
    (shows only for λ > 0; the transport projects onto that scaled point)."""
    return _adam(params, fault="decay_on_frames", **hyper)


def decay_does_nothing(params: Iterable[Any], **hyper: Any) -> torch.optim.Optimizer:
    """``clean_adam_fused_decay`` with ONE fault, it claims fused decay but ignores λ:
    W ← polar(W + ξ) instead of polar((1 − lr·λ)W + ξ) (shows only for λ > 0)."""
    return _adam(params, fault="decay_does_nothing", decay="fused", **hyper)


# -- the table ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Member:
    """One zoo member: its factory, the clean factory it departs from (itself for a clean one),
    its one-line fault (None when clean) and the weight decay its fault needs to show."""

    name: str
    factory: Callable[..., torch.optim.Optimizer]
    clean: str
    fault: str | None
    weight_decay: float = 0.0


MEMBERS: dict[str, Member] = {
    m.name: m
    for m in (
        Member("clean_adam", clean_adam, "clean_adam", None),
        Member("clean_adam_fused_decay", clean_adam_fused_decay, "clean_adam_fused_decay", None),
        Member("clean_rsgd", clean_rsgd, "clean_rsgd", None),
        Member("clean_momentum", clean_momentum, "clean_momentum", None),
        Member("raw_gradient_rsgd", raw_gradient_rsgd, "clean_rsgd", "unprojected gradient step"),
        Member(
            "raw_gradient_adam",
            raw_gradient_adam,
            "clean_adam",
            "moments of the unprojected gradient (ambient Adam, then polar)",
        ),
        Member(
            "bias_correction_off_by_one",
            bias_correction_off_by_one,
            "clean_adam",
            "bias corrections with t + 1 instead of t",
        ),
        Member("halved_gradient", halved_gradient, "clean_rsgd", "gradient halved"),
        Member(
            "skipped_transport", skipped_transport, "clean_momentum", "momentum not transported"
        ),
        Member(
            "drifting_retraction",
            drifting_retraction,
            "clean_rsgd",
            "retraction (W + ξ)(I − ½ξᵀξ), drifts off the manifold",
        ),
        Member(
            "elementwise_moment",
            elementwise_moment,
            "clean_adam",
            "one √v per entry instead of per frame",
        ),
        Member(
            "decay_on_frames",
            decay_on_frames,
            "clean_adam",
            "frame scaled by (1 − lr·λ) after the retraction",
            0.1,
        ),
        Member(
            "decay_does_nothing",
            decay_does_nothing,
            "clean_adam_fused_decay",
            "claims fused decay but ignores λ",
            0.1,
        ),
    )
}
CLEAN = tuple(name for name, m in MEMBERS.items() if m.fault is None)
FAULTY = tuple(name for name, m in MEMBERS.items() if m.fault is not None)
