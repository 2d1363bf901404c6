"""A reward disagreement the machine caused is re-scored, and never counts towards a ban; a
dishonest claim stays ``reward_mismatch``. The sandbox fails on purpose: its runner starts are
replaced by processes that die before reporting ready, on a fixed schedule."""

from __future__ import annotations

import pytest
import torch
from code_run import (  # tests/support: the code run and the sandbox that fails on purpose
    CLEAN,
    CORRECT,
    GROUP,
    SAMPLES,
    SPOILED,
    WRONG,
    CodeRun,
    code_backend,
    code_run,
    judge,
    sandbox_schedule,
)

import grpo
from prime_rl.orchestrator.evidence_ledger import RunEvidence
from prime_rl.validator.checks import Reason
from prime_rl.validator.rewards import RESCORES_PER_SAMPLE
from prime_rl.validator.verdicts import ban_counts


@pytest.fixture(scope="module")
def backend():
    return code_backend()


def honest_batch(run: CodeRun, backend, worker: str = "honest-w", batch_index: int = 0):
    lease, record = run.lease(worker, 0, batch_index)
    batch = run.worker("honest").answer(lease, backend)
    assert [s.reward for s in batch.samples] == [1.0 if run.program == CORRECT else 0.0] * SAMPLES
    return batch, record


def test_an_honest_sample_whose_first_scoring_is_spoiled_is_accepted_after_a_rescore(backend, monkeypatch):
    run = code_run()
    batch, record = honest_batch(run, backend)
    sandbox_schedule(monkeypatch, SPOILED + CLEAN * SAMPLES)  # the first sample's first scoring fails
    verdicts = judge(run, batch, record, backend)
    assert [(v.reason, v.reward) for v in verdicts] == [(Reason.ACCEPTED, 1.0)] * SAMPLES
    assert len(run.scorings) == SAMPLES + 1  # one re-score, of the first sample
    assert run.scorings[0] == run.scorings[1] == batch.samples[0].task_id


def test_a_persistent_machine_failure_is_unverifiable_names_its_cause_and_bans_nobody(backend, monkeypatch, tmp_path):
    run = code_run()
    batch, record = honest_batch(run, backend)
    sandbox_schedule(monkeypatch, [], then_dead=True)
    observed: list[int] = []
    verdicts = judge(run, batch, record, backend, observed=observed)
    assert {v.reason for v in verdicts} == {Reason.REWARD_UNVERIFIABLE} and not any(v.accepted for v in verdicts)
    # The per-worker evidence sees these samples' tokens exactly as an accepted batch's (their
    # decode is honest); it counts no rejection, so the machine's failure adds nothing to it.
    assert observed == list(range(SAMPLES))
    assert "sandbox_start" in verdicts[0].detail and f"still limited after {RESCORES_PER_SAMPLE} re-scores" in verdicts[0].detail
    assert "another sample of the batch was rejected" in verdicts[1].detail  # the lease is lost: no more re-scores
    assert len(run.scorings) == SAMPLES + RESCORES_PER_SAMPLE
    assert ban_counts(verdicts) == (0, 0)
    # The run's ban path (the orchestrator's ledger since issue 45), batch after batch: never banned.
    ledger = RunEvidence(ban_failure_rate=0.5, ban_min_samples=SAMPLES)
    bans: list[str] = []

    def count(judged: list) -> None:  # type: ignore[type-arg]
        judgement = ledger.judge(batch.worker_id, judged, prefilled=True, evidence=None)
        ledger.commit(judgement)
        if judgement.ban:
            bans.append(judgement.ban)

    for _ in range(4):
        count(verdicts)
    row = ledger.get(batch.worker_id)
    assert bans == [] and [row.accepted, row.rejected] == [0, 0]
    # The same batch with a real failure counts in full and bans (2 x 8 rejected >= 50% of 16).
    mismatched = [v.model_copy(update={"reason": str(Reason.REWARD_MISMATCH)}) for v in verdicts]
    assert ban_counts(mismatched) == (0, SAMPLES)
    for _ in range(2):
        count(mismatched)
    assert len(bans) == 1


def test_a_claim_below_a_clean_recomputation_is_accepted_with_the_validators_reward(backend, monkeypatch):
    """The worker's sandbox failed (its claims are 0 for a correct program); the validator's runs
    are clean. A re-score could only reproduce a spoiled 0, so none is made; the trainer never uses
    the claim, so the lease is accepted with the validator's reward (issue 34: rejecting it gave any
    worker a free veto on the leases it did not want trained)."""
    run = code_run()
    lease, record = run.lease("spoiled-worker", 0, 0)
    sandbox_schedule(monkeypatch, [], then_dead=True)
    batch = run.worker("honest").answer(lease, backend)
    assert [s.reward for s in batch.samples] == [0.0] * SAMPLES
    monkeypatch.undo()
    verdicts = judge(run, batch, record, backend)
    assert [(v.reason, v.reward, v.advantage) for v in verdicts] == [(Reason.ACCEPTED, 1.0, 0.0)] * SAMPLES
    assert len(run.scorings) == SAMPLES and ban_counts(verdicts) == (SAMPLES, 0)


