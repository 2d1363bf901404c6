"""The commit-reveal switch record (issue 38: "switch points leave the worker no choice worth having").

A worker announces an in-flight switch (``POST /leases/switch``); the orchestrator records the
first announcement per (lease, version) durably and answers a keyed nonce; every token from the
boundary on is sampled with ``span_seed(seed, nonce)``; the validator recomputes the nonce from the
lease's record and holds every sample to it. Here: the endpoint's rules over HTTP (and across a
restart), the speed cap on a stepped clock, and a real tiny-model decode through a real
orchestrator, where the honest announced switch is accepted with 0 rejects (fp32) and every other
candidate a worker could decode (another switch point, no switch, the lease seed kept) is rejected.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from inflight_harness import (  # tests/support
    VersionedValidator,
    commit_next,
    hold_lease_while_v1_commits,
    other_worker,
)
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

from prime_rl.api.assignment import AssignmentError, span_seed, switch_nonce
from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import (
    ClaimRequest,
    CommitRequest,
    DoneRequest,
    LeaseDone,
    RolloutBatch,
    SwitchRequest,
    Verdict,
)
from prime_rl.api.spans import lease_digest
from prime_rl.inference.backend import HFBackend
from prime_rl.inference.contract import PROOF_CHUNK, VersionSwitch
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.orchestrator.switches import mandatory_problem
from prime_rl.validator.checks import Reason
from prime_rl.weights.files import save_policy
from prime_rl.worker.inflight import CommittedVersions

from .conftest import INFLIGHT, make_batch, make_config
from .ledger_support import _accept, _batch, _ledger, _submit

FOLLOWERS = {Reason.LEASE_REJECTED, Reason.GROUP_REJECTED}


def own_reasons(verdicts: list[Verdict]) -> set[str]:
    return {v.reason for v in verdicts if not v.accepted} - FOLLOWERS


# ------------------------------------------------------------------ the nonce


def test_switch_nonce_known_answer_and_what_it_depends_on():
    key = b"0123456789abcdef"
    where = {"worker_id": "w1", "step": 3, "batch_index": 2}
    # HMAC-SHA256(key, "prime-rl/switch/w1/3/2/4/1"), first 8 bytes big-endian, top bit cleared.
    assert switch_nonce(key=key, **where, policy_version=4, chunk=1) == 3137233886958041046
    reference = hmac.new(key, b"prime-rl/switch/w1/3/2/4/1", hashlib.sha256).digest()[:8]
    assert int.from_bytes(reference, "big") & (2**63 - 1) == 3137233886958041046
    others = {
        switch_nonce(key=key, **where, policy_version=4, chunk=2),
        switch_nonce(key=key, **where, policy_version=5, chunk=1),
        switch_nonce(key=key, worker_id="w1", step=3, batch_index=3, policy_version=4, chunk=1),
        switch_nonce(key=b"another key, 16+", **where, policy_version=4, chunk=1),
    }
    assert len(others) == 4 and 3137233886958041046 not in others
    assert span_seed(7, 3137233886958041046) != span_seed(7, switch_nonce(key=key, **where, policy_version=4, chunk=2))
    with pytest.raises(AssignmentError, match="chunk must be >= 1"):
        switch_nonce(key=key, **where, policy_version=4, chunk=0)


# ------------------------------------------------------------------ the endpoint


def refusal(call: Any) -> tuple[int, str, str]:
    with pytest.raises(ClientRequestError) as error:
        call()
    return error.value.status, error.value.error, error.value.message


OVERRIDES = (*INFLIGHT, "--sampling.max_new_tokens", "256", "--orchestrator.max_open_leases", "4")


def test_the_first_announcement_per_lease_and_version_wins_and_survives_a_restart(tmp_path):
    config = make_config(tmp_path, *OVERRIDES)
    server = OrchestratorServer(config, _tasks()).start()
    try:
        trainer = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
        worker = OrchestratorClient(server.url, retries=0)
        worker_id = worker.register("switcher").worker_id
        lease = worker.get_tasks(worker_id)  # fixes v0
        where = {"step": lease.step, "batch_index": lease.batch_index}

        def announce(version: int, chunk: int) -> int:
            return worker.announce_switch(worker_id, **where, policy_version=version, chunk=chunk).nonce

        status, error, message = refusal(lambda: announce(1, 1))
        assert (status, error) == (422, "bad_switch") and "not committed" in message
        feeder = other_worker(server.url)
        assert commit_next(feeder, trainer) == 1
        status, error, _ = refusal(lambda: announce(0, 1))
        assert (status, error) == (409, "conflict")  # v0 is the lease's own version: not newer
        first = announce(1, 2)
        key = server.trusted.assignment_key
        assert first == switch_nonce(key=key, worker_id=worker_id, **where, policy_version=1, chunk=2)
        assert announce(1, 2) == first  # an identical retry: the same answer
        status, error, message = refusal(lambda: announce(1, 1))  # another switch point for v1
        assert (status, error) == (409, "conflict") and "announced for this lease at chunk 2" in message
        assert commit_next(feeder, trainer) == 2
        status, _, message = refusal(lambda: announce(2, 3))  # a second switch: a second reroll (issue 46)
        assert status == 409 and "at most one switch" in message
        assert commit_next(feeder, trainer) == 3
        status, _, message = refusal(lambda: announce(3, 4))
        assert status == 409 and "at most one switch" in message
        # chunk 0; a lease the caller does not hold (leases are per worker: another worker's step and
        # index name a lease of its own, here answered: 409; an index it never had: 404); a wrong token
        raw = {"worker_id": worker_id, **where, "policy_version": 3, "chunk": 0}
        answer = requests.post(server.url + "/leases/switch", json=raw, headers={"Authorization": f"Bearer {worker.worker_token}"}, timeout=10)
        assert answer.status_code == 400 and answer.json()["error"] == "bad_request"
        status, _, message = refusal(lambda: feeder.client.announce_switch(feeder.worker_id, **where, policy_version=3, chunk=1))
        # refused either way: 409 while the orchestrator still holds the answered lease, 404 once a trainer
        # commit has folded it into the totals (leases fold at every commit since the run's record, issue 44)
        assert (status == 409 and "answered or expired" in message) or status == 404
        status, error, _ = refusal(
            lambda: feeder.client.announce_switch(feeder.worker_id, step=0, batch_index=99, policy_version=3, chunk=1)
        )
        assert (status, error) == (404, "not_found")
        status, error, _ = refusal(
            lambda: OrchestratorClient(server.url, retries=0, worker_token="wrong").announce_switch(
                worker_id, **where, policy_version=1, chunk=2
            )
        )
        assert (status, error) == (401, "unauthorized")
    finally:
        server.stop()
    # The records are in the store: a restarted orchestrator answers the same and refuses the same.
    server = OrchestratorServer(config, _tasks()).start()
    try:
        assert announce_again(server, worker, worker_id, where, 1, 2) == first
        with pytest.raises(ClientRequestError) as error:
            announce_again(server, worker, worker_id, where, 1, 3)
        assert error.value.status == 409
        record = server.ledger.leases.get(worker_id, lease.batch_index).record
        assert [(s.policy_version, s.chunk) for s in record.switches] == [(1, 2)]
        # Done over HTTP: the first digest stands, a retry answers the same, another digest is 409.
        worker.base_url = server.url
        batch = make_batch(lease, 0)
        declared = worker.declare_done(worker_id, **where, digest=lease_digest(batch.samples))
        assert worker.declare_done(worker_id, **where, digest=lease_digest(batch.samples)) == declared
        status, _, _ = refusal(lambda: worker.declare_done(worker_id, **where, digest="0" * 64))
        assert status == 409
        # A submitted batch's stored lease (the validator's, in GET /validator/pending) keeps the records.
        answer = worker.submit_rollouts(batch)
        stored = server.ledger.batches[answer.batch_id].meta.lease
        assert stored is not None and [(s.policy_version, s.chunk) for s in stored.switches] == [(1, 2)]
        assert stored.done is not None and stored.done.digest == declared.digest
        status, _, message = refusal(lambda: announce_again(server, worker, worker_id, where, 3, 4))
        assert status == 409 and "answered or expired" in message  # a closed lease switches no more
    finally:
        server.stop()


def announce_again(server: OrchestratorServer, worker: OrchestratorClient, worker_id: str, where: dict, version: int, chunk: int) -> int:
    client = OrchestratorClient(server.url, retries=0, worker_token=worker.worker_token)
    return client.announce_switch(worker_id, **where, policy_version=version, chunk=chunk).nonce


def test_the_speed_cap_refuses_a_chunk_no_worker_can_have_reached(tmp_path):
    """``32 c > r_max * (now - issued_at) + 32`` is refused (422): at 64 tokens/s, chunk 2 (token 64)
    is allowed 0.5 s after the lease was issued, not before; chunk 1 at once."""
    now = [1000.0]
    config = make_config(tmp_path, *INFLIGHT, "--sampling.max_new_tokens", "256", "--orchestrator.max_decode_tokens_per_s", "64")
    with OrchestratorServer(config, _tasks(), clock=lambda: now[0]) as server:
        held = hold_lease_while_v1_commits(server, "fast")
        now[0] += 0.49
        status, error, message = refusal(lambda: held.announce(1, 2))
        assert (status, error) == (422, "bad_switch") and "max_decode_tokens_per_s" in message
        now[0] += 0.01
        assert held.announce(1, 2) > 0


def test_an_episode_run_announces_model_turns_below_max_turns_with_no_token_rules(tmp_path):
    """In a multi-turn run ``chunk`` is the model turn ``t`` the switch starts: ``1 <= t < max_turns``
    (here 3), the first announcement per version wins as for single-turn, and neither ``max_new_tokens``
    (32: one proof chunk, so a single-turn chunk 2 would be refused) nor the speed cap (64 tokens/s
    on a clock that never moves) applies. The nonce is keyed on the turn."""
    now = [1000.0]
    config = make_config(
        tmp_path, *INFLIGHT, "--sampling.max_new_tokens", "32", "--orchestrator.max_decode_tokens_per_s", "64",
        "--tasks.environment.name", "calculator",
        "--tasks.environment.max_turns", "3",
    )  # fmt: skip
    with OrchestratorServer(config, _tasks(), clock=lambda: now[0]) as server:
        assert server.ledger.episode_turns == 3
        held = hold_lease_while_v1_commits(server, "episodes")
        announce = held.announce
        status, error, message = refusal(lambda: announce(1, 3))
        assert (status, error) == (422, "bad_switch") and "max_turns 3" in message
        first = announce(1, 2)
        key = server.trusted.assignment_key
        assert first == switch_nonce(key=key, worker_id=held.worker_id, **held.where, policy_version=1, chunk=2)
        assert announce(1, 2) == first
        status, _, message = refusal(lambda: announce(1, 1))  # another turn for v1: the first stands
        assert status == 409 and "announced for this lease at chunk 2" in message
        assert commit_next(held.feeder, held.trainer) == 2
        status, _, message = refusal(lambda: announce(2, 2))
        assert status == 409 and "at most one switch" in message
        record = server.ledger.leases.get(held.worker_id, held.lease.batch_index).record
        assert [(s.policy_version, s.chunk) for s in record.switches] == [(1, 2)]


def test_a_single_turn_run_keeps_its_token_rules(config_for):
    """No environment: chunks stay proof chunks (the token rules of the tests above)."""
    assert _ledger(config_for)[0].episode_turns is None


# ------------------------------------------------------------------ the mandatory switch (part A)


def mandatory_ledger(config_for: Any, *overrides: str) -> tuple[Ledger, Any, Any, Any]:
    """A ledger with ``switch_deadline_s`` 2 (leases time out after 10 s), a worker holding a v0
    lease, and v1 committed 1 s after it was issued: ``(ledger, clock, worker, lease)``."""
    ledger, clock = _ledger(
        config_for, *INFLIGHT, "--orchestrator.switch_deadline_s", "2", "--sampling.max_new_tokens", "256", *overrides
    )
    worker = ledger.workers[ledger.register("switcher").worker_id]
    lease = ledger.lease(worker, None, None)
    feeder = ledger.workers[ledger.register("feeder").worker_id]
    fed = ledger.lease(feeder, None, None)
    clock.now += 1.0
    answer = _submit(ledger, feeder, _batch(fed))
    _accept(ledger, answer.batch_id)
    assert ledger.claim(ClaimRequest(step=0, min_samples=1, filter_zero_advantage=False)).ready
    ledger.commit(CommitRequest(step=0, policy_version=1))
    return ledger, clock, worker, lease


def long_batch(lease: Any, tokens: int) -> RolloutBatch:
    batch = _batch(lease)
    samples = [s.model_copy(update={"completion_tokens": [4] * tokens, "inference_logprobs": [-0.5] * tokens}) for s in batch.samples]
    return batch.model_copy(update={"samples": samples})


def test_a_lease_neither_switched_nor_done_by_the_deadline_is_void(config_for):
    ledger, clock, worker, lease = mandatory_ledger(config_for)
    clock.now += 2.5  # v1 was committed 2.5 s ago, deadline 2 s: nothing announced, nothing declared
    with pytest.raises(ApiFailure) as refused:
        _submit(ledger, worker, _batch(lease))
    assert refused.value.status == 409 and "the lease is void" in refused.value.message
    clock.now += 10
    assert ledger.expire_leases() == 1 and ledger.leases.expired(worker.worker_id) == 1  # counted as abandoned


def test_a_batch_submitted_before_the_deadline_needs_nothing(config_for):
    ledger, clock, worker, lease = mandatory_ledger(config_for)
    clock.now += 1.5
    assert not _submit(ledger, worker, _batch(lease)).duplicate


def test_a_switch_within_the_deadline_satisfies_it(config_for):
    ledger, clock, worker, lease = mandatory_ledger(config_for)
    clock.now += 1.0
    request = SwitchRequest(worker_id=worker.worker_id, step=0, batch_index=lease.batch_index, policy_version=1, chunk=1)
    ledger.switch(worker, request)
    clock.now += 5.0
    _submit(ledger, worker, _batch(lease))


def test_done_within_the_deadline_fixes_the_batch(config_for):
    ledger, clock, worker, lease = mandatory_ledger(config_for)
    batch = _batch(lease)
    digest = lease_digest(batch.samples)
    clock.now += 1.0
    declared = ledger.done(worker, DoneRequest(worker_id=worker.worker_id, step=0, batch_index=lease.batch_index, digest=digest))
    assert ledger.done(worker, DoneRequest(worker_id=worker.worker_id, step=0, batch_index=lease.batch_index, digest=digest)) == declared
    with pytest.raises(ApiFailure) as other:
        ledger.done(worker, DoneRequest(worker_id=worker.worker_id, step=0, batch_index=lease.batch_index, digest="0" * 64))
    assert other.value.status == 409
    with pytest.raises(ApiFailure) as switch_after_done:
        ledger.switch(worker, SwitchRequest(worker_id=worker.worker_id, step=0, batch_index=lease.batch_index, policy_version=1, chunk=1))
    assert switch_after_done.value.status == 409 and "declared done" in switch_after_done.value.message
    clock.now += 5.0
    rerolled = long_batch(lease, 2)  # the same shape, other tokens: not the declared batch
    rerolled = rerolled.model_copy(update={"samples": [s.model_copy(update={"completion_tokens": [5, 5]}) for s in rerolled.samples]})
    with pytest.raises(ApiFailure) as differs:
        _submit(ledger, worker, rerolled)
    assert differs.value.status == 409 and "differs from the digest declared done" in differs.value.message
    _submit(ledger, worker, batch)


def test_done_is_capped_by_speed_like_a_switch(config_for):
    """At 64 tokens/s, a lease declared done 1 s after it was issued can hold samples of at most
    64 + 32 = 96 tokens: a 97-token batch is refused at submission, 96 passes the rule."""
    ledger, _, worker, lease = mandatory_ledger(config_for, "--orchestrator.max_decode_tokens_per_s", "64")
    too_long = long_batch(lease, 97)
    where = {"worker_id": worker.worker_id, "step": 0, "batch_index": lease.batch_index}
    ledger.done(worker, DoneRequest(**where, digest=lease_digest(too_long.samples)))  # 1 s after the lease
    with pytest.raises(ApiFailure) as refused:
        _submit(ledger, worker, too_long)
    assert refused.value.status == 409 and "more than 64 tokens/s" in refused.value.message
    record = ledger.leases.get(worker.worker_id, lease.batch_index).record
    fits = long_batch(lease, 96)
    declared = record.model_copy(update={"done": LeaseDone(digest=lease_digest(fits.samples), declared_at=record.issued_at + 1.0)})
    assert mandatory_problem(
        declared, digest=lease_digest(fits.samples), longest=96, commit_times=ledger.commit_times, now=ledger.clock(),
        deadline_s=2.0, max_versions=4, max_tokens_per_s=64.0,
    ) is None  # fmt: skip


def test_done_survives_a_restart(config_for):
    ledger, clock, worker, lease = mandatory_ledger(config_for)
    digest = lease_digest(_batch(lease).samples)
    ledger.done(worker, DoneRequest(worker_id=worker.worker_id, step=0, batch_index=lease.batch_index, digest=digest))
    again = Ledger(ledger.config, ledger.tasks, ledger.store, clock=clock)
    assert again.leases.get(worker.worker_id, lease.batch_index).record.done == ledger.leases.get(worker.worker_id, lease.batch_index).record.done
    assert again.commit_times == ledger.commit_times
    clock.now += 5.0
    _submit(again, again.workers[worker.worker_id], _batch(lease))


class _Tasks:
    """The orchestrator's task set: RUN's prompts."""

    def __len__(self) -> int:
        return NUM_TASKS

    def prompt(self, task_id: int) -> str:
        return prompt_text(task_id)


def _tasks() -> _Tasks:
    return _Tasks()


# ------------------------------------------------------------------ a real decode through a real orchestrator

TOKENIZER = make_tiny_tokenizer()
NUM_TASKS, MAX_NEW = 12, 96


def prompt_text(task_id: int) -> str:
    return f"{task_id}*{task_id + 7}="


class SkipFirst(CommittedVersions):
    """A worker that lets the first chunk boundary pass and announces at the next one (a second
    candidate switch point)."""

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        return None if boundary == PROOF_CHUNK else super().newer(current, boundary)


class Forced:
    """A worker that switches to ``version`` at ``boundary`` with ``nonce`` (None: keeps the lease seeds),
    whatever the orchestrator recorded."""

    max_versions = 4

    def __init__(self, path: Path, version: int, boundary: int, nonce: int | None) -> None:
        self.switch, self.boundary = VersionSwitch(version, path, nonce), boundary

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        return self.switch if boundary == self.boundary and current < self.switch.version else None


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One lease (v0) of a real orchestrator, v1 committed while it is open, and the candidates a
    worker could decode for it: the honest one (announced at chunk 1, the first boundary), a second
    announcement at chunk 2 (refused), and forced switches the orchestrator never recorded."""
    root = tmp_path_factory.mktemp("switch")
    files = {v: save_policy(make_tiny_lm(seed=v).state_dict(), root / f"v{v}.safetensors") for v in range(2)}
    config = make_config(
        root, "--sampling.max_new_tokens", str(MAX_NEW), "--sampling.group_size", "4", "--sampling.stop", "[]",
        "--sampling.temperature", "1.0", *INFLIGHT,
    )  # fmt: skip
    server = OrchestratorServer(config, _tasks()).start()
    out: dict[str, Any] = {"server": server, "files": files}
    try:
        held = hold_lease_while_v1_commits(server, "switcher")
        trainer, worker, worker_id, lease = held.trainer, held.worker, held.worker_id, held.lease
        run = TinyRun(server.trusted.assignment_key, TOKENIZER, prompt_text, NUM_TASKS, group_size=4, prompts_per_batch=2, max_new_tokens=MAX_NEW)
        out["run"] = run

        def decode(version_source: Any) -> RolloutBatch:
            backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER, decode="dynamic")
            backend.version_source = version_source
            return run.worker("honest").answer(lease, backend)

        honest = held.source(files)
        out["honest"] = decode(honest)
        assert honest.announced == [(0, lease.batch_index, 1, 1)]
        nonce = worker.announce_switch(worker_id, step=0, batch_index=lease.batch_index, policy_version=1, chunk=1).nonce
        later = held.source(files, SkipFirst)
        out["no_switch"] = decode(later)  # its announcement at chunk 2 is refused: it cannot switch
        assert later.announced == []
        out["second_refusal"] = refusal(
            lambda: worker.announce_switch(worker_id, step=0, batch_index=lease.batch_index, policy_version=1, chunk=2)
        )
        out["at_chunk_2"] = decode(Forced(files[1], 1, 2 * PROOF_CHUNK, nonce))  # the nonce it holds, at the other point
        chunk_2_nonce = switch_nonce(key=server.trusted.assignment_key, worker_id=worker_id, step=0, batch_index=lease.batch_index, policy_version=1, chunk=2)
        out["at_chunk_2_own_nonce"] = decode(Forced(files[1], 1, 2 * PROOF_CHUNK, chunk_2_nonce))  # even with chunk 2's nonce
        out["lease_seed_kept"] = decode(Forced(files[1], 1, PROOF_CHUNK, None))  # the recorded point, tail rerolled on the lease seed
        worker.submit_rollouts(out["honest"])
        out["pending"] = next(b for b in trainer.pending(32).batches if b.worker_id == worker_id)
        yield out
    finally:
        server.stop()


