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

Two rooms, split along the seam the book always had: this one issues leases and takes their answers
(who gets which tasks, expiry, return, withdrawal, switches, the ``GET /tasks`` answer);
``LeaseHistory`` (lease_history.py), its base class, keeps the leases one by one, counts them per
worker and per address, folds settled ones into the store's totals and replays the events after a
restart. ``HeldLease`` and ``FOLD_EVERY`` live there and are re-exported here.

Cost: a lease costs the same however many leases were issued before it: expiry pops a deadline
heap, open leases are counted as they open and close, settled leases are folded (lease_history.py);
who answered whose tasks stays in the answering batch's ``LeaseRecord`` (``reassigned_from``). Kept
one by one: open leases, leases whose tasks still wait for another identity, and expired leases
nobody answered (abandonment bans bound how many there are). (Pitfall, fixed: the book once scanned
every lease ever issued three times per lease request, so a lease cost more the longer the run;
lease cost over a run's history: ``benchmarks/results/orchestrator_capacity.md``.)
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Protocol

from prime_rl.api.assignment import recorded_switch_nonce, sampling_seeds, task_ids
from prime_rl.api.protocol import LeaseDone, LeaseRecord, LeaseSource, LeaseSwitch, LeaseTask, TaskLease
from prime_rl.config import RunConfig
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.lease_history import FOLD_EVERY, HeldLease, LeaseHistory
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["FOLD_EVERY", "HeldLease", "LeaseBook", "TaskPrompts"]


class TaskPrompts(Protocol):
    """What the ledger needs from a task set: its size and each task's prompt text
    (:class:`prime_rl.tasks.TaskSet` has both; a protocol, so nothing subclasses it)."""

    def __len__(self) -> int: ...

    def prompt(self, task_id: int) -> str: ...


class LeaseBook(LeaseHistory):
    """All leases of a run (see module docstring); their counts, fold and replay: ``LeaseHistory``."""

    def __init__(
        self, config: RunConfig, tasks: Any, store: RolloutStore, metrics: MetricsWriter, *, key: bytes
    ) -> None:
        super().__init__(store, metrics)
        self._config = config
        self._key = key
        self._tasks = tasks

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

    # ------------------------------------------------------------------ changes

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
