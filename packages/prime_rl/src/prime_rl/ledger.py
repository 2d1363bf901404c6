"""The orchestrator's state machine: workers, leases, batches, verdicts, claims and the step.

``Ledger`` holds the in-memory view and applies every rule of API.md; each mutating method
writes to the ``RolloutStore`` (durably) *before* it changes memory and returns, so the HTTP
layer can acknowledge as soon as a method returns, and ``Ledger.load`` rebuilds the same state
after a restart. Methods raise ``ApiFailure(status, error, message)`` for requests the API
refuses; the HTTP layer turns it into the JSON error answer.

Not thread-safe: the HTTP layer calls one method at a time (under one lock).

Invariants (tested): a sample is in at most one claim; a claim for a step never changes once
written; ``step`` only grows; every sample handed to the trainer for step ``s`` has
``policy_version >= s - async_level`` and an ``accepted`` verdict.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prime_rl.assignment import sampling_seeds, task_ids
from prime_rl.claims import ClaimSelection, select_claim
from prime_rl.config import RunConfig
from prime_rl.metrics import MetricsWriter
from prime_rl.protocol import (
    BanRequest,
    BanResponse,
    ClaimRequest,
    ClaimResponse,
    CommitRequest,
    CommitResponse,
    LeaseRecord,
    LeaseSource,
    LeaseTask,
    PendingBatch,
    PendingResponse,
    RegisterResponse,
    RolloutBatch,
    StatusResponse,
    SubmitResponse,
    TaskLease,
    TrainSample,
    VerdictRequest,
    VerdictResponse,
    WorkersResponse,
    WorkerStats,
)
from prime_rl.records import ProofEncodingError, batch_rows, rollout_samples, train_samples
from prime_rl.store import RolloutStore, StoredVerdict

__all__ = ["EXPIRED", "MAX_OPEN_LEASES", "ApiFailure", "Ledger", "TaskPrompts"]

EXPIRED = "expired"
"""Verdict reason the orchestrator itself gives batches that became too old to train on before validation."""

MAX_OPEN_LEASES = 4
"""Unanswered, unexpired leases one worker may hold (bounds task hoarding and unleased submissions)."""


class ApiFailure(Exception):
    """A refused request: HTTP ``status``, short ``error`` code and a human ``message``."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


