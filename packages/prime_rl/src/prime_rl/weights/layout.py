"""Where policy version ``N`` lives on disk: the file ``<root>/v<N>/model.safetensors``.

The trainer's ``policies/``, every worker's, validator's and evaluator's policy cache use this
layout; :mod:`prime_rl.weights.store` prunes old versions with it and
:mod:`prime_rl.launch.supervisor` deletes the transient copies after a run. Torch-free on purpose:
the supervisor imports it without torch, and the orchestrator names :data:`POLICY_FILENAME` to
workers (``StatusResponse.weights_file``).

Parsing is strict: a folder name is a version only if it is exactly what :func:`version_dir`
writes, ``v`` then ASCII decimal digits without sign, whitespace or leading zeros (``v0``, ``v12``;
not ``v``, ``v-1``, ``v01``, ``v1x``, ``vv2``, ``v²``). Anything else in the folder, and plain files
with a version's name, is ignored.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

__all__ = [
    "POLICY_FILENAME",
    "parse_version_dir_name",
    "policy_file",
    "prune_version_dirs",
    "version_dir",
    "version_dirs",
]

POLICY_FILENAME = "model.safetensors"
"""The one file a policy version is (also its file name inside shardcast)."""

_VERSION_DIR = re.compile(r"v(0|[1-9][0-9]*)")


def version_dir(root: str | Path, version: int) -> Path:
    """The folder of policy ``version`` under ``root``: ``root / f"v{version}"``."""
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    return Path(root) / f"v{version}"


def policy_file(root: str | Path, version: int) -> Path:
    """The weights file of policy ``version`` under ``root``: ``root / f"v{version}" / POLICY_FILENAME``."""
    return version_dir(root, version) / POLICY_FILENAME


def parse_version_dir_name(name: str) -> int | None:
    """The version a folder name stands for (``"v12"`` -> 12), or None when it is not one.

    Pitfall: ``str.isdigit`` accepts ``"²"`` (which ``int`` rejects) and ``int`` accepts ``" 1"``,
    ``"+1"`` and ``"0_1"``; a full regex match on ASCII digits accepts neither.
    """
    match = _VERSION_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


def version_dirs(root: str | Path) -> dict[int, Path]:
    """Every version folder directly under ``root``, by version, in ascending version order.

    A missing ``root`` has none (``{}``); entries that are not directories are ignored.
    """
    root = Path(root)
    if not root.is_dir():
        return {}
    found = {}
    for entry in root.iterdir():
        version = parse_version_dir_name(entry.name)
        if version is not None and entry.is_dir():
            found[version] = entry
    return dict(sorted(found.items()))


def prune_version_dirs(root: str | Path, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` version folders under ``root``; the versions deleted.

    Deleting a name frees nothing while another process's cache still hard-links the file, and a
    reader that has the file open keeps reading it (POSIX), so pruning never breaks a load in flight.
    """
    versions = version_dirs(root)
    doomed = list(versions)[: max(0, len(versions) - keep)]
    for version in doomed:
        shutil.rmtree(versions[version], ignore_errors=True)
    return doomed
