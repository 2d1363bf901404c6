"""Validator checks: honest batches accepted, each hostile behaviour rejected with its reason."""

from __future__ import annotations

import base64
import logging
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun, pending_of, validator_at_orchestrator

import toploc
from prime_rl.api.client import OrchestratorClient
from prime_rl.api.protocol import RolloutBatch
from prime_rl.config import load_config
from prime_rl.inference.backend import HFBackend
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.redteam.attacks import ATTACKS, BEHAVIOURS, EXPECTED_REASONS, MIXED_CYCLE, HostileWorker
from prime_rl.tasks import load_tasks
from prime_rl.validator import tolerances
from prime_rl.validator.checks import Reason, repetition_problem
from prime_rl.validator.process import FailureTracker, Validator
from prime_rl.validator.verdicts import ban_counts, validate_batch

KEY = b"validator-test-assignment-key"
NUM_TASKS = 12
GROUP = 4
PER_BATCH = 2
MAX_NEW = 6
TOKENIZER = make_tiny_tokenizer()
RUN = TinyRun(KEY, TOKENIZER, lambda t: f"{t}+{t * 3}=", NUM_TASKS, GROUP, PER_BATCH, MAX_NEW)
CHECKS = RUN.checks()


@pytest.fixture(scope="module")
def backend():
    return HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)


pending = pending_of


def verdicts_for(batch, record, backend, **kwargs):
    return validate_batch(
        pending(batch, record),
        tasks=RUN,
        backend_for=lambda v: backend if v == backend.policy_version else None,
        decode=RUN.decode,
        checks=kwargs.pop("checks", CHECKS),
        **kwargs,
    )


def test_honest_batch_is_accepted_with_recomputed_rewards(backend):
    lease, record = RUN.lease("honest-1", 0, 0)
    batch = RUN.worker("honest").answer(lease, backend)
    assert len(batch.samples) == GROUP * PER_BATCH
    verdicts = verdicts_for(batch, record, backend)
    assert [v.reason for v in verdicts] == [Reason.ACCEPTED] * (GROUP * PER_BATCH)
    for v, s in zip(verdicts, batch.samples, strict=True):
        assert (
            v.accepted
            and v.reward == pytest.approx(s.reward, abs=0)
            and v.advantage == pytest.approx(s.advantage, abs=1e-9)
        )


EXPECTED = {  # every attack of the table; stale_policy needs a later step (its own test)
    name: {Reason(reason) for reason in attack.expected} for name, attack in ATTACKS.items() if name != "stale_policy" and not attack.episodes and not attack.spans  # episodes: test_episodes.py; spans: test_inflight_redteam.py
}


@pytest.mark.parametrize("behaviour", sorted(EXPECTED))
def test_hostile_behaviour_is_rejected_with_its_reason(backend, behaviour):
    lease, record = RUN.lease(f"bad-{behaviour.replace('_', '-')}", 0, 1)
    batch = RUN.worker(behaviour).answer(lease, backend)
    verdicts = verdicts_for(batch, record, backend)
    assert not any(v.accepted for v in verdicts)
    reasons = {v.reason for v in verdicts}
    assert reasons & EXPECTED[behaviour], (behaviour, [(v.reason, v.detail) for v in verdicts])
    assert reasons <= EXPECTED[behaviour] | {Reason.GROUP_REJECTED, Reason.LEASE_REJECTED}


