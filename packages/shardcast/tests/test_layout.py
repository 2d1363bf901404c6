"""Index parsing, served-path whitelist and retention with a grace period."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcast.errors import ManifestError
from shardcast.layout import SERVED_PATH, DataDir, Index, IndexEntry, parse_index


def test_index_round_trip(tmp_path: Path) -> None:
    store = DataDir(tmp_path)
    index = Index((IndexEntry(1, True), IndexEntry(2, False)))
    store.write_index(index)
    assert store.read_index() == index
    assert index.latest() == 2 and index.latest(complete_only=True) == 1


@pytest.mark.parametrize(
    "obj",
    [
        {"format": "shardcast-index/1", "versions": [{"version": "../x", "complete": True}]},
        {"format": "shardcast-index/1", "versions": [{"version": "/etc", "complete": True}]},
        {"format": "shardcast-index/1", "versions": [{"version": 1.5, "complete": True}]},
        {"format": "shardcast-index/1", "versions": [{"version": 1, "complete": "yes"}]},
        {"format": "shardcast-index/1", "versions": [{"version": 1, "complete": True}] * 2},
        {
            "format": "shardcast-index/1",
            "versions": [{"version": i, "complete": True} for i in range(1, 2000)],
        },
        {"format": "other", "versions": []},
        [],
    ],
)
def test_hostile_index_rejected(obj: object) -> None:
    with pytest.raises(ManifestError):
        parse_index(json.dumps(obj))


@given(st.binary(max_size=200))
@settings(deadline=None)  # no timing in tests: CI machines are shared
def test_index_garbage_never_crashes(data: bytes) -> None:
    with contextlib.suppress(ManifestError):
        parse_index(data)


@pytest.mark.parametrize(
    "path", ["index.json", "v1/manifest.json", "v12/shard_000000.bin", "v3/delta_000123.bin"]
)
def test_served_paths(path: str) -> None:
    assert SERVED_PATH.fullmatch(path)


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/",
        ".staging/lock",
        "v1/../index.json",
        "v1/shard_1.bin",
        "v1/shard_000000.bin.part",
        "v1/",
        "../etc/passwd",
    ],
)
def test_unserved_paths(path: str) -> None:
    assert not SERVED_PATH.fullmatch(path)


def test_retention_keeps_newest_and_waits_for_grace(tmp_path: Path) -> None:
    store = DataDir(tmp_path)
    for version in range(1, 5):
        store.version_dir(version).mkdir()
        store.update_index(add=IndexEntry(version, True), keep=2, grace_s=100.0, now=1000.0 + version)
    index = store.read_index()
    assert [e.version for e in index.versions] == [3, 4]
    assert [r.version for r in index.retired] == [1, 2]
    assert store.version_dir(1).exists()  # within grace: still on disk for in-flight downloads
    # v1 was retired when v3 arrived (t=1003), v2 when v4 arrived (t=1004): at t=1103.5 only v1 is
    # past the 100 s grace (100.5 s vs 99.5 s).
    _, deleted = store.update_index(keep=2, grace_s=100.0, now=1103.5)
    assert deleted == [1]
    assert not store.version_dir(1).exists() and store.version_dir(2).exists()
