"""What a run's leases add up to, and how the book comes back after a restart.

``LeaseHistory`` is the state under ``LeaseBook`` (leases.py, which issues leases and takes their
answers): the leases kept one by one (``HeldLease``, keyed by ``(worker_id, batch_index)``), the
per-worker and per-address counts the lease rules read (issued, answered, expired, rejected, open;
``lease_rules.py``), the fold of settled leases into the store's totals, and the replay of the
lease events after a restart (``load``, then ``queue_expired_after_replay`` once the batches are
replayed). Split from the issuing side so that each reads on one screen: the counts and the fold
change together (a fold moves a lease's counts into the store's totals), the rules of who gets which
tasks do not touch them.

Cost: neither memory nor the store nor a restart's replay grows with history. Open leases are
counted per worker and per address as they open and close, and settled leases are folded every
``FOLD_EVERY`` into per-worker and per-address totals in the store (``RolloutStore.fold_leases``).
Settled: answered and judged accepted, or answered and returned (rejected, or expired unjudged) once
another lease took its tasks over. A lease that took over another's tasks folds only with or after
that one (a restart replays the link, which keeps the original from being handed out twice).
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, deque
from collections.abc import Callable

from prime_rl.api.protocol import LeaseDone, LeaseRecord, LeaseSwitch
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.store import LeaseTotals, RolloutStore

__all__ = ["FOLD_EVERY", "HeldLease", "LeaseHistory"]

FOLD_EVERY = 1024
"""Answered leases kept one by one (in memory and in the store) before they are folded into totals."""


class HeldLease:
    """One issued lease and what became of it (``answered`` by a batch, ``expired``, ``returned``
    after its batch was rejected, ``reissued``).

    ``record`` is parsed from the stored event when first read (a restart replays many leases and
    reads few records); ``worker_id``, ``batch_index``, ``deadline`` and ``address`` are at hand.
    """

    __slots__ = (
        "_body", "_record", "address", "answered", "batch_index", "deadline", "excused", "expired", "machine", "reissue",
        "reissued", "rejected", "returned", "worker_id",
    )  # fmt: skip

    def __init__(
        self,
        worker_id: str,
        batch_index: int,
        deadline: float,
        address: str = "",
        *,
        record: LeaseRecord | None = None,
        body: str | None = None,
    ) -> None:
        self.worker_id, self.batch_index, self.deadline, self.address = worker_id, batch_index, deadline, address
        self._record, self._body = record, body
        self.answered = self.expired = self.reissued = self.returned = False
        self.rejected = False  # its batch was rejected (counted in ``LeaseBook.rejected``)
        self.machine = False  # ... for reasons the machine may explain (``LeaseBook.machine_rejected``)
        self.excused = False  # closed without a charge: its answer never reached its client (``withdraw``)
        self.reissue = False  # it hands out an abandoned lease's tasks (``reissued``: its own were handed out)

    @classmethod
    def of(cls, record: LeaseRecord, address: str = "") -> HeldLease:
        return cls(record.worker_id, record.batch_index, record.deadline, address, record=record)

    @property
    def record(self) -> LeaseRecord:
        if self._record is None:
            assert self._body is not None
            self._record = LeaseRecord.model_validate(json.loads(self._body)["lease"])
            self._body = None
        return self._record

    @property
    def key(self) -> tuple[str, int]:
        return self.worker_id, self.batch_index

    def add_switch(self, switch: LeaseSwitch) -> None:
        """Record an in-flight switch on the lease (``LeaseRecord.switches``, oldest first)."""
        self._record = self.record.model_copy(update={"switches": [*self.record.switches, switch]})

    def declare_done(self, done: LeaseDone) -> None:
        """Record the worker's done declaration on the lease (``LeaseRecord.done``)."""
        self._record = self.record.model_copy(update={"done": done})

    @property
    def reassignable(self) -> bool:
        """Its tasks wait for another identity: expired unanswered, or returned; not yet reissued."""
        return not self.reissued and ((self.expired and not self.answered) or self.returned)

    @property
    def open(self) -> bool:
        """Neither answered nor expired: the worker may still answer it."""
        return not self.answered and not self.expired


