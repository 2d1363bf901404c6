"""Stored rollout batches and their verdicts: submission checks, validation queue, expiry.

``BatchBook`` owns every batch the orchestrator has acknowledged (a read-only ``Mapping`` from
batch id to ``StoredBatch``): its metadata, task ids, the lease it answered, its verdicts once
the validator (or the orchestrator's expiry) has judged it, and which of its samples a claim
took. Batch rows live only in the ``RolloutStore`` (parquet, fsynced before the ack).

Memory is sized by open work, not history: only *open* batches (awaiting verdicts, or with
accepted samples a claim could still take) stay in memory (``live``). A batch is *settled* once
nothing can change what it trains (rejected, expired, withheld, fully claimed, too old for any
claim, of a banned worker; the ledger decides, ``settle``): it is closed in the store in the same
transaction as the event that settles it and leaves memory; a lookup of a settled batch reads its
row (one indexed SQLite read). What the rules and ``GET /workers`` need of history is kept as
running counters (per worker: batches, samples, pending, expired, accepted, rejected and rejected
samples per reason; per run: samples dropped past the staleness bound), updated in the store in
the same transaction as the event that moves them. ``load`` reads the open batches and the
counters, never the parquet files. Settled batches are compacted into the run's training record at
the trainer's commits (``compact``, ``record.py``), which replaces their rows and payload files.

Pitfall: a batch id is ``{worker_id}-s{step}-b{batch_index}``, so a resubmission is recognised
by id; an identical request body (same SHA-256 of the bytes received) is a duplicate (idempotent
ack), a different one a 409.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
from pydantic import TypeAdapter

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import (
    LeaseRecord,
    PendingBatch,
    PendingResponse,
    RolloutBatch,
    SubmitResponse,
    ValidatorLeaseResponse,
    Verdict,
    VerdictRequest,
    VerdictResponse,
)
from prime_rl.config import RunConfig
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.batch_claims import ClaimsAndCounts
from prime_rl.orchestrator.claims import available_samples
from prime_rl.orchestrator.payloads import PayloadCache
from prime_rl.orchestrator.record import RecordFile, compact, stamp
from prime_rl.orchestrator.records import batch_rows, rollout_samples, sample_documents
from prime_rl.orchestrator.store import BatchMeta, RolloutStore, StoredRow, StoreError
from prime_rl.orchestrator.store_schema import (
    EXPIRED,
    StoredBatch,
    conform_batch,
    counter_delta,
    sample_counts,
)

__all__ = ["EXPIRED", "BatchBook", "Listing", "StoredBatch", "UnreadSamples"]

log = logging.getLogger(__name__)

_DOCUMENT: TypeAdapter[Any] = TypeAdapter(Any)  # plain JSON values, serialized as the models serialize theirs

Listing = TypeVar("Listing", PendingResponse, ValidatorLeaseResponse)
"""A validator's listing: ``GET /validator/pending``'s answer or ``POST /validator/leases``'."""


class UnreadSamples:
    """The samples of a validator's listing, chosen under the ledger's lock and read after it
    (``into``; ``json``, the answer's body): from the payload files and their cache only, never the
    store's database, so on any thread while the ledger serves. A listing of 8 batches builds 64 samples with their token
    lists: 14-15 ms at the median in the closed loop of 256 identities, which every other ledger
    call waited behind when it ran there (``benchmarks/results/closed_loop.md``, run 22). A batch
    settled meanwhile (its payload file deleted once it is compacted into the record) is no longer
    pending, and is left out of the answer."""

    def __init__(self, sources: list[Path | pa.Table], payloads: PayloadCache) -> None:
        self._sources = sources  # per batch of the listing: its payload file, or its table read already
        self._payloads = payloads

    def into(self, answer: Listing) -> Listing:
        """``answer`` (whose ``batches`` are the listing's, in order) with each batch's samples, and
        without a batch settled meanwhile."""
        batches = []
        for batch, source in zip(answer.batches, self._sources, strict=True):
            table = self._read(batch, source)
            if table is not None:
                batches.append(batch.model_copy(update={"samples": rollout_samples(table)}))
        return answer.model_copy(update={"batches": batches})

    def json(self, answer: Listing, *, packed: bool = False) -> bytes:
        """``into(answer).model_dump_json()``, byte for byte, built from the payload tables without
        the sample models (``records.sample_documents``): what a route sends. ``packed``: the samples'
        token and log-prob lists in their packed form (``api.fields.packed_array``)."""
        document = answer.model_dump(mode="json")
        batches, tables = [], []
        for batch, source, listed in zip(document["batches"], self._sources, answer.batches, strict=True):
            table = self._read(listed, source)
            if table is not None:
                batches.append(batch)
                tables.append(table)
        # One conversion for the whole listing: per batch, its fixed costs outweighed its 8 samples.
        whole = pa.concat_tables([conform_batch(table) for table in tables]) if tables else None
        samples = iter(sample_documents(whole, packed=packed) if whole is not None else [])
        for batch, table in zip(batches, tables, strict=True):
            batch["samples"] = list(itertools.islice(samples, table.num_rows))
        document["batches"] = batches
        return _DOCUMENT.dump_json(document)

    def _read(self, batch: PendingBatch, source: Path | pa.Table) -> pa.Table | None:
        """The payload table of a batch of the listing; None when it was settled meanwhile."""
        if not isinstance(source, Path):
            return source
        try:
            return self._payloads.read(source)
        except (OSError, pa.ArrowException) as error:  # settled and compacted since it was listed
            log.info("batch %s left out of a validator's listing: %s", batch.batch_id, error)
            return None


