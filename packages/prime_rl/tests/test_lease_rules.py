"""The backpressure answer's Retry-After (``LeaseRules.busy_retry_after``): sized by how many
identities wait and how fast leases free up, so waiting identities poll about as often as leases are
granted, whatever their number (issue 33: a fixed 1 s let 256 waiting identities send some 200
requests a second for 8 leases, and their 429s took the orchestrator's core)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prime_rl.orchestrator.lease_rules import LeaseRules

from .conftest import make_config


def _rules(tmp_path: Path, now: list[float]) -> LeaseRules:
    unused: Any = None  # busy_retry_after reads neither the lease book nor the worker registry
    return LeaseRules(
        make_config(tmp_path).orchestrator, unused, unused,
        has_history=lambda worker_id: True, buffered=lambda *args, **kwargs: 0, clock=lambda: now[0],
    )  # fmt: skip


def test_busy_retry_after_grows_with_the_identities_waiting_and_forgets_old_ones(tmp_path: Path) -> None:
    now = [100.0]
    rules = _rules(tmp_path, now)
    for _ in range(20):  # 2 leases a second over the 10 s window
        rules.granted()
    # One, then two identities waiting for 2 leases a second: about 1 s (the floor; 2 / 2 jittered).
    assert rules.busy_retry_after("few0") == 1.0 and 1.0 <= rules.busy_retry_after("few1") < 1.5
    # 100 more: 102 identities / 2 per second = 51 s, jittered, capped.
    waits = [rules.busy_retry_after(f"many{i}") for i in range(100)]
    assert waits[-1] == LeaseRules.MAX_BUSY_RETRY_S
    assert max(waits[:2]) < 3.0  # the first few of them still waited briefly
    middle = rules.busy_retry_after("many0")  # asking again does not count an identity twice: still 102
    assert middle == LeaseRules.MAX_BUSY_RETRY_S
    # 20 identities at 2 per second: 10 s, jittered over [5, 15).
    now[0] += 11.0  # every refusal and grant above left the window
    for _ in range(20):
        rules.granted()
    spread = [rules.busy_retry_after(f"later{i}") for i in range(20)]
    assert 5.0 <= spread[-1] < 15.0 and spread[0] == 1.0  # the first of them waited alone: 1 s
    # Nothing granted in the window (a stalled pipeline): at most MAX_BUSY_RETRY_S, never more.
    now[0] += 11.0
    assert 1.0 <= rules.busy_retry_after("stalled") <= LeaseRules.MAX_BUSY_RETRY_S
    assert len(set(spread[10:])) > 1  # jittered: the waiting do not all come back together
