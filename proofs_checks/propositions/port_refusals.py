"""PORT-11: the optimizers' guard refuses each bad input by name before anything is written, and
accepts the inputs at the edges of what it allows.

One table, ``ROWS``: what is built or done (``act``, on the optimizer ``build`` makes, or None
where ``act`` builds one), and what must follow: a refusal (the error type and a pattern of its
message, with every parameter, state tensor and group as they were), an acceptance (``error``
None), or a warning attributed to the caller's line (``error`` a ``Warning`` class).
``tests/test_optimizer_refusals.py`` runs the same table row by row, in the manner of torch's
``ErrorOptimizerInput``; what a step or a load refuses is in ``tests/test_step_refusals.py``.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proofs_checks.harness import substituted
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

RADIUS = 0.5


@dataclass(frozen=True)
class Row:
    """``act(opt)`` on ``opt = build()`` (None where ``act`` builds) must raise ``error``
    matching ``pattern`` and change nothing; with ``error`` None it must be accepted; with a
    ``Warning`` class it must warn with it, matching ``pattern``, at the caller's line."""

    name: str
    act: Callable[[Any], Any]
    error: type[BaseException] | None
    pattern: str = ""
    build: Callable[[], Any] = field(default=lambda: None)


def _frames(d: int = 8, r: int = 3, batch: tuple[int, ...] = (2,)) -> Any:
    import torch

    import torch_port as tp

    g = torch.Generator().manual_seed(0)
    return torch.nn.Parameter(tp.Stiefel(d, r).random_point(g, batch, dtype=torch.float64))


def _zeros(*shape: int) -> Any:
    import torch

    return torch.nn.Parameter(torch.zeros(*shape, dtype=torch.float64))


def _plain(dtype: Any = None) -> Any:
    import torch

    return torch.nn.Parameter(torch.ones(4, dtype=dtype or torch.float64))


def _stiefel(w: Any, **keys: Any) -> dict:
    return {"params": [w], "geometry": "stiefel", **keys}


def _factors() -> list[Any]:
    import torch

    import torch_port as tp

    g = torch.Generator().manual_seed(0)
    point = tp.GEOMETRIES["fixed_rank_embedded"](6, 5, 2).random_point(g)
    return [torch.nn.Parameter(t) for t in point]


def _opt(name: str, params: Any, **kw: Any) -> Any:
    import torch_port as tp

    return getattr(tp, name)(params, **kw)


def _adam(params: Any, **kw: Any) -> Any:
    return _opt("RiemannianAdam", params, **kw)


def _capturable(dtype: Any = None, **kw: Any) -> Any:
    """RiemannianAdam(capturable=True) on frames (cast to ``dtype``) and a plain parameter."""
    w = _frames()
    if dtype is not None:
        w.data = w.data.to(dtype)
    hyper = {"lr": 1e-2, "trust_radius": RADIUS, "capturable": True, **kw}
    return _adam([_stiefel(w), {"params": [_plain(dtype)]}], **hyper)


def _adam_with_frames() -> Any:
    """RiemannianAdam on frames and a plain parameter, after one step (so it holds state)."""
    import torch

    w, b = _frames(), _plain()
    opt = _adam([_stiefel(w), {"params": [b]}], lr=1e-2, trust_radius=RADIUS)
    g = torch.Generator().manual_seed(1)
    for p in (w, b):
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
    opt.step()
    return opt


def _off_manifold() -> Any:
    """Frames scaled by 1.02: ‖WᵀW − I‖_F = (1.02² − 1)·√3 = 0.06997 per frame."""
    import torch

    w = _frames()
    with torch.no_grad():
        w.mul_(1.02)
    return w


def _add(group: Callable[[], dict]) -> Callable[[Any], Any]:
    return lambda opt: opt.add_param_group(group())


def _plain_eps(eps: float) -> Callable[[Any], Any]:
    """AdamW's ε on a float32 plain parameter; it rounds to 0 there at and below 2⁻¹⁵⁰, half
    the smallest float32 subnormal."""

    def act(_: Any) -> Any:
        import torch

        return _adam([{"params": [_plain(torch.float32)]}], eps=eps)

    return act


def _f32(**kw: Any) -> Callable[[Any], Any]:
    """``_capturable`` in float32."""

    def act(_: Any) -> Any:
        import torch

        return _capturable(torch.float32, **kw)

    return act


def _threshold_one_binade_up(group: dict[str, Any]) -> None:
    """``guard.values.plain_eps`` with its threshold at the smallest subnormal of the
    parameter's dtype instead of half of it (the near miss of ``the_table``)."""
    import torch

    for p in group["params"]:
        info = torch.finfo(p.dtype)
        if group["eps"] <= info.smallest_normal * info.eps:
            raise ValueError(f"eps={group['eps']:g} rounds to 0 in {p.dtype}")


