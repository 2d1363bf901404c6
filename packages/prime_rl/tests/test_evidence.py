"""Per-worker evidence in the validator: honest workers are never banned, steering inside the
per-sample tolerance is, and the process bans through the orchestrator (tiny model, CPU)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import torch
from steering import steering_sampler
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun, submit_honest_and_steered, validator_at_orchestrator

import prime_rl.inference.backend as backend_module
import toploc
from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import PendingBatch, Verdict
from prime_rl.inference.backend import SAMPLER_SEED, HFBackend, SamplingParams
from prime_rl.validator import noise, process
from prime_rl.validator.checks import sampling_margins, sampling_problem
from prime_rl.validator.evidence import EvidenceLedger, reject_banned
from prime_rl.validator.verdicts import validate_batch

KEY = b"evidence-test-assignment-key"
NUM_TASKS = 40
GROUP = 4
PER_BATCH = 2
MAX_NEW = 12
TOKENIZER = make_tiny_tokenizer()
RUN = TinyRun(KEY, TOKENIZER, lambda t: f"{t}*{t + 7}=", NUM_TASKS, GROUP, PER_BATCH, MAX_NEW)
CHECKS = RUN.checks()
STEER_WITHIN = 0.2
"""The steering worker takes the runner-up only when it is this close: inside the 0.25 tolerance."""


class Recorder:
    """Stands in for the process's metrics writer."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def log(self, event: str, **fields: object) -> None:
        self.lines.append((event, fields))


@pytest.fixture(scope="module")
def backend() -> HFBackend:
    return HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)


@pytest.fixture(scope="module")
def tests(backend: HFBackend) -> toploc.EvidenceTests:
    """Honest noise of this backend measured on 1,024 tokens of other prompts (the validator's way)."""
    prompts = [TOKENIZER(f"{i}-{i * 5}=")["input_ids"] for i in range(400)]
    observations = noise.measure(backend, prompts, SamplingParams(1.0, MAX_NEW), tokens=1024)
    return toploc.EvidenceTests.from_profile(toploc.NoiseProfile.calibrate(observations))


steer = steering_sampler(STEER_WITHIN)
"""``sample_next`` of a steering worker: the runner-up wherever it scores within STEER_WITHIN."""


