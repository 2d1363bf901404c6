"""The import rules of ``prime_rl``'s rooms, computed from the code (not from a hand list).

Rules (each room's ``__init__`` docstring says the same):

* ``config`` is the ground floor: it imports no other room of ``prime_rl``;
* the orchestrator never imports torch (nor transformers), directly or through another module;
* worker, validator and trainer never import each other;
* no honest room imports the red team (``redteam``: the hostile worker behaviours), directly or
  through another module: attack code never runs on the honest path;
* each room imports only the rooms it is allowed (``ALLOWED`` below);
* no import cycle between modules, counting imports inside functions too.

Each checker is a pure function over an import graph; the tests run them on the real package and
on small broken graphs, so a checker that could never fail would be caught here too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from import_graph import find_cycles  # tests/support: the cycle finder the libraries' test uses

import prime_rl

PACKAGE_ROOT = Path(prime_rl.__file__).parent
TOP_LEVEL = {"cli", "tasks", "reward", "episodes", "role", "metrics", "trackers", "devices", "durable", "statedb", "storeguard", "seeds", "_name_clash"}  # besides __init__

# Room -> rooms it may import (besides itself). Top-level modules count as rooms of their own name.
ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "metrics": set(),
    "trackers": {"config", "metrics"},  # W&B / TensorBoard fed from the metrics events, beside metrics.py
    "durable": set(),  # atomic durable writes: rollout batches, checkpoints, weights files, worker identities
    "statedb": {"storeguard"},  # control-plane state in SQLite: the orchestrator's store, the validator's journal
    "storeguard": set(),  # the store's flock and the WAL damage check, before SQLite opens the file
    "devices": set(),  # config device/dtype names -> torch objects
    "seeds": set(),  # keyless seed rules (span_seed) the sampler and the wire share
    "tasks": {"config"},
    "reward": {"config", "tasks"},  # the reward contract, next to the tasks it scores
    "episodes": {"config", "tasks"},  # multi-turn episodes' environment turns as tokens: worker and validator share it
    "role": {"config", "api", "metrics"},  # run_role: the scaffold of the worker, validator and trainer mains
    "api": {"config", "seeds"},
    "weights": {"config", "metrics", "durable"},
    # weights: only the torch-free layout (POLICY_FILENAME), which TORCH_FREE below enforces
    "orchestrator": {"config", "api", "tasks", "metrics", "durable", "statedb", "weights"},
    "inference": {"config", "tasks", "weights", "metrics", "devices", "seeds"},
    "worker": {"config", "api", "inference", "weights", "tasks", "reward", "episodes", "role", "metrics", "devices", "durable"},
    "validator": {"config", "api", "inference", "weights", "tasks", "reward", "episodes", "role", "metrics", "devices", "durable",
                  "statedb"},
    "trainer": {"config", "api", "weights", "role", "metrics", "devices", "durable"},
    # the red team plays its attacks inside the worker's loop; nothing imports it back (HONEST below)
    "redteam": {"config", "api", "inference", "weights", "tasks", "reward", "episodes", "role", "metrics", "devices",
                "durable", "worker"},
    "evaluator": {"config", "inference", "weights", "tasks", "metrics", "devices"},
    "launch": {"config", "api", "weights", "metrics", "devices"},
    "cli": {"config", "launch", "metrics", "trackers", "episodes"},  # logging, the demo model's path, the trackers,
    # the environment's contract: before a role starts
    "_name_clash": set(),  # the import-time warning about another package of the same name
    "__init__": {"config", "api", "_name_clash"},
}
# Module-name prefixes that must never reach torch: the control plane runs on any small machine.
TORCH_FREE = ("prime_rl.config", "prime_rl.api", "prime_rl.seeds", "prime_rl.orchestrator", "prime_rl.tasks", "prime_rl.metrics",
              "prime_rl.cli", "prime_rl.launch.supervisor", "prime_rl.launch.report", "prime_rl.launch.progress", "prime_rl.durable", "prime_rl.statedb", "prime_rl.storeguard",
              "prime_rl.weights.layout", "prime_rl.launch.model_cache", "prime_rl.trackers", "prime_rl.episodes")
TORCH_MODULES = {"torch", "transformers", "safetensors", "vllm"}
ATTACK_ROOM = "prime_rl.redteam"
"""The hostile worker behaviours: only tests, demos and ``prime-rl redteam`` load them."""


def module_name(path: Path, root: Path = PACKAGE_ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = PACKAGE_ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> prime_rl modules it imports, module -> third-party top-level packages it imports).

    Every ``import``/``from ... import`` in the file counts, at module level or inside a function
    or ``TYPE_CHECKING`` block: a deferred import is still a dependency of the room.
    """
    modules = {module_name(path, root): path for path in root.rglob("*.py")}
    internal: dict[str, set[str]] = {name: set() for name in modules}
    external: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from prime_rl.api import assignment` imports the module prime_rl.api.assignment.
                targets = [
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                    for alias in node.names
                ]
            for target in targets:
                if target == "prime_rl" or target.startswith("prime_rl."):
                    while target not in modules:
                        target = target.rsplit(".", 1)[0]
                    if target != name:
                        internal[name].add(target)
                else:
                    external[name].add(target.split(".")[0])
    return internal, external


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def room_violations(internal: Mapping[str, Iterable[str]], allowed: Mapping[str, set[str]]) -> list[str]:
    """Every import that crosses from one room into a room it may not import."""
    found = []
    for module, targets in sorted(internal.items()):
        source = room(module)
        for target in sorted(targets):
            target_room = room(target)
            if target_room in (source, "__init__"):
                continue
            if target_room not in allowed.get(source, set()):
                found.append(f"{module} imports {target} ({source} may not import {target_room})")
    return found


def torch_reachers(
    internal: Mapping[str, Iterable[str]], external: Mapping[str, Iterable[str]], start: str,
    forbidden: Iterable[str] = TORCH_MODULES,
) -> list[str]:
    """Import paths from ``start`` to a module that imports torch (or another heavy ML package;
    ``forbidden``: the imports to look for in ``external``)."""
    paths = []
    seen = {start}
    frontier = [[start]]
    while frontier:
        path = frontier.pop()
        heavy = set(forbidden) & set(external.get(path[-1], ()))
        if heavy:
            paths.append(" -> ".join(path) + f" -> {sorted(heavy)[0]}")
        for child in sorted(internal.get(path[-1], ())):
            if child not in seen:
                seen.add(child)
                frontier.append([*path, child])
    return paths


def attack_reachers(internal: Mapping[str, Iterable[str]], start: str) -> list[str]:
    """Import paths from ``start`` (a module outside the red team) into :data:`ATTACK_ROOM`."""
    attack = {t for targets in internal.values() for t in targets if room(t) == room(ATTACK_ROOM + ".attacks")}
    honest = {module: set(targets) - attack for module, targets in internal.items() if module not in attack}
    return torch_reachers(honest, {module: set(targets) & attack for module, targets in internal.items()}, start, attack)


# ---------------------------------------------------------------- the real package


GRAPH, EXTERNAL = import_graph()


def test_layout_has_the_rooms_and_few_top_level_modules():
    rooms = {path.name for path in PACKAGE_ROOT.iterdir() if (path / "__init__.py").exists()}
    assert rooms == {"config", "api", "orchestrator", "inference", "worker", "validator", "trainer",
                     "weights", "launch", "evaluator", "redteam"}
    top = {path.stem for path in PACKAGE_ROOT.glob("*.py")} - {"__init__"}
    assert top == TOP_LEVEL
    for name in rooms:
        doc = ast.get_docstring(ast.parse((PACKAGE_ROOT / name / "__init__.py").read_text()))
        assert doc and "Owns:" in doc and "May import:" in doc, name


def test_every_room_imports_only_what_it_may():
    assert room_violations(GRAPH, ALLOWED) == []


def test_no_import_cycle():
    assert find_cycles(GRAPH) == []


@pytest.mark.parametrize("prefix", TORCH_FREE)
def test_torch_free_modules_never_reach_torch(prefix: str):
    starts = [module for module in GRAPH if module == prefix or module.startswith(prefix + ".")]
    assert starts
    assert [path for start in starts for path in torch_reachers(GRAPH, EXTERNAL, start)] == []


def test_no_honest_module_reaches_attack_code():
    honest = [module for module in GRAPH if not (module == ATTACK_ROOM or module.startswith(ATTACK_ROOM + "."))]
    assert "prime_rl.worker.process" in honest and "prime_rl.cli" in honest
    assert [path for start in honest for path in attack_reachers(GRAPH, start)] == []


def loaded_by(imports: str, forbidden: str) -> str:
    """In a fresh interpreter, run ``imports`` and print the modules loaded whose names match the
    expression ``forbidden`` (of ``m``); '' when there are none, else the output."""
    code = f"import sys; {imports}; loaded = sorted(m for m in sys.modules if {forbidden}); print(loaded); sys.exit(1 if loaded else 0)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_honest_processes_never_load_attack_code():
    # What the interpreter loads, not only what the source names: an honest worker, validator,
    # orchestrator and supervisor import no module of the red team.
    imports = "import prime_rl.worker.process, prime_rl.validator.process, prime_rl.orchestrator.server, prime_rl.launch.supervisor, prime_rl.cli"
    assert loaded_by(imports, "m.startswith('prime_rl.redteam')") == ""


def test_orchestrator_process_never_imports_torch():
    # The static graph does not see what third-party packages import; the interpreter does.
    imports = "import prime_rl.orchestrator.server, prime_rl.launch.supervisor, prime_rl.cli; from prime_rl.config import load_config; load_config(None)"
    assert loaded_by(imports, "m in ('torch', 'transformers', 'safetensors')") == ""


# ---------------------------------------------------------------- the checkers can fail


def test_checkers_catch_a_broken_graph():
    broken = {
        "prime_rl.config.run": {"prime_rl.worker.process"},  # config imports a role
        "prime_rl.worker.process": {"prime_rl.validator.checks"},  # worker imports validator
        "prime_rl.validator.checks": {"prime_rl.worker.process"},  # ... and back: a cycle
        "prime_rl.orchestrator.ledger": {"prime_rl.inference.backend"},
        "prime_rl.inference.backend": set(),
    }
    violations = room_violations(broken, ALLOWED)
    assert violations == [
        "prime_rl.config.run imports prime_rl.worker.process (config may not import worker)",
        "prime_rl.orchestrator.ledger imports prime_rl.inference.backend "
        "(orchestrator may not import inference)",
        "prime_rl.validator.checks imports prime_rl.worker.process (validator may not import worker)",
        "prime_rl.worker.process imports prime_rl.validator.checks (worker may not import validator)",
    ]
    assert find_cycles(broken) == [["prime_rl.validator.checks", "prime_rl.worker.process"]]
    attacked = {**broken, "prime_rl.worker.rollout": {"prime_rl.redteam.attacks"}, "prime_rl.worker.process": {"prime_rl.worker.rollout"}}
    assert room_violations(attacked, ALLOWED)[-1] == (
        "prime_rl.worker.rollout imports prime_rl.redteam.attacks (worker may not import redteam)"
    )
    assert attack_reachers(attacked, "prime_rl.config.run") == [
        "prime_rl.config.run -> prime_rl.worker.process -> prime_rl.worker.rollout -> prime_rl.redteam.attacks"
    ]
    assert attack_reachers({"prime_rl.redteam.process": {"prime_rl.worker.process"}}, "prime_rl.worker.process") == []
    external = {"prime_rl.inference.backend": {"torch"}}
    assert torch_reachers(broken, external, "prime_rl.orchestrator.ledger") == [
        "prime_rl.orchestrator.ledger -> prime_rl.inference.backend -> torch"
    ]


def test_graph_sees_function_level_and_from_package_imports(tmp_path: Path):
    package = tmp_path / "prime_rl"
    (package / "api").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "api" / "__init__.py").write_text("")
    (package / "api" / "assignment.py").write_text("import hashlib\n")
    (package / "tasks.py").write_text(
        "def f():\n    import torch\n    from prime_rl.api import assignment\n    return torch, assignment\n"
    )
    internal, external = import_graph(package)
    assert internal["prime_rl.tasks"] == {"prime_rl.api.assignment"}
    assert external["prime_rl.tasks"] == {"torch"}
    assert external["prime_rl.api.assignment"] == {"hashlib"}


def test_the_old_hostile_module_names_are_deprecated_aliases():
    # One release: prime_rl.worker.hostile* import as the red team's modules (the same objects), with a warning.
    import importlib

    from prime_rl.worker import MOVED_TO_REDTEAM

    assert set(MOVED_TO_REDTEAM) == {f"prime_rl.worker.{n}" for n in ("hostile", "hostile_spans", "hostile_episodes")}
    for old, new in MOVED_TO_REDTEAM.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=new):
            module = importlib.import_module(old)
        assert module is importlib.import_module(new) and module.__spec__.name == new
