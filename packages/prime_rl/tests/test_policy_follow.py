"""Following policy versions through a real shardcast origin: the background VersionFollower
(shardcast.Follower underneath) and PolicyStore.wait_for_published share one cache and its pruning."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import torch

import shardcast
from prime_rl.weights.files import save_policy
from prime_rl.weights.store import PolicyStore, PolicyUnavailable, VersionFollower


def _publish(origin: shardcast.Origin, tmp_path: Path, version: int) -> dict[str, torch.Tensor]:
    state = {"w": torch.full((64,), float(version))}
    origin.publish(
        save_policy(state, tmp_path / "published" / f"v{version}" / "model.safetensors"), version=version
    )
    return state


def _wait(predicate, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _read(path: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(path)["w"]


def test_follower_fetches_each_newest_version_into_the_store(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with shardcast.Origin(tmp_path / "origin", port=0, keep=8) as origin:
        store = PolicyStore([origin.url], cache, {"w": torch.zeros(64)}, keep=1)
        follower = VersionFollower(store, poll_s=0.05).start()
        try:
            assert follower.newest_local == 0
            assert follower.wait_newer(0, timeout_s=0.2) == 0  # nothing published: times out
            _publish(origin, tmp_path, 1)
            assert follower.wait_newer(0, timeout_s=60) == 1
            _publish(origin, tmp_path, 2)
            _wait(lambda: follower.newest_local == 2, "v2")
        finally:
            follower.stop()
        assert not follower.is_alive()
    # v2 is where the store looks for it; keep=1 pruned v1, but version 0 (the initial model) stays
    assert torch.equal(_read(store.path(2)), torch.full((64,), 2.0))
    assert sorted(p.name for p in cache.iterdir()) == ["v0", "v2"]
    assert torch.equal(_read(store.path(0)), torch.zeros(64))


def test_follower_without_servers_stays_idle(tmp_path: Path) -> None:
    follower = VersionFollower(PolicyStore([], tmp_path, None), poll_s=0.05).start()
    assert not follower.is_alive() and follower.newest_local == 0
    follower.stop()
    assert list(tmp_path.iterdir()) == []  # initial_state None: no version 0 written


def test_wait_for_published_fetches_the_oldest_version_at_least_asked(tmp_path: Path) -> None:
    with shardcast.Origin(tmp_path / "origin", port=0, keep=8) as origin:
        store = PolicyStore([origin.url], tmp_path / "cache", None, keep=4)
        for version in (1, 2, 3):
            _publish(origin, tmp_path, version)
        assert store.wait_for_published(2, timeout_s=30, poll_s=0.05) == 2  # not the newest, 3
        assert torch.equal(_read(store.path(2)), torch.full((64,), 2.0))
        assert not store.path(3).exists()
        with pytest.raises(PolicyUnavailable, match="no version >= 4 appeared") as info:
            store.wait_for_published(4, timeout_s=0.3, poll_s=0.05)
        assert info.value.permanent
        # a version published while waiting is picked up
        threading.Timer(0.3, _publish, (origin, tmp_path, 4)).start()
        assert store.wait_for_published(4, timeout_s=30, poll_s=0.05) == 4


def test_a_long_wait_for_a_version_logs_what_it_waits_for(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The evaluator's wait: one progress line per log period naming the version, the newest listed
    one and the servers; a wait shorter than the period says nothing."""
    caplog.set_level(logging.INFO, logger="prime_rl.weights.store")
    with shardcast.Origin(tmp_path / "origin", port=0, keep=8) as origin:
        _publish(origin, tmp_path, 1)
        store = PolicyStore([origin.url], tmp_path / "cache", None)
        started = time.monotonic()
        with pytest.raises(PolicyUnavailable):
            store.wait_for_published(2, timeout_s=1.2, poll_s=0.05, log_every_s=0.3)
        waited = time.monotonic() - started
        lines = [r.getMessage() for r in caplog.records if "still waiting for policy" in r.getMessage()]
        assert 2 <= len(lines) <= int(waited / 0.3)  # at most one per period, none at once
        assert all("policy >= v2 after" in line and "newest listed: v1" in line for line in lines)
        assert all(origin.url in line for line in lines)
        caplog.clear()
        assert store.wait_for_published(1, timeout_s=5, poll_s=0.05, log_every_s=0.3) == 1
        assert "still waiting" not in caplog.text
