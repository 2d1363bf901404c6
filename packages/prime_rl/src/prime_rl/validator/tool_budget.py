"""Tool seconds the validator spends replaying episodes, budgeted per identity and per client address.

Replaying a multi-turn episode runs its tool calls again (``validator/episodes.py``), and tool time
is the one validator cost a worker chooses (a program that loops until the tool timeout). Three
budgets bound it, the smallest wins:

  - per lease: ``validator.tool_seconds_per_lease`` (``checks.replay_checks``);
  - per identity: a bucket of ``tool_seconds_per_identity`` seconds, refilled at that many per
    ``tool_budget_window_s``;
  - per client address (the one the orchestrator handed the lease to: an IPv4 address or an IPv6
    /64, ``PendingBatch.client``): a bucket of ``tool_seconds_per_address``, the same way, charged
    only for identities without accepted samples (as the orchestrator's per-address lease cap),
    so Sybils at an address can spend the fresh identities' share but never an established
    worker's.

    bucket(t) = min(capacity, bucket(t0) + (t - t0) * capacity / window) - seconds spent

A lease whose budget is spent replays no tool at all: its tool episodes are ``tool_unverifiable``
(never a ban count; the orchestrator hands the tasks to another identity). At most ``MAX_KEYS``
buckets are kept per kind, least recently used dropped first (a dropped bucket was full, or
starts full again: a new identity costs at most its first bucket).

Not thread-safe (the validator's loop). ``monotonic`` is injectable (tests step it).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ToolBudget", "ToolBudgetState"]

MAX_KEYS = 65536


@dataclass(frozen=True)
class ToolBudgetState:
    """What one lease's identity and address have left and have spent (seconds; for the metrics)."""

    identity_left_s: float
    address_left_s: float
    identity_spent_s: float
    address_spent_s: float


class _Buckets:
    def __init__(self, capacity: float, window_s: float, monotonic: Callable[[], float]) -> None:
        self.capacity = capacity
        self.rate = capacity / window_s if window_s > 0 else math.inf
        self._monotonic = monotonic
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (seconds, at)
        self.spent: dict[str, float] = {}

    def left(self, key: str) -> float:
        if self.capacity <= 0:
            return math.inf  # 0 = no budget of this kind
        now = self._monotonic()
        seconds, at = self._buckets.get(key, (self.capacity, now))
        return min(self.capacity, seconds + max(0.0, now - at) * self.rate)

    def spend(self, key: str, seconds: float) -> None:
        if len(self.spent) < MAX_KEYS or key in self.spent:
            self.spent[key] = self.spent.get(key, 0.0) + seconds
        if self.capacity <= 0:
            return
        left = self.left(key)
        self._buckets.pop(key, None)
        self._buckets[key] = (left - seconds, self._monotonic())
        while len(self._buckets) > MAX_KEYS:
            self._buckets.popitem(last=False)


class ToolBudget:
    """Per-identity and per-address buckets of tool seconds (module docstring); 0 turns one off."""

    def __init__(
        self,
        per_identity_s: float,
        per_address_s: float,
        window_s: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._identities = _Buckets(per_identity_s, window_s, monotonic)
        self._addresses = _Buckets(per_address_s, window_s, monotonic)

    def left(self, worker_id: str, address: str, *, established: bool) -> float:
        """Tool seconds one lease of ``worker_id`` leased from ``address`` may spend now (>= 0)."""
        identity = self._identities.left(worker_id)
        if established or not address:
            return max(0.0, identity)
        return max(0.0, min(identity, self._addresses.left(address)))

    def spend(self, worker_id: str, address: str, seconds: float, *, established: bool) -> None:
        """Charge ``seconds`` of tool runs to the identity and (if fresh) to its address."""
        self._identities.spend(worker_id, seconds)
        if address and not established:
            self._addresses.spend(address, seconds)

    def state(self, worker_id: str, address: str) -> ToolBudgetState:
        return ToolBudgetState(
            identity_left_s=self._identities.left(worker_id),
            address_left_s=self._addresses.left(address) if address else math.inf,
            identity_spent_s=self._identities.spent.get(worker_id, 0.0),
            address_spent_s=self._addresses.spent.get(address, 0.0),
        )