def judge(state: dict[str, Any], batch: RolloutBatch, **lease_update: Any) -> list[Verdict]:
    """Validate ``batch`` as the answer to the stored lease (its record from the pending payload)."""
    files, run = state["files"], state["run"]
    record = state["pending"].lease
    if lease_update:
        record = record.model_copy(update=lease_update)
    validator = VersionedValidator(HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER), files, run, run.checks(*INFLIGHT))
    return validator.judge(batch, record, newest_version=1, batch_id=state["pending"].batch_id)


def spans_of(batch: RolloutBatch) -> set[tuple[tuple[int, int], ...]]:
    return {tuple((s.policy_version, s.first_token) for s in sample.spans or []) for sample in batch.samples}


def test_an_announced_switch_of_a_real_decode_is_accepted_exactly(switched):
    pending = switched["pending"]
    assert [(s.policy_version, s.chunk) for s in pending.lease.switches] == [(1, 1)]
    assert ((0, 0), (1, 32)) in spans_of(pending)  # the switch is in the stored batch
    verdicts = judge(switched, switched["honest"])
    assert [v.reason for v in verdicts] == ["ok"] * len(verdicts), [(v.reason, v.detail) for v in verdicts]
    for verdict, sample in zip(verdicts, switched["honest"].samples, strict=True):  # fp32
        assert max(abs(a - b) for a, b in zip(verdict.logprobs, sample.inference_logprobs, strict=True)) < 1e-4