def test_a_completion_repeating_one_token_past_the_limit_is_rejected_with_its_own_reason(backend):
    """validator.max_repeated_tokens N: a run of N + 1 equal tokens is rejected (repeated_token) before any
    prefill, a run of exactly N passes the rule; 0 (the default) checks nothing."""
    assert repetition_problem([5, 7, 7, 7, 7, 5], limit=4) is None  # just inside
    assert repetition_problem([5, 7, 7, 7, 7, 7], limit=4) == (
        "token 7 repeats on 5 consecutive positions from 1 (limit 4)"
    )
    assert repetition_problem([9] * 50, limit=0) is None and repetition_problem([], limit=1) is None
    lease, record = RUN.lease("looping", 0, 0)
    batch = RUN.worker("honest").answer(lease, backend)
    looping = batch.samples[3].model_copy(update={"completion_tokens": [7] * MAX_NEW})  # ends at max_new_tokens
    tampered = batch.model_copy(update={"samples": [*batch.samples[:3], looping, *batch.samples[4:]]})
    limited = RUN.checks("--validator.max_repeated_tokens", str(MAX_NEW - 1))
    prefilled = []

    def backend_for(version):
        prefilled.append(version)
        return backend

    verdicts = validate_batch(
        pending(tampered, record), tasks=RUN, backend_for=backend_for, decode=RUN.decode, checks=limited
    )
    assert (verdicts[3].reason, verdicts[3].detail) == (
        Reason.REPEATED_TOKEN, f"token 7 repeats on {MAX_NEW} consecutive positions from 0 (limit {MAX_NEW - 1})"
    )
    assert {v.reason for v in verdicts[:3] + verdicts[4:]} == {Reason.LEASE_REJECTED} and prefilled == []
    # Without a limit the same sample is caught later, by the prefill (its proofs are of other tokens).
    assert verdicts_for(tampered, record, backend)[3].reason == Reason.PROOF_FAILED
    assert {v.reason for v in verdicts_for(batch, record, backend, checks=limited)} == {Reason.ACCEPTED}


def test_stale_policy_is_rejected(backend):
    # Lease of step 3 answered with version 0 while async_level = 1: 0 < 3 - 1.
    lease, record = RUN.lease("stale", 3, 0)
    batch = RUN.worker("stale_policy").answer(lease, backend)
    assert batch.policy_version == 0
    verdicts = verdicts_for(batch, record, backend)
    assert {v.reason for v in verdicts} == {Reason.STALE_POLICY}


def test_a_lease_fixes_its_version(backend):
    """Issue 34 (version shopping): a lease fixes the version it is generated with: its step (the
    newest committed when it was issued) unless the worker stated another version of the window. A worker holding an older version still inside the async
    window, or a newer one committed meanwhile, used to pick the one it liked; either is now
    ``wrong_policy_version``, found before any prefill, and counts as a whole failed lease towards
    a ban (at least ``ban_min_samples``) whatever its size."""
    lease, record = RUN.lease("shopper", 1, 0)  # step 1, async_level 1: versions 0 and 1 used to pass
    assert lease.policy_version == 1 and lease.min_policy_version == 0
    older = RUN.worker("honest").answer(lease, backend)  # generated with the backend's version 0
    assert older.policy_version == 0
    prefilled = []

    def backend_for(version):
        prefilled.append(version)
        return backend if version == backend.policy_version else None

    verdicts = validate_batch(
        pending(older, record), tasks=RUN, backend_for=backend_for, decode=RUN.decode, checks=CHECKS, newest_version=2
    )
    assert {v.reason for v in verdicts} == {Reason.WRONG_POLICY_VERSION} and prefilled == []
    assert "not the lease's version 1" in verdicts[0].detail
    newer = older.model_copy(update={"policy_version": 2})  # committed after the lease was issued
    assert {v.reason for v in verdicts_for(newer, record, backend, newest_version=2)} == {Reason.WRONG_POLICY_VERSION}
    assert ban_counts(verdicts, prefilled=False, min_samples=16) == (0, 16)  # 8 samples count as 16
    assert ban_counts(verdicts, prefilled=True, min_samples=16) == (0, 8)
    # A lease the worker asked for with the version it held (0, inside the window) fixes 0: the
    # same batch is accepted, and the newest version is now the wrong one.
    stated = record.model_copy(update={"policy_version": 0})
    assert {v.reason for v in verdicts_for(older, stated, backend, newest_version=2)} == {Reason.ACCEPTED}
    at_step = older.model_copy(update={"policy_version": 1})
    assert {v.reason for v in verdicts_for(at_step, stated, backend, newest_version=2)} == {Reason.WRONG_POLICY_VERSION}
    # The same lease generated with its own version is accepted.
    own, own_record = RUN.lease("keeper", 0, 0)
    honest = RUN.worker("honest").answer(own, backend)
    assert {v.reason for v in verdicts_for(honest, own_record, backend, newest_version=2)} == {Reason.ACCEPTED}


