"""The orchestrator store's record types, file schemas and SQLite schema versions (``store.py``).

Version 1 holds the event log, folded lease totals, verdicts and claims (and imports a data dir
written before SQLite). Version 2 adds what keeps memory and startup sized by open work:

  - ``batches``: one row per stored batch (its ``BatchMeta`` as JSON, task ids, claimed sample
    indices, ``open``). ``open`` = 1 while the batch can still matter to a rule (awaiting
    verdicts, or accepted samples a claim could still take); a settled batch (rejected, expired,
    withheld, claimed, stale, of a banned worker) has ``open`` = 0 and is read only on demand.
    A restart reads the open rows (a partial index), never the parquet files.
  - ``counters``: running totals ``(scope, key, name) -> n``, updated in the same transaction as
    the event that moves them (per-worker sample counts and rejection reasons, run totals).
  - ``lease_totals.rejected`` / ``address_totals.rejected``: folded rejected leases (``lease_totals.machine``:
    of them, those rejected for reasons the machine may explain).
  - ``release``: the release book's snapshot (``release.py``), and an index of the events by
    kind, so a restart reads the registrations, bans and commits and the ``judged`` events after
    the snapshot, not every judgement of the run.

The version 2 migration reads every parquet file once (a data dir written before it). Version 3
adds the run's evidence ledger, version 4 the training record's tables (``schema_v4``, ``record.py``).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import TypeAdapter

from prime_rl.api.protocol import LeaseRecord, SampleId, Verdict
from prime_rl.statedb import read_jsonl_journal

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


def conform_batch(table: pa.Table) -> pa.Table:
    """A stored batch's table with ``BATCH_SCHEMA``'s columns, in its order and types (a column absent
    from a batch stored before it existed is null): what a payload of any layout is concatenated as."""
    if table.schema.equals(BATCH_SCHEMA, check_metadata=False):
        return table
    present = set(table.column_names)
    columns = [table.column(f.name).cast(f.type) if f.name in present else pa.nulls(table.num_rows, f.type)
               for f in BATCH_SCHEMA]  # fmt: skip
    return pa.Table.from_arrays(columns, schema=BATCH_SCHEMA)


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

BATCH_META_KEY = b"prime_rl.batch"
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
    rejected: int = 0
    machine: int = 0  # of ``rejected``: for reasons the machine may explain (``lease_rules.machine_caused``)


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


StoredRow = tuple[BatchMeta, tuple[int, ...], set[int], list[Verdict] | None, bool]
"""One batch as the store holds it: metadata, task ids, claimed indices, verdicts (None: unjudged), open."""


@dataclass(frozen=True)
class ClaimRecord:
    """The samples the trainer claimed for ``step``, and the freshness bound they were chosen under."""

    step: int
    min_policy_version: int
    time: float
    sample_ids: tuple[SampleId, ...]


_VERDICTS = TypeAdapter(list[Verdict])
_ROWS = TypeAdapter(list[dict[str, Any]])


def verdicts_json(verdicts: Sequence[Verdict]) -> str:
    """The verdicts' row text: pydantic's serializer (a tenth of ``json.dumps``'s time for per-token
    log-probs: ``benchmarks/payload_format.py``), read back by ``json.loads`` or ``verdict_rows``."""
    return _VERDICTS.dump_json(list(verdicts)).decode()


def verdict_rows(text: str) -> list[dict[str, Any]]:
    """A verdicts row's text as plain dicts, what ``json.loads`` gives, by pydantic's JSON reader: a
    fifth of ``json.loads``'s time on rows of 384 log-probs a sample (``payload_format.py``)."""
    return _ROWS.validate_json(text)


def claim_json(sample_ids: Sequence[SampleId]) -> str:
    return json.dumps([[s.batch_id, s.index] for s in sample_ids], separators=(",", ":"))


EVENT_COLUMNS = "kind, worker_id, batch_index, deadline, address, reissues_worker, reissues_index, body"
INSERT_EVENT = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def event_row(event: dict[str, Any]) -> tuple[Any, ...]:
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


