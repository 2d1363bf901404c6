"""Task leases: which tasks each worker was handed, until when, and reassignment of expired ones.

``LeaseBook`` owns the leases of a run (keyed by ``(worker_id, batch_index)``; answered ones folded
into counts, see Cost below), each worker's next batch index, and the queue of expired, unanswered
leases whose tasks the next lease of *another* worker takes over before any fresh task is handed
out. It writes the store events ``lease`` and ``lease_expired`` (durable write before the memory
change, like the rest of the ledger) and ``load`` reads them back after a restart.

Walking away changes nothing: an expired lease's tasks go to the next lease of a worker at
another client address if one asks, else of another worker at the same address, never to the
worker whose lease just expired, and ahead of any fresh task. Answering wrongly changes nothing
either: a lease whose batch the validator rejects (any reason: a worker can cause every one of them
on purpose, a lowered claim, a program that loops past the sandbox's limit) hands its tasks on the
same way (``return_tasks``) and counts as abandoned, not answered (``rejected``). Answering late
changes nothing either: a lease whose batch expires unjudged, too old for any step (the lease fixes
its version), hands its tasks on too, without a charge (a slow validator may be the cause). So
every task the keyed assignment hands out is trained on someone's answer, whichever leases their
first holder chose to answer, spoil or delay, and the multiset of trained tasks is the multiset the
assignment drew.

A fresh lease's tasks and sampling seeds are the keyed functions of ``api/assignment.py`` of
``(worker_id, step, batch_index)`` under the run's assignment key, so the validator (which holds
the key) can recompute them and a worker cannot predict them; a reissued lease keeps the expired
lease's tasks and names where they came from (``reassigned_from``). Each lease remembers the
client address it was handed to, for the per-address cap on fresh identities' open leases, and
the book counts answered, expired and rejected leases per worker and per address (``lease_rules.py``).

The book refuses nothing; the API's lease rules (current step only, open-lease caps, bans for
abandoned leases, backpressure) are the ``Ledger``'s.

Cost: a lease costs the same however many leases were issued before it. Open leases are counted
per worker and per address as they open and close, expiry pops a deadline heap, and settled leases
are folded every ``FOLD_EVERY`` into per-worker and per-address totals in the store (answered,
expired and rejected counts; their events deleted, ``RolloutStore.fold_leases``), so neither memory
nor the store nor a restart's replay grows with history. Settled: answered and judged accepted, or
answered and returned (rejected, or expired unjudged) once another lease took its tasks over. A
lease that took over another's tasks folds only with or after that one (a restart replays the link,
which keeps the original from being handed out twice); who answered whose tasks stays in the
answering batch's ``LeaseRecord`` (``reassigned_from``). Kept one by one: open leases, leases whose
tasks still wait for another identity, and expired leases nobody answered (abandonment bans bound
how many there are). (Pitfall, fixed: the book once scanned every lease ever issued three times
per lease request, so a lease cost more the longer the run; lease cost over a run's history:
``benchmarks/results/orchestrator_capacity.md``.)
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from prime_rl.api.assignment import recorded_switch_nonce, sampling_seeds, task_ids
from prime_rl.api.protocol import LeaseDone, LeaseRecord, LeaseSource, LeaseSwitch, LeaseTask, TaskLease
from prime_rl.config import RunConfig
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.store import LeaseTotals, RolloutStore

__all__ = ["FOLD_EVERY", "HeldLease", "LeaseBook", "TaskPrompts"]

FOLD_EVERY = 1024
"""Answered leases kept one by one (in memory and in the store) before they are folded into totals."""


class TaskPrompts(Protocol):
    """What the ledger needs from a task set: its size and each task's prompt text
    (:class:`prime_rl.tasks.TaskSet` has both; a protocol, so nothing subclasses it)."""

    def __len__(self) -> int: ...

    def prompt(self, task_id: int) -> str: ...


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


class LeaseBook:
    """All leases of a run (see module docstring)."""

    EVENTS = frozenset({"lease", "lease_expired", "lease_switch", "lease_done"})
    """Store event kinds this book writes (and reads back in ``load``)."""

    def __init__(
        self, config: RunConfig, tasks: Any, store: RolloutStore, metrics: MetricsWriter, *, key: bytes
    ) -> None:
        self._config = config
        self._key = key
        self._tasks = tasks
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

    def open_leases(self, worker_id: str) -> list[HeldLease]:
        """``worker_id``'s unanswered, unexpired leases, oldest first. Scans back from its newest
        lease until all ``open_count`` are found: the cost is the distance to its oldest open lease
        (none when it holds none), not the history."""
        found: list[HeldLease] = []
        index = self.next_index(worker_id) - 1
        while len(found) < self.open_count(worker_id) and index >= 0:
            lease = self._leases.get((worker_id, index))
            if lease is not None and lease.open:
                found.append(lease)
            index -= 1
        return found[::-1]

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

    # ------------------------------------------------------------------ changes

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

    def withdraw(self, worker_id: str, batch_index: int, now: float) -> bool:
        """Close an open lease whose answer never reached its client (the server saw the client's
        connection closed before the answer was written: the server's slowness, not the worker's
        choice): durably (a ``lease_expired`` event marked ``excused``), no charge, and its tasks go
        to another identity at once. False when the lease is not open."""
        lease = self._leases.get((worker_id, batch_index))
        if lease is None or not lease.open:
            return False
        self._store.append_event(
            {"event": "lease_expired", "worker_id": worker_id, "batch_index": batch_index, "time": now, "excused": True}
        )
        self._mark_expired(lease, excused=True)
        self._reassign_queue.append(lease)
        self._metrics.log("lease_withdrawn", worker_id=worker_id, step=lease.record.step, batch_index=batch_index)
        return True

    def mark_answered(self, worker_id: str, batch_index: int) -> None:
        """A batch answering this lease is stored (no-op for a lease never issued or already answered,
        folded ones included)."""
        lease = self._leases.get((worker_id, batch_index))
        if lease is not None and not lease.answered:
            if lease.open:
                self._close(lease)
            lease.answered = True
            self._answered[worker_id] += 1
            self._answered_at[lease.address] += 1

    def mark_judged(
        self, worker_id: str, batch_index: int, *, rejected: bool, machine: bool = False, replaying: bool = False
    ) -> None:
        """The validator judged its batch. A rejected batch hands the lease's tasks to another
        identity (``return_tasks``) and counts the lease as ``rejected`` (unless it had expired
        before: it counts once, as expired); an accepted one lets the answered lease fold. A lease folds only
        once judged, so a lease whose tasks may still go back is never folded away first, and a
        returned lease stays one by one (its reissue is in the log)."""
        lease = self._leases.get((worker_id, batch_index))
        if rejected:
            if lease is not None and not lease.rejected and not lease.expired:
                lease.rejected = True
                self._rejected[worker_id] += 1
                self._rejected_at[lease.address] += 1
                self._machine[worker_id] += machine
                lease.machine = machine
            self.return_tasks(worker_id, batch_index, replaying=replaying)
            return
        if lease is not None and lease.answered and not lease.returned and not lease.excused:
            self._foldable(lease)

    def return_tasks(self, worker_id: str, batch_index: int, *, replaying: bool = False) -> bool:
        """Queue the tasks of an answered lease for another identity (its batch was rejected, or
        expired unjudged: too old to train on); False for a lease never issued (or folded), already
        returned or already reissued."""
        lease = self._leases.get((worker_id, batch_index))
        if lease is not None and lease.reissued and lease.answered:  # (a replay: its reissue came first)
            self._foldable(lease)
        if lease is None or lease.returned or lease.reissued:
            return False
        lease.returned = True
        if not replaying:  # on restart, queue_expired_after_replay queues it in deadline order
            self._reassign_queue.append(lease)
            record = lease.record
            self._metrics.log(
                "lease_returned", worker_id=worker_id, step=record.step, batch_index=batch_index, task_ids=record.task_ids
            )
        return True

    def expire(self, now: float) -> list[LeaseRecord]:
        """Mark open leases past their deadline expired and queue their tasks for reassignment (one
        store transaction); returns the leases expired now, in deadline order."""
        due: list[HeldLease] = []
        spared: list[tuple[float, str, int]] = []
        while self._deadlines and self._deadlines[0][0] < now:
            entry = heapq.heappop(self._deadlines)
            lease = self._leases.get(entry[1:])
            if lease is not None and lease.open and lease.key in self.answering:
                spared.append(entry)
            elif lease is not None and lease.open:
                due.append(lease)
        for entry in spared:  # its batch waits in line: looked at again on the next tick
            heapq.heappush(self._deadlines, entry)
        if not due:
            return []
        # Re-pushed if the write fails, so the next tick retries them.
        try:
            self._store.append_events(
                [
                    {
                        "event": "lease_expired",
                        "worker_id": lease.worker_id,
                        "batch_index": lease.batch_index,
                        "time": now,
                    }
                    for lease in due
                ]
            )
        except BaseException:
            for lease in due:
                heapq.heappush(self._deadlines, (lease.deadline, lease.worker_id, lease.batch_index))
            raise
        for lease in due:
            record = lease.record
            self._mark_expired(lease)
            self._reassign_queue.append(lease)
            self._metrics.log(
                "lease_expired",
                worker_id=record.worker_id,
                step=record.step,
                batch_index=record.batch_index,
                task_ids=record.task_ids,
            )
        return [lease.record for lease in due]

    def _take_reassignment(self, worker_id: str, address: str) -> HeldLease | None:
        """The oldest expired, unanswered lease abandoned at another address, else the oldest one
        abandoned by another worker at ``address``; None when only ``worker_id``'s own wait."""
        self._reassign_queue = deque(lease for lease in self._reassign_queue if lease.reassignable)
        others = [lease for lease in self._reassign_queue if lease.worker_id != worker_id]
        chosen = next((lease for lease in others if lease.address != address), None)
        chosen = chosen or next(iter(others), None)
        if chosen is not None:
            self._reassign_queue.remove(chosen)
        return chosen

    def issue(
        self, worker_id: str, step: int, now: float, address: str = "", version: int | None = None
    ) -> LeaseRecord:
        """A new lease for ``worker_id`` (handed to client ``address``) at its next batch index: the
        tasks of an expired, unanswered lease another worker abandoned if one waits for reassignment
        (``_take_reassignment``), else the assignment function's fresh tasks.

        The lease fixes its policy version: ``version`` (the one the worker holds and asked for) when
        it lies in the async window ``[step - async_level, step]``, else ``step``, the newest
        committed. The worker states it before it sees the tasks, so it cannot choose by them; and
        a worker still downloading the newest version generates with the one it holds, as before."""
        orch = self._config.orchestrator
        if version is None or not max(0, step - orch.async_level) <= version <= step:
            version = step
        index = self.next_index(worker_id)
        reissues: tuple[str, int] | None = None
        taken = self._take_reassignment(worker_id, address)
        if taken is not None:
            source = taken.record
            reissues = (source.worker_id, source.batch_index)
            ids = list(source.task_ids)
            origin = (source.source_worker_id, source.source_step, source.source_batch_index)
        else:
            ids = list(
                task_ids(
                    key=self._key,
                    worker_id=worker_id,
                    step=step,
                    batch_index=index,
                    num_tasks=len(self._tasks),
                    prompts_per_batch=orch.prompts_per_batch,
                )
            )
            origin = (worker_id, step, index)
        record = LeaseRecord(
            worker_id=worker_id,
            step=step,
            batch_index=index,
            task_ids=ids,
            issued_at=now,
            deadline=now + orch.task_timeout_s,
            source_worker_id=origin[0],
            source_step=origin[1],
            source_batch_index=origin[2],
            policy_version=version,
        )
        self._store.append_event(
            {
                "event": "lease",
                "lease": record.model_dump(),
                "reissues": reissues,
                "address": address,
                "time": now,
            }
        )
        self._add(HeldLease.of(record, address), reissues)
        heapq.heappush(self._deadlines, (record.deadline, worker_id, index))
        self._metrics.log(
            "lease",
            worker_id=worker_id,
            step=step,
            batch_index=index,
            task_ids=ids,
            reassigned=origin[0] != worker_id or origin[2] != index,
        )
        return record

    def record_switch(self, lease: HeldLease, switch: LeaseSwitch) -> int:
        """Record ``switch`` on ``lease`` durably (a ``lease_switch`` event, replayed by ``load``) and
        return its nonce (``switch_nonce``)."""
        self._store.append_event(
            {
                "event": "lease_switch",
                "worker_id": lease.worker_id,
                "batch_index": lease.batch_index,
                "switch": switch.model_dump(),
                "time": switch.announced_at,
            }
        )
        lease.add_switch(switch)
        record = lease.record
        self._metrics.log(
            "lease_switch", worker_id=lease.worker_id, step=record.step, batch_index=lease.batch_index,
            policy_version=switch.policy_version, chunk=switch.chunk,
        )  # fmt: skip
        return self.nonce(record, switch)

    def record_done(self, lease: HeldLease, done: LeaseDone) -> None:
        """Record the worker's done declaration on ``lease`` durably (a ``lease_done`` event)."""
        self._store.append_event(
            {
                "event": "lease_done", "worker_id": lease.worker_id, "batch_index": lease.batch_index,
                "done": done.model_dump(), "time": done.declared_at,
            }
        )  # fmt: skip
        lease.declare_done(done)

    def nonce(self, record: LeaseRecord, switch: LeaseSwitch) -> int:
        """The nonce of ``switch``, recorded on the lease ``record`` (``api.assignment.switch_nonce``)."""
        return recorded_switch_nonce(self._key, record, switch.policy_version)

    # ------------------------------------------------------------------ answers

    def answer(self, record: LeaseRecord) -> TaskLease:
        """The ``GET /tasks`` answer for ``record``: prompts, per-sample seeds and sampling settings."""
        sampling = self._config.sampling
        orch = self._config.orchestrator
        reassigned = (record.source_worker_id, record.source_batch_index) != (
            record.worker_id,
            record.batch_index,
        )
        tasks = [
            LeaseTask(
                task_id=task_id,
                prompt=self._tasks.prompt(task_id),
                sampling_seeds=list(
                    sampling_seeds(
                        key=self._key,
                        worker_id=record.worker_id,
                        step=record.step,
                        batch_index=record.batch_index,
                        task_id=task_id,
                        group_size=sampling.group_size,
                    )
                ),
            )
            for task_id in record.task_ids
        ]
        return TaskLease(
            worker_id=record.worker_id,
            step=record.step,
            batch_index=record.batch_index,
            policy_version=record.fixed_version,
            min_policy_version=max(0, record.step - orch.async_level),
            deadline=record.deadline,
            group_size=sampling.group_size,
            temperature=sampling.temperature,
            max_new_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop),
            tasks=tasks,
            reassigned_from=LeaseSource(
                worker_id=record.source_worker_id,
                step=record.source_step,
                batch_index=record.source_batch_index,
            )
            if reassigned
            else None,
        )
