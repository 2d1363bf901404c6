"""At most one reroll per lease, and no configuration that leaves the reroll open (issue 46, items 4 and 8).

Every in-flight switch is one keep-or-reroll for a worker that decodes the no-switch tail first
(``docs/inflight.md`` section 4). Before: switches were on by default (``max_versions_per_sample`` 4)
with neither the mandatory switch nor a binding speed cap, and a lease asked at the window's oldest
version (``GET /tasks?version=0`` at step 2) took v1 at chunk 1 and v2 at chunk 2: three tail draws.
"""

from __future__ import annotations

from typing import Any

import pytest

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import ClaimRequest, CommitRequest, LeaseSwitch, SwitchRequest
from prime_rl.config import load_config
from prime_rl.orchestrator.switches import decide_switch

from .conftest import INFLIGHT
from .ledger_support import _accept, _batch, _ledger, _submit


def test_switching_is_off_by_default_and_refused_without_the_mandatory_switch_and_speed_cap():
    assert load_config(None, []).orchestrator.max_versions_per_sample == 1
    with pytest.raises(ValueError, match=r"switch_deadline_s > 0.*max_decode_tokens_per_s > 0"):
        load_config(None, ["--orchestrator.max_versions_per_sample", "2"])
    with pytest.raises(ValueError, match="max_decode_tokens_per_s > 0"):  # the mandatory switch alone is not enough
        load_config(None, ["--orchestrator.max_versions_per_sample", "2", "--orchestrator.switch_deadline_s", "30"])
    with pytest.raises(ValueError, match="less than or equal to 2"):  # a second switch is a second reroll
        load_config(None, [*INFLIGHT, "--orchestrator.max_versions_per_sample", "4"])
    on = load_config(None, list(INFLIGHT)).orchestrator
    assert (on.max_versions_per_sample, on.switch_deadline_s > 0, on.max_decode_tokens_per_s > 0) == (2, True, True)


def lease_at_v0_after_two_commits(config_for: Any, *overrides: str) -> tuple[Any, Any, Any]:
    """A ledger at step 2 (v1 and v2 committed) and a lease its worker asked at version 0."""
    ledger, clock = _ledger(config_for, "--orchestrator.async_level", "2", "--sampling.max_new_tokens", "512", *overrides)
    feeder = ledger.workers[ledger.register("feeder").worker_id]
    for step in range(2):
        fed = ledger.lease(feeder, None, None)
        _accept(ledger, _submit(ledger, feeder, _batch(fed, step)).batch_id)
        assert ledger.claim(ClaimRequest(step=step, min_samples=1, filter_zero_advantage=False)).ready
        ledger.commit(CommitRequest(step=step, policy_version=step + 1))
        clock.now += 1.0
    worker = ledger.workers[ledger.register("shopper").worker_id]
    lease = ledger.lease(worker, None, None, version=0)
    assert (lease.step, lease.policy_version) == (2, 0)
    clock.now += 60.0  # long enough for any decode: the speed cap never binds below
    return ledger, worker, lease


def announce(ledger: Any, worker: Any, lease: Any, version: int, chunk: int) -> Any:
    request = SwitchRequest(
        worker_id=worker.worker_id, step=lease.step, batch_index=lease.batch_index, policy_version=version, chunk=chunk
    )
    return ledger.switch(worker, request)


def test_with_the_shipped_defaults_a_lease_asked_at_v0_switches_to_nothing(config_for):
    ledger, worker, lease = lease_at_v0_after_two_commits(config_for)
    for version, chunk in ((1, 1), (2, 2)):
        with pytest.raises(ApiFailure) as refused:
            announce(ledger, worker, lease, version, chunk)
        assert refused.value.status == 409 and "switches are off" in refused.value.message


def test_a_lease_asked_at_v0_takes_one_switch_not_one_per_newer_version(config_for):
    ledger, worker, lease = lease_at_v0_after_two_commits(config_for, *INFLIGHT)
    assert announce(ledger, worker, lease, 1, 1).nonce > 0
    with pytest.raises(ApiFailure) as refused:
        announce(ledger, worker, lease, 2, 2)  # the second reroll of the old rules
    assert refused.value.status == 409 and "at most one switch" in refused.value.message
    assert announce(ledger, worker, lease, 1, 1).nonce > 0  # an identical retry still answers the record
    record = ledger.leases.get(worker.worker_id, lease.batch_index).record
    assert [(s.policy_version, s.chunk) for s in record.switches] == [(1, 1)]


@pytest.mark.parametrize("max_versions", [2, 4, 64])
def test_decide_switch_takes_one_switch_whatever_max_versions_says(max_versions):
    from prime_rl.api.protocol import LeaseRecord

    record = LeaseRecord(
        worker_id="w", step=2, batch_index=0, task_ids=[0], issued_at=0.0, deadline=1e9, source_worker_id="w",
        source_step=2, source_batch_index=0, policy_version=0, switches=[LeaseSwitch(policy_version=1, chunk=1, announced_at=1.0)],
    )  # fmt: skip
    with pytest.raises(ApiFailure) as refused:
        decide_switch(
            record, is_open=True, policy_version=2, chunk=2, committed=2, now=100.0, max_versions=max_versions,
            max_new_tokens=512, max_tokens_per_s=1e9,
        )  # fmt: skip
    assert refused.value.status == 409 and "at most one switch" in refused.value.message
