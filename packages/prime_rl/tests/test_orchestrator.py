"""The orchestrator over real HTTP: assignment, durability, accounting, claims, hostile input."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_rl.assignment import sampling_seeds, task_ids
from prime_rl.client import ClientRequestError, OrchestratorClient
from prime_rl.protocol import RolloutBatch, Verdict, VerdictRequest


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
        )
        for i in range(n)
    ]
    client.post_verdicts(VerdictRequest(batch_id=batch_id, verdicts=verdicts))


def test_lease_is_the_documented_pure_function(client: OrchestratorClient, server: Any) -> None:
    reg = client.register("honest")
    lease = client.get_tasks(reg.worker_id)
    assert lease.step == 0 and lease.batch_index == 0 and lease.reassigned_from is None
    expected = task_ids(
        run_seed=0, worker_id=reg.worker_id, step=0, batch_index=0, num_tasks=50, prompts_per_batch=2
    )
    assert [t.task_id for t in lease.tasks] == list(expected)
    for task in lease.tasks:
        assert task.prompt == server.ledger.tasks.prompt(task.task_id)
        assert tuple(task.sampling_seeds) == sampling_seeds(
            run_seed=0, worker_id=reg.worker_id, step=0, batch_index=0, task_id=task.task_id, group_size=2
        )
    # Asking for the same live lease again is idempotent; the next one has the next index.
    assert client.get_tasks(reg.worker_id, batch_index=0) == lease
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


def test_admin_token_protects_trusted_endpoints(server_factory: Any) -> None:
    server = server_factory("--orchestrator.admin_token", "s3cret")
    with OrchestratorClient(server.url, retries=0) as anonymous:
        with pytest.raises(ClientRequestError) as error:
            anonymous.claim(0, 1)
        assert error.value.status == 401
    with OrchestratorClient(server.url, retries=0, admin_token="s3cret") as admin:
        assert not admin.claim(0, 1).ready


def test_claims_are_exactly_once_versioned_and_survive_restart(
    server_factory: Any, batch_for: Any, tmp_path: Any
) -> None:
    server = server_factory()
    client = OrchestratorClient(server.url, retries=0)
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
    client = OrchestratorClient(restarted.url, retries=0, worker_token=client.worker_token)
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


def test_expired_lease_is_reassigned_to_another_worker(server_factory: Any, batch_for: Any) -> None:
    server = server_factory("--orchestrator.task_timeout_s", "0.3")
    dead = OrchestratorClient(server.url, retries=0)
    live = OrchestratorClient(server.url, retries=0)
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
def test_garbage_queries_never_crash_the_server(server: Any, query: dict[str, str]) -> None:
    for path in ("/tasks", "/validator/pending", "/status", "/nope"):
        answer = requests.get(server.url + path, params=query, timeout=10)
        assert answer.status_code < 500, answer.text
    assert requests.get(server.url + "/health", timeout=10).json() == {"ok": True}


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


# ---------------------------------------------------------------- the ledger as a state machine

from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

from prime_rl.ledger import ApiFailure, Ledger  # noqa: E402
from prime_rl.protocol import ClaimRequest, CommitRequest  # noqa: E402
from prime_rl.store import RolloutStore  # noqa: E402


class LedgerMachine(RuleBasedStateMachine):
    """Random interleavings of every ledger operation, with crashes (rebuild from disk) in between.

    Invariants: a sample is claimed for at most one step; claimed samples are accepted and no
    older than async_level; a rebuilt ledger answers exactly like the one that crashed.
    """

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        from prime_rl.config import load_config
        from prime_rl.tasks import TaskSet

        self.tmp = tempfile.TemporaryDirectory()
        self.config = load_config(
            None,
            [
                "--run_dir", self.tmp.name,
                "--orchestrator.prompts_per_batch", "2",
                "--orchestrator.async_level", "1",
                "--orchestrator.task_timeout_s", "30",
                "--sampling.group_size", "2",
            ],
        )  # fmt: skip
        self.tasks = TaskSet([{"prompt": f"q{i}"} for i in range(6)])
        self.now = 1000.0
        self.ledger = self._open()
        self.workers: list[Any] = []
        self.leases: list[Any] = []

    def _open(self) -> Ledger:
        return Ledger(self.config, self.tasks, RolloutStore(self.tmp.name + "/orch"), clock=lambda: self.now)

    def teardown(self) -> None:
        self.tmp.cleanup()

    @rule()
    def register(self) -> None:
        reg = self.ledger.register("w")
        self.workers.append(self.ledger.workers[reg.worker_id])

    @precondition(lambda self: self.workers)
    @rule(data=st.data())
    def lease(self, data: Any) -> None:
        worker = data.draw(st.sampled_from(self.workers))
        worker = self.ledger.workers[worker.worker_id]
        try:
            self.leases.append(self.ledger.lease(worker, None, None))
        except ApiFailure as failure:
            assert failure.status == 409

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), version_back=st.integers(0, 2))
    def submit(self, data: Any, version_back: int) -> None:
        import base64

        from prime_rl.protocol import RolloutSample

        lease = data.draw(st.sampled_from(self.leases))
        version = max(0, self.ledger.step - version_back)
        worker = self.ledger.workers[lease.worker_id]
        samples = [
            RolloutSample(
                task_id=task.task_id, group_index=g, prompt_tokens=[1], completion_tokens=[2], sampling_seed=seed,
                temperature=1.0, reward=0.0, advantage=0.0, proofs=base64.b64encode(b"p").decode(),
                inference_logprobs=[-1.0],
            )
            for task in lease.tasks
            for g, seed in enumerate(task.sampling_seeds)
        ]  # fmt: skip
        batch = RolloutBatch(
            worker_id=lease.worker_id, step=lease.step, batch_index=lease.batch_index, policy_version=version,
            samples=samples,
        )  # fmt: skip
        try:
            self.ledger.submit(worker, batch)
        except ApiFailure as failure:
            assert failure.status == 409  # the same lease answered with another version

    @rule(data=st.data())
    def verdicts(self, data: Any) -> None:
        from prime_rl.protocol import Verdict, VerdictRequest

        waiting = [b for b in self.ledger.batches.values() if b.verdicts is None]
        if not waiting:
            return
        batch = data.draw(st.sampled_from(waiting))
        flags = data.draw(st.lists(st.booleans(), min_size=len(batch.task_ids), max_size=len(batch.task_ids)))
        advs = data.draw(
            st.lists(st.sampled_from([0.0, 1.0, -1.0]), min_size=len(flags), max_size=len(flags))
        )
        verdicts = [
            Verdict(sample_index=i, accepted=ok, reason="ok" if ok else "bad", reward=0.0, advantage=a)
            for i, (ok, a) in enumerate(zip(flags, advs, strict=True))
        ]
        self.ledger.record_verdicts(VerdictRequest(batch_id=batch.batch_id, verdicts=verdicts))

    @rule(n=st.integers(1, 12), filter_zero=st.booleans(), back=st.integers(0, 1))
    def claim_and_commit(self, n: int, filter_zero: bool, back: int) -> None:
        step = max(0, self.ledger.step - back)
        try:
            answer = self.ledger.claim(
                ClaimRequest(step=step, min_samples=n, filter_zero_advantage=filter_zero)
            )
        except ApiFailure as failure:
            assert failure.status == 409
            return
        if answer.ready and step == self.ledger.step:
            self.ledger.commit(CommitRequest(step=step, policy_version=step + 1))

    @rule(seconds=st.floats(0, 100))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.ledger.expire_leases()

    @rule()
    def crash_and_restart(self) -> None:
        before = (
            self.ledger.status().model_dump(exclude={"time"}),
            self.ledger.workers_view(),
            dict(self.ledger.claims),
        )
        self.ledger = self._open()
        after = (
            self.ledger.status().model_dump(exclude={"time"}),
            self.ledger.workers_view(),
            dict(self.ledger.claims),
        )
        assert before == after

    @invariant()
    def claims_are_exactly_once_accepted_and_fresh(self) -> None:
        seen: set[str] = set()
        for step, sample_ids in self.ledger.claims.items():
            for sample_id in sample_ids:
                assert sample_id not in seen
                seen.add(sample_id)
                batch_id, index = sample_id.rsplit("/", 1)
                batch = self.ledger.batches[batch_id]
                assert batch.verdicts is not None and batch.verdicts[int(index)].accepted
                assert batch.policy_version >= step - self.config.orchestrator.async_level
        assert all(step in self.ledger.claims for step in range(self.ledger.step))


LedgerMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=25, deadline=None)
test_ledger_state_machine = LedgerMachine.TestCase


def test_select_claim_oracle() -> None:
    """Hand-built batches: b0 stale (v0), b1 pending, b2 one informative + one all-zero group, b3 informative."""
    from dataclasses import dataclass, field

    from prime_rl.claims import select_claim
    from prime_rl.store import StoredVerdict

    @dataclass
    class B:
        batch_id: str
        seq: int
        policy_version: int
        task_ids: tuple[int, ...]
        verdicts: list[StoredVerdict] | None
        claimed: set[int] = field(default_factory=set)

    def v(i: int, ok: bool, adv: float) -> StoredVerdict:
        return StoredVerdict(i, ok, "ok" if ok else "bad", 0.0, adv)

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
    assert picked.sample_ids == ("b2/0", "b2/2", "b3/0", "b3/1")  # whole groups, oldest batch first
    assert (picked.available, picked.pending_batches, picked.pending_samples) == (4, 1, 3)
    assert (picked.stale, picked.zero_advantage) == (2, 2)
    # Without the zero-advantage filter the all-zero group counts and comes before b3.
    unfiltered = select_claim(batches, min_policy_version=1, min_samples=3, filter_zero_advantage=False)
    assert unfiltered.sample_ids == ("b2/0", "b2/2", "b2/3", "b2/4")
    # Not enough: nothing is taken.
    short = select_claim(batches, min_policy_version=1, min_samples=5, filter_zero_advantage=True)
    assert short.sample_ids == () and not short.ready and short.available == 4
    # Already claimed samples are never offered again.
    batches[0].claimed = {0, 1}
    again = select_claim(batches, min_policy_version=1, min_samples=1, filter_zero_advantage=True)
    assert again.sample_ids == ("b2/0", "b2/2")


def test_backpressure_refuses_leases_while_enough_is_buffered(server_factory: Any, batch_for: Any) -> None:
    from prime_rl.client import OrchestratorBusy

    server = server_factory("--orchestrator.max_buffered_samples", "6", "--trainer.samples_per_step", "2")
    client = OrchestratorClient(server.url, retries=0)
    reg = client.register()
    first = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id)))  # 4 awaiting validation
    second = client.submit_rollouts(batch_for(client.get_tasks(reg.worker_id)))  # 8 buffered
    with pytest.raises(OrchestratorBusy):
        client.get_tasks(reg.worker_id)
    answer = requests.get(
        server.url + "/tasks",
        params={"worker_id": reg.worker_id},
        headers={"Authorization": f"Bearer {client.worker_token}"},
        timeout=10,
    )
    assert (
        answer.status_code == 429
        and answer.json()["error"] == "busy"
        and answer.headers["Retry-After"] == "1"
    )
    # Accepted samples the trainer would never claim (all-zero advantages, filtered) free their room:
    # counting them would deadlock (nothing claimable, no new leases).
    _verdict_all(client, first.batch_id, 4, adv=[0.0] * 4)
    lease = client.get_tasks(reg.worker_id)
    with pytest.raises(OrchestratorBusy):  # 4 awaiting validation + 4 in the open lease
        client.get_tasks(reg.worker_id)
    # Informative accepted samples do count until the trainer claims them.
    _verdict_all(client, second.batch_id, 4)
    client.submit_rollouts(batch_for(lease))
    with pytest.raises(OrchestratorBusy):
        client.get_tasks(reg.worker_id)
    assert len(client.claim(0, 4).samples) == 4  # both informative groups consumed: 4 pending remain
    assert client.get_tasks(reg.worker_id).batch_index == 3


def test_backpressure_limit_below_one_step_is_refused(config_for: Any) -> None:
    from prime_rl.ledger import Ledger
    from prime_rl.store import RolloutStore

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
