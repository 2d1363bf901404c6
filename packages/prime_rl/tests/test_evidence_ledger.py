"""One evidence ledger per run (issue 45 item 2): K validators judge an identity as one would.

A steering worker's batches are judged on the tiny model (real prefills, real observations); their
evidence increments are posted over HTTP to a real orchestrator by one validator, or alternately by
two (with an orchestrator restart in between). The run's ledger bans the identity at the same batch,
with the same reason, as ``toploc``'s ledger fed the same batches in one validator process, and its
stored state is toploc's number for number. Failure counts add up the same way.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from steering import steering_sampler
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

import prime_rl.inference.backend as backend_module
import toploc
from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import PendingBatch, Verdict, VerdictRequest
from prime_rl.inference.backend import HFBackend, SamplingParams
from prime_rl.orchestrator.evidence_ledger import EvidenceTests
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import TaskSet
from prime_rl.validator import noise
from prime_rl.validator.evidence import EvidenceLedger, batch_evidence, evidence_spec
from prime_rl.validator.verdicts import validate_batch

KEY = b"evidence-ledger-test-key"
GROUP, PER_BATCH, MAX_NEW, BATCHES = 4, 2, 12, 12
TOKENIZER = make_tiny_tokenizer()
RUN = TinyRun(KEY, TOKENIZER, lambda t: f"{t}*{t + 7}=", 40, GROUP, PER_BATCH, MAX_NEW)


@pytest.fixture(scope="module")
def steered() -> tuple[toploc.EvidenceTests, list[list[toploc.Observations]]]:
    """The evidence tests of the tiny model's honest noise, and the observations of BATCHES batches of a
    worker steering inside the per-sample tolerance (each passes every per-sample check)."""
    backend = HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)
    prompts = [TOKENIZER(f"{i}-{i * 5}=")["input_ids"] for i in range(400)]
    tests = toploc.EvidenceTests.from_profile(
        toploc.NoiseProfile.calibrate(noise.measure(backend, prompts, SamplingParams(1.0, MAX_NEW), tokens=1024))
    )
    def judged(steering: bool) -> list[list[toploc.Observations]]:
        patch = pytest.MonkeyPatch()
        if steering:
            patch.setattr(backend_module, "sample_next", steering_sampler(0.2))
        worker, batches = RUN.worker("honest"), []
        try:
            for b in range(BATCHES):
                task_lease, record = RUN.lease("w", 0, b)
                batch = worker.answer(task_lease, backend)
                observed: list[toploc.Observations] = []
                pending = PendingBatch(batch_id=f"s-{b}", worker_id="w", step=0, batch_index=b, policy_version=0,
                                       received_at=time.time(), lease=record, samples=batch.samples)  # fmt: skip
                verdicts = validate_batch(pending, tasks=RUN, backend_for=lambda v: backend, decode=RUN.decode,
                                          checks=RUN.checks(), observe=lambda i, o, sink=observed: sink.append(o))  # fmt: skip
                assert all(v.accepted for v in verdicts)  # no sample alone looks wrong
                batches.append(observed)
        finally:
            patch.undo()
        return batches

    # A worker steering k samples of each batch, the others honest: the smallest k that gets it banned
    # after a few batches (not at once), so the ban point is a real test of the sums.
    honest, steered = judged(False), judged(True)
    for k in range(1, GROUP * PER_BATCH + 1):
        batches = [[*steered[b][:k], *honest[b][k:]] for b in range(BATCHES)]
        reference = EvidenceLedger(tests)
        states = [reference.record("w", f"b{i}", batch) for i, batch in enumerate(batches)]
        if any(state is not None and state.banned for state in states[1:-1]) and not states[0].banned:  # type: ignore[union-attr]
            break
    return tests, batches


def _server(config_for: Any) -> OrchestratorServer:
    config = config_for("--sampling.group_size", "4", "--orchestrator.task_timeout_s", "1000")
    tasks = TaskSet([{"prompt": f"q{i} =", "task_type": "arithmetic"} for i in range(50)], "{prompt}")
    return OrchestratorServer(config, tasks).start()


def _client(server: OrchestratorServer) -> OrchestratorClient:
    return OrchestratorClient(server.url, timeout_s=30, retries=1, backoff_s=0.05, admin_token=server.admin_token)


def _accept(batch: PendingBatch, validator_id: str, **fields: Any) -> VerdictRequest:
    verdicts = [
        Verdict(sample_index=i, accepted=True, reason="ok", reward=float(s.group_index == 0), advantage=s.advantage,
                logprobs=[-0.5] * len(s.completion_tokens))
        for i, s in enumerate(batch.samples)
    ]  # fmt: skip
    return VerdictRequest(batch_id=batch.batch_id, verdicts=verdicts, validator_id=validator_id, **fields)


def _judge_through(config_for: Any, batch_for: Any, validators: list[str], judge: Any, restart_at: int | None = None) -> list[Any]:
    """Submit BATCHES batches of one worker; the validators take one batch each in turn and post
    ``judge(index, batch, validator_id)``; returns the answers (None once the worker is banned)."""
    server = _server(config_for)
    answers: list[Any] = []
    try:
        with _client(server) as worker:
            worker_id = worker.register("steer").worker_id
            for index in range(BATCHES):
                if restart_at == index:
                    server.stop()
                    server = _server(config_for)  # same run dir: the ledger is read back from the store
                    token, worker = worker.worker_token, _client(server)
                    worker.worker_token = token
                try:
                    lease = worker.get_tasks(worker_id)
                except ClientRequestError as error:
                    assert error.status == 403, error  # banned: no more leases
                    answers.append(None)
                    continue
                worker.submit_rollouts(batch_for(lease))
                name = validators[index % len(validators)]
                with _client(server) as validator:
                    (batch,) = validator.take_batches(name, limit=1).batches
                    answers.append(validator.post_verdicts(judge(index, batch, name)))
        rows = dict(server.store.evidence_rows())
        return [answers, rows, server.ledger.workers[worker_id]]
    finally:
        server.stop()


def test_evidence_from_different_validators_adds_up_and_bans_where_one_validator_would(
    steered: Any, config_for: Any, batch_for: Any
) -> None:
    tests, observed = steered
    reference = EvidenceLedger(tests)  # one validator, as before issue 45
    fractions, ban_at = [], None
    for index, batch in enumerate(observed):
        state = reference.record("steer", f"b{index}", batch)
        assert state is not None
        fractions.append(reference.fraction("steer"))
        if ban_at is None and state.banned:
            ban_at = index
    assert ban_at is not None and 0 < ban_at < BATCHES - 1  # banned after some batches, not at once

    def judge(index: int, batch: PendingBatch, name: str) -> VerdictRequest:
        return _accept(batch, name, prefilled=True, evidence=batch_evidence(tests, observed[index]))

    one = _judge_through(config_for, batch_for, ["solo"], judge)
    two = _judge_through(config_for, batch_for, ["v1", "v2"], judge, restart_at=ban_at // 2 + 1)
    for answers, _rows, worker in (one, two):
        posted = [a for a in answers if a is not None]
        assert len(posted) == ban_at + 1  # banned with the batch that crossed: no lease after it
        assert [a.ban_reason for a in posted] == [""] * ban_at + [reference.ban_reasons["steer"]]
        assert [a.worker_evidence for a in posted] == pytest.approx(fractions[: ban_at + 1], rel=0, abs=0)
        assert posted[-1].accepted == 0  # the crossing batch trains nothing (banned_worker)
        assert worker.banned and worker.ban_reason == reference.ban_reasons["steer"]
    # The stored state is what one toploc ledger holds after the same batches, number for number.
    reference_until_ban = EvidenceLedger(tests)
    for index in range(ban_at + 1):
        reference_until_ban.record("steer", f"b{index}", observed[index])
    snapshot = reference_until_ban.workers["steer"].snapshot()
    for _, rows, worker in (one, two):
        import json

        stored = json.loads(rows[worker.worker_id])
        assert stored["evidence"] == snapshot and stored["evidence_ban"] == reference.ban_reasons["steer"]
    assert EvidenceTests(evidence_spec(tests)).fingerprint == tests.fingerprint


def test_failure_counts_from_different_validators_add_up_to_the_same_ban(config_for: Any, batch_for: Any) -> None:
    """A worker with a record (3 accepted batches of 8 samples) then fails every batch: the run's counts
    reach the 50% ban at the same batch whichever validators judged which batch, across a restart."""

    def judge(index: int, batch: PendingBatch, name: str) -> VerdictRequest:
        request = _accept(batch, name, prefilled=True)
        if index >= 3:
            bad = [v.model_copy(update={"accepted": False, "reason": "toploc_mismatch", "logprobs": []}) for v in request.verdicts]
            request = request.model_copy(update={"verdicts": bad})
        return request

    one = _judge_through(config_for, batch_for, ["solo"], judge)
    two = _judge_through(config_for, batch_for, ["a", "b", "c"], judge, restart_at=3)
    bans = [[i for i, a in enumerate(answers) if a is not None and a.ban_reason][:1] for answers, _, _ in (one, two)]
    assert bans[0] == bans[1] == [5]  # 24 accepted, then 24 rejected after batch 5: 50%
    assert one[2].ban_reason == two[2].ban_reason == "24/48 samples rejected (threshold 50%)"


def test_a_retried_verdict_is_idempotent_before_and_after_the_workers_evidence_ban(
    steered: Any, config_for: Any, batch_for: Any
) -> None:
    """Verdicts stored before the ban (accepted) and the one the ban rejected (banned_worker) both
    answer an identical retry with 200, and count nothing twice."""
    tests, observed = steered
    server = _server(config_for)
    try:
        with _client(server) as worker, _client(server) as validator:
            worker_id = worker.register("steer").worker_id
            posted: list[VerdictRequest] = []
            for index in range(BATCHES):
                try:
                    worker.submit_rollouts(batch_for(worker.get_tasks(worker_id)))
                except ClientRequestError:
                    break  # banned
                (batch,) = validator.take_batches("v", limit=1).batches
                request = _accept(batch, "v", prefilled=True, evidence=batch_evidence(tests, observed[index]))
                posted.append(request)
                validator.post_verdicts(request)
            rows = dict(server.store.evidence_rows())
            for request in posted:  # every retry: identical verdicts, 200, the ledger unchanged
                validator.post_verdicts(request)
            assert dict(server.store.evidence_rows()) == rows
            assert server.ledger.workers[worker_id].banned
    finally:
        server.stop()


def test_rows_written_under_per_token_tests_go_on_under_per_sample_tests() -> None:
    """A run's ledger written before the evidence counted samples (per-token tests) loads, and its
    identities go on under per-sample tests as ``toploc.WorkerEvidence.restore`` would: per-token
    counts do not carry over (another statistic), recent scores restart, a ban stands."""
    import json

    import numpy as np

    from prime_rl.orchestrator.evidence_ledger import RunEvidence

    rng = np.random.default_rng(3)

    def sample(steer: float = 0.0) -> toploc.Observations:
        margins = np.where(rng.random(64) < 0.05 + steer, rng.uniform(0.0, 0.2, 64), 0.0)
        return toploc.Observations(margins, np.zeros(64))

    profile = toploc.NoiseProfile.calibrate([sample() for _ in range(400)])
    token_tests = toploc.EvidenceTests.from_profile(profile, toploc.EvidencePolicy(unit="token"))
    sample_tests = toploc.EvidenceTests.from_profile(profile)
    old, banned = toploc.WorkerEvidence(token_tests), toploc.WorkerEvidence(token_tests)
    for _ in range(5):
        old.update(sample())
    while not banned.update(sample(steer=0.5)).banned:
        pass
    rows = [
        ("old", json.dumps({"accepted": 5, "rejected": 0, "evidence": old.snapshot()})),
        ("banned", json.dumps({"accepted": 9, "rejected": 0, "evidence": banned.snapshot(), "evidence_ban": "evidence ..."})),
    ]
    ledger = RunEvidence(ban_failure_rate=0.5, ban_min_samples=8, rows=rows)
    batch = [sample(), sample()]
    verdicts = [Verdict(sample_index=i, accepted=True, reason="ok", reward=0.0, advantage=0.0, logprobs=[0.0] * 64) for i in range(2)]
    for worker, snapshot in (("old", old.snapshot()), ("banned", banned.snapshot())):
        judgement = ledger.judge(worker, verdicts, prefilled=True, evidence=batch_evidence(sample_tests, batch))
        ledger.commit(judgement)
        reference = toploc.WorkerEvidence.restore(sample_tests, snapshot)
        for observations in batch:
            reference.update(observations)
        assert judgement.row.evidence == reference.snapshot()
        assert {name for name, *_ in judgement.row.evidence["counts"]} <= set(sample_tests.statistics)
    assert all(v.accepted for v in ledger.as_recorded("old", verdicts))
    assert not any(v.accepted for v in ledger.as_recorded("banned", verdicts))  # the ban stands


def test_the_validator_counts_samples_once_its_profile_measured_enough_of_them(caplog: Any) -> None:
    """Per-sample evidence needs samples: a profile of 64 samples bounds no event below one sample in
    five, so the validator keeps the per-token tests there and says what to measure."""
    import numpy as np

    from prime_rl.validator.evidence import MIN_CALIBRATION_SAMPLES, evidence_tests

    def profile(samples: int) -> toploc.NoiseProfile:
        rng = np.random.default_rng(samples)
        return toploc.NoiseProfile.calibrate([toploc.Observations(rng.exponential(1e-3, 32), np.zeros(32)) for _ in range(samples)])

    assert evidence_tests(profile(MIN_CALIBRATION_SAMPLES), toploc.EvidencePolicy()).per_sample
    with caplog.at_level("WARNING"):
        small = evidence_tests(profile(64), toploc.EvidencePolicy())
    assert not small.per_sample and "counts tokens, not samples" in caplog.text
