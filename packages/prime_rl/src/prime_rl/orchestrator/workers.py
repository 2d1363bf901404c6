"""Registered workers: ids, token hashes, bans and malformed-request counts, kept durably; their `GET /workers` view.

``WorkerRegistry`` owns the worker records (a read-only ``Mapping`` from worker id to
``WorkerRecord`` for everyone else) and the store events that create or change them:
``register``, ``ban``, ``retire`` (an identity that did no accepted work in time: ``Ledger``'s
``retire_idle``) and ``malformed``. Like the rest of the ledger, every change is appended
to the ``RolloutStore`` event log *before* memory changes, and ``replay`` rebuilds the same
records from that log after a restart.

Only a SHA-256 of each worker token is kept (in memory and on disk): a leaked data dir does not
leak tokens. The registry refuses nothing; the API's rules (who may register, who is
authenticated) are the ``Ledger``'s.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from prime_rl.api.protocol import WorkersResponse, WorkerStats
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.store import RolloutStore

__all__ = ["WorkerRecord", "WorkerRegistry"]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class WorkerRecord:
    """One registered worker (mutable: ``last_seen``, ban and malformed count change)."""

    worker_id: str
    name: str
    token_sha256: str
    registered_at: float
    banned: bool = False
    ban_reason: str = ""
    last_seen: float = 0.0
    malformed: int = 0
    network: str = ""
    """The network it registered from (``rate_limit.network_key``; empty in stores older than it)."""
    retired: bool = False
    """Expired without accepted work: unknown to the API from then on (it may register anew)."""

    @property
    def active(self) -> bool:
        """Counted against ``max_workers``: neither banned nor retired."""
        return not (self.banned or self.retired)

    def token_matches(self, token: str) -> bool:
        """Constant-time comparison of ``token``'s hash with the registered one."""
        return secrets.compare_digest(_sha256(token), self.token_sha256)