class LeaseHistory:
    """The leases of a run kept one by one, their counts, their fold and their replay (see module
    docstring); ``LeaseBook`` (leases.py) adds the issuing and the answers."""

    EVENTS = frozenset({"lease", "lease_expired", "lease_switch", "lease_done"})
    """Store event kinds the book writes (and reads back in ``load``)."""

    def __init__(self, store: RolloutStore, metrics: MetricsWriter) -> None:
        self._store = store
        self._metrics = metrics
        self._leases: dict[tuple[str, int], HeldLease] = {}
        self._reassign_queue: deque[HeldLease] = deque()
        self._next_index: dict[str, int] = {}
        self._issued: Counter[str] = Counter()
        self._expired: Counter[str] = Counter()
        self._answered: Counter[str] = Counter()
        self._expired_at: Counter[str] = Counter()  # per client address
        self._answered_at: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()  # answered leases whose batch was rejected (never folded)
        self._rejected_at: Counter[str] = Counter()
        self._machine: Counter[str] = Counter()  # rejected leases the machine may explain (lease_rules.machine_caused)
        # Plain dicts, not Counters: Counter's __delitem__ is Python code, and a replay deletes often.
        self._open: dict[str, int] = {}  # open leases per worker (no zero entries)
        self._open_total = 0
        self._open_at: dict[str, dict[str, int]] = {}  # open leases per address, per worker
        self._deadlines: list[tuple[float, str, int]] = []  # heap of (deadline, worker_id, batch_index)
        self._answered_unfolded: dict[tuple[str, int], HeldLease] = {}  # settled, not yet folded (``_foldable``)
        self._sources: dict[tuple[str, int], tuple[str, int]] = {}  # reissue -> the lease it took over
        # Leases whose batch has reached the server and waits in line for the lock (the HTTP layer adds
        # and removes them): never expired meanwhile, so the server's slowness is not the worker's.
        self.answering: set[tuple[str, int]] = set()

    # ------------------------------------------------------------------ queries

    def get(self, worker_id: str, batch_index: int) -> HeldLease | None:
        return self._leases.get((worker_id, batch_index))

    def next_index(self, worker_id: str) -> int:
        """The batch index of ``worker_id``'s next fresh lease (0 for a worker never leased to)."""
        return self._next_index.get(worker_id, 0)

    def open_count(self, worker_id: str) -> int:
        """Unanswered, unexpired leases ``worker_id`` holds."""
        return self._open.get(worker_id, 0)

    def open_at(self, address: str, among: Callable[[str], bool] = lambda worker_id: True) -> int:
        """Unanswered, unexpired leases handed to client ``address`` to workers ``among`` admits."""
        return sum(count for worker_id, count in self._open_at.get(address, {}).items() if among(worker_id))

    def open_total(self) -> int:
        """Unanswered, unexpired leases of all workers."""
        return self._open_total

    def open_by_worker(self) -> dict[str, int]:
        """Open leases per worker holding any (read only: the book's own counts)."""
        return self._open

    def issued(self, worker_id: str) -> int:
        return self._issued[worker_id]

    def expired(self, worker_id: str) -> int:
        return self._expired[worker_id]

    def answered(self, worker_id: str) -> int:
        """Leases of ``worker_id`` a stored batch answers (late answers to expired leases included)."""
        return self._answered[worker_id]

    def expired_at(self, address: str) -> int:
        """Leases handed to client ``address`` that expired unanswered (any worker there)."""
        return self._expired_at[address]

    def answered_at(self, address: str) -> int:
        """Leases handed to client ``address`` that a stored batch answers."""
        return self._answered_at[address]

    def rejected(self, worker_id: str) -> int:
        """Leases of ``worker_id`` whose batch the validator rejected (not counting leases that had
        expired before: those count once, as ``expired``)."""
        return self._rejected[worker_id]

    def machine_rejected(self, worker_id: str) -> int:
        """Of ``rejected``, the leases whose rejection the machine may explain (``mark_judged(machine=True)``)."""
        return self._machine[worker_id]

    def rejected_at(self, address: str) -> int:
        """Leases handed to client ``address`` whose batch the validator rejected (as ``rejected``)."""
        return self._rejected_at[address]

    def unfolded_keys(self) -> list[tuple[str, int, int]]:
        """``(worker_id, batch_index, step)`` of the leases not answered yet as far as the book knows
        (after a restart: whose batches ``Ledger._load`` looks up; O(unfolded leases))."""
        return [(lease.worker_id, lease.batch_index, lease.record.step) for lease in self._leases.values() if not lease.answered]

    def awaiting_reassignment(self) -> int:
        """Expired unanswered (or returned) leases whose tasks no other lease has taken over yet."""
        return sum(1 for lease in self._reassign_queue if lease.reassignable)

    # ------------------------------------------------------------------ recovery

    def restore_totals(self) -> None:
        """Add the store's folded totals to the counters (the first step of ``load``)."""
        for worker_id, totals in self._store.lease_totals().items():
            self._issued[worker_id] += totals.issued
            self._answered[worker_id] += totals.answered
            self._expired[worker_id] += totals.expired
            self._rejected[worker_id] += totals.rejected
            self._machine[worker_id] += totals.machine
            self._next_index[worker_id] = max(self.next_index(worker_id), totals.next_index)
        for address, totals in self._store.address_totals().items():
            self._answered_at[address] += totals.answered
            self._expired_at[address] += totals.expired
            self._rejected_at[address] += totals.rejected

    def load(self) -> None:
        """Rebuild from the store after a restart: the folded totals, then the lease events in order
        (read as columns; a lease's record is parsed only when something reads it)."""
        self.restore_totals()
        for kind, worker_id, batch_index, deadline, address, reissues_worker, reissues_index, body in (
            self._store.lease_events()
        ):
            if kind == "lease":
                reissues = (reissues_worker, reissues_index) if reissues_worker is not None else None
                self._add(HeldLease(worker_id, batch_index, deadline, address, body=body), reissues)
            elif (lease := self._leases.get((worker_id, batch_index))) is None:
                continue
            elif kind == "lease_switch":
                lease.add_switch(LeaseSwitch.model_validate(json.loads(body)["switch"]))
            elif kind == "lease_done":
                lease.declare_done(LeaseDone.model_validate(json.loads(body)["done"]))
            else:
                self._mark_expired(lease, excused=bool(json.loads(body).get("excused")) if body else False)

    def queue_expired_after_replay(self) -> None:
        """Rebuild the reassignment queue and the deadline heap once every event and batch is
        replayed, and fold the answered leases."""
        for lease in sorted(self._leases.values(), key=lambda lease: lease.deadline):
            if lease.reassignable:
                self._reassign_queue.append(lease)
        self._deadlines = [(lease.deadline, lease.worker_id, lease.batch_index) for lease in self._leases.values() if lease.open]
        heapq.heapify(self._deadlines)
        self.fold()

    def _foldable(self, lease: HeldLease) -> None:
        """Queue ``lease`` for the next fold if nothing can change it any more: answered and judged
        accepted, or its tasks went back (rejected, or expired unjudged) and another lease took them
        over. A lease that took over another's tasks waits until that one folds (a restart replays
        the link, which keeps the original from being handed out twice)."""
        self._answered_unfolded[lease.key] = lease
        if len(self._answered_unfolded) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Fold the settled leases not folded yet (``_foldable``) into the store's totals, in one
        transaction, and forget them one by one (their counts stay in the counters)."""
        if not self._answered_unfolded:
            return
        folding = self._answered_unfolded
        # A reissue folds only with (or after) the lease whose tasks it took over.
        waiting = {
            key: lease for key, lease in folding.items()
            if lease.reissue and (source := self._sources.get(key)) is not None
            and source in self._leases and source not in folding
        }  # fmt: skip
        workers: dict[str, LeaseTotals] = {}
        addresses: dict[str, LeaseTotals] = {}
        for key, lease in folding.items():
            if key in waiting:
                continue
            # A withdrawn (excused) lease was never charged: not issued, not expired (``withdraw``).
            issued, answered = int(not lease.excused), int(lease.answered)
            expired, rejected, machine = int(lease.expired and not lease.excused), int(lease.rejected), int(lease.machine)
            old = workers.get(lease.worker_id, LeaseTotals())
            workers[lease.worker_id] = LeaseTotals(
                old.issued + issued, old.answered + answered, old.expired + expired,
                max(old.next_index, lease.batch_index + 1), old.rejected + rejected, old.machine + machine,
            )  # fmt: skip
            at = addresses.get(lease.address, LeaseTotals())
            addresses[lease.address] = LeaseTotals(
                answered=at.answered + answered, expired=at.expired + expired, rejected=at.rejected + rejected
            )
        keys = [key for key in folding if key not in waiting]
        if not keys:
            return
        self._store.fold_leases(keys, workers, addresses)
        for key in keys:
            del self._leases[key]
            self._sources.pop(key, None)
        self._answered_unfolded = waiting

    def _add(self, lease: HeldLease, reissues: tuple[str, int] | None) -> None:
        """Count a newly issued (or replayed) open lease; mark the lease it reissues."""
        worker_id = lease.worker_id
        self._leases[lease.key] = lease
        self._open[worker_id] = self._open.get(worker_id, 0) + 1
        self._open_total += 1
        at = self._open_at.setdefault(lease.address, {})
        at[worker_id] = at.get(worker_id, 0) + 1
        self._next_index[worker_id] = max(self._next_index.get(worker_id, 0), lease.batch_index + 1)
        self._issued[worker_id] += 1
        if reissues is not None:
            lease.reissue = True
            self._sources[lease.key] = reissues
            source = self._leases.get(reissues)
            if source is not None:
                source.reissued = True
                if source.returned:
                    self._foldable(source)  # its tasks are taken over: nothing changes it any more

    # ------------------------------------------------------------------ counting

    def _close(self, lease: HeldLease) -> None:
        """Uncount an open lease that is being answered or expired."""
        worker_id = lease.worker_id
        at = self._open_at[lease.address]
        if at[worker_id] == 1:
            del at[worker_id]
        else:
            at[worker_id] -= 1
        self._open_total -= 1
        if self._open[worker_id] == 1:
            del self._open[worker_id]
        else:
            self._open[worker_id] -= 1

    def _mark_expired(self, lease: HeldLease, *, excused: bool = False) -> None:
        """Close ``lease`` as expired; ``excused``: withdrawn, its answer never delivered (``withdraw``):
        no expiry counted, and not counted as issued either (it cannot pad a worker's ban share)."""
        if lease.open:
            self._close(lease)
        lease.expired = True
        if excused:
            lease.excused = True
            self._issued[lease.worker_id] -= 1
            return
        self._expired[lease.worker_id] += 1
        self._expired_at[lease.address] += 1
