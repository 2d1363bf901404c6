"""The orchestrator's durable store: control-plane state in SQLite, rollout payloads in parquet.

Layout of ``data_dir``::

    state.sqlite                   registrations, leases, bans, judgements, commits (the event log),
                                   folded lease totals, verdicts and claims (``prime_rl.statedb``:
                                   WAL, synchronous=FULL, schema versions)
    batches/<batch_id>.parquet     one submitted rollout batch (one row per sample; batch fields in
                                   the schema metadata key ``prime_rl.batch``)

Every write is durable before the function returns: a SQLite transaction is committed (one fsync of
the write-ahead log), a parquet file is written to a temporary name, fsynced, renamed into place and
the directory fsynced. So a crash leaves either the old state or the new one, never a half record,
and ``load()`` after a restart sees everything that any caller was told succeeded.

Migration: a data dir written before SQLite (``journal.jsonl``, ``verdicts/*.parquet``,
``claims/*.parquet``) is imported into ``state.sqlite`` on first open, in one transaction; the old
files stay where they were (renamed ``journal.jsonl.imported``) and are never read again. A torn
journal line costs only itself (``statedb.read_jsonl_journal``).

Bounded size: a lease answered by a stored batch no longer matters one by one; ``LeaseBook`` folds
such leases into per-worker and per-address totals (``fold_leases``), deleting their events.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prime_rl.api.protocol import LeaseRecord, SampleId, Verdict
from prime_rl.durable import TEMP_GLOB, atomic_path
from prime_rl.statedb import StateDB, StateDBError, read_jsonl_journal

__all__ = [
    "BATCH_SCHEMA",
    "CLAIM_SCHEMA",
    "VERDICT_SCHEMA",
    "BatchMeta",
    "BatchRecord",
    "ClaimRecord",
    "LeaseTotals",
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
        ("spans", pa.list_(pa.struct([("policy_version", pa.int64()), ("first_token", pa.int32())]))),
    ]
)
"""One row per sample. Floats are float64 so the stored batch is exactly what was submitted.
``segments`` is null for single-turn samples (and absent from batches stored before episodes);
``spans`` is null for samples of one version (and absent from batches stored before in-flight updates)."""

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
"""Legacy layout (``verdicts/<batch_id>.parquet``, imported into ``state.sqlite`` on first open): one row
per sample, the validator's decision and recomputed values (``logprobs`` empty if rejected)."""

CLAIM_SCHEMA = pa.schema(
    [("sample_id", pa.string()), ("batch_id", pa.string()), ("sample_index", pa.int32())]
)
"""Legacy layout (``claims/step_<step>.parquet``, imported into ``state.sqlite`` on first open)."""

_BATCH_META_KEY = b"prime_rl.batch"
_CLAIM_META_KEY = b"prime_rl.claim"


class StoreError(RuntimeError):
    """The store could not read or write its files (disk full, permissions, corrupt file)."""


LEASE_EVENTS = ("lease", "lease_expired", "lease_switch", "lease_done")
"""Event kinds keyed by ``(worker_id, batch_index)``: the ones ``fold_leases`` deletes (a folded
lease's switches live on in its batch's ``BatchMeta.lease``)."""


@dataclass(frozen=True)
class LeaseTotals:
    """Folded leases of one key (a worker id, or a client address for ``address_totals``)."""

    issued: int = 0
    answered: int = 0
    expired: int = 0
    next_index: int = 0


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


def _verdicts_json(verdicts: Sequence[Verdict]) -> str:
    return json.dumps([v.model_dump() for v in verdicts], separators=(",", ":"))


def _claim_json(sample_ids: Sequence[SampleId]) -> str:
    return json.dumps([[s.batch_id, s.index] for s in sample_ids], separators=(",", ":"))


_EVENT_COLUMNS = "kind, worker_id, batch_index, deadline, address, reissues_worker, reissues_index, body"
_INSERT_EVENT = f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def _event_row(event: dict[str, Any]) -> tuple[Any, ...]:
    """The ``events`` row of ``event``: lease events also as columns (a restart reads those, not the JSON)."""
    kind = str(event.get("event", ""))
    body = json.dumps(event, separators=(",", ":"), allow_nan=False)
    if kind == "lease":
        lease, reissues = event["lease"], event.get("reissues")
        return (
            kind, str(lease["worker_id"]), int(lease["batch_index"]), float(lease["deadline"]),
            str(event.get("address", "")), str(reissues[0]) if reissues else None,
            int(reissues[1]) if reissues else None, body,
        )  # fmt: skip
    if kind in ("lease_expired", "lease_switch", "lease_done"):
        return kind, str(event["worker_id"]), int(event["batch_index"]), None, None, None, None, body
    return kind, None, None, None, None, None, None, body


