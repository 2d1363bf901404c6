"""The orchestrator's one lock, with trusted callers served first.

Every ledger call runs under one lock (the ledger is not thread-safe). With ``asyncio.Lock`` the
validator's and trainer's calls queued behind every worker request that came first: at 1,024
identities the validator posted 10 verdicts in 15 minutes (issue 44). ``PriorityLock`` keeps two
first-come queues and hands the lock, when it is released, to the oldest *trusted* waiter if any,
else to the oldest untrusted one: a trusted call waits for at most the call that holds the lock
and the trusted calls ahead of it, however many workers wait.

Why a priority in front of the one lock rather than a separate listener: the ledger must still see
one call at a time, so a second listener would end at the same lock and need the same priority;
and a trusted role is already told apart by its admin token on the same port. Workers cannot
starve each other through it either: only admin-token calls and the server's own lease expiry are
trusted, and they are few (one validator, one trainer, one expiry tick a second).

Not thread-safe: used from the event loop's thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

__all__ = ["PriorityLock"]


class PriorityLock:
    """An asyncio lock whose waiters are served trusted first, then first come (module docstring)."""

    def __init__(self) -> None:
        self._held = False
        self._waiters: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())

    def locked(self) -> bool:
        return self._held

    def waiting(self, *, trusted: bool) -> int:
        """Callers of that class waiting for the lock now."""
        return sum(not future.done() for future in self._waiters[0 if trusted else 1])

    @contextlib.asynccontextmanager
    async def hold(self, *, trusted: bool) -> AsyncIterator[None]:
        await self.acquire(trusted=trusted)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, *, trusted: bool) -> None:
        if not self._held and not any(self._waiters):
            self._held = True
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiters[0 if trusted else 1]
        queue.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed the lock as it was cancelled: pass it on
                self.release()
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(future)
            raise

    def release(self) -> None:
        """Hand the lock to the next waiter (trusted first), or free it. O(1) per waiter served."""
        if not self._held:
            raise RuntimeError("PriorityLock released while not held")
        for queue in self._waiters:
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)  # it holds the lock now: ``_held`` stays True
                    return
        self._held = False
