"""The package's shape holds: no import cycles.

The layer order itself is `.importlinter`'s (run `lint-imports`); this holds what a layers
contract cannot say. Every module is read from the source tree next to these tests, so it
holds whatever the layout, and a failure lists every cycle, not only the first. No test
fails a module or a function for its length: a long one is a prompt for
review, never a reason to cut a comment or pack parameters onto one line.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="pip install import-linter (brings grimp)")

PACKAGE = Path(__file__).resolve().parents[2] / "mtkit"


@pytest.fixture(scope="module")
def graph():
    """grimp's import graph of mtkit: every import statement, at module level, inside a
    function or under TYPE_CHECKING."""
    spec = importlib.util.find_spec("mtkit")
    found = [Path(p).resolve() for p in spec.submodule_search_locations or []]
    assert found == [PACKAGE], (
        f"grimp would read mtkit at {found}, not {PACKAGE}: put this "
        f"checkout first on the path (PYTHONPATH={PACKAGE.parent})"
    )
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
                lines = sorted(
                    {
                        d["line_number"]
                        for d in graph.get_import_details(importer=importer, imported=imported)
                    }
                )
                where = ", ".join(f"l.{n}" for n in lines)
                links.append(f"{importer} -> {imported} ({where})")
    return f"{', '.join(modules)}: {'; '.join(links)}"


def test_no_import_cycles(graph):
    nodes = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in nodes}
    cycles = [c for c in strongly_connected(nodes, edges) if len(c) > 1]
    assert not cycles, (
        "import cycles (each a set of modules that import each other in a "
        "circle):\n" + "\n".join(describe_cycle(graph, c) for c in cycles)
    )


def test_the_tarjan_helper_finds_every_cycle():
    edges = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a"},
        "d": {"a", "e"},
        "e": {"d"},
        "f": {"f"},
        "g": set(),
    }
    found = sorted(strongly_connected(sorted(edges), edges))
    assert found == [["a", "b", "c"], ["d", "e"], ["f"], ["g"]]
