"""Where an in-flight worker finds its next version: downloaded here and committed by the orchestrator.

With ``workers.inflight_updates`` on, ``HFBackend.generate`` asks :class:`CommittedVersions` at
every proof-chunk boundary whether a newer version is ready, and switches to it there
(``docs/inflight.md``). Ready means both: the follower has the file on disk (downloads keep
overlapping generation, as between leases) and the orchestrator has committed that version
(shardcast may hold a version the trainer has not committed yet; a span of it would be refused as
from the future). The committed version is read from ``GET /status`` at most every ``poll_s``
seconds, so a boundary costs a dictionary lookup, not a request.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from prime_rl.api.client import ClientRequestError, OrchestratorBusy, OrchestratorUnavailable
from prime_rl.inference.contract import VersionSwitch

__all__ = ["CommittedVersions"]


class CommittedVersions:
    """A ``VersionSource`` (``inference.contract``) over a worker's follower and orchestrator.

    ``committed()``: the orchestrator's newest committed version (``GET /status``);
    ``newest_local()``: the newest version downloaded; ``path(version)``: its weights file;
    ``max_versions``: ``orchestrator.max_versions_per_sample``.
    """

    def __init__(
        self,
        committed: Callable[[], int],
        newest_local: Callable[[], int],
        path: Callable[[int], Path],
        *,
        max_versions: int,
        poll_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._committed_now = committed
        self._newest_local = newest_local
        self._path = path
        self.max_versions = max_versions
        self._poll_s = poll_s
        self._clock = clock
        self._committed = -1
        self._polled = -float("inf")

    def committed(self) -> int:
        """The newest committed version known, asked again once ``poll_s`` has passed (an unreachable
        orchestrator leaves the last answer: it only delays a switch)."""
        now = self._clock()
        if now - self._polled >= self._poll_s:
            self._polled = now
            with contextlib.suppress(OrchestratorUnavailable, OrchestratorBusy, ClientRequestError):
                self._committed = max(self._committed, self._committed_now())
        return self._committed

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        """The newest downloaded, committed version if it is newer than ``current``, with its file
        (no announcement yet: the sample seeds stay, ``nonce`` None)."""
        newest = min(self._newest_local(), self.committed())
        if newest <= current:
            return None
        path = self._path(newest)
        return VersionSwitch(newest, path) if path.is_file() else None