ROWS = [
    # hyperparameters
    Row("negative lr", lambda _: _adam([_frames()], lr=-1e-3), ValueError, "lr"),
    Row("beta2 = 1", lambda _: _adam([_frames()], betas=(0.9, 1.0)), ValueError, "beta2"),
    Row("beta1 = 0 (accepted)", lambda _: _adam([_frames()], betas=(0.0, 0.999)), None),
    Row(
        "unknown moment",
        lambda _: _adam([_stiefel(_frames())], moment="diag"),
        ValueError,
        "unknown moment 'diag'; choose one of",
    ),
    Row(
        "negative trust radius",
        lambda _: _opt("RSGD", [_stiefel(_frames())], lr=1.0, trust_radius=-1.0),
        ValueError,
        "trust_radius",
    ),
    Row(
        "momentum c = 0",
        lambda _: _opt("RiemannianMomentum", [_frames()], lr=1.0, c=0.0),
        ValueError,
        "c must",
    ),
    Row(
        "plain eps = 0",
        lambda _: _adam([{"params": [_plain()]}], eps=0.0),
        ValueError,
        r"eps=0 is 0 in torch.float64, so AdamW's update",
    ),
    Row("plain float32 eps = 2^-150", _plain_eps(2.0**-150), ValueError, "rounds to 0"),
    Row("plain float32 eps = 2^-149 (accepted)", _plain_eps(2.0**-149), None),
    Row(
        "weight decay on frames warns at the caller's line",
        lambda _: _adam([_stiefel(_frames())], weight_decay=0.1),
        UserWarning,
        "weight_decay",
    ),
    # geometries and points
    Row(
        "unknown geometry",
        lambda _: _adam([{"params": [_frames()], "geometry": "grassmann"}]),
        ValueError,
        "unknown geometry",
    ),
    Row(
        "unknown retraction",
        lambda _: _adam([_stiefel(_frames(), retraction="cayley")]),
        ValueError,
        "retraction",
    ),
    Row("r > d", lambda _: _adam([_stiefel(_zeros(2, 5))]), ValueError, r"1 ≤ r ≤ d"),
    Row("r > d, a batch", lambda _: _adam([_stiefel(_zeros(2, 2, 5))]), ValueError, r"1 ≤ r ≤ d"),
    Row(
        "r = 0, a batch",
        lambda _: _adam([_stiefel(_zeros(2, 8, 0))]),
        ValueError,
        r"shape \(2, 8, 0\) holds no point",
    ),
    Row("square frames r = d (accepted)", lambda _: _adam([_stiefel(_frames(3, 3))]), None),
    Row("one column r = 1 (accepted)", lambda _: _adam([_stiefel(_frames(8, 1))]), None),
    Row(
        "a fixed-rank point of unbatched factors (accepted)",
        lambda _: _adam([{"params": _factors(), "geometry": "fixed_rank_embedded"}]),
        None,
    ),
    Row(
        "a parameter listed twice",
        lambda _: _adam([{"params": [p := _plain(), p]}]),
        ValueError,
        r"lists the same parameter twice \(params\[0\] and ",
    ),
    Row(
        "a frame tensor holding no point",
        lambda _: _adam([_stiefel(_zeros(0, 8, 3))]),
        ValueError,
        r"shape \(0, 8, 3\) holds no point",
    ),
    # the capturable step
    Row(
        "capturable without a trust radius",
        lambda _: _capturable(trust_radius=None),
        ValueError,
        "needs trust_radius",
    ),
    Row(
        "capturable trust radius above 0.7",
        lambda _: _capturable(trust_radius=0.8),
        ValueError,
        "0 < Δ ≤ 0.7",
    ),
    Row(
        "capturable trust radius 0",
        lambda _: _capturable(trust_radius=0.0),
        ValueError,
        "trust_radius must be a positive finite number, got 0.0",
    ),
    Row("capturable trust radius 0.7 (accepted)", lambda _: _capturable(trust_radius=0.7), None),
    Row("capturable eps = 0", lambda _: _capturable(eps=0.0), ValueError, "needs eps > 0"),
    Row(
        "capturable float32 step factor 1e39 > the float32 range",
        _f32(eps=1e-40),
        ValueError,
        r"step factor lr/\(\(1 − β1\)·eps\) = 1.000e\+39",
    ),
    Row("capturable float32 step factor 1e38 (accepted)", _f32(eps=1e-39), None),
    Row(
        "capturable elementwise moment",
        lambda _: _capturable(moment="elementwise"),
        ValueError,
        "moment='frame'",
    ),
    Row(
        "capturable sum reduction",
        lambda _: _capturable(reduction="sum"),
        ValueError,
        "reduction='mean'",
    ),
    Row(
        "capturable fixed-rank factors",
        lambda _: _adam(
            [{"params": _factors(), "geometry": "fixed_rank_embedded"}],
            trust_radius=RADIUS,
            capturable=True,
        ),
        ValueError,
        "geometry='stiefel'",
    ),
    # groups added to a built optimizer
    Row(
        "a group whose capturable differs",
        _add(lambda: _stiefel(_frames(), capturable=False)),
        ValueError,
        "the same for every parameter group",
        build=_capturable,
    ),
    Row(
        "a group with a point off its manifold",
        _add(lambda: _stiefel(_off_manifold())),
        ValueError,
        r"off St\(8, 3\): ‖WᵀW − I‖ = 6\.99\de-02.*reproject",
        build=_adam_with_frames,
    ),
    Row(
        "a group with an unknown geometry",
        _add(lambda: {"params": [_frames()], "geometry": "grassmann"}),
        ValueError,
        "unknown geometry",
        build=_adam_with_frames,
    ),
]


