"""Warn when another installed distribution provides the same top-level package as ours.

The PyPI name of our import package may belong to someone else (`pip install verifiers` is
PrimeIntellect's environments library); pip then lets whichever was installed last overwrite
the other's files, without a word. On import we say so in one line.

Cost: a stat per `sys.path` entry; only entries that hold a `<name>/` or `<name>.py` have their
distributions' `top_level.txt` (else `RECORD`) read. This is `importlib.metadata.
packages_distributions()` restricted to one name and to those entries (the full call reads every
RECORD on the path, seconds in a large environment); the tests check the two agree.

Pitfall: when the other distribution's files won, `import <name>` runs *its* code and this
warning never appears; `pip show <name> <our dist>` then shows both.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import importlib.metadata


class NameClashWarning(UserWarning):
    """Another installed distribution provides the same top-level package."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _top_level(dist: importlib.metadata.Distribution) -> set[str]:
    """Top-level names a distribution provides, as `packages_distributions()` infers them."""
    declared = dist.read_text("top_level.txt")
    if declared is not None:
        return set(declared.split())
    names = set()
    for line in (dist.read_text("RECORD") or "").splitlines():
        first = line.split(",", 1)[0].split("/", 1)
        if len(first) == 2:
            names.add(first[0])
        elif first[0].endswith(".py"):
            names.add(first[0][:-3])
    return names


def clashing_distributions(import_name: str, own_dist: str, path: Iterable[str] | None = None) -> list[str]:
    """Names of installed distributions other than `own_dist` that provide `import_name`."""
    entries = [
        entry
        for entry in (sys.path if path is None else path)
        if os.path.isdir(os.path.join(entry or ".", import_name))
        or os.path.isfile(os.path.join(entry or ".", import_name + ".py"))
    ]
    if not entries:
        return []
    import importlib.metadata  # only now: it pulls in email, zipfile and csv (import time)

    owners = {
        dist.metadata["Name"]
        for dist in importlib.metadata.distributions(path=entries)
        if dist.metadata["Name"] and import_name in _top_level(dist)
    }
    return sorted(name for name in owners if _canonical(name) != _canonical(own_dist))


def warn_on_name_clash(import_name: str, own_dist: str, *, others_hint: str) -> list[str]:
    """Emit one `NameClashWarning` line naming both distributions; returns the others found.

    `others_hint` says who the usual other owner is (shown after the names). Never raises:
    broken metadata on the path must not break `import`.
    """
    try:
        others = clashing_distributions(import_name, own_dist)
    except Exception:
        return []
    if others:
        names = ", ".join(others)
        warnings.warn(
            f"'{import_name}' is provided by {own_dist} (this package) and also by {names} ({others_hint}); "
            f"pip lets the last install overwrite the other's files. Keep them apart: use separate "
            f"virtual environments, or `pip uninstall {others[0]}` and reinstall {own_dist}.",
            NameClashWarning,
            stacklevel=2,
        )
    return others