FRESH_TURN = 4
"""In the validator's queue, one place in this many goes to a fresh identity's batch (``pending``)."""


def _from_row(row: StoredRow) -> StoredBatch:
    meta, task_ids, claimed, verdicts, _ = row
    return StoredBatch(meta, task_ids, verdicts, claimed)


class BatchBook(ClaimsAndCounts, Mapping[str, StoredBatch]):
    """All stored batches of a run (see module docstring): open ones from memory, settled ones
    read from the store on demand (iterating reads every id: an audit, O(history))."""

    def __init__(
        self, config: RunConfig, store: RolloutStore, metrics: MetricsWriter, clock: Callable[[], float]
    ) -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._live: dict[str, StoredBatch] = {}  # open batches, in submission order
        self._waiting: dict[str, StoredBatch] = {}  # awaiting verdicts, in submission order
        self._counts: dict[str, Counter[str]] = {}  # per worker (store counters, scope "worker")
        self._run: Counter[str] = Counter()  # per run (store counters, scope "run")
        self._stored = 0  # batches stored: the next sequence number
        self._records_deferred = False  # ``defer_records``
        self._records_upto = -1  # with it: the last commit's newest step due for the record

    def __getitem__(self, batch_id: str) -> StoredBatch:
        batch = self._live.get(batch_id)
        if batch is not None:
            return batch
        row = self._store.batch(batch_id)
        if row is None:
            raise KeyError(batch_id)
        return _from_row(row)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._live or (isinstance(batch_id, str) and self._store.batch_sha256(batch_id) is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._store.batch_ids())

    def __len__(self) -> int:
        return self._stored

    def live(self) -> list[StoredBatch]:
        """The open batches, in submission order (what every rule walks: open work only)."""
        return list(self._live.values())

    def load(self) -> list[StoredBatch]:
        """Rebuild the open batches and the counters from the store; returns the open batches in order."""
        for row in self._store.open_batches():
            batch = _from_row(row)
            self._live[batch.batch_id] = batch
            if batch.verdicts is None:
                self._waiting[batch.batch_id] = batch
        self._counts = self._store.counters("worker")
        self._run = self._store.counters("run").get("", Counter())
        self._stored = self._store.batch_count()
        return self.live()

    def _count(self, worker_id: str, delta: dict[str, int]) -> None:
        counts = self._counts.setdefault(worker_id, Counter())
        counts.update(delta)

    def settle(self, batch_ids: Sequence[str], past_bound: int = 0) -> None:
        """Close ``batch_ids`` (settled: they leave memory) and add ``past_bound`` samples dropped past
        the staleness bound to the run counter, in one store transaction."""
        if not batch_ids and not past_bound:
            return
        self._store.settle(batch_ids, {"past_bound": past_bound} if past_bound else {})
        self._run["past_bound"] += past_bound
        for batch_id in batch_ids:
            self._live.pop(batch_id, None)
            self._waiting.pop(batch_id, None)

    def is_open(self, batch_id: str) -> bool:
        return batch_id in self._live

    def past_bound(self) -> int:
        """Samples dropped past the staleness bound by settled batches (run total)."""
        return self._run["past_bound"]

    def compact(self, step: int, lag: int) -> list[RecordFile]:
        """At the commit of ``step``: stamp the batches settled since the last commit with it, and write
        the record of the steps ``<= step - lag`` (``record.py``; with ``defer_records``, the server
        does). A failure is logged, never raised: the commit is stored already, and the next commit
        tries again."""
        try:
            stamp(self._store, step)
            if self._records_deferred:
                self._records_upto = step - lag
                return []
            files = compact(self._store, step - lag, self._config.orchestrator.keep_claimed_logprobs)
        except (StoreError, OSError) as error:
            self._metrics.log("record_failed", step=step, error=str(error))
            return []
        for record in files:
            record.log(self._metrics)
        return files

    def defer_records(self) -> None:
        """From now on a commit only stamps, and ``records_upto`` says up to which step the record is
        due; the server writes it outside the ledger's lock (``record_writer.py``)."""
        self._records_deferred = True

    @property
    def records_upto(self) -> int:
        """With ``defer_records``: the newest step due for the record at the last commit (-1: none)."""
        return self._records_upto

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
        self,
        batch: RolloutBatch,
        body_sha256: str,
        rows: dict[str, Sequence[Any]],
        lease: LeaseRecord | None,
        *,
        payload: Path | None = None,
    ) -> SubmitResponse:
        """Store ``batch`` (``body_sha256``: digest of the request body as received; rows from
        ``check``; ``lease``: the one it answers, None if unleased; ``payload``: its payload file,
        written already, ``RolloutStore.write_payload``) durably, or recognise it as a duplicate;
        ApiFailure 409 if a different body was stored under the same id."""
        batch_id = f"{batch.worker_id}-s{batch.step}-b{batch.batch_index}"
        existing = self._live.get(batch_id)
        sha256 = existing.meta.sha256 if existing is not None else self._store.batch_sha256(batch_id)
        if sha256 is not None:
            if sha256 == body_sha256:
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
            seq=self._stored,
            lease=lease,
        )
        samples = batch.samples
        delta = {"batches": 1, "samples": len(samples), "pending": len(samples)}
        self._store.write_batch(meta, rows, delta, payload=payload)
        self._stored += 1
        self._count(batch.worker_id, delta)
        self._live[batch_id] = self._waiting[batch_id] = StoredBatch(
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
        self,
        min_policy_version: int,
        usable: Callable[[StoredBatch], bool],
        filter_zero_advantage: bool,
        established: Callable[[str], bool],
    ) -> tuple[int, int]:
        """Samples that may still reach the trainer: fresh batches awaiting validation and accepted
        samples the next claim could take (fresh, unclaimed, informative if the trainer filters
        zero-advantage groups), of the batches ``usable`` admits (not banned, not held); and, of them,
        the samples awaiting validation of workers not ``established`` (unproven work). One walk of
        the open batches. Rejected, stale and uninformative samples do not count, so a full buffer
        always drains (pitfall: counting them deadlocked backpressure); nor do open leases (pitfall:
        counting them let a few identities that take leases and never answer starve every honest
        worker)."""
        fresh = [b for b in self._live.values() if b.policy_version >= min_policy_version and usable(b)]
        pending = unproven = 0
        for batch in fresh:
            if batch.verdicts is None:
                pending += len(batch.task_ids)
                if not established(batch.worker_id):
                    unproven += len(batch.task_ids)
        available = available_samples(
            fresh, min_policy_version=min_policy_version, filter_zero_advantage=filter_zero_advantage
        )
        return pending + available, unproven

    def waiting(self) -> list[StoredBatch]:
        """Batches awaiting verdicts, in submission order."""
        return list(self._waiting.values())

    def waiting_ids(self) -> Mapping[str, StoredBatch]:
        """The batches awaiting verdicts by id (read-only view: ``in`` is O(1))."""
        return self._waiting

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
                delta = counter_delta(sample_counts(len(verdicts), verdicts), sample_counts(len(verdicts), None))
                self._store.write_verdicts(
                    batch.batch_id, verdicts, worker_id=batch.worker_id, counters=delta, settle=True
                )
                self._count(batch.worker_id, delta)
                batch.verdicts = verdicts
                del self._waiting[batch.batch_id]
                del self._live[batch.batch_id]
                self._metrics.log(
                    "expired", batch_id=batch.batch_id, worker_id=batch.worker_id, policy_version=version
                )
                expired.append(batch)
        return expired

    def pending_unread(
        self,
        limit: int,
        step: int,
        *,
        established: Callable[[str], bool] = lambda worker_id: True,
        client: Callable[[StoredBatch], str] = lambda batch: "",
        free: Callable[[str], bool] = lambda batch_id: True,
    ) -> tuple[PendingResponse, UnreadSamples]:
        """Up to ``limit`` batches awaiting verdicts, their samples not read yet (``UnreadSamples``):
        freshest policy first (usable for the most steps), then submission order, with the batches of
        ``established`` workers (accepted work) ahead of the others' but every ``FRESH_TURN``-th
        place kept for the oldest batch of a fresh identity while one waits, so unproven work cannot
        delay established verdicts by more than one batch in ``FRESH_TURN`` and a newcomer is never
        starved. ``client(batch)``: the client address its lease was handed to
        (``PendingBatch.client``); ``free(batch_id)``: whether the batch may be served (not leased to
        another validator: ``validator_leases.py``); the rules order the free batches only."""
        waiting = self.waiting()
        servable = [batch for batch in waiting if free(batch.batch_id)]
        servable.sort(key=lambda batch: (-batch.policy_version, batch.seq))
        ahead = [batch for batch in servable if established(batch.worker_id)]
        fresh = [batch for batch in servable if not established(batch.worker_id)]
        fresh.sort(key=lambda batch: batch.seq)
        ordered: list[StoredBatch] = []
        while len(ordered) < limit and (ahead or fresh):
            fresh_turn = len(ordered) % FRESH_TURN == FRESH_TURN - 1 or not ahead
            ordered.append(fresh.pop(0) if fresh_turn and fresh else ahead.pop(0))
        answer, sources = [], []
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
                    samples=[],
                    client=client(batch),
                )
            )
            path = self._store.payload_path(meta.batch_id)
            sources.append(path if path is not None else self._store.read_batch(meta.batch_id))
        listing = PendingResponse(batches=answer, pending_batches=len(waiting), policy_version=step, step=step)
        return listing, UnreadSamples(sources, self._store.payloads)

    def record_verdicts(
        self,
        request: VerdictRequest,
        events: Sequence[dict[str, Any]] = (),
        keep_open: Callable[[StoredBatch, Sequence[Verdict]], bool] = lambda batch, verdicts: True,
        evidence: Sequence[tuple[str, str]] = (),
    ) -> VerdictResponse:
        """Store one verdict per sample (idempotent for identical verdicts; 404/400/409 otherwise).
        ``events``: store events written in the same transaction as the verdicts (alone when the
        verdicts were stored before); written unless this raises. ``keep_open(batch, verdicts)``:
        whether the batch stays open after these verdicts (else it settles in the same transaction;
        a batch settled before stays settled). ``evidence``: the run's evidence ledger rows this judgement
        changes, written with the verdicts (``evidence_ledger.py``)."""
        batch = self._live.get(request.batch_id)
        if batch is None and (row := self._store.batch(request.batch_id)) is not None:
            batch = _from_row(row)
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
        if batch.batch_id not in self._live and (located := self._store.record.file_of(batch.batch_id)):
            # Compacted (settled long ago): its verdicts are final; an identical retry is answered as before.
            drop = not located[1] and batch.claimed
            same = [v.model_copy(update={"logprobs": []}) if drop and v.sample_index in batch.claimed else v for v in verdicts]
            if batch.verdicts != same:
                raise ApiFailure(409, "conflict", f"batch {request.batch_id} is settled in the run's record ({located[0]})")
        elif batch.verdicts is not None and not batch.expired:
            # (A batch the orchestrator expired while a validator was judging it takes the validator's
            # verdicts instead: its samples stay unusable (too old) but the accounting is the validator's.)
            if batch.verdicts != verdicts:
                raise ApiFailure(409, "conflict", f"batch {request.batch_id} already has different verdicts")
            self._store.append_events(events)
        else:
            delta = counter_delta(sample_counts(len(verdicts), verdicts), sample_counts(len(verdicts), batch.verdicts))
            settle = batch.batch_id not in self._live or not keep_open(batch, verdicts)
            self._store.write_verdicts(
                batch.batch_id, verdicts, events, worker_id=batch.worker_id, counters=delta, settle=settle,
                evidence=evidence, judge=(request.validator_id, request.prefilled),
            )
            self._count(batch.worker_id, delta)
            batch.verdicts = verdicts
            self._waiting.pop(batch.batch_id, None)
            if settle:
                self._live.pop(batch.batch_id, None)
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
