"""Which functions of given source files each proposition's checks call, traced with each
proposition in a fresh interpreter (so that a value one of them caches cannot hide a call from
another, and the imports are seen):

    python proofs_checks/dev/call_trace.py OUT.json FILE [FILE ...] [--ids ID,ID]
        [--qualified] [--full]
    python proofs_checks/dev/call_trace.py --map [--jobs J]

The first writes ``{file: {function: [ids]}}``: the propositions whose quick checks and negative
controls (with ``--full`` the full ones too), at seed 0, call a function of that name in that
file. A function called while the certificate's modules are imported, before any check runs,
is charged to every proposition, since module-level values built by it reach any of them.
``proofs_checks.dev.mutation`` runs it in its copy of the project: a mutant inside a function that a
proposition never calls cannot change what that proposition computes, so certify judges the
mutant by the propositions listed for its function.

The second writes the project's call map (``registry.CALL_MAP``): every function of
``reference`` and ``torch_port`` by qualified name, quick and full checks, with the digests of
the sources it was traced on; each proposition's implementation hash covers the functions the
map lists for it (``registry.Proposition.implementation_content_hash``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

IMPORT = "(import)"


def trace_one(
    files: list[str], pid: str, qualified: bool = False, full: bool = False
) -> dict[str, dict[str, list[str]]]:
    """In this interpreter: the functions of ``files`` that the proposition ``pid`` calls, as
    ``{file: {function: [pid]}}``, or ``[IMPORT]`` for those called while the certificate's
    modules are imported, before any check runs. Functions are named by their innermost name,
    or with ``qualified`` by their qualified name (``Class.method``); ``full``: the checks run
    quick and full (else quick only), and every check must run and pass (what a check that
    did not run would call is not known). Both are watched by ``cProfile`` (a C profiler: they
    run at about their own speed); threads the checks start, which ``cProfile`` does not see
    before Python 3.12, by a profile hook; processes they start (PORT-9's gloo workers) list
    their own calls in the folder named by ``port_gloo.CHILD_TRACE``."""
    root = Path(__file__).resolve().parents[2]
    targets = {str((root / f).resolve()): f for f in files}
    known: dict[str, str | None] = {}  # a code object's file name -> the target it is, if any
    calls: dict[str, dict[str, set[str]]] = {f: {} for f in files}

    def note(filename: str, qualname: str, name: str, who: str) -> None:
        if filename not in known:
            known[filename] = targets.get(str(Path(filename).resolve()))
        f = known[filename]
        if f is not None:
            calls[f].setdefault(qualname if qualified else name, set()).add(who)

    def note_code(code, who: str) -> None:
        note(code.co_filename, code.co_qualname, code.co_name, who)

    imports, checks = cProfile.Profile(), cProfile.Profile()
    imports.enable()
    try:
        from proofs_checks.certificate import certify
    finally:
        imports.disable()

    def in_threads(frame, event, arg):  # cProfile sees one thread (before Python 3.12)
        if event == "call":
            note_code(frame.f_code, pid)

    from proofs_checks.propositions.port_gloo import CHILD_TRACE

    threading.setprofile(in_threads)
    children = tempfile.TemporaryDirectory()
    os.environ[CHILD_TRACE] = children.name  # worker processes list their calls there
    checks.enable()
    try:
        runs = [certify(ids=[pid], quick=quick, seed=0) for quick in (True, False)[: 1 + full]]
    finally:
        checks.disable()
        threading.setprofile(None)
        del os.environ[CHILD_TRACE]
    with children:
        for listed in Path(children.name).glob("*.json"):
            for filename, qualname, name in json.loads(listed.read_text(encoding="utf-8")):
                note(filename, qualname, name, pid)
    for cert in runs if full else ():  # a check not run, or failing, would leave calls out
        skipped = [c for r in cert.results for c in r.checks if c.not_run] + cert.not_run
        if skipped or not cert.passed:
            raise RuntimeError(f"{pid}: not every check ran and passed here; no trace of it")
    for profiler, who in ((imports, IMPORT), (checks, pid)):
        for entry in profiler.getstats():
            if not isinstance(entry.code, str):  # a Python function (builtins are named by text)
                note_code(entry.code, who)
    return {f: {name: sorted(who) for name, who in fns.items()} for f, fns in calls.items()}


def trace(
    files: list[str], ids: list[str], qualified: bool = False, full: bool = False, jobs: int = 1
) -> dict[str, dict[str, list[str]]]:
    """The table of the module docstring: ``trace_one`` for each id in a fresh interpreter
    (this script with ``--one``), ``jobs`` at a time, merged, with IMPORT charged to every
    id."""
    table: dict[str, dict[str, set[str]]] = {f: {} for f in files}
    flags = ["--qualified"] * qualified + ["--full"] * full

    def one(pid: str, tmp: str) -> dict[str, dict[str, list[str]]]:
        out = Path(tmp) / f"{pid}.json"
        args = [sys.executable, __file__, str(out), *files, "--one", pid, *flags]
        subprocess.run(args, check=True, capture_output=True)
        return json.loads(out.read_text(encoding="utf-8"))

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=jobs) as pool:
        for found in pool.map(lambda pid: one(pid, tmp), ids):
            for f, fns in found.items():
                for name, who in fns.items():
                    table[f].setdefault(name, set()).update(ids if IMPORT in who else who)
    return {f: {n: [i for i in ids if i in w] for n, w in fns.items()} for f, fns in table.items()}


def call_map(jobs: int = 1) -> dict:
    """The project's call map (``registry.CALL_MAP``): every function of ``reference`` and
    ``torch_port`` by module and qualified name, with the propositions that call it
    (``calls``); the SHA-256 of every module's source it was traced on (``traced_on``, taken
    before and after the trace, which is refused when they differ), so that a map traced on
    other code is never used (``registry.call_map``); and where it was traced (``traced_in``:
    Python, platform, library versions), since a check that branches on computed values may
    take another branch elsewhere."""
    from proofs_checks.registry import IMPLEMENTATION_PACKAGES, project_sources, source_digest
    from reference.environment import environment

    if sys.version_info < (3, 11):
        raise RuntimeError("the call map needs Python 3.11 or later (qualified code names)")
    root = Path(__file__).resolve().parents[2]
    files = sorted(
        str(path.relative_to(root))
        for package in IMPLEMENTATION_PACKAGES
        for path in (root / package).rglob("*.py")
    )
    before = source_digest(project_sources())
    table = trace(files, _all_ids(), qualified=True, full=True, jobs=jobs)
    if source_digest(project_sources()) != before:
        raise RuntimeError("the sources changed while they were traced; trace them again")
    env = environment("torch", "python-flint")
    traced_in = {k: env[k] for k in ("python", "platform", "versions")}
    calls = {_module(f): fns for f, fns in table.items() if fns}
    return {"traced_on": before, "traced_in": traced_in, "calls": calls}


def _module(file: str) -> str:
    """``reference/capacity/tasks.py`` -> ``reference.capacity.tasks`` (a package's
    ``__init__.py`` -> the package)."""
    parts = list(Path(file).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_ids() -> list[str]:
    from proofs_checks.certificate import REGISTRY

    return list(REGISTRY)


if __name__ == "__main__":
    # import this checkout's packages, whatever is installed: its root, not this script's folder
    sys.path[0] = str(Path(__file__).resolve().parents[2])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="the JSON to write (default with --map: the map)")
    parser.add_argument("files", nargs="*")
    parser.add_argument("--ids", default=None, help="comma-separated ids (default: all)")
    parser.add_argument("--qualified", action="store_true", help="qualified function names")
    parser.add_argument("--full", action="store_true", help="the full checks too, not only quick")
    parser.add_argument("--map", action="store_true", help="trace the project's call map")
    parser.add_argument("--jobs", type=int, default=1, help="propositions traced at a time")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # one id, this process
    args = parser.parse_args()
    if args.map:
        from proofs_checks.registry import CALL_MAP

        table = call_map(args.jobs)
        out = Path(args.out) if args.out else CALL_MAP
        out.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n", encoding="utf-8")
        sys.exit(0)
    if args.out is None or not args.files:
        parser.error("give OUT.json and the files to trace, or --map")
    if args.one is not None:
        table = trace_one(args.files, args.one, args.qualified, args.full)
    else:
        ids = _all_ids() if args.ids is None else args.ids.split(",")
        table = trace(args.files, ids, args.qualified, args.full, args.jobs)
    Path(args.out).write_text(json.dumps(table, indent=1), encoding="utf-8")
