"""Guards around a SQLite state file: one process per file (``flock``), and damage refused at open.

:class:`prime_rl.statedb.StateDB` calls :func:`open_guard` before SQLite touches the file, so what
SQLite would do silently is refused loudly instead:

- **A second process on the same store.** The stores keep in-memory indexes that another writer
  would invalidate, and the orchestrator's store deletes crash leftovers (temporary files) at open
  that a live writer may still be writing. The guard takes ``fcntl.flock`` on ``<db>.lock`` for as
  long as the store is open; a second opener gets :class:`StoreLocked` naming the holder's pid.
  The kernel drops the lock when the holder dies, however it dies, so a crash never leaves a stale
  lock behind.
- **A damaged middle of the write-ahead log.** SQLite reads the WAL frame by frame and stops at the
  first frame whose salt or cumulative checksum does not match: every later commit is dropped
  without an error, and ``PRAGMA integrity_check`` still says ``ok`` (it checks the database as
  read, not what was dropped). :func:`scan_wal` walks the frames itself. A frame that fails is
  normal at the tail (the last transaction a crash interrupted, never acknowledged), so the guard
  refuses only when frames that verify against their own predecessor follow the end of that one
  in-flight transaction: they prove that a later transaction was written, which SQLite only does
  after the damaged one had committed.
- **A missing WAL.** SQLite opens a WAL-mode database without its ``-wal`` file as if the log were
  empty: everything not yet checkpointed (with the default auto-checkpoint, up to about a thousand
  pages of recent commits, or the whole store) is gone without a word. On a clean close the guard
  checkpoints the log into the database and writes ``closed`` into the lock file; at open it writes
  ``open``. A missing WAL beside a WAL-mode database whose last user never closed it is refused.

- **A missing database** where the lock file or a WAL with commits says a store was: SQLite would
  start an empty one.

Each refusal says which files to restore; ``python -m prime_rl.storeguard accept <db>`` (:func:`accept`)
lets the next open read the store as SQLite would instead, once. The check assumes each commit is
on disk before the next starts (``synchronous=FULL``); with commits made durable in groups, a power
cut can leave several unacknowledged transactions out of order, which reads as damage (a false
alarm, never a silent loss). Torch-free; numpy for the checksum.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "ACCEPT",
    "StoreDamaged",
    "StoreGuard",
    "StoreGuardError",
    "StoreLocked",
    "WalScan",
    "accept",
    "open_guard",
    "scan_wal",
]

log = logging.getLogger(__name__)

WAL_MAGIC = (0x377F0682, 0x377F0683)  # low bit set: checksums over big-endian words
WAL_HEADER = 32
FRAME_HEADER = 24


class StoreGuardError(RuntimeError):
    """The store cannot be opened safely (another process holds it, or its files are damaged)."""


class StoreLocked(StoreGuardError):
    """Another live process has the store open."""


class StoreDamaged(StoreGuardError):
    """The store's files show committed data that SQLite would silently drop."""


@dataclass(frozen=True)
class WalScan:
    """What :func:`scan_wal` found: ``frames`` SQLite would read (the valid prefix), the committed
    frames among them, and, after the first frame that fails (``bad_frame``, None if none), how many
    frames still verify against their predecessor and how many of those are commits that SQLite
    would drop (``lost_commits``). ``damaged``: such frames follow the in-flight transaction."""

    frames: int
    committed_frames: int
    bad_frame: int | None
    verified_after_bad: int
    lost_commits: int
    damaged: bool


