"""reference.field_rules against the installed geoopt: the same trajectories in float64.

Each case runs geoopt's optimizer on a ``geoopt.ManifoldParameter`` of shape (7, 3) and the
reference from the same Haar point for 30 steps, each with the gradient of a fixed loss plus seeded
noise, G_t(X) = 2·A·X·N + B_t (A symmetric, N = diag(3, 2, 1), B_t Gaussian), evaluated at its own
current point, and asserts max_t ‖X_geoopt,t − X_ref,t‖_F ≤ TOL. Negative controls (a wrong
manifold, the SGD without geoopt's first-step buffer, Adam's bias correction one step ahead) must
exceed the same TOL, so the check cannot pass vacuously.

The tolerance TOL = STEPS · GROWTH · C · d · u (u = 2^-53), about 9.3e-13:

- Local error, C · d · u with C = 10: per step both sides evaluate the same formulas, a few matrix
  products with inner dimension ≤ d, one sum of d·r squares (the second moment, which enters
  through a square root), axpys, and one LU solve of the d×d matrix I − A/2 (Cayley; A skew, so
  κ(I − A/2) = sqrt(1 + ‖A‖₂²/4) ≈ 1 for the steps here, ‖u‖ ≲ 0.1) or one Householder QR of the
  d×r matrix X + u (κ ≈ 1). Each of them is within γ_{O(d)} ≈ O(d)·u of its exact value times the
  norms of its factors, all O(1) here (‖X‖₂ = 1, and the direction normalised by Adam or scaled by
  a small lr for SGD); about five such terms per evaluation and two evaluations (geoopt's and
  ours) give a difference of at most ~10·d·u in Frobenius norm per step.
- Propagation: e_{t+1} ≤ L_t·e_t + C·d·u gives e_T ≤ C·d·u · Σ_k Π L ≤ T · GROWTH · C·d·u, where
  GROWTH = 4 bounds how much a perturbation of the point grows along a run of these lengths.
  ``test_perturbation_growth_is_bounded`` measures it (≤ 2 in every case), so the bound's one
  assumption is checked rather than assumed. (Normal parts of a rounding error do not grow: the
  Cayley map preserves XᵀX − I exactly, and the QR retraction removes it.)

Measured deviations are 1.1e-15 to 2.6e-15, ~400 times below TOL; the controls are above 5e-3.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import U

import reference as ref
from reference import field_rules as fr
from reference import optim

geoopt = pytest.importorskip("geoopt")
torch = pytest.importorskip("torch")

D, R, STEPS = 7, 3, 30
C_LOCAL, GROWTH = 10, 4
TOL = STEPS * GROWTH * C_LOCAL * D * U  # ≈ 9.3e-13, derived in the module docstring
GEOMETRY = ref.Stiefel(D, R)

#: (optimizer kind, keyword arguments): geoopt's keywords, the same for the reference. The lrs give
#: metric steps of ~0.02 (Adam: about lr; SGD: lr·‖g‖ with ‖g‖ ≈ 6, ×10 with momentum 0.9).
#: With β2 = 0.999 the second moment only grows over these 30 steps, so that amsgrad would change
#: nothing; the amsgrad cases use β2 = 0.9, where v falls below its running maximum (and
#: ``test_amsgrad_flipped_is_rejected`` checks that the flag is seen).
CASES = [
    ("adam", {"lr": 0.02}),
    ("adam", {"lr": 0.02, "betas": (0.9, 0.9)}),
    ("adam", {"lr": 0.02, "betas": (0.9, 0.9), "amsgrad": True}),
    ("adam", {"lr": 0.02, "weight_decay": 0.1}),
    ("adam", {"lr": 0.02, "betas": (0.9, 0.9), "amsgrad": True, "weight_decay": 0.1}),
    ("sgd", {"lr": 0.005}),
    ("sgd", {"lr": 0.005, "weight_decay": 0.1}),
    ("sgd", {"lr": 0.002, "momentum": 0.9}),
    ("sgd", {"lr": 0.002, "momentum": 0.9, "dampening": 0.5}),
    ("sgd", {"lr": 0.002, "momentum": 0.9, "nesterov": True}),
    ("sgd", {"lr": 0.002, "momentum": 0.9, "weight_decay": 0.1}),
]
TABLE = [(stiefel, kind, kw) for stiefel in fr.STIEFELS for kind, kw in CASES]
IDS = [f"{s}-{k}-" + "-".join(f"{a}={b}" for a, b in kw.items()) for s, k, kw in TABLE]


def _problem(seed: int = 0):
    """The start X0 (Haar) and the gradient G_t(X) = 2·A·X·N + B_t."""
    rng = np.random.default_rng(seed)
    x0 = GEOMETRY.random_point(rng)
    z = rng.standard_normal((D, D))
    a = (z + z.T) / (2.0 * np.sqrt(D))
    n = np.diag([3.0, 2.0, 1.0])
    noise = 0.1 * rng.standard_normal((STEPS, D, R))
    return x0, lambda x, t: 2.0 * a @ x @ n + noise[t]


X0, GRAD = _problem()


def _reference(kind: str, stiefel: str, **kw):
    cls = fr.GeooptRiemannianAdam if kind == "adam" else fr.GeooptRiemannianSGD
    return cls(stiefel=stiefel, **kw)


def run_reference(opt, x=X0, state=None):
    """The points after each step, and the last state (from ``state`` or ``opt.init``)."""
    state = opt.init(GEOMETRY, x) if state is None else state
    xs = []
    for t in range(STEPS):
        x, state = opt.step(GEOMETRY, x, GRAD(x, t), state)
        xs.append(x)
    return np.array(xs), state


def run_geoopt(kind: str, stiefel: str, **kw):
    """geoopt's points after each step, in float64, and its state for the parameter."""
    manifold = geoopt.Stiefel(canonical=stiefel == "canonical")
    p = geoopt.ManifoldParameter(torch.tensor(X0, dtype=torch.float64), manifold=manifold)
    cls = geoopt.optim.RiemannianAdam if kind == "adam" else geoopt.optim.RiemannianSGD
    opt = cls([p], **kw)
    xs = []
    for t in range(STEPS):
        p.grad = torch.tensor(GRAD(p.detach().numpy().copy(), t), dtype=torch.float64)
        opt.step()
        xs.append(p.detach().numpy().copy())
    return np.array(xs), opt.state[p]


