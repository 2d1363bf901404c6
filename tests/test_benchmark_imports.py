"""The benchmark scripts import one another without a circle (issue 47).

``benchmarks/`` is a folder of scripts that import each other by their file names (each puts its
own folder on ``sys.path`` when run); every import counts, at module level, inside a function or
under ``if __name__ == "__main__"``, as ``tests/support/import_graph.py`` counts them for the
libraries. A script that needs another's self-test as a command runs it as a process instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import find_cycles

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script_graph(folder: Path) -> dict[str, set[str]]:
    """Script name -> the other scripts of ``folder`` it imports (every import statement)."""
    names = {path.stem for path in folder.glob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in names}
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module.split(".")[0]]
            else:
                continue
            graph[path.stem] |= {target for target in targets if target in names and target != path.stem}
    return graph


def test_benchmark_scripts_import_without_a_circle():
    graph = script_graph(BENCHMARKS)
    assert {"inflight_sim", "inflight_sim_continuous", "swarm_wan", "swarm_wan_probe"} <= set(graph)
    assert "inflight_sim" not in graph["inflight_sim_continuous"] and "swarm_wan_probe" not in graph["swarm_wan"]
    assert find_cycles(graph) == []


def test_the_script_graph_sees_lazy_imports(tmp_path: Path):
    (tmp_path / "a.py").write_text("def f():\n    from b import g\n    return g\n")
    (tmp_path / "b.py").write_text("if __name__ == '__main__':\n    import a\n")
    (tmp_path / "c.py").write_text("import json\n")
    graph = script_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set()}
    assert find_cycles(graph) == [["a", "b"]]
