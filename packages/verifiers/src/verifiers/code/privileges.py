"""Who untrusted code runs as: the unprivileged uid and, for the fallback, the interpreter.

Both sandboxes run tests under `fresh_uid()` when the host is root: a random uid in
[200000, 260000) that owns nothing on the host. RLIMIT_NPROC counts processes per real
uid and is not enforced for root, so only a fresh uid makes the process limit real, and
per run (two concurrent runs share a uid with probability ~1/60000).

bubblewrap binds the interpreter's prefix into the sandbox, so any interpreter works. The
rlimit fallback execs an interpreter from the host filesystem *after* it has dropped to the
fresh uid, so that interpreter must be readable and executable by "others" along its whole
path. A virtual environment under a root-only directory (e.g. pyenv under `/root`, mode
0700) is not; `fallback_python()` then probes system interpreters and picks the first one
that really starts as an unprivileged uid.

Pitfall: the fallback never runs untrusted code as root. When no interpreter passes the
probe, `fallback_python()` returns None and the caller scores the program 0 with a
`runner_error` saying why (it must not raise into the training loop).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass
from functools import cache

UID_RANGE = (200_000, 260_000)  # far above the ranges distributions hand out (< 65536)
# Interpreters tried as root, after the caller's own (first match wins).
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
# What the runner imports before and after dropping privileges (see _runner.py).
_PROBE = (
    "import _signal, ctypes, marshal, os, resource, select, sys\n"
    "assert os.getuid() != 0 and hasattr(os, 'waitstatus_to_exitcode')\n"
    "print('ok', sys.version_info[0], sys.version_info[1])"
)


def fresh_uid() -> int:
    """A random unprivileged uid in `UID_RANGE` (the one way both sandboxes choose it)."""
    return random.randrange(*UID_RANGE)


@dataclass(frozen=True)
class FallbackPython:
    """The interpreter the rlimit fallback runs, or why there is none.

    Attributes:
        path: absolute interpreter path, or None when the fallback must refuse to run.
        drops_uid: True when tests run under `fresh_uid()` (the host is root).
        reason: one line for logs and `CodeResult.error` (why this path, or why none).
    """

    path: str | None
    drops_uid: bool
    reason: str


def _starts_unprivileged(python: str) -> bool:
    """True iff `python -I -S` runs the runner's imports as a fresh non-root uid."""
    uid = fresh_uid()
    try:
        probe = subprocess.run(
            [python, "-I", "-S", "-c", _PROBE],
            capture_output=True,
            timeout=30,
            text=True,
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except (OSError, subprocess.SubprocessError):
        return False
    words = probe.stdout.split()
    return (
        probe.returncode == 0
        and len(words) == 3
        and words[0] == "ok"
        and (int(words[1]), int(words[2])) >= (3, 9)
    )


@cache
def fallback_python() -> FallbackPython:
    """Choose the fallback's interpreter once per process (probes cost ~50 ms each as root).

    Non-root: `sys.executable` (nothing to drop). Root: the caller's interpreter if an
    unprivileged uid can start it, else the first of `SYSTEM_PYTHONS` that can (Python >= 3.9;
    it may be another minor version than the caller's), else None.
    """
    if os.getuid() != 0:
        return FallbackPython(sys.executable, False, "not root: tests run as the caller's uid")
    candidates = [os.path.realpath(sys.executable)]
    candidates += [os.path.realpath(p) for p in SYSTEM_PYTHONS if os.path.exists(p)]
    for python in dict.fromkeys(candidates):  # de-duplicated, order kept
        if _starts_unprivileged(python):
            return FallbackPython(python, True, f"root: tests run as a fresh uid under {python}")
    return FallbackPython(
        None,
        True,
        "rlimit fallback refuses to run untrusted code as root: no Python interpreter is "
        f"usable by an unprivileged uid (tried {', '.join(dict.fromkeys(candidates))}); "
        "install bubblewrap or a world-readable python3",
    )
