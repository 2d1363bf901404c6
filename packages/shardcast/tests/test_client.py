"""Client against in-process origins and relays on loopback sockets: happy paths and faults."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from shardcast_testlib import make_manifest  # type: ignore[import-not-found]

from conftest import files_equal, wait_until, write_random  # type: ignore[import-not-found]
from shardcast import (
    Client,
    DeadlineExceededError,
    Follower,
    HmacKey,
    IntegrityError,
    ManifestError,
    NoServerAvailableError,
    SignatureError,
    VersionGoneError,
    VersionNotFoundError,
)
from shardcast.layout import DataDir, Index, IndexEntry
from shardcast.server import HttpServer


def leftovers(output: Path) -> list[str]:
    return sorted(p.name for p in output.parent.iterdir() if p.name.startswith(output.name + "."))


@pytest.mark.parametrize("encoding", ["raw", "zstd"])
def test_fetch_is_byte_identical(origin_factory, payload: Path, tmp_path: Path, encoding: str) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory(encoding=encoding)
    origin.publish(payload)
    progress = []
    result = Client([origin.url]).fetch("latest", tmp_path / "out.bin", progress=progress.append)
    assert result.version == 1 and files_equal(result.path, payload)
    assert result.bytes_downloaded == result.manifest.stored_bytes and result.bad_shards == 0
    assert progress[-1].shards_done == progress[-1].shards_total == 17
    assert leftovers(result.path) == []  # no .partial, journal or part files remain


def test_delta_downloads_only_the_difference(origin_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory(delta=True, shard_size=100_000)
    model = write_random(tmp_path / "model.bin", 1_000_000, seed=3)
    origin.publish(model)
    client = Client([origin.url])
    first = client.fetch(1, tmp_path / "v1.bin")
    data = bytearray(model.read_bytes())
    data[500_000:500_100] = bytes(100)  # a "small optimizer step"
    model.write_bytes(bytes(data))
    origin.publish(model)
    second = client.fetch(2, tmp_path / "v2.bin", base=first.path)
    assert second.used_delta and files_equal(second.path, model)
    assert second.bytes_downloaded < 5_000  # vs 1,000,000 for the full file
    # A wrong base falls back to the full shards.
    third = client.fetch(2, tmp_path / "v2b.bin", base=model)
    assert not third.used_delta and files_equal(third.path, model)


def test_corrupt_relay_is_penalised_and_file_still_correct(
    origin_factory, relay_factory, payload: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory()
    manifest = origin.publish(payload)
    bad = relay_factory([origin.url], "bad")
    good = relay_factory([origin.url], "good")
    for relay in (bad, good):
        wait_until(lambda r=relay: r.local_index().latest(complete_only=True) == 1, what="relays mirrored")
    for index in range(manifest.num_shards):  # flip one byte of every shard on the bad relay's disk
        path = bad.data_dir.shard_path(1, index)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    result = Client([bad.url, good.url], concurrency=2).fetch(1, tmp_path / "out.bin")
    assert files_equal(result.path, payload)
    reports = {r.url: r for r in result.servers}
    assert result.bad_shards >= 1 and reports[bad.url].bad_shards == result.bad_shards
    assert reports[bad.url].success_rate < reports[good.url].success_rate
    assert reports[good.url].bytes_served == manifest.stored_bytes  # every good byte came from the good relay


def test_dead_server_is_tolerated(origin_factory, payload: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory()
    origin.publish(payload)
    result = Client(["http://127.0.0.1:9", origin.url]).fetch("latest", tmp_path / "out.bin")
    assert files_equal(result.path, payload)


def test_not_found_and_unreachable(origin_factory, payload: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory()
    origin.publish(payload)
    with pytest.raises(VersionNotFoundError, match=r"version 5 .*available: \[1\]"):
        Client([origin.url]).fetch(5, tmp_path / "out.bin")
    with pytest.raises(NoServerAvailableError, match=r"127\.0\.0\.1:9"):
        Client(["127.0.0.1:9"]).fetch("latest", tmp_path / "out.bin")
    with pytest.raises(ManifestError, match="invalid version name"):
        Client([origin.url]).fetch("../1", tmp_path / "out.bin")


def _hostile_server(
    tmp_path: Path, manifest_bytes: bytes | None, index_bytes: bytes | None = None
) -> HttpServer:
    store = DataDir(tmp_path / "hostile")
    store.version_dir(1).mkdir(exist_ok=True)
    (store.root / "index.json").write_bytes(index_bytes or Index((IndexEntry(1, True),)).to_json())
    if manifest_bytes is not None:
        store.manifest_path(1).write_bytes(manifest_bytes)
    return HttpServer(store).start()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"file_size": 10**15, "shard_size": 1}, "exceeds the limit"),
        ({"file_name": "../../../tmp/evil"}, "file_name"),
        ({"file_size": 11}, "disagrees with the plan"),
        ({"version": 2}, "claims version 2"),
    ],
)
def test_hostile_manifest_is_rejected(tmp_path: Path, change: dict[str, object], message: str) -> None:
    obj = json.loads(make_manifest(version=1).to_json())
    obj.update(change)
    server = _hostile_server(tmp_path, json.dumps(obj).encode())
    try:
        with pytest.raises(ManifestError, match=message):
            Client([server.url]).fetch(1, tmp_path / "out.bin")
    finally:
        server.stop()
    assert not (tmp_path / "out.bin").exists()


def test_hostile_index_is_rejected(tmp_path: Path) -> None:
    index = json.dumps(
        {"format": "shardcast-index/1", "versions": [{"version": "../../etc", "complete": True}]}
    )
    server = _hostile_server(tmp_path, None, index.encode())
    try:
        with pytest.raises(NoServerAvailableError, match="invalid version"):
            Client([server.url]).fetch("latest", tmp_path / "out.bin")
    finally:
        server.stop()


def test_pinned_key(origin_factory, payload: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    key = HmacKey(b"cluster-secret-0123456789")
    unsigned = origin_factory("unsigned")
    unsigned.publish(payload)
    with pytest.raises(SignatureError, match="unsigned"):
        Client([unsigned.url], verify_key=key).fetch(1, tmp_path / "out.bin")
    signed = origin_factory("signed", signing_key=key)
    signed.publish(payload)
    assert files_equal(Client([signed.url], verify_key=key).fetch(1, tmp_path / "out.bin").path, payload)


def test_whole_file_digest_mismatch_leaves_no_file(tmp_path: Path, payload: Path, origin_factory) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory()
    manifest = origin.publish(payload)
    # Rewrite the manifest with a wrong whole-file digest (shards stay consistent).
    obj = json.loads(manifest.to_json())
    obj["file_digest"] = "00" * 32
    origin.data_dir.manifest_path(1).write_text(json.dumps(obj))
    output = tmp_path / "out.bin"
    output.write_bytes(b"previous good version")
    with pytest.raises(IntegrityError, match="whole-file digest"):
        Client([origin.url]).fetch(1, output)
    assert output.read_bytes() == b"previous good version"  # destination untouched
    assert leftovers(output) == []


def test_deadline_then_resume(origin_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory(shard_size=256 * 1024)
    model = write_random(tmp_path / "model.bin", 2_000_000, seed=5)
    origin.publish(model)
    output = tmp_path / "out.bin"
    slow = Client([origin.url], max_bytes_per_second=1_000_000, concurrency=2)
    with pytest.raises(DeadlineExceededError, match="deadline passed"):
        slow.fetch(1, output, deadline_s=0.8)
    assert not output.exists() and (tmp_path / "out.bin.partial.json").exists()
    result = Client([origin.url]).fetch(1, output)
    assert files_equal(result.path, model)
    assert result.bytes_resumed > 0
    assert result.bytes_downloaded + result.bytes_resumed == 2_000_000


def test_version_deleted_during_download_fails_clearly(origin_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory(keep=1, grace_s=0.0, shard_size=100_000)
    model = write_random(tmp_path / "model.bin", 2_000_000, seed=6)
    origin.publish(model)
    client = Client([origin.url], max_bytes_per_second=400_000, concurrency=2)
    started = threading.Event()

    def publish_newer() -> None:
        started.wait(10)
        origin.publish(model)  # keep=1, grace 0: v1 is deleted at once

    thread = threading.Thread(target=publish_newer)
    thread.start()
    with pytest.raises(VersionGoneError, match="version 1 is no longer listed"):
        client.fetch(
            1, tmp_path / "out.bin", deadline_s=60, progress=lambda p: p.shards_done >= 2 and started.set()
        )
    thread.join()
    assert not (tmp_path / "out.bin").exists()


def test_follower_hot_reload(origin_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory(delta=True)
    model = write_random(tmp_path / "model.bin", 300_000, seed=7)
    origin.publish(model)
    seen = []
    follower = Follower(Client([origin.url]), seen.append, output_dir=tmp_path / "ckpt", poll_interval_s=0.05, keep=1)
    follower.start()
    try:
        wait_until(lambda: len(seen) == 1, what="v1")
        data = bytearray(model.read_bytes())
        data[0] ^= 1
        model.write_bytes(bytes(data))
        origin.publish(model)
        wait_until(lambda: len(seen) == 2, what="v2")
    finally:
        follower.stop()
    assert [r.version for r in seen] == [1, 2]
    assert seen[1].used_delta and files_equal(seen[1].path, model)
    assert seen[1].path == tmp_path / "ckpt" / "v2" / "model.bin"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["v2"]  # keep=1 pruned v1


def test_follower_prunes_only_ascii_version_folders(tmp_path: Path) -> None:
    """'v²' passes str.isdigit but not int(): pruning must skip it, not crash the follower."""
    out = tmp_path / "ckpt"
    for name in ("v1", "v2", "v3", "v²", "v", "vx"):
        (out / name).mkdir(parents=True)
    follower = Follower(Client(["http://127.0.0.1:9"]), lambda result: None, output_dir=out, keep=1)
    follower._prune(1)
    assert sorted(p.name for p in out.iterdir()) == sorted(["v3", "v²", "v", "vx"])


def test_follower_keep_none_leaves_pruning_to_the_caller(origin_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory()
    model = write_random(tmp_path / "model.bin", 100_000, seed=3)
    origin.publish(model)
    (tmp_path / "ckpt" / "v0").mkdir(parents=True)  # the caller's own version folder
    seen = []
    follower = Client([origin.url]).follower(
        seen.append, output_dir=tmp_path / "ckpt", poll_interval_s=0.05, keep=None
    )
    follower.start()
    try:
        wait_until(lambda: len(seen) == 1, what="v1")
        origin.publish(write_random(model, 100_000, seed=4))
        wait_until(lambda: len(seen) == 2, what="v2")
    finally:
        follower.stop()
    assert [r.version for r in seen] == [1, 2]
    assert files_equal(seen[1].path, model)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["v0", "v1", "v2"]  # nothing pruned


def test_follow_blocks_until_its_stop_event(origin_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    origin = origin_factory()
    origin.publish(write_random(tmp_path / "model.bin", 100_000, seed=5))
    stop = threading.Event()
    seen = []

    def on_version(result) -> None:  # type: ignore[no-untyped-def]
        seen.append(result.version)
        stop.set()  # the callback runs on the following thread: ends the blocking call

    follower = threading.Thread(
        target=Client([origin.url]).follow,
        args=(on_version,),
        kwargs={"output_dir": tmp_path / "ckpt", "poll_interval_s": 0.05, "stop": stop},
    )
    follower.start()
    follower.join(30)
    assert not follower.is_alive() and seen == [1]
