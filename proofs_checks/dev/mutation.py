"""Mutation testing of the code under test: small deliberate bugs, one at a time, judged first by
``rattn certify --quick`` and then, for the mutants it lets through, by the test suite.

    python -m proofs_checks.dev.mutation [--limit N] [--jobs J] [--out FILE.json] [FILE ...]

A mutant changes one node of one function of a source file (``MUTATIONS``): an arithmetic
operator swapped (+ ↔ −, * ↔ /), a comparison made strict or loose (< ↔ ≤, > ↔ ≥), a numeric
constant doubled (an integer incremented), a unary minus dropped. Each runs in a copy of the
project (the packages, the tests, the docs they read and ``pyproject.toml``, first on
``PYTHONPATH``), so the working tree is never touched. A mutant is *killed by certify* when
``rattn certify --quick`` of the propositions that call its function exits non-zero (traced once
on the unmutated copy, ``proofs_checks/dev/call_trace.py``: no other proposition runs the mutated
code), *killed by the tests* when the tests named for its file (``JUDGES``) fail, and
*survives* otherwise (an equivalent mutant, or a gap in the checks). Both judges must pass on
the unmutated copy first, else every mutant would look killed. ``--jobs`` judges that many
mutants at a time, each in its own copy. Long: seconds to minutes per mutant; not part of the
default test command.
"""

from __future__ import annotations

import argparse
import ast
import json
import queue
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]

_GEOMETRY_TESTS = [
    "tests/test_geometries.py",
    "tests/test_geometry_laws.py",
    "tests/test_partial_isometry.py",
    "tests/test_bad_input.py",
    "tests/test_reliability_reference.py",
]
_CAPACITY_TESTS = ["tests/test_capacity.py", "tests/test_eb_statistical.py", "tests/test_rank.py"]
_PORT_TESTS = [
    "tests/test_torch_port.py",
    "tests/test_torch_geometries.py",
    "tests/test_port_agreement.py",
    "tests/test_reliability_torch.py",
    "tests/test_capturable.py",
]

_STEP_TESTS = [
    *_PORT_TESTS,
    "tests/test_frame_step.py",
    "tests/test_step_refusals.py",
    "tests/test_port_plumbing.py",
]
_AUDIT_TESTS = [
    "tests/test_audit.py",
    "tests/test_audit_inputs.py",
    "tests/test_audit_recording.py",
    "tests/test_audit_rule.py",
    "tests/test_audit_verdicts.py",
]
_CONVERT_TESTS = ["tests/test_convert.py", "tests/test_convert_inputs.py"]
_NN_TESTS = [
    "tests/test_torch_nn.py",
    "tests/test_torch_nn_geometries.py",
    "tests/test_deferred.py",
]

#: Source file -> the tests that judge its mutants after certify.
JUDGES: dict[str, list[str]] = {
    "reference/optim.py": [
        "tests/test_optim.py",
        "tests/test_mp.py",
        "tests/test_cross_checks.py",
        "tests/test_reliability_reference.py",
        "tests/test_reference_defaults.py",
    ],
    "reference/optim_transforms.py": [
        "tests/test_optim.py",
        "tests/test_mp.py",
        "tests/test_cross_checks.py",
        "tests/test_reliability_reference.py",
        "tests/test_reference_defaults.py",
    ],
    "reference/stiefel.py": [
        "tests/test_stiefel.py",
        "tests/test_optim.py",
        "tests/test_reliability_reference.py",
    ],
    "reference/linalg.py": [
        "tests/test_linalg.py",
        "tests/test_stiefel.py",
        "tests/test_reliability_reference.py",
    ],
    "torch_port/optim/transforms.py": [
        "tests/test_torch_port.py",
        "tests/test_port_agreement.py",
        "tests/test_reliability_torch.py",
    ],
    "reference/mp.py": ["tests/test_mp.py", "tests/test_cross_checks.py"],
    **{
        f"reference/{name}.py": _GEOMETRY_TESTS
        for name in ("fixed_rank", "partial_isometry", "blocks")
    },
    **{
        f"reference/capacity/{name}.py": _CAPACITY_TESTS
        for name in ("spectra", "tasks", "pretraining", "trainers")
    },
    **{
        f"torch_port/{name}.py": _PORT_TESTS
        for name in ("linalg", "stiefel", "fixed_rank", "partial_isometry", "blocks")
    },
    **{
        f"torch_port/optim/{name}.py": _STEP_TESTS
        for name in (
            "optimizer",
            "update",
            "guard/__init__",
            "guard/entries",
            "guard/groups",
            "guard/values",
            "capturable",
            "sharding",
            "points",
            "presets",
            "groups",
            "loading",
        )
    },
    **{
        f"torch_port/{name}.py": [*_AUDIT_TESTS, "tests/test_audit_schema.py"]
        for name in ("audit", "audit_layout", "audit_sources")
    },
    **{
        f"torch_port/convert/{name}.py": _CONVERT_TESTS
        for name in ("__init__", "points", "weights", "structures")
    },
    **{
        f"torch_port/{name}.py": [*_PORT_TESTS, *_NN_TESTS]
        for name in ("geometry", "attention_products", "nn", "deferred", "reprojection")
    },
}