def test_a_lease_that_fails_before_any_model_check_counts_towards_a_ban_whatever_its_size(tmp_path):
    """Issue 34: one 8-sample lease rejected before the prefill (here ``wrong_policy_version``) bans a
    fresh identity, although 8 < ``ban_min_samples`` 16; a failure the validator's own state may
    explain (``unknown_policy``) counts only its samples, and a worker with accepted history is not
    banned by one such lease."""
    from prime_rl.api.judgement import NOISE_REASONS, NOT_THE_WORKERS
    from prime_rl.api.protocol import Verdict
    from prime_rl.orchestrator.evidence_ledger import RunEvidence

    # The torch-free rule names the validator's reasons by value.
    assert {Reason.SAMPLING_FAILED, Reason.LOGPROBS_MISMATCH} == NOISE_REASONS
    assert {Reason.UNKNOWN_POLICY, Reason.INTERNAL_ERROR} == NOT_THE_WORKERS
    # The run's ledger (the orchestrator's since issue 45) with the validator's ban settings.
    ledger = RunEvidence(ban_failure_rate=0.5, ban_min_samples=16)
    bans: list[str] = []

    def lease(reason: str) -> list[Verdict]:
        return [
            Verdict(sample_index=i, accepted=reason == "ok", reason=reason if i == 0 or reason == "ok" else "lease_rejected",
                    reward=0.0, advantage=0.0)
            for i in range(8)
        ]  # fmt: skip

    def judged(worker: str, reason: str, *, prefilled: bool) -> None:
        judgement = ledger.judge(worker, lease(reason), prefilled=prefilled, evidence=None)
        ledger.commit(judgement)
        if judgement.ban:
            bans.append(worker)

    def counts(worker: str) -> list[int]:
        row = ledger.get(worker)
        return [row.accepted, row.rejected]

    judged("shopper", "wrong_policy_version", prefilled=False)
    judged("unlucky", "unknown_policy", prefilled=False)
    for _ in range(4):
        judged("veteran", "ok", prefilled=True)
    judged("veteran", "bad_seed", prefilled=False)  # 16 of 48: below 50 %
    assert bans == ["shopper"]
    assert counts("unlucky") == [0, 8] and counts("veteran") == [32, 16]

    # Issue 34 (red team round three): a fresh identity's lease that fails after the prefill (made-up
    # episodes with random proofs: toploc_mismatch) bans it too, and a machine-limited one still counts
    # nothing; a worker with accepted samples keeps the ban_min_samples grace for the same failure.
    judged("fabricator", "toploc_mismatch", prefilled=True)
    judged("sandboxed", "reward_unverifiable", prefilled=True)
    judged("veteran", "toploc_mismatch", prefilled=True)  # 24 of 56: below 50 %
    # A per-token rule an honest bf16 worker fails at its calibrated rate keeps the grace for a newcomer.
    judged("newcomer", "sampling_mismatch", prefilled=True)
    assert bans == ["shopper", "fabricator"]
    assert counts("sandboxed") == [0, 0] and counts("veteran") == [32, 24]
    assert counts("newcomer") == [0, 8]


def test_future_and_unknown_versions_and_missing_lease(backend):
    lease, record = RUN.lease("w", 0, 0)
    batch = RUN.worker("honest").answer(lease, backend)
    future = batch.model_copy(update={"policy_version": 5})
    assert {v.reason for v in verdicts_for(future, record, backend)} == {Reason.FUTURE_POLICY}
    none_backend = validate_batch(
        pending(batch, record), tasks=RUN, backend_for=lambda v: None, decode=RUN.decode, checks=CHECKS
    )
    assert {v.reason for v in none_backend} == {Reason.UNKNOWN_POLICY}
    assert {v.reason for v in verdicts_for(batch, None, backend)} == {Reason.UNASSIGNED_TASK}


