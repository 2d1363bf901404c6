"""The orchestrator's durable store: parquet files plus an fsynced journal, all under one directory.

Layout of ``data_dir``::

    journal.jsonl                  one JSON event per line (registrations, leases, bans, commits, ...)
    batches/<batch_id>.parquet     one submitted rollout batch (one row per sample; batch fields in
                                   the schema metadata key ``prime_rl.batch``)
    verdicts/<batch_id>.parquet    the validator's verdicts of that batch (one row per sample)
    claims/step_<step>.parquet     the sample ids the trainer claimed for a step

Every write is durable before the function returns: parquet files are written to a temporary
name, fsynced, renamed into place and the directory fsynced; journal lines are appended, flushed
and fsynced. So a crash leaves either the old state or the new one, never a half file, and
``load()`` after a restart sees everything that any caller was told succeeded.

Pitfall: a crash in the middle of a journal append can leave a torn last line; ``load`` skips
unparsable lines (only the last one can be torn) instead of refusing to start.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prime_rl.api.protocol import LeaseRecord, SampleId, Verdict
from prime_rl.durable import TEMP_GLOB, append_event, atomic_path, read_events

__all__ = [
    "BATCH_SCHEMA",
    "CLAIM_SCHEMA",
    "VERDICT_SCHEMA",
    "BatchMeta",
    "BatchRecord",
    "ClaimRecord",
    "RolloutStore",
    "StoreError",
]

log = logging.getLogger(__name__)

BATCH_SCHEMA = pa.schema(
    [
        ("sample_index", pa.int32()),
        ("task_id", pa.int64()),
        ("group_index", pa.int32()),
        ("prompt_tokens", pa.list_(pa.int32())),
        ("completion_tokens", pa.list_(pa.int32())),
        ("sampling_seed", pa.int64()),
        ("temperature", pa.float64()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("proofs", pa.binary()),
        ("inference_logprobs", pa.list_(pa.float64())),
        (
            "segments",
            pa.list_(pa.struct([("kind", pa.string()), ("length", pa.int32()), ("turn", pa.int32())])),
        ),
    ]
)
"""One row per sample. Floats are float64 so the stored batch is exactly what was submitted.
``segments`` is null for single-turn samples (and absent from batches stored before episodes)."""

VERDICT_SCHEMA = pa.schema(
    [
        ("sample_index", pa.int32()),
        ("accepted", pa.bool_()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("logprobs", pa.list_(pa.float64())),
    ]
)
"""One row per sample: the validator's decision and recomputed values (``logprobs`` empty if rejected)."""

CLAIM_SCHEMA = pa.schema(
    [("sample_id", pa.string()), ("batch_id", pa.string()), ("sample_index", pa.int32())]
)

_BATCH_META_KEY = b"prime_rl.batch"
_CLAIM_META_KEY = b"prime_rl.claim"


class StoreError(RuntimeError):
    """The store could not read or write its files (disk full, permissions, corrupt file)."""


@dataclass(frozen=True)
class BatchMeta:
    """Batch-level fields of one stored batch (kept as JSON in the parquet schema metadata).

    ``seq``: submission order (0, 1, ...); ``sha256``: digest of the request body as received (a
    retry with the same bytes is a duplicate); ``lease``: the lease it answers (None: unleased).
    """

    batch_id: str
    worker_id: str
    step: int
    batch_index: int
    policy_version: int
    received_at: float
    sha256: str
    seq: int
    lease: LeaseRecord | None

    def to_json(self) -> bytes:
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        fields["lease"] = self.lease.model_dump() if self.lease is not None else None
        return json.dumps(fields).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BatchMeta:
        """Parse ``to_json`` output; KeyError/TypeError/ValueError on a damaged record."""
        fields = json.loads(data)
        lease = fields.pop("lease")
        return cls(**fields, lease=LeaseRecord.model_validate(lease) if lease is not None else None)


@dataclass(frozen=True)
class BatchRecord:
    """A stored batch's metadata and its per-sample task ids."""

    meta: BatchMeta
    task_ids: tuple[int, ...]


@dataclass(frozen=True)
class ClaimRecord:
    """The samples the trainer claimed for ``step``, and the freshness bound they were chosen under."""

    step: int
    min_policy_version: int
    time: float
    sample_ids: tuple[SampleId, ...]


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    try:
        with atomic_path(path) as temporary:
            pq.write_table(table, str(temporary), compression="zstd")
    except OSError as error:
        raise StoreError(f"could not write {path}: {error}") from error