def test_trying_a_second_switch_point_gains_nothing(switched):
    """After the honest candidate's announcement at chunk 1, a second announcement for v1 is 409, so
    a worker holding v1 has one switch point: the candidate without the switch lacks the mandatory
    span, and a candidate switched at chunk 2 (with the nonce it holds, or even with chunk 2's own)
    disagrees with the record."""
    status, error, message = switched["second_refusal"]
    assert (status, error) == (409, "conflict") and "at chunk 1" in message
    assert own_reasons(judge(switched, switched["no_switch"])) == {Reason.SPAN_MISSING_MANDATORY}
    assert ((0, 0), (1, 64)) in spans_of(switched["at_chunk_2"])
    for name in ("at_chunk_2", "at_chunk_2_own_nonce"):
        reasons = own_reasons(judge(switched, switched[name]))
        # samples longer than 64 claim the wrong boundary; those ending in (32, 64] miss the switch
        assert Reason.SPAN_BOUNDARY_MISMATCH in reasons, reasons
        assert reasons <= {Reason.SPAN_BOUNDARY_MISMATCH, Reason.SPAN_MISSING_MANDATORY}, reasons
    # Relabelled to the recorded point, the chunk-2 candidate's chunk 1 is v0's: the proofs say so.
    relabelled = relabel(switched["at_chunk_2"], 32)
    assert own_reasons(judge(switched, relabelled)) & {Reason.SPAN_BOUNDARY_MISMATCH, Reason.SPAN_VERSION_FORGED}


def test_a_tail_rerolled_on_the_lease_seed_is_sampling_mismatch(switched):
    """Switched at the recorded point, but the tail drawn with the lease seeds instead of the
    announced nonce's: every check but the sampler's passes."""
    batch = switched["lease_seed_kept"]
    assert spans_of(batch) == spans_of(switched["honest"])
    assert own_reasons(judge(switched, batch)) == {Reason.SAMPLING_FAILED}


def test_a_switch_without_a_record_is_span_unannounced(switched):
    assert own_reasons(judge(switched, switched["honest"], switches=[])) == {Reason.SPAN_UNANNOUNCED}


def relabel(batch: RolloutBatch, boundary: int) -> RolloutBatch:
    """``batch`` with every switch claimed at ``boundary`` (samples longer than it), none elsewhere."""
    from prime_rl.api.spans import VersionSpan

    samples = [
        s.model_copy(update={"spans": [VersionSpan(policy_version=0, first_token=0), VersionSpan(policy_version=1, first_token=boundary)]
                             if len(s.completion_tokens) > boundary else None})
        for s in batch.samples
    ]  # fmt: skip
    return batch.model_copy(update={"samples": samples})

