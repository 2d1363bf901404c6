"""Issue 46, finding 1: rejections the worker did not choose never ban it through abandonment.

``tool_unverifiable``, ``reward_unverifiable``, ``internal_error`` and ``expired`` are the machine's
reasons (``lease_rules.machine_caused``): the lease's tasks still go to another identity (no veto is
free) and the allowance still pays (a worker can cause some at will), but the abandonment ban never
counts them. A worker is banned for them only when their share is above the configured honest
share by a sequential test whose false-ban bound is stated (``lease_rules.machine_rate_evidence``).
Before the fix, 3 such leases of an honest worker banned it ("abandoned 3 of N leases").
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from prime_rl.api.protocol import Verdict, VerdictRequest
from prime_rl.orchestrator.lease_rules import MACHINE_REASONS, machine_caused, machine_rate_evidence
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.store import RolloutStore

from .ledger_support import _accept, _batch, _ledger, _submit


def _judge(ledger: Ledger, batch_id: str, reason: str) -> None:
    """The validator's verdicts: ``reason`` on sample 0 and the rest follow (``ok``: all accepted)."""
    if reason == "ok":
        _accept(ledger, batch_id)
        return
    n = len(ledger.batches[batch_id].task_ids)
    verdicts = [
        Verdict(sample_index=i, accepted=False, reason=reason if i == 0 else "lease_rejected", reward=0.0, advantage=0.0)
        for i in range(n)
    ]
    ledger.record_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts))


def _verdicts(*reasons: str) -> list[Verdict]:
    return [
        Verdict(sample_index=i, accepted=r == "ok", reason=r, reward=0.0, advantage=0.0) for i, r in enumerate(reasons)
    ]


def test_machine_caused_is_own_failures_all_the_machines() -> None:
    for reason in MACHINE_REASONS:
        assert machine_caused(_verdicts(reason, "lease_rejected", "group_rejected"))
    assert machine_caused(_verdicts("tool_unverifiable", "internal_error"))
    assert not machine_caused(_verdicts("tool_unverifiable", "tool_output_mismatch"))  # a cheat among them
    assert not machine_caused(_verdicts("ok", "ok"))
    assert not machine_caused(_verdicts("lease_rejected"))


@pytest.mark.parametrize("reason", sorted(MACHINE_REASONS))
def test_machine_caused_rejections_never_ban_but_still_cost_and_hand_tasks_on(config_for: Any, reason: str) -> None:
    """An honest worker whose every other lease is rejected for a machine reason (the tool bench's
    honest 'clock' or 'slow_worker' programs) is never banned, also after a restart; each such lease
    costs its allowance like walking away, and its tasks go to another identity."""
    ledger, clock = _ledger(config_for)
    honest = ledger.workers[ledger.register("honest").worker_id]
    rejected_indices = []
    for index in range(12):
        lease = ledger.lease(honest, None, None, "10.0.0.1")
        batch_id = _submit(ledger, honest, _batch(lease)).batch_id
        _judge(ledger, batch_id, reason if index % 2 else "ok")
        if index % 2:
            rejected_indices.append(lease.batch_index)
        clock.now += 1
        ledger.expire_leases()
    assert not honest.banned, honest.ban_reason  # today: banned at its 3rd ("abandoned 3 of 6 leases")
    assert ledger.leases.machine_rejected(honest.worker_id) == 6 and ledger.rules.chargeable(honest.worker_id) == 0
    assert ledger.lease_allowance(honest.worker_id) == 1  # min(4, 1 + 12 - 6) - 6: the allowance pays
    other = ledger.workers[ledger.register("other").worker_id]
    taken = [ledger.lease(other, None, None, "10.0.0.2").reassigned_from for _ in range(1)]
    assert taken[0] is not None and taken[0].worker_id == honest.worker_id  # no veto is free
    # A restart rebuilds the same standing from the stored verdicts.
    again = Ledger(ledger.config, ledger.tasks, RolloutStore(ledger.config.orchestrator_data_dir), clock=clock)
    assert again.leases.machine_rejected(honest.worker_id) == 6 and again.rules.chargeable(honest.worker_id) == 0
    assert not again.workers[honest.worker_id].banned


def test_walking_away_still_bans_beside_machine_rejections(config_for: Any) -> None:
    """A lease the worker left unanswered still counts: machine rejections do not dilute it."""
    ledger, clock = _ledger(config_for)
    worker = ledger.workers[ledger.register("walker").worker_id]
    for _ in range(2):
        _judge(ledger, _submit(ledger, worker, _batch(ledger.lease(worker, None, None))).batch_id, "tool_unverifiable")
    for _ in range(3):
        ledger.lease(worker, None, None)
        clock.now += 11
        ledger.expire_leases()
    assert worker.banned and "abandoned 3 of 5 leases" in worker.ban_reason


def test_machine_rejections_at_will_ban_only_above_the_honest_share(config_for: Any) -> None:
    """A worker that makes every lease machine-rejected on purpose (a tool that loops past its limit)
    is banned once the sequential test passes its bound; one at the honest share is not."""
    ledger, clock = _ledger(
        config_for,
        "--orchestrator.machine_rejected_honest_share", "0.5",
        "--orchestrator.machine_rejected_false_ban", "0.001",
    )  # fmt: skip
    at_will = ledger.workers[ledger.register("at will").worker_id]
    honest = ledger.workers[ledger.register("honest").worker_id]
    bound = -math.log(0.001)
    leases = 0
    while not at_will.banned and leases < 100:
        _judge(ledger, _submit(ledger, at_will, _batch(ledger.lease(at_will, None, None))).batch_id, "tool_unverifiable")
        leases += 1
    # k ln(0.75 / 0.5) >= ln(1000) at k = 18: the first count the test's evidence passes the bound.
    assert at_will.banned and leases == math.ceil(bound / math.log(1.5)), (leases, at_will.ban_reason)
    assert "false-ban bound 0.001" in at_will.ban_reason
    for index in range(60):  # machine-rejected at the honest share: never banned
        lease = ledger.lease(honest, None, None)
        _judge(ledger, _submit(ledger, honest, _batch(lease)).batch_id, "tool_unverifiable" if index % 2 else "ok")
        clock.now += 1
    assert not honest.banned, honest.ban_reason
    assert machine_rate_evidence(30, 60, 0.5) < 0 < machine_rate_evidence(18, 18, 0.5)
    assert machine_rate_evidence(100, 100, 1.0) == 0.0  # share 1: the rate ban is off
