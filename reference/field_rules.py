"""geoopt's Riemannian Adam and Riemannian SGD on its two Stiefel manifolds, stated in float64.

What geoopt computes, read from the source of geoopt 0.5.1 (``geoopt/optim/radam.py``,
``geoopt/optim/rsgd.py``, ``geoopt/manifolds/stiefel.py``, ``geoopt/manifolds/base.py``) and
written out here with NumPy/SciPy only, so that the field's most used Riemannian optimizers can be
compared with ours (DESIGN §5) without torch. A point is one float64 array X of shape (d, r) with
XᵀX = I_r; G is the Euclidean gradient at X.

The two manifolds (``stiefel``):

- "canonical" (``geoopt.Stiefel()``, i.e. ``CanonicalStiefel``, geoopt's default):
  rgrad = G − X GᵀX; ⟨u, v⟩ = tr(uᵀv) − ½ tr((Xᵀu)ᵀ(Xᵀv)); retraction and transport by the
  Cayley map Q = (I − A/2)⁻¹(I + A/2), A = u Xᵀ − X uᵀ (d×d, skew): X ← Q X, v ← Q v.
- "euclidean" (``geoopt.Stiefel(canonical=False)``, i.e. ``EuclideanStiefel``):
  rgrad = P_X(G) = G − X sym(XᵀG); ⟨u, v⟩ = tr(uᵀv); retraction: the Q factor of the thin QR
  of X + u with column j multiplied by sign(sign(R_jj) + ½) (a zero R_jj counts as +);
  transport to the new point Y by projection, v ← P_Y(v).

The rules (one step from X with gradient G; t is the step count after this step):

- ``GeooptRiemannianAdam``: G ← G + λX (coupled decay, before rgrad); g = rgrad(X, G);
  m ← β1 m + (1 − β1) g; v ← β2 v + (1 − β2)⟨g, g⟩_X, ONE scalar per frame (geoopt keeps a
  (d, r) tensor whose entries all hold that scalar: ``component_inner`` is the metric's inner
  product with ``keepdim``, broadcast); amsgrad: v̄ ← max(v̄, v) and v̄ replaces v below;
  denom = sqrt(v/(1 − β2^t)) + ε; direction = (m/(1 − β1^t))/denom;
  (X, m) ← retr_transp(X, −lr·direction, m).
- ``GeooptRiemannianSGD``: see its docstring, in particular the first step, where geoopt seeds
  the momentum buffer with the raw Euclidean gradient.

geoopt's ``stabilize`` option (default None) re-projects the point and the state every
``stabilize`` steps; with the default it does nothing, and it is not stated here.

How ``lr`` compares with ours: geoopt's second moment is the SUM ⟨g, g⟩_X = ‖g‖² per frame in
its metric, so its Adam step has metric length about lr (exactly lr·‖g‖_X/(‖g‖_X + ε) at the first
step), while ``reference.optim.riemannian_adam`` with its default ``reduction="mean"`` divides by
the per-entry RMS ‖g‖/sqrt(d·r) and so takes steps of Frobenius length about lr·sqrt(d·r): the
same step needs geoopt's lr = our lr·sqrt(d·r). With ε = 0 on the "euclidean" manifold the two
then agree step for step, ours taken on ``Stiefel(d, r, retraction="qr")`` (same rgrad, moments,
sign-fixed QR and transport P_Y; v ours = v geoopt/(d·r)); otherwise ε enters at different scales,
and "canonical" differs from ours in the retraction (Cayley) and, with our default embedded
metric, in the moment.

Coupled weight decay does nothing on a frame in either metric (RA-5): rgrad(X, λX) = 0 for
XᵀX = I; geoopt applies it anyway, and so does this statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from reference import optim_checks as checks
from reference.geometry import check_finite, check_shapes, is_integer
from reference.linalg import Array, sym
from reference.stiefel import Stiefel

STIEFELS = ("canonical", "euclidean")


# -- the two manifolds ---------------------------------------------------------------------------
def _check_stiefel(stiefel: Any) -> None:
    if stiefel not in STIEFELS:
        raise ValueError(f"unknown stiefel {stiefel!r}; choose one of {STIEFELS}")


def project(x: Array, z: Array) -> Array:
    """P_X(Z) = Z − X sym(XᵀZ): the projection onto T_X St, orthogonal in both metrics (the
    normal space {XS : S = Sᵀ} is the same for both)."""
    return z - x @ sym(x.T @ z)


def rgrad(stiefel: str, x: Array, egrad: Array) -> Array:
    """The Riemannian gradient: G − X GᵀX ("canonical") or P_X(G) = G − X sym(XᵀG)
    ("euclidean")."""
    _check_stiefel(stiefel)
    if stiefel == "canonical":
        return egrad - x @ egrad.T @ x
    return project(x, egrad)


def inner(stiefel: str, x: Array, u: Array, v: Array) -> float:
    """⟨u, v⟩_X = tr(uᵀv) − ½ tr((Xᵀu)ᵀ(Xᵀv)) ("canonical") or tr(uᵀv) ("euclidean")."""
    _check_stiefel(stiefel)
    value = float(np.sum(u * v))
    if stiefel == "canonical":
        value -= 0.5 * float(np.sum((x.T @ u) * (x.T @ v)))
    return value


def _cayley_solve(x: Array, u: Array, b: Array) -> Array:
    """(I − A/2)⁻¹(B + A B/2) with A = u Xᵀ − X uᵀ, by one LU solve (as geoopt does)."""
    a = u @ x.T - x @ u.T
    lhs = np.eye(x.shape[0]) - 0.5 * a
    return np.linalg.solve(lhs, b + 0.5 * (a @ b))


def cayley(x: Array, u: Array) -> Array:
    """The d×d orthogonal Q = (I − A/2)⁻¹(I + A/2), A = u Xᵀ − X uᵀ (skew): the canonical
    Stiefel's retraction is Q X and its transport along u is v ↦ Q v. I − A/2 is invertible for
    every u (the eigenvalues of a skew A are imaginary)."""
    return _cayley_solve(x, u, np.eye(x.shape[0]))


def qr_retraction(x: Array, u: Array) -> Array:
    """Q of the thin QR of X + u, column j multiplied by sign(sign(R_jj) + ½), so that
    diag(R) ≥ 0 after the fix and a zero R_jj keeps its column as it is."""
    q, r = np.linalg.qr(x + u)
    return q * np.sign(np.sign(np.diagonal(r)) + 0.5)


def retract(stiefel: str, x: Array, u: Array) -> Array:
    """R_X(u) = Q X with Q = cayley(X, u) ("canonical"; computed as (I − A/2)⁻¹(X + A X/2)) or
    qr_retraction(X, u) ("euclidean")."""
    _check_stiefel(stiefel)
    if stiefel == "canonical":
        return _cayley_solve(x, u, x)
    return qr_retraction(x, u)


def retract_transport(stiefel: str, x: Array, u: Array, v: Array) -> tuple[Array, Array]:
    """(Y, T(v)) = (Q X, Q v) with Q = cayley(X, u) ("canonical"; one solve for [X, v] at once,
    as geoopt does) or (Y, P_Y(v)) with Y = qr_retraction(X, u) ("euclidean")."""
    _check_stiefel(stiefel)
    if stiefel == "canonical":
        r = x.shape[1]
        both = _cayley_solve(x, u, np.hstack([x, v]))
        return both[:, :r], both[:, r:]
    y = qr_retraction(x, u)
    return y, project(y, v)


# -- validation ----------------------------------------------------------------------------------
def _check_geometry(geometry: Any) -> None:
    if not isinstance(geometry, Stiefel):
        raise TypeError(
            f"geometry must be a reference.Stiefel(d, r) (for shapes and point checks), got "
            f"{geometry!r}"
        )


def _check_bool(name: str, v: Any) -> None:
    if not isinstance(v, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {v!r} of type {type(v).__name__}")


def _check_inputs(geometry: Any, x: Any, egrad: Any) -> tuple[Array, Array]:
    """The point (``geometry.check_point``) and the gradient (real, of the point's shape, finite),
    as float64 arrays."""
    _check_geometry(geometry)
    geometry.check_point(x)
    check_shapes("gradient", [geometry.shape], egrad)
    check_finite("gradient", egrad)
    return np.asarray(x, dtype=np.float64), np.asarray(egrad, dtype=np.float64)


def _check_count(count: Any) -> None:
    if not is_integer(count) or count < 0:
        raise ValueError(f"state.count must be an integer ≥ 0, got {count!r}")


def _check_array(name: str, geometry: Stiefel, a: Any) -> None:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a NumPy array of shape {geometry.shape}, got {a!r}")
    check_shapes(name, [geometry.shape], a)
    check_finite(name, a)


def _check_scalar_moment(name: str, v: Any) -> None:
    if not checks.is_real(v) or not 0.0 <= v < np.inf:
        raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")


def _check_finite_result(y: Array, state_arrays: list[Array]) -> None:
    """A step whose point or state is not finite raises (geoopt would store NaN or inf)."""
    check_finite("the point after this step (e.g. lr·direction overflowed, or ε = 0 and g = 0)", y)
    for a in state_arrays:
        check_finite("the state after this step", a)


def _transport_inputs(geometry: Any, x: Any, y: Any) -> Array:
    _check_geometry(geometry)
    check_shapes("x", [geometry.shape], x)
    check_finite("x", x)
    geometry.check_point(y)
    return np.asarray(y, dtype=np.float64)


# -- Riemannian Adam -----------------------------------------------------------------------------
class AdamState(NamedTuple):
    count: int  # steps taken
    m: np.ndarray  # first moment, tangent at the current point
    v: float  # second moment: the running average of ⟨g, g⟩_X, one scalar per frame
    v_max: float  # amsgrad: the running maximum of v (0.0 without amsgrad)


@dataclass(frozen=True)
class GeooptRiemannianAdam:
    """geoopt 0.5.1's ``RiemannianAdam`` on ``geoopt.Stiefel(canonical=...)``, in float64.

    One step from X with Euclidean gradient G and state (t − 1, m, v, v̄):

        G ← G + λX;  g = rgrad(X, G);
        m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2)⟨g, g⟩_X  (one scalar per frame);
        amsgrad: v̄ ← max(v̄, v), and v̄ is used for v below;
        denom = sqrt(v/(1 − β2^t)) + ε;  direction = (m/(1 − β1^t))/denom;
        (X, m) ← retract_transport(X, −lr·direction, m).

    Hyperparameters are checked as geoopt (torch.optim.Adam) checks them: lr ≥ 0, 0 ≤ β < 1,
    ε ≥ 0, λ ≥ 0; here they must also be finite real numbers. ``geometry`` (a
    ``reference.Stiefel(d, r)``) gives the shape and checks the point; its metric and retraction
    are not used: ``stiefel`` chooses geoopt's manifold. Steps are pure: the given state is never
    changed, and a step that raises returns nothing.
    """

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    stiefel: str = "canonical"

    def __post_init__(self) -> None:
        checks.nonnegative("lr", self.lr)
        checks.two_betas(self.betas)
        checks.nonnegative("eps", self.eps)
        checks.nonnegative("weight_decay", self.weight_decay)
        _check_bool("amsgrad", self.amsgrad)
        _check_stiefel(self.stiefel)

    def init(self, geometry: Stiefel, x: Array) -> AdamState:
        """Check the point; the state geoopt starts from: no steps, m = 0, v = v̄ = 0."""
        _check_geometry(geometry)
        geometry.check_point(x)
        return AdamState(0, np.zeros(geometry.shape), 0.0, 0.0)

    def _check_state(self, geometry: Stiefel, state: Any) -> None:
        if type(state) is not AdamState:
            raise ValueError(f"state must be an AdamState, got {type(state).__name__}")
        _check_count(state.count)
        _check_array("state.m", geometry, state.m)
        _check_scalar_moment("state.v", state.v)
        _check_scalar_moment("state.v_max", state.v_max)

    def step(
        self, geometry: Stiefel, x: Array, egrad: Array, state: AdamState
    ) -> tuple[Array, AdamState]:
        """One step of geoopt's RiemannianAdam: (new point, new state), see the class docstring."""
        x, egrad = _check_inputs(geometry, x, egrad)
        self._check_state(geometry, state)
        b1, b2 = (float(b) for b in self.betas)
        t = state.count + 1
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            g = rgrad(self.stiefel, x, egrad + self.weight_decay * x)
            m = b1 * state.m + (1.0 - b1) * g
            v = b2 * state.v + (1.0 - b2) * inner(self.stiefel, x, g, g)
            v_max = max(state.v_max, v) if self.amsgrad else state.v_max
            bias1, bias2 = 1.0 - b1**t, 1.0 - b2**t
            denom = np.sqrt((v_max if self.amsgrad else v) / bias2) + self.eps
            direction = (m / bias1) / denom
            y, m_new = retract_transport(self.stiefel, x, -self.lr * direction, m)
        _check_finite_result(y, [m_new, np.array([v, v_max])])
        return y, AdamState(t, m_new, float(v), float(v_max))

    def transport(self, geometry: Stiefel, x: Array, y: Array, state: AdamState) -> AdamState:
        """The state with m moved from x to the point y by P_y(m) = m − y sym(yᵀm) (the normal
        space is the same in both metrics, so this is the orthogonal projection in either); used
        to re-attach the state to a point that was rounded or re-projected. Checks y as a point."""
        y = _transport_inputs(geometry, x, y)
        self._check_state(geometry, state)
        return state._replace(m=project(y, state.m))


