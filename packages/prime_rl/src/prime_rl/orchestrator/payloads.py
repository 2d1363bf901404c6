"""Payload files: one submitted batch each in ``batches/`` until its step's record is written.

A payload is read about three times while it lives (the validator's pending batch, the trainer's
claim, the record: ``record.py``), so it is kept in the form cheapest to write and read: an Arrow
IPC file (``.arrow``, uncompressed). For ``soak.py``'s batch of 8 samples it takes an eighth of the
CPU time of a zstd parquet file to write and a ninth to read, and with log-probs and proofs that do
not compress it is no larger (70 KB against 87 KB: ``benchmarks/results/payload_format.json``). The
record files, which stay, are compressed parquet. A store written before issue 44 has ``.parquet``
payloads; they are still read, recorded and cleaned up.

:class:`PayloadCache` keeps the tables written or read last, up to a fixed number of bytes, so the
reads that follow a submission seldom touch the disk. Its size is a constant, not a share of
history: the payloads it holds are the open batches' (the oldest go first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

__all__ = ["PAYLOAD_CACHE_BYTES", "PAYLOAD_SUFFIXES", "PayloadCache", "payload_batch_id", "read_payload_file"]
__all__ += ["write_payload_file"]

PAYLOAD_SUFFIXES = (".arrow", ".parquet")
"""Payload file suffixes: Arrow IPC files, and parquet in a store written before issue 44."""

PAYLOAD_CACHE_BYTES = 32 * 2**20
"""What :class:`PayloadCache` holds at most (about 500 batches of 8 samples of 512 tokens)."""


def write_payload_file(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` as an Arrow IPC file (a payload file is named ``.arrow``)."""
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read_payload_file(path: Path) -> pa.Table:
    """The payload file ``path``, either format (``PAYLOAD_SUFFIXES``); OSError or ArrowException."""
    if path.suffix == ".parquet":
        return pq.ParquetFile(path).read()
    with pa.OSFile(str(path), "rb") as source:
        return ipc.open_file(source).read_all()


def payload_batch_id(path: Path) -> str | None:
    """The batch id a payload file is named for (``<batch_id>.<12 hex>.<suffix>``, or
    ``<batch_id>.parquet`` in a store written before), or None: not a payload file."""
    if path.suffix not in PAYLOAD_SUFFIXES or path.name.startswith("."):
        return None
    stem = path.name[: -len(path.suffix)]
    head, _, tail = stem.rpartition(".")
    return head if head and len(tail) == 12 else stem


class PayloadCache:
    """The payload tables of one ``batches/`` folder written or read last, by file name, up to
    ``max_bytes`` (least recently used out first). Thread-safe: a server writes payloads outside its
    request lock. File names are never reused (``<batch_id>.<random>``), so an entry is never stale;
    payload files are deleted through ``delete``, which drops their entries too (a record has just
    read them, so they would otherwise be the last to go)."""

    def __init__(self, max_bytes: int = PAYLOAD_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._tables: OrderedDict[str, tuple[pa.Table, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tables)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, Path) and path.name in self._tables

    @property
    def nbytes(self) -> int:
        return self._bytes

    def put(self, path: Path, table: pa.Table) -> None:
        """Keep ``table`` as the content of the payload file ``path`` (written, or just read)."""
        size = table.get_total_buffer_size()  # (``nbytes`` walks the buffers' slices: 30x the time)
        if size > self.max_bytes:
            return
        with self._lock:
            _, old = self._tables.pop(path.name, (None, 0))
            self._bytes += size - old
            self._tables[path.name] = (table, size)
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._tables.popitem(last=False)
                self._bytes -= evicted

    def clear(self) -> None:
        """Hold nothing, and hand the memory pool's unused memory back to the system."""
        with self._lock:
            self._tables.clear()
            self._bytes = 0
        pa.default_memory_pool().release_unused()

    def delete(self, paths: Iterable[Path]) -> None:
        """Delete the payload files ``paths`` (those missing already too) and their entries. No folder
        fsync: a file a power cut brings back is deleted at the store's next open (``record.finish``)."""
        for path in paths:
            with self._lock:
                _, size = self._tables.pop(path.name, (None, 0))
                self._bytes -= size
            path.unlink(missing_ok=True)

    def read(self, path: Path) -> pa.Table:
        """The payload file ``path``: from memory when held, else from disk (then held)."""
        with self._lock:
            held = self._tables.get(path.name)
            if held is not None:
                self._tables.move_to_end(path.name)
                return held[0]
        table = read_payload_file(path)
        self.put(path, table)
        return table