class TaskPrompts:
    """What the ledger needs from a task set: its size and each task's prompt text."""

    def __len__(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def prompt(self, task_id: int) -> str:  # pragma: no cover - interface
        raise NotImplementedError


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Worker:
    worker_id: str
    name: str
    token_sha256: str
    registered_at: float
    banned: bool = False
    ban_reason: str = ""
    last_seen: float = 0.0
    next_batch_index: int = 0
    leases_issued: int = 0
    leases_expired: int = 0
    malformed: int = 0


@dataclass
class _Lease:
    record: LeaseRecord
    answered: bool = False
    expired: bool = False
    reissued: bool = False


@dataclass
class _Batch:
    batch_id: str
    meta: dict[str, Any]
    task_ids: tuple[int, ...]
    lease: LeaseRecord | None
    verdicts: list[StoredVerdict] | None = None
    claimed: set[int] = field(default_factory=set)

    @property
    def worker_id(self) -> str:
        return str(self.meta["worker_id"])

    @property
    def seq(self) -> int:
        return int(self.meta["seq"])

    @property
    def policy_version(self) -> int:
        return int(self.meta["policy_version"])


class Ledger:
    """All orchestrator state and rules (see module docstring)."""

    def __init__(
        self,
        config: RunConfig,
        tasks: Any,
        store: RolloutStore,
        *,
        metrics: MetricsWriter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.orch = config.orchestrator
        self.tasks = tasks
        self.store = store
        self.metrics = metrics or MetricsWriter(None, role="orchestrator", name="orchestrator")
        self.clock = clock
        self.step = 0
        self.workers: dict[str, _Worker] = {}
        self.leases: dict[tuple[str, int], _Lease] = {}
        self.reassign_queue: deque[_Lease] = deque()
        self.batches: dict[str, _Batch] = {}
        self.claims: dict[int, tuple[str, ...]] = {}
        self.committed: set[int] = set()
        self._worker_counter = 0
        if self.orch.prompts_per_batch > len(tasks):
            raise ValueError(
                f"orchestrator.prompts_per_batch ({self.orch.prompts_per_batch}) exceeds the task set ({len(tasks)} tasks)"
            )
        limit = self.orch.max_buffered_samples
        needed = int(getattr(config.trainer, "samples_per_step", 0)) + self.orch.prompts_per_batch * (
            config.sampling.group_size
        )
        if limit and limit < needed:
            raise ValueError(
                f"orchestrator.max_buffered_samples ({limit}) must be at least trainer.samples_per_step + one "
                f"lease ({needed}); 2x that is a good value"
            )
        self._load()

    # ------------------------------------------------------------------ recovery

    def _load(self) -> None:
        for event in self.store.events():
            kind = event.get("event")
            if kind == "register":
                self.workers[event["worker_id"]] = _Worker(
                    worker_id=event["worker_id"],
                    name=event["name"],
                    token_sha256=event["token_sha256"],
                    registered_at=event["time"],
                    last_seen=event["time"],
                )
                self._worker_counter = max(self._worker_counter, int(event["number"]) + 1)
            elif kind == "lease":
                reissues = event.get("reissues")
                self._apply_lease(
                    LeaseRecord.model_validate(event["lease"]),
                    (reissues[0], reissues[1]) if reissues else None,
                )
            elif kind == "lease_expired":
                lease = self.leases.get((event["worker_id"], event["batch_index"]))
                if lease is not None:
                    lease.expired = True
                    self.workers[lease.record.worker_id].leases_expired += 1
            elif kind == "ban" and event["worker_id"] in self.workers:
                self.workers[event["worker_id"]].banned = True
                self.workers[event["worker_id"]].ban_reason = event["reason"]
            elif kind == "malformed" and event["worker_id"] in self.workers:
                self.workers[event["worker_id"]].malformed += 1
            elif kind == "commit":
                self.committed.add(int(event["step"]))
                self.step = max(self.step, int(event["step"]) + 1)
        verdicts = self.store.all_verdicts()
        for record in self.store.batch_records():
            leased = LeaseRecord.model_validate(record.meta["lease"]) if record.meta.get("lease") else None
            batch = _Batch(
                record.batch_id, record.meta, record.task_ids, leased, verdicts.get(record.batch_id)
            )
            self.batches[record.batch_id] = batch
            held = self.leases.get((batch.worker_id, int(record.meta["batch_index"])))
            if held is not None:
                held.answered = True
        for claim in self.store.claims():
            self.claims[claim.step] = claim.sample_ids
            for sample_id in claim.sample_ids:
                batch_id, index = sample_id.rsplit("/", 1)
                self.batches[batch_id].claimed.add(int(index))
        for lease in sorted(self.leases.values(), key=lambda lease: lease.record.deadline):
            if lease.expired and not lease.answered and not lease.reissued:
                self.reassign_queue.append(lease)

    def _apply_lease(self, record: LeaseRecord, reissues: tuple[str, int] | None) -> _Lease:
        lease = _Lease(record)
        self.leases[(record.worker_id, record.batch_index)] = lease
        worker = self.workers[record.worker_id]
        worker.next_batch_index = max(worker.next_batch_index, record.batch_index + 1)
        worker.leases_issued += 1
        if reissues is not None and reissues in self.leases:
            self.leases[reissues].reissued = True
        return lease

    # ------------------------------------------------------------------ workers

    def register(self, name: str) -> RegisterResponse:
        number = self._worker_counter
        worker_id = f"w{number:04d}"
        token = secrets.token_hex(16)
        now = self.clock()
        self.store.append_event(
            {
                "event": "register",
                "worker_id": worker_id,
                "name": name,
                "number": number,
                "token_sha256": _sha256(token),
                "time": now,
            }
        )
        self._worker_counter += 1
        self.workers[worker_id] = _Worker(worker_id, name, _sha256(token), now, last_seen=now)
        self.metrics.log("register", worker_id=worker_id, worker_name=name)
        return RegisterResponse(worker_id=worker_id, token=token)

    def authenticate(self, worker_id: str, token: str) -> _Worker:
        """The registered, unbanned worker owning ``token``; ApiFailure 404/401/403 otherwise."""
        worker = self.workers.get(worker_id)
        if worker is None:
            raise ApiFailure(404, "not_found", f"unknown worker_id {worker_id!r}; register first")
        if not secrets.compare_digest(_sha256(token), worker.token_sha256):
            raise ApiFailure(
                401, "unauthorized", "missing or wrong worker token (Authorization: Bearer <token>)"
            )
        if worker.banned:
            raise ApiFailure(403, "banned", f"worker {worker_id} is banned: {worker.ban_reason}")
        worker.last_seen = self.clock()
        return worker

    def record_malformed(self, worker_id: str) -> None:
        worker = self.workers.get(worker_id)
        if worker is not None:
            self.store.append_event({"event": "malformed", "worker_id": worker_id, "time": self.clock()})
            worker.malformed += 1
            self.metrics.log("malformed", worker_id=worker_id)

    def ban(self, request: BanRequest) -> BanResponse:
        worker = self.workers.get(request.worker_id)
        if worker is None:
            raise ApiFailure(404, "not_found", f"unknown worker_id {request.worker_id!r}")
        if not worker.banned:
            self.store.append_event(
                {
                    "event": "ban",
                    "worker_id": worker.worker_id,
                    "reason": request.reason,
                    "time": self.clock(),
                }
            )
            worker.banned, worker.ban_reason = True, request.reason
            self.metrics.log("ban", worker_id=worker.worker_id, reason=request.reason)
        return BanResponse(worker_id=worker.worker_id, banned=True)

    def workers_view(self) -> WorkersResponse:
        stats = {w: Counter[str]() for w in self.workers}
        counts = {w: Counter[str]() for w in self.workers}
        for batch in self.batches.values():
            count = counts[batch.worker_id]
            count["batches"] += 1
            count["samples"] += len(batch.task_ids)
            if batch.verdicts is None:
                count["pending"] += len(batch.task_ids)
                continue
            for verdict in batch.verdicts:
                if verdict.reason == EXPIRED:
                    count["expired"] += 1
                    continue
                count["accepted" if verdict.accepted else "rejected"] += 1
                if not verdict.accepted:
                    stats[batch.worker_id][verdict.reason] += 1
        return WorkersResponse(
            workers=[
                WorkerStats(
                    worker_id=w.worker_id,
                    name=w.name,
                    banned=w.banned,
                    ban_reason=w.ban_reason,
                    registered_at=w.registered_at,
                    last_seen=w.last_seen,
                    leases_issued=w.leases_issued,
                    leases_expired=w.leases_expired,
                    batches_submitted=counts[w.worker_id]["batches"],
                    samples_submitted=counts[w.worker_id]["samples"],
                    samples_accepted=counts[w.worker_id]["accepted"],
                    samples_rejected=counts[w.worker_id]["rejected"],
                    samples_pending=counts[w.worker_id]["pending"],
                    samples_expired=counts[w.worker_id]["expired"],
                    malformed_requests=w.malformed,
                    rejected_reasons=dict(stats[w.worker_id]),
                )
                for w in self.workers.values()
            ]
        )

    # ------------------------------------------------------------------ status and leases

    @property
    def min_policy_version(self) -> int:
        return max(0, self.step - self.orch.async_level)

    def status(self) -> StatusResponse:
        sampling = self.config.sampling
        pending = sum(1 for batch in self.batches.values() if batch.verdicts is None)
        return StatusResponse(
            step=self.step,
            policy_version=self.step,
            async_level=self.orch.async_level,
            min_policy_version=self.min_policy_version,
            group_size=sampling.group_size,
            prompts_per_batch=self.orch.prompts_per_batch,
            temperature=sampling.temperature,
            max_new_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop),
            num_tasks=len(self.tasks),
            task_timeout_s=self.orch.task_timeout_s,
            weights_servers=self.config.shardcast.client_servers,
            weights_file="model.safetensors",
            workers=len(self.workers),
            pending_batches=pending,
            time=self.clock(),
        )

    def buffered_samples(self) -> int:
        """Samples that may still reach the trainer: open leases, fresh batches awaiting validation, and
        accepted samples the next claim could take (fresh, unclaimed, informative if the trainer
        filters zero-advantage groups). Rejected, stale and uninformative samples do not count, so a
        full buffer always drains (pitfall: counting them deadlocked backpressure)."""
        per_lease = self.orch.prompts_per_batch * self.config.sampling.group_size
        total = per_lease * sum(
            1 for lease in self.leases.values() if not lease.answered and not lease.expired
        )
        fresh = [b for b in self.batches.values() if b.policy_version >= self.min_policy_version]
        total += sum(len(b.task_ids) for b in fresh if b.verdicts is None)
        claimable = select_claim(
            fresh,
            min_policy_version=self.min_policy_version,
            min_samples=1 << 62,
            filter_zero_advantage=bool(getattr(self.config.trainer, "filter_zero_advantage", True)),
        )
        return total + claimable.available

    def expire_leases(self) -> int:
        """Mark unanswered leases past their deadline expired and queue their tasks for reassignment."""
        now = self.clock()
        expired = 0
        for lease in self.leases.values():
            if not lease.answered and not lease.expired and lease.record.deadline < now:
                record = lease.record
                self.store.append_event(
                    {
                        "event": "lease_expired",
                        "worker_id": record.worker_id,
                        "batch_index": record.batch_index,
                        "time": now,
                    }
                )
                lease.expired = True
                self.workers[record.worker_id].leases_expired += 1
                self.reassign_queue.append(lease)
                expired += 1
                self.metrics.log(
                    "lease_expired",
                    worker_id=record.worker_id,
                    step=record.step,
                    batch_index=record.batch_index,
                    task_ids=record.task_ids,
                )
        return expired

    def lease(self, worker: _Worker, step: int | None, batch_index: int | None) -> TaskLease:
        if step is not None and step != self.step:
            raise ApiFailure(
                409, "conflict", f"step {step} is not the current step {self.step}; ask without step"
            )
        if batch_index is not None and batch_index != worker.next_batch_index:
            held = self.leases.get((worker.worker_id, batch_index))
            if held is None or held.expired or held.answered:
                raise ApiFailure(
                    409,
                    "conflict",
                    f"batch_index {batch_index} is neither your next index ({worker.next_batch_index}) "
                    "nor a live lease; ask without batch_index",
                )
            return self._lease_answer(held.record)
        self.expire_leases()
        open_leases = sum(
            1
            for (owner, _), lease in self.leases.items()
            if owner == worker.worker_id and not lease.answered and not lease.expired
        )
        if open_leases >= MAX_OPEN_LEASES:
            raise ApiFailure(409, "conflict", f"{open_leases} unanswered leases open; submit them first")
        limit = self.orch.max_buffered_samples
        if limit and (buffered := self.buffered_samples()) >= limit:
            raise ApiFailure(429, "busy", f"{buffered} samples already buffered (limit {limit}); retry later")
        now = self.clock()
        index = worker.next_batch_index
        while self.reassign_queue and self.reassign_queue[0].answered:  # answered late: nothing to redo
            self.reassign_queue.popleft()
        reissues: tuple[str, int] | None = None
        if self.reassign_queue:
            source = self.reassign_queue.popleft().record
            reissues = (source.worker_id, source.batch_index)
            ids = list(source.task_ids)
            origin = (source.source_worker_id, source.source_step, source.source_batch_index)
        else:
            ids = list(
                task_ids(
                    run_seed=self.orch.seed,
                    worker_id=worker.worker_id,
                    step=self.step,
                    batch_index=index,
                    num_tasks=len(self.tasks),
                    prompts_per_batch=self.orch.prompts_per_batch,
                )
            )
            origin = (worker.worker_id, self.step, index)
        record = LeaseRecord(
            worker_id=worker.worker_id,
            step=self.step,
            batch_index=index,
            task_ids=ids,
            issued_at=now,
            deadline=now + self.orch.task_timeout_s,
            source_worker_id=origin[0],
            source_step=origin[1],
            source_batch_index=origin[2],
        )
        self.store.append_event(
            {"event": "lease", "lease": record.model_dump(), "reissues": reissues, "time": now}
        )
        self._apply_lease(record, reissues)
        self.metrics.log(
            "lease",
            worker_id=worker.worker_id,
            step=self.step,
            batch_index=index,
            task_ids=ids,
            reassigned=origin[0] != worker.worker_id or origin[2] != index,
        )
        return self._lease_answer(record)

    def _lease_answer(self, record: LeaseRecord) -> TaskLease:
        sampling = self.config.sampling
        reassigned = (record.source_worker_id, record.source_batch_index) != (
            record.worker_id,
            record.batch_index,
        )
        tasks = [
            LeaseTask(
                task_id=task_id,
                prompt=self.tasks.prompt(task_id),
                sampling_seeds=list(
                    sampling_seeds(
                        run_seed=self.orch.seed,
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
            min_policy_version=max(0, record.step - self.orch.async_level),
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

    # ------------------------------------------------------------------ rollouts

    def submit(self, worker: _Worker, batch: RolloutBatch) -> SubmitResponse:
        orch = self.orch
        if len(batch.samples) > orch.max_samples_per_batch:
            raise ApiFailure(
                413, "too_large", f"{len(batch.samples)} samples > max {orch.max_samples_per_batch}"
            )
        for index, sample in enumerate(batch.samples):
            tokens = len(sample.prompt_tokens) + len(sample.completion_tokens)
            if tokens > orch.max_tokens_per_sample:
                raise ApiFailure(
                    413, "too_large", f"sample {index}: {tokens} tokens > max {orch.max_tokens_per_sample}"
                )
            if sample.group_index >= self.config.sampling.group_size:
                raise ApiFailure(
                    400, "bad_request", f"sample {index}: group_index {sample.group_index} >= group_size"
                )
        try:
            rows = batch_rows(batch)
        except ProofEncodingError as error:
            raise ApiFailure(400, "bad_request", str(error)) from None
        if batch.batch_index >= worker.next_batch_index + MAX_OPEN_LEASES:
            raise ApiFailure(409, "conflict", f"batch_index {batch.batch_index} was never leased to you")
        batch_id = f"{batch.worker_id}-s{batch.step}-b{batch.batch_index}"
        digest = hashlib.sha256(batch.model_dump_json().encode()).hexdigest()
        existing = self.batches.get(batch_id)
        if existing is not None:
            if existing.meta["sha256"] == digest:
                return SubmitResponse(batch_id=batch_id, num_samples=len(batch.samples), duplicate=True)
            raise ApiFailure(409, "conflict", f"a different batch {batch_id} was already stored")
        held = self.leases.get((worker.worker_id, batch.batch_index))
        lease = held.record if held is not None and held.record.step == batch.step else None
        meta = {
            "batch_id": batch_id,
            "worker_id": batch.worker_id,
            "step": batch.step,
            "batch_index": batch.batch_index,
            "policy_version": batch.policy_version,
            "received_at": self.clock(),
            "sha256": digest,
            "seq": len(self.batches),
            "lease": lease.model_dump() if lease else None,
        }
        samples = batch.samples
        self.store.write_batch(batch_id, meta, rows)
        self.batches[batch_id] = _Batch(batch_id, meta, tuple(s.task_id for s in samples), lease)
        if held is not None and lease is not None:
            held.answered = True
        self.metrics.log(
            "batch_stored",
            batch_id=batch_id,
            worker_id=batch.worker_id,
            step=batch.step,
            policy_version=batch.policy_version,
            samples=len(samples),
            leased=lease is not None,
        )
        return SubmitResponse(batch_id=batch_id, num_samples=len(samples), duplicate=False)

    # ------------------------------------------------------------------ validator

    def _expire_useless_batches(self) -> None:
        """Verdict ``expired`` on unvalidated batches no step can use any more (not the worker's fault).

        A batch that was fresh for its own lease (``policy_version >= step - async_level``) but is
        older than ``current step - async_level`` can never be trained on; validating it would only
        burn validator time. A batch stale for its own lease is left to the validator (``stale_policy``).
        """
        level = self.orch.async_level
        for batch in self.batches.values():
            if batch.verdicts is not None:
                continue
            version, lease_step = batch.policy_version, int(batch.meta["step"])
            if lease_step - level <= version < self.step - level:
                verdicts = [StoredVerdict(i, False, EXPIRED, 0.0, 0.0) for i in range(len(batch.task_ids))]
                self.store.write_verdicts(batch.batch_id, verdicts)
                batch.verdicts = verdicts
                self.metrics.log(
                    "expired", batch_id=batch.batch_id, worker_id=batch.worker_id, policy_version=version
                )

    def pending(self, limit: int) -> PendingResponse:
        self._expire_useless_batches()
        waiting = [batch for batch in self.batches.values() if batch.verdicts is None]
        # Freshest policy first (usable for the most steps), then submission order.
        waiting.sort(key=lambda batch: (-batch.policy_version, batch.seq))
        answer = []
        for batch in waiting[:limit]:
            meta, table = self.store.read_batch(batch.batch_id)
            samples = rollout_samples(table)
            answer.append(
                PendingBatch(
                    batch_id=batch.batch_id,
                    worker_id=meta["worker_id"],
                    step=meta["step"],
                    batch_index=meta["batch_index"],
                    policy_version=meta["policy_version"],
                    received_at=meta["received_at"],
                    lease=batch.lease,
                    samples=samples,
                )
            )
        return PendingResponse(
            batches=answer, pending_batches=len(waiting), policy_version=self.step, step=self.step
        )

    def record_verdicts(self, request: VerdictRequest) -> VerdictResponse:
        batch = self.batches.get(request.batch_id)
        if batch is None:
            raise ApiFailure(404, "not_found", f"unknown batch_id {request.batch_id!r}")
        indices = sorted(v.sample_index for v in request.verdicts)
        if indices != list(range(len(batch.task_ids))):
            raise ApiFailure(
                400,
                "bad_request",
                f"need exactly one verdict per sample index 0..{len(batch.task_ids) - 1}, got {len(indices)} verdicts",
            )
        verdicts = sorted(
            (
                StoredVerdict(v.sample_index, v.accepted, v.reason, v.reward, v.advantage)
                for v in request.verdicts
            ),
            key=lambda v: v.sample_index,
        )
        accepted = sum(v.accepted for v in verdicts)
        expired_here = batch.verdicts is not None and all(v.reason == EXPIRED for v in batch.verdicts)
        if batch.verdicts is not None and not expired_here:
            # (A batch the orchestrator expired while a validator was judging it takes the validator's
            # verdicts instead: its samples stay unusable (too old) but the accounting is the validator's.)
            if batch.verdicts != verdicts:
                raise ApiFailure(409, "conflict", f"batch {request.batch_id} already has different verdicts")
        else:
            self.store.write_verdicts(batch.batch_id, verdicts)
            batch.verdicts = verdicts
            reasons = Counter(v.reason for v in verdicts if not v.accepted)
            self.metrics.log(
                "verdicts",
                batch_id=batch.batch_id,
                worker_id=batch.worker_id,
                policy_version=batch.policy_version,
                accepted=accepted,
                rejected=len(verdicts) - accepted,
                reasons=dict(reasons),
            )
        return VerdictResponse(
            batch_id=request.batch_id, accepted=accepted, rejected=len(verdicts) - accepted
        )

    # ------------------------------------------------------------------ trainer

    def claim(self, request: ClaimRequest) -> ClaimResponse:
        min_version = max(0, request.step - self.orch.async_level)
        if request.step in self.claims:
            return self._claim_answer(request.step, min_version, self.claims[request.step], None)
        if request.step != self.step:
            raise ApiFailure(
                409, "conflict", f"step {request.step} is not the current step {self.step} and has no claim"
            )
        self._expire_useless_batches()
        selection = select_claim(
            self.batches.values(),
            min_policy_version=min_version,
            min_samples=request.min_samples,
            filter_zero_advantage=request.filter_zero_advantage,
        )
        if not selection.ready:
            reason = (
                f"{selection.available} fresh accepted samples available (policy_version >= {min_version}), "
                f"need {request.min_samples}; {selection.pending_batches} batches ({selection.pending_samples} "
                "samples) await validation"
            )
            return ClaimResponse(
                ready=False,
                step=request.step,
                min_policy_version=min_version,
                samples=[],
                reason=reason,
                available_samples=selection.available,
                pending_batches=selection.pending_batches,
                pending_samples=selection.pending_samples,
                stale_samples=selection.stale,
                zero_advantage_samples=selection.zero_advantage,
            )
        chosen = selection.sample_ids
        self.store.write_claim(
            request.step, {"min_policy_version": min_version, "time": self.clock()}, chosen
        )
        self.claims[request.step] = chosen
        for sample_id in chosen:
            batch_id, index = sample_id.rsplit("/", 1)
            self.batches[batch_id].claimed.add(int(index))
        self.metrics.log(
            "claim",
            step=request.step,
            samples=len(chosen),
            min_policy_version=min_version,
            stale_samples=selection.stale,
            zero_advantage_samples=selection.zero_advantage,
        )
        return self._claim_answer(request.step, min_version, chosen, selection)

    def _claim_answer(
        self, step: int, min_version: int, sample_ids: tuple[str, ...], selection: ClaimSelection | None
    ) -> ClaimResponse:
        wanted: dict[str, set[int]] = {}
        for sample_id in sample_ids:
            batch_id, index = sample_id.rsplit("/", 1)
            wanted.setdefault(batch_id, set()).add(int(index))
        rows: dict[str, TrainSample] = {}
        for batch_id, indices in wanted.items():
            batch = self.batches[batch_id]
            assert batch.verdicts is not None  # claims only ever hold verdicted samples
            meta, table = self.store.read_batch(batch_id)
            for position, sample in train_samples(batch_id, meta, table, batch.verdicts, indices).items():
                rows[f"{batch_id}/{position}"] = sample
        return ClaimResponse(
            ready=True,
            step=step,
            min_policy_version=min_version,
            samples=[rows[s] for s in sample_ids],
            reason="",
            available_samples=len(sample_ids),
            pending_batches=selection.pending_batches if selection else 0,
            pending_samples=selection.pending_samples if selection else 0,
            stale_samples=selection.stale if selection else 0,
            zero_advantage_samples=selection.zero_advantage if selection else 0,
        )

    def commit(self, request: CommitRequest) -> CommitResponse:
        if request.policy_version != request.step + 1:
            raise ApiFailure(400, "bad_request", f"policy_version must be step + 1 = {request.step + 1}")
        if request.step < self.step:
            return CommitResponse(step=self.step, policy_version=self.step)
        if request.step > self.step:
            raise ApiFailure(409, "conflict", f"step {request.step} is ahead of the current step {self.step}")
        if request.step not in self.claims:
            raise ApiFailure(
                409, "conflict", f"no claim exists for step {request.step}; claim before committing"
            )
        self.store.append_event(
            {
                "event": "commit",
                "step": request.step,
                "policy_version": request.policy_version,
                "time": self.clock(),
            }
        )
        self.committed.add(request.step)
        self.step = request.step + 1
        self.metrics.log("commit", step=request.step, policy_version=self.step)
        return CommitResponse(step=self.step, policy_version=self.step)