def _checksum_loop(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum, as SQLite writes it: over pairs of 32-bit words, seeded with the
    previous values (``s0 += a + s1; s1 += b + s0`` per pair ``a, b``, modulo 2**32)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for index in range(0, len(words), 2):
        s0 = (s0 + words[index] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[index + 1] + s0) & 0xFFFFFFFF
    return s0, s1


@functools.lru_cache(maxsize=8)
def _weights(pairs: int) -> tuple[Any, Any, tuple[int, int, int, int]]:
    """The checksum as one linear map: per pair ``v' = M v + (a, a + b)`` with ``M = [[1, 1], [1, 2]]``,
    so after ``n`` pairs ``v = M^n v0 + sum_i M^(n-1-i) (a_i, a_i + b_i)``. Returns the weights of
    every ``a_i`` and ``b_i`` on ``s0`` and ``s1`` and ``M^n`` (all modulo 2**32)."""
    import numpy as np

    mask = 0xFFFFFFFF
    power = (1, 0, 0, 1)  # M^0 as (m00, m01, m10, m11)
    on_a = np.zeros((2, pairs), dtype=np.uint64)
    on_b = np.zeros((2, pairs), dtype=np.uint64)
    for step in range(pairs):  # power = M^step is the weight of pair n - 1 - step
        m00, m01, m10, m11 = power
        on_a[:, pairs - 1 - step] = ((m00 + m01) & mask, (m10 + m11) & mask)
        on_b[:, pairs - 1 - step] = (m01, m11)
        power = ((m00 + m01) & mask, (m00 + 2 * m01) & mask, (m10 + m11) & mask, (m10 + 2 * m11) & mask)
    return on_a, on_b, power


def _checksum(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    """:func:`_checksum_loop`, vectorised (numpy): a page in microseconds rather than a millisecond.
    Unsigned 64-bit arithmetic wraps modulo 2**64, a multiple of 2**32, so the low 32 bits are exact."""
    import numpy as np

    words = np.frombuffer(data, dtype=">u4" if big_endian else "<u4").astype(np.uint64)
    on_a, on_b, (m00, m01, m10, m11) = _weights(len(words) // 2)
    a, b = words[0::2], words[1::2]
    with np.errstate(over="ignore"):
        total = on_a @ a + on_b @ b
    mask = 0xFFFFFFFF
    return (int(total[0]) + m00 * s0 + m01 * s1) & mask, (int(total[1]) + m10 * s0 + m11 * s1) & mask


def _db_page_size(db_path: Path) -> int | None:
    try:
        with open(db_path, "rb") as handle:
            header = handle.read(100)
    except OSError:
        return None
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return None
    size = struct.unpack(">H", header[16:18])[0]
    return 65536 if size == 1 else size


def scan_wal(wal_path: Path, page_size_hint: int | None = None) -> WalScan:
    """Walk ``wal_path``'s frames as SQLite's recovery does, and past the first one that fails.

    A frame after a failed one is checked against the checksum its predecessor *stores*, so a
    frame written in sequence verifies even though the chain from the header is broken.
    """
    data = wal_path.read_bytes()
    if len(data) < WAL_HEADER:
        return WalScan(0, 0, None, 0, 0, False)
    magic, _version, page_size, _sequence, salt1, salt2, check1, check2 = struct.unpack(
        ">8I", data[:WAL_HEADER]
    )
    header_ok = magic in WAL_MAGIC and page_size >= 512 and page_size & (page_size - 1) == 0
    endian_options = [magic & 1 == 1] if magic in WAL_MAGIC else [True, False]
    if not (page_size >= 512 and page_size & (page_size - 1) == 0):
        page_size = page_size_hint or 4096
    best: WalScan | None = None
    for big_endian in endian_options:
        seed = _checksum(data[:24], 0, 0, big_endian)
        valid = header_ok and seed == (check1, check2)
        scan = _walk(data, page_size, (salt1, salt2), (check1, check2), big_endian, valid)
        if best is None or scan.verified_after_bad > best.verified_after_bad:
            best = scan
    assert best is not None
    return best


def _walk(
    data: bytes, page_size: int, salts: tuple[int, int], seed: tuple[int, int], big_endian: bool, valid: bool
) -> WalScan:
    frame_size = FRAME_HEADER + page_size
    frames = committed = verified_after = lost = 0
    bad: int | None = None if valid else -1  # -1: the header itself failed
    boundary: int | None = None  # the in-flight transaction's last frame (its commit), once seen
    damaged = False
    running = seed
    previous_stored = seed
    for index, offset in enumerate(range(WAL_HEADER, len(data) - frame_size + 1, frame_size)):
        page, commit_size, salt1, salt2, check1, check2 = struct.unpack(
            ">6I", data[offset : offset + FRAME_HEADER]
        )
        body = data[offset : offset + 8] + data[offset + FRAME_HEADER : offset + frame_size]
        same_run = (salt1, salt2) == salts and page != 0
        if bad is None:
            running = _checksum(body, *running, big_endian) if same_run else running
            if same_run and running == (check1, check2):
                frames += 1
                if commit_size:
                    committed = frames
            else:
                bad = index
                if same_run and commit_size:
                    boundary = index  # the damaged frame says it ends its transaction
        elif same_run and _checksum(body, *previous_stored, big_endian) == (check1, check2):
            verified_after += 1
            if boundary is not None:
                damaged = True  # a frame of a later transaction: the damaged one had committed
            if commit_size:
                lost += 1
                if boundary is None:
                    boundary = index
        previous_stored = (check1, check2)
    return WalScan(frames, committed, None if bad is None else max(bad, 0), verified_after, lost, damaged)


def _read_state(handle: IO[str]) -> str:
    handle.seek(0)
    return handle.read().strip()


def _write_state(handle: IO[str], state: str) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(state + "\n")
    handle.flush()
    os.fsync(handle.fileno())


class _Held:
    """One lock file this process holds: its open handle and how many open stores share it."""

    def __init__(self, handle: IO[str]) -> None:
        self.handle = handle
        self.count = 1


_HELD: dict[Path, _Held] = {}
_HELD_LOCK = threading.Lock()
_HELD_OWNER: list[int] = []  # the thread inside ``_holding`` (at most one entry)
_DEFERRED: list[Callable[[], None]] = []


@contextmanager
def _holding() -> Iterator[None]:
    """Hold ``_HELD_LOCK``, and run what was deferred to it (``_locked``) before and after.

    Pitfall: a store's ``weakref.finalize`` (statedb.py) may run inside this very block, when the
    garbage collector fires in the middle of ``open_guard``; taking the lock again there would
    deadlock, so such a finalizer's release is deferred to the end of the block."""
    with _HELD_LOCK:
        _HELD_OWNER.append(threading.get_ident())
        try:
            _run_deferred()
            yield
            _run_deferred()
        finally:
            _HELD_OWNER.clear()


def _run_deferred() -> None:
    while _DEFERRED:
        _DEFERRED.pop(0)()


def _locked(action: Callable[[], None]) -> None:
    """Run ``action`` under ``_HELD_LOCK``; deferred to the end of the block when this thread is
    already inside one (a finalizer run by the garbage collector there, see ``_holding``)."""
    if _HELD_OWNER and _HELD_OWNER[0] == threading.get_ident():
        _DEFERRED.append(action)
        return
    with _holding():
        action()


class StoreGuard:
    """The held lock of one open store, and its ``open``/``closed`` marker (see module docstring).

    Within one process a second open of the same store shares the lock (tests restart a store
    in-process without closing the first); the marker says ``closed`` only when the last one closes.
    """

    def __init__(self, db_path: Path, held: _Held, previous_state: str) -> None:
        self.db_path = db_path
        self.lock_path = db_path.with_name(db_path.name + ".lock")
        self._held: _Held | None = held
        self.previous_state = previous_state

    @property
    def held(self) -> bool:
        return self._held is not None

    def mark_open(self) -> None:
        """Record that this process has the store open (called once SQLite has its ``-wal`` file)."""
        if self._held is not None:
            _write_state(self._held.handle, f"open pid={os.getpid()}")

    def mark_closed(self) -> None:
        """Record a clean close: call only after every commit was checkpointed into the database."""
        _locked(self._mark_closed)

    def _mark_closed(self) -> None:
        if self._held is not None and self._held.count == 1:
            _write_state(self._held.handle, "closed")

    def release(self) -> None:
        """Drop this store's share of the lock (closing the file releases the ``flock``)."""
        _locked(self._release)

    def _release(self) -> None:
        if self._held is None:
            return
        self._held.count -= 1
        if self._held.count == 0:
            self._held.handle.close()
            _HELD.pop(self.lock_path.resolve(), None)
        self._held = None


def _check_files(db_path: Path, previous_state: str, what: str) -> None:
    wal = db_path.with_name(db_path.name + "-wal")
    restore = (
        f"Restore {db_path.name} together with {wal.name} from the same backup (copies taken at one "
        f"moment, while no process had the store open), or move both aside to start an empty {what}."
    )
    if previous_state == ACCEPT:
        log.warning("%s: opening %s as SQLite reads it, as the operator accepted (%s)", what, db_path, ACCEPT)
        return
    if not db_path.exists():
        if previous_state or (wal.exists() and wal.stat().st_size > WAL_HEADER):
            raise StoreDamaged(
                f"the {what}'s database {db_path} is missing, but "
                + (f"its {wal.name} holds commits" if wal.exists() else f"{db_path.name}.lock says one was here")
                + f" ({previous_state or 'a write-ahead log'}); SQLite would start an empty store. Restore "
                f"{db_path.name} (and {wal.name}, if it was backed up with it), or, to start empty, move "
                f"{wal.name} and {db_path.name}.lock aside."
            )
        return
    if wal.exists():
        scan = scan_wal(wal, _db_page_size(db_path))
        if scan.damaged:
            raise StoreDamaged(
                f"the {what}'s write-ahead log {wal} is damaged at frame {scan.bad_frame}: {scan.lost_commits} "
                f"committed transaction(s) after it would be silently dropped by SQLite. {restore} "
                f"To open it as it is, losing those commits: python -m prime_rl.storeguard accept {db_path}"
            )
        return
    try:
        with open(db_path, "rb") as handle:
            header = handle.read(100)
    except FileNotFoundError:
        return
    wal_mode = (
        len(header) == 100 and header.startswith(b"SQLite format 3\x00") and header[18:20] == b"\x02\x02"
    )
    if wal_mode and previous_state.startswith("open"):
        raise StoreDamaged(
            f"the {what}'s write-ahead log {wal} is missing, but the last process to use {db_path} did not "
            f"close it ({previous_state}; it crashed or was killed), so its recent commits lived only in "
            f"that log and SQLite would open the store without them, silently. {restore} To accept the "
            f"loss and open what {db_path.name} holds: python -m prime_rl.storeguard accept {db_path}"
        )


ACCEPT = "accept"
"""The lock file's state after ``python -m prime_rl.storeguard accept <db>``: the next open skips
the damage checks once (the operator chose SQLite's reading over a restore); opening marks it open."""


def accept(db_path: str | Path) -> None:
    """Let the next open of ``db_path`` proceed as SQLite would, losing what the checks protect."""
    path = Path(db_path)
    with open(path.with_name(path.name + ".lock"), "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLocked(f"{path} is open in another process ({_read_state(handle)})") from None
        _write_state(handle, ACCEPT)


def open_guard(db_path: str | Path, what: str) -> StoreGuard:
    """Lock ``db_path`` for this process and refuse damaged files (:class:`StoreLocked`,
    :class:`StoreDamaged`); the caller opens SQLite only after this returns."""
    path = Path(db_path)
    lock_path = path.with_name(path.name + ".lock")
    with _holding():
        held = _HELD.get(lock_path.resolve())
        if held is not None:  # this process has it open already: share the lock
            held.count += 1
            return StoreGuard(path, held, _read_state(held.handle))
        handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the store's lifetime
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_state(handle)
            handle.close()
            raise StoreLocked(
                f"the {what} at {path} is in use by another process ({holder or 'pid unknown'}): two "
                f"processes on one store interleave writes. Stop the other one, or give this one its own "
                f"directory."
            ) from None
        try:
            previous = _read_state(handle)
            _check_files(path, previous, what)
        except BaseException:
            handle.close()
            raise
        held = _Held(handle)
        _HELD[lock_path.resolve()] = held
        return StoreGuard(path, held, previous)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "accept":
        raise SystemExit("usage: python -m prime_rl.storeguard accept <store.sqlite>")
    accept(sys.argv[2])
    print(f"the next open of {sys.argv[2]} skips the damage checks once")
