"""Issue 34, item 1: tool seconds budgeted per identity and per client address, beyond per lease
(a lease with nothing left runs no tool: test_tool_replay.py)."""

from __future__ import annotations

import math

from prime_rl.validator.tool_budget import ToolBudget


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_identity_and_address_buckets_refill_over_their_window() -> None:
    clock = _Clock()
    budget = ToolBudget(per_identity_s=10.0, per_address_s=15.0, window_s=100.0, monotonic=clock)
    assert budget.left("w1", "10.0.0.1", established=False) == 10.0
    budget.spend("w1", "10.0.0.1", 10.0, established=False)
    assert budget.left("w1", "10.0.0.1", established=False) == 0.0
    # Another fresh identity at the address has only the address's remainder (15 - 10), a fresh one
    # elsewhere its whole bucket.
    assert budget.left("w2", "10.0.0.1", established=False) == 5.0
    assert budget.left("w3", "10.0.0.2", established=False) == 10.0
    # An established identity at the same address is not charged to it, nor limited by it.
    budget.spend("w2", "10.0.0.1", 5.0, established=False)
    assert budget.left("w2", "10.0.0.1", established=False) == 0.0
    assert budget.left("veteran", "10.0.0.1", established=True) == 10.0
    budget.spend("veteran", "10.0.0.1", 4.0, established=True)
    clock.now += 50.0  # half a window: half of each bucket back (10 / 100 and 15 / 100 per s)
    assert math.isclose(budget.left("w1", "10.0.0.1", established=False), 5.0)  # identity 5, address 7.5
    assert math.isclose(budget.left("w2", "10.0.0.1", established=False), 7.5)  # identity 10 (full), address 7.5
    state = budget.state("w1", "10.0.0.1")
    assert (state.identity_spent_s, state.address_spent_s) == (10.0, 15.0)
    assert ToolBudget(0.0, 0.0, 100.0).left("w", "a", established=False) == math.inf  # 0 = off
