"""The backpressure answer's Retry-After (``LeaseRules.busy_retry_after``): sized by how many
identities wait, so that together they poll about ``BUSY_POLLS_PER_S`` times a second whatever their
number (issue 33: a fixed 1 s let 256 waiting identities send some 200 requests a second for 8
leases, and their 429s took the orchestrator's core), while a few waiting workers still ask every
second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prime_rl.orchestrator.lease_rules import LeaseRules

from .conftest import make_config


def _rules(tmp_path: Path, now: list[float]) -> LeaseRules:
    unused: Any = None  # busy_retry_after reads neither the lease book nor the worker registry
    return LeaseRules(
        make_config(tmp_path).orchestrator, unused, unused,
        has_history=lambda worker_id: True, buffered=lambda: (0, 0), clock=lambda: now[0],
    )  # fmt: skip


def test_busy_retry_after_grows_with_the_identities_waiting_and_forgets_old_ones(tmp_path: Path) -> None:
    now = [100.0]
    rules = _rules(tmp_path, now)
    polls = LeaseRules.BUSY_POLLS_PER_S
    # A few waiting workers ask again after 1 s, as before.
    assert [rules.busy_retry_after(f"few{i}") for i in range(3)] == [1.0, 1.0, 1.0]
    # 256 waiting: 256 / polls per second, jittered over [0.5, 1.5), capped: together they send
    # about `polls` requests a second, not 256.
    waits = [rules.busy_retry_after(f"many{i}") for i in range(253)]
    cap = LeaseRules.MAX_BUSY_RETRY_S
    assert all(min(cap, 0.5 * 236 / polls) <= w <= min(cap, 1.5 * 256 / polls) for w in waits[-20:])
    assert len(set(waits[-20:])) > 1  # jittered: they do not all come back together
    assert sum(1 / w for w in waits[-20:]) / 20 * 256 < 2 * polls  # polls per second, all 256 together
    # Asking again does not count an identity twice.
    assert rules.busy_retry_after("many0") < 1.5 * 256 / polls
    # Refusals older than the window are forgotten.
    now[0] += LeaseRules.BUSY_WINDOW_S + 1
    assert rules.busy_retry_after("later") == 1.0
