"""A reward disagreement the machine caused is re-scored, and never counts towards a ban; a
dishonest claim stays ``reward_mismatch``. The sandbox fails on purpose: its runner starts are
replaced by processes that die before reporting ready, on a fixed schedule."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

import verifiers
from prime_rl.api.protocol import LeaseRecord, PendingBatch, RolloutBatch
from prime_rl.inference.backend import HFBackend
from prime_rl.validator.checks import Reason
from prime_rl.validator.journal import ValidatorJournal
from prime_rl.validator.process import FailureTracker, Validator
from prime_rl.validator.rewards import RESCORES_PER_SAMPLE
from prime_rl.validator.verdicts import ban_counts, validate_batch
from verifiers.code import sandbox as sandbox_module
from verifiers.code.privileges import fallback_python

KEY = b"rescore-test-assignment-key"
GROUP, PER_BATCH = 4, 2
SAMPLES = GROUP * PER_BATCH
TOKENIZER = make_tiny_tokenizer()
CODE_TASK = verifiers.Task(
    "double it", "prime_rl_code", {"test_cases": {"inputs": ["3\n", "5\n"], "outputs": ["6\n", "10\n"]}}
)
CORRECT, WRONG = "print(int(input()) * 2)", "print(int(input()) + 1)"
STARTS_PER_SCORING = 1 + sandbox_module.START_RETRIES  # dead starts that spoil one scoring


@dataclass(frozen=True)
class CodeRun(TinyRun):
    """The tiny run, but every task's reward is one program run in the sandbox (the tiny model's
    completions are not programs): ``program`` passes both tests (reward 1) or none (0)."""

    program: str = CORRECT
    scorings: list[int] | None = None

    def score(self, task_id: int, completion: str, num_tokens: int) -> float:
        if self.scorings is not None:
            self.scorings.append(task_id)
        return verifiers.verify(CODE_TASK, f"```python\n{self.program}\n```").reward


def code_run(program: str = CORRECT) -> CodeRun:
    return CodeRun(KEY, TOKENIZER, lambda t: f"{t}+{t * 3}=", 12, GROUP, PER_BATCH, 6, program=program, scorings=[])


@pytest.fixture(scope="module")
def backend():
    if sandbox_module.default_sandbox() == "rlimit" and fallback_python().path is None:
        pytest.skip("no sandbox can run here")
    return HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)


def sandbox_schedule(monkeypatch: pytest.MonkeyPatch, dead: list[bool], *, then_dead: bool = False) -> None:
    """Runner starts (spare or fresh) follow ``dead``: True dies before it is ready; after the list,
    every start is ``then_dead``."""
    real = sandbox_module._start_runner
    remaining = list(dead)
    lock = threading.Lock()

    def start(kind: str) -> subprocess.Popen:
        with lock:
            fails = remaining.pop(0) if remaining else then_dead
        if fails:
            return subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return real(kind)

    monkeypatch.setattr(sandbox_module._SPARES, "take", start)
    monkeypatch.setattr(sandbox_module, "_start_runner", start)


SPOILED = [True] * STARTS_PER_SCORING  # one scoring: every start and retry dies
CLEAN = [False]  # one scoring: the first start works


def judge(run: CodeRun, batch: RolloutBatch, record: LeaseRecord, backend, *overrides: str, observed=None):
    run.scorings.clear()
    pending = PendingBatch(
        batch_id=f"{batch.worker_id}-{batch.batch_index}", worker_id=batch.worker_id, step=batch.step,
        batch_index=batch.batch_index, policy_version=batch.policy_version, received_at=time.time(),
        lease=record, samples=batch.samples,
    )  # fmt: skip
    observe = None if observed is None else (lambda index, observations: observed.append(index))
    return validate_batch(
        pending, tasks=run, backend_for=lambda v: backend, decode=run.decode, checks=run.checks(*overrides),
        observe=observe,
    )  # fmt: skip


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
    # The validator's own ban path, batch after batch: the worker is never banned.
    bans: list[tuple[str, str]] = []
    validator = SimpleNamespace(
        failures=FailureTracker(ban_failure_rate=0.5, ban_min_samples=SAMPLES),
        evidence_bans_posted=set(),
        client=SimpleNamespace(ban=lambda worker, reason: bans.append((worker, reason))),
        journal=ValidatorJournal(tmp_path / "journal.jsonl"),
    )
    judged = SimpleNamespace(worker_id=batch.worker_id, batch_id="unverifiable-batch")
    for _ in range(4):
        Validator.ban(validator, judged, verdicts, None)
    assert bans == [] and validator.failures.counts[batch.worker_id] == [0, 0]
    # The same batch with a real failure counts in full and bans (2 x 8 rejected >= 50% of 16).
    mismatched = [v.model_copy(update={"reason": str(Reason.REWARD_MISMATCH)}) for v in verdicts]
    assert ban_counts(mismatched) == (0, SAMPLES)
    for _ in range(2):
        Validator.ban(validator, judged, mismatched, None)
    assert [worker for worker, _ in bans] == [batch.worker_id]


def test_a_claim_below_a_clean_recomputation_is_unverifiable_not_cheating(backend, monkeypatch):
    """The worker's sandbox failed (its claims are 0 for a correct program); the validator's runs
    are clean. A re-score could only reproduce a spoiled 0, so none is made."""
    run = code_run()
    lease, record = run.lease("spoiled-worker", 0, 0)
    sandbox_schedule(monkeypatch, [], then_dead=True)
    batch = run.worker("honest").answer(lease, backend)
    assert [s.reward for s in batch.samples] == [0.0] * SAMPLES
    monkeypatch.undo()
    verdicts = judge(run, batch, record, backend)
    assert verdicts[0].reason == Reason.REWARD_UNVERIFIABLE and "below the recomputed 1" in verdicts[0].detail
    assert {v.reason for v in verdicts} == {Reason.REWARD_UNVERIFIABLE}
    assert len(run.scorings) == SAMPLES and ban_counts(verdicts) == (0, 0)


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
