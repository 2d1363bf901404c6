"""Policy versions as shardcast deltas, over real HTTP: a store holding version v downloads only the
delta shards of v+1 (the newest cached older version is its delta base), and falls back to the
full shards when that base is missing or corrupt. The bytes on the wire are read from shardcast's
own log line, so the key test needs nothing of the store's new API to fail on the old store."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

import shardcast
from prime_rl import metrics
from prime_rl.config import load_config
from prime_rl.weights.files import save_policy
from prime_rl.weights.store import PolicyStore, VersionFollower

if TYPE_CHECKING:  # only annotations: the module imports on the store before PolicyFetch existed
    from prime_rl.weights.store import PolicyFetch

SHARD_BYTES = 1 << 20  # 1 MiB shards: a 4 MiB policy has 4 of them, each with its own delta
WIRE = re.compile(r"fetched v(\d+) to .*: (\d+) bytes downloaded")


def _policies(versions: int) -> list[dict[str, torch.Tensor]]:
    """bf16 states of 2 Mi parameters (4 MiB) where each version moves 1 % of the weights by a few
    bf16 steps, as one small RL step does: most bytes stay equal, so xor-zstd deltas are small."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(2 << 20, generator=generator) * 0.02
    states = []
    for _ in range(versions):
        states.append({"w": weights.to(torch.bfloat16)})
        moved = torch.randperm(weights.numel(), generator=generator)[: weights.numel() // 100]
        weights = weights.clone()
        weights[moved] *= 1.05
    return states


def _publish(origin: shardcast.Origin, tmp_path: Path, version: int, state: dict[str, torch.Tensor]) -> Path:
    path = save_policy(state, tmp_path / "published" / f"v{version}" / "model.safetensors")
    origin.publish(path, version=version, delta=True, shard_size=SHARD_BYTES)
    return path


def _wire_bytes(caplog: pytest.LogCaptureFixture, version: int) -> list[int]:
    """Bytes each fetch of ``version`` received, from shardcast's 'fetched vN ...' log lines."""
    found = (WIRE.search(r.getMessage()) for r in caplog.records if r.name == "shardcast.client")
    return [int(m.group(2)) for m in found if m is not None and int(m.group(1)) == version]


@pytest.fixture
def origin_with_two_versions(tmp_path: Path):  # type: ignore[no-untyped-def]
    states = _policies(2)
    with shardcast.Origin(tmp_path / "origin", port=0, keep=8) as origin:
        files = [_publish(origin, tmp_path, version, states[version - 1]) for version in (1, 2)]
        manifest = shardcast.parse_manifest(origin.data_dir.manifest_path(2).read_bytes())
        assert manifest.delta is not None and manifest.delta.base_version == 1  # the origin wrote one
        yield origin, files


def test_a_store_holding_v1_downloads_only_the_delta_of_v2(
    tmp_path: Path, origin_with_two_versions, caplog: pytest.LogCaptureFixture
) -> None:
    origin, files = origin_with_two_versions
    caplog.set_level(logging.INFO, logger="shardcast.client")
    store = PolicyStore([origin.url], tmp_path / "cache", None)
    size = files[0].stat().st_size
    store.ensure(1)
    assert _wire_bytes(caplog, 1) == [size]  # nothing cached: the full file
    store.ensure(2)
    (delta_bytes,) = _wire_bytes(caplog, 2)
    # 1 % of the weights moved: the xor of two versions is mostly zero bytes, which zstd folds away
    assert 0 < delta_bytes < size // 10, (delta_bytes, size)
    assert store.path(2).read_bytes() == files[1].read_bytes()  # byte-identical to the published file


def test_each_fetch_is_reported_with_its_bytes_and_delta_base(
    tmp_path: Path, origin_with_two_versions, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin, files = origin_with_two_versions
    fetches: list[PolicyFetch] = []
    metrics_file = tmp_path / "metrics" / "worker-0.jsonl"
    monkeypatch.setattr(
        metrics, "_METRICS", metrics.MetricsWriter(metrics_file, role="worker", name="worker-0")
    )
    store = PolicyStore([origin.url], tmp_path / "cache", None, on_fetch=fetches.append)
    store.ensure(1)
    store.ensure(2)
    size = files[0].stat().st_size
    assert [(f.version, f.file_bytes, f.delta_base, f.linked) for f in fetches] == [
        (1, size, None, False),
        (2, size, 1, False),
    ]
    assert fetches[0].bytes_downloaded == size and fetches[1].bytes_downloaded < size // 10
    records = [r for r in metrics.read_metrics(metrics_file) if r["event"] == "policy_fetched"]
    assert [(r["policy_version"], r["delta"], r["bytes_downloaded"]) for r in records] == [
        (f.version, f.used_delta, f.bytes_downloaded) for f in fetches
    ]


def test_a_restarted_follower_takes_the_cached_version_as_base(
    tmp_path: Path, origin_with_two_versions, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker restarted with v1 in its cache: its follower's first download (v2) is the delta."""
    origin, files = origin_with_two_versions
    caplog.set_level(logging.INFO, logger="shardcast.client")
    PolicyStore([origin.url], tmp_path / "cache", None).ensure(1)  # the previous life of the worker
    store = PolicyStore([origin.url], tmp_path / "cache", None)
    follower = VersionFollower(store, poll_s=0.05).start()
    try:
        assert follower.wait_newer(1, timeout_s=60) == 2
    finally:
        follower.stop()
    (delta_bytes,) = _wire_bytes(caplog, 2)
    assert delta_bytes < files[1].stat().st_size // 10
    assert store.path(2).read_bytes() == files[1].read_bytes()


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_without_a_sound_base_the_full_shards_are_downloaded(
    tmp_path: Path, origin_with_two_versions, damage: str
) -> None:
    origin, files = origin_with_two_versions
    fetches: list[PolicyFetch] = []
    store = PolicyStore([origin.url], tmp_path / "cache", None, on_fetch=fetches.append)
    store.ensure(1)
    base = store.path(1)
    if damage == "missing":
        base.unlink()
    else:  # same size, one byte flipped: only the base digest can tell
        data = bytearray(base.read_bytes())
        data[len(data) // 2] ^= 0xFF
        base.write_bytes(bytes(data))
    store.ensure(2)
    size = files[1].stat().st_size
    assert (fetches[-1].version, fetches[-1].delta_base, fetches[-1].bytes_downloaded) == (2, None, size)
    assert store.path(2).read_bytes() == files[1].read_bytes()


def test_delta_is_a_shardcast_config_field_that_round_trips(tmp_path: Path) -> None:
    assert load_config(None, []).shardcast.delta is True
    assert load_config(None, ["--shardcast.delta", "false"]).shardcast.delta is False
    path = tmp_path / "run.toml"
    path.write_text("[shardcast]\ndelta = false\n")
    assert load_config(path, []).shardcast.delta is False
    assert load_config(path, ["--shardcast.delta", "true"]).shardcast.delta is True
