"""A policy version the trainer wrote on this machine is hard-linked into a process's cache, not
downloaded again, only when its bytes are the published ones (prime_rl.weights.store.LocalPolicies)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

import shardcast
from prime_rl.weights.files import load_policy_into, save_policy
from prime_rl.weights.layout import policy_file
from prime_rl.weights.store import LocalPolicies, PolicyStore, PolicyUnavailable

UNREACHABLE = ["http://127.0.0.1:9"]  # the discard port: nothing serves there, a download fails


def publish(tmp_path: Path, version: int, value: float) -> LocalPolicies:
    """The trainer's way: write policies/v<N>/model.safetensors, publish it into the origin folder."""
    local = LocalPolicies(tmp_path / "policies", tmp_path / "shardcast" / "origin")
    path = save_policy({"weight": torch.full((4, 4), value)}, policy_file(local.policies_dir, version))
    shardcast.publish_file(local.origin_dir, path, version=version)
    return local


def test_a_published_version_on_this_machine_is_linked_read_only(tmp_path: Path) -> None:
    local = publish(tmp_path, 1, 0.5)
    store = PolicyStore(UNREACHABLE, tmp_path / "validator" / "policies", None, local=local)
    path = store.ensure(1)
    source = policy_file(local.policies_dir, 1)
    assert path.stat().st_ino == source.stat().st_ino  # the trainer's file, not a copy
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    model = torch.nn.Linear(4, 4, bias=False)
    model.weight = torch.nn.Parameter(torch.zeros(4, 4))
    load_policy_into(model, path)
    assert torch.equal(model.weight.detach(), torch.full((4, 4), 0.5))


def test_a_file_that_differs_from_its_manifest_is_not_linked(tmp_path: Path) -> None:
    local = publish(tmp_path, 1, 0.5)
    source = policy_file(local.policies_dir, 1)
    data = bytearray(source.read_bytes())
    data[-1] ^= 1  # same size, other bytes: not the version that was published
    source.write_bytes(bytes(data))
    store = PolicyStore(UNREACHABLE, tmp_path / "validator" / "policies", None, local=local)
    with pytest.raises(PolicyUnavailable):  # it falls back to a download, which cannot reach anyone
        store.ensure(1)
    assert not store.path(1).exists()


def test_an_unpublished_or_absent_version_is_downloaded(tmp_path: Path) -> None:
    local = publish(tmp_path, 1, 0.5)
    save_policy({"weight": torch.ones(4, 4)}, policy_file(local.policies_dir, 2))  # written, not published
    store = PolicyStore(UNREACHABLE, tmp_path / "validator" / "policies", None, local=local)
    for version in (2, 3):
        with pytest.raises(PolicyUnavailable):
            store.ensure(version)
    missing = LocalPolicies(tmp_path / "elsewhere" / "policies", tmp_path / "elsewhere" / "origin")
    assert not missing.link(1, tmp_path / "target")
    assert not (tmp_path / "elsewhere").exists()  # looking creates nothing


def test_a_follower_links_each_new_version_the_trainer_published_here(tmp_path: Path) -> None:
    """A worker's background follower: versions listed by a real origin, taken as links."""
    from prime_rl.weights.store import VersionFollower

    local = LocalPolicies(tmp_path / "policies", tmp_path / "shardcast" / "origin")
    with shardcast.Origin(local.origin_dir, port=0, keep=8) as origin:
        store = PolicyStore([origin.url], tmp_path / "worker" / "policies", None, local=local)
        follower = VersionFollower(store, poll_s=0.05).start()
        try:
            for version in (1, 2):
                path = save_policy(
                    {"weight": torch.full((4, 4), float(version))}, policy_file(local.policies_dir, version)
                )
                origin.publish(path, version=version)
                assert follower.wait_newer(version - 1, timeout_s=60) == version
                assert store.path(version).stat().st_ino == path.stat().st_ino
        finally:
            follower.stop()
        assert not follower.is_alive()


def test_a_linking_follower_can_be_stopped_before_it_starts(tmp_path: Path) -> None:
    from prime_rl.weights.store import VersionFollower

    local = LocalPolicies(tmp_path / "policies", tmp_path / "origin")
    follower = VersionFollower(PolicyStore(UNREACHABLE, tmp_path / "cache", None, local=local))
    follower.stop()
    assert not follower.is_alive()
