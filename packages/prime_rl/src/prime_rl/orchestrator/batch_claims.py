"""The batch book's trainer side and counters (``BatchBook``'s mixin; ``batches.py`` holds the rest).

Claims take samples from open batches (``claimed_after``, ``mark_claimed``); the trainer's samples
are read back from the store at claim time (``training_samples``: a retry of an old claim reads
settled batches, or the run's record, ``record.py``); the running counters answer ``GET /workers``
and the stale-drop metrics without a walk over history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import SampleId, TrainSample
from prime_rl.orchestrator.records import train_samples
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.orchestrator.store_schema import StoredBatch

__all__ = ["ClaimsAndCounts"]


class ClaimsAndCounts:
    """Claims, the trainer's samples and the counters of a ``BatchBook`` (which sets the attributes)."""

    _live: dict[str, StoredBatch]
    _store: RolloutStore
    _counts: dict[str, Counter[str]]

    def __getitem__(self, batch_id: str) -> StoredBatch:
        raise NotImplementedError  # BatchBook's

    def claimed_after(self, sample_ids: Iterable[SampleId]) -> dict[str, set[int]]:
        """Each open batch's claimed indices once ``sample_ids`` are claimed too (what the claim writes)."""
        after: dict[str, set[int]] = {}
        for sample_id in sample_ids:
            batch_id = sample_id.batch_id
            if batch_id not in after:
                after[batch_id] = set(self._live[batch_id].claimed)
            after[batch_id].add(sample_id.index)
        return after

    def mark_claimed(self, claimed: dict[str, set[int]]) -> None:
        """Record that a claim took these samples (``claimed_after``'s answer, once written)."""
        for batch_id, indices in claimed.items():
            if batch_id in self._live:
                self._live[batch_id].claimed = indices

    def training_samples(self, sample_ids: tuple[SampleId, ...]) -> list[TrainSample]:
        """The trainer's view of claimed samples, in ``sample_ids`` order (read back from the store)."""
        wanted: dict[str, set[int]] = {}
        for sample_id in sample_ids:
            wanted.setdefault(sample_id.batch_id, set()).add(sample_id.index)
        rows: dict[SampleId, TrainSample] = {}
        for batch_id, indices in wanted.items():
            if batch_id not in self._live and (located := self._store.record.file_of(batch_id)) and not located[1]:
                raise ApiFailure(410, "gone", f"batch {batch_id} is in the run's record ({located[0]}) without its log-probs "
                                 "(orchestrator.keep_claimed_logprobs): resume from a newer checkpoint")  # fmt: skip
            batch = self[batch_id]
            assert batch.verdicts is not None  # claims only ever hold verdicted samples
            table = self._store.read_batch(batch_id)
            for index, sample in train_samples(batch.meta, table, batch.verdicts, indices).items():
                rows[SampleId(batch_id, index)] = sample
        return [rows[s] for s in sample_ids]

    def sample_counts(self) -> tuple[dict[str, Counter[str]], dict[str, Counter[str]]]:
        """Per worker id: counts of ``batches``, ``samples``, ``pending``, ``expired``, ``accepted``,
        ``rejected``; and per worker id the rejected samples by verdict reason (copies of the running
        counters: O(workers), safe to read without the ledger's lock)."""
        counts: dict[str, Counter[str]] = {}
        reasons: dict[str, Counter[str]] = {}
        for worker_id, count in list(self._counts.items()):
            names = dict(count)  # one C-level copy (the ledger's thread may add to it meanwhile)
            counts[worker_id] = Counter({n: v for n, v in names.items() if not n.startswith("reason:")})
            reasons[worker_id] = Counter({n[7:]: v for n, v in names.items() if n.startswith("reason:") and v})
        return counts, reasons

    def dropped(self) -> tuple[int, int]:
        """Samples expired by the orchestrator and rejected as ``stale_policy`` (run totals)."""
        expired = stale_policy = 0
        for count in list(self._counts.values()):
            expired += count["expired"]
            stale_policy += count["reason:stale_policy"]
        return expired, stale_policy