def test_a_lowered_claim_vetoes_nothing(backend):
    """The veto of issue 34: an honest lease with one claimed reward lowered. With advantages that
    follow its claims, it is accepted with the validator's rewards and advantages (what the trainer
    gets is what an honest batch gives); with the honest advantages kept, the claims contradict
    each other (``advantage_mismatch``), which counts towards a ban."""
    run = code_run()
    batch, record = honest_batch(run, backend, "vetoer")
    honest = judge(run, batch, record, backend)
    samples = [s.model_copy(update={"reward": 0.0}) if i == 0 else s for i, s in enumerate(batch.samples)]
    lowered = batch.model_copy(update={"samples": samples})
    kept = judge(run, lowered, record, backend)
    assert kept[0].reason == Reason.ADVANTAGE_MISMATCH and not any(v.accepted for v in kept)
    assert ban_counts(kept) == (0, SAMPLES)
    claims = torch.tensor([s.reward for s in samples[:GROUP]], dtype=torch.float64)
    consistent = [float(a) for a in grpo.group_zscore(claims, GROUP).tolist()]  # what a worker derives from its claims
    samples = [s.model_copy(update={"advantage": consistent[i]}) if i < GROUP else s for i, s in enumerate(samples)]
    verdicts = judge(run, lowered.model_copy(update={"samples": samples}), record, backend)
    assert [(v.reason, v.reward, v.advantage) for v in verdicts] == [(v.reason, v.reward, v.advantage) for v in honest]
    assert all(v.accepted and v.reward == 1.0 for v in verdicts)


def test_a_wrong_program_claimed_correct_is_still_a_reward_mismatch(backend, monkeypatch):
    run = code_run(WRONG)
    batch, record = honest_batch(run, backend, "liar")
    lying = batch.model_copy(update={"samples": [s.model_copy(update={"reward": 1.0}) for s in batch.samples]})
    sandbox_schedule(monkeypatch, SPOILED + CLEAN * SAMPLES)  # even when the validator's first run is spoiled
    verdicts = judge(run, lying, record, backend)
    assert verdicts[0].reason == Reason.REWARD_MISMATCH
    assert verdicts[0].detail == "claimed reward 1, recomputed 0 after 1 re-score(s) (first run: sandbox_start)"
    assert {v.reason for v in verdicts} == {Reason.REWARD_MISMATCH}
    assert ban_counts(verdicts) == (0, SAMPLES)
    monkeypatch.undo()
    assert {v.reason for v in judge(run, lying, record, backend)} == {Reason.REWARD_MISMATCH}  # clean runs alike
    assert len(run.scorings) == SAMPLES


@pytest.mark.parametrize("rescores", [0, 3])
def test_rescores_per_batch_are_bounded(backend, monkeypatch, rescores):
    """Starts alternate between a spoiled scoring and a clean one: the first ``rescores`` samples
    pass after one re-score each; the next finds the batch's re-scores spent (unverifiable), and
    no later sample is re-scored (the lease is lost)."""
    run = code_run()
    batch, record = honest_batch(run, backend, f"flaky-{rescores}")
    sandbox_schedule(monkeypatch, (SPOILED + CLEAN) * SAMPLES)
    verdicts = judge(run, batch, record, backend, "--validator.reward_rescores", str(rescores))
    reasons = [v.reason for v in verdicts]
    assert reasons[rescores] == Reason.REWARD_UNVERIFIABLE
    assert "the batch's re-scores are spent" in verdicts[rescores].detail
    assert reasons[:rescores] == [Reason.GROUP_REJECTED] * rescores or rescores > GROUP  # accepted, then their group
    # one unverifiable sample rejects the lease; later samples are not re-scored (a clean first
    # scoring passes, then is rejected with its group or the lease)
    assert set(reasons) <= {Reason.REWARD_UNVERIFIABLE, Reason.GROUP_REJECTED, Reason.LEASE_REJECTED}
    assert all("re-scores are spent" in v.detail or "another sample" in v.detail or v.reason != "reward_unverifiable"
               for v in verdicts)  # fmt: skip
    assert len(run.scorings) == SAMPLES + rescores
    assert ban_counts(verdicts) == (0, 0)
