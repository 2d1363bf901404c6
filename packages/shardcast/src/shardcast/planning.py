"""Shard planning: how a file of ``file_size`` bytes is cut into fixed-size shards.

Shard ``i`` (0-based) covers bytes ``[i * shard_size, min((i + 1) * shard_size, file_size))``;
``num_shards = ceil(file_size / shard_size)``, and the last shard is short unless the size
divides evenly. An empty file has zero shards.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SHARD_SIZE = 50_000_000
"""50 MB, the reference shardcast default (``SHARDCAST_SHARD_SIZE``)."""

MIN_SHARD_SIZE = 1
MAX_SHARD_SIZE = 1 << 32
"""4 GiB: larger shards defeat pipelining and resume, and a manifest asking for them is suspect."""

MAX_SHARDS = 1_000_000
"""Upper bound on shards per version (1 M × 50 MB = 50 TB): protects against absurd manifests."""


@dataclass(frozen=True)
class ShardSpan:
    """Where one shard lies in the original file: ``[offset, offset + size)``."""

    index: int
    offset: int
    size: int


def num_shards(file_size: int, shard_size: int) -> int:
    """``ceil(file_size / shard_size)``; raises ``ValueError`` on non-positive shard size."""
    if shard_size < MIN_SHARD_SIZE:
        raise ValueError(f"shard_size must be >= {MIN_SHARD_SIZE}, got {shard_size}")
    if file_size < 0:
        raise ValueError(f"file_size must be >= 0, got {file_size}")
    return -(-file_size // shard_size)


def shard_span(index: int, file_size: int, shard_size: int) -> ShardSpan:
    """The span of shard ``index``; raises ``IndexError`` outside ``[0, num_shards)``."""
    count = num_shards(file_size, shard_size)
    if not 0 <= index < count:
        raise IndexError(f"shard {index} out of range for {count} shards")
    offset = index * shard_size
    return ShardSpan(index=index, offset=offset, size=min(shard_size, file_size - offset))


def plan_shards(file_size: int, shard_size: int) -> list[ShardSpan]:
    """All shard spans in order. They tile ``[0, file_size)`` exactly, without gaps or overlap."""
    count = num_shards(file_size, shard_size)
    return [
        ShardSpan(index=i, offset=i * shard_size, size=min(shard_size, file_size - i * shard_size))
        for i in range(count)
    ]
