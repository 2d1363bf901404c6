"""Validator leases (issue 45 item 1): several validators against one real orchestrator, over HTTP.

``POST /validator/leases`` hands each pending batch to one validator at a time, for
``orchestrator.validator_lease_s`` on the orchestrator's clock (stepped by hand here); a stalled
validator's batches go back to the pool when the lease runs out; a verdict from a validator whose
lease passed to another is refused (409 ``lease_lost``) unless identical to the recorded one.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import PendingBatch, Verdict, VerdictRequest

make_batch: Any = None  # conftest's, set by the fixture (importlib mode cannot import conftest)


@pytest.fixture
def served(clocked_server_for: Any, batch_for: Any) -> Any:
    global make_batch
    make_batch = batch_for
    return clocked_server_for("--orchestrator.validator_lease_s", "30", "--orchestrator.task_timeout_s", "1000")


def _client(server: Any) -> OrchestratorClient:
    return OrchestratorClient(server.url, timeout_s=10, retries=1, backoff_s=0.05, admin_token=server.admin_token)


def _submit(server: Any, workers: int, batches_each: int) -> list[str]:
    ids = []
    for _ in range(workers):
        with _client(server) as worker:
            reg = worker.register()
            for _ in range(batches_each):
                ids.append(worker.submit_rollouts(make_batch(worker.get_tasks(reg.worker_id))).batch_id)
    return ids


def _accept(batch: PendingBatch, validator_id: str | None, reward: float = 1.0) -> VerdictRequest:
    verdicts = [
        Verdict(sample_index=i, accepted=True, reason="ok", reward=reward, advantage=0.0,
                logprobs=[-0.5] * len(sample.completion_tokens))
        for i, sample in enumerate(batch.samples)
    ]  # fmt: skip
    return VerdictRequest(batch_id=batch.batch_id, verdicts=verdicts, validator_id=validator_id)


def test_two_validators_never_receive_the_same_batch_while_a_lease_holds(served: Any) -> None:
    server, _ = served
    submitted = _submit(server, workers=6, batches_each=2)
    with _client(server) as one, _client(server) as two:
        first = one.take_batches("v1", limit=5)
        second = two.take_batches("v2", limit=256)
        a, b = {x.batch_id for x in first.batches}, {x.batch_id for x in second.batches}
        assert len(a) == 5 and a.isdisjoint(b) and a | b == set(submitted)
        assert first.expires_at == pytest.approx(1_000_030.0) and first.lease_s == 30
        # Asking again hands nothing new to either: every batch is held.
        assert {x.batch_id for x in two.take_batches("v2", limit=8).batches} <= b
        assert {x.batch_id for x in one.take_batches("v1", limit=256).batches} <= a
        assert "validator_leases" in one.status().capabilities  # what `prime-rl run` checks for validator.count > 1
        # The anonymous listing takes nothing and shows no held batch.
        assert one.pending(256).batches == [] and one.pending(256).pending_batches == len(submitted)


def test_queue_order_is_kept_across_validators(served: Any) -> None:
    """Freshest version first, then submission order: the first validator takes the queue's head,
    the second the next places, as one validator would have been served them."""
    server, _ = served
    _submit(server, workers=4, batches_each=1)
    with _client(server) as admin:
        order = [x.batch_id for x in admin.pending(256).batches]
        head = [x.batch_id for x in admin.take_batches("v1", limit=2).batches]
        rest = [x.batch_id for x in admin.take_batches("v2", limit=8).batches]
    assert head + rest == order


def test_a_stalled_validators_batches_go_back_to_the_pool_when_its_lease_runs_out(served: Any) -> None:
    server, clock = served
    submitted = _submit(server, workers=2, batches_each=1)
    with _client(server) as stalled, _client(server) as live:
        taken = stalled.take_batches("stalled", limit=8).batches
        assert {x.batch_id for x in taken} == set(submitted)
        clock.now += 29.0  # still held
        assert live.take_batches("live", limit=8).batches == []
        # A renewal extends the lease: 29 s later it still holds.
        renewed = stalled.take_batches("stalled", limit=0, renew=[taken[0].batch_id])
        assert renewed.renewed == [taken[0].batch_id] and renewed.lost == []
        clock.now += 2.0  # the other batch's lease ran out, the renewed one holds
        again = live.take_batches("live", limit=8).batches
        assert [x.batch_id for x in again] == [taken[1].batch_id]
        # The stalled validator wakes up: its lost batch is refused, its held one accepted.
        answer = stalled.take_batches("stalled", limit=0, renew=[taken[0].batch_id, taken[1].batch_id])
        assert answer.lost == [taken[1].batch_id]
        with pytest.raises(ClientRequestError) as refused:
            stalled.post_verdicts(_accept(taken[1], "stalled"))
        assert refused.value.status == 409 and refused.value.error == "lease_lost"
        with pytest.raises(ClientRequestError) as anonymous:
            stalled.post_verdicts(_accept(taken[1], None))
        assert anonymous.value.error == "lease_lost"
        assert live.post_verdicts(_accept(again[0], "live")).accepted == len(again[0].samples)
        # Once judged: the identical verdicts from anyone are a 200 (idempotent), different ones a 409.
        assert stalled.post_verdicts(_accept(taken[1], "stalled")).accepted == len(taken[1].samples)
        different = _accept(taken[1], "stalled").model_copy(update={"verdicts": [
            v.model_copy(update={"reward": 0.0}) for v in _accept(taken[1], "stalled").verdicts
        ]})  # fmt: skip
        with pytest.raises(ClientRequestError) as conflict:
            stalled.post_verdicts(different)
        assert conflict.value.error == "conflict"
        stalled.post_verdicts(_accept(taken[0], "stalled"))
        assert server.ledger.validator_leases.held_by("stalled") == [] and len(server.ledger.validator_leases) == 0


def test_a_lease_that_ran_out_untaken_still_takes_its_holders_verdicts(served: Any) -> None:
    server, clock = served
    _submit(server, workers=1, batches_each=1)
    with _client(server) as slow:
        (batch,) = slow.take_batches("slow", limit=8).batches
        clock.now += 120.0
        assert slow.post_verdicts(_accept(batch, "slow")).accepted == len(batch.samples)


def test_k_validators_judge_every_batch_once(served: Any) -> None:
    """Three validator threads take, judge and post until the queue is empty; one of them stalls
    for good after taking its first batches (their leases run out and pass on). Every batch is
    judged, none twice: each validator only posts what it holds.

    Each validator's verdicts carry its own reward, so two judgements of one batch differ: a 200 is
    then a judgement the orchestrator stored. (Identical verdicts would be a 200 from anyone once the
    batch is judged, the idempotent retry: a validator whose lease ran out, passed on and was released
    when the new holder posted, may post after it and get that 200 without anything counting twice.)"""
    server, clock = served
    submitted = _submit(server, workers=8, batches_each=2)
    posted: Counter[str] = Counter()
    refused: list[str] = []
    lock = threading.Lock()

    def validator(name: str, stall: bool) -> None:
        with _client(server) as http:
            for _ in range(200):
                leased = http.take_batches(name, limit=3)
                if stall and leased.batches:
                    return  # took its batches and died
                if not leased.batches and leased.pending_batches == 0:
                    return
                for batch in leased.batches:
                    try:
                        http.post_verdicts(_accept(batch, name, reward=float(name[1:])))
                    except ClientRequestError as error:
                        with lock:
                            refused.append(f"{batch.batch_id}:{error.error}")
                        continue
                    with lock:
                        posted[batch.batch_id] += 1
                if not leased.batches:
                    with lock:
                        clock.now += 10.0  # time passes while nothing is free: the dead one's leases run out

    threads = [threading.Thread(target=validator, args=(f"v{i}", i == 0)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(posted) == set(submitted)
    assert max(posted.values()) == 1, posted  # 0 batches judged twice
    # A live validator's lease may run out too when the clock jumps mid-batch: its verdict is then
    # refused, never counted twice: lease_lost while the new holder judges, conflict once it posted.
    assert all(entry.endswith((":lease_lost", ":conflict")) for entry in refused), refused


def test_the_validators_lease_keeper_renews_while_a_long_batch_is_judged(served: Any) -> None:
    from prime_rl.validator.lease_keeper import LeaseKeeper

    server, clock = served
    _submit(server, workers=2, batches_each=1)
    with _client(server) as http, _client(server) as other:
        taken = http.take_batches("judge", limit=8)
        ids = [x.batch_id for x in taken.batches]
        keeper = LeaseKeeper(server.url, server.admin_token, "judge", ids, lease_s=3600)  # the thread waits: tick by hand
        with keeper:
            for _ in range(4):  # 4 x 20 s > the 30 s lease: held only because it is renewed
                clock.now += 20.0
                keeper.renew_now()
                assert other.take_batches("other", limit=8).batches == []
            keeper.done(ids[0])
            clock.now += 20.0
            keeper.renew_now()
            clock.now += 20.0  # ids[0] no longer renewed: its lease ran out
            assert [x.batch_id for x in other.take_batches("other", limit=8).batches] == [ids[0]]
            assert not keeper.lost(ids[1])
        assert keeper.renewals == 5


@pytest.mark.parametrize("endpoint", ["pending", "take_batches"])
def test_a_listing_reads_its_samples_off_the_ledger_thread(served: Any, endpoint: str, monkeypatch: Any) -> None:
    """Through the real server: the listing's batches are chosen on the ledger's thread, and their
    samples read and built on another (``batches.UnreadSamples``), so no ledger call waits for them;
    they are the samples submitted."""
    import prime_rl.orchestrator.batches as batches

    server, _ = served
    submitted = _submit(server, workers=3, batches_each=1)
    threads: list[str] = []
    built = batches.rollout_samples

    def noting(table: Any) -> Any:
        threads.append(threading.current_thread().name)
        return built(table)

    stored = {b.batch_id: b.samples for b in server.ledger.pending(8).batches}  # read in one call (nothing held)
    monkeypatch.setattr(batches, "rollout_samples", noting)
    with _client(server) as admin:
        answer = admin.pending(8) if endpoint == "pending" else admin.take_batches("v1", limit=8)
    assert sorted(b.batch_id for b in answer.batches) == sorted(submitted)
    assert len(threads) == 3 and "ledger" not in threads, threads
    assert {b.batch_id: b.samples for b in answer.batches} == stored


def test_a_batch_settled_before_its_samples_are_read_is_left_out(served: Any) -> None:
    """Between the ledger's call and the read, a listed batch can settle and its payload file go (its
    record written, the file deleted): it is no longer pending, and the answer leaves it out."""
    server, _ = served
    _submit(server, workers=3, batches_each=1)
    ledger = server.ledger
    answer, unread = ledger.pending_unread(8)
    gone = answer.batches[1].batch_id
    path = ledger.store.payload_path(gone)
    assert path is not None
    ledger.store.payloads.delete([path])
    read = unread.into(answer)
    assert [b.batch_id for b in read.batches] == [b.batch_id for b in answer.batches if b.batch_id != gone]
    assert all(b.samples for b in read.batches)
