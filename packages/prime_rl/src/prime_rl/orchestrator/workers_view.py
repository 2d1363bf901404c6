"""``GET /workers``: a snapshot of the worker table, rebuilt at most every ``max_age_s``, served in
bounded pages without the ledger's lock.

The endpoint needs no token, so its cost must not grow with what anyone can create for free:

  - **Off the lock**: ``build_snapshot`` reads the ledger's records by reference (each container
    copied with one C-level ``list()``, atomic under the GIL), never under the ledger's lock, so
    a read never delays a worker's lease or a verdict. The counts it sees may be a request or two
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import WorkersResponse, WorkerStats, WorkerTotals
from prime_rl.orchestrator.ledger import Ledger

__all__ = ["PAGE_DEFAULT", "PAGE_MAX", "WorkersSnapshot", "WorkersView", "build_snapshot"]

PAGE_DEFAULT = 100
PAGE_MAX = 500
ORDERS = ("id", "accepted")


@dataclass(frozen=True)
class WorkersSnapshot:
    """The worker table at ``built_at`` (ledger clock seconds): one row of keyword arguments of
    ``WorkerStats`` per worker, in registration order, with the orders and filters precomputed."""

    built_at: float
    rows: tuple[dict[str, Any], ...]
    by_accepted: tuple[int, ...]
    banned: tuple[int, ...]
    totals: WorkerTotals

    def page(self, *, offset: int, limit: int, order: str, banned_only: bool) -> WorkersResponse:
        """Up to ``limit`` workers from ``offset`` of the chosen order (and filter)."""
        if banned_only:
            indices: tuple[int, ...] | range = self.banned
        elif order == "accepted":
            indices = self.by_accepted
        else:
            indices = range(len(self.rows))
        chosen = indices[offset : offset + limit]
        return WorkersResponse(
            workers=[WorkerStats(**self.rows[i]) for i in chosen],
            total=len(indices),
            offset=offset,
            totals=self.totals,
            as_of=self.built_at,
        )


def build_snapshot(ledger: Ledger) -> WorkersSnapshot:
    """The snapshot of ``ledger``'s worker table, read without its lock (module docstring).
    O(workers + batches)."""
    counts, reasons = ledger.batches.sample_counts()
    workers = ledger.workers.records()
    rows = []
    totals: Counter[str] = Counter()
    for w in workers:
        count = counts.get(w.worker_id, Counter())
        rows.append(
            {
                "worker_id": w.worker_id,
                "name": w.name,
                "banned": w.banned,
                "ban_reason": w.ban_reason,
                "registered_at": w.registered_at,
                "last_seen": w.last_seen,
                "leases_issued": ledger.leases.issued(w.worker_id),
                "leases_expired": ledger.leases.expired(w.worker_id),
                "batches_submitted": count["batches"],
                "samples_submitted": count["samples"],
                "samples_accepted": count["accepted"],
                "samples_rejected": count["rejected"],
                "samples_pending": count["pending"],
                "samples_expired": count["expired"],
                "malformed_requests": w.malformed,
                "rejected_reasons": dict(reasons.get(w.worker_id, Counter())),
                "retired": w.retired,
            }
        )
        totals["banned"] += w.banned
        totals["retired"] += w.retired
        totals["established"] += count["accepted"] > 0
        for key in ("accepted", "rejected", "pending"):
            totals[key] += count[key]
    by_accepted = sorted(range(len(rows)), key=lambda i: (-rows[i]["samples_accepted"], i))
    return WorkersSnapshot(
        built_at=ledger.clock(),
        rows=tuple(rows),
        by_accepted=tuple(by_accepted),
        banned=tuple(i for i, row in enumerate(rows) if row["banned"]),
        totals=WorkerTotals(
            registered=len(rows),
            active=len(rows) - sum(1 for row in rows if row["banned"] or row["retired"]),
            banned=totals["banned"],
            retired=totals["retired"],
            established=totals["established"],
            samples_accepted=totals["accepted"],
            samples_rejected=totals["rejected"],
            samples_pending=totals["pending"],
        ),
    )


class WorkersView:
    """The cached snapshot of one ledger, refreshed at most every ``max_age_s`` (0: on every read),
    one rebuild at a time, in a thread (never on the event loop, never under the ledger's lock).

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
                self._snapshot = await asyncio.to_thread(build_snapshot, self._ledger)
                self._built = started
                self.rebuilds += 1
            return self._snapshot

    async def page(self, query: dict[str, str]) -> WorkersResponse:
        """The page ``query`` asks for (``offset``, ``limit``, ``order``, ``banned``); ApiFailure 400
        for a bad one."""
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
        return snapshot.page(offset=offset, limit=limit, order=order, banned_only=banned == "true")