def _schema_v1(root: Path) -> Callable[[sqlite3.Connection], None]:
    """Version 1: the tables, and the import of a data dir written before SQLite."""

    def migrate(connection: sqlite3.Connection) -> None:
        # Lease events carry their keys, deadline, address and reissued lease as columns too.
        connection.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, worker_id TEXT, batch_index INTEGER, "
            "deadline REAL, address TEXT, reissues_worker TEXT, reissues_index INTEGER, body TEXT NOT NULL)"
        )
        connection.execute("CREATE INDEX events_by_lease ON events (worker_id, batch_index) WHERE worker_id IS NOT NULL")
        connection.execute(
            "CREATE TABLE lease_totals (worker_id TEXT PRIMARY KEY, issued INTEGER NOT NULL, answered INTEGER NOT NULL, "
            "expired INTEGER NOT NULL, next_index INTEGER NOT NULL)"
        )
        connection.execute(
            "CREATE TABLE address_totals (address TEXT PRIMARY KEY, answered INTEGER NOT NULL, expired INTEGER NOT NULL)"
        )
        connection.execute("CREATE TABLE verdicts (batch_id TEXT PRIMARY KEY, verdicts TEXT NOT NULL)")
        connection.execute(
            "CREATE TABLE claims (step INTEGER PRIMARY KEY, min_policy_version INTEGER NOT NULL, time REAL NOT NULL, "
            "sample_ids TEXT NOT NULL)"
        )
        journal = root / "journal.jsonl"
        events = read_jsonl_journal(journal, "orchestrator journal")
        rows = []
        for number, event in enumerate(events):
            try:
                rows.append(_event_row(event))
            except (KeyError, TypeError, ValueError, IndexError) as error:
                log.warning("orchestrator journal: skipped malformed event %d (%r)", number, error)
        connection.executemany(_INSERT_EVENT, rows)
        for path in sorted((root / "verdicts").glob("*.parquet")):
            rows = pq.read_table(path).to_pylist()
            verdicts = [Verdict.model_construct(**row) for row in rows]
            connection.execute("INSERT INTO verdicts VALUES (?, ?)", (path.stem, _verdicts_json(verdicts)))
        for claim in _legacy_claims(root / "claims"):
            connection.execute(
                "INSERT INTO claims VALUES (?, ?, ?, ?)",
                (claim.step, claim.min_policy_version, claim.time, _claim_json(claim.sample_ids)),
            )
        if events or journal.exists():
            log.info("orchestrator store: imported %d journal events from %s", len(events), journal)

    return migrate


def _legacy_claims(claims_dir: Path) -> list[ClaimRecord]:
    """Claims written as ``claims/step_<step>.parquet`` before SQLite (imported once)."""
    result = []
    for path in sorted(claims_dir.glob("step_*.parquet")):
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


