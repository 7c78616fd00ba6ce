"""Reliability of the float64 reference (``reference/``), one group per kind of fix:

1. gradient scales: subnormal and huge gradients give the step of the same gradient scaled to
   normal range (RA-2: the ε = 0 rules are scale invariant), frame by frame;
2. dtypes: complex, object, string and bool points, gradients and states are refused;
3. states that do not fit the point are refused, field by field;
4. sizes and hyperparameters of the wrong type (bool, str, ...) are refused;
5. a step that leaves the rank-r manifold says what happened, never "nan".

Every refusal is a ValueError or TypeError naming the input, the problem and the measured value,
and leaves whatever the caller holds as it was.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from conftest import U

import reference as ref
from reference import optim
from reference.geometry import parts, tree_map

SUBNORMAL = 2.0**-1074  # the spacing of float64 below 2^-1022 (the smallest subnormal)


def _geometry(name: str):
    if name == "stiefel":
        return ref.Stiefel(6, 3)
    if name == "product":
        return ref.Product(ref.Stiefel(5, 2), ref.Stiefel(4, 3))
    if name == "mha_block_fixed_rank_embedded":  # two groups: two frames of one Product
        return ref.GEOMETRIES["block_fixed_rank_embedded"](5, 4, 2, n_heads=2, n_kv_heads=2)
    return ref.GEOMETRIES[name](5, 4, 2)


def _gaussian(x, rng: np.random.Generator):
    """A factor gradient in the point's layout, standard normal entries."""
    return tree_map(lambda p: rng.standard_normal(np.shape(p)), x)


def _ldexp(u, k: int):
    """u·2^k part by part: exact while the result stays normal (and from a subnormal u back)."""
    return tree_map(lambda p: np.ldexp(p, k), u)


def _flat(u) -> np.ndarray:
    return np.concatenate([np.ravel(p) for p in parts(u)])


def _rms(u) -> float:
    return float(np.sqrt(np.mean(_flat(u) ** 2)))


