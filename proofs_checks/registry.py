"""Propositions as registered, citable objects (DESIGN §6).

A proposition has a stable id, a title, a LaTeX statement, its hypotheses and a list of checks.
Every check is a function ``run(ctx, wrong) -> Outcome`` run twice: on the implementation
(``wrong=False``), where it must pass, and on a deliberately wrong variant (``wrong=True``, the
*negative control* named in ``control``), where the very same test must fail. A check whose
control is not rejected fails: it would have passed vacuously.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import time
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("symbolic", "float64", "mpmath", "property", "rigorous", "machine-checked")
#: A control rejected at no more than this multiple of its tolerance is a near miss: it shows
#: that the check resolves errors of about the size its tolerance allows.
NEAR_MISS_RATIO = 100.0


@dataclass(frozen=True)
class Context:
    """What a check may depend on: the seed and whether a quick run was asked for."""

    seed: int = 0
    quick: bool = False


@dataclass(frozen=True)
class Outcome:
    """One run of a check: worst residual against its tolerance, what was measured, and what
    the run exercised: (what, value) pairs such as ("sizes", "St(7, 3)"), ("points", "8
    random"), ("dtypes", "float32"), ("seeds", "0"), ("steps", "1000"), written by the check
    from the values it ran with, so that the certificate prints the evidence beside the
    claim."""

    passed: bool
    residual: float | None
    tolerance: float | None
    detail: str
    crashed: bool = False
    #: Given as a mapping or as pairs; held as (what, value) pairs of strings.
    exercised: Mapping[str, object] | tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        items = self.exercised.items() if isinstance(self.exercised, Mapping) else self.exercised
        object.__setattr__(self, "exercised", tuple((str(k), str(v)) for k, v in items))

    @classmethod
    def bound(
        cls,
        residual: float,
        tolerance: float,
        detail: str,
        exercised: Mapping[str, object] | None = None,
    ) -> Outcome:
        """Pass when residual ≤ tolerance (NaN never passes)."""
        return cls(
            bool(residual <= tolerance),
            float(residual),
            float(tolerance),
            detail,
            exercised=exercised or {},
        )


@dataclass(frozen=True)
class Check:
    kind: str
    name: str
    run: Callable[[Context, bool], Outcome]
    control: str  # the deliberately wrong variant that ``run(ctx, True)`` exercises
    #: Why the check cannot run here (e.g. "needs coqc"), or None: a tool the check runs,
    #: asked when it is about to run. A check that cannot run is listed as not run with the
    #: reason; it neither passes nor fails.
    unavailable: Callable[[], str | None] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown check kind {self.kind!r}; choose one of {KINDS}")

    @property
    def missing(self) -> str | None:
        """Why the check cannot run here (``unavailable``), or None."""
        return self.unavailable() if self.unavailable is not None else None


@dataclass(frozen=True)
class Proposition:
    id: str
    title: str
    statement: str  # LaTeX
    hypotheses: tuple[str, ...]
    checks: tuple[Check, ...]
    seeds: str = "the certificate's seed (default 0)"
    #: Context that no check establishes (a heuristic, a general sentence with "≪"): printed
    #: beside the statement as a remark, never certified.
    remarks: tuple[str, ...] = ()
    #: Modules the checks need beyond the package's own requirements (e.g. "torch" for the port
    #: propositions): a proposition whose modules are not installed is listed as not run.
    requires: tuple[str, ...] = ()

    @property
    def missing(self) -> str | None:
        """Why the proposition cannot run here (a required module is not installed), or None."""
        absent = [m for m in self.requires if importlib.util.find_spec(m) is None]
        return f"needs {', '.join(absent)}, which is not installed" if absent else None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if any(c.kind == k for c in self.checks))

    @property
    def hash(self) -> str:
        """SHA-256 (64 hex digits) of what is checked: ``content_hash`` over the package's
        sources on disk (``package_sources``), so that any change to what is checked changes
        the hash."""
        return self.content_hash(package_sources())

    def content_hash(self, sources: Mapping[str, str]) -> str:
        """The hash over ``sources`` (module name -> source text, e.g. ``package_sources()``
        with one module's text changed): the id, statement, hypotheses and remarks, the source
        of every check function, and the name and source of every module of
        ``imported_closure`` from the modules the checks are defined in. A check module outside
        ``sources`` (one defined outside the package) is added with its source as Python
        loaded it."""
        modules = {c.run.__module__ for c in self.checks}
        outside = {m: inspect.getsource(sys.modules[m]) for m in sorted(modules - set(sources))}
        sources = ChainMap(outside, sources) if outside else sources
        h = hashlib.sha256()
        for text in (self.id, self.statement, *self.hypotheses, *self.remarks):
            h.update(text.encode())
        for check in self.checks:
            h.update(inspect.getsource(check.run).encode())
        for name in imported_closure(modules, sources):
            h.update(name.encode())
            h.update(sources[name].encode())
        return h.hexdigest()

    @property
    def implementation_hash(self) -> str:
        """SHA-256 of the implementation the checks exercise: ``implementation_content_hash``
        over the project's sources on disk (``project_sources``)."""
        return self.implementation_content_hash(project_sources())

    def implementation_content_hash(
        self, sources: Mapping[str, str], calls: CallMap | None = None
    ) -> str:
        """The hash over the name and the source of every module ``implementation_modules``
        names, each as ``called_source`` gives it for this proposition: its module-level code,
        the signatures of its functions and the bodies of those this proposition's checks call,
        without the bodies the call map (``calls``, default ``call_map()``) lists as run by
        other propositions only. A comment or a bug in a function the checks call, or in
        module-level code that runs, changes it; the checks' own code, and an edit inside a
        function only other propositions call, do not."""
        calls = call_map() if calls is None else calls
        h = hashlib.sha256()
        for name in self.implementation_modules(sources, calls):
            h.update(name.encode())
            h.update(called_source(sources[name], calls.get(name, {}), self.id).encode())
        return h.hexdigest()

    def implementation_modules(self, sources: Mapping[str, str], calls: CallMap) -> list[str]:
        """The modules of ``IMPLEMENTATION_PACKAGES`` (``reference``, ``torch_port``) that this
        proposition's implementation hash covers. With a call map: those the check modules
        import, directly or through other modules (``imported_closure`` over ``sources``, the
        three packages together), their parent packages (whose ``__init__`` runs first), and
        every module in which the map lists this proposition (code that runs though no check
        module imports it: the certificate's own imports, other modules' imports). Without one
        (``calls`` empty: no map traced on these sources), every module of the two packages,
        since what runs cannot be told then."""
        implementation = [m for m in sources if m.partition(".")[0] in IMPLEMENTATION_PACKAGES]
        if not calls:
            return sorted(implementation)
        found = set(imported_closure({c.run.__module__ for c in self.checks}, sources))
        found |= {m for m, fns in calls.items() if any(self.id in who for who in fns.values())}
        found |= {m.rsplit(".", k)[0] for m in found for k in range(1, m.count(".") + 1)}
        return sorted(found & set(implementation))


# -- which code a proposition's hash covers: its check modules and their imports in the package ----

#: The package whose modules a hash follows imports into.
PACKAGE = __name__.partition(".")[0]
PACKAGE_DIR = Path(__file__).resolve().parent


class _SourceFiles(Mapping[str, str]):
    """Module name -> source text of the ``.py`` files under a package directory, each read
    (UTF-8) when it is looked up; a package's ``__init__.py`` is keyed by the package's name."""

    def __init__(self, root: Path, package: str, skip: tuple[str, ...] = ()) -> None:
        self._paths: dict[str, Path] = {}
        for path in sorted(root.rglob("*.py")):
            if path.relative_to(root).parts[0] in skip:
                continue
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            self._paths[".".join(parts)] = path

    def __getitem__(self, name: str) -> str:
        return self._paths[name].read_text(encoding="utf-8")

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __contains__(self, name: object) -> bool:
        return name in self._paths


#: Subpackages that are not installed (``pyproject.toml``): developer tools, which no check runs.
NOT_INSTALLED = ("dev",)


def package_sources() -> Mapping[str, str]:
    """Module name -> source text of every installed module of the package as it is on disk
    now (a checkout's ``NOT_INSTALLED`` tools left out, so that it hashes as an install does)."""
    return _SourceFiles(PACKAGE_DIR, PACKAGE, skip=NOT_INSTALLED)


#: The packages of the code under test, beside this one (in the same directory).
IMPLEMENTATION_PACKAGES = ("reference", "torch_port")


def project_sources() -> Mapping[str, str]:
    """Module name -> source text of every module of this package and of
    ``IMPLEMENTATION_PACKAGES`` (those installed beside it), as they are on disk now."""
    maps = [package_sources()] + [
        _SourceFiles(PACKAGE_DIR.parent / name, name)
        for name in IMPLEMENTATION_PACKAGES
        if (PACKAGE_DIR.parent / name).is_dir()
    ]
    return ChainMap(*maps)


def imported_modules(name: str, source: str, sources: Mapping[str, str]) -> set[str]:
    """The modules of ``sources`` that module ``name`` (source text ``source``) imports: every
    ``import a.b`` and ``from a.b import c`` anywhere in it (in functions too; relative imports
    resolved against ``name``'s package). ``from a import c`` names ``a.c`` when that is a module
    of ``sources``, else ``a`` itself. A parent package is not implied by importing its child:
    the hash follows the code an import names, not the ``__init__`` files Python runs on the way.
    """
    is_package = any(key.startswith(name + ".") for key in sources)
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for level, base, names in _import_statements(source):
        if base is None:  # import a.b, c
            found.update(names)
            continue
        if level:
            anchor = package.rsplit(".", level - 1)[0] if level > 1 else package
            base = f"{anchor}.{base}" if base else anchor
        children = [f"{base}.{alias}" for alias in names]
        named = [child for child in children if child in sources]
        found.update(named)
        if len(named) < len(children):
            found.add(base)
    return {module for module in found if module in sources and module != name}


@functools.lru_cache(maxsize=256)
def _import_statements(source: str) -> tuple[tuple[int, str | None, tuple[str, ...]], ...]:
    """Every import statement of ``source`` as (level, module, names): ``import a.b, c`` is
    (0, None, ("a.b", "c")); ``from ..a import b`` is (2, "a", ("b",)). A pure function of the
    text, so it is cached on the text (an edited module is parsed afresh)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.append((0, None, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", tuple(a.name for a in node.names)))
    return tuple(out)


# -- which functions of a module a proposition's implementation hash covers: those it calls -----

#: module -> qualified function name -> the ids of the propositions whose checks and controls,
#: quick and full, call it (``proofs_checks/dev/call_trace.py``).
CallMap = Mapping[str, Mapping[str, Iterable[str]]]

#: The call map of the project (``python proofs_checks/dev/call_trace.py --map``): the functions
#: each proposition calls, traced on the sources whose digests it records.
CALL_MAP = PACKAGE_DIR / "call_map.json"


def source_digest(sources: Mapping[str, str]) -> dict[str, str]:
    """Module name -> SHA-256 of its source text."""
    return {name: hashlib.sha256(sources[name].encode()).hexdigest() for name in sorted(sources)}


def call_map() -> dict[str, dict[str, frozenset[str]]]:
    """The rows of ``CALL_MAP`` (read as JSON: no code runs) when it was traced on exactly the
    sources on disk now (``project_sources``: every module of the three packages, the checks'
    own included, since they decide what is called); else empty, and every implementation hash
    covers every module whole. A map traced on other code could leave out a call that an edit
    made since, so it is never used. Read again whenever a source file or the map changes."""
    return _call_map(_fingerprint())


def _fingerprint() -> tuple:
    """(path, modification time, size) of the map and of every source file: what
    ``call_map`` depends on, cheap to take."""
    files = [path for source in project_sources().maps for path in source._paths.values()]
    stats = [(str(p), os.stat(p)) for p in [CALL_MAP, *files] if p.is_file()]
    return tuple((p, st.st_mtime_ns, st.st_size) for p, st in stats)


@functools.lru_cache(maxsize=1)
def _call_map(fingerprint: tuple) -> dict[str, dict[str, frozenset[str]]]:
    if not CALL_MAP.is_file():
        return {}
    doc = json.loads(CALL_MAP.read_text(encoding="utf-8"))
    if doc.get("traced_on") != source_digest(project_sources()):
        return {}
    return {m: {q: frozenset(ids) for q, ids in fns.items()} for m, fns in doc["calls"].items()}


@functools.lru_cache(maxsize=512)
def function_bodies(source: str) -> tuple[tuple[str, int, int], ...]:
    """(qualified name, first line, last line), 0-based, end exclusive, of the body of every
    function defined at module level or in a class body (classes nested in classes included)
    of ``source``. The ``def`` line, its decorators and its default values run at import and
    stay module-level code; a function whose body starts on its ``def`` line is left whole.
    Functions nested in functions are part of their body."""
    bodies: list[tuple[str, int, int]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = node.body[0]
                decorators = getattr(first, "decorator_list", [])
                start = min([first.lineno, *(d.lineno for d in decorators)]) - 1
                if start >= node.lineno:  # else the body starts on the def line: kept whole
                    bodies.append((prefix + node.name, start, node.end_lineno or node.lineno))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    return tuple(bodies)


def source_lines(source: str) -> list[str]:
    """``source`` split after each newline character only, as Python numbers its lines
    (``splitlines`` would also split at form feeds and other separators Python does not count)."""
    return re.split(r"(?<=\n)", source)


def called_source(source: str, callers: Mapping[str, Iterable[str]], pid: str) -> str:
    """``source`` less the bodies of the functions that ``callers`` (qualified name -> ids, a
    module's row of the call map) lists as called, and not by ``pid``, each replaced by one
    line naming it. A function the map does not list, or lists for nobody, is kept: what no
    trace vouches for is covered."""
    lines = source_lines(source)
    for name, first, last in reversed(function_bodies(source)):
        who = callers.get(name)
        if who and pid not in who:
            lines[first:last] = [f"# {name}: body not called by {pid}\n"]
    return "".join(lines)


def imported_closure(roots: Iterable[str], sources: Mapping[str, str]) -> list[str]:
    """``roots`` that are modules of ``sources`` and every module of ``sources`` they import,
    directly or through one another (``imported_modules``), sorted by name."""
    seen: set[str] = set()
    todo = [root for root in roots if root in sources]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imported_modules(name, sources[name], sources) - seen)
    return sorted(seen)


@dataclass
class CheckResult:
    kind: str
    name: str
    outcome: Outcome
    control: str
    control_outcome: Outcome
    seconds: float = 0.0
    #: Why the check was not run here (``Check.missing``), or None when it ran.
    not_run: str | None = None

    @property
    def control_rejected(self) -> bool:
        """The same check measured the wrong variant and failed it (a crash is no rejection)."""
        return not self.control_outcome.passed and not self.control_outcome.crashed

    @property
    def passed(self) -> bool:
        """The implementation passes and the deliberately wrong variant is rejected."""
        return self.outcome.passed and self.control_rejected

    @property
    def control_ratio(self) -> float | None:
        """How far past its tolerance the control was rejected (residual/tolerance): the
        resolution the control shows; None for an exact (tolerance 0) or crashed check."""
        res, tol = self.control_outcome.residual, self.control_outcome.tolerance
        if not tol:  # exact, or crashed
            return None
        return math.inf if res is None else res / tol

    @property
    def near_miss(self) -> bool:
        """Its control is a near miss: rejected at no more than ``NEAR_MISS_RATIO`` × its
        tolerance, or, for an exact check (tolerance 0, a count of wrong decisions), a control
        named a near miss (a threshold moved by a small amount)."""
        if not self.control_rejected:
            return False
        if self.control_outcome.tolerance == 0:
            return self.control.startswith("near miss")
        ratio = self.control_ratio
        return ratio is not None and ratio <= NEAR_MISS_RATIO


@dataclass
class PropositionResult:
    proposition: Proposition
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ran(self) -> list[CheckResult]:
        """The checks that ran (not those whose program is missing here)."""
        return [c for c in self.checks if c.not_run is None]

    @property
    def passed(self) -> bool:
        """At least one check ran, and every check that ran passed."""
        return bool(self.ran) and all(c.passed for c in self.ran)

    @property
    def exercised(self) -> dict[str, list[str]]:
        """What the checks' passing runs exercised, merged by what: each value once, in the
        order the checks report them."""
        merged: dict[str, list[str]] = {}
        for c in self.checks:
            for what, value in c.outcome.exercised:
                if value not in merged.setdefault(what, []):
                    merged[what].append(value)
        return merged

    @property
    def exercised_by(self) -> int:
        """How many of the checks report what they exercised."""
        return sum(bool(c.outcome.exercised) for c in self.checks)


def _guarded(check: Check, ctx: Context, wrong: bool) -> Outcome:
    """Run one side of a check. An exception is reported, never raised, and is marked
    ``crashed``: a crash neither passes a check nor counts as rejecting a control."""
    try:
        return check.run(ctx, wrong)
    except Exception as exc:  # a crashing check must be reported, not abort the certificate
        return Outcome(False, None, None, f"raised {type(exc).__name__}: {exc}", crashed=True)


def run_check(check: Check, ctx: Context) -> CheckResult:
    if (reason := check.missing) is not None:
        skipped = Outcome(False, None, None, f"not run: {reason}")
        return CheckResult(check.kind, check.name, skipped, check.control, skipped, not_run=reason)
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