class WorkerRegistry(Mapping[str, WorkerRecord]):
    """Worker records by id (``w0000``, ``w0001``, ...; ids are never reused, not even after a ban)."""

    EVENTS = frozenset({"register", "ban", "retire", "malformed"})
    """Store event kinds this registry writes and replays."""

    def __init__(self, store: RolloutStore, metrics: MetricsWriter, clock: Callable[[], float]) -> None:
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._workers: dict[str, WorkerRecord] = {}
        self._next_number = 0
        self._active = 0  # kept as events apply: registration checks it, and must not count 10k records
        self._banned: set[str] = set()  # kept as events apply: every lease's backpressure asks for it

    def __getitem__(self, worker_id: str) -> WorkerRecord:
        return self._workers[worker_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def records(self) -> list[WorkerRecord]:
        """A copy of the records in registration order (one C-level ``list()``: safe to call from
        another thread while the ledger's thread registers workers)."""
        return list(self._workers.values())

    def banned_ids(self) -> AbstractSet[str]:
        """The banned workers' ids, kept as bans apply (the registry's own set, read-only: no copy, no
        walk of the registered workers; every lease's backpressure asks for it)."""
        return self._banned

    def active_count(self) -> int:
        """Registered workers neither banned nor retired (O(1))."""
        return self._active

    def replay(self, event: dict[str, Any]) -> None:
        """Apply one logged event of a kind in ``EVENTS`` (restart rebuild)."""
        kind = event.get("event")
        if kind == "register":
            self._workers[event["worker_id"]] = WorkerRecord(
                worker_id=event["worker_id"],
                name=event["name"],
                token_sha256=event["token_sha256"],
                registered_at=event["time"],
                last_seen=event["time"],
                network=event.get("network", ""),
            )
            self._active += 1
            self._next_number = max(self._next_number, int(event["number"]) + 1)
        elif kind == "ban" and event["worker_id"] in self._workers:
            self._set_ban(self._workers[event["worker_id"]], event["reason"])
        elif kind == "retire" and event["worker_id"] in self._workers:
            self._set_retired(self._workers[event["worker_id"]])
        elif kind == "malformed" and event["worker_id"] in self._workers:
            self._workers[event["worker_id"]].malformed += 1

    def _set_ban(self, worker: WorkerRecord, reason: str) -> None:
        self._active -= worker.active
        worker.banned, worker.ban_reason = True, reason
        self._banned.add(worker.worker_id)

    def _set_retired(self, worker: WorkerRecord) -> None:
        self._active -= worker.active
        worker.retired = True

    def register(self, name: str, network: str = "") -> tuple[WorkerRecord, str]:
        """A new worker registered from ``network`` and its bearer token (shown once; only its hash
        is stored)."""
        number = self._next_number
        worker_id = f"w{number:04d}"
        token = secrets.token_hex(16)
        now = self._clock()
        self._store.append_event(
            {
                "event": "register",
                "worker_id": worker_id,
                "name": name,
                "number": number,
                "token_sha256": _sha256(token),
                "time": now,
                "network": network,
            }
        )
        self._next_number += 1
        worker = WorkerRecord(worker_id, name, _sha256(token), now, last_seen=now, network=network)
        self._workers[worker_id] = worker
        self._active += 1
        self._metrics.log("register", worker_id=worker_id, worker_name=name)
        return worker, token

    def touch(self, worker: WorkerRecord) -> None:
        """Note that ``worker`` was just seen (memory only: ``last_seen`` is informational)."""
        worker.last_seen = self._clock()

    def record_malformed(self, worker_id: str) -> None:
        """Count one malformed request against a registered worker (unknown ids are ignored)."""
        worker = self._workers.get(worker_id)
        if worker is not None:
            self._store.append_event({"event": "malformed", "worker_id": worker_id, "time": self._clock()})
            worker.malformed += 1
            self._metrics.log("malformed", worker_id=worker_id)

    def ban(self, worker: WorkerRecord, reason: str) -> None:
        """Ban ``worker`` for ``reason``; banning a banned worker changes nothing (idempotent)."""
        if worker.banned:
            return
        self._store.append_event(
            {"event": "ban", "worker_id": worker.worker_id, "reason": reason, "time": self._clock()}
        )
        self._set_ban(worker, reason)
        self._metrics.log("ban", worker_id=worker.worker_id, reason=reason)

    def retire(self, worker: WorkerRecord, reason: str) -> None:
        """Retire ``worker`` (it did no accepted work in time): its slot in ``max_workers`` is free and
        the API knows it no more. Idempotent; a banned worker stays banned, not retired."""
        if not worker.active:
            return
        self._store.append_event(
            {"event": "retire", "worker_id": worker.worker_id, "reason": reason, "time": self._clock()}
        )
        self._set_retired(worker)
        self._metrics.log("retire", worker_id=worker.worker_id, reason=reason)

    def stats(
        self,
        counts: Mapping[str, Counter[str]],
        reasons: Mapping[str, Counter[str]],
        *,
        leases: Callable[[str], tuple[int, int]],
    ) -> WorkersResponse:
        """``GET /workers``: each worker's record with its sample ``counts`` and rejection ``reasons``
        (``BatchBook.sample_counts``) and ``leases(worker_id) -> (issued, expired)``."""
        stats = []
        for w in self._workers.values():
            count = counts.get(w.worker_id, Counter())
            issued, expired = leases(w.worker_id)
            stats.append(
                WorkerStats(
                    worker_id=w.worker_id,
                    name=w.name,
                    banned=w.banned,
                    ban_reason=w.ban_reason,
                    registered_at=w.registered_at,
                    last_seen=w.last_seen,
                    leases_issued=issued,
                    leases_expired=expired,
                    batches_submitted=count["batches"],
                    samples_submitted=count["samples"],
                    samples_accepted=count["accepted"],
                    samples_rejected=count["rejected"],
                    samples_pending=count["pending"],
                    samples_expired=count["expired"],
                    malformed_requests=w.malformed,
                    rejected_reasons=dict(reasons.get(w.worker_id, Counter())),
                    retired=w.retired,
                )
            )
        return WorkersResponse(workers=stats)