#: The verdict of a mutant that certify let through when the tests are not run (``--certify-only``).
LET_THROUGH = "let through by certify"

_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}


@dataclass(frozen=True)
class Mutant:
    file: str
    line: int
    function: str
    change: str
    col: int = -1  # the node's (col_offset, end_col_offset) as col·1000 + end: one per node


def _sites(tree: ast.AST) -> Iterator[tuple[ast.AST, str, str]]:
    """(node, innermost enclosing function, description) of every mutable node inside a
    function, each node once (a nested function's nodes belong to it, not to its parent)."""
    owner: dict[int, str] = {}
    for func in ast.walk(tree):  # outer functions first: inner ones overwrite their nodes
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(func):
                owner[id(node)] = func.name
    for node in ast.walk(tree):
        name = owner.get(id(node))
        if name is None:
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in _SWAP:
            yield node, name, f"{type(node.op).__name__} -> {_SWAP[type(node.op)].__name__}"
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in _COMPARE:
            yield (
                node,
                name,
                f"{type(node.ops[0]).__name__} -> {_COMPARE[type(node.ops[0])].__name__}",
            )
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
            and node.value not in (0, 1)
        ):
            yield node, name, f"constant {node.value!r} -> {_bumped(node.value)!r}"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            yield node, name, "unary minus dropped"


def _bumped(v: int | float) -> int | float:
    return v + 1 if isinstance(v, int) else 2.0 * v


def _mutate(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.BinOp):
        return ast.BinOp(node.left, _SWAP[type(node.op)](), node.right)
    if isinstance(node, ast.Compare):
        return ast.Compare(
            node.left, [_COMPARE[type(node.ops[0])](), *node.ops[1:]], node.comparators
        )
    if isinstance(node, ast.Constant):
        return ast.Constant(_bumped(node.value))
    assert isinstance(node, ast.UnaryOp)
    return node.operand


class _Replace(ast.NodeTransformer):
    """Replaces one node (by identity) with its mutation."""

    def __init__(self, target: ast.AST) -> None:
        self.target = target

    def generic_visit(self, n: ast.AST) -> ast.AST:
        return _mutate(n) if n is self.target else super().generic_visit(n)


def mutants(file: str) -> list[tuple[Mutant, str]]:
    """Every mutant of ``file`` (relative to the project) with the mutated source text."""
    source = (ROOT / file).read_text(encoding="utf-8")
    count = sum(1 for _ in _sites(ast.parse(source)))
    out = []
    for k in range(count):
        tree = ast.parse(source)
        node, function, change = list(_sites(tree))[k]

        mutated = ast.unparse(ast.fix_missing_locations(_Replace(node).visit(tree)))
        col = node.col_offset * 1000 + (node.end_col_offset or 0)
        out.append((Mutant(file, node.lineno, function, change, col), mutated))
    return out