def deviation(a: np.ndarray, b: np.ndarray) -> float:
    """max_t ‖a_t − b_t‖_F over two trajectories."""
    return float(np.max(np.linalg.norm(a - b, axis=(1, 2))))


_GEOOPT: dict = {}


def geoopt_run(stiefel: str, kind: str, kw: dict):
    key = (stiefel, kind, tuple(sorted(kw.items())))
    if key not in _GEOOPT:
        _GEOOPT[key] = run_geoopt(kind, stiefel, **kw)
    return _GEOOPT[key]


# -- agreement -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("stiefel", "kind", "kw"), TABLE, ids=IDS)
def test_reference_follows_geoopt(stiefel, kind, kw) -> None:
    theirs, their_state = geoopt_run(stiefel, kind, kw)
    ours, state = run_reference(_reference(kind, stiefel, **kw))
    assert deviation(theirs, ours) <= TOL
    assert state.count == STEPS
    if kind == "adam":
        # One scalar per frame: geoopt's (d, r) exp_avg_sq holds v in every entry (up to
        # rounding: torch's vectorised and scalar loops may round the same update differently).
        sq = their_state["exp_avg_sq"].numpy()
        assert np.max(np.abs(sq - state.v)) <= TOL * state.v
        m = their_state["exp_avg"].numpy()
        assert np.linalg.norm(m - state.m) <= TOL * max(1.0, np.linalg.norm(state.m))
        if kw.get("amsgrad"):
            sq_max = their_state["max_exp_avg_sq"].numpy()
            assert np.max(np.abs(sq_max - state.v_max)) <= TOL * state.v_max
    elif kw.get("momentum", 0.0) > 0.0:
        buf = their_state["momentum_buffer"].numpy()
        assert np.linalg.norm(buf - state.buffer) <= TOL * max(1.0, np.linalg.norm(state.buffer))
    else:
        assert state.buffer is None


