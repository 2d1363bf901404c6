"""How long a download may wait, and what it tells people meanwhile: the default deadline
and stall timeout, the record passed to progress callbacks, the periodic log line that says
what a transfer waits for, and the command line's terminal bar.

A download that makes no progress is never silent: :class:`~shardcast.transfer.Transfer`
logs :func:`status_line` every :data:`STATUS_LOG_S` seconds, naming each server's state
(unreachable and when it is retried, still mirroring, not listing the version, dropped),
and gives up after :data:`DEFAULT_STALL_TIMEOUT_S` without an answer from any server.
This module imports no HTTP library, so the command line starts fast.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .remote import VersionTracker
    from .servers import ServerPool

DEFAULT_DEADLINE_S = 3600.0
"""Limit of one whole download (a 64 GB checkpoint at 590 Mbit/s takes ~15 min)."""
DEFAULT_STALL_TIMEOUT_S = 60.0
"""A download fails when no server has answered anything for this long (dead origin, cut link),
instead of backing off until the deadline."""
STATUS_LOG_S = 15.0
"""Seconds between a transfer's status lines (people should never wait 30 s in silence)."""


@dataclass(frozen=True)
class Progress:
    """Progress of one transfer, passed to progress callbacks."""

    version: int
    shards_done: int
    shards_total: int
    bytes_done: int
    bytes_total: int
    bytes_per_s: float
    elapsed_s: float


ProgressCallback = Callable[[Progress], None]


def server_states(pool: ServerPool, tracker: VersionTracker, now: float) -> list[str]:
    """One ``"<url>: <state>"`` per server, in the pool's order."""
    lines = []
    for url, state in pool.states.items():
        status = tracker.status.get(url)
        if state.dropped:
            what = f"dropped ({state.last_error})"
        elif not state.alive(now):
            what = f"unreachable, next try in {state.dead_until - now:.0f} s ({state.last_error})"
        elif status is None or status.state == "absent":
            what = f"does not list v{tracker.manifest.version}"
        elif status.state == "partial":
            what = "still mirroring this version"
        elif state.in_flight:
            what = f"{state.in_flight} requests in flight"
        else:
            what = "idle"
        lines.append(f"{url}: {what}")
    return lines


def status_line(
    progress: Progress, *, recent_bytes: int, window_s: float, silent_s: float, servers: list[str]
) -> str:
    """The periodic log line: progress, then (when no byte arrived) what the transfer waits for."""
    head = (
        f"v{progress.version}: {progress.shards_done}/{progress.shards_total} shards, "
        f"{progress.bytes_done / 1e6:.1f} of {progress.bytes_total / 1e6:.1f} MB"
    )
    if recent_bytes:
        return f"{head}, {recent_bytes / window_s / 1e6:.1f} MB/s over the last {window_s:.0f} s"
    return f"{head}; no data for {silent_s:.0f} s, waiting for: " + "; ".join(servers)


class ProgressBar:
    """A one-line progress bar on stderr (only on a terminal): percent, shards, MB/s, ETA."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()

    def __call__(self, progress: Progress) -> None:
        if not self.enabled:
            return
        fraction = progress.bytes_done / progress.bytes_total if progress.bytes_total else 1.0
        rate = progress.bytes_per_s
        eta = (progress.bytes_total - progress.bytes_done) / rate if rate > 0 else math.inf
        width = 30
        bar = "#" * int(fraction * width) + "-" * (width - int(fraction * width))
        sys.stderr.write(
            f"\rv{progress.version} [{bar}] {fraction * 100:5.1f}% {progress.shards_done}/{progress.shards_total} shards "
            f"{rate / 1e6:7.1f} MB/s ETA {eta:5.0f}s"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
