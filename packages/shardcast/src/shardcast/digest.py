"""The one checksum routine of the package: SHA-256, hex encoded.

SHA-256 with OpenSSL's SHA extensions (``hashlib`` releases the GIL on large buffers) is
faster than the network paths shardcast targets (``benchmarks/results/shardcast_bench.txt``),
and it needs no third-party dependency.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

DIGEST_ALGORITHM = "sha256"
"""Name written in manifests; the only algorithm accepted by :mod:`shardcast.manifest`."""

DIGEST_HEX_LENGTH = 64

_READ_CHUNK = 4 << 20


def new_hasher() -> hashlib._Hash:
    """A fresh incremental hasher (``.update(bytes)``, ``.hexdigest()``)."""
    return hashlib.sha256()


def digest_bytes(data: bytes | memoryview) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def digest_file(path: str | os.PathLike[str], offset: int = 0, length: int | None = None) -> str:
    """Hex SHA-256 of ``length`` bytes of a file starting at ``offset`` (default: to the end)."""
    hasher = hashlib.sha256()
    update_from_file(hasher, path, offset, length)
    return hasher.hexdigest()


def update_from_file(
    hasher: hashlib._Hash, path: str | os.PathLike[str], offset: int = 0, length: int | None = None
) -> int:
    """Feed ``length`` bytes of ``path`` from ``offset`` into ``hasher``; return the bytes read.

    Pitfall: stops early (returns fewer bytes) when the file is shorter than asked.
    """
    remaining = length if length is not None else max(0, Path(path).stat().st_size - offset)
    done = 0
    with open(path, "rb") as handle:
        handle.seek(offset)
        while remaining > 0:
            chunk = handle.read(min(_READ_CHUNK, remaining))
            if not chunk:
                break
            hasher.update(chunk)
            remaining -= len(chunk)
            done += len(chunk)
    return done
