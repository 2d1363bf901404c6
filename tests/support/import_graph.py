"""A package's internal import graph, computed from its source with ``ast``, and its cycles.

Every ``import`` statement counts wherever it stands: at module level, inside a function
(the "lazy import" that hides a cycle from the interpreter but not from a reader), and
under ``if TYPE_CHECKING:``. An edge goes from the importing module to the deepest module
of the same package that the statement names: ``from .client import Client`` -> ``client``,
``from . import cuda`` -> ``cuda`` (a sub-package, i.e. its ``__init__``), ``from . import
__version__`` -> the package itself. Parents a module imports implicitly (every submodule
runs its package's ``__init__``) are not edges: they are how Python packages work, not a
dependency someone wrote.

Cycles are the strongly connected components with more than one module (Tarjan), plus
modules that import themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_names(src: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of ``src/<package>``."""
    root = src / package
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest existing module that ``name`` (dotted) is or lies in; None outside the package."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    """``{module: modules of the same package it imports}`` (see the module docstring)."""
    modules = module_names(src, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        # The package a relative import of level 1 starts from.
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = here.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join([*base_parts, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                # `from pkg import sub` imports the submodule `pkg.sub` when it exists.
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for target in targets:
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != name:
                    graph[name].add(resolved)
                elif resolved == name and not is_package:
                    graph[name].add(name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle: each strongly connected component of more than one module (sorted),
    and each self-import, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        # Iterative Tarjan: (node, iterator over its successors) frames.
        nonlocal counter
        frames = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while frames:
            node, successors = frames[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    frames.append((succ, iter(sorted(graph.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            frames.pop()
            if frames:
                parent = frames[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def describe_cycle(component: list[str], graph: dict[str, set[str]]) -> str:
    """The component's modules and the import arrows between them, for an assertion message."""
    members = set(component)
    arrows = [f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in members]
    return "{" + ", ".join(component) + "}: " + "; ".join(arrows)
