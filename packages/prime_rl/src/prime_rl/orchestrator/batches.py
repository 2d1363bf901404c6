"""Stored rollout batches and their verdicts: submission checks, validation queue, expiry.

``BatchBook`` owns every batch the orchestrator has acknowledged (a read-only ``Mapping`` from
batch id to ``StoredBatch``): its metadata, task ids, the lease it answered, its verdicts once
the validator (or the orchestrator's expiry) has judged it, and which of its samples a claim
took. Batch rows live only in the ``RolloutStore`` (parquet, fsynced before the ack); memory
holds what the rules need. ``load`` rebuilds the same view from the store after a restart.

Pitfall: a batch id is ``{worker_id}-s{step}-b{batch_index}``, so a resubmission is recognised
by id; an identical request body (same SHA-256 of the bytes received) is a duplicate (idempotent
ack), a different one a 409.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import (
    LeaseRecord,
    PendingBatch,
    PendingResponse,
    RolloutBatch,
    SampleId,
    SubmitResponse,
    TrainSample,
    Verdict,
    VerdictRequest,
    VerdictResponse,
)
from prime_rl.config import RunConfig
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.claims import select_claim
from prime_rl.orchestrator.records import batch_rows, rollout_samples, train_samples
from prime_rl.orchestrator.store import BatchMeta, RolloutStore

__all__ = ["EXPIRED", "BatchBook", "StoredBatch"]

EXPIRED = "expired"
"""Verdict reason the orchestrator itself gives batches that became too old to train on before validation."""


@dataclass
class StoredBatch:
    """One acknowledged batch (``verdicts`` None = awaiting validation; ``claimed``: sample indices;
    ``completion_lengths``: per sample, known when the batch was stored by this process, else None
    until read back from the store)."""

    meta: BatchMeta
    task_ids: tuple[int, ...]
    verdicts: list[Verdict] | None = None
    claimed: set[int] = field(default_factory=set)
    completion_lengths: tuple[int, ...] | None = None

    @property
    def batch_id(self) -> str:
        return self.meta.batch_id

    @property
    def worker_id(self) -> str:
        return self.meta.worker_id

    @property
    def seq(self) -> int:
        return self.meta.seq

    @property
    def policy_version(self) -> int:
        return self.meta.policy_version

    @property
    def lease(self) -> LeaseRecord | None:
        return self.meta.lease

    @property
    def expired(self) -> bool:
        """Judged by the orchestrator's expiry (every verdict ``expired``), not by a validator."""
        return self.verdicts is not None and all(v.reason == EXPIRED for v in self.verdicts)


FRESH_TURN = 4
"""In the validator's queue, one place in this many goes to a fresh identity's batch (``pending``)."""