def _copy_project(dest: Path) -> None:
    for name in (
        "reference",
        "proofs_checks",
        "torch_port",
        "tests",
        "docs",
    ):  # docs: tests read them
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def _run(args: list[str], cwd: Path, timeout: float) -> int:
    env = {"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    try:
        return subprocess.run(
            args, cwd=cwd, env=env, capture_output=True, timeout=timeout, check=False
        ).returncode
    except subprocess.TimeoutExpired:
        return -1  # a mutant that hangs a judge is killed by it


def called_by(work: Path, files: list[str]) -> dict[str, dict[str, list[str]]]:
    """file -> function -> the ids of the propositions whose quick checks call it, traced in
    the copy ``work`` by ``proofs_checks/dev/call_trace.py`` (a fresh interpreter, so that imports
    are seen too)."""
    out = work.parent / "calls.json"
    args = [sys.executable, str(work / "proofs_checks" / "dev" / "call_trace.py"), str(out), *files]
    if _run(args, work, 1800) != 0:
        raise RuntimeError("tracing the propositions' calls failed on the unmutated copy")
    return json.loads(out.read_text(encoding="utf-8"))


def _verdict(mutant: Mutant, text: str, work: Path, ids: list[str], tests: bool = True) -> dict:
    """Certify with ``ids``, then (``tests``) the file's tests if certify lets the mutant
    through."""
    target = work / mutant.file
    original = target.read_text(encoding="utf-8")
    target.write_text(text, encoding="utf-8")
    try:
        certify = _run(_certify_args(work, ids), work, 600) if ids else None
        tested = None
        if not certify and tests:
            tested = _run(_pytest_args(JUDGES[mutant.file]), work, 900)
    finally:
        target.write_text(original, encoding="utf-8")
    if certify:
        verdict = "killed by certify"
    elif not tests:
        verdict = LET_THROUGH
    else:
        verdict = "killed by the tests" if tested else "survived"
    return {**asdict(mutant), "certify_exit": certify, "tests_exit": tested, "verdict": verdict}


def _pytest_args(tests: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]


def _certify_args(work: Path, ids: list[str]) -> list[str]:
    out = work.parent / "certificate"
    return [sys.executable, "-m", "proofs_checks", *ids, "--quick", "--out", str(out)]


def judge(
    selected: list[tuple[Mutant, str]],
    progress: bool = True,
    jobs: int = 1,
    out: Path | None = None,
    tests: bool = True,
) -> list[dict]:
    """Run each mutant through certify (the propositions that call its function,
    ``called_by``), then its file's tests when certify lets it through (unless not ``tests``:
    then its verdict is ``LET_THROUGH``, for a reading by hand); ``jobs`` mutants at a time,
    each in its own copy; the verdicts so far are written to ``out`` after each one (a long
    run stopped early keeps them)."""
    with tempfile.TemporaryDirectory() as tmp:
        copies: queue.SimpleQueue[Path] = queue.SimpleQueue()
        for k in range(jobs):
            work = Path(tmp) / f"copy{k}" / "project"
            _copy_project(work)
            copies.put(work)
        work = copies.get()
        if _run(_certify_args(work, []), work, 600) != 0:  # else every mutant would look killed
            raise RuntimeError("rattn certify --quick fails on the unmutated copy")
        for judges in {tuple(JUDGES[m.file]) for m, _ in selected} if tests else ():
            if _run(_pytest_args(list(judges)), work, 900) != 0:
                raise RuntimeError(f"the judges {list(judges)} fail on the unmutated copy")
        calls = called_by(work, sorted({m.file for m, _ in selected}))
        copies.put(work)

        def one(item: tuple[Mutant, str]) -> dict:
            work = copies.get()
            try:
                ids = calls[item[0].file].get(item[0].function, [])
                return _verdict(item[0], item[1], work, ids, tests)
            finally:
                copies.put(work)

        rows: list[dict] = []
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for row in tqdm(
                pool.map(one, selected),
                total=len(selected),
                desc="mutants",
                disable=not progress,
                file=sys.stderr,
            ):
                rows.append(row)
                if out is not None:
                    _write(out, rows)
    return rows


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def to_rejudge(files: list[str], earlier: list[dict]) -> list[tuple[Mutant, str]]:
    """The mutants of ``files`` that an earlier result did not have killed by certify (the
    tests' kills and the survivors): after the checks changed, does certify now kill them?"""

    def same(m: Mutant, r: dict) -> bool:  # results written before ``col`` match on the rest
        return (m.file, m.line, m.function, m.change) == (
            r["file"],
            r["line"],
            r["function"],
            r["change"],
        ) and r.get("col", m.col) == m.col

    let_through = [r for r in earlier if r["verdict"] != "killed by certify"]
    return [
        (m, t) for file in files for m, t in mutants(file) if any(same(m, r) for r in let_through)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=list(JUDGES), help="sources (default: all)")
    parser.add_argument("--limit", type=int, default=None, help="at most N mutants per file")
    parser.add_argument("--jobs", type=int, default=1, help="mutants judged at a time")
    parser.add_argument("--out", default="mutation.json", help="where to write the results")
    parser.add_argument(
        "--rejudge",
        default=None,
        help="judge again only the mutants of this earlier result that certify did not kill",
    )
    parser.add_argument(
        "--certify-only",
        action="store_true",
        help="judge by certify alone (what it lets through is read by hand)",
    )
    args = parser.parse_args(argv)
    unknown = [f for f in args.files if f not in JUDGES]
    if unknown:
        parser.error(f"no judges named for {unknown}; known: {list(JUDGES)}")
    selected = []
    for file in args.files:
        found = mutants(file)
        if args.limit is not None and len(found) > args.limit:
            step = len(found) / args.limit  # evenly spread over the file
            found = [found[int(i * step)] for i in range(args.limit)]
        selected += found
    if args.rejudge is not None:
        earlier = json.loads(Path(args.rejudge).read_text(encoding="utf-8"))
        selected = to_rejudge(args.files, earlier)
    rows = judge(selected, jobs=args.jobs, out=Path(args.out), tests=not args.certify_only)
    _write(Path(args.out), rows)
    for verdict in ("killed by certify", "killed by the tests", "survived", LET_THROUGH):
        print(f"{verdict}: {sum(r['verdict'] == verdict for r in rows)} of {len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
