"""The server writes the run's training record outside its lock (``record.py``).

A trainer's commit compacts the settled batches of a step into one record file: it reads their
payload files, builds a table and writes it, about as much work as the step's submissions. Run
inside the commit's ledger call (as a ``Ledger`` used directly does), every request waited for it
under the one lock: at 32-64 identities in a closed loop the commit's p50 was 270-360 ms, once a
step (``benchmarks/results/closed_loop.md``).

So the server's ledger only stamps at a commit (``BatchBook.defer_records``), and ``RecordWriter``
writes the record after the commit has been answered, in three phases (``record.py``):

  1. ``plan_step`` under the lock (store reads of the step's settled rows: they no longer change);
  2. ``write_step`` in a thread, without the lock (payload files in, the record file out, atomic);
  3. ``settle_step`` under the lock (one transaction); once it is durable (the group commit), the
     payload files it replaced are deleted.

Crash safety is ``compact_step``'s: a crash before phase 3 leaves the rows and payload files as
they were (the next commit redoes the step, same file name); after it, the store's open deletes the
payload files left behind (``record.finish``). One writer runs at a time; a commit while it runs
asks it for one more round. A failure is logged (metrics ``record_failed``) and the next commit
tries again, as before. Until a step's record is written, its batches are read from their rows and
payload files, as before any compaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from prime_rl.orchestrator.delivery import LedgerCalls
from prime_rl.orchestrator.record import RecordFile, StepPlan, due_steps, plan_step, settle_step, write_step
from prime_rl.orchestrator.store import StoreError

__all__ = ["RecordWriter"]

log = logging.getLogger(__name__)


class RecordWriter:
    """Writes the record of committed steps after each commit, outside the ledger's lock (module
    docstring). Its rounds run on one event loop: the first one it is used on, or the one ``bind``
    names (the server's); a commit answered on another (the trusted listener's) hands it there."""

    def __init__(self, calls: LedgerCalls) -> None:
        self._calls = calls
        self._ledger = calls.ledger
        self._ledger.batches.defer_records()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the rounds on ``loop`` (the server's, at its start)."""
        self._loop = loop

    def after_commit(self) -> None:
        """A commit was answered: write what is due (now, or after the round running)."""
        running = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = running
        if running is not self._loop:
            with contextlib.suppress(RuntimeError):  # its loop closed (the server stops): the next commit redoes it
                self._loop.call_soon_threadsafe(self.after_commit)
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = running.create_task(self._rounds())

    async def idle(self) -> None:
        """Wait for the writer to finish what it has started (the app stops)."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)

    def close(self) -> None:
        """Stop a round still running after ``idle`` gave up on it (the app stops): what it half did
        is redone at the next commit (module docstring)."""
        if self._task is not None:
            self._task.cancel()

    async def _rounds(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            try:
                await self._round()
            except (StoreError, OSError) as error:
                log.warning("the record could not be written (the next commit tries again): %s", error)
                self._ledger.metrics.log("record_failed", step=self._ledger.batches.records_upto, error=str(error))
                return

    async def _round(self) -> None:
        loop, store = asyncio.get_running_loop(), self._ledger.store
        for plan in await self._calls.call(self.plan_records):
            record = await loop.run_in_executor(None, write_step, store, plan)
            files: list[Path] = await self._calls.call(self.settle_record, plan, record)  # answered once durable
            await loop.run_in_executor(None, store.payloads.delete, files)

    def plan_records(self) -> list[StepPlan]:
        """Under the lock: the plans of the ``record.due_steps`` of the last commit, oldest first."""
        store, keep = self._ledger.store, self._ledger.config.orchestrator.keep_claimed_logprobs
        plans = [plan_step(store, step, keep) for step in due_steps(store, self._ledger.batches.records_upto)]
        return [plan for plan in plans if plan is not None]

    def settle_record(self, plan: StepPlan, record: RecordFile) -> list[Path]:
        """Under the lock: ``record.settle_step``, and the metrics event ``record``."""
        files = settle_step(self._ledger.store, plan, record)
        record.log(self._ledger.metrics)
        return files
