"""What every property check of ``rattn conform`` is given (``Context``: the target, the
problem, the dtype, the claims and the claimed rule) and returns (``Outcome``), and the
measures of a point's views the checks share."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from proofs_checks import reference_rules
from proofs_checks.audit.bounds import FACTORING_RETRACTIONS
from proofs_checks.conformance.problem import Problem, Run
from proofs_checks.port_compare.geometries import unit_roundoff

Array = np.ndarray


@dataclass
class Outcome:
    passed: bool | None
    detail: str
    value: float | None = None
    bound: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What every check needs: the target, the problem (with its space), the dtype of the run,
    the run's lr, the claims and the claimed rule (name and settings) if any."""

    factory: Callable[..., Any]
    problem: Problem
    dtype: torch.dtype
    lr: float | None  # None: the optimizer's own
    claims: dict[str, Any]
    rule: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def space(self) -> Any:
        return self.problem.space

    def run(self, problem: Problem | None = None, dtype: torch.dtype | None = None) -> Run:
        problem = problem or self.problem
        dtype = dtype or self.dtype
        start = [torch.tensor(p, dtype=dtype).double().numpy() for p in problem.start()]
        run = Run(self.factory, problem.space, start, dtype)
        if self.lr is not None:
            run.set("lr", self.lr)
        if "weight_decay" in self.settings:  # the rule's decay is the optimizer's too
            run.set("weight_decay", self.settings["weight_decay"])
        return run

    @property
    def u(self) -> float:
        return unit_roundoff(self.dtype)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype)

    def dims(self) -> tuple[int, int]:
        """(n, r): the largest matrix dimension and the largest rank of the problem's points."""
        sizes = self.space.sizes()
        return max(s[0] for s in sizes), max(s[1] for s in sizes)

    def bound_rules(
        self, lr: float | None = None, decay: bool = True
    ) -> list[reference_rules.BoundRule]:
        """The claimed rule on each point's geometry, at lr (the run's when None), without its
        weight decay when ``decay`` is False (as the first-order properties run)."""
        settings = {**self.settings, "lr": self.lr if lr is None else lr}
        if not decay:
            settings.pop("weight_decay", None)
        spec = reference_rules.rule_spec(self.rule)
        return [spec.bind_to(settings, self.space.geometry(i)) for i in range(len(self.space))]

    def decays(self) -> list[float]:
        """The rule's forgetting factors β (its moments remember ~1/(1 − β) steps)."""
        s = self.settings
        out = list(s.get("betas", (0.9, 0.999) if "adam" in (self.rule or "") else ()))
        out += [s[k] for k in ("beta", "momentum") if k in s]
        if self.rule == "riemannian_momentum" and "beta" not in s:
            out.append(0.9)
        return [float(b) for b in out]

    def factoring(self) -> bool:
        """Whether the claimed rule's retraction factors W + ξ in the working dtype."""
        if self.rule is None:
            return True
        if reference_rules.rule_spec(self.rule).field:
            return True
        return self.settings.get("retraction", "polar") in FACTORING_RETRACTIONS

    # -- the point as the properties see it (``spaces``) -------------------------------------
    def elements(self, arrays: Sequence[Array]) -> list[tuple[int, Any]]:
        """(point index, reference point) of every element the arrays hold."""
        return [(i, x) for i in range(len(self.space)) for x in self.problem.elements(arrays, i)]

    def view(self, arrays: Sequence[Array]) -> list[Array]:
        """Every element's view, flat (what lengths and differences are taken of)."""
        return [v for i, x in self.elements(arrays) for v in self.space.view(i, x)]

    def split(self, arrays: Sequence[Array], flat: Sequence[Array]) -> list[tuple[int, Any, list]]:
        """(i, x, its parts of ``flat``) for every element x: a flat list of views cut up."""
        out, k = [], 0
        for i, x in self.elements(arrays):
            n = len(self.space.view(i, x))
            out.append((i, x, list(flat[k : k + n])))
            k += n
        return out


class _Unmeasurable(Exception):
    """The property cannot be measured on this target (said in its detail)."""


def _norm(arrays: Sequence[Array]) -> float:
    return float(np.sqrt(sum(float(np.sum(a * a)) for a in arrays)))


def _diff(a: Sequence[Array], b: Sequence[Array]) -> list[Array]:
    return [x - y for x, y in zip(a, b, strict=True)]


def _largest(values: Sequence[float]) -> float:
    """max of the values, inf when one is not finite (Python's max skips a NaN)."""
    values = list(values)
    return max(values) if all(math.isfinite(v) for v in values) else math.inf


def _residual(ctx: Context, arrays: Sequence[Array]) -> float:
    """max over elements of their distance from the manifold (``spaces``; inf when not finite)."""
    if not all(np.isfinite(a).all() for a in arrays):
        return math.inf
    return _largest([ctx.space.residual(i, x) for i, x in ctx.elements(arrays)])