def schema_v1(root: Path) -> Callable[[sqlite3.Connection], None]:
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
                rows.append(event_row(event))
            except (KeyError, TypeError, ValueError, IndexError) as error:
                log.warning("orchestrator journal: skipped malformed event %d (%r)", number, error)
        connection.executemany(INSERT_EVENT, rows)
        for path in sorted((root / "verdicts").glob("*.parquet")):
            rows = pq.read_table(path).to_pylist()
            verdicts = [Verdict.model_construct(**row) for row in rows]
            connection.execute("INSERT INTO verdicts VALUES (?, ?)", (path.stem, verdicts_json(verdicts)))
        for claim in _legacy_claims(root / "claims"):
            connection.execute(
                "INSERT INTO claims VALUES (?, ?, ?, ?)",
                (claim.step, claim.min_policy_version, claim.time, claim_json(claim.sample_ids)),
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



def read_batch_records(batches_dir: Path) -> list[BatchRecord]:
    """Every batch file's metadata and task ids, by submission sequence number (the version 2
    migration; ``StoreError`` for a damaged file)."""
    records = []
    for path in batches_dir.glob("*.parquet"):
        try:
            parquet = pq.ParquetFile(path)
            meta = BatchMeta.from_json(parquet.schema_arrow.metadata[BATCH_META_KEY])
            task_ids = parquet.read(columns=["task_id"]).column("task_id").to_pylist()
        except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as error:
            raise StoreError(f"corrupt batch file {path}: {error}") from error
        if meta.batch_id != path.stem:
            raise StoreError(f"corrupt batch file {path}: it holds batch {meta.batch_id}")
        records.append(BatchRecord(meta=meta, task_ids=tuple(task_ids)))
    records.sort(key=lambda record: record.meta.seq)
    return records


EXPIRED = "expired"
"""Verdict reason the orchestrator itself gives batches that became too old to train on before validation."""


def sample_counts(num_samples: int, verdicts: Sequence[Verdict] | None) -> Counter[str]:
    """A batch's contribution to its worker's sample counters: ``pending`` while unjudged, else
    ``expired``, ``accepted``, ``rejected`` and ``reason:<reason>`` per rejected sample."""
    if verdicts is None:
        return Counter(pending=num_samples)
    counts: Counter[str] = Counter()
    for verdict in verdicts:
        if verdict.reason == EXPIRED:
            counts["expired"] += 1
        elif verdict.accepted:
            counts["accepted"] += 1
        else:
            counts["rejected"] += 1
            counts[f"reason:{verdict.reason}"] += 1
    return counts


def counter_delta(new: Counter[str], old: Counter[str]) -> dict[str, int]:
    """``new - old`` keeping negative values (``Counter.__sub__`` drops them)."""
    return {name: new[name] - old[name] for name in set(new) | set(old) if new[name] != old[name]}


def claimed_json(indices: set[int]) -> str:
    return json.dumps(sorted(indices), separators=(",", ":"))


BATCH_COLUMNS = "batch_id, seq, worker_id, meta, task_ids, claimed, open, file"
INSERT_BATCH = f"INSERT INTO batches ({BATCH_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
ADD_COUNTER = (
    "INSERT INTO counters VALUES (?, ?, ?, ?) ON CONFLICT (scope, key, name) DO UPDATE SET n = n + excluded.n"
)


def schema_v2(root: Path) -> Callable[[sqlite3.Connection], None]:
    """Version 2: the batch table, the counters, folded rejected leases (module docstring)."""

    def migrate(connection: sqlite3.Connection) -> None:
        connection.execute(
            "CREATE TABLE batches (batch_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, worker_id TEXT NOT NULL, "
            "meta TEXT NOT NULL, task_ids TEXT NOT NULL, claimed TEXT NOT NULL, open INTEGER NOT NULL, file TEXT)"
        )
        connection.execute("CREATE INDEX batches_open ON batches (seq) WHERE open = 1")
        connection.execute(
            "CREATE TABLE counters (scope TEXT NOT NULL, key TEXT NOT NULL, name TEXT NOT NULL, n INTEGER NOT NULL, "
            "PRIMARY KEY (scope, key, name)) WITHOUT ROWID"
        )
        connection.execute(
            "CREATE TABLE release (kind TEXT NOT NULL, key TEXT NOT NULL, state TEXT NOT NULL, PRIMARY KEY (kind, key)) "
            "WITHOUT ROWID"
        )
        connection.execute("CREATE INDEX events_by_kind ON events (kind, seq)")
        for table in ("lease_totals", "address_totals"):
            connection.execute(f"ALTER TABLE {table} ADD COLUMN rejected INTEGER NOT NULL DEFAULT 0")
        connection.execute("ALTER TABLE lease_totals ADD COLUMN machine INTEGER NOT NULL DEFAULT 0")
        verdicts = {
            batch_id: [Verdict.model_construct(**row) for row in verdict_rows(text)]
            for batch_id, text in connection.execute("SELECT batch_id, verdicts FROM verdicts")
        }
        claimed: dict[str, set[int]] = {}
        for (text,) in connection.execute("SELECT sample_ids FROM claims"):
            for batch_id, index in json.loads(text):
                claimed.setdefault(batch_id, set()).add(int(index))
        counters: dict[tuple[str, str], int] = {}
        rows = []
        for record in read_batch_records(root / "batches"):
            meta = record.meta
            rows.append(
                (meta.batch_id, meta.seq, meta.worker_id, meta.to_json().decode(), json.dumps(record.task_ids),
                 claimed_json(claimed.get(meta.batch_id, set())), 1, None)
            )  # fmt: skip
            counts = sample_counts(len(record.task_ids), verdicts.get(meta.batch_id))
            counts.update(batches=1, samples=len(record.task_ids))
            for name, n in counts.items():
                counters[(meta.worker_id, name)] = counters.get((meta.worker_id, name), 0) + n
        connection.executemany(INSERT_BATCH, rows)
        connection.executemany(ADD_COUNTER, [("worker", w, name, n) for (w, name), n in counters.items()])
        if rows:
            log.info("orchestrator store: indexed %d stored batches", len(rows))

    return migrate


def schema_v3(connection: sqlite3.Connection) -> None:
    """Version 3: the run's evidence ledger (``evidence_ledger.py``): one row per identity, written in
    the transaction of the verdicts that change it."""
    connection.execute("CREATE TABLE evidence (worker_id TEXT PRIMARY KEY, state TEXT NOT NULL) WITHOUT ROWID")


def schema_v4(connection: sqlite3.Connection) -> None:
    """Version 4: the run's training record (``record.py``). ``record_queue``: settled batches waiting
    for compaction (``step`` NULL until the next commit stamps it); ``records``: the per-step record
    files written; ``compacted``: one narrow row per compacted batch (its digest, so a resubmission is
    still a duplicate, and its record file); ``judges``: who judged a batch and whether the run's
    evidence ledger counted it. A store written before it queues its settled batches at their lease step."""
    connection.execute("CREATE TABLE record_queue (batch_id TEXT PRIMARY KEY, step INTEGER) WITHOUT ROWID")
    connection.execute("CREATE INDEX record_queue_step ON record_queue (step)")
    connection.execute(
        "CREATE TABLE records (file TEXT PRIMARY KEY, step INTEGER NOT NULL, batches INTEGER NOT NULL, "
        "samples INTEGER NOT NULL, max_seq INTEGER NOT NULL, bytes INTEGER NOT NULL, logprobs INTEGER NOT NULL)"
    )
    connection.execute("CREATE INDEX records_step ON records (step)")
    connection.execute(
        "CREATE TABLE compacted (batch_id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, file TEXT NOT NULL) WITHOUT ROWID"
    )
    connection.execute(
        "CREATE TABLE judges (batch_id TEXT PRIMARY KEY, validator TEXT, prefilled INTEGER) WITHOUT ROWID"
    )
    connection.execute(
        "INSERT INTO record_queue SELECT batch_id, json_extract(meta, '$.step') FROM batches WHERE open = 0"
    )