@pytest.mark.parametrize(("stiefel", "kind", "kw"), TABLE, ids=IDS)
def test_perturbation_growth_is_bounded(stiefel, kind, kw) -> None:
    """The assumption of TOL: a perturbation of X0 grows by at most GROWTH along the run."""
    opt = _reference(kind, stiefel, **kw)
    base, _ = run_reference(opt)
    x1 = GEOMETRY.retract(X0, 1e-9 * GEOMETRY.random_tangent(X0, np.random.default_rng(5)))
    moved, _ = run_reference(opt, x=x1)
    assert deviation(moved, base) <= GROWTH * np.linalg.norm(x1 - X0)


# -- negative controls -----------------------------------------------------------------------------
@pytest.mark.parametrize(("stiefel", "kind", "kw"), TABLE, ids=IDS)
def test_swapped_manifold_is_rejected(stiefel, kind, kw) -> None:
    other = "euclidean" if stiefel == "canonical" else "canonical"
    theirs, _ = geoopt_run(stiefel, kind, kw)
    wrong, _ = run_reference(_reference(kind, other, **kw))
    assert deviation(theirs, wrong) > 1e6 * TOL


@pytest.mark.parametrize("stiefel", fr.STIEFELS)
@pytest.mark.parametrize("kw", [kw for kind, kw in CASES if kw.get("momentum")], ids=str)
def test_sgd_without_first_step_buffer_is_rejected(stiefel, kw) -> None:
    """A buffer started at zero (buf₁ = (1 − τ)·g, no raw gradient) is not geoopt's rule: the
    state (count 1, buffer 0) makes the next step exactly that variant."""
    theirs, _ = geoopt_run(stiefel, "sgd", kw)
    opt = _reference("sgd", stiefel, **kw)
    wrong, _ = run_reference(opt, state=fr.MomentumState(1, np.zeros((D, R))))
    assert deviation(theirs, wrong) > 1e6 * TOL


@pytest.mark.parametrize("stiefel", fr.STIEFELS)
@pytest.mark.parametrize("kw", [kw for kind, kw in CASES if kind == "adam"], ids=str)
def test_adam_bias_correction_off_by_one_is_rejected(stiefel, kw) -> None:
    """Bias corrections 1 − β^(t+1) (the state (count 1, m 0, v 0)) are not geoopt's rule."""
    theirs, _ = geoopt_run(stiefel, "adam", kw)
    opt = _reference("adam", stiefel, **kw)
    wrong, _ = run_reference(opt, state=fr.AdamState(1, np.zeros((D, R)), 0.0, 0.0))
    assert deviation(theirs, wrong) > 1e6 * TOL


@pytest.mark.parametrize("stiefel", fr.STIEFELS)
@pytest.mark.parametrize("kw", [kw for kind, kw in CASES if "betas" in kw], ids=str)
def test_amsgrad_flipped_is_rejected(stiefel, kw) -> None:
    theirs, _ = geoopt_run(stiefel, "adam", kw)
    flipped = {**kw, "amsgrad": not kw.get("amsgrad", False)}
    wrong, _ = run_reference(_reference("adam", stiefel, **flipped))
    assert deviation(theirs, wrong) > 1e6 * TOL


# -- the stated relations --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_coupled_decay_does_nothing_on_frames(kind) -> None:
    """rgrad(X, λX) = 0 on St(d, r) in both metrics (RA-5): decay changes only rounding."""
    for stiefel in fr.STIEFELS:
        lr = 0.02 if kind == "adam" else 0.005
        plain, _ = run_reference(_reference(kind, stiefel, lr=lr))
        decayed, _ = run_reference(_reference(kind, stiefel, lr=lr, weight_decay=0.1))
        assert deviation(plain, decayed) <= TOL


