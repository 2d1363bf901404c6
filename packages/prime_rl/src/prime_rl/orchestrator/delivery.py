"""How a request's ledger call runs and is answered: on the one ledger thread, durable before it is
answered, and a lease handed over only to a client that is still there (issue 44, item 5).

A request queues its ledger call for the ledger's one thread (``priority.py``: trusted calls
first; the ledger is not thread-safe, and blocks on the store), then waits until its store writes
are durable (``group_commit.py``: one fsync covers many requests) and only then is answered. On a
slow server a client may give up (its timeout) at any point of that, the durability wait included.

A lease the client never received is never held against it. ``GET /tasks`` checks the request's
connection three times: before the lease (a client that gave up waiting in line is granted
nothing), on the ledger thread right after the grant, and, last, after the durability wait, just
before the answer is written. A lease granted by this request to a client found gone at either
later check is withdrawn (``LeaseBook.withdraw``): durably, before the 408 ``client_gone`` that nobody
reads, not counted as issued or abandoned, its tasks at once for another identity. From the last
check to aiohttp's write of the answer the event loop runs nothing else (no await yields), so a
lease that passes it had its answer written to an open connection: it is delivered. A client that
still lost it (in flight as it closed) asks again with ``resume`` and gets that lease back. From
its grant until it is delivered or withdrawn, the expiry tick passes the lease over
(``LeaseBook.answering``, as for a batch waiting in line): a durability wait or a withdrawal in
line that outlasts ``task_timeout_s`` cannot make it expire as abandoned first.

Only a lease this very request granted is withdrawn. One handed out again (``resume``, or a re-ask
by ``batch_index``) was written to an open connection before, so its tasks may be known: were it
withdrawn when the re-asking client closes, a worker could walk away from any lease it has seen,
free of the abandonment charge, by asking for it again and hanging up. It stays open; the next
``resume`` hands it back.

The other calls that wait for durability before they answer (``POST /rollouts``, ``/leases/switch``,
``/leases/done``) record what the client asked for, and an identical retry answers the same (a
stored batch ``duplicate``, its lease answered; a recorded switch its nonce; a done declaration
itself), whether the lease is still open or not: an answer lost in the durability wait costs the
worker nothing, its retry gets it (``tests/test_graceful_overload.py``).

Trusted calls wait behind no untrusted work the server controls: the ledger thread takes them
first, and the group commit's fsync runs on a thread of its own (not in asyncio's shared pool,
which the swarm's payload writes and admission hooks can fill), and where each trusted call spent
its time (the wait for the ledger thread, still called ``lock``; the ledger call; durability) is
logged per 10 s window (metrics event ``trusted_phases``), with what it may have waited behind:
each untrusted call's time on the ledger thread (``held``), the event loop's lag and
garbage-collection pauses (``server.py``). With one port they share with the swarm the event loop
that reads every request: at 1,024 identities sharing two cores their p99 reached 170-921 ms. With
the trusted listener (``orchestrator.trusted_port``: their own thread and event loop) it was
49-117 ms in the same hour, under 100 ms in 2 of 3 runs (``benchmarks/results/swarm.md``,
"The trusted listener").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from prime_rl.api.protocol import TaskLease
from prime_rl.metrics import CallTimes
from prime_rl.orchestrator.group_commit import GroupCommit
from prime_rl.orchestrator.http import bearer, client_gone, in_line, refuse_if_gone
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.priority import LedgerThread
from prime_rl.orchestrator.rate_limit import client_key

__all__ = ["LeaseAsk", "LedgerCalls"]


@dataclass(frozen=True)
class LeaseAsk:
    """The query of one ``GET /tasks`` (parsed and checked by the handler)."""

    worker_id: str
    step: int | None
    batch_index: int | None
    version: int | None
    resume: bool


def _call_name(function: Callable[..., Any]) -> str:
    """What a ledger call is called in ``trusted_phases``: a method's name, or the name of the handler
    a local function was made in (``ApiHandlers.submit.<locals>.work``: ``submit``)."""
    qualname = getattr(function, "__qualname__", "call")
    return qualname.rsplit(".<locals>", 1)[0].rsplit(".", 1)[-1]


class LedgerCalls:
    """The ledger's thread, its group commit, and the leases whose answer is in line (module docstring)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        # One thread runs every ledger call, trusted ones first (priority.py). Not asyncio's shared
        # pool: there a trusted call could wait for a free thread behind untrusted work that runs
        # beside the ledger (payload writes, admission hooks).
        self.thread = LedgerThread()
        self.group_commit = GroupCommit(ledger.store.db)
        self.in_line: dict[Hashable, int] = {}  # requests in line per lease (``LeaseBook.answering``)
        self.trusted_phases = CallTimes("trusted_phases")  # metrics event: where trusted calls wait

    def close(self) -> None:
        """Let the ledger's and the group commit's threads go (the app stops)."""
        self.thread.close()
        self.group_commit.close()

    async def call(self, function: Callable[..., Any], *args: Any, trusted: bool = False, durable: bool = True) -> Any:
        """Run ``function(*args)`` on the ledger thread, then wait until its store writes are durable
        (``group_commit.py``): only then may the caller answer. ``trusted`` calls (admin token, the
        server's own expiry) run before any waiting worker request (``priority.py``). Where each
        call spent its time is recorded (``trusted_phases``): a trusted call's wait for the thread
        (``lock``), its run and its durability wait, so that a slow trusted answer can be told apart
        from a busy event loop (the rest of what its client measures); an untrusted call's run
        (``held``): how long a trusted call that comes in meanwhile waits behind it. ``durable``
        False: the caller waits for durability itself (``lease``), after what it does in between."""
        name, phases = _call_name(function), self.trusted_phases
        try:
            call = await self.thread.run(function, *args, trusted=trusted)
            if trusted:
                phases.record("lock", name, 200, call.began - call.queued)
                phases.record("run", name, 200, call.ended - call.began)
            else:
                phases.record("held", name, 200, call.ended - call.began)
            return call.result()
        finally:
            synced = time.perf_counter()
            if durable:
                await self.group_commit.durable()
            if trusted:
                phases.record("durable", name, 200, time.perf_counter() - synced)

    def waiting(self, key: Hashable) -> Any:
        """A context in which the lease ``key`` does not expire: a request answering it is in line."""
        return in_line(self.in_line, self.ledger.leases.answering, key)

    async def lease(self, request: web.Request, ask: LeaseAsk) -> TaskLease:
        """``GET /tasks``: the lease to answer with, durable, for a client still there at the last
        moment; else ApiFailure 408 ``client_gone`` with a lease this request granted withdrawn."""
        ledger, worker_id = self.ledger, ask.worker_id

        def grant() -> tuple[TaskLease, bool]:
            refuse_if_gone(request)
            worker = ledger.authenticate(worker_id, bearer(request))
            fresh_from = ledger.leases.next_index(worker_id)
            lease = ledger.lease(
                worker, ask.step, ask.batch_index, client_key(request.remote), ask.version, resume=ask.resume
            )
            fresh = lease.batch_index >= fresh_from  # granted now, not handed out again
            if fresh and client_gone(request):
                ledger.leases.withdraw(worker_id, lease.batch_index, ledger.clock())
                refuse_if_gone(request)
            return lease, fresh

        with contextlib.ExitStack() as undelivered:
            try:
                lease, fresh = await self.call(grant, durable=False)
                if fresh:  # from here on no expiry tick expires it (before: granted now, its deadline is ahead)
                    undelivered.enter_context(self.waiting((worker_id, lease.batch_index)))
            finally:
                await self.group_commit.durable()
            if fresh and client_gone(request):  # it left during the durability wait: nobody reads the answer
                await self.call(self._withdraw, worker_id, lease.batch_index)
                refuse_if_gone(request)
        return lease  # no await from the check above to aiohttp's write of the answer

    def _withdraw(self, worker_id: str, batch_index: int) -> None:
        self.ledger.leases.withdraw(worker_id, batch_index, self.ledger.clock())
