"""The package's shape holds: no import cycles, no module over 450 lines, no function over 60.

The layer order itself is `.importlinter`'s (run `lint-imports`); these hold what a layers
contract cannot say. Every module is read from the source tree next to these tests, so they
hold whatever the layout: each failure lists every offender, not only the first.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="pip install import-linter (brings grimp)")

PACKAGE = Path(__file__).resolve().parents[2] / "mtkit"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def shown(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


@pytest.fixture(scope="module")
def graph():
    """grimp's import graph of mtkit: every import statement, at module level, inside a
    function or under TYPE_CHECKING."""
    spec = importlib.util.find_spec("mtkit")
    found = [Path(p).resolve() for p in spec.submodule_search_locations or []]
    assert found == [PACKAGE], f"grimp would read mtkit at {found}, not {PACKAGE}: put this " \
                               f"checkout first on the path (PYTHONPATH={PACKAGE.parent})"
    return grimp.build_graph("mtkit", cache_dir=None)


def strongly_connected(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def describe_cycle(graph, modules: list[str]) -> str:
    """'a, b, c: a -> b (l.12), b -> a (l.40)': the cycle's modules and its imports."""
    links = []
    for importer in modules:
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported in modules:
                lines = sorted({d["line_number"] for d in graph.get_import_details(
                    importer=importer, imported=imported)})
                where = ", ".join(f"l.{n}" for n in lines)
                links.append(f"{importer} -> {imported} ({where})")
    return f"{', '.join(modules)}: {'; '.join(links)}"


def test_no_import_cycles(graph):
    nodes = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in nodes}
    cycles = [c for c in strongly_connected(nodes, edges) if len(c) > 1]
    assert not cycles, "import cycles (each a set of modules that import each other in a " \
                       "circle):\n" + "\n".join(describe_cycle(graph, c) for c in cycles)


def test_the_tarjan_helper_finds_every_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"},
             "g": set()}
    found = sorted(strongly_connected(sorted(edges), edges))
    assert found == [["a", "b", "c"], ["d", "e"], ["f"], ["g"]]


def test_no_module_over_450_lines():
    long = []
    for path in sources():
        with open(path, encoding="utf-8") as f:
            count = sum(1 for _ in f)
        if count > MAX_MODULE_LINES:
            long.append(f"{shown(path)}: {count} lines")
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def test_no_function_over_60_lines():
    long = []
    for path in sources():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node in functions(tree):
            length = node.end_lineno - node.lineno + 1  # from `def` to its last line
            if length > MAX_FUNCTION_LINES:
                long.append((shown(path), node.lineno, f"{shown(path)}:{name}:{length}"))
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (file:function:lines):\n" \
                     + "\n".join(entry for *_, entry in sorted(long))
