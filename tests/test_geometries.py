"""The ten geometries under every update rule, and the block variants' structure (DESIGN §4.4)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import reference as ref
from proofs_checks import geometry_laws as law
from proofs_checks.bounds import frame_error
from reference.blocks import BlockGeometry, components, gqa_pattern
from reference.geometry import parts, tree_map

NAMES = list(ref.GEOMETRIES)
RULES = {
    "riemannian_adam": lambda: ref.optim.riemannian_adam(1e-2, trust_radius=0.1),
    "riemannian_adam_elementwise": lambda: ref.optim.riemannian_adam(
        1e-2, trust_radius=0.1, moment="elementwise"
    ),
    "riemannian_momentum": lambda: ref.optim.riemannian_momentum(1e-2, beta=0.9, c=1.0),
    "rsgd": lambda: ref.optim.rsgd(1e-2, trust_radius=0.1),
    "normalized_rsgd": lambda: ref.optim.normalized_rsgd(1e-3),
}


def make(name: str):
    sizes = (3, 4, 2) if name.startswith("block_") else (6, 5, 2)
    return ref.GEOMETRIES[name](*sizes)


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", NAMES)
def test_every_rule_runs_on_every_geometry(name: str, rule: str) -> None:
    """30 steps on F(W) = ⟨C, W⟩ + ½‖W‖² + … : finite, constraints kept (bound as in GEO-*:
    3·frame_error), the loss goes down, and the stored momentum is tangent at the new point
    after every step (it is transported), within GEO's ``law_tolerance``."""
    geo, rng = make(name), np.random.default_rng(1)
    x = geo.random_point(rng)
    f, grad = law.smooth_loss(2)
    opt = RULES[rule]()
    state = opt.init(geo, x)
    start = f(geo.to_matrix(x))
    for _ in range(30):
        egrad = geo.egrad_from_matrix(x, grad(geo.to_matrix(x)))
        x, state = opt.step(geo, x, egrad, state)
        momentum = getattr(state[0], "m", None)
        if momentum is not None and any(np.any(p) for p in parts(momentum)):
            assert law.tangency(geo, x, momentum) <= law.law_tolerance(geo, x)
    k = max(max(np.shape(p)) for p in parts(x))
    assert law.constraints(geo, x) <= 3 * frame_error(k, 2)
    assert f(geo.to_matrix(x)) < start


@pytest.mark.parametrize("name", NAMES)
def test_one_scalar_moment_per_stored_frame(name: str) -> None:
    geo = make(name)
    x = geo.random_point(np.random.default_rng(0))
    state = ref.optim.riemannian_adam(1e-2).init(geo, x)
    frames = 2 if name.endswith("stiefel_pair") else 1  # default blocks: one group
    assert len(state[0].sqrt_v) == len(geo.moment_groups) == frames
    assert all(isinstance(v, float) for v in state[0].sqrt_v)


def test_gqa_components_and_patterns() -> None:
    assert gqa_pattern(4, 2) == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert components(gqa_pattern(4, 2)) == [([0, 1], [0]), ([2, 3], [1])]
    assert components(gqa_pattern(3, 3)) == [([0], [0]), ([1], [1]), ([2], [2])]
    with pytest.raises(ValueError, match="multiple"):
        gqa_pattern(3, 2)
    with pytest.raises(ValueError, match="must appear"):
        BlockGeometry(ref.FixedRankQuotient, 3, 4, 2, pattern=[(0, 0), (2, 0)])
    with pytest.raises(ValueError, match="grouping"):
        BlockGeometry(ref.FixedRankQuotient, 3, 4, 2, groups="heads")


@pytest.mark.parametrize("base", list(ref.GEOMETRIES)[:5])
def test_mha_block_variant_equals_the_plain_one(base: str) -> None:
    """Under MHA the default groups are single heads: the block trajectory is the plain one run
    head by head (each head its own point and moments)."""
    m, n, r = 5, 4, 2
    block = ref.GEOMETRIES[f"block_{base}"](m, n, r, n_heads=2, n_kv_heads=2)
    plain = ref.GEOMETRIES[base](m, n, r)
    assert len(block.groups) == 2
    rng = np.random.default_rng(3)
    heads = (plain.random_point(rng), plain.random_point(rng))
    grads = [
        tuple(tree_map(lambda p: rng.standard_normal(p.shape), h) for h in heads) for _ in range(5)
    ]
    opt = ref.optim.riemannian_adam(1e-2, trust_radius=0.1)
    x, state = heads, opt.init(block, heads)
    for g in grads:
        x, state = opt.step(block, x, g, state)
    for h in range(2):
        y, s = heads[h], opt.init(plain, heads[h])
        for g in grads:
            y, s = opt.step(plain, y, g[h], s)
        for a, b in zip(parts(x[h]), parts(y), strict=True):
            # Same arithmetic up to where frame norms are scaled before summing: 5 steps of
            # per-step rounding (GEO's frame_error ≈ 1e-14 at these sizes) bound the gap.
            np.testing.assert_allclose(a, b, rtol=0, atol=5 * frame_error(5, 2))