def test_seed_temperature_logprobs_and_group_checks(backend):
    lease, record = RUN.lease("w2", 0, 0)
    batch = RUN.worker("honest").answer(lease, backend)

    def tamper(index, **update):
        samples = list(batch.samples)
        samples[index] = samples[index].model_copy(update=update)
        return batch.model_copy(update={"samples": samples})

    cases = [
        (tamper(0, sampling_seed=batch.samples[0].sampling_seed + 1), Reason.SEED_MISMATCH),
        (tamper(0, temperature=0.7), Reason.SAMPLING_PARAMS_MISMATCH),
        (
            tamper(0, inference_logprobs=[x - 1.0 for x in batch.samples[0].inference_logprobs]),
            Reason.LOGPROBS_MISMATCH,
        ),
        (tamper(0, advantage=batch.samples[0].advantage + 0.5), Reason.ADVANTAGE_MISMATCH),
        (tamper(0, completion_tokens=[101] * len(batch.samples[0].completion_tokens)), Reason.MALFORMED),
        (batch.model_copy(update={"samples": batch.samples[1:]}), Reason.GROUP_INCOMPLETE),
    ]
    for tampered, reason in cases:
        verdicts = verdicts_for(tampered, record, backend)
        assert verdicts[0].reason == reason, (reason, verdicts[0])
        # A lease is accepted whole or not at all: the other task's untouched group goes too.
        assert not any(v.accepted for v in verdicts)
        assert {v.reason for v in verdicts[-GROUP:]} == {Reason.LEASE_REJECTED}, [v.reason for v in verdicts]


def test_early_eos_and_truncation_are_bad_termination(backend):
    lease, record = RUN.lease("w3", 0, 0)
    batch = RUN.worker("honest").answer(lease, backend)
    s = batch.samples[0]
    cut = s.model_copy(
        update={
            "completion_tokens": s.completion_tokens[:-1] or [5],
            "inference_logprobs": s.inference_logprobs[:-1] or [0.0],
        }
    )
    if s.completion_tokens[-1] != 2 and len(s.completion_tokens) > 1:
        tampered = batch.model_copy(update={"samples": [cut, *batch.samples[1:]]})
        assert verdicts_for(tampered, record, backend)[0].reason == Reason.BAD_TERMINATION


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    proofs=st.binary(max_size=600),
    tokens=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=MAX_NEW + 2),
    logprobs=st.floats(-1e6, 1e6, allow_nan=False),
)
def test_validator_never_crashes_on_hostile_samples(backend, proofs, tokens, logprobs):
    lease, record = RUN.lease("fuzz", 0, 0)
    batch = HONEST_CACHE.setdefault("batch", RUN.worker("honest").answer(lease, backend))
    s = batch.samples[0].model_copy(
        update={
            "proofs": base64.b64encode(proofs).decode(),
            "completion_tokens": tokens,
            "inference_logprobs": [logprobs] * len(tokens),
        }
    )
    verdicts = verdicts_for(batch.model_copy(update={"samples": [s, *batch.samples[1:]]}), record, backend)
    assert len(verdicts) == len(batch.samples)
    assert not verdicts[0].accepted and verdicts[0].reason != Reason.INTERNAL_ERROR


HONEST_CACHE: dict[str, RolloutBatch] = {}


def test_failure_tracker_bans_over_threshold():
    failures = FailureTracker(ban_failure_rate=0.5, ban_min_samples=10)
    assert failures.record("good", accepted=9, rejected=1) is None
    assert failures.record("bad", accepted=2, rejected=3) is None  # too few samples to judge
    reason = failures.record("bad", accepted=0, rejected=5)
    assert reason is not None and "8/10" in reason
    assert failures.record("bad", accepted=0, rejected=5) is None  # banned once


def test_every_behaviour_name_is_known():
    assert "honest" in BEHAVIOURS
    with pytest.raises(ValueError):
        RUN.worker("nope")


