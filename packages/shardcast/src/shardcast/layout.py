"""The static on-disk layout shared by origins and relays, and its index file.

::

    DATA_DIR/
      index.json                  # live versions, rewritten atomically (temp file + rename)
      v7/manifest.json            # written only after every shard_ file of v7 exists (origin)
      v7/shard_000000.bin         # stored bytes of shard 0 (raw or zstd, see manifest.encoding)
      v7/delta_000000.bin         # optional: zstd(shard XOR same shard of the base version)
      .staging/                   # temporary files and the lock; never served

Any static file server can serve ``DATA_DIR`` as-is (deny dot-paths; see the README for an
nginx snippet). Only paths matching :data:`SERVED_PATH` are served by ours.

``index.json``::

    {"format": "shardcast-index/1",
     "versions": [{"version": 6, "complete": true}, {"version": 7, "complete": false}],
     "retired": [{"version": 2, "retired_at": 1790000000.0}]}

``complete`` is false on a relay that is still mirroring the version (its verified shards
are already served). ``retired`` versions are no longer listed but their files stay on disk
for a grace period so that in-flight downloads finish.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ManifestError
from .manifest import MAX_VERSION

INDEX_NAME = "index.json"
INDEX_FORMAT = "shardcast-index/1"
MANIFEST_NAME = "manifest.json"
STAGING_DIR = ".staging"
MAX_INDEX_BYTES = 1 << 20
MAX_LISTED_VERSIONS = 1000

SERVED_PATH = re.compile(r"^(index\.json|v[0-9]{1,12}/(manifest\.json|(shard|delta)_[0-9]{6}\.bin))$")
"""Every URL path (without the leading slash) a shardcast server answers."""


def version_dir_name(version: int) -> str:
    return f"v{version}"


def shard_name(index: int) -> str:
    return f"shard_{index:06d}.bin"


def delta_name(index: int) -> str:
    return f"delta_{index:06d}.bin"


def shard_url_path(version: int, index: int, delta: bool = False) -> str:
    """URL path (no leading slash) of a stored shard."""
    return f"{version_dir_name(version)}/{delta_name(index) if delta else shard_name(index)}"


def manifest_url_path(version: int) -> str:
    return f"{version_dir_name(version)}/{MANIFEST_NAME}"


@dataclass(frozen=True)
class IndexEntry:
    version: int
    complete: bool


@dataclass(frozen=True)
class RetiredEntry:
    version: int
    retired_at: float


@dataclass(frozen=True)
class Index:
    """Parsed ``index.json``: live versions (ascending) and retired ones awaiting deletion."""

    versions: tuple[IndexEntry, ...] = ()
    retired: tuple[RetiredEntry, ...] = field(default=())

    def latest(self, complete_only: bool = False) -> int | None:
        live = [e.version for e in self.versions if e.complete or not complete_only]
        return max(live) if live else None

    def entry(self, version: int) -> IndexEntry | None:
        return next((e for e in self.versions if e.version == version), None)

    def to_json(self) -> bytes:
        obj = {
            "format": INDEX_FORMAT,
            "versions": [{"version": e.version, "complete": e.complete} for e in self.versions],
            "retired": [{"version": r.version, "retired_at": r.retired_at} for r in self.retired],
        }
        return json.dumps(obj, indent=1).encode()


def parse_index(data: bytes | str) -> Index:
    """Strictly parse untrusted ``index.json`` bytes; raise :class:`ManifestError` if malformed."""
    if len(data) > MAX_INDEX_BYTES:
        raise ManifestError(f"index is {len(data)} bytes, more than the limit of {MAX_INDEX_BYTES}")
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ManifestError(f"index is not valid JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("format") != INDEX_FORMAT:
        raise ManifestError(f"index: expected an object with format {INDEX_FORMAT!r}")
    versions, retired = obj.get("versions"), obj.get("retired", [])
    if not isinstance(versions, list) or not isinstance(retired, list):
        raise ManifestError("index: 'versions' and 'retired' must be lists")
    if len(versions) + len(retired) > MAX_LISTED_VERSIONS:
        raise ManifestError(f"index lists more than {MAX_LISTED_VERSIONS} versions")
    entries = []
    for item in versions:
        if not isinstance(item, dict) or type(item.get("complete")) is not bool:
            raise ManifestError(f"index: bad version entry {str(item)[:80]!r}")
        entries.append(IndexEntry(_version(item.get("version")), item["complete"]))
    gone = []
    for item in retired:
        stamp = item.get("retired_at") if isinstance(item, dict) else None
        if type(stamp) not in (int, float):
            raise ManifestError(f"index: bad retired entry {str(item)[:80]!r}")
        gone.append(RetiredEntry(_version(item.get("version")), float(stamp)))  # type: ignore[arg-type]
    if len({e.version for e in entries}) != len(entries):
        raise ManifestError("index: duplicate versions")
    return Index(tuple(sorted(entries, key=lambda e: e.version)), tuple(gone))


def _version(value: object) -> int:
    if type(value) is not int or not 1 <= value <= MAX_VERSION:  # type: ignore[operator]
        raise ManifestError(
            f"index: invalid version {str(value)[:40]!r}: must be an integer in [1, {MAX_VERSION}]"
        )
    return value  # type: ignore[return-value]


class DataDir:
    """A served directory. All paths are built from validated integers, never from input strings."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(exist_ok=True)

    @property
    def staging(self) -> Path:
        return self.root / STAGING_DIR

    def version_dir(self, version: int) -> Path:
        return self.root / version_dir_name(version)

    def manifest_path(self, version: int) -> Path:
        return self.version_dir(version) / MANIFEST_NAME

    def shard_path(self, version: int, index: int, delta: bool = False) -> Path:
        return self.version_dir(version) / (delta_name(index) if delta else shard_name(index))

    def read_index(self) -> Index:
        try:
            return parse_index((self.root / INDEX_NAME).read_bytes())
        except FileNotFoundError:
            return Index()

    def write_index(self, index: Index) -> None:
        self.atomic_write(self.root / INDEX_NAME, index.to_json())

    def atomic_write(self, path: Path, data: bytes) -> None:
        """Write ``data`` to ``path`` via a temporary file in ``.staging`` and ``os.replace``."""
        fd, tmp = tempfile.mkstemp(dir=self.staging, prefix="write-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Inter-process lock around read-modify-write of the index (``flock`` on ``.staging/lock``)."""
        with open(self.staging / "lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def local_versions(self) -> list[int]:
        """Version directories present on disk (``v<N>`` only)."""
        found = []
        for child in self.root.iterdir():
            if child.is_dir() and re.fullmatch(r"v[0-9]{1,12}", child.name):
                found.append(int(child.name[1:]))
        return sorted(found)

    def update_index(
        self,
        *,
        add: IndexEntry | None = None,
        keep: int,
        grace_s: float,
        now: float | None = None,
    ) -> tuple[Index, list[int]]:
        """Add/replace one entry, retire all but the newest ``keep``, delete expired retirees.

        A retired version is removed from ``versions`` at once but its directory is only
        deleted ``grace_s`` seconds later, so downloads that already hold its manifest finish.
        Returns the new index and the versions whose directories were deleted.
        """
        now = time.time() if now is None else now
        with self.locked():
            index = self.read_index()
            live = {e.version: e for e in index.versions}
            retired = {r.version: r for r in index.retired}
            if add is not None:
                live[add.version] = add
                retired.pop(add.version, None)
            ordered = sorted(live)
            for version in ordered[: max(0, len(ordered) - keep)]:
                del live[version]
                retired[version] = RetiredEntry(version, now)
            deleted = []
            for version, entry in list(retired.items()):
                if now - entry.retired_at >= grace_s:
                    shutil.rmtree(self.version_dir(version), ignore_errors=True)
                    del retired[version]
                    deleted.append(version)
            new = Index(tuple(live[v] for v in sorted(live)), tuple(retired[v] for v in sorted(retired)))
            self.write_index(new)
        return new, deleted