def _snapshot(opt: Any) -> tuple[list, list]:
    """The groups' keys and sizes, and a copy of every point and state tensor."""
    import torch

    if opt is None:
        return [], []
    params = [p for g in opt.param_groups for p in g["params"]]
    tensors = [p.detach().clone() for p in params] + [
        v.clone() for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor)
    ]
    return [[*sorted(g), len(g["params"])] for g in opt.param_groups], tensors


def misbehaviour(row: Row) -> str | None:
    """How ``row`` departs from what the table says (None: it behaves as it says)."""
    import torch

    opt = row.build()
    layout, tensors = _snapshot(opt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            row.act(opt)
        except Exception as err:
            if row.error is None or issubclass(row.error, Warning):
                return f"raised {type(err).__name__}: {err}"
            if not isinstance(err, row.error) or not re.search(row.pattern, str(err)):
                want = f"{row.error.__name__} {row.pattern!r}"
                return f"raised {type(err).__name__}: {err}, not {want}"
            after_layout, after = _snapshot(opt)
            same = len(after) == len(tensors) and all(
                torch.equal(a, b) for a, b in zip(tensors, after, strict=True)
            )
            return None if after_layout == layout and same else "refused after writing"
    if row.error is None:
        return None
    if not issubclass(row.error, Warning):
        return "accepted"
    here = [
        w
        for w in caught
        if issubclass(w.category, row.error)
        and re.search(row.pattern, str(w.message))
        and w.filename == __file__
    ]
    return None if here else f"no {row.error.__name__} {row.pattern!r} at the caller's line"


def the_table(ctx: Context, wrong: bool) -> Outcome:
    """Every row of ``ROWS`` behaves as the table says (``misbehaviour``): residual, the number
    of rows that do not (tolerance 0). Control, a near miss: AdamW's ε threshold one binade up,
    at the smallest float32 subnormal 2⁻¹⁴⁹ instead of 2⁻¹⁵⁰ (``_threshold_one_binade_up`` for
    ``guard.values.plain_eps``), which refuses the row at 2⁻¹⁴⁹ that must be taken."""
    from torch_port.optim.guard import values

    variant = substituted(values, "plain_eps", _threshold_one_binade_up)
    with variant if wrong else contextlib.nullcontext():
        bad = {row.name: why for row in ROWS if (why := misbehaviour(row)) is not None}
    refused = sum(row.error is not None and not issubclass(row.error, Warning) for row in ROWS)
    return Outcome.bound(
        float(len(bad)),
        0.0,
        f"{len(ROWS) - len(bad)} of {len(ROWS)} rows as the table says ({refused} refusals)"
        + "".join(f"; {name}: {why}" for name, why in list(bad.items())[:3]),
        {"cases": f"{len(ROWS)} rows", "dtypes": "float64, float32", "seeds": "fixed"},
    )


register(
    Proposition(
        id="PORT-11",
        title="The guard refuses by name before it writes, and accepts the edges",
        statement=(
            r"Each input of the table that the optimizers do not take (a hyperparameter out "
            r"of range, a point or layout no geometry holds, a setting the capturable step "
            r"cannot run, a group added that does not fit) is refused with its error type and "
            r"a message naming it, and leaves every parameter, state tensor and group as it "
            r"was; each input at the edge of what they take is accepted; a warning is "
            r"attributed to the caller's line."
        ),
        hypotheses=(
            "the rows of proofs_checks/propositions/port_refusals.py (ROWS); a step's and a "
            "load's own refusals are tested in tests/test_step_refusals.py",
        ),
        checks=(
            Check(
                "float64",
                "every row of the refusal table",
                the_table,
                "near miss: AdamW's ε threshold one binade up (2⁻¹⁴⁹ refused), substituted "
                "into the port",
            ),
        ),
        requires=("torch",),
    )
)
