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
from prime_rl.api.protocol import (
    PendingBatch,
    PendingResponse,
    RolloutBatch,
    RolloutSample,
    Segment,
    ValidatorLeaseResponse,
    Verdict,
    VerdictRequest,
    VersionSpan,
)

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
    samples read and built on another (``batch_verdicts.UnreadSamples``), so no ledger call waits for them;
    they are the samples submitted."""
    import prime_rl.orchestrator.batch_verdicts as batch_verdicts

    server, _ = served
    submitted = _submit(server, workers=3, batches_each=1)
    threads: list[str] = []
    built = batch_verdicts.sample_documents

    def noting(table: Any, **options: Any) -> Any:
        threads.append(threading.current_thread().name)
        return built(table, **options)

    stored = {b.batch_id: b.samples for b in server.ledger.pending(8).batches}  # read in one call (nothing held)
    monkeypatch.setattr(batch_verdicts, "sample_documents", noting)
    with _client(server) as admin:
        answer = admin.pending(8) if endpoint == "pending" else admin.take_batches("v1", limit=8)
    assert sorted(b.batch_id for b in answer.batches) == sorted(submitted)
    assert len(threads) == 1 and "ledger" not in threads[0], threads  # one conversion for the listing's 3 batches
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
    assert unread.json(answer) == read.model_dump_json().encode()  # what the routes send: the same, byte for byte


def _multi_turn_batch() -> RolloutBatch:
    """Samples with episode segments and version spans, and one without either."""
    turns = [Segment(kind="model", length=32, turn=0), Segment(kind="env", length=8, turn=0),
             Segment(kind="model", length=24, turn=1)]  # fmt: skip
    logprobs = [-0.25] * 32 + [0.0] * 8 + [-1.0 / 3.0] * 24
    spans = [VersionSpan(policy_version=3, first_token=0), VersionSpan(policy_version=4, first_token=32)]
    samples = [
        RolloutSample(task_id=7, group_index=g, prompt_tokens=[1, 2, 3], completion_tokens=list(range(64)),
                      sampling_seed=11 + g, temperature=0.7, reward=0.1 * g, advantage=-0.05, proofs=bytes(range(g, 40)),
                      inference_logprobs=logprobs, segments=turns if g else None, spans=spans if g < 2 else None)
        for g in range(3)
    ]  # fmt: skip
    return RolloutBatch(worker_id="w1", step=2, batch_index=0, policy_version=3, samples=samples)


def test_a_listings_samples_are_written_as_their_models_would_be() -> None:
    """``records.sample_documents`` (the listing's samples, straight from the payload table) gives
    the JSON the sample models give, byte for byte: with segments and spans, and for a payload stored
    before either existed."""
    import pyarrow as pa
    from pydantic import TypeAdapter

    from prime_rl.orchestrator.records import batch_rows, rollout_samples, sample_documents
    from prime_rl.orchestrator.store_schema import BATCH_SCHEMA

    batch = _multi_turn_batch()
    table = pa.Table.from_pydict(batch_rows(batch), schema=BATCH_SCHEMA)
    as_models, as_json = TypeAdapter(list[RolloutSample]).dump_json, TypeAdapter(Any).dump_json
    assert rollout_samples(table) == batch.samples
    assert as_json(sample_documents(table)) == as_models(batch.samples)
    older = table.drop_columns(["segments", "spans"])
    assert as_json(sample_documents(older)) == as_models(rollout_samples(older))
    assert b'"segments":null,"spans":null' in as_json(sample_documents(older))
    # A listing of both (one conversion for all its batches): the models' JSON, each batch its own samples.
    from prime_rl.orchestrator.batch_verdicts import UnreadSamples

    # A layout of other types too (group_index as int64): conformed to the store's schema, the same samples.
    wider = older.set_column(older.schema.get_field_index("group_index"), "group_index", older.column("group_index").cast(pa.int64()))
    listed = [PendingBatch(batch_id=f"b{i}", worker_id="w1", step=2, batch_index=i, policy_version=3, received_at=1.5,
                           lease=None, samples=[]) for i in range(4)]  # fmt: skip
    answer = PendingResponse(batches=listed, pending_batches=4, policy_version=3, step=2)
    unread = UnreadSamples([table, older, table.slice(1), wider], payloads=None)  # type: ignore[arg-type]
    assert unread.json(answer) == unread.into(answer).model_dump_json().encode()
    assert [len(b.samples) for b in unread.into(answer).batches] == [3, 3, 2, 3]
    packed = PendingResponse.model_validate_json(unread.json(answer, packed=True))
    assert [b.samples for b in packed.batches] == [b.samples for b in unread.into(answer).batches]


def test_packed_samples_parse_to_the_samples_stored() -> None:
    """``sample_documents(table, packed=True)``: the token and log-prob lists packed from the table's
    buffers (sliced tables too), every other field as in the JSON listing; parsed by the wire model they
    are the samples submitted, floats exactly."""
    import pyarrow as pa

    from prime_rl.orchestrator.records import batch_rows, sample_documents
    from prime_rl.orchestrator.store_schema import BATCH_SCHEMA

    batch = _multi_turn_batch()
    table = pa.Table.from_pydict(batch_rows(batch), schema=BATCH_SCHEMA)
    documents = sample_documents(table, packed=True)
    assert {d["completion_tokens"]["dtype"] for d in documents} == {"<i4"}
    assert {d["inference_logprobs"]["dtype"] for d in documents} == {"<f8"}
    assert [RolloutSample.model_validate(d) for d in documents] == batch.samples
    plain = sample_documents(table)
    assert [list(d) for d in documents] == [list(d) for d in plain]  # the fields in the model's order
    assert [{**d, **{k: p[k] for k in ("prompt_tokens", "completion_tokens", "inference_logprobs")}} for d, p in zip(documents, plain, strict=True)] == plain  # fmt: skip
    tail = pa.concat_tables([table.slice(0, 1), table.slice(1)]).slice(1)  # two chunks, an offset
    assert [RolloutSample.model_validate(d) for d in sample_documents(tail, packed=True)] == batch.samples[1:]


def test_a_packed_listing_holds_the_samples_of_a_json_one(served: Any) -> None:
    """Through the real server, both listings: ``?arrays=packed`` answers the samples' lists packed,
    and they parse to the samples the JSON listing holds; any other ``arrays`` is a 400."""
    import requests

    server, _ = served
    _submit(server, workers=2, batches_each=2)
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    as_json = requests.get(f"{server.url}/validator/pending", params={"limit": 8}, headers=headers, timeout=10)
    packed = requests.get(f"{server.url}/validator/pending", params={"limit": 8, "arrays": "packed"}, headers=headers, timeout=10)
    assert as_json.status_code == packed.status_code == 200
    first = packed.json()["batches"][0]["samples"][0]
    assert isinstance(first["prompt_tokens"], dict) and isinstance(as_json.json()["batches"][0]["samples"][0]["prompt_tokens"], list)
    assert PendingResponse.model_validate_json(packed.content) == PendingResponse.model_validate_json(as_json.content)
    taken = requests.post(f"{server.url}/validator/leases", params={"arrays": "packed"}, headers=headers, timeout=10,
                          json={"validator_id": "v1", "limit": 8})  # fmt: skip
    assert taken.status_code == 200 and isinstance(taken.json()["batches"][0]["samples"][0]["inference_logprobs"], dict)
    listed = {b.batch_id: b.samples for b in PendingResponse.model_validate_json(as_json.content).batches}
    assert {b.batch_id: b.samples for b in ValidatorLeaseResponse.model_validate_json(taken.content).batches} == listed
    for endpoint, method in (("pending", "GET"), ("leases", "POST")):
        bad = requests.request(method, f"{server.url}/validator/{endpoint}", params={"arrays": "msgpack"}, headers=headers,
                               json={"validator_id": "v1"}, timeout=10)  # fmt: skip
        assert bad.status_code == 400 and "arrays" in bad.json()["message"]
