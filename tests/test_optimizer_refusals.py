"""What the port's optimizers refuse when they are built or given a group: one table of
(input, error type, message pattern) rows, run by one generic test, in the manner of torch's
``ErrorOptimizerInput``. A refused ``add_param_group`` leaves the optimizer as it was.

What a step or a load refuses is in ``test_step_refusals.py`` (its own tables: hyperparameters
set after construction, changes between steps); flags torch's optimizers take are in
``test_torch_conventions.py`` (``FLAGS``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402

RADIUS = 0.5


def _frames(d: int = 8, r: int = 3, batch: tuple[int, ...] = (2,)) -> torch.nn.Parameter:
    g = torch.Generator().manual_seed(0)
    return torch.nn.Parameter(tp.Stiefel(d, r).random_point(g, batch, dtype=torch.float64))


def _plain() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(4, dtype=torch.float64))


def _stiefel(w: torch.Tensor, **keys: Any) -> dict:
    return {"params": [w], "geometry": "stiefel", **keys}


def _factors() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    point = tp.GEOMETRIES["fixed_rank_embedded"](6, 5, 2).random_point(g)
    return [torch.nn.Parameter(t) for t in point]


def _capturable(**kw: Any) -> Any:
    return tp.RiemannianAdam(
        [_stiefel(_frames())], **{"lr": 1e-2, "trust_radius": RADIUS, "capturable": True, **kw}
    )


def _adam_with_frames() -> Any:
    """RiemannianAdam on frames and a plain parameter, after one step (so it holds state)."""
    w, b = _frames(), _plain()
    opt = tp.RiemannianAdam([_stiefel(w), {"params": [b]}], lr=1e-2, trust_radius=RADIUS)
    g = torch.Generator().manual_seed(1)
    for p in (w, b):
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
    opt.step()
    return opt


def _off_manifold() -> torch.nn.Parameter:
    """Frames scaled by 1.02: ‖WᵀW − I‖_F = (1.02² − 1)·√3 = 0.06997 per frame."""
    w = _frames()
    with torch.no_grad():
        w.mul_(1.02)
    return w


@dataclass(frozen=True)
class Refusal:
    """``act(opt)`` must raise ``error`` matching ``pattern``; ``opt`` is ``build()`` (None for a
    refusal at construction, where ``act`` builds)."""

    name: str
    act: Callable[[Any], Any]
    error: type[Exception]
    pattern: str
    build: Callable[[], Any] = field(default=lambda: None)


def _add(group: Callable[[], dict]) -> Callable[[Any], Any]:
    return lambda opt: opt.add_param_group(group())


REFUSALS = [
    # hyperparameters
    Refusal("negative lr", lambda _: tp.RiemannianAdam([_frames()], lr=-1e-3), ValueError, "lr"),
    Refusal(
        "beta2 = 1", lambda _: tp.RiemannianAdam([_frames()], betas=(0.9, 1.0)), ValueError, "beta2"
    ),
    Refusal(
        "unknown moment",
        lambda _: tp.RiemannianAdam([_stiefel(_frames())], moment="diag"),
        ValueError,
        "moment",
    ),
    Refusal(
        "negative trust radius",
        lambda _: tp.RSGD([_stiefel(_frames())], lr=1.0, trust_radius=-1.0),
        ValueError,
        "trust_radius",
    ),
    Refusal(
        "momentum c = 0",
        lambda _: tp.RiemannianMomentum([_frames()], lr=1.0, c=0.0),
        ValueError,
        "c must",
    ),
    Refusal(
        "plain eps = 0",
        lambda _: tp.RiemannianAdam([{"params": [_plain()]}], eps=0.0),
        ValueError,
        r"eps=0 is 0 in torch.float64, so AdamW's update",
    ),
    # geometries and points
    Refusal(
        "unknown geometry",
        lambda _: tp.RiemannianAdam([{"params": [_frames()], "geometry": "grassmann"}]),
        ValueError,
        "unknown geometry",
    ),
    Refusal(
        "unknown retraction",
        lambda _: tp.RiemannianAdam([_stiefel(_frames(), retraction="cayley")]),
        ValueError,
        "retraction",
    ),
    Refusal(
        "r > d",
        lambda _: tp.RiemannianAdam(
            [_stiefel(torch.nn.Parameter(torch.zeros(2, 5, dtype=torch.float64)))]
        ),
        ValueError,
        r"1 ≤ r ≤ d",
    ),
    Refusal(
        "a parameter listed twice",
        lambda _: tp.RiemannianAdam([{"params": [p := _plain(), p]}]),
        ValueError,
        r"lists the same parameter twice \(params\[0\] and ",
    ),
    Refusal(
        "a frame tensor holding no point",
        lambda _: tp.RiemannianAdam(
            [_stiefel(torch.nn.Parameter(torch.zeros(0, 8, 3, dtype=torch.float64)))]
        ),
        ValueError,
        r"shape \(0, 8, 3\) holds no point",
    ),
    # the capturable step
    Refusal(
        "capturable without a trust radius",
        lambda _: _capturable(trust_radius=None),
        ValueError,
        "needs trust_radius",
    ),
    Refusal(
        "capturable trust radius above 0.7",
        lambda _: _capturable(trust_radius=0.8),
        ValueError,
        "0 < Δ ≤ 0.7",
    ),
    Refusal("capturable eps = 0", lambda _: _capturable(eps=0.0), ValueError, "needs eps > 0"),
    Refusal(
        "capturable elementwise moment",
        lambda _: _capturable(moment="elementwise"),
        ValueError,
        "moment='frame'",
    ),
    Refusal(
        "capturable sum reduction",
        lambda _: _capturable(reduction="sum"),
        ValueError,
        "reduction='mean'",
    ),
    Refusal(
        "capturable fixed-rank factors",
        lambda _: tp.RiemannianAdam(
            [{"params": _factors(), "geometry": "fixed_rank_embedded"}],
            trust_radius=RADIUS,
            capturable=True,
        ),
        ValueError,
        "geometry='stiefel'",
    ),
    # groups added to a built optimizer
    Refusal(
        "a group whose capturable differs",
        _add(lambda: _stiefel(_frames(), capturable=False)),
        ValueError,
        "the same for every parameter group",
        build=_capturable,
    ),
    Refusal(
        "a group with a point off its manifold",
        _add(lambda: _stiefel(_off_manifold())),
        ValueError,
        r"off St\(8, 3\): ‖WᵀW − I‖ = 6\.99\de-02.*reproject",
        build=_adam_with_frames,
    ),
    Refusal(
        "a group with an unknown geometry",
        _add(lambda: {"params": [_frames()], "geometry": "grassmann"}),
        ValueError,
        "unknown geometry",
        build=_adam_with_frames,
    ),
]


def _snapshot(opt: Any) -> tuple[list, list]:
    """The groups' keys and sizes, and a copy of every point and state tensor."""
    if opt is None:
        return [], []
    params = [p for g in opt.param_groups for p in g["params"]]
    tensors = [p.detach().clone() for p in params] + [
        v.clone() for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor)
    ]
    return [[*sorted(g), len(g["params"])] for g in opt.param_groups], tensors


