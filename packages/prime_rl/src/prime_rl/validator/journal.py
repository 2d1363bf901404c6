"""The validator's former per-identity journal (read-only since issue 45: the run's ledger replaced it).

**Migration note.** Per-identity evidence, failure counts and evidence bans now live in one ledger
per run, in the orchestrator's store (``orchestrator/evidence_ledger.py``, table ``evidence``),
updated in each verdict's own transaction, so that K validators judge an identity as one would. The
validator process no longer opens this journal. A ``validator/journal.sqlite`` left by an earlier
run is not imported: the bans the old validator posted stand in the orchestrator (its ``ban``
events), but an identity's evidence and failure counts start again from zero in the run's ledger
when such a run is resumed. This module stays for reading old journals (``benchmarks/swarm_checks.py``,
audits); nothing writes it any more.

What follows describes the format as it was written:
The validator's durable per-identity state: evidence and failure counts survive a restart.

Without it a validator restart forgave everything: a worker's evidence (``evidence.py``) and its
accepted/rejected counts (``process.FailureTracker``) lived in memory only. The state is a SQLite
file (``prime_rl.statedb``: WAL, synchronous=FULL, schema versions) next to the validator's noise
profile: ``<run_dir>/validator/journal.sqlite`` for the ``journal.jsonl`` path the validator names
(the JSON-lines journal it kept before; imported on first open, then renamed
``journal.jsonl.imported``; a torn or malformed line costs only itself). Each write is one
transaction, committed and fsynced before the call returns:

* ``evidence(batch_id, worker_id, ledger)`` after a batch is added to its worker's evidence (before
  its verdicts are posted: a batch counted here is never counted again after a restart): the
  worker's ``WorkerEvidence.snapshot()``, its evidence ban reason (kept apart, so a ban outlives a
  snapshot that no longer restores, restart after restart), and the batch id among its counted
  batches;
* ``failures(batch_id, worker_id, tracker)`` after a batch's verdicts were posted and counted by the
  failure tracker: the worker's cumulative accepted/rejected counts and whether it is banned; in
  the same transaction the batch leaves the counted batch ids (the orchestrator has its verdicts
  and never offers it again, so there is nothing left to count twice).

One row per worker and kind, plus one per batch counted into the evidence whose verdicts are not
posted yet (in flight), so the file stays as large as the set of identities, and a restart reads
exactly that. ``restore`` on open drops what no longer restores (``compact``).

Pitfall: a crash between posting a batch's verdicts and its ``failures`` write loses that batch's
counts (the orchestrator has settled it and will not offer it again); its evidence was written
before the post and is kept.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import toploc
from prime_rl.statedb import StateDB, StateDBError, read_jsonl_journal

if TYPE_CHECKING:
    from prime_rl.validator.evidence import EvidenceLedger, FailureTracker

log = logging.getLogger(__name__)

__all__ = ["JournalError", "JournalState", "ValidatorJournal"]


class JournalError(RuntimeError):
    """The journal cannot be written (disk full, permissions): the validator must not judge on."""


@dataclass
class JournalState:
    """What a replay found, per worker id."""

    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)  # latest WorkerEvidence snapshot
    batches: dict[str, list[str]] = field(default_factory=dict)  # batch ids counted into the evidence
    ban_reasons: dict[str, str] = field(default_factory=dict)  # evidence bans
    failures: dict[str, tuple[int, int]] = field(default_factory=dict)  # (accepted, rejected)
    failure_bans: set[str] = field(default_factory=set)  # bans by rejected share


def _apply_event(state: JournalState, event: dict[str, Any]) -> None:
    """Fold one event of the old JSON-lines journal into ``state`` (KeyError/TypeError/ValueError
    when malformed)."""
    worker = str(event["worker_id"])
    if event["event"] == "evidence":
        if not isinstance(event["state"], dict):
            raise TypeError("state is not an object")
        state.evidence[worker] = event["state"]
        batches = state.batches.setdefault(worker, [])
        batches.extend(str(b) for b in event.get("batches", [event["batch_id"]]) if b)
        if event.get("ban_reason"):
            state.ban_reasons[worker] = str(event["ban_reason"])
    elif event["event"] == "failures":
        state.failures[worker] = (int(event["accepted"]), int(event["rejected"]))
        if event["banned"]:
            state.failure_bans.add(worker)


def _write_state(connection: sqlite3.Connection, state: JournalState) -> None:
    """Replace every row with ``state`` (inside the caller's transaction)."""
    for table in ("evidence", "evidence_bans", "evidence_batches", "failures"):
        connection.execute(f"DELETE FROM {table}")
    connection.executemany(
        "INSERT INTO evidence VALUES (?, ?)",
        [(w, json.dumps(snapshot, allow_nan=False)) for w, snapshot in state.evidence.items()],
    )
    connection.executemany("INSERT INTO evidence_bans VALUES (?, ?)", list(state.ban_reasons.items()))
    connection.executemany(
        "INSERT OR IGNORE INTO evidence_batches VALUES (?, ?)",
        [(b, w) for w, batches in state.batches.items() if w in state.evidence for b in batches],
    )
    connection.executemany(
        "INSERT INTO failures VALUES (?, ?, ?, ?)",
        [(w, a, r, int(w in state.failure_bans)) for w, (a, r) in state.failures.items()],
    )


def _schema_v1(legacy: Path) -> Any:
    """Version 1: the tables, and the import of the JSON-lines journal at ``legacy``."""

    def migrate(connection: sqlite3.Connection) -> None:
        connection.execute("CREATE TABLE evidence (worker_id TEXT PRIMARY KEY, state TEXT NOT NULL)")
        # Apart from the evidence: a ban outlives a snapshot that no longer restores.
        connection.execute("CREATE TABLE evidence_bans (worker_id TEXT PRIMARY KEY, reason TEXT NOT NULL)")
        connection.execute("CREATE TABLE evidence_batches (batch_id TEXT PRIMARY KEY, worker_id TEXT NOT NULL)")
        connection.execute(
            "CREATE TABLE failures (worker_id TEXT PRIMARY KEY, accepted INTEGER NOT NULL, rejected INTEGER NOT NULL, "
            "banned INTEGER NOT NULL)"
        )
        state = JournalState()
        for event in read_jsonl_journal(legacy, "validator journal"):
            try:
                _apply_event(state, event)
            except (KeyError, TypeError, ValueError) as error:
                log.warning("validator journal: skipped a malformed event (%r)", error)
        _write_state(connection, state)

    return migrate


class ValidatorJournal:
    """Durable per-identity state of one validator (one process per file; see module docstring).

    ``path``: the validator's journal path as it was named before SQLite (``journal.jsonl``); the
    state lives beside it in ``path.with_suffix(".sqlite")``.
    """

    def __init__(self, path: str | Path, reader: bool = False) -> None:
        self.path = Path(path)
        self.db_path = self.path.with_suffix(".sqlite")
        try:  # reader: inspect a journal a live validator may hold (read-only, no lock)
            self.db = StateDB(self.db_path, [_schema_v1(self.path)], "validator journal", reader=reader)
        except (StateDBError, OSError) as error:
            raise JournalError(f"could not open {self.db_path}: {error}") from error
        if self.path.exists() and not reader:  # imported by the migration: never read again
            self.path.rename(self.path.with_name(self.path.name + ".imported"))

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------- writing

    def evidence(self, batch_id: str, worker_id: str, ledger: EvidenceLedger) -> None:
        """Record ``worker_id``'s evidence right after ``batch_id`` was counted into it."""
        snapshot = json.dumps(ledger.workers[worker_id].snapshot(), allow_nan=False)
        try:
            with self.db.transaction() as connection:
                connection.execute("INSERT OR REPLACE INTO evidence VALUES (?, ?)", (worker_id, snapshot))
                if ledger.ban_reasons.get(worker_id):
                    connection.execute(
                        "INSERT OR REPLACE INTO evidence_bans VALUES (?, ?)", (worker_id, ledger.ban_reasons[worker_id])
                    )
                connection.execute("INSERT OR IGNORE INTO evidence_batches VALUES (?, ?)", (batch_id, worker_id))
        except (StateDBError, sqlite3.Error) as error:
            raise JournalError(f"could not write {self.db_path}: {error}") from error

    def failures(
        self, batch_id: str, worker_id: str, tracker: FailureTracker, ledger: EvidenceLedger | None = None
    ) -> None:
        """Record ``worker_id``'s cumulative failure counts right after ``batch_id``'s posted verdicts
        were counted, and forget ``batch_id`` among the counted batches (here and in ``ledger``)."""
        accepted, rejected = tracker.counts.get(worker_id, [0, 0])
        try:
            with self.db.transaction() as connection:
                connection.execute(
                    "INSERT OR REPLACE INTO failures VALUES (?, ?, ?, ?)",
                    (worker_id, int(accepted), int(rejected), int(worker_id in tracker.banned)),
                )
                connection.execute("DELETE FROM evidence_batches WHERE batch_id = ?", (batch_id,))
        except (StateDBError, sqlite3.Error) as error:
            raise JournalError(f"could not write {self.db_path}: {error}") from error
        if ledger is not None:
            ledger.counted_batches.discard(batch_id)

    # ------------------------------------------------------------- replay

    def load(self) -> JournalState:
        """The recorded state (a row that does not parse is skipped with a warning, never fatal)."""
        state = JournalState()
        for worker, text in self.db.read("SELECT worker_id, state FROM evidence"):
            try:
                state.evidence[worker] = json.loads(text)
            except json.JSONDecodeError as error:
                log.warning("validator journal: skipped the unreadable evidence of %s (%r)", worker, error)
        state.ban_reasons.update(self.db.read("SELECT worker_id, reason FROM evidence_bans"))
        for batch_id, worker in self.db.read("SELECT batch_id, worker_id FROM evidence_batches ORDER BY rowid"):
            state.batches.setdefault(worker, []).append(batch_id)
        for worker, accepted, rejected, banned in self.db.read(
            "SELECT worker_id, accepted, rejected, banned FROM failures"
        ):
            state.failures[worker] = (int(accepted), int(rejected))
            if banned:
                state.failure_bans.add(worker)
        return state

    def compact(self, state: JournalState) -> None:
        """Replace the recorded state with ``state`` in one transaction (drops what ``restore`` could
        not restore)."""
        try:
            with self.db.transaction() as connection:
                _write_state(connection, state)
        except (StateDBError, sqlite3.Error) as error:
            raise JournalError(f"could not rewrite {self.db_path}: {error}") from error

    def restore(self, ledger: EvidenceLedger | None, tracker: FailureTracker) -> JournalState:
        """Load the journal into a fresh ``ledger`` (None: evidence is off) and ``tracker``, then
        compact it. A worker whose evidence snapshot no longer fits is logged and starts afresh
        (its ban, if any, is kept)."""
        state = self.load()
        for worker, (accepted, rejected) in state.failures.items():
            tracker.counts[worker] = [accepted, rejected]
        tracker.banned |= state.failure_bans
        if ledger is not None:
            for worker, snapshot in list(state.evidence.items()):
                try:
                    ledger.workers[worker] = toploc.WorkerEvidence.restore(ledger.tests, snapshot)
                except toploc.EvidenceError as error:
                    log.warning("validator journal: evidence of %s not restored: %s", worker, error)
                    del state.evidence[worker]
                    continue
                ledger.counted_batches.update(state.batches.get(worker, []))
            ledger.ban_reasons.update(state.ban_reasons)
        self.compact(state)
        if state.evidence or state.failures:
            log.info(
                "validator journal: restored the evidence of %d and the failure counts of %d workers (%d banned)",
                len(state.evidence),
                len(state.failures),
                len(set(state.ban_reasons) | state.failure_bans),
            )
        return state
