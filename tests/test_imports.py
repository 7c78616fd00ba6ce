"""The import graph of ``reference``, ``proofs_checks`` and ``torch_port``, read with ``ast``.

(a) No import cycle among the modules of these packages, counting module-level imports (those
that run when a module is imported: at the top, in class bodies, under ``if``/``try``; not under
``if TYPE_CHECKING:``), and none when imports inside functions are counted as well. (b) No
module of ``torch_port.experiments`` imports another module of that package inside a function
(docs/background: such lazy imports hid the circle between the arms, grokking and patches
modules).

An edge ``A → B`` means that A imports B. ``from P import x`` is an edge to the module ``P.x``
when that is a module of the packages, to ``P`` otherwise; ``import P.Q`` is an edge to ``P.Q``.
A parent package that Python initialises on the way is not an edge of its own: a submodule
imported while its package is being initialised finds the package in ``sys.modules``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reference", "proofs_checks", "torch_port")
EXPERIMENTS = "torch_port.experiments"

#: Cycles allowed for now (sets of module names), each with the reason. None at present: the
#: ``proofs_checks.harness`` ↔ ``proofs_checks.registry`` circle, which went through an import
#: inside a function of ``registry``, is gone (``registry`` imports nothing of the package).
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def module_files() -> dict[str, Path]:
    """Module name -> source file, for every module of ``PACKAGES`` (packages by __init__.py)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    node: ast.AST, in_function: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``node`` with whether it sits inside a function; imports
    under ``if TYPE_CHECKING:`` (never run) are left out."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_function
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]), in_function)
        else:
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            yield from _imports(child, inner)


def _targets(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]
) -> set[str]:
    """The modules of ``known`` that an import statement of ``module`` names."""

    def nearest(name: str) -> str | None:  # the longest prefix of ``name`` that is a module
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in known:
                return ".".join(parts[:k])
        return None

    if isinstance(node, ast.Import):
        return {m for a in node.names if (m := nearest(a.name)) is not None}
    if node.level:
        anchor = module.split(".")
        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    found = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        target = sub if sub in known else nearest(base)
        if target is not None:
            found.add(target)
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level edges, function-level edges): module -> the modules it imports."""
    files = module_files()
    known = set(files)
    top: dict[str, set[str]] = {m: set() for m in files}
    lazy: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node, in_function in _imports(tree):
            targets = _targets(module, is_package, node, known) - {module}
            (lazy if in_function else top)[module] |= targets
    return top, lazy


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle [a, b, …, a] per strongly connected component of more than one module
    (Tarjan's algorithm), the component's modules in sorted order of their first member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for component in components:
        start = min(component)
        # breadth-first search inside the component, from ``start`` back to it
        parents: dict[str, str] = {}
        frontier, seen, end = [start], {start}, None
        while frontier and end is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & component):
                    if w == start:
                        end = v
                        break
                    if w not in seen:
                        seen.add(w)
                        parents[w] = v
                        nxt.append(w)
                if end is not None:
                    break
            frontier = nxt
        path = [start]
        v = end
        while v is not None and v != start:
            path.append(v)
            v = parents.get(v)
        found.append([start, *reversed(path[1:]), start])
    return sorted(found)


def test_the_walker_sees_the_graph() -> None:
    """The walk finds edges known to exist (so that the tests below cannot pass on nothing)."""
    top, lazy = import_graph()
    assert f"{EXPERIMENTS}.grokking" in top[f"{EXPERIMENTS}.suite"]
    assert f"{EXPERIMENTS}.runs" in top[f"{EXPERIMENTS}.training"]
    assert "reference.linalg" in top["reference.stiefel"]
    assert f"{EXPERIMENTS}.common" in lazy["proofs_checks.cli"]  # the command imports lazily
    assert len(top) > 50


def test_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    top, _ = import_graph()
    found = [c for c in cycles(top) if frozenset(c) not in KNOWN_CYCLES]
    assert not found, "import cycles (module-level imports): " + "; ".join(
        " → ".join(c) for c in found
    )


def test_no_import_cycles_counting_imports_inside_functions() -> None:
    """A lazy import hides a circle from Python but not from a reader: the graph of module-level
    and function-level imports together has no cycle either."""
    top, lazy = import_graph()
    both = {m: top.get(m, set()) | lazy.get(m, set()) for m in top.keys() | lazy.keys()}
    found = cycles(both)
    assert not found, "import cycles (imports inside functions counted): " + "; ".join(
        " → ".join(c) for c in found
    )


def test_no_experiment_module_imports_another_inside_a_function() -> None:
    _, lazy = import_graph()
    bad = [
        f"{module} → {target}"
        for module, targets in sorted(lazy.items())
        if module.startswith(EXPERIMENTS + ".")
        for target in sorted(targets)
        if target == EXPERIMENTS or target.startswith(EXPERIMENTS + ".")
    ]
    assert not bad, "imports of experiment modules inside functions: " + ", ".join(bad)


#: DESIGN §2: (importer package, packages it may never import), function-level imports included.
#: ``torch_port``'s experiments may use ``reference`` but not ``proofs_checks``; developer tools
#: (``proofs_checks.dev``, not installed) are imported by nothing that is installed.
FORBIDDEN = [
    ("reference", ("torch_port", "proofs_checks")),
    ("torch_port", ("proofs_checks",)),
    ("proofs_checks", ("proofs_checks.dev",)),
]


def _forbidden_edges(graph: dict[str, set[str]]) -> list[str]:
    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return [
        f"{module} → {target}"
        for importer, banned in FORBIDDEN
        for module, targets in sorted(graph.items())
        if within(module, importer) and not within(module, "proofs_checks.dev")
        for target in sorted(targets)
        if any(within(target, b) for b in banned)
    ]


def test_imports_flow_one_way() -> None:
    top, lazy = import_graph()
    both = {m: top.get(m, set()) | lazy.get(m, set()) for m in top.keys() | lazy.keys()}
    bad = _forbidden_edges(both)
    assert not bad, "imports against DESIGN §2's direction: " + ", ".join(bad)


def test_a_forbidden_import_is_seen() -> None:
    """Control: an experiment importing the command's module is reported."""
    bad = _forbidden_edges({f"{EXPERIMENTS}.rank_edge": {"proofs_checks.cli.rank"}})
    assert bad == [f"{EXPERIMENTS}.rank_edge → proofs_checks.cli.rank"]


def test_the_developer_tools_are_not_installed_and_not_hashed() -> None:
    """``pyproject.toml`` leaves out of the wheel exactly the subpackages the registry leaves out
    of its source hashes, so a checkout and an install hash the same files."""
    import tomllib

    from proofs_checks import registry

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    excluded = config["tool"]["setuptools"]["packages"]["find"]["exclude"]
    assert excluded == [f"proofs_checks.{name}*" for name in registry.NOT_INSTALLED]
    hashed = set(registry.package_sources())
    assert "proofs_checks.registry" in hashed
    assert not any(m.startswith("proofs_checks.dev") for m in hashed)
