"""Where downloaded shards land: the client's output file and the relay's data directory.

Client (:class:`OutputSink`): the version is assembled in ``<output>.partial`` next to the
destination (same filesystem, so the final ``os.replace`` is atomic). Raw shards are
written in place at their offset; encoded shards (zstd, delta) are staged as
``<output>.partial.d/<name>.part``, decoded once verified, checked against the decoded
digest and written in place. Progress is journaled in ``<output>.partial.json``
(manifest identity, done shards, bytes of partial raw shards) so a restarted client resumes
where the killed one stopped. The destination is replaced only after the whole-file
digest verifies; on a digest failure the partial files are removed.

Relay (:class:`MirrorSink`): stored bytes go to ``.staging/mirror-v<N>/<name>.part`` and are
renamed into ``v<N>/`` only after their digest verifies, so only verified shards are served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import shutil
import threading
from pathlib import Path
from typing import BinaryIO

from . import codec
from .digest import digest_bytes, new_hasher, update_from_file
from .errors import IntegrityError
from .layout import DataDir, delta_name, shard_name
from .manifest import Manifest
from .planning import shard_span
from .transfer import ShardJob

JOURNAL_FORMAT = "shardcast-journal/1"


class _PartFiles:
    """Append-only ``.part`` files for encoded shards, one open handle per shard."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.handles: dict[str, BinaryIO] = {}

    def path(self, job: ShardJob) -> Path:
        return self.directory / ((delta_name(job.index) if job.delta else shard_name(job.index)) + ".part")

    def size(self, job: ShardJob) -> int:
        try:
            return self.path(job).stat().st_size
        except FileNotFoundError:
            return 0

    def write(self, job: ShardJob, position: int, data: bytes) -> None:
        key = self.path(job).name
        handle = self.handles.get(key)
        if handle is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle = open(self.path(job), "r+b" if self.path(job).exists() else "w+b")  # noqa: SIM115
            self.handles[key] = handle
        handle.seek(position)
        handle.write(data)

    def close(self, job: ShardJob) -> None:
        handle = self.handles.pop(self.path(job).name, None)
        if handle is not None:
            handle.close()

    def reset(self, job: ShardJob) -> None:
        self.close(job)
        with contextlib.suppress(FileNotFoundError):
            self.path(job).unlink()

    def close_all(self) -> None:
        for handle in self.handles.values():
            handle.close()
        self.handles.clear()


class _PrefixHasher:
    """Hash the output file's verified prefix in a background thread while shards arrive.

    Shards complete out of order; whenever shards ``0..k`` are all done, their bytes are
    read back (from the page cache, normally) and fed to the whole-file hasher, so the
    final whole-file check costs only the last few shards instead of a second pass.
    """

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.manifest = manifest
        self.hasher = new_hasher()
        self.next_index = 0
        self.done: set[int] = set()
        self.lock = threading.Lock()
        self.queue: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, name="shardcast-prefix-hash", daemon=True)
        self.thread.start()

    def mark_done(self, index: int) -> None:
        with self.lock:
            self.done.add(index)
            while self.next_index in self.done:
                span = shard_span(self.next_index, self.manifest.file_size, self.manifest.shard_size)
                self.queue.put((span.offset, span.size))
                self.next_index += 1

    def _work(self) -> None:
        try:
            # Unbuffered positional reads: a buffered reader could serve stale read-ahead bytes
            # of a region that was still being written when it was first read.
            fd = os.open(self.path, os.O_RDONLY)
            try:
                while (item := self.queue.get()) is not None:
                    position, remaining = item
                    while remaining:
                        chunk = os.pread(fd, min(remaining, 8 << 20), position)
                        if not chunk:
                            raise OSError(f"{self.path} is shorter than expected")
                        self.hasher.update(chunk)
                        remaining -= len(chunk)
                        position += len(chunk)
            finally:
                os.close(fd)
        except BaseException as exc:
            self.error = exc
            while self.queue.get() is not None:
                pass

    def hexdigest(self) -> str:
        """Wait for the queued work and return the digest of the prefix hashed so far."""
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.hasher.hexdigest()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()