def _tree_equal(a, b) -> bool:
    """Bitwise equality of nested tuples / NamedTuples of arrays and scalars (NaN equals NaN)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, tuple):
        return (
            isinstance(b, tuple)
            and len(a) == len(b)
            and all(_tree_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)


# -- 1. gradient scales ------------------------------------------------------------------------
#: The ε = 0 rules, each with the smallest weight w it puts on g before anything is normalised:
#: √(1 − β2) ≈ 0.032 on RMS(g) in Adam's √v, 1 − β = 0.1 in the momentum, 1 for normalised RSGD.
#: ``make(c)`` takes the momentum's c, which must scale with the gradient for scale invariance.
SCALE_FREE_RULES = {
    "adam-eps0": (lambda c: optim.riemannian_adam(1e-2, eps=0.0), math.sqrt(1e-3)),
    "adam-eps0-sum": (
        lambda c: optim.riemannian_adam(1e-2, eps=0.0, reduction="sum"),
        math.sqrt(1e-3),
    ),
    "adam-eps0-trust": (
        lambda c: optim.riemannian_adam(1e-2, eps=0.0, trust_radius=1e-3),
        math.sqrt(1e-3),
    ),
    "normalized-rsgd": (lambda c: optim.normalized_rsgd(1e-2), 1.0),
    "momentum": (lambda c: optim.riemannian_momentum(1e-2, 0.9, c), 0.1),
}
SCALE_GEOMETRIES = ["stiefel", "fixed_rank_embedded", "stiefel_pair", "block_fixed_rank_quotient"]


@pytest.mark.parametrize("rule", list(SCALE_FREE_RULES))
@pytest.mark.parametrize("name", SCALE_GEOMETRIES)
def test_subnormal_gradient_gives_the_normal_range_step(name, rule):
    """Entries ~1e-310 (2^-1030·N(0, 1)): before the fix 1/(√v̂ + ε), 1/RMS(g) and 1/max(‖M‖, c)
    overflowed to inf ("polar factor of a matrix with non-finite entries").

    Tolerance: every quantity a rule forms at the subnormal scale (the rgrad, (1 − β)·g, √v, …)
    is rounded to a multiple of 2^-1074, an absolute error ≤ 2^-1075 per rounding; the smallest of
    them is w·RMS(g), so a step is off by a relative few·2^-1074/(w·RMS(g)). 16 of them cover the
    ~2 roundings per entry measured (≤ 56·2^-1074/RMS(g) for Adam, w ≈ 0.032, over 3 steps of
    carried state) with a margin of 5 or more; 64u covers the normal-range rounding."""
    make, weight = SCALE_FREE_RULES[rule]
    k = 1030
    geo = _geometry(name)
    rng = np.random.default_rng(0)
    x = geo.random_point(rng)
    sub, normal = make(2.0**-1070), make(2.0 ** (-1070 + k))
    s_sub, s_normal = sub.init(geo, x), normal.init(geo, x)
    for _ in range(3):
        g_sub = _ldexp(_gaussian(x, rng), -k)
        assert 0.0 < np.max(np.abs(_flat(g_sub))) < np.finfo(np.float64).tiny  # subnormal
        g_normal = _ldexp(g_sub, k)  # the same gradient, exactly, in normal range
        xi_sub, _ = sub.update(geo, x, g_sub, s_sub)
        xi_normal, _ = normal.update(geo, x, g_normal, s_normal)
        assert np.all(np.isfinite(_flat(xi_sub)))
        tol = 16 * SUBNORMAL / (weight * _rms(g_normal) * 2.0**-k) + 64 * U
        err = np.linalg.norm(_flat(xi_sub) - _flat(xi_normal)) / np.linalg.norm(_flat(xi_normal))
        assert err <= tol, (err, tol)
        y, s_sub = sub.step(geo, x, g_sub, s_sub)
        _, s_normal = normal.step(geo, x, g_normal, s_normal)
        geo.check_point(y)
        x = y


@pytest.mark.parametrize(
    "rule", [*SCALE_FREE_RULES, "rsgd-trust"]
)  # rsgd capped at Δ is scale invariant too
@pytest.mark.parametrize("name", SCALE_GEOMETRIES)
def test_huge_gradient_gives_the_scaled_down_step_bitwise(name, rule):
    """Entries ~1e300 (2^997·N(0, 1)): every per-frame norm, RMS, moment and cap is formed scaled,
    and a power-of-two scaling commutes with every rounding while all intermediates stay normal,
    so the trajectory is bit for bit the one of the gradient scaled down by 2^-997."""
    if rule == "rsgd-trust":
        big = normal = optim.rsgd(1e-2, trust_radius=1e-3)
    else:
        make = SCALE_FREE_RULES[rule][0]
        big, normal = make(2.0**997), make(1.0)
    geo = _geometry(name)
    rng = np.random.default_rng(1)
    x = y = geo.random_point(rng)
    s_big, s_normal = big.init(geo, x), normal.init(geo, x)
    for _ in range(3):
        g = _gaussian(x, rng)
        x, s_big = big.step(geo, x, _ldexp(g, 997), s_big)
        y, s_normal = normal.step(geo, y, g, s_normal)
        assert _tree_equal(x, y)


def _scale_frames(geo, u, exponents):
    """u with the parts of frame k multiplied by 2^exponents[k]."""
    out = list(parts(u))
    for group, e in zip(geo.moment_groups, exponents, strict=True):
        for i in group:
            out[i] = np.ldexp(out[i], e)
    return ref.geometry.like(u, out)


@pytest.mark.parametrize("rule", ["adam-eps0", "normalized-rsgd"])
@pytest.mark.parametrize("name", ["stiefel_pair", "product", "mha_block_fixed_rank_embedded"])
def test_frames_of_very_different_scales_keep_their_own_step(name, rule):
    """Frames at 2^600 and 2^-600: the RMS of each frame is its own. Before the fix every frame
    was divided by the largest entry of the point, which flushed the small frame to zero (its
    RMS 0, so a zero step by 0/0 := 0). Per frame the rules are scale invariant, so the step is
    the one of the frames both at scale 1, up to the rounding of the different divisors (each
    frame's own max instead of the point's): 64u relative."""
    geo = _geometry(name)
    assert len(geo.moment_groups) == 2
    make = SCALE_FREE_RULES[rule][0]
    opt = make(1.0)
    rng = np.random.default_rng(2)
    x = geo.random_point(rng)
    state = opt.init(geo, x)
    g = _gaussian(x, rng)
    xi_mixed, _ = opt.update(geo, x, _scale_frames(geo, g, [600, -600]), state)
    xi_plain, _ = opt.update(geo, x, g, state)
    for group in geo.moment_groups:
        a = np.concatenate([np.ravel(parts(xi_mixed)[i]) for i in group])
        b = np.concatenate([np.ravel(parts(xi_plain)[i]) for i in group])
        assert np.linalg.norm(b) > 0.0
        assert np.linalg.norm(a - b) <= 64 * U * np.linalg.norm(b)


@pytest.mark.parametrize("name", SCALE_GEOMETRIES)
def test_trust_region_passes_a_subnormal_step_unchanged(name):
    """Δ/‖ξ‖ overflows to inf for a subnormal ‖ξ‖, and min(1, inf) = 1 is the right cap: the step
    is −lr·rgrad exactly."""
    geo = _geometry(name)
    rng = np.random.default_rng(3)
    x = geo.random_point(rng)
    opt = optim.rsgd(1e-2, trust_radius=1e-3)
    g = _ldexp(_gaussian(x, rng), -1030)
    xi, _ = opt.update(geo, x, g, opt.init(geo, x))
    assert _tree_equal(xi, tree_map(lambda p: -1e-2 * p, geo.egrad_to_rgrad(x, g)))
    assert np.any(_flat(xi) != 0.0)


# -- 2. dtypes ---------------------------------------------------------------------------------
BAD_DTYPES = {
    "complex128": lambda a: a.astype(np.complex128),
    "object": lambda a: a.astype(object),
    "<U": lambda a: a.astype(str),
    "bool": lambda a: a > 0,
}
DTYPE_GEOMETRIES = ["stiefel", "fixed_rank_embedded", "stiefel_pair", "block_fixed_rank_quotient"]


def _spoil_last(u, dtype: str):
    """u with its last part converted to the bad dtype."""
    ps = list(parts(u))
    ps[-1] = BAD_DTYPES[dtype](ps[-1])
    return ref.geometry.like(u, ps)


@pytest.mark.parametrize("dtype", list(BAD_DTYPES))
@pytest.mark.parametrize("name", DTYPE_GEOMETRIES)
def test_non_real_gradient_is_refused(name, dtype):
    """Before: a complex gradient only warned (ComplexWarning) and gave a complex point, object
    and string ones failed inside np.isfinite, a bool one was taken as 0/1."""
    geo = _geometry(name)
    rng = np.random.default_rng(4)
    x = geo.random_point(rng)
    opt = optim.riemannian_adam(1e-2)
    state = opt.init(geo, x)
    saved = copy.deepcopy((x, state))
    bad = _spoil_last(_gaussian(x, rng), dtype)
    with pytest.raises(TypeError, match=rf"gradient: entries must be real numbers.*dtype {dtype}"):
        opt.step(geo, x, bad, state)
    assert _tree_equal((x, state), saved)


@pytest.mark.parametrize("dtype", list(BAD_DTYPES))
@pytest.mark.parametrize("name", DTYPE_GEOMETRIES)
def test_non_real_point_is_refused(name, dtype):
    geo = _geometry(name)
    rng = np.random.default_rng(5)
    x = geo.random_point(rng)
    bad = _spoil_last(x, dtype)
    with pytest.raises(TypeError, match=rf"point.*: entries must be real numbers.*dtype {dtype}"):
        geo.check_point(bad)
    opt = optim.rsgd(1e-2)
    with pytest.raises(TypeError, match=rf"dtype {dtype}"):
        opt.init(geo, bad)
    with pytest.raises(TypeError, match=rf"dtype {dtype}"):
        opt.step(geo, bad, _gaussian(x, rng), opt.init(geo, x))


def test_ragged_gradient_is_a_value_error_naming_it():
    st = ref.Stiefel(2, 1)
    w = st.random_point(np.random.default_rng(6))
    opt = optim.rsgd(1e-2)
    with pytest.raises(ValueError, match="gradient: not an array"):
        opt.step(st, w, [[1.0], [2.0, 3.0]], opt.init(st, w))


# -- 3. states that do not fit the point -------------------------------------------------------
STATE_CASES = {
    # name: (optimizer, geometry, how to spoil the state made at the point, expected message)
    "adam-m-of-another-size": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: opt.init(ref.Stiefel(3, 1), ref.Stiefel(3, 1).random_point(_RNG)),
        r"state\[0\]\.m: expected shapes \[\(3, 3\)\], got \[\(3, 1\)\]",
    ),
    "adam-sqrt-v-per-group": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (s[0]._replace(sqrt_v=(0.1, 0.2)), *s[1:]),
        r"state\[0\]\.sqrt_v: expected a tuple of 1 entries, got 2 entries",
    ),
    "adam-pair-state-on-one-frame": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: opt.init(ref.GEOMETRIES["stiefel_pair"](3, 3, 3), _pair33()),
        r"state\[0\]\.m: expected shapes \[\(3, 3\)\], got \[\(3, 3\), \(3, 3\)\]",
    ),
    "adam-negative-count": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (s[0]._replace(count=-1), *s[1:]),
        r"state\[0\]\.count: expected an integer ≥ 0, got -1",
    ),
    "adam-float-count": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (s[0]._replace(count=1.5), *s[1:]),
        r"state\[0\]\.count: expected an integer ≥ 0, got 1\.5",
    ),
    "adam-bool-count": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (s[0]._replace(count=True), *s[1:]),
        r"state\[0\]\.count: expected an integer ≥ 0, got True",
    ),
    "adam-negative-sqrt-v": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (s[0]._replace(sqrt_v=(-0.5,)), *s[1:]),
        r"state\[0\]\.sqrt_v\[0\]: expected a finite number ≥ 0, got -0\.5",
    ),
    "adam-nan-sqrt-v": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (s[0]._replace(sqrt_v=(math.nan,)), *s[1:]),
        r"state\[0\]\.sqrt_v\[0\]: expected a finite number ≥ 0, got nan",
    ),
    "adam-inf-sqrt-v": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (s[0]._replace(sqrt_v=(math.inf,)), *s[1:]),
        r"state\[0\]\.sqrt_v\[0\]: expected a finite number ≥ 0, got inf",
    ),
    "adam-elementwise-negative-sqrt-v": (
        optim.riemannian_adam(1e-2, moment="elementwise"),
        "stiefel33",
        lambda s, opt: (s[0]._replace(sqrt_v=(-np.ones((3, 3)),)), *s[1:]),
        r"state\[0\]\.sqrt_v\[0\]: entries must be ≥ 0, got a minimum of -1\.0",
    ),
    "adam-nan-m": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (s[0]._replace(m=np.full((3, 3), np.nan)), *s[1:]),
        r"state\[0\]\.m: 9 non-finite entries",
    ),
    "adam-plain-tuple": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: (tuple(s[0]), *s[1:]),
        r"state\[0\]: expected type AdamState, got tuple",
    ),
    "chain-too-short": (
        optim.riemannian_adam(1e-2),
        "stiefel33",
        lambda s, opt: s[:1],
        r"state: expected a tuple of 2 entries, got 1 entries",
    ),
    "trace-m-of-another-size": (
        optim.riemannian_momentum(1e-2),
        "stiefel33",
        lambda s, opt: (optim.TraceState(np.zeros((3, 1))), *s[1:]),
        r"state\[0\]\.m: expected shapes \[\(3, 3\)\], got \[\(3, 1\)\]",
    ),
    "factored-m-part": (
        optim.riemannian_adam(1e-2),
        "fixed_rank_embedded",
        lambda s, opt: (s[0]._replace(m=(s[0].m[0], s[0].m[1][:4], s[0].m[2])), *s[1:]),
        r"state\[0\]\.m\[1\]: expected shapes \[\(5, 2\)\], got \[\(4, 2\)\]",
    ),
    "block-sqrt-v": (
        optim.riemannian_adam(1e-2),
        "block_stiefel_pair",
        lambda s, opt: (s[0]._replace(sqrt_v=s[0].sqrt_v[:1]), *s[1:]),
        r"state\[0\]\.sqrt_v: expected a tuple of 2 entries, got 1 entries",
    ),
    "not-a-state": (
        optim.rsgd(1e-2),
        "stiefel33",
        lambda s, opt: None,
        r"state: expected a tuple of 1 entries, got NoneType",
    ),
}
_RNG = np.random.default_rng(7)


def _pair33():
    return ref.GEOMETRIES["stiefel_pair"](3, 3, 3).random_point(np.random.default_rng(8))


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_state_that_does_not_fit_is_refused(case):
    """Before: silently broadcast ((3, 1) moments on St(3, 3)), a raw NumPy or zip error, or a
    step from a negative count / √v."""
    opt, name, spoil, match = STATE_CASES[case]
    geo = ref.Stiefel(3, 3) if name == "stiefel33" else _geometry(name)
    rng = np.random.default_rng(9)
    x = geo.random_point(rng)
    good = opt.init(geo, x)
    bad = spoil(good, opt)
    saved = copy.deepcopy((x, bad))
    g = _gaussian(x, rng)
    with pytest.raises(ValueError, match=match):
        opt.step(geo, x, g, bad)
    assert _tree_equal((x, bad), saved)
    opt.step(geo, x, g, good)  # the state made at this point is accepted


def test_complex_state_is_a_type_error():
    st = ref.Stiefel(3, 3)
    rng = np.random.default_rng(10)
    w = st.random_point(rng)
    opt = optim.riemannian_adam(1e-2)
    s = opt.init(st, w)
    bad = (s[0]._replace(m=s[0].m.astype(complex)), *s[1:])
    with pytest.raises(TypeError, match=r"state\[0\]\.m: entries must be real.*complex128"):
        opt.step(st, w, _gaussian(w, rng), bad)


# -- 4. sizes and hyperparameters --------------------------------------------------------------
SIZE_CASES = [
    pytest.param(lambda: ref.Stiefel(True, True), r"St\(d, r\) needs integer d and r", id="St-1-1"),
    pytest.param(lambda: ref.Stiefel(6, True), "got r=True", id="St-r"),
    pytest.param(lambda: ref.Euclidean(3, True), "integer dimensions, got True", id="Euclidean"),
    *[
        pytest.param(
            lambda name=name, pos=pos: ref.GEOMETRIES[name](
                *[True if i == pos else v for i, v in enumerate((5, 4, 2))]
            ),
            f"needs integer m, n and r, got {'mnr'[pos]}=True",
            id=f"{name}-{'mnr'[pos]}",
        )
        for name in ref.GEOMETRIES
        for pos in range(3)
    ],
    *[
        pytest.param(
            lambda name=name, kw=kw: ref.GEOMETRIES[name](5, 4, 2, **kw),
            match,
            id=f"{name}-{next(iter(kw))}",
        )
        for name in ref.GEOMETRIES
        if name.startswith("block_")
        for kw, match in (
            ({"n_heads": True}, "got n_heads=True"),
            ({"n_kv_heads": True}, "got n_kv_heads=True"),
            ({"n_heads": 2.0}, "got n_heads=2.0"),
            ({"pattern": [(0, True)]}, r"pairs \(i, j\) of integers, got \(0, True\)"),
            ({"pattern": [(0, 0.0)]}, r"pairs \(i, j\) of integers, got \(0, 0\.0\)"),
        )
    ],
]


@pytest.mark.parametrize(("make", "match"), SIZE_CASES)
def test_bool_or_float_size_is_a_type_error(make, match):
    """Before: True passed as the integer 1 (St(1, 1), a fixed-rank or block geometry of size 1),
    and block sizes were multiplied before any check."""
    with pytest.raises(TypeError, match=match):
        make()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(lambda: ref.GEOMETRIES["block_stiefel_pair"](5, 4, 0), "r ≥ 1", id="r=0"),
        pytest.param(lambda: ref.GEOMETRIES["block_stiefel_pair"](-1, 4, 2), "m=-1", id="m<0"),
        pytest.param(
            lambda: ref.GEOMETRIES["block_stiefel_pair"](5, 4, 2, pattern=[(0, -1)]),
            r"≥ 0, got \(0, -1\)",
            id="pattern<0",
        ),
        pytest.param(
            lambda: ref.GEOMETRIES["block_stiefel_pair"](5, 4, 2, pattern=[]),
            "no active block",
            id="empty-pattern",
        ),
    ],
)
def test_block_size_values_are_checked_before_stacking(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _presets():
    """(id, constructor taking the hyperparameter as a keyword) for every preset and transform."""
    return {
        "riemannian_adam": lambda **kw: optim.riemannian_adam(**{"lr": 1e-2, **kw}),
        "riemannian_momentum": lambda **kw: optim.riemannian_momentum(**{"lr": 1e-2, **kw}),
        "rsgd": lambda **kw: optim.rsgd(**{"lr": 1e-2, **kw}),
        "normalized_rsgd": lambda **kw: optim.normalized_rsgd(**{"lr": 1e-2, **kw}),
        "adamw": lambda **kw: optim.adamw(**{"lr": 1e-2, **kw}),
        "Optimizer": lambda **kw: optim.Optimizer(optim.chain(), **{"lr": 1e-2, **kw}),
        "scale_by_adam": lambda **kw: optim.scale_by_adam(**kw),
        "trace": lambda **kw: optim.trace(**kw),
        "scale": lambda **kw: optim.scale(**kw),
        "trust_region": lambda **kw: optim.trust_region(**kw),
        "normalize_by_max": lambda **kw: optim.normalize_by_max(**kw),
        "add_decayed_weights": lambda **kw: optim.add_decayed_weights(**kw),
    }


HYPERPARAMETERS = [
    ("riemannian_adam", "lr"),
    ("riemannian_adam", "eps"),
    ("riemannian_adam", "trust_radius"),
    ("riemannian_adam", "weight_decay"),
    ("riemannian_momentum", "lr"),
    ("riemannian_momentum", "beta"),
    ("riemannian_momentum", "c"),
    ("rsgd", "lr"),
    ("rsgd", "trust_radius"),
    ("normalized_rsgd", "lr"),
    ("adamw", "lr"),
    ("adamw", "eps"),
    ("adamw", "weight_decay"),
    ("Optimizer", "lr"),
    ("Optimizer", "weight_decay"),
    ("scale_by_adam", "b1"),
    ("scale_by_adam", "b2"),
    ("scale_by_adam", "eps"),
    ("trace", "beta"),
    ("scale", "factor"),
    ("trust_region", "radius"),
    ("normalize_by_max", "c"),
    ("add_decayed_weights", "weight_decay"),
]
_MESSAGE_NAME = {"b1": "beta1", "b2": "beta2", "radius": "trust_radius"}
_REQUIRED = {"trace": "beta", "scale": "factor", "trust_region": "radius"}


@pytest.mark.parametrize(
    ("maker", "name", "value"),
    [
        (maker, name, value)
        for maker, name in HYPERPARAMETERS
        for value in ("1e-3", True, None, 1e-3j, [0.1])
        if not (name == "trust_radius" and value is None)  # None: no trust region
    ],
    ids=repr,
)
def test_hyperparameter_of_the_wrong_type_is_a_type_error(maker, name, value):
    """Before: lr='1e-3' gave "bad operand type for unary -: 'str'", and bools passed as 0 or 1.
    The message names the hyperparameter and the value given."""
    with pytest.raises(TypeError, match=rf"^{_MESSAGE_NAME.get(name, name)} must .*got ") as info:
        _presets()[maker](**{name: value})
    assert f"got {value!r} of type {type(value).__name__}" in str(info.value)


@pytest.mark.parametrize("betas", [(0.9, "0.999"), (True, 0.999)], ids=repr)
@pytest.mark.parametrize("maker", ["riemannian_adam", "adamw"])
def test_betas_of_the_wrong_type(maker, betas):
    which = "beta1" if betas[1] == 0.999 else "beta2"
    with pytest.raises(TypeError, match=rf"{which} must lie in \[0, 1\), got "):
        _presets()[maker](betas=betas)


@pytest.mark.parametrize(
    ("maker", "kwargs", "error", "match"),
    [
        ("riemannian_adam", {"betas": "ab"}, TypeError, "betas must be a pair"),
        ("riemannian_adam", {"betas": (0.9,)}, ValueError, r"betas must be a pair.*\(0\.9,\)"),
        ("riemannian_adam", {"trust_radius": math.inf}, ValueError, "trust_radius .* got inf"),
        ("rsgd", {"trust_radius": math.inf}, ValueError, "trust_radius .* got inf"),
        ("riemannian_momentum", {"c": math.inf}, ValueError, "c must be .* got inf"),
        ("scale", {"factor": math.nan}, ValueError, "factor must be a finite number, got nan"),
        ("trace", {"beta": -0.1}, ValueError, r"beta must lie in \[0, 1\), got -0\.1"),
    ],
)
def test_hyperparameter_values(maker, kwargs, error, match):
    if maker in _REQUIRED and _REQUIRED[maker] not in kwargs:
        kwargs = {**kwargs, _REQUIRED[maker]: 1.0}
    with pytest.raises(error, match=match):
        _presets()[maker](**kwargs)


# -- 5. leaving the rank-r manifold ------------------------------------------------------------
def _embedded(retraction="projection"):
    geo = ref.FixedRankEmbedded(5, 4, 2, retraction=retraction)
    return geo, geo.random_point(np.random.default_rng(11))


def _quotient():
    geo = ref.FixedRankQuotient(5, 4, 2)
    return geo, geo.random_point(np.random.default_rng(12))


def _zero_core(geo, x):
    """ξ = (−S, 0, 0): W + ξ = U(S − S)Vᵀ = 0, every singular value of the new core is 0."""
    u, s, v = x
    return (-s, np.zeros_like(u), np.zeros_like(v))


def _with_inf(u):
    ps = [p.copy() for p in parts(u)]
    ps[-1][0, 0] = np.inf
    return ref.geometry.like(u, ps)


RANK_CASES = {
    "embedded-zero-core": (
        _embedded,
        _zero_core,
        r"leaves the rank-2 manifold: rank-deficient factor S of the retracted point: it is "
        r"zero, σ_1 = σ_r = 0 \(rank 0 < 2\)",
    ),
    "embedded-rank-one-core": (
        _embedded,
        lambda geo, x: (-_rank_one_cut(x), np.zeros_like(x[0]), np.zeros_like(x[2])),
        r"leaves the rank-2 manifold: rank-deficient factor S of the retracted point: σ_r/σ_1 = "
        r".* ≤ r·ε = 4\.4e-16 \(σ_r = .*, σ_1 = .*\): its rank is below r = 2",
    ),
    "embedded-inf-step": (
        _embedded,
        lambda geo, x: _with_inf(geo.zero_tangent(x)),
        r"the step ξ = \(M, U_p, V_p\): 1 non-finite entries",
    ),
    "embedded-core-overflow": (  # a finite step whose QR factor R_U overflows
        _embedded,
        lambda geo, x: (np.zeros((2, 2)), np.full((5, 2), 1e308), np.zeros((4, 2))),
        r"the retraction's core \[\[S \+ M, R_Vᵀ\], \[R_U, 0\]\]: \d+ non-finite entries",
    ),
    "embedded-qr-zero": (
        lambda: _embedded("qr"),
        _zero_core,
        "factor S of the retracted point: it is zero",
    ),
    "embedded-qr-inf": (
        lambda: _embedded("qr"),
        lambda geo, x: _with_inf(geo.zero_tangent(x)),
        r"the step ξ = \(M, U_p, V_p\): 1 non-finite entries",
    ),
    "quotient-zero-factor": (
        _quotient,
        lambda geo, x: (-x[0], np.zeros_like(x[1])),
        "leaves the rank-2 manifold: rank-deficient factor A of the retracted point: it is zero",
    ),
    "quotient-inf-step": (
        _quotient,
        lambda geo, x: _with_inf(geo.zero_tangent(x)),
        r"leaves the rank-2 manifold: factor B of the retracted point: 1 non-finite entries",
    ),
}


def _rank_one_cut(x):
    """S q qᵀ for the right singular vector q of S belonging to σ_2: S − S q qᵀ = σ_1 p_1 q_1ᵀ has
    rank one, up to rounding (σ_2 of the computed difference is ~u·σ_1 < r·ε·σ_1)."""
    s = x[1]
    _, _, vt = np.linalg.svd(s)
    q = vt[1][:, None]
    return s @ q @ q.T


@pytest.mark.parametrize("case", list(RANK_CASES))
def test_leaving_the_rank_r_manifold_says_what_happened(case):
    """Before: "σ_r/σ_1 = nan" (0/0 for a zero core, or the SVD of a non-finite one), and the
    quotient retraction let a non-finite factor through (nan ≤ tol is false)."""
    make, step, match = RANK_CASES[case]
    geo, x = make()
    xi = step(geo, x)
    saved = copy.deepcopy(x)
    with pytest.raises(ValueError, match=match) as info:
        geo.retract(x, xi)
    assert "nan" not in str(info.value)
    assert _tree_equal(x, saved)


@pytest.mark.parametrize(
    ("s", "match"),
    [
        (np.zeros((2, 2)), r"factor S: it is zero, σ_1 = σ_r = 0"),
        (np.diag([1.0, 0.0]), r"factor S: σ_r/σ_1 = 0\.000e\+00 .*\(σ_r = 0\.000e\+00, σ_1 = 1"),
    ],
)
def test_check_point_reports_the_measured_singular_values(s, match):
    geo, (u, _, v) = _embedded()
    with pytest.raises(ValueError, match=match) as info:
        geo.check_point((u, s, v))
    assert "nan" not in str(info.value)


def test_the_rank_message_reports_the_smallest_of_three_singular_values():
    """Rank 3, S = diag(2, 1, 2⁻⁶⁰): σ_r = 2⁻⁶⁰ ≈ 8.674e-19 (not σ_2 = 1) and σ_r/σ_1 = 2⁻⁶¹
    ≈ 4.337e-19 (not σ_r·σ_1), below r·ε = 6.7e-16. The SVD of a diagonal matrix is exact."""
    geo = ref.FixedRankEmbedded(6, 5, 3)
    u, _, v = geo.random_point(np.random.default_rng(3))
    match = r"σ_r/σ_1 = 4\.337e-19 ≤ r·ε = 6\.7e-16 \(σ_r = 8\.674e-19, σ_1 = 2\.000e\+00\)"
    with pytest.raises(ValueError, match=match):
        geo.check_point((u, np.diag([2.0, 1.0, 2.0**-60]), v))


@pytest.mark.parametrize("name", ["stiefel", "fixed_rank_embedded", "fixed_rank_quotient"])
def test_an_overflowing_step_is_refused_before_the_retraction(name):
    """lr·g overflows (lr = 1e10, g ~ 1e300): the optimizer names the step, on every geometry
    (before: "polar factor of a matrix with non-finite entries" or "σ_r/σ_1 = nan")."""
    geo = _geometry(name)
    rng = np.random.default_rng(13)
    x = geo.random_point(rng)
    opt = optim.rsgd(1e10)
    state = opt.init(geo, x)
    saved = copy.deepcopy((x, state))
    g = tree_map(lambda p: 1e300 * np.sign(rng.standard_normal(np.shape(p))), x)
    with np.errstate(over="ignore", invalid="ignore"):
        with pytest.raises(ValueError, match=r"the step ξ .*: \d+ non-finite entries") as info:
            opt.step(geo, x, g, state)
    assert "nan" not in str(info.value)
    assert _tree_equal((x, state), saved)