class RolloutStore:
    """Durable storage of one orchestrator (thread-safe writes; one process per directory)."""

    def __init__(self, data_dir: str | Path) -> None:
        self.root = Path(data_dir)
        self.batches_dir = self.root / "batches"
        self.verdicts_dir = self.root / "verdicts"
        self.claims_dir = self.root / "claims"
        for directory in (self.root, self.batches_dir, self.verdicts_dir, self.claims_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.journal_path = self.root / "journal.jsonl"
        self._journal_lock = threading.Lock()
        for stale in self.root.rglob(TEMP_GLOB):  # leftovers of a crash mid-write
            stale.unlink(missing_ok=True)

    # ------------------------------------------------------------- journal

    def append_event(self, event: dict[str, Any]) -> None:
        """Append one event to the journal and fsync it."""
        with self._journal_lock:
            try:
                append_event(self.journal_path, event)
            except OSError as error:
                raise StoreError(f"could not append to {self.journal_path}: {error}") from error

    def events(self) -> Iterator[dict[str, Any]]:
        """Replay the journal in order (a torn last line is skipped with a warning)."""
        return read_events(self.journal_path)

    # ------------------------------------------------------------- batches

    def batch_path(self, batch_id: str) -> Path:
        return self.batches_dir / f"{batch_id}.parquet"

    def write_batch(self, meta: BatchMeta, rows: dict[str, Sequence[Any]]) -> None:
        """Durably store a batch: ``rows`` maps every ``BATCH_SCHEMA`` column to its values."""
        schema = BATCH_SCHEMA.with_metadata({_BATCH_META_KEY: meta.to_json()})
        table = pa.Table.from_pydict(dict(rows), schema=schema)
        _atomic_write_table(table, self.batch_path(meta.batch_id))

    def read_batch(self, batch_id: str) -> pa.Table:
        """The batch's full table (one row per sample)."""
        try:
            return pq.read_table(self.batch_path(batch_id))
        except (OSError, pa.ArrowException) as error:
            raise StoreError(f"could not read batch {batch_id}: {error}") from error

    def batch_records(self) -> list[BatchRecord]:
        """Every stored batch's metadata and task ids, ordered by submission sequence number."""
        records = []
        for path in self.batches_dir.glob("*.parquet"):
            try:
                parquet = pq.ParquetFile(path)
                meta = BatchMeta.from_json(parquet.schema_arrow.metadata[_BATCH_META_KEY])
                task_ids = parquet.read(columns=["task_id"]).column("task_id").to_pylist()
            except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as error:
                raise StoreError(f"corrupt batch file {path}: {error}") from error
            if meta.batch_id != path.stem:
                raise StoreError(f"corrupt batch file {path}: it holds batch {meta.batch_id}")
            records.append(BatchRecord(meta=meta, task_ids=tuple(task_ids)))
        records.sort(key=lambda record: record.meta.seq)
        return records

    # ------------------------------------------------------------- verdicts

    def write_verdicts(self, batch_id: str, verdicts: Sequence[Verdict]) -> None:
        rows = {name: [getattr(v, name) for v in verdicts] for name in VERDICT_SCHEMA.names}
        _atomic_write_table(
            pa.Table.from_pydict(rows, schema=VERDICT_SCHEMA), self.verdicts_dir / f"{batch_id}.parquet"
        )

    def all_verdicts(self) -> dict[str, list[Verdict]]:
        result = {}
        for path in self.verdicts_dir.glob("*.parquet"):
            try:
                rows = pq.read_table(path).to_pylist()
                # Trusted data written by this store: constructed without re-validation.
                result[path.stem] = [Verdict.model_construct(**row) for row in rows]
            except (OSError, pa.ArrowException) as error:
                raise StoreError(f"corrupt verdict file {path}: {error}") from error
        return result

    # ------------------------------------------------------------- claims

    def write_claim(self, claim: ClaimRecord) -> None:
        meta = {"step": claim.step, "min_policy_version": claim.min_policy_version, "time": claim.time}
        schema = CLAIM_SCHEMA.with_metadata({_CLAIM_META_KEY: json.dumps(meta).encode()})
        columns = {
            "sample_id": [str(s) for s in claim.sample_ids],
            "batch_id": [s.batch_id for s in claim.sample_ids],
            "sample_index": [s.index for s in claim.sample_ids],
        }
        table = pa.Table.from_pydict(columns, schema=schema)
        _atomic_write_table(table, self.claims_dir / f"step_{claim.step:010d}.parquet")

    def claims(self) -> list[ClaimRecord]:
        result = []
        for path in sorted(self.claims_dir.glob("step_*.parquet")):
            try:
                table = pq.read_table(path)
                meta = json.loads(table.schema.metadata[_CLAIM_META_KEY])
                sample_ids = zip(table.column("batch_id").to_pylist(), table.column("sample_index").to_pylist(), strict=True)
                result.append(
                    ClaimRecord(
                        step=int(meta["step"]),
                        min_policy_version=int(meta["min_policy_version"]),
                        time=float(meta["time"]),
                        sample_ids=tuple(SampleId(batch_id, index) for batch_id, index in sample_ids),
                    )
                )
            except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as error:
                raise StoreError(f"corrupt claim file {path}: {error}") from error
        return result
