"""Where an in-flight worker finds its next version: downloaded here and committed by the orchestrator.

With ``workers.inflight_updates`` on, ``HFBackend.generate`` asks :class:`CommittedVersions` at
every proof-chunk boundary whether a newer version is ready, and switches to it there
(``docs/inflight.md``). Ready means both: the follower has the file on disk (downloads keep
overlapping generation, as between leases) and the orchestrator has committed that version
(shardcast may hold a version the trainer has not committed yet; a span of it would be refused as
from the future). The committed version is read from ``GET /status`` at most every ``poll_s``
seconds, so a boundary costs a dictionary lookup, not a request, while nothing newer is ready.

When a version is ready, the switch is announced first (``POST /leases/switch``, the commit-reveal
rule of ``docs/inflight.md`` section 4): the orchestrator records the first announcement per lease
and version and answers a nonce, and every token from the boundary on is sampled with
``span_seed(seed, nonce)``. A refusal (409: another chunk was announced for that version first,
e.g. by an earlier decode batch of the same lease; 422: beyond the speed cap) or an unreachable
orchestrator means no switch at this boundary: the lease goes on with the version it has, which is
always valid. A version refused with 409 for a lease is not announced again for it.

Episodes (``worker/episodes.py``) switch only at a model turn's start: :meth:`CommittedVersions.at_turn`
announces the turn index as ``chunk`` (the orchestrator reads it so in a multi-turn run).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from prime_rl.api.client import ClientRequestError, OrchestratorBusy, OrchestratorUnavailable
from prime_rl.api.spans import SPAN_ALIGN
from prime_rl.inference.contract import VersionSwitch

Announce = Callable[[int, int, int, int], int]
"""``announce(step, batch_index, policy_version, chunk) -> nonce``: ``POST /leases/switch`` for the
worker's lease ``(step, batch_index)`` (``OrchestratorClient.announce_switch``)."""

__all__ = ["CommittedVersions"]


class CommittedVersions:
    """A ``VersionSource`` (``inference.contract``) over a worker's follower and orchestrator.

    ``committed()``: the orchestrator's newest committed version (``GET /status``);
    ``newest_local()``: the newest version downloaded; ``path(version)``: its weights file;
    ``max_versions``: ``orchestrator.max_versions_per_sample``; ``announce``: see :data:`Announce`.
    Set ``lease`` to the ``(step, batch_index)`` being decoded before each lease (None: no switch).
    """

    def __init__(
        self,
        committed: Callable[[], int],
        newest_local: Callable[[], int],
        path: Callable[[int], Path],
        *,
        max_versions: int,
        poll_s: float,
        announce: Announce,
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
        self._announce = announce
        self.lease: tuple[int, int] | None = None
        self._refused: set[tuple[int, int, int]] = set()  # (step, batch_index, version) refused with 409
        self.announced: list[tuple[int, int, int, int]] = []  # (step, batch_index, version, chunk) accepted

    def committed(self) -> int:
        """The newest committed version known, asked again once ``poll_s`` has passed (an unreachable
        orchestrator leaves the last answer: it only delays a switch)."""
        now = self._clock()
        if now - self._polled >= self._poll_s:
            self._polled = now
            with contextlib.suppress(OrchestratorUnavailable, OrchestratorBusy, ClientRequestError):
                self._committed = max(self._committed, self._committed_now())
        return self._committed

    def at_turn(self, current: int, turn: int) -> VersionSwitch | None:
        """For an episode's model turn ``turn >= 1`` (``worker/episodes.py``): the newest downloaded,
        committed version if it is newer than ``current``, announced as the switch at the start of
        that turn (in a multi-turn run the orchestrator reads ``chunk`` as the model turn), with the
        answered nonce; None as for :meth:`newer`."""
        newest = min(self._newest_local(), self.committed())
        if newest <= current or self.lease is None or turn <= 0:
            return None
        return self._announced(newest, turn)

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        """The newest downloaded, committed version if it is newer than ``current``, with its file
        and the nonce the orchestrator answered to its announcement at ``boundary``; None if there
        is none or the announcement was refused (module docstring). No request unless a version is
        ready."""
        newest = min(self._newest_local(), self.committed())
        if newest <= current or self.lease is None or boundary % SPAN_ALIGN or boundary <= 0:
            return None
        return self._announced(newest, boundary // SPAN_ALIGN)

    def _announced(self, version: int, chunk: int) -> VersionSwitch | None:
        """Announce the switch to ``version`` at ``chunk`` for the lease; the switch with the answered
        nonce, or None (no file yet, or refused, or the orchestrator unreachable)."""
        assert self.lease is not None
        path = self._path(version)
        step, batch_index = self.lease
        if not path.is_file() or (step, batch_index, version) in self._refused:
            return None
        try:
            nonce = self._announce(step, batch_index, version, chunk)
        except ClientRequestError as error:
            if error.status == 409:
                self._refused.add((step, batch_index, version))
            return None
        except (OrchestratorUnavailable, OrchestratorBusy):
            return None
        self.announced.append((step, batch_index, version, chunk))
        return VersionSwitch(version, path, nonce)
