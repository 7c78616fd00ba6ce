"""Which functions of given source files each proposition's quick checks call: run as a script by
``proofs_checks.mutation`` in its copy of the project, so that the hook is in place before any of
the project is imported.

    python proofs_checks/call_trace.py OUT.json FILE [FILE ...] [--ids ID,ID]

writes ``{file: {function: [ids]}}``: the propositions whose quick checks and negative controls,
at seed 0, call a function of that name in that file (a profile hook, ``sys.setprofile`` and
``threading.setprofile``, sees every Python call). Each proposition runs in a fresh interpreter,
so that a value one of them caches cannot hide a call from another. A function called while a
module is imported (at the start, or lazily inside a check) is charged to every proposition,
since module-level values built by it reach any of them. A mutant inside a function that a
proposition never calls cannot change what that proposition computes, so certify judges the
mutant by the propositions listed for its function.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

IMPORT = "(import)"


def trace_one(files: list[str], pid: str) -> dict[str, dict[str, list[str]]]:
    """In this interpreter: the functions of ``files`` that the proposition ``pid`` calls, as
    ``{file: {function: [pid]}}``, or ``[IMPORT]`` for those called while a module is
    imported."""
    root = Path(__file__).resolve().parents[1]
    targets = {str((root / f).resolve()): f for f in files}
    known: dict[str, str | None] = {}  # a code object's file name -> the target it is, if any
    calls: dict[str, dict[str, set[str]]] = {f: {} for f in files}
    current = [IMPORT]

    def hook(frame, event, arg):  # the profile hook's signature
        if event != "call":
            return
        name = frame.f_code.co_filename
        if name not in known:
            known[name] = targets.get(str(Path(name).resolve()))
        f = known[name]
        if f is not None:
            who = IMPORT if _importing(frame.f_back) else current[0]
            calls[f].setdefault(frame.f_code.co_name, set()).add(who)

    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        from proofs_checks.certificate import certify

        current[0] = pid
        certify(ids=[pid], quick=True, seed=0)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return {f: {name: sorted(who) for name, who in fns.items()} for f, fns in calls.items()}


def _importing(frame) -> bool:
    """Is a module body (other than this script's) running below this frame: an import, lazy
    or not, whose values any later proposition may use?"""
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_code.co_filename != __file__:
            return True
        frame = frame.f_back
    return False


def trace(files: list[str], ids: list[str]) -> dict[str, dict[str, list[str]]]:
    """The table of the module docstring: ``trace_one`` for each id in a fresh interpreter
    (this script with ``--one``), merged, with IMPORT charged to every id."""
    table: dict[str, dict[str, set[str]]] = {f: {} for f in files}
    with tempfile.TemporaryDirectory() as tmp:
        for pid in ids:
            out = Path(tmp) / "one.json"
            args = [sys.executable, __file__, str(out), *files, "--one", pid]
            subprocess.run(args, check=True, capture_output=True)
            for f, fns in json.loads(out.read_text(encoding="utf-8")).items():
                for name, who in fns.items():
                    table[f].setdefault(name, set()).update(ids if IMPORT in who else who)
    return {f: {n: [i for i in ids if i in w] for n, w in fns.items()} for f, fns in table.items()}


def _all_ids() -> list[str]:
    from proofs_checks.certificate import REGISTRY

    return list(REGISTRY)


if __name__ == "__main__":
    sys.path.pop(0)  # this script's folder is not a root to import from
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--ids", default=None, help="comma-separated ids (default: all)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # one id, this process
    args = parser.parse_args()
    if args.one is not None:
        table = trace_one(args.files, args.one)
    else:
        table = trace(args.files, _all_ids() if args.ids is None else args.ids.split(","))
    Path(args.out).write_text(json.dumps(table, indent=1), encoding="utf-8")
