"""The honest worker scores a sample again when its own sandbox failed (prime_rl.worker.scoring):
the runner starts of a real sandbox die on purpose, the worker re-scores, and the validator then
accepts the whole lease with the rewards the worker claims (before this, the lease was lost as
``reward_unverifiable``; since issue 34 a spoiled low claim is accepted with the validator's reward)."""

from __future__ import annotations

import pytest
from code_run import CLEAN, SAMPLES, SPOILED, code_backend, code_run, judge, sandbox_schedule

from prime_rl.validator.checks import Reason
from prime_rl.worker.process import Honest
from prime_rl.worker.rollout import build_batch
from prime_rl.worker.scoring import WORKER_RESCORES, rescoring, score_sample


@pytest.fixture(scope="module")
def backend():  # type: ignore[no-untyped-def]
    return code_backend()


def test_a_spoiled_first_scoring_is_scored_again_and_the_lease_is_accepted(backend, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run = code_run()
    lease, record = run.lease("honest-w", 0, 0)
    sandbox_schedule(monkeypatch, SPOILED + CLEAN * SAMPLES)  # the worker's first scoring fails to start
    batch = Honest(run).answer(lease, backend)  # type: ignore[arg-type]
    assert [s.reward for s in batch.samples] == [1.0] * SAMPLES
    assert len(run.scorings) == SAMPLES + 1  # one re-score, of the first sample
    assert run.scorings[0] == run.scorings[1] == batch.samples[0].task_id
    sandbox_schedule(monkeypatch, [], then_dead=False)
    verdicts = judge(run, batch, record, backend)
    assert [(v.reason, v.reward) for v in verdicts] == [(Reason.ACCEPTED, 1.0)] * SAMPLES


def test_without_the_rescore_the_spoiled_claim_is_replaced_by_the_validators_reward(backend, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The control: the worker's plain score sends the spoiled 0 (and advantages from it). The validator
    used to reject the lease (``reward_unverifiable``); since issue 34 it accepts it with its own
    clean reward and advantages, which is what the trainer gets."""
    run = code_run()
    lease, record = run.lease("honest-w", 0, 0)
    sandbox_schedule(monkeypatch, SPOILED + CLEAN * SAMPLES)
    batch, rewards = build_batch(lease, backend, encode=run.encode, score=run.score)
    assert rewards[0] == 0.0 and rewards[1:] == [1.0] * (SAMPLES - 1)
    sandbox_schedule(monkeypatch, [], then_dead=False)
    verdicts = judge(run, batch, record, backend)
    assert [(v.reason, v.reward, v.advantage) for v in verdicts] == [(Reason.ACCEPTED, 1.0, 0.0)] * SAMPLES


def test_a_persistent_failure_is_sent_after_a_bounded_number_of_rescores(backend, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run = code_run()
    sandbox_schedule(monkeypatch, [], then_dead=True)
    result = score_sample(run.score, 3, "unused", 5)
    assert (result.reward, result.machine_limit, result.rescores) == (0.0, "sandbox_start", WORKER_RESCORES)
    assert run.scorings == [3] * (1 + WORKER_RESCORES)


def test_a_clean_score_is_not_repeated_and_a_wrong_program_keeps_its_zero(backend, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run = code_run(program="print(int(input()) + 1)")
    scored = rescoring(run.score)
    assert scored(5, "unused", 5) == 0.0
    assert run.scorings == [5]  # a clean 0 is the program's, not the machine's
    with pytest.raises(ValueError, match="rescores"):
        score_sample(run.score, 5, "unused", 5, rescores=-1)
