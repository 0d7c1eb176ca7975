"""The import graph of a package, read from its source (``ast``), for the layout tests.

The package is read, not imported, so an import inside a function counts as much as one at
the top of a module, and so does one under ``if TYPE_CHECKING:``: a circle that only type
checkers see is still two modules that need each other (issue 20).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    """``numeric_check/model/hooks.py`` -> ``numeric_check.model.hooks`` (a package is its ``__init__``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder under the repository root) by its dotted name."""
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every module in ``known`` that ``path`` imports, at any depth (functions and
    ``if TYPE_CHECKING:`` blocks included).

    ``from numeric_check.model import hooks`` names the module ``numeric_check.model.hooks``;
    ``from numeric_check.model.hooks import Constant`` names ``numeric_check.model.hooks``.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in known:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` and the modules of the same package it imports."""
    modules = modules_of(package)
    known = set(modules)
    return {name: imported_modules(path, known) - {name} for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each set of two or more modules that all reach each
    other (or one that imports itself), sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                out.append(sorted(group))

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return sorted(out)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None when the graph is acyclic."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None
