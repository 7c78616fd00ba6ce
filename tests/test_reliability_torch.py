"""Optimizer state that is checked, steps that commit whole, promises about scale and type
(docs/reliability.md, kinds 2, 3 and 4, torch side).

Every refusal names the group or parameter and the measured value, and leaves the optimizer,
its state and the parameters exactly as they were (compared bitwise).
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from torch_port.nn import RiemannianMultiheadAttention, build_optimizer, reproject  # noqa: E402
from torch_port.optim.guard import entries as validation  # noqa: E402
from torch_port.stiefel import LazyProduct, Stiefel, StiefelFrames  # noqa: E402

D, R = 8, 3


def _frames(dtype=torch.float64, batch=(2,), seed=0) -> torch.nn.Parameter:
    gen = torch.Generator().manual_seed(seed)
    w = Stiefel(D, R).random_point(generator=gen, batch_shape=batch)
    return torch.nn.Parameter(w.to(dtype))


def _grad(shape, seed: int, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    g = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (g * scale).to(dtype)


def _trained(dtype=torch.float64, steps: int = 5, cls=tp.RiemannianAdam, **kw):
    w, b = _frames(dtype), torch.nn.Parameter(torch.zeros(4, dtype=dtype))
    opt = cls([{"params": [w], "geometry": "stiefel"}, {"params": [b]}], lr=1e-2, **kw)
    for t in range(steps):
        w.grad, b.grad = _grad(w.shape, t, dtype), _grad(b.shape, 100 + t, dtype)
        opt.step()
    return w, b, opt


def _snapshot(opt, *params):
    return copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in params]


def _unchanged(opt, params, snap) -> bool:
    sd, values = snap
    now = opt.state_dict()
    same_state = all(
        torch.equal(v, now["state"][k][n])
        if isinstance(v, torch.Tensor)
        else v == now["state"][k][n]
        for k, entry in sd["state"].items()
        for n, v in entry.items()
    )
    return (
        same_state
        and sd["param_groups"] == now["param_groups"]
        and all(torch.equal(p, v) for p, v in zip(params, values, strict=True))
    )


# -- kind 2: state that is checked on load ------------------------------------------------------
def _bad_state_dicts():
    cases = {
        "adamw": (
            lambda sd, w, b: torch.optim.AdamW([{"params": [w]}, {"params": [b]}]).state_dict(),
            r"geometry=None, but this optimizer's group has geometry='stiefel'",
        ),
        "negative lr": (
            lambda sd, w, b: (sd["param_groups"][0].update(lr=-0.01), sd)[1],
            r"param_groups\[0\].*lr must be a finite number ≥ 0, got -0.01",
        ),
        "string lr": (
            lambda sd, w, b: (sd["param_groups"][1].update(lr="1e-3"), sd)[1],
            r"param_groups\[1\].*lr must be a finite number ≥ 0, got '1e-3'",
        ),
        "other moment": (
            lambda sd, w, b: (sd["param_groups"][0].update(moment="elementwise"), sd)[1],
            r"moment='elementwise', but this optimizer's group has moment='frame'",
        ),
        "broadcastable exp_avg": (
            lambda sd, w, b: (sd["state"][0].update(exp_avg=sd["state"][0]["exp_avg"][:1]), sd)[1],
            r"\['exp_avg'\]: expected shape \(2, 8, 3\), got \(1, 8, 3\)",
        ),
        "NaN exp_avg": (
            lambda sd, w, b: (sd["state"][0]["exp_avg"].view(-1).__setitem__(0, math.nan), sd)[1],
            r"\['exp_avg'\]: 1 non-finite entries",
        ),
        "negative sqrt_v": (
            lambda sd, w, b: (sd["state"][0].update(sqrt_v=-sd["state"][0]["sqrt_v"]), sd)[1],
            r"\['sqrt_v'\]: 2 negative entries",
        ),
        "negative exp_avg_sq": (
            lambda sd, w, b: (sd["state"][1]["exp_avg_sq"].fill_(-1.0), sd)[1],
            r"param_groups\[1\].*\['exp_avg_sq'\]: 4 negative entries",
        ),
        "fractional step": (
            lambda sd, w, b: (sd["state"][0].update(step=torch.tensor(2.5)), sd)[1],
            r"\['step'\]: the step count must be an integer in \[0, 16777216\) for "
            r"torch.float32, got 2.5",
        ),
        "step as a fractional number": (  # a whole number loads (test_torch_conventions)
            lambda sd, w, b: (sd["state"][0].update(step=3.5), sd)[1],
            r"\['step'\]: the step count must be an integer",
        ),
        "integer step tensor": (  # torch's foreach AdamW needs a floating step
            lambda sd, w, b: (sd["state"][1].update(step=torch.tensor(3)), sd)[1],
            r"param_groups\[1\].*\['step'\]: expected a one-entry floating tensor, got shape "
            r"\(\), dtype torch.int64",
        ),
        "step past float32's integers": (  # 2^24 + 1 rounds to 2^24: the count would stop
            lambda sd, w, b: (sd["state"][0].update(step=torch.tensor(2.0**24)), sd)[1],
            r"\['step'\]: the step count must be an integer in \[0, 16777216\)",
        ),
        "missing key": (
            lambda sd, w, b: (sd["state"][0].pop("sqrt_v"), sd)[1],
            r"expected the entries \['exp_avg', 'sqrt_v', 'step'\] of RiemannianAdam",
        ),
        "stray id": (
            lambda sd, w, b: (sd["state"].__setitem__(99, {}), sd)[1],
            r"state for parameter ids \[99\] that no group lists",
        ),
        "not a state dict": (lambda sd, w, b: [1, 2], "not an optimizer state dict"),
    }
    return cases


BAD = _bad_state_dicts()


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_state_dict_is_refused_and_changes_nothing(case: str) -> None:
    w, b, opt = _trained()
    make, message = BAD[case]
    bad = make(copy.deepcopy(opt.state_dict()), w, b)
    snap = _snapshot(opt, w, b)
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(bad)
    assert _unchanged(opt, [w, b], snap)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls", [tp.RiemannianAdam, tp.RiemannianMomentum])
def test_honest_states_load_and_sit_far_below_the_tangency_tolerance(dtype, cls) -> None:
    """The state this library writes passes its own load check in every dtype, by a margin:
    the measured tangency defect stays below 1/8 of sqrt(ε) (so the check flags violations,
    not rounding)."""
    w, _, opt = _trained(dtype, steps=30, cls=cls)
    key = "exp_avg" if cls is tp.RiemannianAdam else "momentum_buffer"
    m, w64 = opt.state[w][key].double(), w.detach().double()
    normal = w64 @ ((w64.mT @ m + m.mT @ w64) / 2)  # m − P_W(m)
    rel = (torch.linalg.matrix_norm(normal) / torch.linalg.matrix_norm(m)).max()
    assert float(rel) < validation.tangent_tolerance(dtype) / 8, float(rel)
    fresh = cls(copy.deepcopy(opt.param_groups), lr=1e-2)
    fresh.load_state_dict(copy.deepcopy(opt.state_dict()))


def test_bfloat16_resume_equals_continue() -> None:
    """√v of bfloat16 frames stays float32 through a state_dict round trip, so a resumed run
    continues bitwise as the uninterrupted one (torch alone would cast √v to bfloat16, where
    √β2·√v rounds back to √v and √v stops decaying)."""
    torch.manual_seed(0)
    model = RiemannianMultiheadAttention(16, 4, qk_geometry="stiefel").to(torch.bfloat16)
    x = torch.randn(2, 5, 16).to(torch.bfloat16)

    def run(m, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            m(x).float().pow(2).sum().backward()
            opt.step()

    opt = build_optimizer(model, lr=1e-2)
    run(model, opt, 5)
    saved, weights = copy.deepcopy(opt.state_dict()), copy.deepcopy(model.state_dict())
    run(model, opt, 20)
    again = RiemannianMultiheadAttention(16, 4, qk_geometry="stiefel").to(torch.bfloat16)
    again.load_state_dict(weights)
    resumed = build_optimizer(again, lr=1e-2)
    resumed.load_state_dict(saved)
    assert resumed.state[again.w_q]["sqrt_v"].dtype == torch.float32
    run(again, resumed, 20)
    assert torch.equal(again.w_q, model.w_q) and torch.equal(again.w_k, model.w_k)
    assert torch.equal(resumed.state[again.w_q]["sqrt_v"], opt.state[model.w_q]["sqrt_v"])


# -- kind 3: steps that commit whole ------------------------------------------------------------
@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda st: st.update(exp_avg=st["exp_avg"][:2]), r"\['exp_avg'\]: expected shape \(4,\)"),
        (lambda st: st.pop("exp_avg_sq"), r"expected the AdamW entries"),
    ],
)
def test_bad_plain_state_is_refused_before_any_frame_moves(corrupt, message) -> None:
    w, b, opt = _trained()
    corrupt(opt.state[b])
    w.grad, b.grad = _grad(w.shape, 50), _grad(b.shape, 51)
    before, step = w.detach().clone(), opt.state[w]["step"].clone()
    with pytest.raises(ValueError, match=message):
        opt.step()
    assert torch.equal(w, before) and torch.equal(opt.state[w]["step"], step)


def test_bad_frame_state_is_refused_before_anything_moves() -> None:
    w, b, opt = _trained()
    opt.state[w]["sqrt_v"] = opt.state[w]["sqrt_v"][:1]
    w.grad, b.grad = _grad(w.shape, 50), _grad(b.shape, 51)
    before_b = b.detach().clone()
    with pytest.raises(ValueError, match=r"\['sqrt_v'\]: expected shape \(2,\), got \(1,\)"):
        opt.step()
    assert torch.equal(b, before_b) and int(opt.state[b]["step"]) == 5


def test_cast_model_is_refused_with_the_fix_and_the_fix_works() -> None:
    torch.manual_seed(0)
    model = RiemannianMultiheadAttention(16, 4, qk_geometry="stiefel", vo_geometry="stiefel")
    model = model.to(torch.float64)  # float32 frames read as float64: off St by ~1e-7
    with pytest.raises(ValueError, match=r"off St\(16, 4\).*> 1\.5e-08.*torch_port\.nn\.reproject"):
        build_optimizer(model, lr=1e-2)
    found = reproject(model)
    assert all(1e-8 < res < 1e-6 for res in found.values()), found  # the float32 rounding
    model.check_points()
    assert float(tp.linalg.orthonormality_residual(model.w_q.detach()).max()) < 1e-14
    build_optimizer(model, lr=1e-2)


@pytest.mark.parametrize(
    "geometry", ["fixed_rank_embedded", "stiefel_pair", "block_partial_isometry_quotient"]
)
def test_reproject_restores_factored_points(geometry: str) -> None:
    torch.manual_seed(0)
    model = RiemannianMultiheadAttention(16, 4, qk_geometry=geometry).to(torch.float64)
    reproject(model)
    model.check_points(atol=1e-13)


# -- kind 4: scale and type ---------------------------------------------------------------------
def _one_step(cls, dtype, scale, d=D, r=R, **kw):
    w = torch.nn.Parameter(
        Stiefel(d, r).random_point(generator=torch.Generator().manual_seed(0)).to(dtype)
    )
    opt = cls([{"params": [w], "geometry": "stiefel"}], lr=1e-2, **kw)
    g = _grad((d, r), 1)
    w.grad = (g / g.abs().max() * scale).to(dtype)
    before = w.detach().double().clone()
    opt.step()
    return (w.detach().double() - before).norm().item()


@pytest.mark.parametrize(
    ("cls", "kw"), [(tp.RiemannianAdam, {"eps": 0.0}), (tp.NormalizedRSGD, {})]
)
@pytest.mark.parametrize("scale", [1e-310, 1e-300, 1e300])
def test_scale_free_rules_take_the_same_step_at_every_float64_scale(cls, kw, scale) -> None:
    """With ε = 0 both rules are degree zero in the gradient (RA-7): the step from c·G equals
    the step from G. Bound: a subnormal gradient of largest entry 1e-310 keeps its entries to
    within 2^-1074/1e-310 ≈ 5e-14 relative, and the step inherits that (the rules are
    Lipschitz in the direction); 1e-12 is asserted."""
    assert _one_step(cls, torch.float64, scale, **kw) == pytest.approx(
        _one_step(cls, torch.float64, 1.0, **kw), rel=1e-12
    )


def test_underflowing_sqrt_v_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"√v = .* underflows to 0 in torch.float32.*eps > 0"):
        _one_step(tp.RiemannianAdam, torch.float32, 1e-44, eps=0.0)


def test_float16_gradient_whose_projection_overflows_is_named() -> None:
    """W = 1/√8 (one column), G = 6e4·(1, −1, …, −1): P_W(G) = G − mean(G)·1 has first entry
    6e4·(1 + 6/8) = 1.05e5 > 65504, the largest float16: not representable, and said so (not
    "polar factor of a matrix with non-finite entries")."""
    w = torch.nn.Parameter(torch.full((8, 1), 8**-0.5, dtype=torch.float16))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2)
    w.grad = torch.tensor([[6e4]] + [[-6e4]] * 7, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"P_W\(G\) of this frame is not representable in"):
        opt.step()


@pytest.mark.parametrize(("d", "r"), [(8, 3), (768, 64)])
def test_float16_gradient_near_its_largest_value_steps(d: int, r: int) -> None:
    """Entries up to 6e4: partial sums of WᵀG overflow float16 although P_W(G) fits (its
    largest entry is 4.4e4 and 5.5e4 here, measured in float64), so the projection is taken at
    the scale 2^-15 (exact) and the step agrees with the float64 step to float16's precision
    (2^-11 relative per entry; 2e-2 on the step's norm is asserted)."""
    step = _one_step(tp.RiemannianAdam, torch.float16, 6e4, d=d, r=r)
    assert step == pytest.approx(
        _one_step(tp.RiemannianAdam, torch.float64, 6e4, d=d, r=r), rel=2e-2
    )


@pytest.mark.parametrize("name", sorted(tp.GEOMETRIES))
@pytest.mark.parametrize("sizes", [(True, 4, 2), (6, 4.0, 2), (6, 4, "2")])
def test_port_geometries_refuse_non_integer_sizes(name: str, sizes) -> None:
    if name == "stiefel":  # St(d, r): the bad value as d or r
        sizes = (sizes[0], sizes[2] if isinstance(sizes[1], int) else sizes[1])
    with pytest.raises((TypeError, ValueError), match=r"integer"):
        tp.GEOMETRIES[name](*sizes)


@pytest.mark.parametrize("lazy", [False, True])
def test_float16_transport_of_a_large_moment_is_taken_at_scale_1(lazy: bool) -> None:
    """A float16 moment with entries up to 6e4 at d = 768: partial sums of Yᵀm overflow, the
    projection P_Y(m) itself fits (checked in float64 below). The transport is redone at scale
    2^-15 (exact), so it agrees with the float64 projection of the same entries to float16's
    rounding of O(d) sums, relative 2^-11·sqrt(d) ≈ 1.4e-2 of max|m| (asserted: 2e-2; measured
    18 against max|m| = 6e4, i.e. 3e-4)."""
    d, r = 768, 64
    frames = StiefelFrames(Stiefel(d, r))
    st = Stiefel(d, r)
    y = st.random_point(generator=torch.Generator().manual_seed(0)).half()
    y64 = y.double()
    tangent = st.proj(y64, _grad((d, r), 2))
    m = y64 * 4e5 + tangent / tangent.abs().max() * 1e4  # a large normal part: Yᵀm ≈ 4e5·I
    m = (m / m.abs().max() * 6e4).half()
    m64 = m.double()
    exact = m64 - y64 @ ((y64.mT @ m64 + m64.mT @ y64) / 2)
    assert float(exact.abs().max()) < 65504  # representable: the scaled route must succeed
    assert not bool(torch.isfinite(y.mT @ m).all())  # the unscaled Yᵀm overflows here
    target = LazyProduct(y, torch.eye(r, dtype=y.dtype)) if lazy else y
    (out,) = frames.transport_owned((y,), (target,), (m.clone(),))
    assert float((out.double() - exact).abs().max()) < 2e-2 * 6e4


def test_a_zero_gradient_with_eps_zero_gives_a_zero_step_not_an_error() -> None:
    """ε = 0, frame moment: a frame whose gradient is exactly zero has √v = 0 and m = 0, and the
    step 0/0 := 0 (DESIGN §5): no error, and the frame only re-orthonormalised by the polar
    retraction (‖polar(W) − W‖ ≤ frame_error(6, 2)), while the other frame moves."""
    from proofs_checks.bounds import frame_error

    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(tp.Stiefel(6, 2).random_point(gen, (2,)))
    opt = tp.RiemannianAdam([{"params": [w], "geometry": "stiefel"}], lr=1e-2, eps=0.0)
    g = torch.randn(2, 6, 2, generator=gen, dtype=torch.float64)
    g[1] = 0.0
    w.grad = g
    before = w.detach().clone()
    opt.step()
    assert float(torch.linalg.norm(w[1].detach() - before[1])) <= frame_error(6, 2)
    assert float(torch.linalg.norm(w[0].detach() - before[0])) > 1e-3


def test_zero_gradient_entries_with_eps_zero_give_a_finite_elementwise_step() -> None:
    """ε = 0, elementwise moment: where an entry's √v̂ + ε is 0 (every entry of a frame whose
    gradient is zero: its Riemannian gradient is P_W(0) = 0) its ratio is 0, not 0/0 = NaN, so
    the step is finite and the frame stays on St(6, 2) within the polar retraction's drift
    bound 4r(r + 1)u + 2(d + r)r·u."""
    from proofs_checks.port_compare.geometries import polar_drift_bound

    gen = torch.Generator().manual_seed(1)
    w = torch.nn.Parameter(tp.Stiefel(6, 2).random_point(gen, (2,)))
    opt = tp.RiemannianAdam(
        [{"params": [w], "geometry": "stiefel"}], lr=1e-2, eps=0.0, moment="elementwise"
    )
    g = torch.randn(2, 6, 2, generator=gen, dtype=torch.float64)
    g[0] = 0.0
    w.grad = g
    opt.step()
    assert bool(torch.isfinite(w).all())
    drift = float(tp.linalg.orthonormality_residual(w.detach()).max())
    assert drift <= polar_drift_bound(6, 2, torch.float64)


def test_a_gradient_whose_norm_overflows_gives_the_scaled_down_step() -> None:
    """A gradient of entries up to 2^1023 whose Frobenius norm overflows float64 (the Euclidean
    gradient of arm E, never projected): ``frame_rms`` takes its scaled route
    s·(‖g/s‖/sqrt(entries)), and with ε = 0 Adam's step is scale invariant, so it equals the
    step of the gradient divided by 2^1023: the directions within ``relative_tolerance(6, 2,
    spread=0)`` (the same input up to an exact power of two), each retraction within
    ``step_error(6, 2)`` of its exact value: ‖Δ₁ − Δ₀‖ ≤ tol·‖Δ₀‖ + 2·step_error."""
    from proofs_checks.bounds import relative_tolerance, step_error

    steps = []
    for scale in (1.0, 2.0**1023):
        gen = torch.Generator().manual_seed(2)
        w = torch.nn.Parameter(tp.Stiefel(6, 2).random_point(gen))
        group = {"params": [w], "geometry": "stiefel", "gradient": "euclidean"}
        opt = tp.RiemannianAdam([group], lr=1e-2, eps=0.0)
        z = torch.randn(6, 2, generator=gen, dtype=torch.float64)
        z = torch.sign(z) + 0.1 * z  # entries near ±1: ‖z‖/max|z| ≈ sqrt(12)/1.2 > 2
        w.grad = z / z.abs().max() * scale
        assert (scale == 1.0) == math.isfinite(float(torch.linalg.norm(w.grad)))
        before = w.detach().clone()
        opt.step()
        steps.append(w.detach() - before)
    size = float(torch.linalg.norm(steps[0]))
    bound = relative_tolerance(6, 2, spread=0.0) * size + 2 * step_error(6, 2)
    assert float(torch.linalg.norm(steps[1] - steps[0])) <= bound


def test_the_adam_transform_has_the_reference_defaults() -> None:
    """``transforms.scale_by_adam``'s defaults are the reference's (a rule composed from it
    without arguments is the reference's rule)."""
    import inspect

    from reference import optim as ro
    from torch_port.optim import transforms

    port = inspect.signature(transforms.scale_by_adam).parameters
    ref = inspect.signature(ro.scale_by_adam).parameters
    assert {k: p.default for k, p in port.items()} == {k: p.default for k, p in ref.items()}


@pytest.mark.parametrize("cap", [False, True], ids=["eager", "capturable"])
def test_a_moment_not_tangent_at_the_loaded_point_is_refused_by_the_next_step(cap) -> None:
    """torch's ``set_state_dict`` loads the optimizer before the model, so a load cannot
    refuse a moment for not being tangent at the points it sees; the first step after the
    load checks it against the points as they are then. A moment that is not tangent (a
    Gaussian) is refused by that step, naming the load, before anything is written; a state
    loaded before the weights it was saved with (torch's order) steps as the run it came from,
    bitwise."""
    kw = {"trust_radius": 0.5, "capturable": cap}
    w, b, opt = _trained(**kw)
    sd = copy.deepcopy(opt.state_dict())
    bad = copy.deepcopy(sd)
    bad["state"][0]["exp_avg"] = _grad(w.shape, 7)
    opt.load_state_dict(bad)
    w.grad, b.grad = _grad(w.shape, 50), _grad(b.shape, 51)
    before = [w.detach().clone(), b.detach().clone()]
    with pytest.raises(
        ValueError, match=r"\['exp_avg'\] is not tangent .* after the state was loa"
    ):
        opt.step()
    assert torch.equal(w, before[0]) and torch.equal(b, before[1])
    # torch's order: the state into a fresh model's optimizer, then the weights
    w2, b2, fresh = _trained(steps=0, **kw)
    fresh.load_state_dict(copy.deepcopy(sd))
    with torch.no_grad():
        w2.copy_(w)
        b2.copy_(b)
    opt.load_state_dict(copy.deepcopy(sd))
    for t in range(3):
        for p, q, k in ((w, w2, 60 + t), (b, b2, 70 + t)):
            p.grad = _grad(p.shape, k)
            q.grad = p.grad.clone()
        opt.step()
        fresh.step()
    assert torch.equal(w, w2) and torch.equal(b, b2)