def test_euclidean_adam_is_ours_with_lr_times_sqrt_dr() -> None:
    """With ε = 0, geoopt's Adam on the euclidean Stiefel with lr·sqrt(d·r) is
    ``reference.optim.riemannian_adam(lr, reduction="mean")`` with the QR retraction: the same
    rgrad, moment, transport and retraction, v ours = v geoopt/(d·r)."""
    lr = 0.02
    ours_opt = optim.riemannian_adam(lr, eps=0.0)
    qr_geometry = ref.Stiefel(D, R, retraction="qr")
    x, state, ours = X0, ours_opt.init(qr_geometry, X0), []
    for t in range(STEPS):
        x, state = ours_opt.step(qr_geometry, x, GRAD(x, t), state)
        ours.append(x)
    theirs, _ = run_reference(_reference("adam", "euclidean", lr=lr * np.sqrt(D * R), eps=0.0))
    assert deviation(np.array(ours), theirs) <= TOL


@pytest.mark.parametrize("stiefel", fr.STIEFELS)
def test_first_adam_step_has_metric_length_lr(stiefel) -> None:
    """At step 1 with ε = 0 the direction is g/‖g‖_X, so the step is −lr·g/‖g‖_X."""
    lr = 0.05
    g = fr.rgrad(stiefel, X0, GRAD(X0, 0))
    step = -lr * g / np.sqrt(fr.inner(stiefel, X0, g, g))
    assert np.isclose(np.sqrt(fr.inner(stiefel, X0, step, step)), lr, rtol=1e-14, atol=0.0)
    opt = _reference("adam", stiefel, lr=lr, eps=0.0)
    y, _ = opt.step(GEOMETRY, X0, GRAD(X0, 0), opt.init(GEOMETRY, X0))
    assert np.linalg.norm(y - fr.retract(stiefel, X0, step)) <= C_LOCAL * D * U


def test_cayley_is_orthogonal_and_moves_the_point() -> None:
    u = fr.rgrad("canonical", X0, GRAD(X0, 0)) * 0.1
    q = fr.cayley(X0, u)
    assert np.linalg.norm(q.T @ q - np.eye(D)) <= C_LOCAL * D * U
    assert np.linalg.norm(q @ X0 - fr.retract("canonical", X0, u)) <= C_LOCAL * D * U
    y, w = fr.retract_transport("canonical", X0, u, u)
    assert np.linalg.norm(y - q @ X0) <= C_LOCAL * D * U
    assert np.linalg.norm(w - q @ u) <= C_LOCAL * D * U * np.linalg.norm(u)


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_transport_projects_the_state(kind) -> None:
    kw = {"lr": 0.02} if kind == "adam" else {"lr": 0.002, "momentum": 0.9}
    opt = _reference(kind, "canonical", **kw)
    _, state = run_reference(opt)
    vec = state.m if kind == "adam" else state.buffer
    y = GEOMETRY.random_point(np.random.default_rng(3))
    moved = opt.transport(GEOMETRY, X0, y, state)
    new = moved.m if kind == "adam" else moved.buffer
    assert np.array_equal(new, fr.project(y, vec))
    assert np.linalg.norm(y.T @ new + new.T @ y) <= C_LOCAL * D * U * np.linalg.norm(vec)
    assert moved.count == state.count
    empty = _reference("sgd", "canonical", lr=0.01).init(GEOMETRY, X0)
    assert _reference("sgd", "canonical", lr=0.01).transport(GEOMETRY, X0, y, empty) == empty


# -- bad input -------------------------------------------------------------------------------------
BAD_HYPERPARAMETERS = [
    ("adam", {"lr": -1.0}, "-1.0"),
    ("adam", {"lr": 0.01, "betas": (1.0, 0.999)}, "1.0"),
    ("adam", {"lr": 0.01, "betas": (0.9, -0.5)}, "-0.5"),
    ("adam", {"lr": 0.01, "eps": -1e-8}, "-1e-08"),
    ("adam", {"lr": 0.01, "weight_decay": -0.1}, "-0.1"),
    ("sgd", {"lr": -1.0}, "-1.0"),
    ("sgd", {"lr": 0.01, "momentum": -0.5}, "-0.5"),
    ("sgd", {"lr": 0.01, "weight_decay": -0.1}, "-0.1"),
    ("sgd", {"lr": 0.01, "nesterov": True}, "momentum=0"),
    ("sgd", {"lr": 0.01, "momentum": 0.9, "dampening": 0.5, "nesterov": True}, "dampening=0.5"),
]


