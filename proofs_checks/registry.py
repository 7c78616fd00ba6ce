"""Propositions as registered, citable objects (DESIGN §6).

A proposition has a stable id, a title, a LaTeX statement, its hypotheses and a list of checks.
Every check is a function ``run(ctx, wrong) -> Outcome`` run twice: on the implementation
(``wrong=False``), where it must pass, and on a deliberately wrong variant (``wrong=True``, the
*negative control* named in ``control``), where the very same test must fail. A check whose
control is not rejected fails: it would have passed vacuously.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("symbolic", "float64", "mpmath", "property")


@dataclass(frozen=True)
class Context:
    """What a check may depend on: the seed and whether a quick run was asked for."""

    seed: int = 0
    quick: bool = False


@dataclass(frozen=True)
class Outcome:
    """One run of a check: worst residual against its tolerance, and what was measured."""

    passed: bool
    residual: float | None
    tolerance: float | None
    detail: str
    crashed: bool = False

    @classmethod
    def bound(cls, residual: float, tolerance: float, detail: str) -> Outcome:
        """Pass when residual ≤ tolerance (NaN never passes)."""
        return cls(bool(residual <= tolerance), float(residual), float(tolerance), detail)


@dataclass(frozen=True)
class Check:
    kind: str
    name: str
    run: Callable[[Context, bool], Outcome]
    control: str  # the deliberately wrong variant that ``run(ctx, True)`` exercises

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown check kind {self.kind!r}; choose one of {KINDS}")


@dataclass(frozen=True)
class Proposition:
    id: str
    title: str
    statement: str  # LaTeX
    hypotheses: tuple[str, ...]
    checks: tuple[Check, ...]
    seeds: str = "the certificate's seed (default 0)"

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if any(c.kind == k for c in self.checks))

    @property
    def hash(self) -> str:
        """SHA-256 of the id, statement and hypotheses, the source of every check function and
        of the modules the checks are defined in, and of the shared check machinery (bounds,
        harness, laws, registry), so that any change to what is checked changes the hash."""
        h = hashlib.sha256()
        for text in (self.id, self.statement, *self.hypotheses):
            h.update(text.encode())
        modules = {inspect.getmodule(c.run) for c in self.checks}
        for check in self.checks:
            h.update(inspect.getsource(check.run).encode())
        for module in sorted(modules | _shared_modules(), key=lambda m: m.__name__):
            h.update(inspect.getsource(module).encode())
        return h.hexdigest()


def _shared_modules() -> set:
    from proofs_checks import bounds, geometry_laws, harness, registry

    return {bounds, geometry_laws, harness, registry}


@dataclass
class CheckResult:
    kind: str
    name: str
    outcome: Outcome
    control: str
    control_outcome: Outcome
    seconds: float = 0.0

    @property
    def control_rejected(self) -> bool:
        """The same check measured the wrong variant and failed it (a crash is no rejection)."""
        return not self.control_outcome.passed and not self.control_outcome.crashed

    @property
    def passed(self) -> bool:
        """The implementation passes and the deliberately wrong variant is rejected."""
        return self.outcome.passed and self.control_rejected


@dataclass
class PropositionResult:
    proposition: Proposition
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


def _guarded(check: Check, ctx: Context, wrong: bool) -> Outcome:
    """Run one side of a check. An exception is reported, never raised, and is marked
    ``crashed``: a crash neither passes a check nor counts as rejecting a control."""
    try:
        return check.run(ctx, wrong)
    except Exception as exc:  # a crashing check must be reported, not abort the certificate
        return Outcome(False, None, None, f"raised {type(exc).__name__}: {exc}", crashed=True)


def run_check(check: Check, ctx: Context) -> CheckResult:
    start = time.perf_counter()
    outcome = _guarded(check, ctx, False)
    control = _guarded(check, ctx, True)
    return CheckResult(
        check.kind, check.name, outcome, check.control, control, time.perf_counter() - start
    )


REGISTRY: dict[str, Proposition] = {}


def register(proposition: Proposition) -> Proposition:
    if proposition.id in REGISTRY:
        raise ValueError(f"proposition {proposition.id} is registered twice")
    REGISTRY[proposition.id] = proposition
    return proposition
