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
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "BATCH_SCHEMA",
    "CLAIM_SCHEMA",
    "VERDICT_SCHEMA",
    "BatchRecord",
    "ClaimRecord",
    "RolloutStore",
    "StoreError",
    "StoredVerdict",
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
    ]
)
"""One row per sample. Floats are float64 so the stored batch is exactly what was submitted."""

VERDICT_SCHEMA = pa.schema(
    [
        ("sample_index", pa.int32()),
        ("accepted", pa.bool_()),
        ("reason", pa.string()),
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
class BatchRecord:
    """Batch-level fields of a stored batch (``meta``) and its per-sample task ids."""

    batch_id: str
    meta: dict[str, Any]
    task_ids: tuple[int, ...]


@dataclass(frozen=True)
class StoredVerdict:
    """A verdict as stored; ``logprobs``: the validator's per-token log-probs (empty if rejected)."""

    sample_index: int
    accepted: bool
    reason: str
    reward: float
    advantage: float
    logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class ClaimRecord:
    step: int
    meta: dict[str, Any]
    sample_ids: tuple[str, ...]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as error:
        tmp.unlink(missing_ok=True)
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
        for stale in self.root.rglob(".*.tmp-*"):  # leftovers of a crash mid-write
            stale.unlink(missing_ok=True)

    # ------------------------------------------------------------- journal

    def append_event(self, event: dict[str, Any]) -> None:
        """Append one event to the journal and fsync it."""
        line = json.dumps(event, separators=(",", ":"), allow_nan=False) + "\n"
        with self._journal_lock:
            try:
                with open(self.journal_path, "a", encoding="utf-8") as handle:
                    handle.write(line)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as error:
                raise StoreError(f"could not append to {self.journal_path}: {error}") from error

    def events(self) -> Iterator[dict[str, Any]]:
        """Replay the journal in order (a torn last line is skipped with a warning)."""
        if not self.journal_path.exists():
            return
        with open(self.journal_path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("journal line %d is torn (crash during a write); skipped", number)
                    continue
                if isinstance(event, dict):
                    yield event

    # ------------------------------------------------------------- batches

    def batch_path(self, batch_id: str) -> Path:
        return self.batches_dir / f"{batch_id}.parquet"

    def write_batch(self, batch_id: str, meta: dict[str, Any], rows: dict[str, Sequence[Any]]) -> None:
        """Durably store a batch: ``rows`` maps every ``BATCH_SCHEMA`` column to its values."""
        schema = BATCH_SCHEMA.with_metadata({_BATCH_META_KEY: json.dumps(meta).encode()})
        table = pa.Table.from_pydict(dict(rows), schema=schema)
        _atomic_write_table(table, self.batch_path(batch_id))

    def read_batch(self, batch_id: str) -> tuple[dict[str, Any], pa.Table]:
        """The batch's metadata and full table."""
        try:
            table = pq.read_table(self.batch_path(batch_id))
        except (OSError, pa.ArrowException) as error:
            raise StoreError(f"could not read batch {batch_id}: {error}") from error
        return json.loads(table.schema.metadata[_BATCH_META_KEY]), table

    def batch_records(self) -> list[BatchRecord]:
        """Every stored batch's metadata and task ids, ordered by submission sequence number."""
        records = []
        for path in self.batches_dir.glob("*.parquet"):
            try:
                parquet = pq.ParquetFile(path)
                meta = json.loads(parquet.schema_arrow.metadata[_BATCH_META_KEY])
                task_ids = parquet.read(columns=["task_id"]).column("task_id").to_pylist()
            except (OSError, pa.ArrowException, KeyError, ValueError) as error:
                raise StoreError(f"corrupt batch file {path}: {error}") from error
            records.append(BatchRecord(batch_id=path.stem, meta=meta, task_ids=tuple(task_ids)))
        records.sort(key=lambda record: record.meta["seq"])
        return records

    # ------------------------------------------------------------- verdicts

    def write_verdicts(self, batch_id: str, verdicts: Sequence[StoredVerdict]) -> None:
        rows = {
            "sample_index": [v.sample_index for v in verdicts],
            "accepted": [v.accepted for v in verdicts],
            "reason": [v.reason for v in verdicts],
            "reward": [v.reward for v in verdicts],
            "advantage": [v.advantage for v in verdicts],
            "logprobs": [list(v.logprobs) for v in verdicts],
        }
        _atomic_write_table(
            pa.Table.from_pydict(rows, schema=VERDICT_SCHEMA), self.verdicts_dir / f"{batch_id}.parquet"
        )

    def all_verdicts(self) -> dict[str, list[StoredVerdict]]:
        result = {}
        for path in self.verdicts_dir.glob("*.parquet"):
            try:
                rows = pq.read_table(path).to_pylist()
            except (OSError, pa.ArrowException) as error:
                raise StoreError(f"corrupt verdict file {path}: {error}") from error
            result[path.stem] = [
                StoredVerdict(**{**row, "logprobs": tuple(row.get("logprobs") or ())}) for row in rows
            ]
        return result

    # ------------------------------------------------------------- claims

    def write_claim(self, step: int, meta: dict[str, Any], sample_ids: Sequence[str]) -> None:
        batch_ids, indices = [], []
        for sample_id in sample_ids:
            batch_id, index = sample_id.rsplit("/", 1)
            batch_ids.append(batch_id)
            indices.append(int(index))
        schema = CLAIM_SCHEMA.with_metadata({_CLAIM_META_KEY: json.dumps({**meta, "step": step}).encode()})
        table = pa.Table.from_pydict(
            {"sample_id": list(sample_ids), "batch_id": batch_ids, "sample_index": indices}, schema=schema
        )
        _atomic_write_table(table, self.claims_dir / f"step_{step:010d}.parquet")

    def claims(self) -> list[ClaimRecord]:
        result = []
        for path in sorted(self.claims_dir.glob("step_*.parquet")):
            try:
                table = pq.read_table(path)
                meta = json.loads(table.schema.metadata[_CLAIM_META_KEY])
            except (OSError, pa.ArrowException, KeyError, ValueError) as error:
                raise StoreError(f"corrupt claim file {path}: {error}") from error
            result.append(
                ClaimRecord(
                    step=int(meta["step"]), meta=meta, sample_ids=tuple(table.column("sample_id").to_pylist())
                )
            )
        return result
