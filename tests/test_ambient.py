"""Rules on the Euclidean gradient (``gradient="euclidean"``; ablation arms E and H), both
sides: the reference's ``Optimizer`` on ``euclidean.Ambient`` and the port's ``ChainOptimizer``
groups. The agreement of the two is a row of ``port_compare.RECORDS`` (arm_e, arm_h); here: the
first step against a hand computation, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

import reference as ref
from reference import optim as ro
from reference.euclidean import Ambient

LR, EPS = 0.05, 1e-8


def _frame_and_gradient(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return ref.Stiefel(9, 3).random_point(rng), rng.standard_normal((9, 3))


def _adam(gradient: str, radius: float | None = None) -> ro.Optimizer:
    steps = [ro.scale_by_adam(0.9, 0.999, EPS), ro.scale(-LR)]
    if radius is not None:
        steps.append(ro.trust_region(radius))
    return ro.Optimizer(ro.chain(*steps), LR, gradient=gradient)


@pytest.mark.parametrize("radius", [None, 0.01])
def test_reference_arm_e_first_step_is_polar_of_the_raw_scaled_gradient(radius) -> None:
    """Step 1 of frame Adam: m̂ = G, √v̂ = RMS(G), so ξ = −lr·G/(RMS(G) + ε), capped at Δ;
    W₁ = polar(W + ξ) with no projection of G. Negative control: the Riemannian rule (ξ from
    P_W(G)) lands elsewhere."""
    st = ref.Stiefel(9, 3)
    w, g = _frame_and_gradient()
    xi = -LR * g / (np.sqrt(np.mean(g**2)) + EPS)
    if radius is not None:
        xi *= min(1.0, radius / np.linalg.norm(xi))
    expected = ref.linalg.polar(w + xi)
    opt = _adam("euclidean", radius)
    w1, state = opt.step(st, w, g, opt.init(st, w))
    assert np.linalg.norm(w1 - expected) <= 1e-14
    # the moment is the raw gradient's (1 − β1)·G, never projected
    assert np.allclose(state[0].m, (1 - 0.9) * g, rtol=1e-15, atol=0)
    riemannian = _adam("riemannian", radius)
    w1_r, _ = riemannian.step(st, w, g, riemannian.init(st, w))
    assert np.linalg.norm(w1_r - expected) > 1e-4


def test_ambient_is_identity_projection_and_frobenius_metric() -> None:
    st = ref.Stiefel(9, 3)
    w, g = _frame_and_gradient(1)
    amb = Ambient(st)
    assert amb.proj_tangent(w, g) is g and amb.transport(w, w, g) is g
    assert amb.norm(w, g) == pytest.approx(np.linalg.norm(g), rel=1e-15)
    assert amb.moment_groups == st.moment_groups


def test_refusals() -> None:
    with pytest.raises(ValueError, match="unknown gradient 'natural'"):
        ro.Optimizer(ro.scale(-LR), LR, gradient="natural")
    r1 = ref.GEOMETRIES["fixed_rank_embedded"](6, 5, 2)
    with pytest.raises(ValueError, match="embedded layout"):
        Ambient(r1)


def test_port_groups_refuse_a_euclidean_gradient_where_it_is_undefined() -> None:
    torch = pytest.importorskip("torch")
    import torch_port as tp

    gen = torch.Generator().manual_seed(0)
    r1 = tp.GEOMETRIES["fixed_rank_embedded"](6, 5, 2)
    params = [torch.nn.Parameter(t) for t in r1.random_point(gen)]
    group = {"params": params, "geometry": "fixed_rank_embedded"}
    with pytest.raises(ValueError, match="gradient='euclidean' needs tangent vectors"):
        tp.RiemannianAdam([{**group, "gradient": "euclidean"}])
    with pytest.raises(ValueError, match="unknown gradient 'natural'"):
        tp.RiemannianAdam([{**group, "gradient": "natural"}])
    # a state dict of a Riemannian group is not loaded into a Euclidean-gradient group
    w = torch.nn.Parameter(tp.Stiefel(9, 3).random_point(gen, (2,)))
    riem = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=LR)
    w.grad = torch.randn(w.shape, generator=gen, dtype=w.dtype)
    riem.step()
    eucl = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel", "gradient": "euclidean"}])
    with pytest.raises(ValueError, match="gradient=None, but this optimizer's group has"):
        eucl.load_state_dict(riem.state_dict())
