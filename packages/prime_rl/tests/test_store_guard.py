"""Store damage is loud and one process owns a store (``prime_rl.storeguard`` through ``StateDB``).

Real files, real crashes: a child process commits through :class:`StateDB` and dies with
``os._exit`` (no close, no checkpoint: the commits live only in the WAL, as after ``kill -9``);
the test then damages the files the way a disk or an operator would and reopens them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prime_rl.orchestrator.store import RolloutStore, StoreError
from prime_rl.statedb import StateDB, StateDBError
from prime_rl.storeguard import FRAME_HEADER, WAL_HEADER, scan_wal
from prime_rl.validator.journal import JournalError, ValidatorJournal

COMMITS = 216
PAGE = 4096


def _table(connection) -> None:  # type: ignore[no-untyped-def]
    connection.execute("CREATE TABLE t (i INTEGER, s TEXT)")


def _crash_after_commits(path: Path, commits: int = COMMITS, last_blob: int = 0) -> None:
    """A real process commits ``commits`` rows (the last one ``last_blob`` bytes long, spanning
    several WAL frames when large) and dies without closing."""
    code = textwrap.dedent(f"""
        import os
        from prime_rl.statedb import StateDB
        db = StateDB({str(path)!r}, [lambda c: c.execute("CREATE TABLE t (i INTEGER, s TEXT)")], "probe")
        for i in range({commits}):
            size = {last_blob} if i == {commits} - 1 and {last_blob} else 300
            db.write("INSERT INTO t VALUES (?, ?)", [(i, "x" * size)])
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert Path(f"{path}-wal").stat().st_size > 0


def _frames(wal: Path) -> int:
    return (wal.stat().st_size - WAL_HEADER) // (FRAME_HEADER + PAGE)


def _rows(path: Path) -> int:
    db = StateDB(path, [_table], "probe")
    try:
        return int(db.read("SELECT count(*) FROM t")[0][0])
    finally:
        db.close()


def _damage_frame(wal: Path, frame: int) -> None:
    with open(wal, "r+b") as handle:
        handle.seek(WAL_HEADER + frame * (FRAME_HEADER + PAGE) + FRAME_HEADER + 100)
        handle.write(b"\xff" * 8)


