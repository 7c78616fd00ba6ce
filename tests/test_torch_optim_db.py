"""torch's own optimizer database (``torch.testing._internal.common_optimizers.optim_db``), its
entries for ``torch.optim.AdamW``, run through the four classes: every input torch's tests
construct AdamW with gives, on plain parameters, AdamW's steps bitwise (or a refusal by name,
for the one flag this port does not implement), and every error input raises the exception type
torch's AdamW raises. Two departures, each a table entry with its reason: a parameter listed
twice in a group, which torch only warns about (its warning says it will become an error; here a
frame would be stepped twice), and a tensor lr with ``foreach=True``, which torch refuses because
its foreach kernels cannot read a tensor lr outside ``capturable``, while this step reads its
value (``test_torch_conventions``)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
common_optimizers = pytest.importorskip("torch.testing._internal.common_optimizers")

import torch_port as tp  # noqa: E402

CLASSES = {
    "RiemannianAdam": tp.RiemannianAdam,
    "RiemannianMomentum": tp.RiemannianMomentum,
    "RSGD": tp.RSGD,
    "NormalizedRSGD": tp.NormalizedRSGD,
}
ADAMW = next(o for o in common_optimizers.optim_db if o.optim_cls is torch.optim.AdamW)
INPUTS = ADAMW.optim_inputs_func(device="cpu", dtype=torch.float64)
ERRORS = ADAMW.optim_error_inputs_func(device="cpu", dtype=torch.float64)

#: The error inputs this port answers otherwise (matched on torch's message), with the reason.
#: An answer of ``None`` is acceptance; otherwise the exception type and this port's message.
DEPARTURES = {
    "duplicate parameters": (ValueError, "lists the same parameter twice"),
    "lr as a Tensor is not supported": (
        None,
        "this step reads a tensor lr's value; torch's foreach kernels cannot",
    ),
}
#: The inputs refused by name: the flags this port does not implement.
REFUSED = {"amsgrad": "amsgrad=True: torch's amsgrad is not implemented"}


def _departure(error) -> tuple[type | None, str] | None:
    for key, answer in DEPARTURES.items():
        if key in error.error_regex:
            return answer
    return None


def _plain(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64, generator=g))]


def _run(make, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    opt = make(params)
    for k in range(3):
        for p in params:
            g = torch.Generator().manual_seed(100 + k)
            p.grad = torch.randn(p.shape, dtype=p.dtype, generator=g)
        opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("cls", list(CLASSES))
@pytest.mark.parametrize("optim_input", INPUTS, ids=[i.desc for i in INPUTS])
def test_torchs_adamw_inputs_give_adamws_steps_on_plain_parameters(cls, optim_input) -> None:
    """Three steps equal AdamW's bitwise, with AdamW's defaults filled in for the entries whose
    defaults differ here (weight_decay 0 here, 0.01 in torch; lr 1e-3 in both)."""
    kwargs = {**optim_input.kwargs}
    refused = [REFUSED[k] for k in REFUSED if kwargs.get(k)]
    ours = {"lr": 1e-3, "weight_decay": 1e-2, **kwargs}
    if refused:
        with pytest.raises(ValueError, match=refused[0]):
            CLASSES[cls](_plain(), **ours)
        return
    expected = _run(lambda p: torch.optim.AdamW(p, **kwargs), _plain())
    got = _run(lambda p: CLASSES[cls](p, **ours), _plain())
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert not torch.equal(got[0], _plain()[0])


@pytest.mark.parametrize("cls", list(CLASSES))
@pytest.mark.parametrize("error", ERRORS, ids=[e.error_regex[:40] for e in ERRORS])
def test_torchs_adamw_error_inputs_raise_torchs_exception_types(cls, error) -> None:
    """Each error input raises torch's exception type (a hyperparameter error whatever the
    parameters: torch checks those before it reads ``params``, so an input without parameters
    gets one here), or the departure of ``DEPARTURES``."""
    inp = error.optimizer_error_input
    params = inp.params if inp.params is not None else _plain()
    kwargs = {"lr": 1e-3, **inp.kwargs}
    expected, message = error.error_type, None
    departure = _departure(error)
    if departure is not None:
        expected, message = departure
    if expected is None:  # accepted, and it steps
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _run(lambda p: CLASSES[cls](p, **kwargs), params)
        return
    assert error.error_on == common_optimizers.OptimizerErrorEnum.CONSTRUCTION_ERROR
    with pytest.raises(expected, match=message), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's base class warns of the duplicate first
        CLASSES[cls](params, **kwargs)


def test_the_departures_are_departures() -> None:
    """Control: torch's AdamW itself answers each departure as torch's table says (so the table
    above is not hiding an input torch accepts)."""
    seen = set()
    for error in ERRORS:
        if _departure(error) is None:
            continue
        seen.add(next(k for k in DEPARTURES if k in error.error_regex))
        inp = error.optimizer_error_input
        params = inp.params if inp.params is not None else _plain()
        if issubclass(error.error_type, Warning):
            with pytest.warns(error.error_type):
                torch.optim.AdamW(params, **inp.kwargs)
        else:
            with pytest.raises(error.error_type):
                torch.optim.AdamW(params, **inp.kwargs)
    assert seen == set(DEPARTURES)
