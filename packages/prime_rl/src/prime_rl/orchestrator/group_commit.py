"""Group commit: one fsync acknowledges many requests, and none is taken under the server's lock.

The server (``server.py``) runs each ledger call under one ``asyncio.Lock``. Were every store
write fsynced inside that call (``synchronous=FULL``), every request would wait behind the other
requests' fsyncs, and a core would sit idle for most of each cycle (issue #44; the closed loop's
rate and the core's load: ``benchmarks/results/soak.md``). Instead the store commits without an fsync
(``StateDB.defer_sync``) and a request, after its call has released the lock, waits in
``GroupCommit.durable`` until an fsync of the write-ahead log that began after its commit has
finished; only then is it answered. One fsync runs at a time, in a thread; while it runs, other
requests commit and queue for the next one, so one fsync covers every commit made during the
previous one.

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
from concurrent.futures import ThreadPoolExecutor

from prime_rl.orchestrator.store import StoreError
from prime_rl.statedb import StateDB, StateDBError

__all__ = ["GroupCommit"]


class GroupCommit:
    """Durability for the commits of one ``StateDB`` (see module docstring)."""

    def __init__(self, db: StateDB) -> None:
        self._db = db
        self.synced = db.commits  # commits known durable
        self._running: asyncio.Task[None] | None = None
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
            if self._running is None:
                self._running = asyncio.get_running_loop().create_task(self._sync())
            await asyncio.shield(self._running)

    async def _sync(self) -> None:
        covered = self._db.commits  # everything committed before the fsync starts
        try:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._db.sync)
        except StateDBError as error:
            self._failed = error
        else:
            self.synced = max(self.synced, covered)
        finally:
            self._running = None
