"""RA-6's measurements (``proofs_checks.propositions.ra6_gauge``) on losses and actions for which
they must fail: the gauge residual is a property of the loss, measured by differentiating it,
not of the way its gradient is written."""

from __future__ import annotations

import numpy as np
import pytest

import reference as ref
from proofs_checks.propositions import ra6_gauge as gauge
from reference.linalg import frobenius

D, R, SEED = 12, 4, 3


@pytest.fixture(scope="module")
def problem():
    wq, wk, x = gauge.head_problem(D, R, SEED)
    return wq, wk, x, gauge.Scales.of(x, wq, wk)


def test_complex_step_matches_central_differences(problem) -> None:
    """The complex-step gradient against central differences (h = 1e-5: truncation
    h²·L'''/6 and rounding u·L/h, both ≲ 1e-9·‖G‖ here; 1e-6 relative allowed)."""
    wq, wk, x, _ = problem
    cq, _ = gauge.complex_step_gradient(x, wq, wk)
    h, fd = 1e-5, np.zeros_like(wq)
    for idx in np.ndindex(*wq.shape):
        e = np.zeros_like(wq)
        e[idx] = h
        fd[idx] = (gauge.loss(x, wq + e, wk) - gauge.loss(x, wq - e, wk)) / (2 * h)
    assert frobenius(fd - cq) <= 1e-6 * frobenius(cq)


def test_a_loss_not_of_the_product_has_a_vertical_gradient(problem) -> None:
    """L + ⟨C, W_Q⟩ is not a function of W_Q W_Kᵀ: its complex-step gradient, measured the same
    way, has a gauge residual ‖skew(W_QᵀC)‖ far above ``Scales.gauge`` (the check measures the
    loss, not the form of its gradient), while L's own stays below it."""
    wq, wk, x, sc = problem
    c = np.random.default_rng(0).standard_normal(wq.shape)
    cq, ck = gauge.complex_step_gradient(x, wq, wk)
    bound = sc.gauge(wq, wk, cq, ck)
    assert gauge.vertical_residual(wq, wk, cq, ck) <= bound
    assert gauge.vertical_residual(wq, wk, cq + c, ck) > 1e6 * bound


def test_invariance_is_measured_against_a_wrong_action(problem) -> None:
    """L(W_QQ, W_KQ) = L within ``Scales.invariance``; (W_QQ, W_KQᵀ) and (W_QQ, W_K) change L by
    far more (the measurement sees the action)."""
    wq, wk, x, sc = problem
    q = ref.linalg.haar_orthogonal(R, np.random.default_rng(1))
    bound = sc.invariance(q, wq, wk)
    assert abs(gauge.loss(x, wq @ q, wk @ q) - sc.loss) <= bound
    for moved in ((wq @ q, wk @ q.T), (wq @ q, wk)):
        assert abs(gauge.loss(x, *moved) - sc.loss) > 1e6 * bound


def test_separate_moments_give_the_stated_vertical_part() -> None:
    """Without the trust region and with separate moments the vertical part is nonzero and
    matches −½(a_Q − a_K)·skew(W_QᵀG_Q), a_F = lr/(√v̂_F + ε), within its bound; shared, it is
    0; with the dropped-transpose gradient the same comparison fails by orders of magnitude."""
    from proofs_checks.registry import Context

    ctx = Context(seed=SEED, quick=True)
    res, smallest, detail = gauge.vertical_parts(ctx, shared=False, radius=None, wrong=False)
    assert res <= 1.0 and smallest > 1e-4, detail
    res, smallest, detail = gauge.vertical_parts(ctx, shared=True, radius=None, wrong=False)
    assert res <= 1.0 and smallest == 0.0, detail
    res, _, detail = gauge.vertical_parts(ctx, shared=True, radius=None, wrong=True)
    assert res > 1e6, detail
