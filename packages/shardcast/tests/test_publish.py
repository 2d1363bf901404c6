"""Publishing: layout on disk, digests, atomic appearance, encodings, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardcast import codec
from shardcast.digest import digest_bytes
from shardcast.errors import AlreadyPublished, PublishError
from shardcast.layout import DataDir
from shardcast.manifest import parse_manifest
from shardcast.publish import publish_file, read_decoded_shard


def test_publish_raw_layout(tmp_path: Path, payload: Path) -> None:
    store = DataDir(tmp_path / "origin")
    manifest = publish_file(store, payload, shard_size=64 * 1024)
    data = payload.read_bytes()
    assert manifest.version == 1 and manifest.num_shards == 17  # ceil((2**20 + 123) / 2**16)
    assert manifest.file_digest == digest_bytes(data)
    assert parse_manifest(store.manifest_path(1).read_bytes()) == manifest
    joined = b"".join(store.shard_path(1, i).read_bytes() for i in range(manifest.num_shards))
    assert joined == data
    for shard in manifest.shards:
        assert shard.digest == digest_bytes(data[shard.index * 65536 : (shard.index + 1) * 65536])
    assert [e.version for e in store.read_index().versions] == [1]
    assert list(store.staging.iterdir()) == [store.staging / "lock"]  # nothing left behind


def test_versions_increment_and_clash(tmp_path: Path, payload: Path) -> None:
    store = DataDir(tmp_path / "origin")
    assert publish_file(store, payload).version == 1
    assert publish_file(store, payload).version == 2
    with pytest.raises(AlreadyPublished, match="already exists") as clash:  # a PublishError, typed
        publish_file(store, payload, version=2)
    assert clash.value.version == 2 and isinstance(clash.value, PublishError)
    with pytest.raises(PublishError, match="not a regular file"):
        publish_file(store, tmp_path / "missing")
    with pytest.raises(PublishError, match="encoding"):
        publish_file(store, payload, encoding="lz4")


def test_zstd_and_delta_shards_decode(tmp_path: Path, payload: Path) -> None:
    store = DataDir(tmp_path / "origin")
    first = publish_file(store, payload, shard_size=100_000, encoding="zstd")
    changed = bytearray(payload.read_bytes())
    changed[5] ^= 0xFF
    payload.write_bytes(bytes(changed))
    second = publish_file(store, payload, shard_size=100_000, encoding="zstd", delta=True)
    assert second.delta is not None and second.delta.base_version == first.version
    assert second.delta.base_digest == first.file_digest
    for i in range(second.num_shards):
        assert read_decoded_shard(store, second, i) == bytes(changed[i * 100_000 : (i + 1) * 100_000])
        base = read_decoded_shard(store, first, i)
        delta = store.shard_path(2, i, delta=True).read_bytes()
        assert codec.decode_delta(delta, base) == bytes(changed[i * 100_000 : (i + 1) * 100_000])
    # Only shard 0 changed, so the other deltas are all-zero XORs and compress to almost nothing.
    assert all(d.stored_size < 100 for d in second.delta.shards[1:])