@pytest.mark.parametrize("row", REFUSALS, ids=[row.name for row in REFUSALS])
def test_a_bad_input_is_refused_by_name(row: Refusal) -> None:
    opt = row.build()
    layout, tensors = _snapshot(opt)
    with pytest.raises(row.error, match=row.pattern):
        row.act(opt)
    after_layout, after = _snapshot(opt)
    assert after_layout == layout  # no group added
    assert len(after) == len(tensors) and all(
        torch.equal(a, b) for a, b in zip(tensors, after, strict=True)
    )


def test_the_table_names_each_row_once() -> None:
    names = [row.name for row in REFUSALS]
    assert len(names) == len(set(names))


def test_an_accepted_input_fails_the_generic_test() -> None:
    """Control: a row whose input is accepted is not counted as refused."""
    row = Refusal("accepted", lambda _: tp.RiemannianAdam([_frames()], lr=1e-3), ValueError, "lr")
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        test_a_bad_input_is_refused_by_name(row)


def test_a_refusal_that_writes_fails_the_generic_test() -> None:
    """Control: a refusal raised after a point was changed is caught by the snapshot."""

    def writes_then_refuses(opt: Any) -> None:
        with torch.no_grad():
            opt.param_groups[0]["params"][0].mul_(2.0)
        raise ValueError("refused too late")

    row = Refusal("late", writes_then_refuses, ValueError, "too late", build=_adam_with_frames)
    with pytest.raises(AssertionError):
        test_a_bad_input_is_refused_by_name(row)
