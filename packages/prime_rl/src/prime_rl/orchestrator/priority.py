"""The orchestrator's one ledger thread, with trusted callers served first.

Every ledger call runs on one thread (the ledger is not thread-safe, and blocks on the store). With
``asyncio.Lock`` the validator's and trainer's calls queued behind every worker request that came
first: at 1,024 identities the validator posted 10 verdicts in 15 minutes (issue 44).
``LedgerThread`` keeps two first-come queues and takes, whenever a call ends, the oldest *trusted*
call if any, else the oldest untrusted one: a trusted call waits for at most the call that runs and
the trusted calls ahead of it, however many workers wait.

Why the queue lives on the thread, not in front of it on the event loop (a lock held across
``run_in_executor``, as before): a lock held that way is held until the event loop gets round to
the call's completion, and its next holder starts only when the loop wakes it. In a registration
storm one turn of the loop runs hundreds of request handlers (its lag reached 321-427 ms at 1,024
identities), so a registration, 0.2 ms of work, held the lock for up to 231-346 ms, and a trusted
call waited behind such calls all the same (``benchmarks/results/swarm_1024_phases.json``). Here the
thread takes the next call as soon as one ends: a trusted call's wait for it fell to at most 7.7 ms
in the same storm (``swarm.md``, "The ledger thread"). The loop's lag is still paid by each call's
own request, in reading it and writing its answer.

With one port the trusted roles share the event loop with the swarm: a trusted request is read,
and answered, there. That was the tail left at 1,024 identities when the orchestrator shares its
CPUs (``swarm.md``). The trusted listener (``orchestrator.trusted_port``, ``server.py``) reads them
on a thread and event loop of their own and hands their calls to this same thread, which depends on
no one event loop (each call's future is settled on its own loop). Workers cannot
starve each other through the priority: only admin-token calls and the server's own lease expiry
are trusted, and they are few (one validator, one trainer, one expiry tick a second).

A call whose request is cancelled while it waits is skipped; one that has started runs to its end
(its result is dropped), as a thread cannot be interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LedgerCall", "LedgerThread"]


@dataclass
class LedgerCall:
    """One call on the ledger thread: when it was queued, began and ended (``perf_counter``), and
    what it returned or raised (``result``)."""

    function: Callable[[], Any]
    future: asyncio.Future[None]
    queued: float = field(default_factory=time.perf_counter)
    began: float = 0.0
    ended: float = 0.0
    outcome: tuple[Any, BaseException | None] = (None, None)

    def result(self) -> Any:
        """What the function returned; what it raised is raised here, once.

        Raising lets the call go of the error first: the error's traceback holds the caller's frame,
        and that frame holds this call, so a call that kept it would make a reference cycle. Only
        the garbage collector frees a cycle. Every refusal (a 429 of backpressure, some hundreds a
        second under load) would then leave its ten frames, with their requests, for the next young
        collection to walk (``benchmarks/results/closed_loop.md``, run 19)."""
        value, error = self.outcome
        if error is None:
            return value
        self.outcome = (None, None)
        try:
            raise error
        finally:
            del error


class LedgerThread:
    """One thread running calls one at a time, trusted first, then first come (module docstring)."""

    def __init__(self, name: str = "ledger") -> None:
        self._ready = threading.Condition()
        self._queues: tuple[deque[LedgerCall], deque[LedgerCall]] = (deque(), deque())
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def waiting(self, *, trusted: bool) -> int:
        """Calls of that class waiting to run now."""
        with self._ready:
            return sum(not call.future.done() for call in self._queues[0 if trusted else 1])

    async def run(self, function: Callable[..., Any], *args: Any, trusted: bool) -> LedgerCall:
        """Run ``function(*args)`` on the thread (trusted calls ahead of every waiting untrusted one);
        the call once it ended (``LedgerCall.result``: what it returned or raised)."""
        call = LedgerCall(functools.partial(function, *args), asyncio.get_running_loop().create_future())
        with self._ready:
            if self._closed:
                raise RuntimeError("the ledger thread is closed")
            self._queues[0 if trusted else 1].append(call)
            self._ready.notify()
        await call.future
        return call

    def close(self) -> None:
        """The thread runs what is queued, then ends (the app stops)."""
        with self._ready:
            self._closed = True
            self._ready.notify()

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not any(self._queues) and not self._closed:
                    self._ready.wait()
                if not any(self._queues):
                    return
                call = (self._queues[0] or self._queues[1]).popleft()
            if call.future.done():  # cancelled while it waited: nobody reads its answer
                continue
            call.began = time.perf_counter()
            try:
                call.outcome = (call.function(), None)
            except BaseException as error:  # handed to the caller, raised there (``LedgerCall.result``)
                call.outcome = (None, error)
            call.ended = time.perf_counter()
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the app stopped): nobody waits
                call.future.get_loop().call_soon_threadsafe(_settle, call.future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():  # (cancelled while the call ran: its result is dropped)
        future.set_result(None)