def test_a_damaged_middle_of_the_wal_is_refused_with_what_to_restore(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "state.sqlite"
    _crash_after_commits(path)
    wal = Path(f"{path}-wal")
    _damage_frame(wal, _frames(wal) // 2)
    scan = scan_wal(wal)
    assert scan.damaged and scan.lost_commits > COMMITS // 3  # SQLite would drop all of these silently
    with pytest.raises(
        StateDBError, match=r"damaged at frame .*committed transaction\(s\).*Restore state\.sqlite"
    ):
        StateDB(path, [_table], "probe")
    # the orchestrator's store refuses it too, and nothing was changed by trying
    before = wal.read_bytes()
    with pytest.raises(StoreError, match="damaged"):
        RolloutStore(tmp_path)
    assert wal.read_bytes() == before
    # the operator chooses SQLite's reading over a restore, as the message offers: once
    subprocess.run([sys.executable, "-m", "prime_rl.storeguard", "accept", str(path)], check=True, timeout=60)
    assert _rows(path) == COMMITS - scan.lost_commits - 1  # SQLite kept those before the damaged commit


def test_a_torn_tail_opens_with_every_acknowledged_commit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The last transaction a crash interrupted was never acknowledged: losing it is normal."""
    # (a) the last frame only partly written
    path = tmp_path / "a" / "state.sqlite"
    _crash_after_commits(path)
    wal = Path(f"{path}-wal")
    os.truncate(wal, wal.stat().st_size - PAGE // 2)
    assert not scan_wal(wal).damaged
    assert _rows(path) == COMMITS - 1
    # (b) the last transaction spans frames and one of its middle frames never reached the disk
    # (the writeback reordered it), while its commit frame did
    path = tmp_path / "b" / "state.sqlite"
    _crash_after_commits(path, last_blob=5 * PAGE)
    wal = Path(f"{path}-wal")
    _damage_frame(wal, _frames(wal) - 3)
    scan = scan_wal(wal)
    assert scan.bad_frame is not None and scan.lost_commits == 1 and not scan.damaged
    assert _rows(path) == COMMITS - 1
    # (c) an undamaged WAL after a crash keeps everything
    path = tmp_path / "c" / "state.sqlite"
    _crash_after_commits(path)
    assert scan_wal(Path(f"{path}-wal")).bad_frame is None
    assert _rows(path) == COMMITS


def test_a_missing_wal_after_a_crash_is_refused_but_not_after_a_clean_close(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "state.sqlite"
    _crash_after_commits(path)
    Path(f"{path}-wal").unlink()
    Path(f"{path}-shm").unlink(missing_ok=True)
    with pytest.raises(StateDBError, match=r"write-ahead log .* is missing.*crashed or was killed.*Restore"):
        StateDB(path, [_table], "probe")
    # the operator accepts the loss as the message says: the store opens with what the file holds
    subprocess.run([sys.executable, "-m", "prime_rl.storeguard", "accept", str(path)], check=True, timeout=60)
    StateDB(path, [_table], "probe").close()
    # a clean close checkpoints the log: no WAL is needed to reopen everything
    clean = tmp_path / "clean" / "state.sqlite"
    db = StateDB(clean, [_table], "probe")
    db.write("INSERT INTO t VALUES (?, ?)", [(i, "x") for i in range(50)])
    db.close()
    Path(f"{clean}-wal").unlink(missing_ok=True)
    assert _rows(clean) == 50


def test_the_validator_journal_refuses_a_missing_wal_after_a_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    journal = tmp_path / "validator" / "journal.jsonl"
    code = textwrap.dedent(f"""
        import os
        from prime_rl.validator.journal import ValidatorJournal
        journal = ValidatorJournal({str(journal)!r})
        journal.db.write("INSERT INTO schema_version VALUES (1)")  # a commit that lives in the WAL only
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    Path(f"{journal.with_suffix('.sqlite')}-wal").unlink()
    with pytest.raises(JournalError, match="missing"):
        ValidatorJournal(journal)


_HOLDER = """
import sys, time
from prime_rl.orchestrator.store import RolloutStore
store = RolloutStore(sys.argv[1])
print("ready", flush=True)
time.sleep(60)
"""


def test_a_second_process_on_the_same_store_is_refused_and_deletes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        in_flight = (
            tmp_path / "batches" / ".b-1.parquet.tmp-0123456789abcdef"
        )  # the holder's write in progress
        in_flight.write_bytes(b"partial")
        second = subprocess.run(
            [sys.executable, "-c", "import sys; from prime_rl.orchestrator.store import RolloutStore; RolloutStore(sys.argv[1])",
             str(tmp_path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode != 0
        assert f"in use by another process (open pid={holder.pid})" in second.stderr
        assert in_flight.exists()
        # an inspector beside the live orchestrator reads without the lock, and cannot write
        reader = RolloutStore(tmp_path, reader=True)
        try:
            assert reader.db.read("SELECT count(*) FROM schema_version") == [(1,)]
            with pytest.raises(StateDBError, match="readonly"):
                reader.db.write("DELETE FROM schema_version")
        finally:
            reader.close()
        assert in_flight.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # the kernel released the dead holder's lock: the next orchestrator opens, and cleans up
    RolloutStore(tmp_path).close()
    assert not in_flight.exists()


def test_the_vectorised_checksum_is_sqlites() -> None:
    import random

    from prime_rl.storeguard import _checksum, _checksum_loop

    generator = random.Random(0)
    for size in (24, 8 + 512, 8 + 4096, 8 + 65536):
        data = generator.randbytes(size)
        seed = (generator.getrandbits(32), generator.getrandbits(32))
        for big_endian in (True, False):
            assert _checksum(data, *seed, big_endian) == _checksum_loop(data, *seed, big_endian)


def test_a_process_that_exits_without_closing_leaves_a_store_that_opens(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SQLite checkpoints and deletes the WAL as the last connection goes at exit: that is no loss."""
    path = tmp_path / "state.sqlite"
    code = textwrap.dedent(f"""
        from prime_rl.statedb import StateDB
        db = StateDB({str(path)!r}, [lambda c: c.execute("CREATE TABLE t (i INTEGER, s TEXT)")], "probe")
        db.write("INSERT INTO t VALUES (?, ?)", [(i, "x") for i in range(30)])
    """)  # no close(): the interpreter's exit closes the connection
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    assert _rows(path) == 30


def test_a_deleted_database_is_refused_not_started_empty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "state.sqlite"
    db = StateDB(path, [_table], "probe")
    db.write("INSERT INTO t VALUES (?, ?)", [(1, "x")])
    db.close()
    path.unlink()  # a clean store whose database went (an operator, a sync tool)
    with pytest.raises(StateDBError, match=r"database .* is missing.*SQLite would start an empty store"):
        StateDB(path, [_table], "probe")
    Path(f"{path}.lock").unlink()  # the operator starts empty on purpose, as the message says
    assert _rows(path) == 0


def test_a_store_collected_while_another_opens_does_not_deadlock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A store dropped without close() is closed by its finalizer, which the garbage collector may
    run in the middle of another open (seen: a hypothesis state machine hung in open_guard). The
    finalizer's release must not wait on the lock its own thread holds; the lock is still shared
    correctly and freed once the last store closes."""
    import gc
    import threading

    from prime_rl import storeguard

    path = tmp_path / "state.sqlite"
    stores = [StateDB(path, [], "test store")]  # the only reference to the first store
    failures: list[BaseException] = []
    holding = getattr(storeguard, "_holding", None) or (lambda: storeguard._HELD_LOCK)  # main had a bare lock

    def open_while_the_first_is_collected() -> None:
        try:
            with holding():  # what open_guard holds when the collector fires inside it
                stores.clear()
                gc.collect()  # nothing refers to the first store now: its finalizer runs here
        except BaseException as error:
            failures.append(error)

    done = threading.Thread(target=open_while_the_first_is_collected, daemon=True)
    done.start()
    done.join(timeout=20)
    assert not done.is_alive(), "the finalizer waited on the lock its own thread holds"
    assert not failures, failures
    lock = path.with_name(path.name + ".lock").resolve()
    assert lock not in storeguard._HELD, "the collected store's lock share was not released"
    second = StateDB(path, [], "test store")  # the lock was freed: this process can take it again
    second.close()
