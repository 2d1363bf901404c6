"""The run's environment as one digest, so a worker with another copy of it is refused at once.

``[tasks.environment]`` names an environment by import path, and each process imports it from its
own disk. A worker whose copy of ``my_env.py`` is older than the validator's plays episodes the
validator re-derives differently, and every lease is rejected one by one, with no word why. The
orchestrator publishes :func:`environment_digest` of its configuration in ``GET /status``
(``environment``); a worker or validator whose own digest differs stops before it loads a model,
naming both digests and the file.

What the digest covers: the section's settings (attribute, ``args``, ``max_turns``, ``feedback``,
``turn_template``, ``tool_timeout_s``) and the bytes of the source file that defines the
environment (a ``.py`` path, the module's file, or the module an entry point names), not where it
lies on disk, so two machines with identical copies agree. Built-ins cover their settings only; a
process that cannot find the source publishes "" and nothing is compared.
Torch-free; the source is read, never executed, except the parent packages of a dotted module
path, which ``importlib.util.find_spec`` imports to find it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from importlib.metadata import entry_points
from pathlib import Path

from prime_rl.config.components import ImportPath
from prime_rl.config.sections import BUILTIN_ENVIRONMENTS, ENVIRONMENT_ENTRY_POINTS, EnvironmentConfig

__all__ = ["environment_digest", "environment_source"]


def environment_source(section: EnvironmentConfig) -> Path | None:
    """The source file that defines the environment ``section`` names; None for a built-in or one
    this process cannot find (then only the settings are digested)."""
    if section.name in BUILTIN_ENVIRONMENTS:
        return None
    if ":" in section.name:
        target = ImportPath.parse(section.name)
        if target.is_file:
            path = Path(target.source).expanduser().resolve()
            return path if path.is_file() else None
        module = target.source
    else:
        found = entry_points(group=ENVIRONMENT_ENTRY_POINTS, name=section.name)
        if not found:
            return None
        module = next(iter(found)).value.partition(":")[0].strip()
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and Path(origin).is_file() else None


def environment_digest(section: EnvironmentConfig) -> str:
    """``sha256`` (hex, 16 characters) of the environment's settings and source (module docstring);
    "" when this process cannot find the source of an environment of yours (nothing to compare: a
    process without the file cannot load it either, and says so)."""
    attribute = section.name.rpartition(":")[2]
    source = environment_source(section)
    if source is None and section.name not in BUILTIN_ENVIRONMENTS:
        return ""
    settings = {
        "environment": attribute,
        "args": section.args,
        "max_turns": section.max_turns,
        "feedback": section.feedback,
        "turn_template": section.turn_template,
        "tool_timeout_s": section.tool_timeout_s,
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest() if source is not None else "",
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
