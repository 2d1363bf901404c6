"""Stopping process groups: SIGTERM every live one at once, then reap each within one shared grace
period and SIGKILL whatever outlives it.

Every process that starts children in their own process groups stops them this way: the
supervisor (``prime-rl run``), the test harness and the swarm rehearsal. Each child must lead its
own group (``start_new_session=True``), so the signal also reaches what it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable

__all__ = ["stop_groups"]


def stop_groups(
    processes: Iterable[subprocess.Popen[bytes] | subprocess.Popen[str]],
    grace_s: float,
    *,
    reap_s: float | None = None,
    on_kill: Callable[[subprocess.Popen[bytes] | subprocess.Popen[str]], None] | None = None,
) -> None:
    """SIGTERM the process group of every live process in ``processes``, wait for them all within
    ``grace_s`` seconds together, SIGKILL the group of each one still running then (``on_kill(p)``
    first) and wait ``reap_s`` more (None: until it is gone)."""
    live = [process for process in processes if process.poll() is None]
    for process in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in live:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if on_kill is not None:
                on_kill(process)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(reap_s)
