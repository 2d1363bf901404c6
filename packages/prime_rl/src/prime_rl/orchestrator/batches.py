"""Stored rollout batches and their verdicts: submission checks, validation queue, expiry.

This module holds the book and its submissions; its validator side (the queue awaiting verdicts,
the listings, the verdicts, the expiry) is ``batch_verdicts.py`` and its trainer side (claims and
counters) ``batch_claims.py``, the two mixins ``BatchBook`` is made of.

``BatchBook`` owns every batch the orchestrator has acknowledged (a read-only ``Mapping`` from
batch id to ``StoredBatch``): its metadata, task ids, the lease it answered, its verdicts once
the validator (or the orchestrator's expiry) has judged it, and which of its samples a claim
took. Batch rows live only in the ``RolloutStore`` (payload files, fsynced before the ack).

Memory is sized by open work, not history: only *open* batches (awaiting verdicts, or with
accepted samples a claim could still take) stay in memory (``live``). A batch is *settled* once
nothing can change what it trains (rejected, expired, withheld, fully claimed, too old for any
claim, of a banned worker; the ledger decides, ``settle``): it is closed in the store in the same
transaction as the event that settles it and leaves memory; a lookup of a settled batch reads its
row (one indexed SQLite read). What the rules and ``GET /workers`` need of history is kept as
running counters (per worker: batches, samples, pending, expired, accepted, rejected and rejected
samples per reason; per run: samples dropped past the staleness bound), updated in the store in
the same transaction as the event that moves them. ``load`` reads the open batches and the
counters, never the payload files. Settled batches are compacted into the run's training record at
the trainer's commits (``compact``, ``record.py``), which replaces their rows and payload files.

Pitfall: a batch id is ``{worker_id}-s{step}-b{batch_index}``, so a resubmission is recognised
by id; an identical request body (same SHA-256 of the bytes received) is a duplicate (idempotent
ack), a different one a 409.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import LeaseRecord, RolloutBatch, SubmitResponse
from prime_rl.config import RunConfig
from prime_rl.metrics import MetricsWriter
from prime_rl.orchestrator.batch_claims import ClaimsAndCounts
from prime_rl.orchestrator.batch_verdicts import VerdictsAndListings
from prime_rl.orchestrator.claims import available_samples
from prime_rl.orchestrator.record import RecordFile, compact, stamp
from prime_rl.orchestrator.records import batch_rows
from prime_rl.orchestrator.store import BatchMeta, RolloutStore, StoredRow, StoreError
from prime_rl.orchestrator.store_schema import EXPIRED, StoredBatch

__all__ = ["EXPIRED", "BatchBook", "StoredBatch"]


def _from_row(row: StoredRow) -> StoredBatch:
    meta, task_ids, claimed, verdicts, _ = row
    return StoredBatch(meta, task_ids, verdicts, claimed)


class BatchBook(ClaimsAndCounts, VerdictsAndListings, Mapping[str, StoredBatch]):
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

    # ------------------------------------------------------------------ backpressure

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
