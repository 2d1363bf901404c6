"""The run's training record: settled batches compacted into one parquet file per step.

A settled batch (claimed, rejected, expired, withheld, too old, of a banned worker: ``batches.py``)
no longer changes; it is history, and history lives on disk in a form an audit reads, not in the
store's per-batch rows and payload files. Its life after it settles:

  1. Settling queues it (``record_queue``, in the transaction that settles it).
  2. The trainer's commit of step ``S`` stamps every queued, unstamped batch with ``S``: the record
     of step ``S`` holds the batches that settled while the run was at step ``S`` (the samples a
     claim of ``S`` trained, and every batch rejected or expired meanwhile). A sample trained at ``S``
     whose batch had samples left for a later claim is in a later record: ``claim_step`` says when
     it trained.
  3. ``compact`` (called at each commit) turns the stamped steps at least ``lag`` steps old into one
     file each, ``<data_dir>/record/step_<S>.parquet`` (``RECORD_SCHEMA``: one row per sample; what
     was trained, the verdicts, who judged), written to a temporary name, fsynced, renamed, the
     folder fsynced. Then, in one transaction: the ``records`` row, one narrow ``compacted`` row per
     batch (its digest: a resubmission stays a duplicate) and the deletion of its ``batches``,
     ``verdicts``, ``judges`` and queue rows; a group fsync of the log; only then are its payload
     files deleted. A crash before the transaction redoes the step (same file name, same content);
     after it, the store's open deletes the payload files left behind (``finish``). Nothing is lost
     at any point, and memory holds nothing of it.

``lag`` (``Ledger``: the trainer's ``checkpoint_every * keep_checkpoints``) keeps the steps a
trainer restarting from its oldest checkpoint may claim again out of the record: their log-probs
are still in the store. A claim of an older step is refused (410) unless the record kept them.

Per-token data of trained samples (the validator's log-probs, the worker's inference log-probs, the
toploc proofs) is dropped from the record unless ``orchestrator.keep_claimed_logprobs``; samples
that were never trained keep theirs (what an audit of a rejection looks at). Reads of compacted
batches (``RecordReader``) go through the store's usual calls (``RolloutStore.batch``,
``read_batch``, ``batch_records``, ``all_verdicts``), so audits and replays keep working.

Pruning (``prune``): deleting the record files of steps before ``N`` loses only what they hold
(an audit's history); the orchestrator reads a record file only when it looks up a compacted
batch (a validator's late retry, a restart replaying a lease that had not folded), and ``prune``
keeps the files such a lease needs. Run it with the orchestrator stopped (it takes the store's lock):
``python -m prime_rl.orchestrator.record_cli prune <data_dir> --before N``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prime_rl.api.protocol import LeaseRecord, Verdict
from prime_rl.durable import atomic_path, fsync_dir
from prime_rl.orchestrator.payloads import PayloadCache, payload_batch_id
from prime_rl.orchestrator.store_schema import (
    BATCH_META_KEY,
    BATCH_SCHEMA,
    BatchMeta,
    StoredRow,
    StoreError,
    conform_batch,
    verdict_rows,
)
from prime_rl.statedb import StateDB


class StoreView(Protocol):
    """What the record needs of ``store.RolloutStore`` (which imports this module)."""

    root: Path
    batches_dir: Path
    db: StateDB
    record: RecordReader
    payloads: PayloadCache

    def batch_path(self, batch_id: str) -> Path: ...

__all__ = [
    "RECORD_DIR", "RECORD_SCHEMA", "RecordFile", "RecordReader", "StepPlan", "compact", "due_steps", "finish", "plan_step",
    "prune", "settle_step", "stamp", "write_step",
]  # fmt: skip

log = logging.getLogger(__name__)

RECORD_DIR = "record"
MAX_BATCHES = 4096
"""Batches one compaction writes at most (a step with more, such as a backlog a store written before
version 4 queued, takes several commits: ``step_<S>.1.parquet``, ...)."""
PER_TOKEN = ("proofs", "inference_logprobs")
"""Payload columns dropped for trained samples unless ``keep_claimed_logprobs`` (with ``logprobs``)."""

RECORD_SCHEMA = pa.schema(
    [
        ("record_step", pa.int64()),
        ("batch_id", pa.string()),
        ("seq", pa.int64()),
        ("worker_id", pa.string()),
        ("step", pa.int64()),
        ("batch_index", pa.int64()),
        ("policy_version", pa.int64()),
        ("received_at", pa.float64()),
        ("sha256", pa.string()),
        ("lease", pa.string()),
        *[BATCH_SCHEMA.field(name) for name in BATCH_SCHEMA.names],
        ("prompt_length", pa.int32()),
        ("completion_length", pa.int32()),
        ("claim_step", pa.int64()),
        ("accepted", pa.bool_()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("verdict_reward", pa.float64()),
        ("verdict_advantage", pa.float64()),
        ("logprobs", pa.list_(pa.float64())),
        ("beyond_tolerance", pa.int64()),
        ("validator", pa.string()),
        ("prefilled", pa.bool_()),
    ]
)
"""One row per sample: the batch's fields (``BatchMeta``; ``lease`` as JSON), the payload as submitted
(``BATCH_SCHEMA``; ``proofs`` and ``inference_logprobs`` null when dropped), token counts,
``claim_step`` (null: never trained), the verdict (``logprobs`` null when dropped), ``validator``
(null: the orchestrator's expiry, or a validator that did not name itself) and ``prefilled`` (null:
not counted in the run's evidence ledger)."""


@dataclass(frozen=True)
class RecordFile:
    """One compacted step: its file (under ``record/``), batches, samples, bytes, and whether it kept
    the trained samples' per-token data."""

    step: int
    file: str
    batches: int
    samples: int
    bytes: int
    logprobs: bool

    def log(self, metrics: Any) -> None:
        """The metrics event ``record`` (a ``MetricsWriter``'s ``log``)."""
        metrics.log("record", step=self.step, file=self.file, batches=self.batches, samples=self.samples, bytes=self.bytes)


def stamp(store: StoreView, step: int) -> None:
    """Stamp the queued, unstamped settled batches with ``step`` (the step being committed)."""
    with store.db.transaction() as connection:
        connection.execute("UPDATE record_queue SET step = ? WHERE step IS NULL", (step,))


def _chunks(items: Sequence[str], size: int = 500) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _claim_steps(store: StoreView, batches: dict[str, BatchMeta], step: int) -> dict[tuple[str, int], int]:
    """The claim step of each claimed sample of ``batches`` (a claim of step ``s`` takes versions <= ``s``)."""
    if not batches:
        return {}
    low = min(meta.policy_version for meta in batches.values())
    steps: dict[tuple[str, int], int] = {}
    for claim_step, text in store.db.read("SELECT step, sample_ids FROM claims WHERE step BETWEEN ? AND ?", (low, step)):
        for batch_id, index in json.loads(text):
            if batch_id in batches:
                steps[(batch_id, int(index))] = int(claim_step)
    return steps


def _unfolded(store: StoreView, meta: BatchMeta) -> bool:
    rows = store.db.read(
        "SELECT 1 FROM events WHERE worker_id = ? AND batch_index = ? AND kind = 'lease' LIMIT 1",
        (meta.worker_id, meta.batch_index),
    )
    return bool(rows)


def _batch_columns(
    store: StoreView, step: int, row: Sequence[Any], claim_steps: dict[tuple[str, int], int], keep: bool
) -> dict[str, Any]:
    """One batch's ``RECORD_SCHEMA`` columns as lists of values, but for its payload's (``_PAYLOAD``:
    the payload table; ``_KEPT``: whether each sample keeps its per-token data), which ``_step_table``
    makes for the whole step at once."""
    batch_id, meta_text, task_ids_text, claimed_text, verdicts_text, file, validator, prefilled = row
    meta = BatchMeta.from_json(meta_text.encode())
    path = store.batches_dir / file if file else store.batch_path(batch_id)
    try:
        payload = store.payloads.read(path)
    except FileNotFoundError:  # lost before (a damaged store): what the rows know, rather than no record at all
        log.warning("record of step %d: batch %s has no payload file %s; recorded without it", step, batch_id, path)
        indices = list(range(len(json.loads(task_ids_text))))
        payload = pa.table({"sample_index": pa.array(indices, pa.int32()), "task_id": json.loads(task_ids_text)})
        payload = payload.append_column("prompt_tokens", pa.array([[]] * len(indices), pa.list_(pa.int32())))
        payload = payload.append_column("completion_tokens", pa.array([[]] * len(indices), pa.list_(pa.int32())))
    except (OSError, pa.ArrowException) as error:
        raise StoreError(f"could not read batch {batch_id} for the record: {error}") from error
    n = payload.num_rows
    claimed = set(json.loads(claimed_text))
    verdicts = {int(v["sample_index"]): v for v in verdict_rows(verdicts_text)} if verdicts_text else {}
    indices = payload.column("sample_index").to_pylist()
    columns: dict[str, Any] = {
        "record_step": [step] * n, "batch_id": [batch_id] * n, "seq": [meta.seq] * n, "worker_id": [meta.worker_id] * n,
        "step": [meta.step] * n, "batch_index": [meta.batch_index] * n, "policy_version": [meta.policy_version] * n,
        "received_at": [meta.received_at] * n, "sha256": [meta.sha256] * n,
        "lease": [None if meta.lease is None else meta.lease.model_dump_json()] * n,
    }  # fmt: skip
    columns[_PAYLOAD] = conform_batch(payload)
    columns[_KEPT] = [keep or index not in claimed for index in indices]
    columns["claim_step"] = [claim_steps.get((batch_id, index)) for index in indices]
    judged = [verdicts.get(index) for index in indices]
    columns["accepted"] = [None if v is None else bool(v["accepted"]) for v in judged]
    columns["reason"] = [None if v is None else v["reason"] for v in judged]
    columns["detail"] = [None if v is None else v.get("detail", "") for v in judged]
    columns["verdict_reward"] = [None if v is None else v["reward"] for v in judged]
    columns["verdict_advantage"] = [None if v is None else v["advantage"] for v in judged]
    columns["logprobs"] = [
        None if v is None or not (keep or index not in claimed) else v.get("logprobs", [])
        for index, v in zip(indices, judged, strict=True)
    ]
    columns["beyond_tolerance"] = [None if v is None else int(v.get("beyond_tolerance", 0)) for v in judged]
    columns["validator"] = [validator] * n
    columns["prefilled"] = [None if prefilled is None else bool(prefilled)] * n
    return columns


_PAYLOAD, _KEPT = "_payload", "_kept"


def _step_table(batches: Sequence[dict[str, Any]]) -> pa.Table:
    """The record table of a step's batches (``_batch_columns``), each column made once for the whole
    step: one Arrow conversion per column of values, one concatenation of the payloads, one mask of
    the per-token data. Made per batch and concatenated, a step of some 30 batches paid the fixed cost
    of each of its 35 column operations 30 times, more than the values themselves cost."""
    if not batches:
        return RECORD_SCHEMA.empty_table()
    payload = pa.concat_tables([batch[_PAYLOAD] for batch in batches])
    kept = pa.array([k for batch in batches for k in batch[_KEPT]], pa.bool_())
    columns: dict[str, Any] = {}
    for field in BATCH_SCHEMA:
        column = payload.column(field.name)
        columns[field.name] = pc.if_else(kept, column, pa.nulls(len(kept), field.type)) if field.name in PER_TOKEN else column
    columns["prompt_length"] = pc.list_value_length(payload.column("prompt_tokens")).cast(pa.int32())
    columns["completion_length"] = pc.list_value_length(payload.column("completion_tokens")).cast(pa.int32())
    for field in RECORD_SCHEMA:
        if field.name not in columns:
            columns[field.name] = pa.array([value for batch in batches for value in batch[field.name]], field.type)
    return pa.Table.from_arrays([columns[field.name] for field in RECORD_SCHEMA], schema=RECORD_SCHEMA)


@dataclass(frozen=True)
class StepPlan:
    """One step's record as read from the store (settled rows no longer change: ``write_step``)."""

    step: int
    rows: list[Sequence[Any]]
    metas: dict[str, BatchMeta]
    queued: list[str]
    waiting: set[str]
    claim_steps: dict[tuple[str, int], int]
    name: str
    keep_logprobs: bool


def plan_step(store: StoreView, step: int, keep_logprobs: bool) -> StepPlan | None:
    """The plan of the record of the batches stamped ``step``; None when nothing is to be written now
    (a batch whose lease has not folded yet goes back to the queue for the next commit)."""
    query = "SELECT batch_id FROM record_queue WHERE step = ? LIMIT ?"
    queued = [str(r[0]) for r in store.db.read(query, (step, MAX_BATCHES))]
    rows: list[Sequence[Any]] = []
    for chunk in _chunks(queued):
        rows += store.db.read(
            "SELECT b.batch_id, b.meta, b.task_ids, b.claimed, v.verdicts, b.file, j.validator, j.prefilled FROM batches b "
            "LEFT JOIN verdicts v ON v.batch_id = b.batch_id LEFT JOIN judges j ON j.batch_id = b.batch_id "
            f"WHERE b.batch_id IN ({', '.join('?' * len(chunk))})",
            chunk,
        )
    rows.sort(key=lambda row: json.loads(row[1])["seq"])
    metas = {str(row[0]): BatchMeta.from_json(row[1].encode()) for row in rows}
    # A batch whose lease has not folded yet waits for a later record: a restart replays such a lease
    # from the batch's row (``Ledger._load``), which must not cost a record file read.
    waiting = {b for b, m in metas.items() if m.lease is not None and _unfolded(store, m)}
    rows = [row for row in rows if str(row[0]) not in waiting]
    metas = {b: m for b, m in metas.items() if b not in waiting}
    if not metas:  # nothing to write yet: the waiting ones go to the next commit's step
        with store.db.transaction() as connection:
            connection.executemany("UPDATE record_queue SET step = NULL WHERE batch_id = ?", [(b,) for b in waiting])
            connection.executemany("DELETE FROM record_queue WHERE batch_id = ?", [(b,) for b in queued if b not in waiting])
        return None
    claim_steps = _claim_steps(store, {str(row[0]): metas[str(row[0])] for row in rows if json.loads(row[3])}, step)
    taken = {name for (name,) in store.db.read("SELECT file FROM records WHERE step = ?", (step,))}
    name = f"step_{step:08d}.parquet"
    if name in taken:  # a step of more than MAX_BATCHES batches: one more file, nothing overwritten
        name = f"step_{step:08d}.{len(taken)}.parquet"
    return StepPlan(step, rows, metas, queued, waiting, claim_steps, name, keep_logprobs)


def write_step(store: StoreView, plan: StepPlan) -> RecordFile:
    """Write the record file of ``plan`` (atomically). Reads payload files only, never the store's
    database: safe in another thread while the ledger serves requests."""
    table = _step_table([_batch_columns(store, plan.step, row, plan.claim_steps, plan.keep_logprobs) for row in plan.rows])
    path = store.root / RECORD_DIR / plan.name
    try:
        with atomic_path(path) as temporary:
            pq.write_table(table, str(temporary), compression="zstd")
    except OSError as error:
        raise StoreError(f"could not write the record of step {plan.step}: {error}") from error
    return RecordFile(plan.step, plan.name, len(plan.rows), table.num_rows, path.stat().st_size, plan.keep_logprobs)


def settle_step(store: StoreView, plan: StepPlan, result: RecordFile) -> list[Path]:
    """In one transaction: the ``records`` row, the ``compacted`` rows, and the deletion of the
    batches' rows. Returns their payload files, to delete once that transaction is durable."""
    max_seq = max((meta.seq for meta in plan.metas.values()), default=-1)
    with store.db.transaction() as connection:
        connection.execute(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
            (plan.name, plan.step, result.batches, result.samples, max_seq, result.bytes, int(plan.keep_logprobs)),
        )
        connection.executemany(
            "INSERT OR REPLACE INTO compacted VALUES (?, ?, ?)", [(b, m.sha256, plan.name) for b, m in plan.metas.items()]
        )
        for table_name in ("batches", "verdicts", "judges", "record_queue"):
            connection.executemany(f"DELETE FROM {table_name} WHERE batch_id = ?", [(b,) for b in plan.metas])
        connection.executemany(
            "DELETE FROM record_queue WHERE batch_id = ?", [(b,) for b in plan.queued if b not in plan.waiting]
        )
        connection.executemany("UPDATE record_queue SET step = NULL WHERE batch_id = ?", [(b,) for b in plan.waiting])
    return [store.batches_dir / row[5] if row[5] else store.batch_path(str(row[0])) for row in plan.rows]


def compact_step(store: StoreView, step: int, keep_logprobs: bool) -> RecordFile | None:
    """Compact the batches stamped ``step`` (module docstring, item 3); idempotent. The server runs
    the same phases with the file written outside its lock (``record_writer.py``)."""
    plan = plan_step(store, step, keep_logprobs)
    if plan is None:
        return None
    result = write_step(store, plan)
    files = settle_step(store, plan, result)
    store.db.sync()  # the deletion is durable before the files it replaces go (group commit defers it)
    store.payloads.delete(files)
    return result


def due_steps(store: StoreView, upto: int, max_steps: int = 2) -> list[int]:
    """Up to ``max_steps`` stamped steps ``<= upto``, oldest first (a backlog, such as a store written
    before version 4, drains a little at every commit instead of all at once)."""
    query = "SELECT DISTINCT step FROM record_queue WHERE step IS NOT NULL AND step <= ? ORDER BY step LIMIT ?"
    return [int(step) for (step,) in store.db.read(query, (upto, max_steps))]


def compact(store: StoreView, upto: int, keep_logprobs: bool, max_steps: int = 2) -> list[RecordFile]:
    """Compact the ``due_steps``."""
    files = [compact_step(store, step, keep_logprobs) for step in due_steps(store, upto, max_steps)]
    return [file for file in files if file is not None]


def finish(store: StoreView) -> int:
    """Delete the payload files of compacted batches a crash left behind (at the store's open; the
    folder holds the uncompacted batches only); returns how many."""
    removed = 0
    for path in store.batches_dir.iterdir():
        batch_id = payload_batch_id(path)
        if batch_id is not None and store.db.read("SELECT 1 FROM compacted WHERE batch_id = ?", (batch_id,)):
            path.unlink(missing_ok=True)
            removed += 1
    if removed:
        log.info("orchestrator store: removed %d payload files of compacted batches", removed)
    return removed


class RecordReader:
    """Reads of compacted batches from the record files (the last file read is cached: a restart's
    lookups hit a few recent steps)."""

    def __init__(self, store: StoreView) -> None:
        self._store = store
        self._cached: tuple[str, pa.Table] | None = None

    def file_of(self, batch_id: str) -> tuple[str, bool] | None:
        """The record file holding ``batch_id`` and whether it kept trained samples' log-probs (None:
        not compacted)."""
        rows = self._store.db.read(
            "SELECT c.file, r.logprobs FROM compacted c LEFT JOIN records r ON r.file = c.file WHERE c.batch_id = ?",
            (batch_id,),
        )
        return (str(rows[0][0]), bool(rows[0][1])) if rows else None

    def sha256(self, batch_id: str) -> str | None:
        rows = self._store.db.read("SELECT sha256 FROM compacted WHERE batch_id = ?", (batch_id,))
        return str(rows[0][0]) if rows else None

    def _table(self, file: str) -> pa.Table | None:
        if self._cached is not None and self._cached[0] == file:
            return self._cached[1]
        path = self._store.root / RECORD_DIR / file
        if not path.exists():
            return None  # pruned
        try:
            table = pq.ParquetFile(path).read()
        except (OSError, pa.ArrowException) as error:
            raise StoreError(f"could not read the record file {path}: {error}") from error
        self._cached = (file, table)
        return table

    def rows(self, batch_id: str) -> list[dict[str, Any]] | None:
        """The record rows of a compacted batch, by sample index (None: not compacted, or pruned)."""
        located = self.file_of(batch_id)
        table = None if located is None else self._table(located[0])
        if table is None:
            return None
        rows = table.filter(pc.equal(table.column("batch_id"), batch_id)).to_pylist()
        return sorted(rows, key=lambda row: row["sample_index"])

    def stored_row(self, batch_id: str) -> StoredRow | None:
        rows = self.rows(batch_id)
        return None if not rows else stored_row(rows)

    def payload(self, batch_id: str) -> pa.Table | None:
        """A compacted batch as ``BATCH_SCHEMA`` (dropped per-token columns: empty)."""
        rows = self.rows(batch_id)
        if not rows:
            return None
        columns = {name: [row[name] for row in rows] for name in BATCH_SCHEMA.names}
        columns["proofs"] = [b"" if p is None else p for p in columns["proofs"]]
        columns["inference_logprobs"] = [[] if p is None else p for p in columns["inference_logprobs"]]
        meta = {BATCH_META_KEY: json.dumps({"batch_id": batch_id, "sha256": rows[0]["sha256"]})}
        return pa.Table.from_pydict(columns, schema=BATCH_SCHEMA.with_metadata(meta))

    def batches(self) -> Iterator[StoredRow]:
        """Every compacted batch still on disk, by record file and submission order (an audit: O(history))."""
        for (file,) in self._store.db.read("SELECT file FROM records ORDER BY step, file"):
            table = self._table(str(file))
            if table is None:
                continue
            by_batch: dict[str, list[dict[str, Any]]] = {}
            for row in table.to_pylist():
                by_batch.setdefault(row["batch_id"], []).append(row)
            for rows in by_batch.values():
                yield stored_row(sorted(rows, key=lambda row: row["sample_index"]))


def stored_row(rows: list[dict[str, Any]]) -> StoredRow:
    """A compacted batch's record rows (one per sample, in order) as the store's ``StoredRow``."""
    first = rows[0]
    lease = None if first["lease"] is None else LeaseRecord.model_validate_json(first["lease"])
    meta = BatchMeta(
        batch_id=first["batch_id"], worker_id=first["worker_id"], step=first["step"], batch_index=first["batch_index"],
        policy_version=first["policy_version"], received_at=first["received_at"], sha256=first["sha256"],
        seq=first["seq"], lease=lease,
    )  # fmt: skip
    verdicts = None
    if first["accepted"] is not None:
        verdicts = [
            Verdict.model_construct(
                sample_index=row["sample_index"], accepted=row["accepted"], reason=row["reason"], detail=row["detail"],
                reward=row["verdict_reward"], advantage=row["verdict_advantage"], logprobs=row["logprobs"] or [],
                beyond_tolerance=row["beyond_tolerance"],
            )
            for row in rows
        ]  # fmt: skip
    claimed = {row["sample_index"] for row in rows if row["claim_step"] is not None}
    return meta, tuple(row["task_id"] for row in rows), claimed, verdicts, False


def prune(store: StoreView, before: int) -> list[str]:
    """Delete the record files of steps ``< before``, except those holding the batch of a lease that has
    not folded yet (a restart replays it from the record); returns the deleted file names. The
    ``compacted`` rows stay (a resubmission of a pruned batch is still a duplicate)."""
    needed: set[str] = set()
    for worker_id, batch_index, body in store.db.read("SELECT worker_id, batch_index, body FROM events WHERE kind = 'lease'"):
        step = json.loads(body)["lease"]["step"]
        located = store.record.file_of(f"{worker_id}-s{step}-b{batch_index}")
        if located is not None:
            needed.add(located[0])
    files = [str(f) for (f,) in store.db.read("SELECT file FROM records WHERE step < ?", (before,)) if str(f) not in needed]
    for file in files:
        (store.root / RECORD_DIR / file).unlink(missing_ok=True)
    if files:
        fsync_dir(store.root / RECORD_DIR)
        with store.db.transaction() as connection:
            connection.executemany("DELETE FROM records WHERE file = ?", [(f,) for f in files])
    return files