def test_mixed_behaviour_cycles_and_every_batch_is_rejected_as_announced(backend):
    mixed = RUN.worker("mixed")
    seen = set()
    for batch_index in range(len(MIXED_CYCLE)):
        lease, record = RUN.lease("mixed", 0, batch_index)
        kind = mixed.resolve(lease)
        seen.add(kind)
        batch = mixed.answer(lease, backend)
        verdicts = verdicts_for(batch, record, backend)
        # Every sample judged: "none accepted" holds for no verdicts too.
        assert len(verdicts) == len(batch.samples) == GROUP * PER_BATCH, kind
        allowed = set(EXPECTED_REASONS[kind]) | {"group_rejected", "lease_rejected"}
        assert {str(v.reason) for v in verdicts} <= allowed and not any(v.accepted for v in verdicts), kind
    assert seen == set(MIXED_CYCLE) - {"stale_policy"}  # stale needs min_policy_version > 0


def test_validator_process_posts_verdicts_and_bans(tmp_path, tiny_lm_dir, caplog, monkeypatch):
    # The process loop against a real orchestrator: one honest and one cheating worker.
    from prime_rl import metrics
    from verifiers.code import run_tests, sandbox_runs

    writer = metrics.MetricsWriter(tmp_path / "metrics" / "validator.jsonl", role="validator", name="validator")
    monkeypatch.setattr(metrics, "_METRICS", writer)
    # One program run in this process beforehand: a verdict's sandbox_runs is the process's cumulative count.
    run_tests("print(1)", {"inputs": [""], "outputs": ["1"]})
    with validator_at_orchestrator(
        tmp_path, tiny_lm_dir,
        "--validator.max_batches", "2", "--validator.ban_min_samples", "4",
        num_tasks=20, group_size=2, max_new_tokens=4,
    ) as (_, server, validator):  # fmt: skip
        validator.wait_log_every_s = 0.3
        caplog.set_level(logging.INFO, logger="prime_rl.validator.process")
        judging = threading.Thread(target=validator.run_loop)
        started = time.monotonic()
        judging.start()  # nothing to judge yet: it says so once per log period
        ids, answers = {}, []
        for behaviour in ("honest", "inflated_rewards"):
            client = OrchestratorClient(server.url)
            ids[behaviour] = client.register(behaviour).worker_id
            lease = client.get_tasks(ids[behaviour])
            cheat = HostileWorker(
                behaviour, validator.tasks.encode, validator.tasks.score, validator.tasks.prompt_tokens,
                validator.tasks.num_tasks,
            )  # fmt: skip
            answers.append((client, cheat.answer(lease, validator.backend)))
        time.sleep(max(0.0, 1.5 - (time.monotonic() - started)))
        idle_lines = [r.getMessage() for r in caplog.records if "no batch to judge" in r.getMessage()]
        assert 2 <= len(idle_lines) <= (time.monotonic() - started) / 0.3, idle_lines
        assert "0 batches judged so far" in idle_lines[-1]
        for client, answer in answers:
            client.submit_rollouts(answer)
            client.close()
        judging.join(timeout=300)
        assert not judging.is_alive()
        validator.close()
        with OrchestratorClient(server.url) as client:
            stats = {w.worker_id: w for w in client.workers().workers}
    honest, bad = stats[ids["honest"]], stats[ids["inflated_rewards"]]
    assert (honest.samples_accepted, honest.samples_rejected, honest.banned) == (4, 0, False)
    assert (bad.samples_accepted, bad.samples_rejected, bad.banned) == (0, 4, True)
    assert set(bad.rejected_reasons) <= {"reward_mismatch", "group_rejected", "lease_rejected"}
    writer.close()
    verdicts = [r for r in metrics.read_metrics(tmp_path / "metrics" / "validator.jsonl") if r["event"] == "verdict"]
    assert len(verdicts) == 2 and sum(verdicts[-1]["sandbox_runs"].values()) >= 1
    assert verdicts[-1]["sandbox_runs"] == sandbox_runs()  # arithmetic tasks ran nothing more