class BatchBook(Mapping[str, StoredBatch]):
    """All stored batches of a run (see module docstring)."""

    def __init__(
        self, config: RunConfig, store: RolloutStore, metrics: MetricsWriter, clock: Callable[[], float]
    ) -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._batches: dict[str, StoredBatch] = {}
        self._waiting: dict[str, StoredBatch] = {}  # awaiting verdicts, in submission order

    def __getitem__(self, batch_id: str) -> StoredBatch:
        return self._batches[batch_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)

    def load(self) -> list[StoredBatch]:
        """Rebuild every stored batch and its verdicts from the store; returns them in store order."""
        verdicts = self._store.all_verdicts()
        loaded = []
        for record in self._store.batch_records():
            batch = StoredBatch(record.meta, record.task_ids, verdicts.get(record.meta.batch_id))
            self._batches[batch.batch_id] = batch
            if batch.verdicts is None:
                self._waiting[batch.batch_id] = batch
            loaded.append(batch)
        return loaded

    # ------------------------------------------------------------------ submission

    def check(self, batch: RolloutBatch) -> dict[str, Sequence[Any]]:
        """The store rows of ``batch``; ApiFailure 413 (too many samples/tokens) or 400 otherwise."""
        orch = self._config.orchestrator
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
            if sample.group_index >= self._config.sampling.group_size:
                raise ApiFailure(
                    400, "bad_request", f"sample {index}: group_index {sample.group_index} >= group_size"
                )
        return batch_rows(batch)

    def add(
        self, batch: RolloutBatch, body_sha256: str, rows: dict[str, Sequence[Any]], lease: LeaseRecord | None
    ) -> SubmitResponse:
        """Store ``batch`` (``body_sha256``: digest of the request body as received; rows from
        ``check``; ``lease``: the one it answers, None if unleased) durably, or recognise it as a
        duplicate; ApiFailure 409 if a different body was stored under the same id."""
        batch_id = f"{batch.worker_id}-s{batch.step}-b{batch.batch_index}"
        existing = self._batches.get(batch_id)
        if existing is not None:
            if existing.meta.sha256 == body_sha256:
                return SubmitResponse(batch_id=batch_id, num_samples=len(batch.samples), duplicate=True)
            raise ApiFailure(409, "conflict", f"a different batch {batch_id} was already stored")
        meta = BatchMeta(
            batch_id=batch_id,
            worker_id=batch.worker_id,
            step=batch.step,
            batch_index=batch.batch_index,
            policy_version=batch.policy_version,
            received_at=self._clock(),
            sha256=body_sha256,
            seq=len(self._batches),
            lease=lease,
        )
        samples = batch.samples
        self._store.write_batch(meta, rows)
        self._batches[batch_id] = self._waiting[batch_id] = StoredBatch(
            meta, tuple(s.task_id for s in samples), completion_lengths=tuple(len(s.completion_tokens) for s in samples)
        )
        self._metrics.log(
            "batch_stored",
            batch_id=batch_id,
            worker_id=batch.worker_id,
            step=batch.step,
            policy_version=batch.policy_version,
            samples=len(samples),
            leased=lease is not None,
        )
        return SubmitResponse(batch_id=batch_id, num_samples=len(samples), duplicate=False)

    # ------------------------------------------------------------------ validation

    def buffered(
        self, min_policy_version: int, usable: Callable[[StoredBatch], bool], filter_zero_advantage: bool
    ) -> int:
        """Samples that may still reach the trainer: fresh batches awaiting validation and accepted
        samples the next claim could take (fresh, unclaimed, informative if the trainer filters
        zero-advantage groups), of the batches ``usable`` admits (not banned, not held). Rejected, stale and
        uninformative samples do not count, so a full buffer always drains (pitfall: counting them
        deadlocked backpressure); nor do open leases (pitfall: counting them let a few identities
        that take leases and never answer starve every honest worker)."""
        fresh = [
            b
            for b in self._batches.values()
            if b.policy_version >= min_policy_version and usable(b)
        ]
        pending = sum(len(b.task_ids) for b in fresh if b.verdicts is None)
        claimable = select_claim(
            fresh,
            min_policy_version=min_policy_version,
            min_samples=1 << 62,
            filter_zero_advantage=filter_zero_advantage,
        )
        return pending + claimable.available

    def waiting(self) -> list[StoredBatch]:
        """Batches awaiting verdicts, in submission order."""
        return list(self._waiting.values())

    def waiting_count(self) -> int:
        """How many batches await verdicts."""
        return len(self._waiting)

    def expire_useless(self, step: int, async_level: int, off_policy_bound: int | None = None) -> list[StoredBatch]:
        """Verdict ``expired`` on unvalidated batches no step can use any more (not the worker's fault);
        returns the batches expired now.

        A batch that was fresh for its own lease (``policy_version >= lease step - async_level``)
        but is older than ``step - off_policy_bound`` (default ``async_level``: the trainer's staleness
        bound, ``max_off_policy_steps``) can never be trained on; validating it would only burn
        validator time. A batch stale for its own lease is left to the validator (``stale_policy``).
        """
        bound = async_level if off_policy_bound is None else off_policy_bound
        expired = []
        for batch in self.waiting():
            version, lease_step = batch.policy_version, batch.meta.step
            if lease_step - async_level <= version < step - bound:
                verdicts = [
                    Verdict(
                        sample_index=i,
                        accepted=False,
                        reason=EXPIRED,
                        detail=f"policy v{version} became older than step {step} - {bound} before validation",
                        reward=0.0,
                        advantage=0.0,
                    )
                    for i in range(len(batch.task_ids))
                ]
                self._store.write_verdicts(batch.batch_id, verdicts)
                batch.verdicts = verdicts
                del self._waiting[batch.batch_id]
                self._metrics.log(
                    "expired", batch_id=batch.batch_id, worker_id=batch.worker_id, policy_version=version
                )
                expired.append(batch)
        return expired

    def pending(
        self,
        limit: int,
        step: int,
        *,
        established: Callable[[str], bool] = lambda worker_id: True,
        client: Callable[[StoredBatch], str] = lambda batch: "",
    ) -> PendingResponse:
        """Up to ``limit`` batches awaiting verdicts, each with its stored samples: freshest policy
        first (usable for the most steps), then submission order, with the batches of ``established``
        workers (accepted work) ahead of the others' but every ``FRESH_TURN``-th place kept for the
        oldest batch of a fresh identity while one waits, so unproven work cannot delay established
        verdicts by more than one batch in ``FRESH_TURN`` and a newcomer is never starved.
        ``client(batch)``: the client address its lease was handed to (``PendingBatch.client``)."""
        waiting = self.waiting()
        waiting.sort(key=lambda batch: (-batch.policy_version, batch.seq))
        ahead = [batch for batch in waiting if established(batch.worker_id)]
        fresh = [batch for batch in waiting if not established(batch.worker_id)]
        fresh.sort(key=lambda batch: batch.seq)
        ordered: list[StoredBatch] = []
        while len(ordered) < limit and (ahead or fresh):
            fresh_turn = len(ordered) % FRESH_TURN == FRESH_TURN - 1 or not ahead
            ordered.append(fresh.pop(0) if fresh_turn and fresh else ahead.pop(0))
        answer = []
        for batch in ordered:
            meta = batch.meta
            answer.append(
                PendingBatch(
                    batch_id=meta.batch_id,
                    worker_id=meta.worker_id,
                    step=meta.step,
                    batch_index=meta.batch_index,
                    policy_version=meta.policy_version,
                    received_at=meta.received_at,
                    lease=meta.lease,
                    samples=rollout_samples(self._store.read_batch(meta.batch_id)),
                    client=client(batch),
                )
            )
        return PendingResponse(batches=answer, pending_batches=len(waiting), policy_version=step, step=step)

    def record_verdicts(self, request: VerdictRequest, events: Sequence[dict[str, Any]] = ()) -> VerdictResponse:
        """Store one verdict per sample (idempotent for identical verdicts; 404/400/409 otherwise).
        ``events``: store events written in the same transaction as the verdicts (alone when the
        verdicts were stored before); written unless this raises."""
        batch = self._batches.get(request.batch_id)
        if batch is None:
            raise ApiFailure(404, "not_found", f"unknown batch_id {request.batch_id!r}")
        indices = sorted(v.sample_index for v in request.verdicts)
        if indices != list(range(len(batch.task_ids))):
            raise ApiFailure(
                400,
                "bad_request",
                f"need exactly one verdict per sample index 0..{len(batch.task_ids) - 1}, got {len(indices)} verdicts",
            )
        # A rejected sample trains nothing: its log-probs are not kept.
        verdicts = sorted(
            (v if v.accepted or not v.logprobs else v.model_copy(update={"logprobs": []}) for v in request.verdicts),
            key=lambda v: v.sample_index,
        )
        accepted = sum(v.accepted for v in verdicts)
        if accepted:
            self._check_logprobs(batch, verdicts)
        if batch.verdicts is not None and not batch.expired:
            # (A batch the orchestrator expired while a validator was judging it takes the validator's
            # verdicts instead: its samples stay unusable (too old) but the accounting is the validator's.)
            if batch.verdicts != verdicts:
                raise ApiFailure(409, "conflict", f"batch {request.batch_id} already has different verdicts")
            self._store.append_events(events)
        else:
            self._store.write_verdicts(batch.batch_id, verdicts, events)
            batch.verdicts = verdicts
            self._waiting.pop(batch.batch_id, None)
            rejected = [v for v in verdicts if not v.accepted]
            self._metrics.log(
                "verdicts",
                batch_id=batch.batch_id,
                worker_id=batch.worker_id,
                policy_version=batch.policy_version,
                accepted=accepted,
                rejected=len(rejected),
                reasons=dict(Counter(v.reason for v in rejected)),
                # why, for the first rejections (group mates repeat the first reason; a few suffice)
                details={str(v.sample_index): f"{v.reason}: {v.detail}" for v in rejected[:4]},
            )
        return VerdictResponse(
            batch_id=request.batch_id, accepted=accepted, rejected=len(verdicts) - accepted
        )

    def _check_logprobs(self, batch: StoredBatch, verdicts: Sequence[Verdict]) -> None:
        """ApiFailure 400 unless every accepted verdict has one log-prob per completion token: the
        trainer learns from these, never from the worker's claim, so they must be complete."""
        if batch.completion_lengths is None:  # stored before a restart: read back once
            table = self._store.read_batch(batch.batch_id)
            batch.completion_lengths = tuple(len(tokens) for tokens in table.column("completion_tokens").to_pylist())
        lengths = batch.completion_lengths
        for verdict in verdicts:
            if verdict.accepted and len(verdict.logprobs) != lengths[verdict.sample_index]:
                raise ApiFailure(
                    400,
                    "bad_request",
                    f"accepted sample {verdict.sample_index} needs {lengths[verdict.sample_index]} "
                    f"recomputed log-probs (one per completion token), got {len(verdict.logprobs)}",
                )

    # ------------------------------------------------------------------ claims and accounting

    def mark_claimed(self, sample_ids: Iterable[SampleId]) -> None:
        """Record that a claim took these samples."""
        for sample_id in sample_ids:
            self._batches[sample_id.batch_id].claimed.add(sample_id.index)

    def training_samples(self, sample_ids: tuple[SampleId, ...]) -> list[TrainSample]:
        """The trainer's view of claimed samples, in ``sample_ids`` order (read back from the store)."""
        wanted: dict[str, set[int]] = {}
        for sample_id in sample_ids:
            wanted.setdefault(sample_id.batch_id, set()).add(sample_id.index)
        rows: dict[SampleId, TrainSample] = {}
        for batch_id, indices in wanted.items():
            batch = self._batches[batch_id]
            assert batch.verdicts is not None  # claims only ever hold verdicted samples
            table = self._store.read_batch(batch_id)
            for index, sample in train_samples(batch.meta, table, batch.verdicts, indices).items():
                rows[SampleId(batch_id, index)] = sample
        return [rows[s] for s in sample_ids]

    def sample_counts(self) -> tuple[dict[str, Counter[str]], dict[str, Counter[str]]]:
        """Per worker id: counts of ``batches``, ``samples``, ``pending``, ``expired``, ``accepted``,
        ``rejected``; and per worker id the rejected samples by verdict reason."""
        counts: dict[str, Counter[str]] = {}
        reasons: dict[str, Counter[str]] = {}
        count_samples(self._batches.values(), counts, reasons)
        return counts, reasons

    def stored(self) -> list[StoredBatch]:
        """A copy of the stored batches (one C-level ``list()``: safe while the ledger's thread adds
        batches; ``GET /workers`` reads them without the ledger's lock)."""
        return list(self._batches.values())


def count_samples(
    batches: Iterable[StoredBatch], counts: dict[str, Counter[str]], reasons: dict[str, Counter[str]]
) -> None:
    """Add ``batches`` to ``counts`` and ``reasons`` (``BatchBook.sample_counts``)."""
    for batch in batches:
        count = counts.setdefault(batch.worker_id, Counter())
        rejected = reasons.setdefault(batch.worker_id, Counter())
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
                rejected[verdict.reason] += 1