@pytest.mark.parametrize(("kind", "kw", "shown"), BAD_HYPERPARAMETERS, ids=str)
def test_bad_hyperparameters_are_refused_as_geoopt_refuses_them(kind, kw, shown) -> None:
    with pytest.raises(ValueError, match=re.escape(shown)):
        _reference(kind, "canonical", **kw)
    p = geoopt.ManifoldParameter(torch.tensor(X0), manifold=geoopt.Stiefel())
    cls = geoopt.optim.RiemannianAdam if kind == "adam" else geoopt.optim.RiemannianSGD
    with pytest.raises(ValueError):
        cls([p], **kw)


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_lr_zero_and_unknown_stiefel(kind) -> None:
    _reference(kind, "canonical", lr=0.0)  # geoopt accepts lr = 0, and so do we
    with pytest.raises(ValueError, match="'polar'"):
        _reference(kind, "polar", lr=0.01)


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_bad_inputs_raise_with_the_measured_value(kind) -> None:
    kw = {"lr": 0.02} if kind == "adam" else {"lr": 0.002, "momentum": 0.9}
    opt = _reference(kind, "euclidean", **kw)
    state = opt.init(GEOMETRY, X0)
    with pytest.raises(ValueError, match=re.escape("got [(3, 7)]")):
        opt.step(GEOMETRY, X0, np.ones((R, D)), state)
    bad = GRAD(X0, 0)
    bad[1, 2], bad[4, 0] = np.nan, np.inf
    with pytest.raises(ValueError, match="gradient: 2 non-finite"):
        opt.step(GEOMETRY, X0, bad, state)
    off = 1.01 * X0
    shown = f"{np.linalg.norm(off.T @ off - np.eye(R)):.3e}"
    with pytest.raises(ValueError, match=re.escape(shown)):
        opt.step(GEOMETRY, off, GRAD(X0, 0), state)
    with pytest.raises(ValueError, match=re.escape(shown)):
        opt.init(GEOMETRY, off)
    with pytest.raises(TypeError, match=re.escape("reference.Stiefel")):
        opt.init(ref.Euclidean(D, R), X0)


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_refused_step_leaves_the_state_unchanged(kind) -> None:
    kw = {"lr": 0.02, "amsgrad": True} if kind == "adam" else {"lr": 0.002, "momentum": 0.9}
    opt = _reference(kind, "canonical", **kw)
    x, state = X0, opt.init(GEOMETRY, X0)
    for t in range(3):
        x, state = opt.step(GEOMETRY, x, GRAD(x, t), state)
    before = tuple(np.copy(f) if isinstance(f, np.ndarray) else f for f in state)
    bad = GRAD(x, 3)
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        opt.step(GEOMETRY, x, bad, state)
    for old, new in zip(before, state, strict=True):
        assert np.array_equal(old, new)
    # The state still steps exactly as a copy of it does.
    y1, s1 = opt.step(GEOMETRY, x, GRAD(x, 3), state)
    y2, s2 = opt.step(GEOMETRY, x, GRAD(x, 3), type(state)(*before))
    assert np.array_equal(y1, y2)
    for a, b in zip(s1, s2, strict=True):
        assert np.array_equal(a, b)


def test_bad_states_are_refused() -> None:
    sgd = _reference("sgd", "canonical", lr=0.01, momentum=0.9)
    with pytest.raises(ValueError, match=re.escape("state.buffer")):
        sgd.step(GEOMETRY, X0, GRAD(X0, 0), fr.MomentumState(0, np.zeros((D, R))))
    with pytest.raises(ValueError, match=re.escape("state.buffer")):
        sgd.step(GEOMETRY, X0, GRAD(X0, 0), fr.MomentumState(2, None))
    adam = _reference("adam", "canonical", lr=0.01)
    with pytest.raises(ValueError, match=re.escape("-1.0")):
        adam.step(GEOMETRY, X0, GRAD(X0, 0), fr.AdamState(1, np.zeros((D, R)), -1.0, 0.0))
    with pytest.raises(ValueError, match="AdamState"):
        adam.step(GEOMETRY, X0, GRAD(X0, 0), fr.MomentumState(0, None))