def test_a_profile_too_small_for_evidence_leaves_the_per_sample_tolerances_as_configured(tmp_path, tiny_lm_dir):
    """Evidence off (no usable test in a two-token profile) must not widen the per-sample rules: the
    widening to 3x the honest maxima (here 0.6 and 0.09) is only safe with the evidence behind it."""
    profile = toploc.NoiseProfile.calibrate(
        [toploc.Observations(sampling_margin=np.array([0.2, 0.0]), logprob_gap=np.array([0.03, 0.0]))]
    )
    profile.save(tmp_path / "tiny-profile.json")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = load_config(
        None,
        [
            "--run_dir", str(tmp_path / "run"), "--model.path", str(tiny_lm_dir), "--tasks.num_tasks", "20",
            "--orchestrator.port", str(port), "--validator.noise_profile", str(tmp_path / "tiny-profile.json"),
        ],
    )  # fmt: skip
    with OrchestratorServer(config, load_tasks(config.tasks)):
        validator = Validator(config)
        validator.close()
    assert validator.evidence is None
    # fp32 is exact whatever the evidence: any runner-up swap is rejected (validator/tolerances.py)
    assert validator.checks.validator.sampling_tolerance == tolerances.FP32_SAMPLING_TOLERANCE
    assert validator.checks.sampling_rule is not None and validator.checks.sampling_rule.allowed(10_000) == 0
    assert validator.checks.validator.logprob_atol == config.validator.logprob_atol == 0.05


# ---------------------------------------------------------------- issue 13: whole leases, cheap checks first


def _no_prefill(version):
    raise AssertionError("a structurally invalid batch must cost no prefill (backend_for was called)")


def _honest(backend, worker_id):
    lease, record = RUN.lease(worker_id, 0, 0)
    return RUN.worker("honest").answer(lease, backend), record


def test_half_a_lease_is_rejected_whole_before_any_prefill(backend):
    batch, record = _honest(backend, "half")
    first_task = batch.samples[0].task_id
    half = batch.model_copy(update={"samples": [s for s in batch.samples if s.task_id == first_task]})
    assert len(half.samples) == GROUP  # a whole, honest group: only the other prompt is missing
    verdicts = validate_batch(
        pending(half, record), tasks=RUN, backend_for=_no_prefill, decode=RUN.decode, checks=CHECKS
    )
    assert {v.reason for v in verdicts} == {Reason.INCOMPLETE_LEASE} and not any(v.accepted for v in verdicts)


@pytest.mark.parametrize(
    "cut",
    [
        lambda data: data[:-2],  # one coefficient short
        lambda data: data + data,  # twice the proofs the tokens need
        lambda data: b"\x00\x00" + data[2:],  # modulus 0
        lambda data: data[:2] + b"\xff\xff" + data[4:],  # a coefficient >= 65497
        lambda data: b"",
    ],
)
def test_malformed_proofs_cost_no_prefill(backend, cut):
    batch, record = _honest(backend, "proofs")
    samples = list(batch.samples)
    samples[3] = samples[3].model_copy(update={"proofs": cut(samples[3].proofs)})  # bytes in-process
    verdicts = validate_batch(
        pending(batch.model_copy(update={"samples": samples}), record),
        tasks=RUN, backend_for=_no_prefill, decode=RUN.decode, checks=CHECKS,
    )  # fmt: skip
    assert verdicts[3].reason == Reason.MALFORMED_PROOF, verdicts[3]
    assert {v.reason for i, v in enumerate(verdicts) if i != 3} <= {Reason.LEASE_REJECTED}
    assert not any(v.accepted for v in verdicts)


def test_unterminated_and_extended_completions_are_bad_termination_before_prefill(backend):
    batch, record = _honest(backend, "term")
    longest = max(range(len(batch.samples)), key=lambda i: len(batch.samples[i].completion_tokens))
    s = batch.samples[longest]
    variants = {
        "truncated": s.completion_tokens[:-1],  # no EOS, shorter than max_new_tokens
        "past_eos": [s.completion_tokens[0], 2, 5],  # EOS, then more tokens
    }
    for name, tokens in variants.items():
        if not tokens or (name == "truncated" and len(tokens) == MAX_NEW):
            continue
        tampered = s.model_copy(
            update={"completion_tokens": tokens, "inference_logprobs": [-1.0] * len(tokens)}
        )
        samples = [tampered if i == longest else x for i, x in enumerate(batch.samples)]
        verdicts = validate_batch(
            pending(batch.model_copy(update={"samples": samples}), record),
            tasks=RUN, backend_for=_no_prefill, decode=RUN.decode, checks=CHECKS,
        )  # fmt: skip
        assert verdicts[longest].reason == Reason.BAD_TERMINATION, (name, verdicts[longest])
        assert not any(v.accepted for v in verdicts), name


