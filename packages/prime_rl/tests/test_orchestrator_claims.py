"""The orchestrator over real HTTP: verdicts, per-worker accounting, claims, commits, backpressure, expiry."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import Verdict, VerdictRequest


def _verdict_all(
    client: OrchestratorClient, batch_id: str, n: int, *, accept: bool = True, adv: Any = None
) -> None:
    verdicts = [
        Verdict(
            sample_index=i,
            accepted=accept,
            reason="ok" if accept else "toploc_mismatch",
            reward=float(i % 2 == 0),
            advantage=(adv[i] if adv is not None else (1.0 if i % 2 == 0 else -1.0)),
            logprobs=[-0.125, -0.5 - i] if accept else [],  # the validator's, one per completion token
        )
        for i in range(n)
    ]
    client.post_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts))


def test_auth_ban_and_accounting(client: OrchestratorClient, server: Any, batch_for: Any) -> None:
    good = client.register("good")
    good_token = client.worker_token
    bad = client.register("bad")
    bad_token = client.worker_token
    client.worker_token = good_token
    lease = client.get_tasks(good.worker_id)
    # Another worker's token cannot submit for `good`.
    client.worker_token = bad_token
    with pytest.raises(ClientRequestError) as error:
        client.submit_rollouts(batch_for(lease))
    assert error.value.status == 401
    client.worker_token = good_token
    answer = client.submit_rollouts(batch_for(lease))
    _verdict_all(client, answer.batch_id, 4)
    client.worker_token = bad_token
    bad_lease = client.get_tasks(bad.worker_id)
    bad_answer = client.submit_rollouts(batch_for(bad_lease))
    _verdict_all(client, bad_answer.batch_id, 4, accept=False)
    client.ban(bad.worker_id, "failure rate 1.0 over 4 samples")
    with pytest.raises(ClientRequestError) as error:
        client.get_tasks(bad.worker_id)
    assert error.value.status == 403 and error.value.error == "banned"
    stats = {w.worker_id: w for w in client.workers().workers}
    assert stats[good.worker_id].samples_accepted == 4 and stats[good.worker_id].samples_rejected == 0
    assert stats[bad.worker_id].samples_rejected == 4
    assert stats[bad.worker_id].rejected_reasons == {"toploc_mismatch": 4}
    assert stats[bad.worker_id].banned and "failure rate" in stats[bad.worker_id].ban_reason


def test_verdicts_must_cover_every_sample_once(client: OrchestratorClient, batch_for: Any) -> None:
    reg = client.register()
    answer = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id)))
    partial = [Verdict(sample_index=0, accepted=True, reason="ok", reward=1.0, advantage=1.0)]
    with pytest.raises(ClientRequestError) as error:
        client.post_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=partial * 4))
    assert error.value.status == 400
    with pytest.raises(ClientRequestError) as error:
        client.post_verdicts(VerdictRequest(batch_id="w9999-s0-b0", verdicts=partial))
    assert error.value.status == 404
    _verdict_all(client, answer.batch_id, 4)
    _verdict_all(client, answer.batch_id, 4)  # identical repeat is fine
    with pytest.raises(ClientRequestError) as error:
        _verdict_all(client, answer.batch_id, 4, accept=False)
    assert error.value.status == 409


def test_claims_are_exactly_once_versioned_and_survive_restart(
    server_factory: Any, batch_for: Any, tmp_path: Any
) -> None:
    server = server_factory()
    client = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    reg = client.register()
    answers = []
    for version, advantages in ((0, None), (0, [0.0, 0.0, 0.0, 0.0]), (0, None)):
        lease = client.get_tasks(reg.worker_id)
        answers.append(client.submit_rollouts(batch_for(lease, version)))
        if advantages is None:
            _verdict_all(client, answers[-1].batch_id, 4)
        else:
            _verdict_all(client, answers[-1].batch_id, 4, adv=advantages)
    waiting = client.claim(0, 100)
    assert not waiting.ready and "need 100" in waiting.reason and waiting.zero_advantage_samples == 4
    claim0 = client.claim(0, 5)
    assert claim0.ready and len(claim0.samples) == 6  # whole groups of 2 until >= 5
    assert claim0.zero_advantage_samples == 4
    assert all(s.advantage != 0 for s in claim0.samples)
    assert (
        client.claim(0, 5).samples == claim0.samples
    )  # a retry (or a restarted trainer) gets the same samples
    with pytest.raises(ClientRequestError):
        client.claim(1, 1)  # step 1 does not exist before step 0 is committed
    assert client.commit(0, 1).step == 1
    assert client.commit(0, 1).step == 1  # idempotent replay
    assert client.status().policy_version == 1
    # Step 1 (async_level 1 -> min version 0): one informative group of batch 3 is left.
    assert client.claim(1, 3).available_samples == 2
    # A version-1 batch for step 1, then restart the orchestrator and check nothing was lost.
    lease = client.get_tasks(reg.worker_id)
    stored = client.submit_rollouts(batch_for(lease, 1))
    server.stop()
    restarted = server_factory()
    client = OrchestratorClient(
        restarted.url, retries=0, worker_token=client.worker_token, admin_token=restarted.admin_token
    )
    assert client.status().step == 1
    assert [b.batch_id for b in client.pending().batches] == [stored.batch_id]
    assert client.claim(0, 5).samples == claim0.samples
    _verdict_all(client, stored.batch_id, 4)
    claim1 = client.claim(1, 6)
    assert claim1.ready and len(claim1.samples) == 6
    assert {s.batch_id for s in claim1.samples} == {answers[2].batch_id, stored.batch_id}
    assert not {s.sample_id for s in claim1.samples} & {s.sample_id for s in claim0.samples}
    assert client.commit(1, 2).step == 2
    # Step 2 with async_level 1 needs version >= 1: accepted version-0 samples are stale, never claimed
    # (the new batch and the all-zero-advantage batch of step 0).
    lease = client.get_tasks(reg.worker_id)
    old = client.submit_rollouts(batch_for(lease, 0))
    _verdict_all(client, old.batch_id, 4)
    late = client.claim(2, 1)
    assert not late.ready and late.stale_samples == 8 and late.min_policy_version == 1


def test_select_claim_oracle() -> None:
    """Hand-built batches: b0 stale (v0), b1 pending, b2 one informative + one all-zero group, b3 informative."""
    from dataclasses import dataclass, field

    from prime_rl.api.protocol import Verdict
    from prime_rl.orchestrator.claims import available_samples, select_claim

    @dataclass
    class B:
        batch_id: str
        seq: int
        policy_version: int
        task_ids: tuple[int, ...]
        verdicts: list[Verdict] | None
        claimed: set[int] = field(default_factory=set)

    def v(i: int, ok: bool, adv: float) -> Verdict:
        return Verdict(sample_index=i, accepted=ok, reason="ok" if ok else "bad", reward=0.0, advantage=adv)

    batches = [
        B("b3", 3, 2, (7, 7), [v(0, True, 1.0), v(1, True, -1.0)]),
        B("b0", 0, 0, (1, 1), [v(0, True, 1.0), v(1, True, -1.0)]),
        B("b1", 1, 2, (2, 2, 2), None),
        # task 3: members 0 and 2 accepted (1 rejected) -> group of 2; task 4: all-zero advantages.
        B(
            "b2",
            2,
            1,
            (3, 3, 3, 4, 4),
            [v(0, True, 0.5), v(1, False, 0.0), v(2, True, -0.5), v(3, True, 0.0), v(4, True, 0.0)],
        ),
    ]
    # Step 2 with async_level 1: min version 1 -> b0 (2 samples) is stale.
    picked = select_claim(batches, min_policy_version=1, min_samples=3, filter_zero_advantage=True)
    assert tuple(map(str, picked.sample_ids)) == ("b2/0", "b2/2", "b3/0", "b3/1")  # whole groups, oldest batch first
    assert (picked.available, picked.pending_batches, picked.pending_samples) == (4, 1, 3)
    assert (picked.stale, picked.zero_advantage) == (2, 2)
    # Without the zero-advantage filter the all-zero group counts and comes before b3.
    unfiltered = select_claim(batches, min_policy_version=1, min_samples=3, filter_zero_advantage=False)
    assert tuple(map(str, unfiltered.sample_ids)) == ("b2/0", "b2/2", "b2/3", "b2/4")
    # Not enough: nothing is taken.
    short = select_claim(batches, min_policy_version=1, min_samples=5, filter_zero_advantage=True)
    assert short.sample_ids == () and not short.ready and short.available == 4
    # Already claimed samples are never offered again.
    batches[0].claimed = {0, 1}
    again = select_claim(batches, min_policy_version=1, min_samples=1, filter_zero_advantage=True)
    assert tuple(map(str, again.sample_ids)) == ("b2/0", "b2/2")
    # What backpressure counts (no selection, any order): select_claim's ``available`` in every case.
    for version in (0, 1, 2, 3):
        for filtering in (True, False):
            expected = select_claim(batches, min_policy_version=version, min_samples=1, filter_zero_advantage=filtering)
            counted = available_samples(batches[::-1], min_policy_version=version, filter_zero_advantage=filtering)
            assert counted == expected.available
    assert available_samples(batches, min_policy_version=1, filter_zero_advantage=True) == 2
    assert available_samples(batches, min_policy_version=1, filter_zero_advantage=False) == 4


def test_backpressure_refuses_leases_while_enough_is_buffered(server_factory: Any, batch_for: Any) -> None:
    from prime_rl.api.client import OrchestratorBusy

    server = server_factory("--orchestrator.max_buffered_samples", "6", "--trainer.samples_per_step", "2")
    client = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    reg = client.register()
    first = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id)))  # 4 awaiting validation
    with pytest.raises(OrchestratorBusy):  # issue 44: a second lease would admit 8 samples against 6
        client.get_tasks(reg.worker_id)
    answer = requests.get(
        server.url + "/tasks",
        params={"worker_id": reg.worker_id},
        headers={"Authorization": f"Bearer {client.worker_token}"},
        timeout=10,
    )
    # Retry-After: the identities refused lately over the leases granted lately (2 in the window), at
    # least 1 s, at most LeaseRules.MAX_BUSY_RETRY_S (test_lease_rules: how it grows).
    assert answer.status_code == 429 and answer.json()["error"] == "busy"
    assert 1 <= int(answer.headers["Retry-After"]) <= 15
    # Accepted samples the trainer would never claim (all-zero advantages, filtered) free their room:
    # counting them would deadlock (nothing claimable, no new leases).
    _verdict_all(client, first.batch_id, 4, adv=[0.0] * 4)
    lease = client.get_tasks(reg.worker_id)
    # Open leases are admitted work (issue 44: 992 batches once queued against a 128-sample limit).
    with pytest.raises(OrchestratorBusy):
        client.get_tasks(reg.worker_id)
    second = client.submit_rollouts(batch_for(lease))
    # Informative accepted samples do count until the trainer claims them.
    _verdict_all(client, second.batch_id, 4)
    with pytest.raises(OrchestratorBusy):
        client.get_tasks(reg.worker_id)
    assert len(client.claim(0, 4).samples) == 4  # the informative group consumed: nothing admitted
    assert client.get_tasks(reg.worker_id).batch_index == 2


def test_backpressure_limit_below_one_step_is_refused(config_for: Any) -> None:
    from prime_rl.orchestrator.ledger import Ledger
    from prime_rl.orchestrator.store import RolloutStore

    config = config_for("--orchestrator.max_buffered_samples", "10", "--trainer.samples_per_step", "16")
    with pytest.raises(ValueError, match="max_buffered_samples"):
        Ledger(config, [0] * 10, RolloutStore(config.orchestrator_data_dir))


def test_batches_too_old_to_train_on_expire_instead_of_being_validated(
    client: OrchestratorClient, batch_for: Any
) -> None:
    """async_level 1: a v0 batch leased at step 0 still unvalidated at step 2 is never handed to the validator."""
    reg = client.register()
    a = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id), 0))
    late = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id), 0))
    _verdict_all(client, a.batch_id, 4)
    client.claim(0, 4)
    client.commit(0, 1)
    assert {b.batch_id for b in client.pending().batches} == {late.batch_id}  # still usable at step 1
    c = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id), 1))
    fresh = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id), 1))
    pending = client.pending()
    # Freshest policy first, then submission order.
    assert [b.batch_id for b in pending.batches] == [c.batch_id, fresh.batch_id, late.batch_id]
    _verdict_all(client, c.batch_id, 4)
    client.claim(1, 4)
    client.commit(1, 2)
    pending = client.pending()  # step 2 needs version >= 1: `late` (v0) expires
    assert [b.batch_id for b in pending.batches] == [fresh.batch_id]
    stats = client.workers().workers[0]
    assert (stats.samples_expired, stats.samples_rejected, stats.samples_pending) == (4, 0, 4)
    assert stats.rejected_reasons == {}
    # A validator that was already judging `late` may still post its verdicts; they replace `expired`
    # (accounting), but the samples stay too old for any claim.
    _verdict_all(client, late.batch_id, 4)
    assert client.workers().workers[0].samples_expired == 0
    _verdict_all(client, fresh.batch_id, 4)
    assert {s.batch_id for s in client.claim(2, 4).samples} == {fresh.batch_id}


def test_a_lease_fixes_the_version_the_worker_states_before_it_sees_its_tasks(
    server_factory: Any, batch_for: Any
) -> None:
    """Issue 34 (version shopping): the lease fixes one version. The worker states the version it
    holds when it asks (``version``); inside the async window the lease fixes that one, so a worker
    still downloading the newest version keeps generating (downloads overlap generation); outside
    it, or unstated, the lease fixes the newest committed. The record keeps the fixed version across
    a restart, which is what the validator checks the batch against."""
    server = server_factory()
    client = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    reg = client.register()
    answer = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id)))
    _verdict_all(client, answer.batch_id, 4)
    assert client.claim(0, 2).ready
    assert client.commit(0, 1).step == 1  # step 1, async_level 1: versions 0 and 1 are in the window
    held_back = client.get_tasks(reg.worker_id, version=0)
    assert (held_back.step, held_back.policy_version, held_back.min_policy_version) == (1, 0, 0)
    assert client.get_tasks(reg.worker_id, version=1).policy_version == 1
    client.submit_rollouts(batch_for(held_back, 0))
    assert client.get_tasks(reg.worker_id, version=7).policy_version == 1  # from the future: the newest
    server.stop()
    restarted = server_factory()
    held = restarted.ledger.leases.get(reg.worker_id, held_back.batch_index)
    assert held is not None and held.record.fixed_version == 0


def test_max_off_policy_steps_bounds_training_staleness_apart_from_the_lease_window(
    server_factory: Any, batch_for: Any, config_for: Any
) -> None:
    """async_level 1 bounds which version a lease fixes; max_off_policy_steps 2 bounds what trains:
    a v0 batch validated late still trains at step 2 (2 - 0 <= 2), never at step 3."""
    server = server_factory("--orchestrator.max_off_policy_steps", "2")
    client = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    reg = client.register()
    a, old1, old2 = (client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id), 0)) for _ in range(3))
    _verdict_all(client, a.batch_id, 4)
    assert {s.batch_id for s in client.claim(0, 4).samples} == {a.batch_id}
    client.commit(0, 1)
    c = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id), 1))
    _verdict_all(client, c.batch_id, 4)
    assert {s.batch_id for s in client.claim(1, 4).samples} == {c.batch_id}
    client.commit(1, 2)
    assert client.status().min_policy_version == 1  # the lease window stays async_level's
    # Not expired at step 2: the trainer may still use v0 (with async_level alone both would expire).
    assert {b.batch_id for b in client.pending().batches} >= {old1.batch_id, old2.batch_id}
    _verdict_all(client, old1.batch_id, 4)
    _verdict_all(client, old2.batch_id, 4)
    claim2 = client.claim(2, 4)
    assert claim2.ready and claim2.min_policy_version == 0
    assert {s.batch_id for s in claim2.samples} == {old1.batch_id}
    assert all(s.policy_version == 0 for s in claim2.samples)
    client.commit(2, 3)
    late = client.claim(3, 1)  # step 3 - v0 = 3 > 2: old2's samples are stale, counted, never handed out
    assert not late.ready and late.stale_samples == 4 and late.min_policy_version == 1
    with pytest.raises(ValueError, match="max_off_policy_steps"):
        config_for("--orchestrator.max_off_policy_steps", "0")  # below async_level 1
