"""``rattn audit``: replay every recorded step of a training run through ``reference.optim`` in
float64 and compare the point the port reached with the exact one (NumPy only: a trace recorded
with torch is replayed where torch is not installed).

A record (``torch_port.audit``; its schema and reader: ``proofs_checks.audit.trace``) holds, for
one point of one geometry group at one step t, the elements kept (frames of a Stiefel parameter,
points of a factored group's batch), each with its point x before the step, its Euclidean
gradient, the optimizer state before and the point y after, in the port's internal layout and
dtype, plus the hyperparameters in force and how the geometry is built. For every element the
replay

1. builds the reference geometry and the reference optimizer of the recorded rule
   (``PRESETS``: the four presets of ``reference.optim.PRESET_CHAINS`` with every option, on
   the Riemannian or the Euclidean gradient; ``FIELD_RULES``: geoopt's RiemannianAdam and
   RiemannianSGD as ``reference.field_rules`` states them) with the recorded hyperparameters;
2. projects x to its manifold in float64 (the polar factor of each orthonormal factor) and
   reports the distance δ = ‖C(x) − C(x̄)‖, C what is compared (the point, or W = A Bᵀ where the
   factors are defined up to a group action: ``Elements``);
3. converts the port's state to the reference's (``reference_state``: the count t − 1, the
   moments' arrays and √v filled into the layout the reference's ``init`` makes at x̄);
4. takes the reference step ȳ = step(x̄, g, state) and measures e = ‖C(y) − C(ȳ)‖.

The bound e ≤ B of a step in dtype w (unit roundoff u) is, with Δ = ‖C(ȳ) − C(x̄)‖ the length
of the exact step, s = ‖C(ȳ)‖ the size of the point after it and κ the conditioning of the
point (``step_bound``, ``Elements.conditioning``):

    B = L·δ + K·u·(κ·(n + r + 2·log2(n·r))·Δ + (r + 4)·s)

- L·δ: the port stepped from x, the reference from x̄. The step map of every rule here is
  Lipschitz in the point with a constant 1 + O(‖ξ‖) near the manifold (the projection, the
  moments' normalisation and the retraction each change by O(‖ξ‖)·δ; the retractions that end
  in a polar factor remove a normal offset to first order, the others carry it with factor
  ≤ 1 + O(‖ξ‖)); L = 2 covers every step with ‖ξ‖ ≤ 1/2 (a longer step is marked as such).
- The direction ξ is formed with inner products of length ≤ n (the largest matrix dimension:
  the projection's Wᵀ G) and r, and with norms of n·r entries summed pairwise by torch
  (error ≤ log2(n·r)·u, twice: the frame's RMS and the trust-region norm): relative error
  (n + r + 2·log2(n·r))·u of the step. Where the rule solves with the Gram matrix of a factor
  that is not a frame (R2's preconditioned metric, R1's core S), the error of the solve is κ
  times its backward error, κ = max cond(F)² over those factors (1 for frames).
- The retraction rounds the sum x + ξ (u·s), forms a product of inner length r with a factor
  cast to w (r·u·s + u·s), and stores the result in w (u·s); a safety factor K = 4 covers the
  second-order terms (γ_k = k·u/(1 − k·u)) and the float64 parts (Gram, eigendecomposition)
  that are ≥ 2^29 times smaller in float32.

- A Stiefel retraction that factors W + ξ itself in the working dtype (``polar_svd``: its
  SVD; ``qr``: its Householder QR; ``exp``: the exponential of a 2r×2r block and products with
  [W, ξ]) has a backward error of at most p(n, r)·u·‖W + ξ‖, p(n, r) = n·r (Golub & Van Loan,
  4th ed., §5.2, §8.6), which the polar factor (or Q) carries with condition ≤ 2 for
  κ(W + ξ) ≤ sqrt(1 + ‖ξ‖²) ≤ 1.12: 2·p·u·s more. Without it, a float64 step of the SVD route
  was measured at 1.18 times the bound (seed 78 of the Stiefel Brockett problem, momentum).
  The worst-case constant n·r assumes every rounding error of the factorisation adds up with
  the same sign; under the probabilistic model of Higham & Mary (SIAM J. Sci. Comput. 41(5),
  2019, Thm. 2.4: the rounding errors independent with mean zero) a sum of n·r of them stays
  below λ·sqrt(n·r)·u·(1 + O(u)) except with probability 2·exp(−λ²(1 − u)²/2), so
  p = min(n·r, λ·sqrt(n·r)) with λ = ``ROUNDING_LAMBDA`` = 7 (a false alarm at most
  4.6e-11 per step from this term; at St(768, 64), 222 times below n·r).
- For the elementwise moment, κ is at least the entrywise amplification a of
  ``elementwise_amplification`` (its direction is scale-free entry by entry, so a small entry of
  the gradient carries a large relative rounding error into its step), and a·δ is added.

The state is checked too: each recorded step keeps the state after it, and that state is
compared with the reference's after the step, entry by entry (``state_bound``; for the
geometries compared by W, each moment as the tangent matrix it represents:
``in_matrix_form``), so a step whose point is right but whose state is not (a skipped
transport, a wrong moment) is flagged at its step, whatever ``every`` sampled.

The verdict of a row is sound by construction (``verdict``): "pass" only when the bound is at
most ``RESOLUTION`` of the step's own length (or, at lr 0, when the point is unchanged bit for
bit), "fail" when a bound is exceeded, "not auditable" otherwise. A step that the port skipped
(``skip_nonfinite``) passes only when a gradient recorded at that step has a non-finite entry
(``_skipped_verdict``). A run passes when no row fails, none is not auditable and at least one
step was replayed (``overall``).
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import reference as ref
from proofs_checks import reference_rules
from proofs_checks.audit.trace import DTYPES, Trace, load
from reference import field_rules as fr
from reference import optim as ro
from reference.geometry import like, parts

Array = np.ndarray

#: The Lipschitz constant of one step in its starting point, and the safety factor of the
#: rounding terms (module docstring).
LIPSCHITZ = 2.0
SAFETY = 4.0
#: The largest step (Frobenius norm of C(ȳ) − C(x̄)) the Lipschitz constant L covers.
LARGEST_STEP = 0.5


def _roundoff(dtype: str) -> float:
    """u of a recorded dtype ("torch.float32", …: ``trace.DTYPES``)."""
    return DTYPES[dtype].roundoff


def _accepted(dtype: str) -> float:
    """The orthonormality residual ‖FᵀF − I‖ up to which the port accepts a point of this
    dtype as on its manifold (sqrt(ε), ``torch_port.geometry.default_atol``). A recorded point
    beyond it is one the port would have refused: that step fails."""
    return DTYPES[dtype].accepted


class TraceError(ValueError):
    """A trace that cannot be replayed (named, with what is wrong)."""


class MissingState(TraceError):
    """The recorded state lacks an entry the rule needs."""


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


# -- geometries, elements and states -------------------------------------------------------------
@dataclass(frozen=True)
class Elements:
    """How the elements of one record are read, from the reference geometry of one element:
    the number of block groups (0 for a plain point), the factors that are frames, the trailing
    shapes of the point's parts in the port's layout (a block point's groups first: the port
    keeps the ``reference.blocks`` groups stacked), whether the point is a single frame
    (Stiefel), and what is compared: the factors where both sides keep the same ones (a frame;
    P1, whose retraction aligns the new factors to the old; P3), else W = A Bᵀ (the quotients
    R2 and P2, whose factors are defined up to a group action, and R1, whose (U, S, V) represent
    W up to U ↦ UQ, S ↦ QᵀSP, V ↦ VP)."""

    geometry: Any
    n_groups: int
    orthonormal: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    frame: bool
    compares_matrix: bool

    def _sets(self, x: Any) -> list[tuple[Array, ...]]:
        """The factor tuples of x: one per block group; (x,) for a frame."""
        if self.frame:
            return [(x,)]
        return list(x) if self.n_groups else [x]

    def residual(self, x: Any) -> float:
        """max ‖FᵀF − I‖_F over the orthonormal factors F of x (0 when it has none)."""
        frames = [f for s in self._sets(x) for i, f in enumerate(s) if i in self.orthonormal]
        return max(
            (float(np.linalg.norm(f.T @ f - np.eye(f.shape[1]))) for f in frames), default=0.0
        )

    def point(self, arrays: Sequence[Array], e: int) -> Any:
        """Element e of parts kept as (elements, *trailing): a frame, a tuple of factors, or a
        tuple over the block groups of tuples of factors."""
        if self.frame:
            return arrays[0][e]
        if self.n_groups:
            return tuple(tuple(a[e][c] for a in arrays) for c in range(self.n_groups))
        return tuple(a[e] for a in arrays)

    def project(self, x: Any) -> Any:
        """x with each orthonormal factor replaced by its polar factor (float64)."""
        if self.frame:
            return ref.linalg.polar(x)

        def one(factors: tuple) -> tuple:
            return tuple(
                ref.linalg.polar(f) if i in self.orthonormal else f for i, f in enumerate(factors)
            )

        return tuple(one(s) for s in x) if self.n_groups else one(x)

    def compared(self, x: Any) -> Array:
        """C(x): W of every group, or the factors, as one vector (class docstring)."""
        if self.compares_matrix:
            w = self.geometry.to_matrix(x)
            return np.concatenate([np.ravel(a) for a in (w if isinstance(w, tuple) else (w,))])
        return np.concatenate([np.ravel(f) for s in self._sets(x) for f in s])

    def conditioning(self, x: Any) -> float:
        """κ = max over the factors that are not frames (S of R1, A and B of R2) of cond(F)²,
        the condition number of their Gram matrices FᵀF, which the Riemannian gradient, the
        projections and the transports solve with (1 for points made of frames only)."""
        kappa = 1.0
        for factors in self._sets(x):
            for i, f in enumerate(factors):
                if i not in self.orthonormal:
                    sv = np.linalg.svd(f, compute_uv=False)
                    kappa = max(kappa, float(sv[0] / sv[-1]) ** 2 if sv[-1] > 0 else math.inf)
        return kappa


def elements(spec: dict[str, Any]) -> Elements:
    """The ``Elements`` of a recorded geometry (name, sizes, options), read from the reference
    geometry of one element (``tests/test_audit.py`` checks that the port's layout is the
    reference's for each of the ten)."""
    name, sizes, options = spec["name"], spec["sizes"], dict(spec["options"])
    if name == "stiefel":
        geometry = ref.Stiefel(sizes["d"], sizes["r"], **options)
        return Elements(geometry, 0, (0,), ((sizes["d"], sizes["r"]),), True, False)
    if name not in ref.GEOMETRIES:
        raise TraceError(f"unknown geometry {name!r} in the trace")
    if options.get("pattern") is not None:
        options["pattern"] = tuple(tuple(e) for e in options["pattern"])
    geometry = ref.GEOMETRIES[name](sizes["m"], sizes["n"], sizes["r"], **options)
    compares_matrix = name.endswith(("_quotient", "fixed_rank_embedded"))
    if not name.startswith("block_"):
        shapes = tuple(geometry.point_shapes)
        return Elements(geometry, 0, geometry.orthonormal_factors, shapes, False, compares_matrix)
    bases = geometry.factors
    if len({b.point_shapes for b in bases}) != 1:
        raise TraceError(f"{name}: its groups differ in shape, which the port does not stack")
    shapes = tuple((len(bases), *s) for s in bases[0].point_shapes)
    return Elements(
        geometry, len(bases), bases[0].orthonormal_factors, shapes, False, compares_matrix
    )


def reference_state(
    template: Any, entries: dict[str, list[Any]], count: int, *, as_recorded: bool = False
) -> Any:
    """The port's state entries of one element (``entries``: key -> its arrays, group-major for
    a block point) in the layout of ``template``, the state the reference's ``init`` makes: an
    ``AdamState`` takes the count, "exp_avg" and "sqrt_v", a ``TraceState`` "momentum_buffer";
    each is checked to fill its field exactly (shapes and number of leaves). geoopt's states
    (``reference.field_rules``) take "exp_avg", "exp_avg_sq" and "max_exp_avg_sq", or
    "momentum_buffer"; its second moments, one value per frame kept broadcast over the
    frame's entries (which a vectorised update may round differently), enter a step as their
    mean and are compared ``as_recorded``, entry by entry."""

    def recorded(key: str) -> list[Any]:
        if key not in entries:
            raise MissingState(f"the recorded state has no {key!r}")
        return entries[key]

    def fill(field: Any, key: str) -> Any:
        values = recorded(key)
        if isinstance(field, tuple) and all(isinstance(v, float) for v in field):  # √v per frame
            flat = np.concatenate([np.ravel(v) for v in values])
            if len(flat) != len(field):
                raise TraceError(f"state {key!r}: {len(flat)} values for {len(field)} frames")
            return tuple(float(v) for v in flat)
        leaves = parts(field)
        if len(leaves) != len(values) or any(
            np.shape(a) != np.shape(b) for a, b in zip(leaves, values, strict=True)
        ):
            raise TraceError(
                f"state {key!r}: shapes {[np.shape(v) for v in values]} do not fit the "
                f"reference's {[np.shape(a) for a in leaves]}"
            )
        return like(field, list(values)) if isinstance(field, tuple) else values[0]

    def per_frame(key: str) -> Any:
        """geoopt's second moment: one value per frame, kept broadcast over its entries."""
        a = np.asarray(recorded(key)[0])
        return a if as_recorded else float(np.mean(a))

    def build(t: Any) -> Any:
        if isinstance(t, fr.AdamState):
            amsgrad = "max_exp_avg_sq" in entries
            v_max = per_frame("max_exp_avg_sq") if amsgrad else 0.0
            return fr.AdamState(count, fill(t.m, "exp_avg"), per_frame("exp_avg_sq"), v_max)
        if isinstance(t, fr.MomentumState):  # geoopt seeds the buffer at its first step
            buffer = entries.get("momentum_buffer")
            return fr.MomentumState(
                count if buffer else 0, np.asarray(buffer[0]) if buffer else None
            )
        if isinstance(t, ro.AdamState):
            return ro.AdamState(count, fill(t.m, "exp_avg"), fill(t.sqrt_v, "sqrt_v"))
        if isinstance(t, ro.TraceState):
            return ro.TraceState(fill(t.m, "momentum_buffer"))
        if isinstance(t, tuple):
            return tuple(build(s) for s in t)
        return t

    return template if count == 0 else build(template)


#: Stiefel retractions that factor the d×r matrix W + ξ itself in the working dtype.
FACTORING_RETRACTIONS = ("polar_svd", "qr", "exp")
#: λ of the probabilistic rounding bound of a factorisation (module docstring).
ROUNDING_LAMBDA = 7.0


def factoring_constant(n: int, r: int) -> float:
    """p = min(n·r, λ·sqrt(n·r)): the backward error of factoring an n×r matrix, in units of
    u·‖W + ξ‖, worst case or (the smaller, for n·r > λ² = 49) under the probabilistic model."""
    return min(n * r, ROUNDING_LAMBDA * math.sqrt(n * r))


def step_bound(
    dtype: str,
    delta: float,
    step: float,
    size: float,
    n: int,
    r: int,
    kappa: float = 1.0,
    factoring: bool = False,
) -> float:
    """B = L·δ + K·u·(κ·(n + r + 2·log2(n·r))·Δ + (r + 4)·s) (module docstring), plus
    2·p·u·s for a retraction that factors W + ξ itself (``factoring``; p:
    ``factoring_constant``)."""
    u = _roundoff(dtype)
    inner = n + r + 2.0 * math.log2(n * r)
    factored = 2 * factoring_constant(n, r) * u * size if factoring else 0.0
    return LIPSCHITZ * delta + SAFETY * u * (kappa * inner * step + (r + 4) * size) + factored


def elementwise_amplification(
    geometry: Any,
    x: Any,
    g: Any,
    lr: float,
    t: int,
    b2: float,
    length: float,
    n: int,
    r: int,
    dtype: str,
) -> float:
    """The amplification a of the direction's relative error for ``moment="elementwise"``.

    That direction is m̂_ij/(√v̂_ij + ε) entry by entry, of degree zero in each entry's own
    history, so a relative error ε_ij of the entry ḡ_ij of this step's Riemannian gradient moves
    it by at most 2ρ_t·ε_ij (ρ_t = ``bounds.adam_ratio_bound``). Rounding bounds the entries'
    absolute errors relative to ‖ḡ‖, not to each entry: |δḡ_ij| ≤ (n + r)·u·‖ḡ‖, so
    ε_ij ≤ (n + r)·u·‖ḡ‖/|ḡ_ij| (at most 1 where the entry is itself at that level, τ). The
    step, lr times the (non-expansively projected) direction, then errs by
    lr·2ρ_t·(n + r)·u·‖ḡ‖·sqrt(Σ_ij 1/max(|ḡ_ij|, τ)²), which is a·(n + r)·u·Δ with
    a = 2ρ_t·lr·‖ḡ‖·sqrt(Σ_ij 1/max(|ḡ_ij|, τ)²)/Δ. A point off by δ changes ḡ's entries by
    ≤ 2δ‖G‖ likewise, hence the a·δ term of the bound (Δ ≤ 1/2)."""
    from proofs_checks.bounds import adam_ratio_bound
    from reference.geometry import parts

    if length == 0.0:
        return 0.0
    rg = np.concatenate([np.ravel(a) for a in parts(geometry.egrad_to_rgrad(x, g))])
    norm = float(np.linalg.norm(rg))
    if norm == 0.0:
        return 0.0
    tau = (n + r) * _roundoff(dtype) * norm
    total = float(np.sqrt(np.sum(1.0 / np.maximum(np.abs(rg), tau) ** 2)))
    return 2 * adam_ratio_bound(t, b2) * lr * norm * total / length


def _dims(spec: dict[str, Any]) -> tuple[int, int]:
    """(n, r): the largest matrix dimension and the rank of one element."""
    s = spec["sizes"]
    r = s["r"]
    o = spec["options"]
    if spec["name"] == "stiefel":
        return s["d"], r
    heads = max(o.get("n_heads", 1), o.get("n_kv_heads", 1)) if "n_heads" in o else 1
    return max(s["m"], s["n"]) * heads, r


# -- the replay -----------------------------------------------------------------------------------
def state_leaves(state: Any) -> list[tuple[str, Any]]:
    """(field, value) of every number and array of a reference state, in order: the count, then
    each moment's arrays and √v's values."""
    out: list[tuple[str, Any]] = []
    if isinstance(state, ro.AdamState):
        out.append(("count", state.count))
        out += [("exp_avg", a) for a in parts(state.m)]
        out += [("sqrt_v", v) for v in parts(state.sqrt_v)]
    elif isinstance(state, ro.TraceState):
        out += [("momentum_buffer", a) for a in parts(state.m)]
    elif isinstance(state, fr.AdamState):  # geoopt's names
        out += [("count", state.count), ("exp_avg", state.m), ("exp_avg_sq", state.v)]
        out.append(("max_exp_avg_sq", state.v_max))
    elif isinstance(state, fr.MomentumState):  # geoopt counts SGD's steps per group, not here
        out += [("momentum_buffer", state.buffer)] if state.buffer is not None else []
    elif isinstance(state, tuple):
        for s in state:
            out += state_leaves(s)
    return out


def in_matrix_form(state: Any, geometry: Any, point: Any) -> Any:
    """The state with each moment as the ambient matrix it represents at ``point``
    (``tangent_to_matrix``) and per-entry √v left out: for the geometries compared by W, whose
    factors after a step are fixed only up to the group (R1's SVD chooses them), so that a
    moment's factor coordinates differ between two representations of one point while the
    tangent matrix does not; the per-frame √v (a metric norm) needs no change."""
    if isinstance(state, ro.AdamState):
        scalar = all(isinstance(v, float) for v in state.sqrt_v)
        return state._replace(
            m=geometry.tangent_to_matrix(point, state.m),
            sqrt_v=state.sqrt_v if scalar else (),
        )
    if isinstance(state, ro.TraceState):
        return ro.TraceState(geometry.tangent_to_matrix(point, state.m))
    if isinstance(state, tuple):
        return tuple(in_matrix_form(s, geometry, point) for s in state)
    return state


def state_bound(
    dtype: str, delta: float, deviation: float, size: float, n: int, r: int, kappa: float = 1.0
) -> float:
    """B_s = (2·(e + L·δ) + K·u·κ·(n + r + 2·log2(n·r)))·‖s̄‖ for a state entry s̄ of the
    reference after the step (the moment transported to ȳ, or √v): the port's entry was formed
    at x and transported to y, the reference's at x̄ and to ȳ; the projection P_y differs from
    P_ȳ by ≤ 2‖y − ȳ‖ (e, measured) and the new moment by ≤ 2·L·δ relative (its gradient was
    projected at x, not x̄); the rounding is that of the direction (``step_bound``)."""
    u = _roundoff(dtype)
    inner = n + r + 2.0 * math.log2(n * r)
    return (2.0 * (deviation + LIPSCHITZ * delta) + SAFETY * u * kappa * inner) * size


def state_deviation(
    recorded: Any,
    expected: Any,
    dtype: str,
    delta: float,
    deviation: float,
    n: int,
    r: int,
    kappa: float = 1.0,
) -> tuple[float, float, str | None]:
    """(the largest ratio deviation/bound over the entries, that entry's deviation, its name)
    between the state recorded before a step and the reference's after the step before; each
    entry (all parts of a moment) is taken whole; the counts must agree exactly (a bound of
    1/2)."""
    got: dict[str, list[Array]] = {}
    want: dict[str, list[Array]] = {}
    leaves, wanted = state_leaves(recorded), state_leaves(expected)
    if [name for name, _ in leaves] != [name for name, _ in wanted]:
        return math.inf, math.inf, f"entries {[n for n, _ in leaves]}, not the rule's"
    for (name, a), (_, b) in zip(leaves, wanted, strict=True):
        if name == "count":
            if a != b:  # counts agree exactly: a bound of 1/2 on |Δcount|
                return 2.0 * abs(a - b), float(abs(a - b)), "count"
            continue
        if np.ndim(b) == 0 and np.ndim(a) > 0:  # one value per frame, recorded broadcast
            b = np.full(np.shape(a), b)
        got.setdefault(name, []).append(np.ravel(a))
        want.setdefault(name, []).append(np.ravel(b))
    worst: tuple[float, float, str | None] = (0.0, 0.0, None)
    for name in want:
        a, b = np.concatenate(got[name]), np.concatenate(want[name])
        dev = float(np.linalg.norm(a - b))
        bound = state_bound(dtype, delta, deviation, float(np.linalg.norm(b)), n, r, kappa)
        ratio = dev / bound if bound > 0 else (0.0 if dev == 0 else math.inf)
        if ratio > worst[0] or worst[2] is None:
            worst = (ratio, dev, name)
    return worst


def replay_record(trace: Trace, k: int, claim: Claim | None = None) -> list[dict[str, Any]]:
    """Every kept element of record k: deviation, bound, the state after the step against the
    reference's, and the row's verdict (module docstring); against ``claim`` when given."""
    step = trace.meta["steps"][k]
    where = f"step {step['step']}, group {step['group']}"
    try:
        return _replay_record(trace, k, where, claim)
    except TraceError:
        raise
    except (
        KeyError,
        TypeError,
        ValueError,
        IndexError,
        OverflowError,
        np.linalg.LinAlgError,
    ) as err:
        raise TraceError(f"{where}: cannot be replayed ({type(err).__name__}: {err})") from None


def _replay_record(trace: Trace, k: int, where: str, claim: Claim | None) -> list[dict[str, Any]]:
    meta = trace.meta
    optimizer, step = meta["optimizer"], meta["steps"][k]
    if claim is not None:
        optimizer, step = claim.applied(step)
    spec = step["geometry"]
    try:
        el = elements(spec)
        x_parts, g_parts = _float64(trace.parts(k, "x")), _float64(trace.parts(k, "g"))
        y_parts = _float64(trace.parts(k, "y")) if step["taken"] else None
        state = {key: _float64(trace.parts(k, f"state/{key}")) for key in step["state_keys"]}
        after = {key: _float64(trace.parts(k, f"after/{key}")) for key in step["after_keys"]}
    except (KeyError, TypeError) as err:
        message = f"{where}: the record is incomplete ({type(err).__name__}: {err})"
        raise TraceError(message) from None
    for what, arrays in (("x", x_parts), ("g", g_parts), ("y", y_parts or x_parts)):
        got = tuple(a.shape[1:] for a in arrays)
        if got != el.shapes:
            raise TraceError(
                f"{where}: {what} has parts of shapes {list(got)}; a {spec['name']} point of "
                f"these sizes has {list(el.shapes)}"
            )
    opt = reference_optimizer(optimizer, step, el.geometry)
    # an optimizer that is neither the library's nor geoopt's keeps its state under its own
    # names (``FramesSource``): what the claimed rule needs and it lacks is not checked
    unmapped = meta["optimizer"] not in RECORDED_AS.values()
    dtype = step["dtypes"][0]  # one of ``trace.DTYPES``: ``check_trace`` refused others
    n, r = _dims(spec)
    h = step["hyperparameters"]
    rows = []
    for j, e in enumerate(step["elements"]):
        x = el.point(x_parts, j)
        g = el.point(g_parts, j)
        if optimizer in FIELD_RULES and y_parts is not None:
            g = g - h.get("weight_decay", 0.0) * x  # geoopt added λX to it in place
        row: dict[str, Any] = {
            "step": step["step"],
            "group": step["group"],
            "names": step["names"],
            "params": step["params"],
            "element": e,
            "geometry": spec["name"],
            "dtype": dtype,
            "skipped": y_parts is None,
            "deviation": None,
            "bound": None,
            "state_deviation": None,
            "state_ratio": None,
        }
        residual = el.residual(x)
        accepted = residual <= _accepted(dtype)
        row.update(residual=residual, accepted=accepted)
        if y_parts is None:  # skipped by the port: right only for a non-finite gradient
            rows.append({**row, **_skipped_verdict(trace, step, el, g)})
            continue
        xp = el.project(x)
        delta = float(np.linalg.norm(el.compared(x) - el.compared(xp)))
        template = opt.init(el.geometry, xp)
        entries = {key: _element_entries(el, v, j) for key, v in state.items()}
        try:
            st = reference_state(template, entries, step["step"] - 1)
        except (TypeError, ValueError) as err:  # MissingState included
            if claim is None:
                raise TraceError(f"{where}, element {e}: {err}") from None
            if unmapped and isinstance(err, MissingState):  # nothing is claimed without it
                rows.append({**row, **_said("not auditable", f"not checked: {err}")})
            else:
                rows.append({**row, **_said("fail", f"the state is not the claimed rule's: {err}")})
            continue
        try:
            y_ref, new_state = opt.step(el.geometry, xp, g, st)
        except (TypeError, ValueError) as err:
            message = f"{where}, element {e}: the reference cannot take this step: {err}"
            raise TraceError(message) from None
        y = el.point(y_parts, j)
        c_ref, c_x = el.compared(y_ref), el.compared(xp)
        error = el.compared(y) - c_ref
        deviation = float(np.linalg.norm(error))
        length = float(np.linalg.norm(c_ref - c_x))
        # the deviation's component along the exact step, relative to it: a step taken with
        # (1 + δ) times the rule's lr has δ here, to first order in the step
        along = float(error @ (c_ref - c_x)) / length**2 if length > 0 else None
        kappa = max(el.conditioning(xp), el.conditioning(y_ref))
        amplification = 0.0
        if h.get("moment") == "elementwise":
            amplification = elementwise_amplification(
                el.geometry, xp, g, h["lr"], step["step"], h["betas"][1], length, n, r, dtype
            )
        factoring = optimizer in FIELD_RULES or (  # geoopt: Cayley's solve or QR
            spec["name"] == "stiefel"
            and spec["options"].get("retraction", "polar") in FACTORING_RETRACTIONS
        )
        size = float(np.linalg.norm(c_ref))
        kappa_step = max(kappa, amplification)
        bound = step_bound(dtype, delta, length, size, n, r, kappa_step, factoring)
        bound += amplification * delta
        state_ratio, state_dev, state_entry, unchecked = None, None, None, None
        if deviation <= bound:  # else the row fails by its point (y may not even be one)
            yp = el.project(y)
            entries = {key: _element_entries(el, v, j) for key, v in after.items()}
            try:
                recorded = reference_state(new_state, entries, step["step"], as_recorded=True)
            except MissingState as err:
                if not unmapped:
                    message = f"{where}, element {e}, the state after the step: {err}"
                    raise TraceError(message) from None
                recorded, unchecked = None, f"the state was not checked: {err}"
            except (TypeError, ValueError) as err:
                message = f"{where}, element {e}, the state after the step: {err}"
                raise TraceError(message) from None
            if recorded is not None:
                expected = new_state
                if el.compares_matrix:
                    recorded = in_matrix_form(recorded, el.geometry, yp)
                    expected = in_matrix_form(new_state, el.geometry, y_ref)
                kappa_state = max(kappa, el.conditioning(yp))
                state_ratio, state_dev, state_entry = state_deviation(
                    recorded, expected, dtype, delta, deviation, n, r, kappa_state
                )
        row.update(
            projection=delta,
            conditioning=kappa,
            step_length=length,
            deviation=deviation,
            along=along,
            bound=bound,
            bounded=length <= LARGEST_STEP,
            state_deviation=state_dev,
            state_ratio=state_ratio,
            state_entry=state_entry,
            unchecked=unchecked,
        )
        # at lr 0 the port leaves the point as it is; another library may round it (geoopt's
        # QR retraction re-factors x), which the bound, checked first, covers
        still = optimizer in FIELD_RULES or all(
            np.array_equal(a[j], b[j]) for a, b in zip(x_parts, y_parts, strict=True)
        )
        row.update(verdict(row, lr_zero=h["lr"] == 0, unchanged=still))
        rows.append(row)
    return rows


#: The resolution a passing row must have: its bound at most this fraction of its own step's
#: length, so that a pass excludes every departure larger than a tenth of the step (a step
#: not taken, a learning rate off by more than 10%, a step of the wrong direction).
RESOLUTION = 0.1

VERDICTS = ("pass", "fail", "not auditable")


def verdict(row: dict[str, Any], *, lr_zero: bool, unchanged: bool) -> dict[str, Any]:
    """The verdict of a replayed row, sound by construction: "fail" when the point was one the
    port refuses, the deviation (or the state's) exceeds its bound or is not finite; "pass"
    only when the check can tell a wrong step from a right one: at lr 0 the point is unchanged
    (``unchanged``: bit for bit for the port, whose R_x(0) = x; within the bound for another
    library's rule, whose retraction may round x), otherwise the bound is at most
    ``RESOLUTION`` of the step's length Δ and the step is one the bound covers
    (Δ ≤ ``LARGEST_STEP``); every other row is "not auditable", with the reason."""
    dev, bound, state = row["deviation"], row["bound"], row["state_ratio"]
    if not row["accepted"]:
        return _said("fail", f"the point is off its manifold by {row['residual']:.1e}")
    if not (math.isfinite(dev) and math.isfinite(bound)) or dev > bound:
        return _said("fail", "the point after the step departs from the rule's")
    if row.get("unchecked") is None and not state <= 1.0:  # NaN included
        return _said(
            "fail", f"the state after the step departs from the rule's ({row['state_entry']})"
        )
    if lr_zero:
        if unchanged:
            return _said("pass", "lr 0: the point is unchanged")
        return _said("fail", "lr 0, but the point changed")
    if not row["bounded"]:
        return _said("not auditable", f"a step longer than {LARGEST_STEP:g}")
    if bound > RESOLUTION * row["step_length"]:
        ratio = bound / row["step_length"] if row["step_length"] else math.inf
        return _said(
            "not auditable", f"the bound is {ratio:.2g} of the step (a pass needs ≤ {RESOLUTION:g})"
        )
    return _said("pass", row.get("unchecked"))


def _said(what: str, reason: str | None) -> dict[str, Any]:
    return {"verdict": what, "passed": what == "pass", "reason": reason}


def _skipped_verdict(trace: Trace, step: dict[str, Any], el: Elements, g: Any) -> dict:
    """A step the port skipped (``skip_nonfinite``) is right only for a non-finite gradient:
    "pass" when one of the gradients recorded at this step has a non-finite entry, "fail" when
    every gradient of the step is finite (the trace says none was not), "not auditable" when
    the trace says a gradient it did not keep was not finite."""
    if not all(np.isfinite(a).all() for a in parts(g)):
        return _said("pass", "skipped: its gradient is not finite")
    same = [k for k, s in enumerate(trace.meta["steps"]) if s["step"] == step["step"]]
    if any(not np.isfinite(a).all() for k in same for a in trace.parts(k, "g")):
        return _said("pass", "skipped: a gradient of this step is not finite")
    if step["nonfinite_gradient"]:
        return _said(
            "not auditable",
            "skipped for a non-finite gradient that the trace does not keep",
        )
    return _said("fail", "skipped, but every gradient of the step is finite")


def _float64(arrays: Sequence[Array]) -> list[Array]:
    """float64 copies (exact: the recorded dtypes are float64, float32 or wider-stored ones)."""
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _element_entries(el: Elements, arrays: Sequence[Array], j: int) -> list[Any]:
    """The arrays of one state entry for element j, as leaves in the reference's order
    (group-major for a block point)."""
    if el.n_groups and arrays[0].ndim > 2:  # tensors (elements, G, ...): split the groups
        return [a[j][c] for c in range(el.n_groups) for a in arrays]
    return [a[j] for a in arrays]


def replay(trace: Trace, *, progress: bool = False, claim: Claim | None = None) -> dict[str, Any]:
    """Every record of a trace: one JSON-ready document with ``passed``,
    ``first_failure_step`` and ``steps`` (one row per element of each record); against the
    claimed rule when given (``Claim``), else the recorded one."""
    rows: list[dict[str, Any]] = []
    records = range(len(trace.meta["steps"]))
    for k in tqdm(
        records, desc="rattn audit", unit="record", file=sys.stderr, disable=not progress
    ):
        rows.extend(replay_record(trace, k, claim))
    for row in rows:  # JSON has no NaN or inf: a non-finite value is null (the row failed)
        for name, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[name] = None
    return {
        **overall(rows),
        "optimizer": trace.meta["optimizer"],
        "rule": None if claim is None else {"name": claim.rule, "settings": claim.settings},
        "partial": bool(trace.meta.get("partial", False)),
        "steps": rows,
        "versions": trace.meta.get("versions"),
    }


def overall(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The verdict of a run: "failed" when a row failed; else "not auditable" when a row is,
    or when no step was replayed (only skipped steps, or none: nothing was shown); else
    "passed". ``passed`` is true for "passed" only."""
    failed = [r["step"] for r in rows if r["verdict"] == "fail"]
    unauditable = [r["step"] for r in rows if r["verdict"] == "not auditable"]
    replayed = [r for r in rows if not r["skipped"]]
    if failed:
        result = "failed"
    elif unauditable or not replayed:
        result = "not auditable"
    else:
        result = "passed"
    return {
        "verdict": result,
        "passed": result == "passed",
        "first_failure_step": min(failed) if failed else None,
        "first_unauditable_step": min(unauditable) if unauditable else None,
        "counts": {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS},
    }


def audit(
    path: str | Path, *, progress: bool = False, claim: Claim | None = None
) -> dict[str, Any]:
    """Load a trace (``trace.load``, which checks its layout) and replay it (against
    ``claim`` when given); TraceError naming the file for one that cannot be read or
    replayed."""
    try:
        trace = load(path)
    except ValueError as err:
        raise TraceError(str(err)) from None
    if not trace.meta["steps"]:
        raise TraceError(f"{path}: the trace records no step")
    try:
        result = replay(trace, progress=progress, claim=claim)
    except TraceError as err:
        raise TraceError(f"{path}: {err}") from None
    return {"trace": str(path), **result}


def row_ratio(row: dict[str, Any]) -> float:
    """The largest of deviation/bound and the state's ratio (0 for a skipped step, inf for a
    step whose deviation was not finite)."""
    if row["deviation"] is None or not row["bound"]:
        return 0.0 if row["skipped"] else math.inf
    point = row["deviation"] / row["bound"]
    if row["state_ratio"] is None:  # the state was not checked (listed), or the point failed
        return point if row.get("unchecked") else math.inf
    return max(point, row["state_ratio"])