# -- Riemannian SGD ------------------------------------------------------------------------------
class MomentumState(NamedTuple):
    count: int  # steps taken
    buffer: np.ndarray | None  # geoopt's "momentum_buffer"; None before the first step


@dataclass(frozen=True)
class GeooptRiemannianSGD:
    """geoopt 0.5.1's ``RiemannianSGD`` on ``geoopt.Stiefel(canonical=...)``, in float64.

    One step from X with Euclidean gradient G (μ = momentum, τ = dampening, λ = weight_decay):

        first step only, if μ > 0:  buf = G  (a copy of the RAW Euclidean gradient: before the
                                              decay and before rgrad);
        G ← G + λX;  g = rgrad(X, G);
        μ > 0:  buf ← μ·buf + (1 − τ)·g;
                direction = g + μ·buf (nesterov) or buf;
                (X, buf) ← retract_transport(X, −lr·direction, buf);
        μ = 0:  X ← retract(X, −lr·g).

    So the first step uses buf = μG + (1 − τ)g, which is not tangent: μ times the Euclidean
    gradient's normal part X sym(XᵀG) enters the first step (it changes the QR retraction's result;
    the Cayley map ignores a normal part X S, S = Sᵀ, since A = uXᵀ − Xuᵀ cancels it) and stays in
    the stored buffer (the Cayley transport maps X S to Y S, decaying as μ^t; the euclidean
    transport P_Y removes it at the first step). torch.optim.SGD, by contrast, starts from
    buf = g with no dampening. ``transport`` projects the buffer by P_y, which removes that normal
    part; in exact arithmetic that changes none of the later points in either manifold (the
    Cayley map ignores it; the euclidean transport has already removed it).

    Hyperparameters are checked as geoopt checks them: lr ≥ 0, μ ≥ 0, λ ≥ 0, nesterov only with
    μ > 0 and τ = 0; here they must also be finite real numbers (τ of any sign, as in geoopt).
    ``geometry`` (a ``reference.Stiefel(d, r)``) gives the shape and checks the point; its metric
    and retraction are not used: ``stiefel`` chooses geoopt's manifold. Steps are pure: the given
    state is never changed, and a step that raises returns nothing.
    """

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    stiefel: str = "canonical"

    def __post_init__(self) -> None:
        checks.nonnegative("lr", self.lr)
        checks.nonnegative("momentum", self.momentum)
        checks.hyper("dampening", self.dampening, np.isfinite, "be a finite number")
        checks.nonnegative("weight_decay", self.weight_decay)
        _check_bool("nesterov", self.nesterov)
        if self.nesterov and (self.momentum <= 0.0 or self.dampening != 0.0):
            raise ValueError(
                "nesterov=True requires momentum > 0 and dampening = 0 (as in geoopt), got "
                f"momentum={self.momentum!r}, dampening={self.dampening!r}"
            )
        _check_stiefel(self.stiefel)

    def init(self, geometry: Stiefel, x: Array) -> MomentumState:
        """Check the point; the state geoopt starts from: no steps, no buffer yet (the first step
        creates it from the raw gradient)."""
        _check_geometry(geometry)
        geometry.check_point(x)
        return MomentumState(0, None)

    def _check_state(self, geometry: Stiefel, state: Any) -> None:
        if type(state) is not MomentumState:
            raise ValueError(f"state must be a MomentumState, got {type(state).__name__}")
        _check_count(state.count)
        if self.momentum > 0.0 and state.count > 0:
            _check_array("state.buffer", geometry, state.buffer)
        elif state.buffer is not None:
            why = "momentum = 0" if self.momentum == 0.0 else "count = 0 (before the first step)"
            raise ValueError(f"state.buffer must be None with {why}, got an array")

    def step(
        self, geometry: Stiefel, x: Array, egrad: Array, state: MomentumState
    ) -> tuple[Array, MomentumState]:
        """One step of geoopt's RiemannianSGD: (new point, new state), see the class docstring."""
        x, egrad = _check_inputs(geometry, x, egrad)
        self._check_state(geometry, state)
        mu, tau = float(self.momentum), float(self.dampening)
        with np.errstate(over="ignore", invalid="ignore"):
            g = rgrad(self.stiefel, x, egrad + self.weight_decay * x)
            if mu == 0.0:
                y = retract(self.stiefel, x, -self.lr * g)
                _check_finite_result(y, [])
                return y, MomentumState(state.count + 1, None)
            buf = egrad.copy() if state.buffer is None else state.buffer
            buf = mu * buf + (1.0 - tau) * g
            direction = g + mu * buf if self.nesterov else buf
            y, buf_new = retract_transport(self.stiefel, x, -self.lr * direction, buf)
        _check_finite_result(y, [buf_new])
        return y, MomentumState(state.count + 1, buf_new)

    def transport(
        self, geometry: Stiefel, x: Array, y: Array, state: MomentumState
    ) -> MomentumState:
        """The state with the buffer (if any) moved from x to the point y by
        P_y(buf) = buf − y sym(yᵀbuf) (orthogonal in both metrics); used to re-attach the state
        to a point that was rounded or re-projected. Checks y as a point."""
        y = _transport_inputs(geometry, x, y)
        self._check_state(geometry, state)
        if state.buffer is None:
            return state
        return state._replace(buffer=project(y, state.buffer))