@pytest.fixture
def steering(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(backend_module, "sample_next", steer)
    yield


def judge_batches(
    backend: HFBackend, tests: toploc.EvidenceTests, worker_id: str, batches: int
) -> tuple[list[list[Verdict]], list[toploc.EvidenceState], list[toploc.Observations]]:
    """Answer ``batches`` leases as an honest worker (steering if patched) and judge them."""
    ledger = EvidenceLedger(tests)
    worker = RUN.worker("honest")
    verdicts, states, everything = [], [], []
    for b in range(batches):
        task_lease, record = RUN.lease(worker_id, 0, b)
        batch = worker.answer(task_lease, backend)
        observed: list[toploc.Observations] = []
        verdicts.append(
            validate_batch(
                PendingBatch(batch_id=f"{worker_id}-{b}", worker_id=worker_id, step=0, batch_index=b,
                             policy_version=0, received_at=time.time(), lease=record, samples=batch.samples),
                tasks=RUN,
                backend_for=lambda v: backend,
                decode=RUN.decode,
                checks=CHECKS,
                observe=lambda index, observations, sink=observed: sink.append(observations),
            )
        )
        state = ledger.record(worker_id, f"{worker_id}-{b}", observed)
        assert state is not None and ledger.record(worker_id, f"{worker_id}-{b}", observed) is None  # once
        states.append(state)
        everything.extend(observed)
    return verdicts, states, everything


def test_honest_worker_is_never_banned(backend: HFBackend, tests: toploc.EvidenceTests) -> None:
    verdicts, states, observed = judge_batches(backend, tests, "honest-w", 12)
    assert [v.reason for batch in verdicts for v in batch] == ["ok"] * (12 * PER_BATCH * GROUP)
    assert len(observed) == 12 * PER_BATCH * GROUP  # every sample observed once
    # fp32 decode vs prefill on one machine: every claimed token is exactly the sampler's choice
    assert all((o.sampling_margin == 0).all() for o in observed)
    assert not any(s.banned for s in states)
    assert max(s.fraction for s in states) < 0.2  # far from the threshold, not just under it


def test_steering_inside_the_tolerance_passes_every_sample_check_but_is_banned(
    backend: HFBackend, tests: toploc.EvidenceTests, steering: None
) -> None:
    verdicts, states, observed = judge_batches(backend, tests, "steer-w", 12)
    margins = torch.tensor([m for o in observed for m in o.sampling_margin.tolist()])
    assert 0 < margins.max() < STEER_WITHIN  # steered, and always inside the per-sample tolerance
    assert (margins > 0).float().mean() > 0.05
    # no sample alone looks wrong
    assert [v.reason for batch in verdicts for v in batch] == ["ok"] * (12 * PER_BATCH * GROUP)
    banned_at = next(i for i, s in enumerate(states) if s.banned)  # banned ...
    assert all(s.banned for s in states[banned_at:])  # ... for good
    assert "sampling_margin" in states[banned_at].strongest
    reason = "evidence 40.0 >= 31.0 nats"
    rejected = reject_banned(verdicts[banned_at], reason)
    assert {(v.accepted, v.reason, v.detail) for v in rejected} == {(False, "banned_worker", reason)}


def test_the_ban_reason_gives_the_score_of_the_sample_that_crossed(
    backend: HFBackend, tests: toploc.EvidenceTests, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, honest = judge_batches(backend, tests, "honest-w", 2)
    with monkeypatch.context() as patch:
        patch.setattr(backend_module, "sample_next", steer)
        _, _, steered = judge_batches(backend, tests, "steer-w", 12)
    replay = toploc.WorkerEvidence(tests)
    crossing = next(i for i, o in enumerate(steered) if replay.update(o).banned)
    ledger = EvidenceLedger(tests)  # one batch: steering until it crosses, then honest samples
    final = ledger.record("w", "b0", [*steered[: crossing + 1], *honest])
    assert final is not None and final.banned and final.fraction < 1  # fell back after
    words = ledger.ban_reasons["w"].split()  # "evidence <score> >= <threshold> nats ..."
    assert float(words[1]) >= float(words[3]) in (round(tests.log_threshold, 1), round(tests.history_log_threshold, 1))


def test_margins_equal_the_sampling_check(backend: HFBackend) -> None:
    prompts = [TOKENIZER("12*3=")["input_ids"]] * 3
    completions = backend.generate(prompts, [5, 6, 7], SamplingParams(1.0, MAX_NEW))
    prefills = backend.prefill(prompts, [c.completion_tokens for c in completions])
    for completion, pre in zip(completions, prefills, strict=True):
        forged = torch.tensor(completion.completion_tokens)
        forged[1] = (forged[1] + 1) % 100
        margins = sampling_margins(pre.logits, forged, completion.seed, 1.0)
        for tolerance in (0.0, 0.25, 100.0):
            positions = torch.arange(forged.numel())
            check = toploc.check_sampling(  # toploc's own rule, the reference
                pre.logits, forged, SAMPLER_SEED, completion.seed, positions, 1.0, tolerance=tolerance, max_mismatches=0
            )
            assert (sampling_problem(margins, tolerance=tolerance, max_mismatch_fraction=0.0) is None) == check.passed
        assert float(margins.max()) == check.max_margin


def test_validator_process_bans_a_steering_worker_through_the_orchestrator(
    tmp_path, tiny_lm_dir, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    metrics = Recorder()
    monkeypatch.setattr(process, "get_metrics", lambda: metrics)
    with validator_at_orchestrator(
        tmp_path, tiny_lm_dir,
        "--validator.max_batches", "8", "--validator.calibration_tokens", "512",
        "--validator.false_ban_rate", "1e-3", "--validator.evidence_horizon_samples", "1000",
        num_tasks=40, group_size=4, max_new_tokens=16,
    ) as (config, server, validator):  # fmt: skip
        # the validator measured the honest noise of its backend at start
        assert (tmp_path / "validator" / "noise-profile.json").exists()
        posted: dict[str, float | None] = {}
        post = validator.client.post_verdicts

        def record_post(request):  # type: ignore[no-untyped-def]
            assert request.prefilled is not None and request.worker_evidence is None  # the run's ledger decides
            answer = post(request)
            posted[request.batch_id] = answer.worker_evidence
            return answer

        monkeypatch.setattr(validator.client, "post_verdicts", record_post)
        ids = submit_honest_and_steered(server.url, validator, monkeypatch, steer, batches=4)
        validator.run_loop()
        validator.close()
        with OrchestratorClient(server.url) as client:
            stats = {w.worker_id: w for w in client.workers().workers}
        rows = {worker: json.loads(text) for worker, text in server.store.evidence_rows()}
    honest, steering_worker = stats[ids["honest"]], stats[ids["steer"]]
    assert (honest.samples_accepted, honest.samples_rejected, honest.banned) == (32, 0, False)
    assert steering_worker.banned and steering_worker.ban_reason.startswith("evidence ")
    assert steering_worker.samples_rejected >= 8  # at least the batch that crossed the threshold
    # fp32: any runner-up swap fails the per-sample check (tolerances.py); the evidence bans anyway
    assert "sampling_mismatch" in steering_worker.rejected_reasons
    # The run's ledger (in the orchestrator's store) holds both identities' evidence and the ban.
    assert rows[ids["honest"]]["evidence"]["samples"] == 32 and not rows[ids["honest"]]["evidence"]["banned"]
    assert rows[ids["honest"]]["evidence_ban"] == "" and rows[ids["steer"]]["evidence_ban"] == steering_worker.ban_reason
    assert ("ban", {"worker_id": ids["steer"], "reason": steering_worker.ban_reason}) in metrics.lines
    # Each batch's answer carries its worker's evidence after it (never below 0), as the release saw it.
    assert len(posted) == 8 and all(fraction is not None and fraction >= 0 for fraction in posted.values())
    steer_first = min((b for b in posted if b.startswith(ids["steer"])), key=lambda b: b.rsplit("-b", 1)[1])
    assert posted[steer_first] > config.orchestrator.release_max_evidence  # held from its first batch
