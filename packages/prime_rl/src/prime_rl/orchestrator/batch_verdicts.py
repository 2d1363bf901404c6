"""The batch book's validator side (``BatchBook``'s mixin; ``batches.py`` holds the rest): the
batches awaiting verdicts, the validators' listings and the verdicts they post, and the expiry of
batches no step can use any more.

A listing is chosen under the ledger's lock (``pending_unread``) and its samples are read after it
(``UnreadSamples``), off the ledger's thread. A verdict is stored once per batch, idempotently for
an identical retry, in the same store transaction as the counters it moves and, when it settles
the batch, the batch's close.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
from pydantic import TypeAdapter

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import (
    PendingBatch,
    PendingResponse,
    ValidatorLeaseResponse,
    Verdict,
    VerdictRequest,
    VerdictResponse,
)
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.payloads import PayloadCache
from prime_rl.orchestrator.records import rollout_samples, sample_documents
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.orchestrator.store_schema import (
    EXPIRED,
    StoredBatch,
    conform_batch,
    counter_delta,
    sample_counts,
)

__all__ = ["FRESH_TURN", "Listing", "UnreadSamples", "VerdictsAndListings"]

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


class VerdictsAndListings:
    """The validation queue, listings and verdicts of a ``BatchBook`` (which sets the attributes)."""

    _live: dict[str, StoredBatch]
    _waiting: dict[str, StoredBatch]
    _store: RolloutStore
    _metrics: MetricsWriter

    def __getitem__(self, batch_id: str) -> StoredBatch:
        raise NotImplementedError  # BatchBook's

    def _count(self, worker_id: str, delta: dict[str, int]) -> None:
        raise NotImplementedError  # BatchBook's

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
        try:
            batch = self[request.batch_id]
        except KeyError:
            raise ApiFailure(404, "not_found", f"unknown batch_id {request.batch_id!r}") from None
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
