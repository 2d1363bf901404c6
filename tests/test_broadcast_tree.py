"""benchmarks/broadcast_tree.py: the relay tree's shape, and one tiny broadcast through it end to end.

The broadcast runs in network namespaces where this machine allows them (root, `ip`, `tc`) and on
loopback otherwise; either way every client must hold every version byte for byte, later versions
must arrive as deltas, and nothing the run started may outlive it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import broadcast_tree
import broadcast_tree_payload
import swarm_wan


def test_plan_tree_bounds_fanout_and_grows_relays_not_depth_with_clients() -> None:
    # 16 clients, fan-out 4, depth 2: 16 / 4 = 4 leaf relays (tier 2) under ceil(4 / 4) = 1 relay (tier 1).
    plan = broadcast_tree.plan_tree(2, 4, 16)
    assert plan.relay_parent == (-1, 0, 0, 0, 0)
    assert plan.relay_tier == (1, 2, 2, 2, 2)
    assert plan.client_parent == (1,) * 4 + (2,) * 4 + (3,) * 4 + (4,) * 4
    # 64 clients at the same depth: 16 leaves under 4 tier-1 relays, each leaf under relay i // 4.
    wide = broadcast_tree.plan_tree(2, 4, 64)
    assert wide.relay_parent == (-1,) * 4 + tuple(i // 4 for i in range(16))
    assert wide.depth == 2 and wide.relays == 20
    for tree in (plan, wide):
        children = [tree.relay_parent.count(r) + tree.client_parent.count(r) for r in range(-1, tree.relays)]
        assert max(children) <= 4
    with pytest.raises(ValueError, match="more than 1 tiers"):
        broadcast_tree.plan_tree(1, 4, 64)  # the origin would feed 16 relays


def _our_processes(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_tiny_broadcast_reaches_every_client_byte_exact_through_deltas(tmp_path: Path) -> None:
    spec = broadcast_tree_payload.PayloadSpec(
        hidden=64, layers=1, vocab=2048, versions=3, batch=2, sequence=16, lr=1e-5
    )
    payload = broadcast_tree_payload.build(spec, tmp_path / "cache")
    assert len(set(payload.sha256)) == 3  # each AdamW step changed the bf16 file
    plan = broadcast_tree.plan_tree(2, 2, 4)  # origin -> 1 relay -> 2 leaf relays -> 4 clients
    workdir = tmp_path / "run"
    workdir.mkdir()
    result = broadcast_tree.run_tree(
        plan,
        payload,
        workdir,
        seed=3,
        per_host=2,
        shard_size=64 * 1024,
        poll_s=0.3,
        rtt_ms=(5, 10),
        mbit=(50, 100),
        rehash=True,
        version_timeout_s=20.0,
    )
    print(result.network)
    assert result.emulated == (swarm_wan.why_not_emulated() is None), result.network
    assert [row.version for row in result.versions] == [1, 2, 3]
    for row in result.versions:
        # digests_ok counts clients whose own SHA-256 of the placed file equals the publisher's
        assert row.clients_done == 4 and row.digests_ok == 4, row
        assert row.relays_done_max_s is not None, row
    for row in result.versions[1:]:
        assert row.delta_bytes is not None and row.clients_used_delta == 4, row
        assert row.bytes_per_client_mean is not None and row.bytes_per_client_mean <= row.delta_bytes, row
    assert result.versions[0].bytes_per_client_mean == result.versions[0].file_bytes
    # egress: the tier-1 relay fed both leaves; each leaf fed its 2 clients
    assert result.versions[1].egress_relay_by_tier[2] == [2 * result.versions[1].delta_bytes] * 2
    assert result.ok
    # everything it created is gone: namespaces and links of this pid, and every process it started
    namespaces, links = _our_names()
    assert not namespaces and not links
    assert _our_processes(str(workdir)) == []


def _our_names() -> tuple[list[str], list[str]]:
    if swarm_wan.why_not_emulated():
        return [], []
    pid = str(os.getpid())
    namespaces = [
        line.split()[0]
        for line in swarm_wan.run_ip("ip", "netns", "list").splitlines()
        if line.strip() and (m := swarm_wan.NAMESPACE.match(line.split()[0])) and m.group(1) == pid
    ]
    links = [
        line
        for line in swarm_wan.run_ip("ip", "-o", "link", "show").splitlines()
        if f"{swarm_wan.ALIAS}{pid}" in line
    ]
    return namespaces, links
