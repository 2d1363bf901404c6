"""The span forgeries of ``redteam/attacks.py`` (in-flight weight updates), in process, on real decodes.

Each hostile behaviour decodes a lease of the tiny model for real (versions 0 and 1 are the tiny
models of seeds 0 and 1, as in ``test_inflight.py``), switching in flight where it needs to, and
forges its span claim; the validator must reject it with the attack's own reason
(``hostile.ATTACKS``), and the two the orchestrator refuses must break the submission rules with
their own message. The same behaviours as worker processes: ``test_redteam_spans.py``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from inflight_harness import VersionedValidator  # tests/support
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

from prime_rl.api.assignment import switch_nonce
from prime_rl.api.protocol import LeaseRecord, LeaseSwitch, RolloutBatch, TaskLease
from prime_rl.api.spans import SPAN_ALIGN, future_span, spans_problem
from prime_rl.inference.backend import HFBackend
from prime_rl.inference.contract import VersionSwitch
from prime_rl.redteam.attacks import ATTACKS, HostileWorker
from prime_rl.redteam.spans import decode_switching_at, points
from prime_rl.validator.checks import Reason
from prime_rl.weights.files import save_policy
from prime_rl.worker.rollout import sampling_params

from .conftest import INFLIGHT

KEY = b"inflight-redteam-assignment-key"
TOKENIZER = make_tiny_tokenizer()
MAX_NEW = 96  # three proof chunks
RUN = TinyRun(KEY, TOKENIZER, lambda t: f"{t}*{t + 7}=", 12, group_size=4, prompts_per_batch=2, max_new_tokens=MAX_NEW)
# A run allows one switch per lease (orchestrator/switches.py); the validator's chained forwards are
# general, and these validator tests also chain three versions (records made by hand), so their checks
# allow three spans.
CHECKS = dataclasses.replace(RUN.checks(*INFLIGHT), max_versions_per_sample=3)
FOLLOWERS = {Reason.LEASE_REJECTED, Reason.GROUP_REJECTED}
SPAN_ATTACKS = sorted(name for name, attack in ATTACKS.items() if attack.spans)


class Versions:
    """The worker's versions: v1 committed and on disk (``SpanVersions``); a switch to it is announced
    for ``lease`` and recorded as the orchestrator records it (the first announcement wins; another
    chunk is refused), answered with the record's nonce."""

    max_versions = 4

    def __init__(self, files: dict[int, Path], lease: TaskLease) -> None:
        self.files, self.lease = files, lease
        self.switches: list[LeaseSwitch] = []

    def committed(self) -> int:
        return 1

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        if current >= 1:
            return None
        chunk = boundary // SPAN_ALIGN
        if not self.switches:
            self.switches.append(LeaseSwitch(policy_version=1, chunk=chunk, announced_at=time.time()))
        if self.switches[0].chunk != chunk:
            return None  # 409: v1 is recorded at another chunk
        nonce = switch_nonce(
            key=KEY, worker_id=self.lease.worker_id, step=self.lease.step, batch_index=self.lease.batch_index,
            policy_version=1, chunk=chunk,
        )  # fmt: skip
        return VersionSwitch(1, self.files[1], nonce)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("versions")
    return {v: save_policy(make_tiny_lm(seed=v).state_dict(), root / f"v{v}.safetensors") for v in range(2)}


def worker_backend() -> HFBackend:
    return HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER, decode="dynamic")


def judge(batch: RolloutBatch, record, files: dict[int, Path]) -> list:
    validator = VersionedValidator(HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER), files, RUN, CHECKS)
    return validator.judge(batch, record, newest_version=1, batch_id="b")


def attack(behaviour: str, files: dict[int, Path]) -> tuple[RolloutBatch, LeaseRecord]:
    """The behaviour's batch for a fresh lease, and the lease's record with the switches it announced."""
    lease, record = RUN.lease(f"w-{behaviour.replace('_', '-')}", 0, 0)
    versions = Versions(files, lease)
    worker = HostileWorker(behaviour, RUN.encode, RUN.score, RUN.prompt_tokens, RUN.num_tasks, versions=versions)
    batch = worker.answer(lease, worker_backend())
    return batch, record.model_copy(update={"switches": versions.switches})


@pytest.mark.parametrize("behaviour", [n for n in SPAN_ATTACKS if not ATTACKS[n].refused])
def test_each_span_forgery_is_rejected_with_its_own_reason(files, behaviour):
    batch, record = attack(behaviour, files)
    assert batch.policy_version == 0 and any(s.spans for s in batch.samples)
    verdicts = judge(batch, record, files)
    assert not any(v.accepted for v in verdicts)
    own = {v.reason for v in verdicts} - FOLLOWERS
    expected = {Reason(r) for r in ATTACKS[behaviour].expected}
    assert own & expected and own <= expected, [(v.reason, v.detail) for v in verdicts]
    assert Reason(ATTACKS[behaviour].expected[0]) in own  # the attack's first reason is always there


@pytest.mark.parametrize("behaviour", [n for n in SPAN_ATTACKS if ATTACKS[n].refused])
def test_the_refused_span_forgeries_break_a_submission_rule(files, behaviour):
    batch, _ = attack(behaviour, files)
    spanned = [s for s in batch.samples if s.spans]
    assert spanned
    for s in spanned:
        problem = spans_problem(s.spans or [], len(s.completion_tokens), start_version=0, max_versions=Versions.max_versions)
        if behaviour == "too_many_spans":
            assert problem is not None and "at most 4 versions per sample" in problem
        else:  # future_span_version: well-formed, but its version is not committed (the orchestrator's 422)
            assert problem is None and future_span(s.spans or [], 1) is not None


def test_an_honest_switch_is_accepted_and_the_token_by_token_decode_reproduces_it(files):
    """The control: the same lease, decoded with the same in-flight switch and claimed as it was, passes;
    and ``decode_switching_at`` (the mid-chunk attack's decode) is the backend's decode with a free
    switch point: switched at the same chunk boundary, it samples the same tokens, log-probs and proofs."""
    lease, record = RUN.lease("w-control", 0, 0)
    versions = Versions(files, lease)
    worker = HostileWorker("partial_switch", RUN.encode, RUN.score, RUN.prompt_tokens, RUN.num_tasks, versions=versions)
    batch, start, version = worker._switched(lease, worker_backend())
    assert (start, version) == (0, 1) and any(points(s) == [(0, 0), (1, 32)] for s in batch.samples)
    record = record.model_copy(update={"switches": versions.switches})
    assert {v.reason for v in judge(batch, record, files)} == {Reason.ACCEPTED}
    prompts = [s.prompt_tokens for s in batch.samples]
    seeds = [s.sampling_seed for s in batch.samples]
    switch = versions.newer(0, SPAN_ALIGN)  # the recorded switch again: the same nonce
    assert switch is not None and switch.nonce is not None
    completions = decode_switching_at(worker_backend(), prompts, seeds, sampling_params(lease), switch, 32)
    for sample, completion in zip(batch.samples, completions, strict=True):
        assert list(completion.completion_tokens) == sample.completion_tokens
        assert max(abs(a - b) for a, b in zip(completion.logprobs, sample.inference_logprobs, strict=True)) < 1e-4
        assert len(completion.proofs) == len(sample.proofs)
