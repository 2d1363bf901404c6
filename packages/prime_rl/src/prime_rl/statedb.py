"""Control-plane state in SQLite: one durable transaction per change, schema versions, journal import.

The orchestrator's registrations, leases, bans, claims and evidence (``orchestrator/store.py``) and
the validator's per-identity state (``validator/journal.py``) live in SQLite files opened through
:class:`StateDB`. Rollout payloads stay in files of their own (``orchestrator/payloads.py``).

Durability: WAL mode with ``synchronous=FULL``, so a committed transaction is on disk (one fsync of
the write-ahead log) before :meth:`StateDB.transaction` returns, and a crash (``kill -9``, power cut)
loses only transactions that never returned. A torn write cannot glue two records together, which
is what the hand-written JSON-lines journals before it could do: after a crash left a torn last line,
the next append was glued onto it and replay skipped both.

Schema versions: the ``schema_version`` table holds one row; each store passes its ordered list of
migrations (callables taking the connection) and :class:`StateDB` applies those past the stored
version, each in its own transaction with the version bump, so a crash mid-migration re-runs it.

Journal import: :func:`read_jsonl_journal` reads an old JSON-lines journal for a store's first
migration. A torn last line (a crash mid-append) is dropped alone, with a warning; so is any other
line that is not a JSON object. A torn line *inside* the file (an append glued onto a torn line) is
split at the glue point so the complete record after it is kept.

One process per file, and damage refused at open (:mod:`prime_rl.storeguard`): opening takes
``flock`` on ``<file>.lock`` (a second process gets a clear error: the stores keep in-memory
indexes another writer would silently invalidate), and refuses a write-ahead log damaged in its
middle or missing after a crash, which SQLite itself would open without the lost commits and
without a word. A clean :meth:`StateDB.close` checkpoints the log into the database first.

Group commit (``defer_sync``): a server that answers many requests sets ``synchronous=NORMAL``, so
a commit appends to the write-ahead log without an fsync, and makes commits durable in groups with
:meth:`StateDB.sync` (one fsync of the log covers every commit before it; ``commits`` counts them),
taken outside its request lock; it acknowledges a request only once a sync covers its commit.


Torch-free and dependency-free: the control plane imports it.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prime_rl.storeguard import StoreGuard, StoreGuardError, open_guard

__all__ = ["Migration", "StateDB", "StateDBError", "read_jsonl_journal"]

log = logging.getLogger(__name__)

Migration = Callable[[sqlite3.Connection], None]
"""One schema step: run inside a transaction; must not commit."""


class StateDBError(RuntimeError):
    """The state database cannot be opened or written (disk full, permissions, corrupt file, newer schema)."""


class StateDB:
    """One SQLite state file (thread-safe: one connection behind a lock; one process per file).

    ``migrations[i]`` brings the schema from version ``i`` to ``i + 1``; opening applies the
    missing ones. ``what`` names the store in errors and logs. ``reader``: inspect a store another
    process may have open (an audit, a test beside a live run): read-only, no lock, no migration.
    """

    def __init__(self, path: str | Path, migrations: Sequence[Migration], what: str, reader: bool = False) -> None:
        self.path = Path(path)
        self.what = what
        self._lock = threading.RLock()
        self._depth = 0
        self.commits = 0  # transactions committed by this process (``sync`` makes them durable)
        self.syncs = 0  # fsyncs ``sync`` took
        self._wal_dir_synced = False
        self._guard: StoreGuard | None = None
        self._closer: weakref.finalize[Any, Any] | None = None
        if reader:
            self.connection, self.version = self._open_reader(len(migrations))
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._guard = guard = self._open_guard()
        try:
            # isolation_level=None: no implicit transactions; BEGIN/COMMIT are ours.
            self.connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=FULL")
            self.connection.execute("PRAGMA foreign_keys=ON")
            self.connection.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            guard.mark_open()  # after journal_mode=WAL: the -wal file exists from here on
            self.version = self._migrate(migrations)
        except sqlite3.Error as error:
            guard.release()
            raise StateDBError(f"could not open the {what} at {self.path}: {error}") from error
        except BaseException:
            guard.release()
            raise
        self._closer = weakref.finalize(self, _close_store, self.connection, guard, self._lock, what)

    def _open_reader(self, known: int) -> tuple[sqlite3.Connection, int]:
        """A read-only connection (writes fail with ``StateDBError``) to a store at schema ``known``."""
        if not self.path.exists():
            raise StateDBError(f"no {self.what} at {self.path}")
        try:
            connection = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
            row = connection.execute("SELECT version FROM schema_version").fetchone()
        except sqlite3.Error as error:
            raise StateDBError(f"could not read the {self.what} at {self.path}: {error}") from error
        version = 0 if row is None else int(row[0])
        if version != known:
            connection.close()
            raise StateDBError(
                f"the {self.what} at {self.path} has schema version {version}, this code reads {known}: "
                "open it once with its own process (which migrates it) or with a matching prime_rl"
            )
        return connection, version

    def _open_guard(self) -> StoreGuard:
        """Lock the file for this process and refuse a damaged or orphaned WAL (before SQLite reads it)."""
        try:
            return open_guard(self.path, self.what)
        except StoreGuardError as error:
            raise StateDBError(str(error)) from error
        except OSError as error:
            raise StateDBError(f"could not lock the {self.what} at {self.path}: {error}") from error

    def _migrate(self, migrations: Sequence[Migration]) -> int:
        row = self.connection.execute("SELECT version FROM schema_version").fetchone()
        version = 0 if row is None else int(row[0])
        if version > len(migrations):
            raise StateDBError(
                f"the {self.what} at {self.path} has schema version {version}, newer than this code knows "
                f"({len(migrations)}); run a newer prime_rl on it"
            )
        for number in range(version, len(migrations)):
            with self.transaction():
                migrations[number](self.connection)
                self.connection.execute("DELETE FROM schema_version")
                self.connection.execute("INSERT INTO schema_version (version) VALUES (?)", (number + 1,))
            log.info("%s: schema migrated to version %d", self.what, number + 1)
        return len(migrations)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One durable transaction (nested calls join the outer one): committed, and fsynced, when the
        outermost block ends without an exception; rolled back when it raises. ``StateDBError`` when
        the commit fails (disk full)."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self.connection
                finally:
                    self._depth -= 1
                return
            try:
                self.connection.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as error:
                raise StateDBError(f"could not write the {self.what} at {self.path}: {error}") from error
            self._depth = 1
            try:
                yield self.connection
            except BaseException:
                self._depth = 0
                self.connection.execute("ROLLBACK")
                raise
            self._depth = 0
            try:
                self.connection.execute("COMMIT")
            except sqlite3.Error as error:
                if self.connection.in_transaction:
                    self.connection.execute("ROLLBACK")
                raise StateDBError(f"could not write the {self.what} at {self.path}: {error}") from error
            self.commits += 1

    def defer_sync(self) -> None:
        """Commit without an fsync from now on (``synchronous=NORMAL``): the caller makes commits
        durable with ``sync`` before it acknowledges them (module docstring: group commit)."""
        with self._lock:
            self.connection.execute("PRAGMA synchronous=NORMAL")

    def sync(self) -> None:
        """Make every transaction committed so far durable: one fsync of the write-ahead log (and of
        its folder, the first time: the log's own name). Safe from any thread, never under the
        connection's lock, so writers go on meanwhile. ``StateDBError`` when the fsync fails."""
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            fd = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:
            return  # nothing written through the log yet
        except OSError as error:
            raise StateDBError(f"could not sync the {self.what} at {self.path}: {error}") from error
        try:
            os.fsync(fd)
            self.syncs += 1
            if not self._wal_dir_synced:
                folder = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
                self._wal_dir_synced = True
        except OSError as error:
            raise StateDBError(f"could not sync the {self.what} at {self.path}: {error}") from error
        finally:
            os.close(fd)

    def write(self, sql: str, rows: Sequence[Sequence[Any]] = ((),)) -> None:
        """Run one statement per row of parameters in one transaction (``StateDBError`` on failure)."""
        try:
            with self.transaction() as connection:
                connection.executemany(sql, rows)
        except sqlite3.Error as error:
            raise StateDBError(f"could not write the {self.what} at {self.path}: {error}") from error

    def read(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """All rows of one query."""
        with self._lock:
            try:
                return self.connection.execute(sql, parameters).fetchall()
            except sqlite3.Error as error:
                raise StateDBError(f"could not read the {self.what} at {self.path}: {error}") from error

    def close(self) -> None:
        """Checkpoint the log into the database, mark the close clean, and release the lock."""
        with self._lock:
            if self._closer is not None:
                self._closer()  # once; also run when the object is collected or at interpreter exit
            else:
                self.connection.close()  # a reader


def _close_store(connection: sqlite3.Connection, guard: StoreGuard, lock: threading.RLock, what: str) -> None:
    """Close a writer's connection cleanly: a process that exits without :meth:`StateDB.close`
    would still have SQLite checkpoint and delete the WAL as its connection goes, and the
    ``open`` marker left behind would then read as a lost log at the next open."""
    with lock:
        try:
            busy = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy is not None and busy[0] == 0:
                guard.mark_closed()
        except (sqlite3.Error, OSError) as error:
            log.warning("%s: clean close failed (%s); the next open checks the log", what, error)
        finally:
            connection.close()
            guard.release()


def _glued_record(line: str) -> dict[str, Any] | None:
    """A line that does not parse may be a torn record with a whole one glued after it (the old
    journals' failure): the longest proper suffix starting at ``{"`` that parses as an object."""
    start = line.find('{"', 1)
    while start != -1:
        try:
            candidate = json.loads(line[start:])
        except json.JSONDecodeError:
            start = line.find('{"', start + 1)
            continue
        return candidate if isinstance(candidate, dict) else None
    return None


def read_jsonl_journal(path: Path, what: str) -> list[dict[str, Any]]:
    """Every JSON-object line of an old journal, in order (none if the file does not exist).

    A line that does not parse is torn: if a complete record was glued onto it, that record is
    kept (the torn prefix is dropped), otherwise the whole line is dropped; each drop is logged.
    """
    if not path.exists():
        return []
    events: list[dict[str, Any]] = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                glued = _glued_record(line.strip())
                log.warning(
                    "%s line %d is torn (crash during a write); %s",
                    what,
                    number,
                    "kept the whole record glued after it" if glued is not None else "dropped",
                )
                if glued is not None:
                    events.append(glued)
                continue
            if isinstance(event, dict):
                events.append(event)
            else:
                log.warning("%s line %d is not a JSON object; dropped", what, number)
    return events
