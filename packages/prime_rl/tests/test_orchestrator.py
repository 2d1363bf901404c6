"""The orchestrator over real HTTP: lease assignment, submissions, admin auth, hostile input."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prime_rl.api.assignment import sampling_seeds, task_ids
from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import RolloutBatch


def test_lease_is_the_documented_pure_function(client: OrchestratorClient, server: Any, batch_for: Any) -> None:
    reg = client.register("honest")
    lease = client.get_tasks(reg.worker_id)
    assert lease.step == 0 and lease.batch_index == 0 and lease.reassigned_from is None
    key = server.trusted.assignment_key  # the run's secret key: only trusted processes hold it
    expected = task_ids(key=key, worker_id=reg.worker_id, step=0, batch_index=0, num_tasks=50, prompts_per_batch=2)
    assert [t.task_id for t in lease.tasks] == list(expected)
    for task in lease.tasks:
        assert task.prompt == server.ledger.tasks.prompt(task.task_id)
        assert tuple(task.sampling_seeds) == sampling_seeds(
            key=key, worker_id=reg.worker_id, step=0, batch_index=0, task_id=task.task_id, group_size=2
        )
    # Asking for the same live lease again is idempotent; once answered, the next one has the next index.
    assert client.get_tasks(reg.worker_id, batch_index=0) == lease
    client.submit_rollouts(batch_for(lease))
    assert client.get_tasks(reg.worker_id).batch_index == 1
    with pytest.raises(ClientRequestError) as error:
        client.get_tasks(reg.worker_id, step=5)
    assert error.value.status == 409


def test_submit_is_idempotent_and_conflicting_resubmission_is_refused(
    client: OrchestratorClient, batch_for: Any
) -> None:
    reg = client.register()
    lease = client.get_tasks(reg.worker_id)
    batch = batch_for(lease)
    first = client.submit_rollouts(batch)
    assert first.batch_id == f"{reg.worker_id}-s0-b0" and not first.duplicate and first.num_samples == 4
    assert client.submit_rollouts(batch).duplicate
    changed = batch.model_copy(update={"policy_version": 1})
    with pytest.raises(ClientRequestError) as error:
        client.submit_rollouts(changed)
    assert error.value.status == 409
    pending = client.pending()
    assert pending.pending_batches == 1
    stored = pending.batches[0]
    assert stored.samples == list(batch.samples)  # exactly what was submitted, floats and proofs included
    assert stored.lease is not None and stored.lease.task_ids == [t.task_id for t in lease.tasks]


def test_worker_learns_why_its_samples_were_rejected(client: OrchestratorClient, server: Any, batch_for: Any) -> None:
    """The validator's verdict (reason and detail) reaches the worker's API and the metrics unchanged."""
    from prime_rl.api.protocol import Verdict, VerdictRequest

    reg = client.register("w")
    answer = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id)))
    before = client.batch_verdicts(reg.worker_id, answer.batch_id)
    assert before.batch_id == answer.batch_id and not before.judged and before.verdicts == []
    verdicts = [
        Verdict(sample_index=i, accepted=False, reason="sampling_mismatch", detail=f"token {i}: margin 0.31 > 0.25",
                reward=0.0, advantage=0.0)
        for i in range(answer.num_samples)
    ]  # fmt: skip
    client.post_verdicts(VerdictRequest(batch_id=answer.batch_id, verdicts=verdicts))
    after = client.batch_verdicts(reg.worker_id, answer.batch_id)
    assert after.judged and after.verdicts == verdicts
    # Another worker cannot read it, and cannot probe which batch ids exist.
    other = OrchestratorClient(server.url, retries=0)
    other_id = other.register("other").worker_id
    with pytest.raises(ClientRequestError) as error:
        other.batch_verdicts(other_id, answer.batch_id)
    assert error.value.status == 404
    with pytest.raises(ClientRequestError) as error:
        client.batch_verdicts(reg.worker_id, "no-such-batch")
    assert error.value.status == 404


def test_configured_admin_token_protects_trusted_endpoints(server_factory: Any) -> None:
    server = server_factory("--orchestrator.admin_token", "s3cret-s3cret-s3cret")
    assert server.admin_token == "s3cret-s3cret-s3cret"
    for token in ("", "s3cret", "s3cret-s3cret-s3creT"):
        with OrchestratorClient(server.url, retries=0, admin_token=token) as anonymous:
            with pytest.raises(ClientRequestError) as error:
                anonymous.claim(0, 1)
            assert error.value.status == 401
    with OrchestratorClient(server.url, retries=0, admin_token="s3cret-s3cret-s3cret") as admin:
        assert not admin.claim(0, 1).ready


def test_expired_lease_is_reassigned_to_another_worker(server_factory: Any, batch_for: Any) -> None:
    server = server_factory("--orchestrator.task_timeout_s", "0.3")
    dead = OrchestratorClient(server.url, retries=0)
    live = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    dead_reg = dead.register("dies")
    abandoned = dead.get_tasks(dead_reg.worker_id)
    live_reg = live.register("lives")
    time.sleep(0.8)  # let the lease deadline pass (the expiry loop ticks every 75 ms here)
    lease = live.get_tasks(live_reg.worker_id)
    assert lease.reassigned_from is not None
    assert lease.reassigned_from.worker_id == dead_reg.worker_id
    assert [t.task_id for t in lease.tasks] == [t.task_id for t in abandoned.tasks]
    stored = live.submit_rollouts(batch_for(lease))
    record = live.pending().batches[0].lease
    assert record is not None and record.source_worker_id == dead_reg.worker_id
    assert stored.batch_id.startswith(live_reg.worker_id)
    # The next lease is a fresh assignment again.
    assert live.get_tasks(live_reg.worker_id).reassigned_from is None
    stats = {w.worker_id: w for w in live.workers().workers}
    assert stats[dead_reg.worker_id].leases_expired == 1


def test_oversized_and_structurally_invalid_batches_get_4xx(server_factory: Any, batch_for: Any) -> None:
    server = server_factory(
        "--orchestrator.max_request_bytes", "4096", "--orchestrator.max_samples_per_batch", "3"
    )
    client = OrchestratorClient(server.url, retries=0)
    reg = client.register()
    lease = client.get_tasks(reg.worker_id)
    batch = batch_for(lease)
    with pytest.raises(ClientRequestError) as error:
        client.submit_rollouts(batch)  # 4 samples > 3
    assert error.value.status == 413
    big = batch.model_copy(
        update={"samples": [batch.samples[0].model_copy(update={"prompt_tokens": [1] * 3000})]}
    )
    with pytest.raises(ClientRequestError) as error:
        client.submit_rollouts(big)
    assert error.value.status == 413
    headers = {"Authorization": f"Bearer {client.worker_token}", "Content-Type": "application/json"}
    payload = json.loads(batch.model_dump_json())
    payload["samples"] = payload["samples"][:1]
    for mutate, code in [
        (lambda p: p["samples"][0].update(proofs="not base64!"), 400),
        (lambda p: p["samples"][0].update(inference_logprobs=[0.0]), 400),
        (lambda p: p["samples"][0].update(group_index=7), 400),
        (lambda p: p["samples"][0].update(task_id="3"), 400),
        (lambda p: p.update(step=True), 400),
        (lambda p: p.update(extra=1), 400),
    ]:
        body = json.loads(json.dumps(payload))
        mutate(body)
        answer = requests.post(server.url + "/rollouts", data=json.dumps(body), headers=headers, timeout=10)
        assert answer.status_code == code, answer.text
        assert set(answer.json()) == {"error", "message"}
    nan = json.dumps(payload, separators=(",", ":")).replace('"reward":1.0', '"reward":NaN')
    assert '"reward":NaN' in nan
    assert requests.post(server.url + "/rollouts", data=nan, headers=headers, timeout=10).status_code == 400
    stats = client.workers().workers[0]
    assert stats.malformed_requests >= 8 and stats.batches_submitted == 0


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
_POSTS = [
    "/rollouts",
    "/workers/register",
    "/workers/ban",
    "/validator/verdicts",
    "/trainer/claim",
    "/trainer/commit",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(_POSTS), body=_json_values | st.binary(max_size=200).map(lambda b: b"RAW" + b))
def test_garbage_never_crashes_the_server(server: Any, path: str, body: Any) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = requests.post(server.url + path, data=data, timeout=10)
    if path == "/workers/register" and answer.status_code == 200:
        return  # {} or {"name": "..."} is a valid registration
    assert 400 <= answer.status_code < 500, answer.text
    assert set(answer.json()) == {"error", "message"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.dictionaries(
        st.sampled_from(["worker_id", "step", "batch_index", "limit"]), st.text(max_size=30)
    )
)
@example(query={"worker_id": "0", "step": "\u00b2"})  # '²'.isdigit() is True, int('²') raises
@example(query={"limit": "\u0663"})  # an Arabic-Indic digit: isdigit() True, but not ASCII
def test_garbage_queries_never_crash_the_server(server: Any, query: dict[str, str]) -> None:
    for path in ("/tasks", "/validator/pending", "/rollouts/verdicts", "/status", "/nope"):
        answer = requests.get(server.url + path, params=query, timeout=10)
        assert answer.status_code < 500, answer.text
    assert requests.get(server.url + "/health", timeout=10).json() == {"ok": True}


def test_unleased_batch_is_stored_without_lease(client: OrchestratorClient, batch_for: Any) -> None:
    reg = client.register()
    lease = client.get_tasks(reg.worker_id)
    forged = batch_for(lease).model_copy(update={"batch_index": 2})
    client.submit_rollouts(forged)
    assert client.pending().batches[0].lease is None  # the validator rejects it as not assigned
    far = batch_for(lease).model_copy(update={"batch_index": 50})
    with pytest.raises(ClientRequestError) as error:
        client.submit_rollouts(far)
    assert error.value.status == 409
    assert isinstance(forged, RolloutBatch)


def test_a_restarted_worker_gets_its_open_lease_back(server: Any, batch_for: Any) -> None:
    """A worker that died holding a lease and came back under its saved identity asks with
    ``resume``: it gets that lease again (same index, tasks and seeds), so the lease is answered
    instead of expiring against it as abandoned; once it is answered, ``resume`` leases anew.
    (Before ``resume`` existed a new identity, allowed one open lease, got 409 here.)"""
    with OrchestratorClient(server.url, timeout_s=10, retries=0) as before:
        worker_id = before.register("restarts").worker_id
        held = before.get_tasks(worker_id)
        token = before.worker_token
    with OrchestratorClient(server.url, timeout_s=10, retries=0, worker_token=token) as after:
        again = after.get_tasks(worker_id, resume=True)
        assert again.model_dump() == held.model_dump()
        after.submit_rollouts(batch_for(again))
        assert after.get_tasks(worker_id, resume=True).batch_index == held.batch_index + 1
