"""The untrusted inference worker (``prime-rl worker``).

Owns: the worker process (``process.py``: follow the policy, take leases, submit batches), turning
a lease into a rollout batch (``rollout.py``, ``episodes.py``), in-flight version switches
(``inflight.py``), identities and rescoring. No attack code: the hostile behaviours live in
:mod:`prime_rl.redteam`, which this room never imports (``tests/test_layout.py``). May import:
``config``, ``api``, ``inference``, ``weights``, ``tasks``, ``reward``, ``episodes``, ``role``,
``metrics``, ``devices``, ``durable``; never ``validator``, ``trainer``, ``orchestrator`` or ``redteam``.

The old module names ``prime_rl.worker.hostile``, ``hostile_spans`` and ``hostile_episodes`` still
import, for one release, as deprecated aliases of their ``prime_rl.redteam`` modules: the alias
resolves the name when someone imports it, so nothing on the honest path loads the red team.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED_TO_REDTEAM = {
    "prime_rl.worker.hostile": "prime_rl.redteam.attacks",
    "prime_rl.worker.hostile_spans": "prime_rl.redteam.spans",
    "prime_rl.worker.hostile_episodes": "prime_rl.redteam.episodes",
}
"""Deprecated module name -> where it lives now (removed in the release after this one)."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a deprecated name as the very module it moved to (one object: patches reach both)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_TO_REDTEAM:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED_TO_REDTEAM[spec.name]
        warnings.warn(f"{spec.name} is deprecated: it moved to {new}", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        # the import system stamps the alias's spec on the module: exec_module puts the real one back
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None and module.__spec__.name in self._specs:
            module.__spec__ = self._specs.pop(module.__spec__.name)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())  # after the path finders: a real file of that name wins