class RolloutStore:
    """Durable storage of one orchestrator (thread-safe writes; one process per directory, which
    holds its lock). ``reader``: inspect a store a live orchestrator may hold (read-only, no lock)."""

    def __init__(self, data_dir: str | Path, reader: bool = False) -> None:
        self.root = Path(data_dir)
        self.batches_dir = self.root / "batches"
        if reader:
            try:
                self.db = StateDB(self.root / "state.sqlite", [_schema_v1(self.root)], "orchestrator store", reader=True)
            except StateDBError as error:
                raise StoreError(f"could not read the store in {self.root}: {error}") from error
            return
        for directory in (self.root, self.batches_dir):
            directory.mkdir(parents=True, exist_ok=True)
        try:  # StateDB locks the directory's store first: the temp files below are ours to delete
            self.db = StateDB(self.root / "state.sqlite", [_schema_v1(self.root)], "orchestrator store")
        except (StateDBError, OSError, pa.ArrowException) as error:
            raise StoreError(f"could not open the store in {self.root}: {error}") from error
        for stale in self.root.rglob(TEMP_GLOB):  # leftovers of a crash mid-write
            stale.unlink(missing_ok=True)
        journal = self.root / "journal.jsonl"
        if journal.exists():  # imported by the migration: never read again
            journal.rename(journal.with_name("journal.jsonl.imported"))

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------- event log

    def append_event(self, event: dict[str, Any]) -> None:
        """Append one event to the log, durably (one transaction)."""
        self.append_events([event])

    def append_events(self, events: Sequence[dict[str, Any]]) -> None:
        """Append ``events`` in order, durably, in one transaction (all or none)."""
        if not events:
            return
        try:
            self.db.write(_INSERT_EVENT, [_event_row(event) for event in events])
        except StateDBError as error:
            raise StoreError(str(error)) from error

    def events(self, skip: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
        """Replay the event log in order (without the kinds in ``skip``)."""
        skipped = sorted(skip)
        where = f"WHERE kind NOT IN ({', '.join('?' * len(skipped))})" if skipped else ""
        for (body,) in self.db.read(f"SELECT body FROM events {where} ORDER BY seq", skipped):
            yield json.loads(body)

    def lease_events(self) -> list[tuple[Any, ...]]:
        """The events of ``LEASE_EVENTS`` in order, as rows ``(kind, worker_id, batch_index, deadline,
        address, reissues_worker, reissues_index, body)`` (``lease_expired`` rows carry only the first
        three, ``lease_switch`` and ``lease_done`` rows those and the body)."""
        kinds = ", ".join(f"'{kind}'" for kind in LEASE_EVENTS)
        return self.db.read(f"SELECT {_EVENT_COLUMNS} FROM events WHERE kind IN ({kinds}) ORDER BY seq")

    def event_count(self) -> int:
        """Events in the log (folded leases no longer count)."""
        return int(self.db.read("SELECT count(*) FROM events")[0][0])

    # ------------------------------------------------------------- folded leases

    def lease_totals(self) -> dict[str, LeaseTotals]:
        """Folded leases per worker id."""
        rows = self.db.read("SELECT worker_id, issued, answered, expired, next_index FROM lease_totals")
        return {row[0]: LeaseTotals(*row[1:]) for row in rows}

    def address_totals(self) -> dict[str, LeaseTotals]:
        """Folded leases per client address (``issued`` and ``next_index`` unused: 0)."""
        rows = self.db.read("SELECT address, answered, expired FROM address_totals")
        return {row[0]: LeaseTotals(answered=row[1], expired=row[2]) for row in rows}

    def fold_leases(
        self,
        keys: Iterable[tuple[str, int]],
        workers: dict[str, LeaseTotals],
        addresses: dict[str, LeaseTotals],
    ) -> None:
        """In one transaction: delete the ``lease``/``lease_expired`` events of ``keys`` (worker id,
        batch index) and add ``workers`` and ``addresses`` to the folded totals (``next_index``: the
        larger one is kept)."""
        try:
            with self.db.transaction() as connection:
                connection.executemany("DELETE FROM events WHERE worker_id = ? AND batch_index = ?", list(keys))
                connection.executemany(
                    "INSERT INTO lease_totals VALUES (?, ?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET "
                    "issued = issued + excluded.issued, answered = answered + excluded.answered, "
                    "expired = expired + excluded.expired, next_index = max(next_index, excluded.next_index)",
                    [(w, t.issued, t.answered, t.expired, t.next_index) for w, t in workers.items()],
                )
                connection.executemany(
                    "INSERT INTO address_totals VALUES (?, ?, ?) ON CONFLICT (address) DO UPDATE SET "
                    "answered = answered + excluded.answered, expired = expired + excluded.expired",
                    [(a, t.answered, t.expired) for a, t in addresses.items()],
                )
        except (StateDBError, sqlite3.Error) as error:
            raise StoreError(f"could not fold leases in {self.root}: {error}") from error

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

    def write_verdicts(self, batch_id: str, verdicts: Sequence[Verdict], events: Sequence[dict[str, Any]] = ()) -> None:
        """Store (or replace) the verdicts of ``batch_id`` and append ``events``, durably, in one transaction."""
        try:
            with self.db.transaction() as connection:
                connection.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?)", (batch_id, _verdicts_json(verdicts)))
                connection.executemany(_INSERT_EVENT, [_event_row(event) for event in events])
        except (StateDBError, sqlite3.Error) as error:
            raise StoreError(f"could not write the verdicts of {batch_id}: {error}") from error

    def all_verdicts(self) -> dict[str, list[Verdict]]:
        # Trusted data written by this store: constructed without re-validation.
        return {
            batch_id: [Verdict.model_construct(**row) for row in json.loads(text)]
            for batch_id, text in self.db.read("SELECT batch_id, verdicts FROM verdicts")
        }

    # ------------------------------------------------------------- claims

    def write_claim(self, claim: ClaimRecord) -> None:
        """Store the claim of ``claim.step``, durably (a step's claim is written once)."""
        try:
            self.db.write(
                "INSERT INTO claims VALUES (?, ?, ?, ?)",
                [(claim.step, claim.min_policy_version, claim.time, _claim_json(claim.sample_ids))],
            )
        except StateDBError as error:
            raise StoreError(str(error)) from error

    def claims(self) -> list[ClaimRecord]:
        """Every claim, by step."""
        return [
            ClaimRecord(
                step=int(step),
                min_policy_version=int(min_version),
                time=float(time),
                sample_ids=tuple(SampleId(batch_id, int(index)) for batch_id, index in json.loads(text)),
            )
            for step, min_version, time, text in self.db.read(
                "SELECT step, min_policy_version, time, sample_ids FROM claims ORDER BY step"
            )
        ]
