"""Bad input: every public entry point must refuse it with a clear error, and a refused step
must leave the caller's state usable.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
from conftest import U

import reference as ref
from reference import optim

NAN, INF = float("nan"), float("inf")


def _stiefel(d=6, r=3, seed=0):
    st = ref.Stiefel(d, r)
    rng = np.random.default_rng(seed)
    return st, st.random_point(rng), rng


def _tree_equal(a, b) -> bool:
    """Bitwise equality of nested tuples / NamedTuples of arrays and scalars."""
    if isinstance(a, tuple):
        return (
            isinstance(b, tuple)
            and len(a) == len(b)
            and all(_tree_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return np.array_equal(np.asarray(a), np.asarray(b))


# -- geometry constructors ---------------------------------------------------------------------
@pytest.mark.parametrize(("d", "r"), [(3, 4), (1, 2)])
def test_stiefel_r_greater_than_d(d, r):
    with pytest.raises(ValueError, match=rf"r ≤ d.*r={r} > d={d}"):
        ref.Stiefel(d, r)


@pytest.mark.parametrize(("d", "r"), [(0, 0), (3, 0), (-2, 1)])
def test_stiefel_nonpositive(d, r):
    with pytest.raises(ValueError, match="d ≥ 1 and r ≥ 1"):
        ref.Stiefel(d, r)


@pytest.mark.parametrize(("d", "r"), [(6.0, 3), (6, "3"), (None, 1)])
def test_stiefel_non_integer(d, r):
    with pytest.raises(TypeError, match="integer d and r"):
        ref.Stiefel(d, r)


def test_stiefel_numpy_integers_accepted():
    st = ref.Stiefel(np.int64(5), np.int32(2))
    assert (st.d, st.r, st.dim) == (5, 2, 7)


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [({"retraction": "cayley"}, "'cayley'"), ({"metric": "riemannian"}, "'riemannian'")],
)
def test_stiefel_unknown_options(kwargs, bad):
    with pytest.raises(ValueError, match=f"unknown .*{bad}"):
        ref.Stiefel(6, 3, **kwargs)


@pytest.mark.parametrize("shape", [(), (0,), (3, -1)])
def test_euclidean_bad_shape(shape):
    with pytest.raises(ValueError, match="positive integer dimensions"):
        ref.Euclidean(*shape)


def test_euclidean_non_integer_dimension():
    with pytest.raises((TypeError, ValueError)):
        ref.Euclidean(2.7)


def test_product_needs_a_factor():
    with pytest.raises(ValueError, match="at least one factor"):
        ref.Product()


# -- optimizer hyperparameters -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"moment": "diagonal"}, "unknown moment 'diagonal'"),
        ({"reduction": "max"}, "unknown reduction 'max'"),
        ({"decay": "decoupled"}, "unknown decay mode 'decoupled'"),
        ({"betas": (1.0, 0.999)}, "beta1 must lie in"),
        ({"betas": (0.9, -0.1)}, "beta2 must lie in"),
        ({"betas": (NAN, 0.999)}, "beta1 must lie in"),
        ({"eps": -1e-8}, "eps must be a finite number ≥ 0"),
        ({"eps": NAN}, "eps must be a finite number ≥ 0"),
        ({"trust_radius": 0.0}, "trust_radius must be > 0"),
        ({"trust_radius": NAN}, "trust_radius must be > 0"),
        ({"weight_decay": -0.1}, "weight_decay must be a finite number ≥ 0"),
        ({"weight_decay": 20.0, "decay": "fused"}, "fused decay needs lr·λ < 1"),
    ],
)
def test_riemannian_adam_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        optim.riemannian_adam(0.1, **kwargs)


@pytest.mark.parametrize("lr", [0.0, -1e-3, NAN, INF])
@pytest.mark.parametrize(
    "make",
    [
        optim.riemannian_adam,
        optim.rsgd,
        optim.normalized_rsgd,
        optim.riemannian_momentum,
        optim.adamw,
    ],
)
def test_bad_learning_rate(make, lr):
    with pytest.raises(ValueError, match="lr must be a positive finite number"):
        make(lr)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"beta": 1.0}, "beta must lie in"),
        ({"c": 0.0}, "c must be a finite number > 0"),
        ({"c": -1}, "c must"),
    ],
)
def test_riemannian_momentum_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        optim.riemannian_momentum(0.1, **kwargs)


def test_rsgd_rejects_bad_trust_radius():
    with pytest.raises(ValueError, match="trust_radius must be > 0"):
        optim.rsgd(0.1, trust_radius=-1.0)


@pytest.mark.parametrize("weight_decay", [-0.5, NAN])
def test_adamw_rejects_bad_weight_decay(weight_decay):
    with pytest.raises(ValueError, match="weight_decay"):
        optim.adamw(1e-3, weight_decay=weight_decay)


@pytest.mark.parametrize("weight_decay", [NAN, INF])
def test_optimizer_rejects_non_finite_weight_decay(weight_decay):
    with pytest.raises(ValueError, match="weight_decay"):
        optim.riemannian_adam(1e-3, weight_decay=weight_decay)


# -- optimizer inputs --------------------------------------------------------------------------
def test_adamw_on_frames_is_a_type_error():
    st, w, _ = _stiefel()
    with pytest.raises(TypeError, match="plain arrays"):
        optim.adamw().init(st, w)
    p = ref.Product(ref.Euclidean(3), ref.Euclidean(2))
    with pytest.raises(TypeError, match="plain arrays"):
        optim.adamw().init(p, (np.zeros(3), np.zeros(2)))


def test_init_rejects_point_off_manifold():
    st, w, _ = _stiefel()
    with pytest.raises(ValueError, match="off St"):
        optim.riemannian_adam(0.1).init(st, 1.01 * w)
    with pytest.raises(ValueError, match="expected shapes"):
        optim.rsgd(0.1).init(st, w[:, :2])


@pytest.mark.parametrize("shape", [(3, 6), (6, 2), (18,), (1, 6, 3)])
def test_wrong_gradient_shape_names_shapes(shape):
    st, w, rng = _stiefel()
    opt = optim.riemannian_adam(0.1)
    state = opt.init(st, w)
    with pytest.raises(ValueError, match=r"gradient: expected shapes \[\(6, 3\)\], got") as info:
        opt.step(st, w, rng.standard_normal(shape), state)
    assert str(shape) in str(info.value)


def test_wrong_gradient_structure_on_product():
    p = ref.Product(ref.Stiefel(5, 2), ref.Stiefel(4, 3))
    x = p.random_point(np.random.default_rng(1))
    opt = optim.rsgd(0.1)
    state = opt.init(p, x)
    with pytest.raises(ValueError, match=r"\(5, 2\), \(4, 3\)"):
        opt.step(p, x, (np.zeros((5, 2)),), state)
    with pytest.raises(ValueError, match=r"got \[\(5, 2\), \(3, 4\)\]"):
        opt.step(p, x, (np.zeros((5, 2)), np.zeros((3, 4))), state)


def test_tuple_gradient_on_single_array_geometry():
    st, w, rng = _stiefel()
    opt = optim.rsgd(0.1)
    state = opt.init(st, w)
    with pytest.raises(ValueError):
        opt.step(st, w, (rng.standard_normal((6, 3)),), state)


def _optimizers():
    st, _, _ = _stiefel()
    e = ref.Euclidean(6, 3)
    return [
        pytest.param(optim.riemannian_adam(0.05), st, id="adam-frame"),
        pytest.param(optim.riemannian_adam(0.05, moment="elementwise"), st, id="adam-elementwise"),
        pytest.param(optim.riemannian_adam(0.05, trust_radius=0.1), st, id="adam-trust"),
        pytest.param(optim.rsgd(0.05), st, id="rsgd"),
        pytest.param(optim.normalized_rsgd(0.05), st, id="normalized-rsgd"),
        pytest.param(optim.riemannian_momentum(0.05, 0.9, 1.0), st, id="momentum"),
        pytest.param(optim.adamw(0.05), e, id="adamw"),
    ]


@pytest.mark.parametrize("bad_value", [NAN, INF, -INF])
@pytest.mark.parametrize(("opt", "geometry"), _optimizers())
def test_non_finite_gradient_raises_and_keeps_state(opt, geometry, bad_value):
    rng = np.random.default_rng(2)
    x0 = geometry.random_point(rng)
    g1, g2 = rng.standard_normal((2, 6, 3))
    state0 = opt.init(geometry, x0)
    x1, state1 = opt.step(geometry, x0, g1, state0)
    saved = copy.deepcopy(state1)
    expected_x, expected_state = opt.step(geometry, x1, g2, state1)
    bad = g2.copy()
    bad[1, 2] = bad_value
    with pytest.raises(ValueError, match="gradient: 1 non-finite entries"):
        opt.step(geometry, x1, bad, state1)
    with pytest.raises(ValueError, match="gradient: 1 non-finite entries"):
        opt.update(geometry, x1, bad, state1)
    # Nothing was mutated: the old state is bit-for-bit what it was and gives the same step.
    assert _tree_equal(state1, saved)
    again_x, again_state = opt.step(geometry, x1, g2, state1)
    assert np.array_equal(again_x, expected_x)
    assert _tree_equal(again_state, expected_state)


# -- weight decay on products with plain-array factors -----------------------------------------
@pytest.mark.parametrize("decay", ["coupled", "after", "fused"])
def test_decay_on_product_of_euclidean(decay):
    rng = np.random.default_rng(3)
    p = ref.Product(ref.Euclidean(3), ref.Euclidean(2))
    x = p.random_point(rng)
    g = (rng.standard_normal(3), rng.standard_normal(2))
    lr, lam = 0.1, 0.5
    opt = optim.Optimizer(optim.chain(optim.scale(-lr)), lr, weight_decay=lam, decay=decay)
    with warnings.catch_warnings():
        warnings.simplefilter("error", optim.FrameDecayWarning)
        state = opt.init(p, x)
    y, _ = opt.step(p, x, g, state)
    for yi, xi, gi in zip(y, x, g, strict=True):
        expected = {
            "coupled": xi - lr * (gi + lam * xi),
            "after": (1 - lr * lam) * (xi - lr * gi),
            "fused": (1 - lr * lam) * xi - lr * gi,
        }[decay]
        # ≤ 4 roundings of numbers below ~4 (as in test_optim's Euclidean decay test).
        assert np.max(np.abs(yi - expected)) < 8 * U * 4
