"""Atomic, durable file writes: a file appears complete under its name, and survives a power cut.

Every process that writes state another process (or its own restart) reads uses this one routine:
the orchestrator's parquet tables, the trainer's checkpoint markers and the policy weights files.
The write goes to a temporary file in the same folder (``.<name>.tmp-<random>``), which is flushed
and fsynced, renamed over the target (``os.replace``, atomic on POSIX), and then the folder itself
is fsynced so that the rename is on disk too. A reader therefore sees the old file or the new one,
never a prefix; after a crash the temporary file may remain and :data:`TEMP_GLOB` finds it.

Pitfall: fsyncing the file is not enough. Without the folder fsync a power cut after the rename can
leave the folder entry pointing at the old file (or at nothing, for a new name) even though the data
blocks are on disk.

Control-plane state (registrations, leases, bans, claims, evidence) is not written here but in
SQLite (:mod:`prime_rl.statedb`): the hand-written JSON-lines journal this module once appended to
glued the next record onto a torn last line after a crash, and replay lost both.

Torch-free and dependency-free: the control plane imports it.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["TEMP_GLOB", "atomic_path", "fsync_dir", "write_atomic"]

log = logging.getLogger(__name__)

TEMP_GLOB = ".*.tmp-*"
"""Glob of the temporary files a crash mid-write can leave behind (``path.rglob(TEMP_GLOB)``)."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (creations, renames, deletions) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on a clean exit it becomes ``path``, durably.

    Write the whole file to the yielded path (any writer that takes a file name: ``save_file``,
    ``pq.write_table``, ``open``). When the block ends without an exception the file is fsynced,
    renamed over ``path`` and the folder fsynced; when it raises, the temporary file is removed and
    ``path`` is untouched. The parent folder is created if needed.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp-{secrets.token_hex(8)}")
    # O_EXCL: never clobber another writer's file; mode 0o666 minus the umask, as open() would give
    # (tempfile.mkstemp would make every file private to its owner).
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield temporary
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (``str`` as UTF-8) to ``path`` atomically and durably; returns ``path``."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path) as temporary:
        temporary.write_bytes(payload)
    return Path(path)