class OutputSink:
    """Assemble ``manifest``'s file at ``output`` (see module docstring).

    ``base_path`` is the previous version's file, required when ``use_delta`` is true.
    """

    def __init__(
        self, manifest: Manifest, output: Path, *, use_delta: bool = False, base_path: Path | None = None
    ) -> None:
        self.manifest = manifest
        self.output = output
        self.tmp = output.with_name(output.name + ".partial")
        self.journal = output.with_name(output.name + ".partial.json")
        self.parts = _PartFiles(output.with_name(output.name + ".partial.d"))
        self.use_delta = use_delta
        self.base_path = base_path
        self.mode = "delta" if use_delta else "full"
        self.identity = manifest.identity()
        self.done: set[tuple[int, bool]] = set()
        self.partial: dict[int, int] = {}
        output.parent.mkdir(parents=True, exist_ok=True)
        self._load_journal()
        flags = os.O_RDWR | os.O_CREAT
        self.fd = os.open(self.tmp, flags, 0o644)
        if os.fstat(self.fd).st_size != manifest.file_size:
            os.ftruncate(self.fd, manifest.file_size)
        self._dirty = False
        self._prefix = _PrefixHasher(self.tmp, manifest)
        for index, _ in sorted(self.done):
            self._prefix.mark_done(index)

    def _load_journal(self) -> None:
        try:
            state = json.loads(self.journal.read_text())
            ok = (
                state.get("format") == JOURNAL_FORMAT
                and state.get("identity") == self.identity
                and self.tmp.exists()
            )
        except (OSError, ValueError, AttributeError):
            ok = False
        if not ok:
            self._discard_files()
            return
        self.done = {(int(i), bool(d)) for i, d in state.get("done", [])}
        self.partial = {int(k): int(v) for k, v in state.get("partial", {}).items()}

    def _discard_files(self) -> None:
        for path in (self.tmp, self.journal):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        shutil.rmtree(self.parts.directory, ignore_errors=True)

    def _in_place(self, job: ShardJob) -> bool:
        return not job.delta and self.manifest.encoding == "raw"

    def _offset(self, job: ShardJob) -> int:
        return job.index * self.manifest.shard_size

    def is_done(self, job: ShardJob) -> bool:
        # Delta and full shards decode to the same bytes in place, so either counts.
        return (job.index, False) in self.done or (job.index, True) in self.done

    def present(self, job: ShardJob) -> int:
        return self.partial.get(job.index, 0) if self._in_place(job) else self.parts.size(job)

    def prefix_hasher(self, job: ShardJob, nbytes: int) -> hashlib._Hash:
        hasher = new_hasher()
        if self._in_place(job):
            update_from_file(hasher, self.tmp, self._offset(job), nbytes)
        else:
            self.parts.close(job)
            update_from_file(hasher, self.parts.path(job), 0, nbytes)
        return hasher

    def write(self, job: ShardJob, position: int, data: bytes) -> None:
        if self._in_place(job):
            os.pwrite(self.fd, data, self._offset(job) + position)
            self.partial[job.index] = position + len(data)
        else:
            self.parts.write(job, position, data)
        self._dirty = True

    def finish(self, job: ShardJob) -> None:
        shard = self.manifest.shards[job.index]
        if not self._in_place(job):
            self.parts.close(job)
            stored = self.parts.path(job).read_bytes()
            try:
                if job.delta:
                    assert self.base_path is not None
                    span = shard_span(job.index, self.manifest.file_size, self.manifest.shard_size)
                    with open(self.base_path, "rb") as base:
                        base.seek(span.offset)
                        data = codec.decode_delta(stored, base.read(span.size))
                else:
                    data = codec.decode(stored, self.manifest.encoding, shard.size)
            except ValueError as exc:
                raise IntegrityError(f"shard {job.index} does not decode: {exc}") from None
            if digest_bytes(data) != shard.digest:
                raise IntegrityError(f"decoded shard {job.index} does not match its digest")
            os.pwrite(self.fd, data, self._offset(job))
            self.parts.reset(job)
        self.partial.pop(job.index, None)
        self.done.add((job.index, job.delta))
        self._prefix.mark_done(job.index)
        self._dirty = True
        self.checkpoint()

    def reset(self, job: ShardJob) -> None:
        if self._in_place(job):
            self.partial.pop(job.index, None)
        else:
            self.parts.reset(job)
        self._dirty = True

    def checkpoint(self) -> None:
        if not self._dirty:
            return
        state = {
            "format": JOURNAL_FORMAT,
            "identity": self.identity,
            "mode": self.mode,
            "done": sorted([i, d] for i, d in self.done),
            "partial": {str(k): v for k, v in self.partial.items()},
        }
        tmp = self.journal.with_name(self.journal.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.journal)
        self._dirty = False

    def finalize(self, verify_whole_file: bool = True, fsync: bool = False) -> None:
        """Check the whole-file digest, then atomically move the file into place.

        Pitfall: without ``fsync`` the rename is atomic for other processes and survives a
        crash of this process, but not necessarily a power loss (the data may still be in
        the page cache when the rename is persisted). ``fsync=True`` costs a full writeback.
        """
        if fsync:
            os.fsync(self.fd)
        if verify_whole_file:
            digest = self._prefix.hexdigest()
            if self._prefix.next_index != self.manifest.num_shards or digest != self.manifest.file_digest:
                self.close()
                self._discard_files()
                raise IntegrityError(
                    f"v{self.manifest.version}: whole-file digest mismatch after assembly; partial output removed"
                )
        self.close()
        os.replace(self.tmp, self.output)
        if fsync:
            directory = os.open(self.output.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        with contextlib.suppress(FileNotFoundError):
            self.journal.unlink()
        shutil.rmtree(self.parts.directory, ignore_errors=True)

    def close(self) -> None:
        self._prefix.stop()
        self.parts.close_all()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class MirrorSink:
    """Store verified shards of ``manifest`` into a relay's ``data_dir`` (see module docstring)."""

    def __init__(self, data_dir: DataDir, manifest: Manifest) -> None:
        self.data_dir = data_dir
        self.manifest = manifest
        self.parts = _PartFiles(data_dir.staging / f"mirror-v{manifest.version}")
        self.done: set[tuple[int, bool]] = set()

    def adopt_existing(self, jobs: list[ShardJob]) -> None:
        """Re-verify shards already in ``v<N>/`` (after a restart); delete bad ones."""
        for job in jobs:
            final = self.data_dir.shard_path(self.manifest.version, job.index, job.delta)
            if final.exists():
                hasher = new_hasher()
                update_from_file(hasher, final)
                if hasher.hexdigest() == job.stored_digest and final.stat().st_size == job.stored_size:
                    self.done.add((job.index, job.delta))
                else:
                    final.unlink()

    def is_done(self, job: ShardJob) -> bool:
        return (job.index, job.delta) in self.done

    def present(self, job: ShardJob) -> int:
        return self.parts.size(job)

    def prefix_hasher(self, job: ShardJob, nbytes: int) -> hashlib._Hash:
        self.parts.close(job)
        hasher = new_hasher()
        update_from_file(hasher, self.parts.path(job), 0, nbytes)
        return hasher

    def write(self, job: ShardJob, position: int, data: bytes) -> None:
        self.parts.write(job, position, data)

    def finish(self, job: ShardJob) -> None:
        self.parts.close(job)
        part = self.parts.path(job)
        os.chmod(part, 0o644)
        os.replace(part, self.data_dir.shard_path(self.manifest.version, job.index, job.delta))
        self.done.add((job.index, job.delta))

    def reset(self, job: ShardJob) -> None:
        self.parts.reset(job)

    def checkpoint(self) -> None:
        return None

    def cleanup(self) -> None:
        self.parts.close_all()
        shutil.rmtree(self.parts.directory, ignore_errors=True)
