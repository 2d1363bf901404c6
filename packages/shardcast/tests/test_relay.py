"""Relays on loopback: pipelined chains, verification, hostile upstreams, upstream loss."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import requests
from shardcast_testlib import make_manifest  # type: ignore[import-not-found]

from conftest import files_equal, wait_until, write_random  # type: ignore[import-not-found]
from shardcast import Client, Origin
from shardcast.layout import DataDir, Index, IndexEntry, RetiredEntry
from shardcast.server import HttpServer


def test_chain_pipelines_and_delivers(origin_factory, relay_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # 4 MB in 64 KiB shards, origin limited to 100 kB/s per response: the first relay needs
    # several seconds, so the second relay can only serve early shards by pipelining.
    origin = origin_factory(rate_limit_bps=100_000)
    model = write_random(tmp_path / "model.bin", 4_000_000, seed=11)
    first = relay_factory([origin.url], "r1")
    second = relay_factory([first.url], "r2")
    origin.publish(model)
    observed = []

    def second_serves_while_first_incomplete() -> bool:
        if requests.get(f"{second.url}/v1/shard_000000.bin", timeout=10).status_code != 200:
            return False
        entry = first.local_index().entry(1)  # read *after* the relay-2 GET succeeded
        observed.append(entry)
        return True

    wait_until(second_serves_while_first_incomplete, timeout=60, what="relay 2 serving shard 0")
    assert observed[-1] is not None and not observed[-1].complete, (
        "relay 2 only served after relay 1 had everything"
    )
    result = Client([second.url]).fetch(1, tmp_path / "out.bin", deadline_s=120)
    assert files_equal(result.path, model)
    wait_until(lambda: first.local_index().latest(complete_only=True) == 1, what="relay 1 complete")


def test_relay_never_serves_unverified_shards(tmp_path: Path, payload: Path, relay_factory) -> None:  # type: ignore[no-untyped-def]
    with Origin(tmp_path / "a", port=0, shard_size=64 * 1024) as bad_origin:
        manifest = bad_origin.publish(payload)
        shutil.copytree(tmp_path / "a", tmp_path / "b")  # an identical, healthy second origin
        shard3 = bad_origin.data_dir.shard_path(1, 3)
        shard3.write_bytes(b"\x00" + shard3.read_bytes()[1:])
        relay = relay_factory([bad_origin.url], "r")
        wait_until(
            lambda: relay.data_dir.shard_path(1, manifest.num_shards - 1).exists(),
            what="other shards mirrored",
        )
        assert requests.get(f"{relay.url}/v1/shard_000003.bin").status_code == 404
        assert not relay.local_index().entry(1).complete  # type: ignore[union-attr]
        relay.stop()
        with Origin(tmp_path / "b", port=0) as good_origin:
            healed = relay_factory([bad_origin.url, good_origin.url], "r")  # same dir: resumes, re-verifies
            wait_until(lambda: healed.local_index().latest(complete_only=True) == 1, what="relay complete")
            assert (
                healed.data_dir.shard_path(1, 3).read_bytes() == payload.read_bytes()[3 * 65536 : 4 * 65536]
            )


def test_relay_rejects_hostile_upstream_and_writes_nothing_outside(tmp_path: Path, relay_factory) -> None:  # type: ignore[no-untyped-def]
    hostile = DataDir(tmp_path / "hostile")
    hostile.write_index(Index((IndexEntry(1, True), IndexEntry(2, True))))
    for version, change in (
        (1, {"file_name": "../../../escaped"}),
        (2, {"file_size": 10**15, "shard_size": 1}),
    ):
        obj = json.loads(make_manifest(version=version).to_json())
        obj.update(change)
        hostile.version_dir(version).mkdir()
        hostile.manifest_path(version).write_text(json.dumps(obj))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with HttpServer(hostile) as server:
        relay = relay_factory([server.url], "relay")
        wait_until(lambda: "file_name" in relay.last_error or "exceeds" in relay.last_error, what="rejection")
        wait_until(lambda: "file_name" in relay.last_error, what="v1 rejection")
    after = sorted(str(p) for p in tmp_path.rglob("*"))
    new = [p for p in after if p not in before]
    assert all(p.startswith(str(tmp_path / "relay")) for p in new), new
    assert relay.local_index().versions == ()


def test_relay_serves_what_it_has_when_upstream_dies(tmp_path: Path, payload: Path, relay_factory) -> None:  # type: ignore[no-untyped-def]
    origin = Origin(tmp_path / "o", port=0, shard_size=64 * 1024).start()
    origin.publish(payload)
    relay = relay_factory([origin.url], "r")
    wait_until(lambda: relay.local_index().latest(complete_only=True) == 1, what="mirrored")
    origin.stop()
    wait_until(lambda: relay._upstream_ok.get(origin.url) is False, what="relay noticed upstream loss")
    result = Client([relay.url, origin.url]).fetch("latest", tmp_path / "out.bin", deadline_s=60)
    assert files_equal(result.path, payload)
    assert relay.local_index().latest(complete_only=True) == 1


def test_relay_deletes_retired_versions_after_grace_without_new_versions(tmp_path: Path, relay_factory) -> None:  # type: ignore[no-untyped-def]
    # v1 was retired 0.2 s ago with a grace of 0.3 s, and the upstream is dead, so no new version
    # will ever touch the index: only the relay's own sweep (every 0.5 s, the floor of
    # sweep_interval_s) can delete it. It used to stay on disk until the next version arrived.
    data_dir = DataDir(tmp_path / "r")
    data_dir.version_dir(1).mkdir()
    (data_dir.version_dir(1) / "manifest.json").write_text("{}")
    data_dir.write_index(Index(versions=(), retired=(RetiredEntry(1, time.time() - 0.2),)))
    relay = relay_factory(["http://127.0.0.1:9"], "r", grace_s=0.3)
    assert data_dir.version_dir(1).is_dir(), "deleted before its grace period was over"
    # the sweep deletes the directory first and rewrites the index after it: wait for both
    wait_until(
        lambda: not data_dir.version_dir(1).exists() and relay.local_index().retired == (),
        timeout=5,
        what="retired v1 deleted and unlisted",
    )


def test_relay_places_every_delta_shard_before_any_full_shard(origin_factory, relay_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A client holding the previous version needs only the deltas, so a relay must not make it wait
    # behind the full shards. Upstream full shards are slow (64 KiB at 200 kB/s per response) and
    # there are more jobs (24 deltas + 24 shards) than the relay has slots (8) or connections (4).
    origin = origin_factory(rate_limit_bps=200_000, delta=True)
    first = write_random(tmp_path / "v1.bin", 24 * 64 * 1024, seed=3)
    second = bytearray(first.read_bytes())
    second[::4096] = bytes(len(second[::4096]))  # a sparse change: small delta shards
    (tmp_path / "v2.bin").write_bytes(bytes(second))
    origin.publish(first, file_name="model.bin")
    relay = relay_factory([origin.url], "r1")
    wait_until(lambda: relay.local_index().latest(complete_only=True) == 1, timeout=60, what="v1 mirrored")
    origin.publish(tmp_path / "v2.bin", file_name="model.bin")
    version_dir = tmp_path / "r1" / "v2"
    first_seen: dict[str, float] = {}

    def complete() -> bool:
        if version_dir.is_dir():
            now = time.monotonic()
            for path in version_dir.glob("*_*.bin"):
                first_seen.setdefault(path.name, now)
        return relay.local_index().latest(complete_only=True) == 2

    wait_until(complete, timeout=60, what="v2 mirrored")
    deltas = [t for name, t in first_seen.items() if name.startswith("delta_")]
    shards = [t for name, t in first_seen.items() if name.startswith("shard_")]
    assert len(deltas) == 24 and len(shards) == 24
    assert max(deltas) <= min(shards), "a full shard was placed while delta shards were still missing"



def test_a_relay_beside_its_origin_links_its_shards_and_still_verifies_them(  # type: ignore[no-untyped-def]
    origin_factory, relay_factory, payload: Path, tmp_path: Path
) -> None:
    origin = origin_factory()
    manifest = origin.publish(payload)
    # the data directory on this machine: the origin's files, one of them damaged on disk
    local = tmp_path / "local"
    shutil.copytree(origin.data_dir.root, local)
    good = origin.data_dir.shard_path(1, 2).read_bytes()
    DataDir(local).shard_path(1, 2).write_bytes(b"\x00" + good[1:])
    beside = relay_factory([origin.url], "beside", local_sources=[local])
    apart = relay_factory([origin.url], "apart")
    for relay in (beside, apart):
        wait_until(lambda relay=relay: relay.local_index().latest(complete_only=True) == 1, what="mirrored")
    shards = range(manifest.num_shards)
    linked = [beside.data_dir.shard_path(1, i).stat().st_ino == DataDir(local).shard_path(1, i).stat().st_ino
              for i in shards]  # fmt: skip
    assert [i for i in shards if not linked[i]] == [2]  # one copy on this machine, but not of a bad shard
    assert beside.data_dir.shard_path(1, 2).read_bytes() == good  # verified, deleted, downloaded
    result = Client([beside.url]).fetch(1, tmp_path / "out.bin", deadline_s=60)
    assert files_equal(result.path, payload)
    assert not any(
        apart.data_dir.shard_path(1, i).stat().st_ino == origin.data_dir.shard_path(1, i).stat().st_ino for i in shards
    )
