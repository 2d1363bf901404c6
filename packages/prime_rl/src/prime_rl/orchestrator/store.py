"""The orchestrator's durable store: control-plane state in SQLite, rollout payloads in Arrow files.

Layout of ``data_dir``::

    state.sqlite                   registrations, leases, bans, judgements, commits (the event log),
                                   folded lease totals, verdicts, claims, the batch index, running
                                   counters and the release snapshot (``prime_rl.statedb``: WAL,
                                   synchronous=FULL, schema versions: ``store_schema.py``)
    batches/<batch_id>.<random>.arrow
                                   one submitted rollout batch (one row per sample, an Arrow IPC
                                   file: ``payloads.py``); its file name is in the
                                   batch index (``.parquet`` in a store written before issue 44, and
                                   ``<batch_id>.parquet`` with the batch fields in the schema
                                   metadata before that); uncompacted only
    record/step_<step>.parquet     the run's training record: the settled batches of one step, compacted
                                   (``record.py``), which replace their rows and payload files

Every write is durable before the function returns: a SQLite transaction is committed (one fsync of
the write-ahead log), a payload or record file is written to a temporary name, fsynced, renamed into place and
the directory fsynced. So a crash leaves either the old state or the new one, never a half record,
and a restart sees everything that any caller was told succeeded. The server commits without the
fsync and acknowledges only after a group fsync covers the commit (``group_commit.py``).

Sized by open work: a restart reads the open batches' index rows, the counters, the release
snapshot and the events that did not fold (``Ledger._load``), never the payload files or every
verdict; reads of settled batches and old claims are single indexed lookups (of compacted ones: a
record file). ``batch_records``, ``all_verdicts``, ``claims`` and ``events`` read everything, the
record included: audits and tests only.

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
import secrets
import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from prime_rl.api.protocol import SampleId, Verdict
from prime_rl.durable import TEMP_GLOB, atomic_path
from prime_rl.orchestrator.payloads import PayloadCache, write_payload_file
from prime_rl.orchestrator.record import RecordReader, finish
from prime_rl.orchestrator.store_schema import (
    ADD_COUNTER,
    BATCH_META_KEY,
    BATCH_SCHEMA,
    CLAIM_SCHEMA,
    EVENT_COLUMNS,
    INSERT_BATCH,
    INSERT_EVENT,
    LEASE_EVENTS,
    VERDICT_SCHEMA,
    BatchMeta,
    BatchRecord,
    ClaimRecord,
    LeaseTotals,
    StoredRow,
    StoreError,
    claim_json,
    claimed_json,
    event_row,
    schema_v1,
    schema_v2,
    schema_v3,
    schema_v4,
    verdict_rows,
    verdicts_json,
)
from prime_rl.statedb import StateDB, StateDBError

__all__ = ["BATCH_SCHEMA", "CLAIM_SCHEMA", "LEASE_EVENTS", "VERDICT_SCHEMA", "BatchMeta", "BatchRecord", "ClaimRecord"]
__all__ += ["LeaseTotals", "RolloutStore", "StoreError", "StoredRow"]

log = logging.getLogger(__name__)



def _atomic_write_table(table: pa.Table, path: Path) -> None:
    try:
        with atomic_path(path) as temporary:
            write_payload_file(table, temporary)
    except (OSError, pa.ArrowException) as error:
        raise StoreError(f"could not write {path}: {error}") from error



class RolloutStore:
    """Durable storage of one orchestrator (thread-safe writes; one process per directory, which
    holds its lock). ``reader``: inspect a store a live orchestrator may hold (read-only, no lock)."""

    def __init__(self, data_dir: str | Path, reader: bool = False) -> None:
        self.root = Path(data_dir)
        self.batches_dir = self.root / "batches"
        self.record = RecordReader(self)  # compacted batches (``record.py``)
        self.payloads = PayloadCache()  # the open batches' payloads written or read last (``payloads.py``)
        migrations = [schema_v1(self.root), schema_v2(self.root), schema_v3, schema_v4]
        if reader:
            try:
                self.db = StateDB(self.root / "state.sqlite", migrations, "orchestrator store", reader=True)
            except StateDBError as error:
                raise StoreError(f"could not read the store in {self.root}: {error}") from error
            return
        for directory in (self.root, self.batches_dir):
            directory.mkdir(parents=True, exist_ok=True)
        try:  # StateDB locks the directory's store first: the temp files below are ours to delete
            self.db = StateDB(self.root / "state.sqlite", migrations, "orchestrator store")
        except (StateDBError, OSError, pa.ArrowException) as error:
            raise StoreError(f"could not open the store in {self.root}: {error}") from error
        for stale in self.root.rglob(TEMP_GLOB):  # leftovers of a crash mid-write
            stale.unlink(missing_ok=True)
        finish(self)  # payload files of a compaction that a crash interrupted
        journal = self.root / "journal.jsonl"
        if journal.exists():  # imported by the migration: never read again
            journal.rename(journal.with_name("journal.jsonl.imported"))

    def close(self) -> None:
        self.db.close()
        self.payloads.clear()  # a closed store serves nothing: its tables' memory goes back now

    # ------------------------------------------------------------- event log

    def append_event(self, event: dict[str, Any]) -> None:
        """Append one event to the log, durably (one transaction)."""
        self.append_events([event])

    def append_events(self, events: Sequence[dict[str, Any]]) -> None:
        """Append ``events`` in order, durably, in one transaction (all or none)."""
        if not events:
            return
        try:
            self.db.write(INSERT_EVENT, [event_row(event) for event in events])
        except StateDBError as error:
            raise StoreError(str(error)) from error

    def events(self, skip: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
        """Replay the event log in order (without the kinds in ``skip``; an audit read: O(history))."""
        skipped = sorted(skip)
        where = f"WHERE kind NOT IN ({', '.join('?' * len(skipped))})" if skipped else ""
        for (body,) in self.db.read(f"SELECT body FROM events {where} ORDER BY seq", skipped):
            yield json.loads(body)

    def replay_events(self, kinds: Iterable[str], judged_after: int) -> Iterator[dict[str, Any]]:
        """The events of ``kinds`` and the ``judged`` events after sequence number ``judged_after``, in
        order: what a restart replays (through the index by kind, never the whole log)."""
        wanted = sorted(kinds)
        query = (
            f"SELECT seq, body FROM events WHERE kind IN ({', '.join('?' * len(wanted))}) "
            "UNION ALL SELECT seq, body FROM events WHERE kind = 'judged' AND seq > ? ORDER BY seq"
        )
        for _, body in self.db.read(query, [*wanted, judged_after]):
            yield json.loads(body)

    def release_rows(self) -> list[tuple[str, str, str]]:
        """The release book's snapshot rows (``ReleaseBook.restore``)."""
        return [tuple(row) for row in self.db.read("SELECT kind, key, state FROM release")]

    def write_release(self, rows: Sequence[tuple[str, str, str]], deletes: Sequence[tuple[str, str]]) -> None:
        """Write a release snapshot (``ReleaseBook.snapshot``) in one transaction; the run's row
        records the last ``judged`` event it includes."""
        try:
            with self.db.transaction() as connection:
                (upto,) = connection.execute("SELECT coalesce(max(seq), 0) FROM events WHERE kind = 'judged'").fetchone()
                *others, (kind, key, text) = rows
                run = json.loads(text)
                run["upto"] = int(upto)
                connection.executemany("DELETE FROM release WHERE kind = ? AND key = ?", deletes)
                connection.executemany(
                    "INSERT OR REPLACE INTO release VALUES (?, ?, ?)", [*others, (kind, key, json.dumps(run))]
                )
        except (StateDBError, sqlite3.Error) as error:
            raise StoreError(f"could not write the release snapshot in {self.root}: {error}") from error

    def lease_events(self) -> list[tuple[Any, ...]]:
        """The events of ``LEASE_EVENTS`` in order, as rows ``(kind, worker_id, batch_index, deadline,
        address, reissues_worker, reissues_index, body)`` (``lease_expired`` rows carry only the first
        three, ``lease_switch`` and ``lease_done`` rows those and the body)."""
        kinds = ", ".join(f"'{kind}'" for kind in LEASE_EVENTS)
        return self.db.read(f"SELECT {EVENT_COLUMNS} FROM events WHERE kind IN ({kinds}) ORDER BY seq")

    def event_count(self) -> int:
        """Events in the log (folded leases no longer count)."""
        return int(self.db.read("SELECT count(*) FROM events")[0][0])

    # ------------------------------------------------------------- folded leases

    def lease_totals(self) -> dict[str, LeaseTotals]:
        """Folded leases per worker id."""
        rows = self.db.read("SELECT worker_id, issued, answered, expired, next_index, rejected, machine FROM lease_totals")
        return {row[0]: LeaseTotals(*row[1:]) for row in rows}

    def address_totals(self) -> dict[str, LeaseTotals]:
        """Folded leases per client address (``issued`` and ``next_index`` unused: 0)."""
        rows = self.db.read("SELECT address, answered, expired, rejected FROM address_totals")
        return {row[0]: LeaseTotals(answered=row[1], expired=row[2], rejected=row[3]) for row in rows}

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
                    "INSERT INTO lease_totals VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET "
                    "issued = issued + excluded.issued, answered = answered + excluded.answered, "
                    "expired = expired + excluded.expired, next_index = max(next_index, excluded.next_index), "
                    "rejected = rejected + excluded.rejected, machine = machine + excluded.machine",
                    [(w, t.issued, t.answered, t.expired, t.next_index, t.rejected, t.machine) for w, t in workers.items()],
                )
                connection.executemany(
                    "INSERT INTO address_totals VALUES (?, ?, ?, ?) ON CONFLICT (address) DO UPDATE SET "
                    "answered = answered + excluded.answered, expired = expired + excluded.expired, "
                    "rejected = rejected + excluded.rejected",
                    [(a, t.answered, t.expired, t.rejected) for a, t in addresses.items()],
                )
        except (StateDBError, sqlite3.Error) as error:
            raise StoreError(f"could not fold leases in {self.root}: {error}") from error

    # ------------------------------------------------------------- batches

    def batch_path(self, batch_id: str) -> Path:
        """The payload file name of a batch stored before payload files were named per request."""
        return self.batches_dir / f"{batch_id}.parquet"

    def write_payload(self, batch_id: str, sha256: str, rows: dict[str, Sequence[Any]]) -> Path:
        """Durably write a batch's payload (``rows`` maps every ``BATCH_SCHEMA`` column to its values)
        to a file of its own (``<batch_id>.<random>.arrow``) before anything refers to it; returns
        its path. Thread-safe and needs no ledger state: a server writes it outside its request lock
        (``group_commit.py``). A payload that ends up unused (a duplicate, a refused batch) is the
        caller's to delete."""
        path = self.batches_dir / f"{batch_id}.{secrets.token_hex(6)}.arrow"
        schema = BATCH_SCHEMA.with_metadata({BATCH_META_KEY: json.dumps({"batch_id": batch_id, "sha256": sha256})})
        table = pa.Table.from_pydict(dict(rows), schema=schema)
        _atomic_write_table(table, path)
        self.payloads.put(path, table)
        return path

    def write_batch(
        self, meta: BatchMeta, rows: dict[str, Sequence[Any]], counters: Mapping[str, int], *, payload: Path | None = None
    ) -> None:
        """Durably store a batch: its payload (``rows``; ``payload``: written already, ``write_payload``),
        then, in one transaction, its index row (open) and its worker's ``counters`` deltas. The
        payload comes first: a crash between the two leaves an orphan file no one reads (the batch
        was never acknowledged)."""
        if payload is None:
            payload = self.write_payload(meta.batch_id, meta.sha256, rows)
        task_ids = json.dumps([int(task_id) for task_id in rows["task_id"]])
        row = (meta.batch_id, meta.seq, meta.worker_id, meta.to_json().decode(), task_ids, "[]", 1, payload.name)
        try:
            with self.db.transaction() as connection:
                connection.execute(INSERT_BATCH, row)
                _add_counters(connection, "worker", meta.worker_id, counters)
        except (StateDBError, sqlite3.Error) as error:
            raise StoreError(f"could not index batch {meta.batch_id}: {error}") from error

    def payload_path(self, batch_id: str) -> Path | None:
        """The payload file of a batch whose row is in the store (None: compacted, or never stored)."""
        rows = self.db.read("SELECT file FROM batches WHERE batch_id = ?", (batch_id,))
        if not rows:
            return None
        return self.batches_dir / rows[0][0] if rows[0][0] else self.batch_path(batch_id)

    def read_batch(self, batch_id: str) -> pa.Table:
        """The batch's full table (one row per sample)."""
        path = self.payload_path(batch_id)
        if path is None and (compacted := self.record.payload(batch_id)) is not None:
            return compacted
        path = path if path is not None else self.batch_path(batch_id)
        try:
            return self.payloads.read(path)
        except (OSError, pa.ArrowException) as error:
            raise StoreError(f"could not read batch {batch_id}: {error}") from error

    def open_batches(self) -> list[StoredRow]:
        """The batches still open (``store_schema``), by submission order: what a restart loads."""
        return self._rows("WHERE b.open = 1 ORDER BY b.seq")

    def batch(self, batch_id: str) -> StoredRow | None:
        """One stored batch, open or settled (one indexed lookup); None if never stored."""
        rows = self._rows("WHERE b.batch_id = ?", (batch_id,))
        return rows[0] if rows else self.record.stored_row(batch_id)

    def batch_sha256(self, batch_id: str) -> str | None:
        """The body digest a stored batch was acknowledged with (None: never stored)."""
        rows = self.db.read("SELECT json_extract(meta, '$.sha256') FROM batches WHERE batch_id = ?", (batch_id,))
        return str(rows[0][0]) if rows else self.record.sha256(batch_id)

    def batch_count(self) -> int:
        """Batches stored (the next submission sequence number)."""
        rows = self.db.read("SELECT max(coalesce((SELECT max(seq) FROM batches), -1), coalesce((SELECT max(max_seq) FROM records), -1))")
        return int(rows[0][0]) + 1

    def batch_ids(self) -> list[str]:
        """Every stored batch id by submission order, compacted ones included (an audit read: O(history))."""
        return [record.meta.batch_id for record in self.batch_records()]

    def batch_records(self) -> list[BatchRecord]:
        """Every stored batch's metadata and task ids by submission order, the record's included (an
        audit read: O(history))."""
        rows = [*self.record.batches(), *self._rows("")]
        return sorted((BatchRecord(meta=row[0], task_ids=row[1]) for row in rows), key=lambda r: r.meta.seq)

    def _rows(self, where: str, parameters: Sequence[Any] = ()) -> list[StoredRow]:
        query = (
            "SELECT b.meta, b.task_ids, b.claimed, v.verdicts, b.open FROM batches b "
            f"LEFT JOIN verdicts v ON v.batch_id = b.batch_id {where}"
        )
        return [
            (
                BatchMeta.from_json(meta.encode()),
                tuple(json.loads(task_ids)),
                set(json.loads(claimed)),
                None if verdicts is None else _verdicts(verdicts),
                bool(is_open),
            )
            for meta, task_ids, claimed, verdicts, is_open in self.db.read(query, parameters)
        ]

    # ------------------------------------------------------------- verdicts

    def write_verdicts(
        self,
        batch_id: str,
        verdicts: Sequence[Verdict],
        events: Sequence[dict[str, Any]] = (),
        *,
        worker_id: str = "",
        counters: Mapping[str, int] | None = None,
        settle: bool = False,
        evidence: Sequence[tuple[str, str]] = (),
        judge: tuple[str | None, bool | None] | None = None,
    ) -> None:
        """Store (or replace) the verdicts of ``batch_id``, append ``events``, add ``counters`` to
        ``worker_id``'s, write the ``evidence`` ledger rows, ``judge`` (validator id, prefilled: ``judges``)
        and close the batch if ``settle`` (queued for the record), durably, in one transaction."""
        try:
            with self.db.transaction() as connection:
                connection.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?)", (batch_id, verdicts_json(verdicts)))
                connection.executemany(INSERT_EVENT, [event_row(event) for event in events])
                _add_counters(connection, "worker", worker_id, counters or {})
                connection.executemany("INSERT OR REPLACE INTO evidence VALUES (?, ?)", evidence)
                if judge is not None:
                    connection.execute("INSERT OR REPLACE INTO judges VALUES (?, ?, ?)", (batch_id, *judge))
                if settle:
                    _close(connection, [batch_id])
        except (StateDBError, sqlite3.Error) as error:
            raise StoreError(f"could not write the verdicts of {batch_id}: {error}") from error

    def evidence_rows(self) -> list[tuple[str, str]]:
        """The run's evidence ledger rows ``(worker_id, state json)`` (``evidence_ledger.RunEvidence``)."""
        return [(str(w), str(text)) for w, text in self.db.read("SELECT worker_id, state FROM evidence")]

    def all_verdicts(self) -> dict[str, list[Verdict]]:
        """Every stored verdict by batch id, the record's included (an audit read: O(history)); the record's
        trained samples have no log-probs unless it kept them."""
        result = {row[0].batch_id: row[3] for row in self.record.batches() if row[3] is not None}
        result.update((batch_id, _verdicts(text)) for batch_id, text in self.db.read("SELECT batch_id, verdicts FROM verdicts"))
        return result

    # ------------------------------------------------------------- counters

    def counters(self, scope: str) -> dict[str, Counter[str]]:
        """The running counters of ``scope`` (``worker``, ``run``), by key."""
        result: dict[str, Counter[str]] = {}
        for key, name, n in self.db.read("SELECT key, name, n FROM counters WHERE scope = ?", (scope,)):
            result.setdefault(key, Counter())[name] = int(n)
        return result

    def settle(self, batch_ids: Sequence[str], run_counters: Mapping[str, int] = {}) -> None:
        """Close ``batch_ids`` (settled: read on demand only, queued for the record) and add ``run_counters``,
        in one transaction."""
        if not batch_ids and not run_counters:
            return
        try:
            with self.db.transaction() as connection:
                _close(connection, batch_ids)
                _add_counters(connection, "run", "", run_counters)
        except (StateDBError, sqlite3.Error) as error:
            raise StoreError(f"could not settle batches in {self.root}: {error}") from error

    # ------------------------------------------------------------- claims

    def write_claim(self, claim: ClaimRecord, claimed: Mapping[str, set[int]] = {}) -> None:
        """Store the claim of ``claim.step`` and the batches' claimed indices after it (``claimed``),
        durably, in one transaction (a step's claim is written once)."""
        try:
            with self.db.transaction() as connection:
                connection.execute(
                    "INSERT INTO claims VALUES (?, ?, ?, ?)",
                    (claim.step, claim.min_policy_version, claim.time, claim_json(claim.sample_ids)),
                )
                connection.executemany(
                    "UPDATE batches SET claimed = ? WHERE batch_id = ?",
                    [(claimed_json(indices), batch_id) for batch_id, indices in claimed.items()],
                )
        except (StateDBError, sqlite3.Error) as error:
            raise StoreError(f"could not write the claim of step {claim.step}: {error}") from error

    def claim(self, step: int) -> ClaimRecord | None:
        """The claim of ``step`` (None: none)."""
        return next(iter(self._claims("WHERE step = ?", (step,))), None)

    def claim_steps(self) -> list[int]:
        """The claimed steps, in order."""
        return [int(row[0]) for row in self.db.read("SELECT step FROM claims ORDER BY step")]

    def claims(self) -> list[ClaimRecord]:
        """Every claim, by step (an audit read: O(steps))."""
        return self._claims("ORDER BY step")

    def _claims(self, where: str, parameters: Sequence[Any] = ()) -> list[ClaimRecord]:
        return [
            ClaimRecord(
                step=int(step),
                min_policy_version=int(min_version),
                time=float(time),
                sample_ids=tuple(SampleId(batch_id, int(index)) for batch_id, index in json.loads(text)),
            )
            for step, min_version, time, text in self.db.read(
                f"SELECT step, min_policy_version, time, sample_ids FROM claims {where}", parameters
            )
        ]


def _verdicts(text: str) -> list[Verdict]:
    # Trusted data written by this store: constructed without re-validation.
    return [Verdict.model_construct(**row) for row in verdict_rows(text)]


def _close(connection: sqlite3.Connection, batch_ids: Sequence[str]) -> None:
    """Settle ``batch_ids``: closed, and queued for the training record (``record.py``)."""
    connection.executemany("UPDATE batches SET open = 0 WHERE batch_id = ?", [(b,) for b in batch_ids])
    connection.executemany("INSERT OR IGNORE INTO record_queue VALUES (?, NULL)", [(b,) for b in batch_ids])


def _add_counters(connection: sqlite3.Connection, scope: str, key: str, counters: Mapping[str, int]) -> None:
    connection.executemany(ADD_COUNTER, [(scope, key, name, n) for name, n in counters.items() if n])