def test_accepted_verdicts_carry_the_validators_logprobs_not_the_claimed_ones(backend):
    batch, record = _honest(backend, "nudge")
    nudged = batch.model_copy(
        update={
            "samples": [
                s.model_copy(update={"inference_logprobs": [x + 0.04 for x in s.inference_logprobs]})
                for s in batch.samples
            ]
        }
    )
    verdicts = verdicts_for(nudged, record, backend)
    assert all(v.accepted for v in verdicts)  # +0.04 is inside logprob_atol (0.05)
    for v, honest, claimed in zip(verdicts, batch.samples, nudged.samples, strict=True):
        assert len(v.logprobs) == len(honest.completion_tokens)
        # The recomputed values are the honest ones (fp32 decode = prefill to ~1e-6), 0.04 off the claim.
        assert max(abs(a - b) for a, b in zip(v.logprobs, honest.inference_logprobs, strict=True)) < 1e-4
        assert min(abs(a - b) for a, b in zip(v.logprobs, claimed.inference_logprobs, strict=True)) > 0.039


def test_one_bad_group_rejects_the_whole_lease(backend):
    batch, record = _honest(backend, "onegroup")
    first_task = batch.samples[0].task_id
    samples = [
        s.model_copy(update={"reward": s.reward + 1.0}) if s.task_id == first_task else s for s in batch.samples
    ]  # the worker "fails" the group it did badly on, hoping to keep the other
    verdicts = verdicts_for(batch.model_copy(update={"samples": samples}), record, backend)
    by_task = {}
    for v, s in zip(verdicts, samples, strict=True):
        by_task.setdefault(s.task_id == first_task, set()).add(v.reason)
    assert by_task[True] <= {Reason.REWARD_MISMATCH, Reason.GROUP_REJECTED}
    assert by_task[False] == {Reason.LEASE_REJECTED}
    assert not any(v.accepted or v.logprobs for v in verdicts)


def test_a_validator_with_another_assignment_key_stops_instead_of_rejecting_honest_work(backend):
    from dataclasses import replace

    from prime_rl.validator.structure import AssignmentKeyMismatch

    batch, record = _honest(backend, "keys")
    with pytest.raises(AssignmentKeyMismatch, match="assignment_secret"):
        verdicts_for(batch, record, backend, checks=replace(CHECKS, assignment_key=b"another-key-another-key"))


def test_accepted_verdicts_count_the_tokens_beyond_the_sampling_tolerance(backend, monkeypatch):
    """A bf16 rule accepts a few tokens beyond the tolerance (honest noise puts them there); the
    verdict says how many, so the orchestrator never trains on them (issue #34 item 9). The margins
    are the validator's real ones (fp32: all 0) with the first token of sample 1 lifted to 0.2."""
    import torch

    from prime_rl.validator import checks as checks_module
    from prime_rl.validator.token_rule import TokenRule

    real = checks_module.sampling_margins
    calls = []

    def margins(logits, tokens, seed, temperature, *, runs=None):
        out = real(logits, tokens, seed, temperature, runs=runs)
        calls.append(seed)
        if len(calls) == 2:
            out = out.clone()
            out[0] = 0.2
        return out

    monkeypatch.setattr(checks_module, "sampling_margins", margins)
    rule = TokenRule(tolerance=0.1, rate=0.2, hard_limit=0.3)  # allows a token beyond 0.1 in a 6-token sample
    assert rule.problem(torch.tensor([0.2, 0, 0, 0, 0, 0])) is None
    batch, record = _honest(backend, "beyond")
    from dataclasses import replace

    verdicts = verdicts_for(batch, record, backend, checks=replace(CHECKS, sampling_rule=rule))
    assert all(v.accepted for v in verdicts), [(v.reason, v.detail) for v in verdicts]
    assert [v.beyond_tolerance for v in verdicts] == [0, 1] + [0] * (len(verdicts) - 2)
