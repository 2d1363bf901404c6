"""Helpers shared by shardcast's test modules (made importable by conftest.py)."""

from __future__ import annotations

from shardcast.digest import digest_bytes
from shardcast.manifest import Manifest, ShardInfo
from shardcast.planning import plan_shards

HEX = "ab" * 32


def make_manifest(
    file_size: int = 10, shard_size: int = 4, version: int = 3, encoding: str = "raw"
) -> Manifest:
    shards = []
    for span in plan_shards(file_size, shard_size):
        digest = digest_bytes(bytes([span.index % 256]) * span.size)
        stored = (span.size, digest) if encoding == "raw" else (span.size // 2, HEX)
        shards.append(ShardInfo(span.index, span.size, digest, *stored))
    return Manifest(
        version=version,
        file_name="model.safetensors",
        file_size=file_size,
        shard_size=shard_size,
        file_digest=HEX,
        created_at=1.5,
        encoding=encoding,
        shards=tuple(shards),
    )
