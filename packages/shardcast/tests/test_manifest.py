"""Manifest parsing: round-trips, strict rejection of hostile input, never-crash on garbage."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shardcast_testlib import HEX, make_manifest  # type: ignore[import-not-found]

from shardcast.errors import ManifestError
from shardcast.manifest import (
    MANIFEST_FORMAT,
    DeltaInfo,
    Manifest,
    StoredInfo,
    parse_manifest,
    parse_version_name,
    validate_file_name,
)


def mutate(manifest: Manifest, **changes: Any) -> bytes:
    obj = json.loads(manifest.to_json())
    obj.update(changes)
    return json.dumps(obj).encode()


@given(
    file_size=st.integers(0, 5000),
    shard_size=st.integers(1, 700),
    version=st.integers(1, 10**12),
    encoding=st.sampled_from(["raw", "zstd"]),
)
@settings(max_examples=60, deadline=None)
def test_round_trip(file_size: int, shard_size: int, version: int, encoding: str) -> None:
    manifest = make_manifest(file_size, shard_size, version, encoding)
    parsed = parse_manifest(manifest.to_json())
    assert parsed == manifest
    assert parsed.identity() == manifest.identity()
    assert parsed.num_shards == -(-file_size // shard_size)


def test_delta_round_trip() -> None:
    base = make_manifest(version=4)
    delta = DeltaInfo(3, HEX, "xor-zstd", tuple(StoredInfo(1, HEX) for _ in base.shards))
    manifest = Manifest(**{**base.__dict__, "delta": delta})
    assert parse_manifest(manifest.to_json()).delta == delta
    bad = json.loads(manifest.to_json())
    bad["delta"]["base_version"] = 4  # a delta must be against an older version
    with pytest.raises(ManifestError, match="older"):
        parse_manifest(json.dumps(bad))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": "../../etc"}, "version"),
        ({"version": "v1"}, "version"),
        ({"version": 0}, "version"),
        ({"version": True}, "version"),
        ({"version": -5}, "version"),
        ({"file_name": "../../.bashrc"}, "file_name"),
        ({"file_name": "/etc/passwd"}, "file_name"),
        ({"file_name": ".hidden"}, "file_name"),
        ({"file_name": "a\x00b"}, "file_name"),
        ({"file_size": 10**30}, "file_size"),
        (
            {"file_size": 11},
            "disagrees with the plan",
        ),  # 11 bytes / 4: last shard would be 3 bytes, listed as 2
        ({"file_size": 13}, "needs 4 shards"),  # 13 bytes / 4 = 4 shards, only 3 listed
        ({"shard_size": 0}, "shard_size"),
        ({"shard_size": 1, "file_size": 10**12}, "exceeds the limit"),
        ({"format": "shardcast-manifest/99"}, "format"),
        ({"digest_algorithm": "md5"}, "digest_algorithm"),
        ({"file_digest": "XYZ"}, "file_digest"),
        ({"encoding": "gzip"}, "encoding"),
        ({"created_at": float("nan")}, "created_at"),
        ({"shards": "many"}, "shards"),
        ({"extra": 1}, "unexpected keys"),
    ],
)
def test_hostile_fields_are_rejected(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest(mutate(make_manifest(), **changes))


def test_wrong_shard_sizes_and_order_are_rejected() -> None:
    obj = json.loads(make_manifest().to_json())
    obj["shards"][2]["size"] = 3  # plan says the last shard of 10 bytes / 4 is 2 bytes
    with pytest.raises(ManifestError, match="disagrees with the plan"):
        parse_manifest(json.dumps(obj))
    obj = json.loads(make_manifest().to_json())
    obj["shards"][0], obj["shards"][1] = obj["shards"][1], obj["shards"][0]
    with pytest.raises(ManifestError, match="out of order"):
        parse_manifest(json.dumps(obj))
    obj = json.loads(make_manifest().to_json())
    obj["shards"][0]["stored_size"] = 99
    with pytest.raises(ManifestError, match="raw encoding"):
        parse_manifest(json.dumps(obj))


def test_absurd_shard_count_is_rejected_before_allocation() -> None:
    # 10**15 bytes in 1-byte shards: the count is checked before the shard list is looked at.
    data = mutate(make_manifest(), file_size=10**15, shard_size=1, shards=[])
    with pytest.raises(ManifestError, match="exceeds the limit"):
        parse_manifest(data)
    with pytest.raises(ManifestError, match="exceeds the limit"):
        parse_manifest(make_manifest(file_size=100, shard_size=1).to_json(), max_shards=10)


@given(st.binary(max_size=300))
@settings(deadline=None)  # no timing in tests: CI machines are shared
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(ManifestError):
        parse_manifest(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.sampled_from(sorted(json.loads(make_manifest().to_json()))), json_values))
@settings(max_examples=200, deadline=None)
def test_arbitrary_json_objects_never_crash(obj: dict[str, Any]) -> None:
    base = json.loads(make_manifest().to_json())
    base.update(obj)
    with contextlib.suppress(ManifestError):
        parse_manifest(json.dumps(base))


@pytest.mark.parametrize("name", ["v1", "1", 1, "v000012", "v999999999999"])
def test_version_names_accepted(name: str | int) -> None:
    assert parse_version_name(name) >= 1


@pytest.mark.parametrize(
    "name", ["../v1", "v1/..", "v-1", "v", "", "v1.0", "V1", " v1", "v1\n", "v0", "x1", "v1234567890123"]
)
def test_version_names_rejected(name: str) -> None:
    with pytest.raises(ManifestError):
        parse_version_name(name)


@given(st.text(max_size=40))
@settings(deadline=None)  # no timing in tests: CI machines are shared
def test_file_names_never_contain_separators(name: str) -> None:
    try:
        checked = validate_file_name(name)
    except ManifestError:
        return
    assert (
        "/" not in checked
        and "\\" not in checked
        and not checked.startswith(".")
        and checked not in {".", ".."}
    )


def test_format_constant_is_written() -> None:
    assert json.loads(make_manifest().to_json())["format"] == MANIFEST_FORMAT