def test_gqa_shared_key_receives_the_sum_of_its_blocks() -> None:
    """For L = Σ_h ⟨C_h, A_h B_gᵀ⟩ the key gradient is Σ_h C_hᵀ A_h; the stacked geometry sees
    the same gradient as its own matrix function F(X) = ⟨[C_1; C_2], X⟩."""
    m, n, r = 3, 4, 2
    geo = ref.GEOMETRIES["block_fixed_rank_quotient"](m, n, r)  # two queries, one key
    rng = np.random.default_rng(4)
    x = geo.random_point(rng)
    a, b = geo.head_factors(x)
    c = [rng.standard_normal((m, n)) for _ in range(2)]
    g_a = [c[h] @ b[0] for h in range(2)]
    g_b = [sum(c[h].T @ a[h] for h in range(2))]
    stacked = geo.egrad_from_heads(x, g_a, g_b)
    direct = geo.egrad_from_matrix(x, (np.vstack(c),))
    for p, q in zip(parts(stacked), parts(direct), strict=True):
        np.testing.assert_allclose(p, q, rtol=0, atol=1e-14)  # identical products, reordered sums
    blocks = np.vstack([a[h] @ b[0].T for h in range(2)])
    np.testing.assert_allclose(geo.to_matrix(x)[0], blocks, rtol=0, atol=1e-14)


def test_block_stiefel_pair_keeps_the_stacked_queries_jointly_orthonormal() -> None:
    geo = ref.GEOMETRIES["block_stiefel_pair"](6, 5, 2)  # two query heads, one key frame
    rng = np.random.default_rng(5)
    x = geo.random_point(rng)
    opt = ref.optim.riemannian_adam(1e-2, trust_radius=0.1)
    state = opt.init(geo, x)
    for _ in range(50):
        x, state = opt.step(geo, x, tree_map(lambda p: rng.standard_normal(p.shape), x), state)
    a, b = geo.head_factors(x)
    joint = sum(ah.T @ ah for ah in a)
    assert np.linalg.norm(joint - np.eye(2)) < 3 * frame_error(12, 2)
    assert np.linalg.norm(a[0].T @ a[0] - np.eye(2)) > 0.1  # one head alone is not orthonormal
    assert np.linalg.norm(b[0].T @ b[0] - np.eye(2)) < 3 * frame_error(12, 2)


def test_grouping_all_couples_every_head() -> None:
    geo = ref.GEOMETRIES["block_partial_isometry_quotient"](
        3, 4, 2, n_heads=2, n_kv_heads=2, groups="all"
    )
    assert geo.groups == [([0, 1], [0, 1])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = geo.random_point(np.random.default_rng(0))
    assert [p.shape for p in parts(x)] == [(6, 2), (8, 2)]


@pytest.mark.parametrize(
    "make_geo",
    [
        lambda: ref.FixedRankQuotient(6, 5, 2),
        lambda: ref.FixedRankQuotient(6, 5, 2, metric="balanced"),
        lambda: ref.PartialIsometryQuotient(6, 5, 2),
    ],
    ids=["R2-preconditioned", "R2-balanced", "P2"],
)
def test_quotient_steps_do_not_depend_on_the_representative(make_geo) -> None:
    """Adam from x and from x·M (same W, same gradient of F(W)) reaches the same W: every
    per-frame scalar uses the metric norm, which is invariant. 10 steps; the per-step rounding
    is GEO's law_tolerance (which carries κ(A)²κ(B)² for R2), so 10·law_tolerance bounds it."""
    geo, rng = make_geo(), np.random.default_rng(6)
    x = geo.random_point(rng)
    g = law.random_group_element(geo, rng)
    _f, grad = law.smooth_loss(7)
    ends = []
    for start in (x, geo.act(x, g)):
        opt = ref.optim.riemannian_adam(1e-2, trust_radius=0.1)
        y, state = start, opt.init(geo, start)
        for _ in range(10):
            y, state = opt.step(geo, y, geo.egrad_from_matrix(y, grad(geo.to_matrix(y))), state)
        ends.append(geo.to_matrix(y))
    assert np.linalg.norm(ends[0] - ends[1]) <= 10 * law.law_tolerance(geo, x)


@pytest.mark.parametrize("name", ["fixed_rank_embedded", "fixed_rank_quotient"])
def test_full_rank_r_equal_to_min_m_n_is_accepted(name) -> None:
    """r = min(m, n) is allowed (r ≤ min(m, n)); r = min(m, n) + 1 is refused with both."""
    geometry = ref.GEOMETRIES[name](4, 3, 3)
    x = geometry.random_point(np.random.default_rng(0))
    geometry.check_point(x)
    with pytest.raises(ValueError, match=r"r ≤ min\(m, n\), got r=4 > min\(4, 3\)"):
        ref.GEOMETRIES[name](4, 3, 4)


def test_r2_random_points_have_the_stated_scale() -> None:
    """R2's random A, B are Gaussian scaled by 1/√m and 1/√n: E‖A‖_F² = E‖B‖_F² = r. Over
    N = 400 points the mean of ‖A‖_F² (variance 2r/m per point) has standard deviation
    sqrt(2r/(m·N)) ≈ 0.041 at (m, r) = (6, 2); 6 of them fail an honest draw with probability
    below 2e-9."""
    geo = ref.GEOMETRIES["fixed_rank_quotient"](6, 5, 2)
    rng = np.random.default_rng(0)
    points = [geo.random_point(rng) for _ in range(400)]
    for k, rows in ((0, 6), (1, 5)):
        mean = float(np.mean([np.sum(x[k] ** 2) for x in points]))
        assert abs(mean - 2) <= 6 * (2 * 2 / (rows * 400)) ** 0.5, (rows, mean)
