"""``rattn conform``: the property suite run on anyone's Riemannian optimizer (docs/conformance.md).

    from proofs_checks.conformance import conform
    report = conform("my_package.optim:make", rule="riemannian_adam", settings={"lr": 1e-2})
    report["passed"], report["properties"]

The target is a factory ``module:function`` called as ``factory(params)``: on Stiefel
(``geometry="stiefel"``) with a list of ``torch.nn.Parameter``, each a frame (d, r) or a batch
(..., d, r); on one of the ten design points with a list of parameter groups
``{"params": [factors], "geometry": NAME, **options}``, one per point (``spaces``). It returns a
``torch.optim.Optimizer`` whose ``step()`` reads ``.grad``. The properties (``PROPERTIES``,
ids ``CONF-…``) are checked where claimed and measured elsewhere; the claims are the rule's
(``reference_rules.implied_claims``) unless given. Needs torch (imported here, lazily by the CLI).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from proofs_checks import reference_rules
from proofs_checks.conformance.context import Context
from proofs_checks.conformance.problem import DTYPES, Problem, TargetError
from proofs_checks.conformance.properties import CLAIM_KEYS, PROPERTIES, evaluate

__all__ = ["PROPERTIES", "TargetError", "check_claims", "conform", "load_factory", "parse_claims"]


def load_factory(target: str | Callable[..., Any]) -> Callable[..., Any]:
    """The factory named ``module:function`` (or a callable, returned as is); TargetError when
    it cannot be imported or is not callable."""
    if callable(target):
        return target
    module_name, sep, attr = str(target).partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"TARGET must be MODULE:FACTORY, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # an import may fail in any way
        raise TargetError(f"cannot import {module_name!r}: {type(err).__name__}: {err}") from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
    if not callable(factory):
        raise TargetError(f"{module_name!r} has no callable {attr!r}")
    return factory


#: Claims that take a value (``order=2``); the others are bare names.
VALUED = {
    "order": (1, 2),
    "degree": (0, 1),
    "decay": ("none", "fused", "coupled"),
    "metric": ("embedded", "canonical"),
}


def parse_claims(text: str | None) -> dict[str, Any] | None:
    """``--claims manifold,order=2,degree=0,decay=none,metric=canonical`` as a dict (a bare
    name means True); None when not given. Refused as ``check_claims`` refuses."""
    if text is None:
        return None
    claims: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if key in VALUED and not sep:
            raise ValueError(f"claim {item!r}: {key}= one of {VALUED[key]}")
        if key in CLAIM_KEYS and key not in VALUED and sep:  # unknown keys: check_claims
            raise ValueError(f"claim {item!r}: {key} takes no value (leave it out to not claim it)")
        claims[key] = (int(value) if value.isdigit() else value) if sep else True
    return check_claims(claims, text)


def check_claims(claims: dict[str, Any], text: Any = None) -> dict[str, Any]:
    """The claims, refused (ValueError) when one names no property, a valued claim has a value
    outside its choices, a bare claim is anything but True, or none claims a property (nothing
    would be checked)."""
    for key, value in claims.items():
        if key not in CLAIM_KEYS:
            raise ValueError(f"unknown claim {key!r}; claims are {', '.join(CLAIM_KEYS)}")
        if key in VALUED and value not in VALUED[key]:
            raise ValueError(f"claim {key}={value!r}: {key}= one of {VALUED[key]}")
        if key not in VALUED and value is not True:
            raise ValueError(f"claim {key}={value!r}: {key} is claimed by True or left out")
    if not set(claims) - {"metric"}:
        shown = claims if text is None else text
        raise ValueError(f"--claims {shown!r} claims no property: nothing would be checked")
    return claims


def describe(target: str | Callable[..., Any], factory: Callable[..., Any]) -> dict[str, Any]:
    """The target's name, its package's version and the SHA-256 of its module's source file
    (None where the factory has no source file)."""
    module = inspect.getmodule(factory)
    name = target if isinstance(target, str) else f"{factory.__module__}:{factory.__qualname__}"
    top = (module.__name__ if module else "").split(".")[0]
    package = (importlib.metadata.packages_distributions().get(top) or [top])[0]
    try:
        version = importlib.metadata.version(package)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        version = None
    try:
        source = inspect.getsourcefile(module) if module else None
    except TypeError:  # a factory defined where there is no file (python -c, a notebook)
        source = None
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest() if source else None
    return {"target": name, "package": package, "version": version, "source_hash": digest}


def conform(
    target: str | Callable[..., Any],
    *,
    geometry: str = "stiefel",
    rule: str | None = None,
    settings: dict[str, Any] | None = None,
    claims: dict[str, Any] | None = None,
    dtype: str = "float64",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Run every property on the target and return the report (``passed``, ``properties``,
    ``first_departure_step`` when a rule is claimed, ...). ValueError/TargetError for bad usage
    (exit 2 in the CLI)."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    settings = dict(settings or {})
    claims = None if claims is None else check_claims(dict(claims))
    if "lr" in settings and not (
        isinstance(settings["lr"], int | float)
        and not isinstance(settings["lr"], bool)
        and math.isfinite(settings["lr"])
        and settings["lr"] > 0
    ):
        raise ValueError(f"--set lr={settings['lr']!r}: lr must be a finite number > 0")
    spec = None if rule is None else reference_rules.rule_spec(rule)  # refuses an unknown name
    options = {k: settings[k] for k in reference_rules.GEOMETRY_KEYS if k in settings}
    if spec is not None and spec.field:
        options = {}
    problem = Problem.make(seed, geometry, options)  # refuses an unknown geometry or option
    if geometry != "stiefel":
        if spec is not None and spec.field:
            raise ValueError(f"--rule {rule} is geoopt's Stiefel optimizer: use --geometry stiefel")
        if claims is not None and "metric" in claims:
            raise ValueError(
                "--claims metric=...: on the ten the metric is the geometry's own (--set metric "
                "for fixed_rank_quotient)"
            )
        if settings.get("decay") == "fused":
            raise ValueError('--set decay="fused": fused decay is stated for Stiefel frames')
    factory = load_factory(target)
    implied = (
        reference_rules.implied_claims(rule, settings, problem.space.geometry(0))
        if rule is not None
        else {"manifold": True, "tangent": True, "state": True}
    )
    chosen = implied if claims is None else claims
    probe = Context(factory, problem, DTYPES[dtype], None, chosen, rule, settings)
    lr = float(settings["lr"]) if "lr" in settings else _own_lr(probe)
    ctx = Context(factory, problem, DTYPES[dtype], lr, chosen, rule, settings)
    if rule is not None:
        ctx.bound_rules()  # refuses a bad setting before any property runs
        if claims is None and not ctx.run().has("weight_decay"):
            chosen.pop("decay", None)  # implied only where the optimizer has a decay to set
    rows = []
    for prop in tqdm(list(PROPERTIES.values()), desc="conform", disable=not progress):
        outcome = evaluate(prop, ctx)
        claimed = prop.claim in chosen
        rows.append(
            {
                "id": prop.id,
                "title": prop.title,
                "claimed": claimed,
                "claim": chosen.get(prop.claim),
                "passed": outcome.passed,
                "detail": outcome.detail,
                "value": outcome.value,
                "bound": outcome.bound,
                **outcome.extra,
            }
        )
    failed = [row["id"] for row in rows if row["claimed"] and row["passed"] is not True]
    report = {
        **describe(target, factory),
        "geometry": geometry,
        "dtype": dtype,
        "seed": seed,
        "lr": lr,
        "rule": rule,
        "settings": settings,
        "claims": chosen,
        "passed": not failed,
        "failed": failed,
        "properties": rows,
        "torch": torch.__version__,
    }
    if rule is not None:
        rule_row = next(row for row in rows if row["id"] == "CONF-RULE")
        report["first_departure_step"] = rule_row.get("first_departure_step")
    return report


def _own_lr(ctx: Context) -> float:
    """The optimizer's own lr (its first parameter group's)."""
    run = ctx.run()
    if not run.has("lr"):
        raise TargetError("the optimizer has no 'lr' in its param_groups; give --set lr=...")
    lr = float(run.get("lr"))
    if not (math.isfinite(lr) and lr > 0):
        raise TargetError(f"the optimizer's own lr is {lr}; give --set lr=... (> 0)")
    return lr
