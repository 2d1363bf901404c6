"""``GET /workers``: a snapshot of the worker table, rebuilt at most every ``max_age_s``, served in
bounded pages without the ledger's lock.

The endpoint needs no token, so its cost must not grow with what anyone can create for free:

  - **Off the lock**: ``build_steps`` reads the ledger's records by reference (each container
    copied with one C-level ``list()``, atomic under the GIL), never under the ledger's lock, in
    steps of ``CHUNK`` records between which the event loop serves other requests, so a read
    never delays a worker's lease or a verdict by more than a step (about 1 ms). The counts it sees may be a request or two
    behind the ledger; the view is informational (the trusted endpoints read the ledger itself).
  - **Rebuilt at most every** ``orchestrator.workers_view_max_age_s`` (1 s): between rebuilds every
    reader shares one snapshot, so N anonymous clients cost one rebuild per period, not N.
  - **Bounded answers**: a page of at most ``PAGE_MAX`` workers (``?offset=&limit=``, default
    ``PAGE_DEFAULT``), in registration order or by accepted samples (``?order=accepted``), or only
    banned ones (``?banned=true``), with the table's ``totals`` and how many workers matched.
    Serving a page builds only that page's ``WorkerStats``: O(limit), whatever the table's size.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import WorkersResponse, WorkerStats, WorkerTotals
from prime_rl.orchestrator.ledger import Ledger

__all__ = ["PAGE_DEFAULT", "PAGE_MAX", "WorkersSnapshot", "WorkersView", "build_snapshot", "build_steps"]

PAGE_DEFAULT = 100
PAGE_MAX = 200
ORDERS = ("id", "accepted")


FIELDS = tuple(WorkerStats.model_fields)
"""The ``WorkerStats`` fields, in the order of a snapshot row."""
BANNED, RETIRED, REASONS = (FIELDS.index(name) for name in ("banned", "retired", "rejected_reasons"))

PAGES_CACHED = 64
"""Serialized pages kept per snapshot (identical reads between rebuilds cost a dictionary lookup)."""


@dataclass(frozen=True)
class WorkersSnapshot:
    """The worker table at ``built_at`` (ledger clock seconds): one row (``FIELDS`` values, the
    rejection reasons as ``(reason, count)`` pairs) per worker, in registration order, with the
    orders and filters precomputed."""

    built_at: float
    rows: tuple[tuple[Any, ...], ...]
    by_accepted: tuple[int, ...]
    banned: tuple[int, ...]
    totals: WorkerTotals
    pages: dict[tuple[int, int, str, bool], bytes] = field(default_factory=dict, compare=False)

    def page(self, *, offset: int, limit: int, order: str, banned_only: bool) -> WorkersResponse:
        """Up to ``limit`` workers from ``offset`` of the chosen order (and filter)."""
        if banned_only:
            indices: tuple[int, ...] | range = self.banned
        elif order == "accepted":
            indices = self.by_accepted
        else:
            indices = range(len(self.rows))
        return WorkersResponse(
            workers=[_stats(self.rows[i]) for i in indices[offset:][:limit]],
            total=len(indices),
            offset=offset,
            totals=self.totals,
            as_of=self.built_at,
        )

    def page_json(self, *, offset: int, limit: int, order: str, banned_only: bool) -> bytes:
        """``page`` serialized, cached (at most ``PAGES_CACHED`` pages per snapshot)."""
        key = (offset, limit, order, banned_only)
        cached = self.pages.get(key)
        if cached is None:
            cached = self.page(offset=offset, limit=limit, order=order, banned_only=banned_only).model_dump_json().encode()
            if len(self.pages) < PAGES_CACHED:
                self.pages[key] = cached
        return cached


def _stats(row: tuple[Any, ...]) -> WorkerStats:
    fields = dict(zip(FIELDS, row, strict=True))
    fields["rejected_reasons"] = dict(row[REASONS])
    return WorkerStats(**fields)


CHUNK = 256
"""Workers or batches per step of a rebuild: the event loop serves other requests between steps."""


def build_steps(ledger: Ledger) -> Generator[None, None, WorkersSnapshot]:
    """Build the snapshot of ``ledger``'s worker table in steps of ``CHUNK`` batches or workers
    (each yield lets the event loop answer other requests; about 1 ms a step), reading the ledger
    without its lock (module docstring); returns the snapshot. O(workers) in all (the sample counts are running counters). Plain
    tuples and ints: a ``Counter`` per worker cost 30 us each, 0.3 s at 10k workers. A row holds
    only strings, numbers and tuples of them (its rejection reasons as ``(reason, count)`` pairs,
    not a dict), so the garbage collector stops tracking it after one pass instead of walking
    every row in each full collection while it holds the GIL."""
    counts, reasons = ledger.batches.sample_counts()  # running counters: O(workers), never O(batches)
    yield
    issued, expired = ledger.leases.issued, ledger.leases.expired
    none: Counter[str] = Counter()
    rows: list[tuple[Any, ...]] = []
    accepted_of: list[int] = []
    banned = retired = established = accepted = rejected = pending = submitted = expired_samples = 0
    for position, w in enumerate(ledger.workers.records()):
        if position and position % CHUNK == 0:
            yield
        count = counts.get(w.worker_id, none)
        row_accepted, row_rejected, row_pending = count["accepted"], count["rejected"], count["pending"]
        rows.append(
            (
                w.worker_id, w.name, w.banned, w.ban_reason, w.registered_at, w.last_seen,
                issued(w.worker_id), expired(w.worker_id), count["batches"], count["samples"],
                row_accepted, row_rejected, row_pending, count["expired"], w.malformed,
                tuple(reasons.get(w.worker_id, none).items()), w.retired,
            )
        )  # fmt: skip
        banned += w.banned
        retired += w.retired
        established += row_accepted > 0
        accepted_of.append(row_accepted)
        accepted, rejected, pending = accepted + row_accepted, rejected + row_rejected, pending + row_pending
        if not w.banned:  # expired share of the work of identities not banned (issue 45, item 5)
            submitted, expired_samples = submitted + count["samples"], expired_samples + count["expired"]
    yield
    by_accepted = sorted(range(len(rows)), key=lambda i: -accepted_of[i])
    return WorkersSnapshot(
        built_at=ledger.clock(),
        rows=tuple(rows),
        by_accepted=tuple(by_accepted),
        banned=tuple(i for i, row in enumerate(rows) if row[BANNED]),
        totals=WorkerTotals(
            registered=len(rows),
            active=len(rows) - sum(1 for row in rows if row[BANNED] or row[RETIRED]),
            banned=banned,
            retired=retired,
            established=established,
            samples_accepted=accepted,
            samples_rejected=rejected,
            samples_pending=pending,
            samples_submitted=submitted,
            samples_expired=expired_samples,
            expired_share=round(expired_samples / submitted, 4) if submitted else 0.0,
        ),
    )


def build_snapshot(ledger: Ledger) -> WorkersSnapshot:
    """``build_steps`` run to the end at once."""
    steps = build_steps(ledger)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class WorkersView:
    """The cached snapshot of one ledger, refreshed at most every ``max_age_s`` (0: on every read),
    one rebuild at a time, in steps on the event loop (``build_steps``: never more than a step
    between other requests, never under the ledger's lock, no thread fighting the event loop
    for the GIL).

    ``monotonic``: the clock of the snapshot's age (tests step it).
    """

    def __init__(
        self, ledger: Ledger, max_age_s: float, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._ledger = ledger
        self.max_age_s = max_age_s
        self._monotonic = monotonic
        self._snapshot: WorkersSnapshot | None = None
        self._built = -float("inf")
        self._refreshing = asyncio.Lock()
        self.rebuilds = 0

    async def snapshot(self) -> WorkersSnapshot:
        """The cached snapshot, rebuilt first when older than ``max_age_s``; while another request
        rebuilds it, the previous one (if any) is served rather than waiting."""
        if self._snapshot is not None and self._monotonic() - self._built < self.max_age_s:
            return self._snapshot
        if self._refreshing.locked() and self._snapshot is not None:
            return self._snapshot
        async with self._refreshing:
            if self._snapshot is None or self._monotonic() - self._built >= self.max_age_s:
                started = self._monotonic()
                steps = build_steps(self._ledger)
                while True:
                    try:
                        next(steps)
                    except StopIteration as done:
                        self._snapshot = done.value
                        break
                    await asyncio.sleep(0)
                self._built = started
                self.rebuilds += 1
            return self._snapshot

    async def page(self, query: dict[str, str]) -> bytes:
        """The page ``query`` asks for (``offset``, ``limit``, ``order``, ``banned``), as the JSON body
        of a ``WorkersResponse``; ApiFailure 400 for a bad one."""
        try:
            offset = int(query.get("offset", "0"))
            limit = int(query.get("limit", str(PAGE_DEFAULT)))
        except ValueError:
            raise ApiFailure(400, "bad_request", "offset and limit must be integers") from None
        order, banned = query.get("order", "id"), query.get("banned", "false")
        if offset < 0 or not 1 <= limit <= PAGE_MAX:
            raise ApiFailure(400, "bad_request", f"need offset >= 0 and limit in 1..{PAGE_MAX}")
        if order not in ORDERS or banned not in ("true", "false"):
            raise ApiFailure(400, "bad_request", f"order must be one of {ORDERS} and banned true or false")
        snapshot = await self.snapshot()
        return snapshot.page_json(offset=offset, limit=limit, order=order, banned_only=banned == "true")
