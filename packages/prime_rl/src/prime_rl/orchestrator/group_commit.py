"""Group commit: one fsync acknowledges many requests, and none is taken on the ledger's thread.

The server runs every ledger call, one at a time, on one thread (``priority.py``). Were every store
write fsynced inside that call (``synchronous=FULL``), every request would wait behind the other
requests' fsyncs, and a core would sit idle for most of each cycle (issue #44; the closed loop's
rate and the core's load: ``benchmarks/results/soak.md``). Instead the store commits without an fsync
(``StateDB.defer_sync``) and a request, once its call has ended, waits in
``GroupCommit.durable`` until an fsync of the write-ahead log that began after its commit has
finished; only then is it answered. One fsync runs at a time, in a thread; while it runs, other
requests commit and queue for the next one, so one fsync covers every commit made during the
previous one. Requests served by the trusted listener (``server.py``, its own event loop) wait for the
same fsyncs.

What a client was told succeeded is on disk, as before: a reply is sent only after the fsync that
covers the request's commit. A crash loses only transactions nobody was answered for; those may
or may not be on disk after the crash (the OS may have written the log pages on its own), which
is the state of a request that failed mid-flight, and every request is safe to retry (the API's
idempotency rules). Batch payloads are written and fsynced before their commit, outside the lock
(``RolloutStore.write_payload``), so a committed batch row never refers to a file that is not on
disk. An fsync that fails is fatal for the store: every later request fails with it (as a
``StoreError``), since memory may be ahead of the disk.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from prime_rl.orchestrator.store import StoreError
from prime_rl.statedb import StateDB, StateDBError

__all__ = ["GroupCommit"]


class GroupCommit:
    """Durability for the commits of one ``StateDB`` (see module docstring). ``durable`` may be
    awaited on any event loop (the server's, the trusted listener's): the fsync running is a thread's
    future, which every loop's waiters share."""

    def __init__(self, db: StateDB) -> None:
        self._db = db
        self.synced = db.commits  # commits known durable
        self._guard = threading.Lock()  # one fsync at a time, whichever loop asks
        self._running: Future[None] | None = None
        self._failed: BaseException | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="fsync")  # never queued behind other work
        db.defer_sync()

    def close(self) -> None:
        """Let the fsync thread go (the server stops)."""
        self._thread.shutdown(wait=False)

    async def durable(self) -> None:
        """Return once every commit made before this call is on disk."""
        target = self._db.commits
        while self.synced < target:
            if self._failed is not None:
                raise StoreError(f"the store could not be synced: {self._failed}") from self._failed
            with self._guard:
                if self._running is None or self._running.done():
                    self._running = self._thread.submit(self._sync)
                running = self._running
            # shielded: a waiter cancelled (its client gone) must not cancel the fsync the others wait on
            await asyncio.shield(asyncio.wrap_future(running))

    def _sync(self) -> None:
        covered = self._db.commits  # everything committed before the fsync starts
        try:
            self._db.sync()
        except StateDBError as error:
            self._failed = error
        else:
            with self._guard:
                self.synced = max(self.synced, covered)
