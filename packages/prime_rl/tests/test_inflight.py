"""In-flight weight updates: a real HF decode that switches versions mid-sample, verified exactly.

The worker's backend switches at proof-chunk boundaries (keep-KV) and records version spans; the
validator re-derives each span with its own version by chained forwards. Three tiny models built
in code (seeds 0, 1, 2) are policy versions 0, 1, 2; every forgery below starts from a real decode.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest
from inflight_harness import VersionedValidator, commit_during_second_lease, free_port, worker_loop_config
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

from prime_rl.api.assignment import switch_nonce
from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import LeaseRecord, LeaseSwitch, RolloutBatch, RolloutSample
from prime_rl.api.spans import SPAN_ALIGN, VersionSpan, future_span, spans_problem
from prime_rl.inference.backend import HFBackend
from prime_rl.inference.contract import PROOF_CHUNK, VersionSwitch
from prime_rl.orchestrator.records import batch_rows, rollout_samples
from prime_rl.orchestrator.store import BATCH_SCHEMA
from prime_rl.validator.checks import Reason
from prime_rl.validator.spans import proof_reason
from prime_rl.validator.verdicts import validate_batch
from prime_rl.weights.files import save_policy
from prime_rl.worker.inflight import CommittedVersions

from .conftest import INFLIGHT

KEY = b"inflight-test-assignment-key"
TOKENIZER = make_tiny_tokenizer()
MAX_NEW = 96  # three proof chunks: room for two switches
RUN = TinyRun(KEY, TOKENIZER, lambda t: f"{t}*{t + 7}=", 12, group_size=4, prompts_per_batch=2, max_new_tokens=MAX_NEW)
# A run allows one switch per lease (orchestrator/switches.py); the validator's chained forwards are
# general, and these validator tests also chain three versions (records made by hand), so their checks
# allow three spans.
CHECKS = dataclasses.replace(RUN.checks(*INFLIGHT), max_versions_per_sample=3)
FOLLOWERS = {Reason.LEASE_REJECTED, Reason.GROUP_REJECTED}


class Offer:
    """A version source that has ``versions[i]`` ready from the ``after[i]``-th boundary it is asked at,
    and answers each switch with the nonce the orchestrator would give the lease ``w-inflight`` s0 b0
    (``switches``: the records it would keep)."""

    def __init__(self, files: dict[int, Path], after: dict[int, int], max_versions: int = 4) -> None:
        self.files, self.after, self.max_versions, self.asked = files, after, max_versions, 0
        self.switches: list[LeaseSwitch] = []

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        self.asked += 1
        ready = [v for v, n in self.after.items() if v > current and self.asked >= n]
        if not ready:
            return None
        version, chunk = max(ready), boundary // PROOF_CHUNK
        self.switches.append(LeaseSwitch(policy_version=version, chunk=chunk, announced_at=0.0))
        nonce = switch_nonce(key=KEY, worker_id="w-inflight", step=0, batch_index=0, policy_version=version, chunk=chunk)
        return VersionSwitch(version, self.files[version], nonce)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("versions")
    return {v: save_policy(make_tiny_lm(seed=v).state_dict(), root / f"v{v}.safetensors") for v in range(3)}


def worker_backend(files: dict[int, Path], offer: Offer | None) -> HFBackend:
    backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER, decode="dynamic")
    backend.version_source = offer
    return backend


def Validator(files: dict[int, Path]) -> VersionedValidator:
    """The validator's one backend, loading each version in place (every judgement from v0, loads counted)."""
    backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER)
    return VersionedValidator(backend, files, RUN, CHECKS, from_v0=True)


SWITCHES = {"none": None, "one": {1: 1}, "two": {1: 1, 2: 2}}
"""Honest decodes of one lease: no switch; v1 from the first chunk boundary (token 32); and v2 from
the second (token 64) too. Decoded once per module (a decode is the slow part of these tests)."""


RECORD = RUN.lease("w-inflight", 0, 0)[1]
RECORDS: dict[str, LeaseRecord] = {}
"""The orchestrator's record of the lease after each decode's announced switches (filled by ``decodes``)."""


@pytest.fixture(scope="module")
def decodes(files: dict[int, Path]) -> dict[str, RolloutBatch]:
    lease, _ = RUN.lease("w-inflight", 0, 0)
    out = {}
    for name, after in SWITCHES.items():
        offer = Offer(files, after) if after else None
        backend = worker_backend(files, offer)
        out[name] = RUN.worker("honest").answer(lease, backend)
        assert backend.policy_version == (max(after) if after else 0)
        RECORDS[name] = RECORD.model_copy(update={"switches": offer.switches if offer else []})
    return out


def own_reasons(verdicts) -> set[str]:
    return {v.reason for v in verdicts if not v.accepted} - FOLLOWERS


def with_spans(batch: RolloutBatch, spans_of) -> RolloutBatch:
    """``batch`` with each sample's spans replaced by ``spans_of(sample)`` (a list of (version, token) or None)."""
    samples = []
    for s in batch.samples:
        spans = spans_of(s)
        samples.append(
            s.model_copy(update={"spans": None if spans is None else [VersionSpan(policy_version=v, first_token=b) for v, b in spans]})
        )
    return batch.model_copy(update={"samples": samples})


def pairs(sample: RolloutSample) -> list[tuple[int, int]] | None:
    return None if sample.spans is None else [(s.policy_version, s.first_token) for s in sample.spans]


# ------------------------------------------------------------------ the decode


def test_the_decode_switches_at_the_first_chunk_boundary_after_a_version_is_ready(decodes):
    plain, switched = decodes["none"], decodes["one"]  # v1 ready when first asked: at token 32
    assert PROOF_CHUNK == SPAN_ALIGN
    assert switched.policy_version == 0  # the batch states its start version
    long = [i for i, s in enumerate(plain.samples) if len(s.completion_tokens) > 32]
    assert long, "the decode needs samples longer than one chunk"
    for i, (p, s) in enumerate(zip(plain.samples, switched.samples, strict=True)):
        # Up to the boundary the two decodes are the same draw (same weights, same seeds) ...
        assert s.completion_tokens[:32] == p.completion_tokens[:32]
        assert s.inference_logprobs[:32] == p.inference_logprobs[:32]
        # ... every sample running at the switch records it, the others stay one-version samples.
        assert pairs(s) == ([(0, 0), (1, 32)] if i in long else None)
    assert any(s.completion_tokens[32:] != p.completion_tokens[32:] for s, p in zip(switched.samples, plain.samples, strict=True))


def test_committed_versions_offers_only_downloaded_committed_versions(tmp_path):
    (tmp_path / "v2").write_bytes(b"x")
    committed = [1]
    clock = [0.0]
    announced: list[tuple[int, int, int, int]] = []

    def announce(step: int, batch_index: int, version: int, chunk: int) -> int:
        announced.append((step, batch_index, version, chunk))
        return 1000 + chunk

    source = CommittedVersions(
        lambda: committed[0], lambda: 2, lambda v: tmp_path / f"v{v}", max_versions=4, poll_s=1.0,
        announce=announce, clock=lambda: clock[0],
    )  # fmt: skip
    source.lease = (0, 3)
    assert source.newer(0, 32) is None  # v1 is committed but not downloaded (no file), v2 downloaded but not committed
    committed[0] = 2
    assert source.newer(0, 32) is None  # the committed version is asked again only after poll_s
    clock[0] = 1.0
    assert announced == []  # nothing was ready: no request
    assert source.newer(0, 64) == VersionSwitch(2, tmp_path / "v2", 1002) and source.newer(2, 96) is None
    assert announced == [(0, 3, 2, 2)]  # announced for the lease, at the boundary asked about


# ------------------------------------------------------------------ the validator


def test_an_honest_mixed_version_lease_is_accepted_exactly_each_version_loaded_once(files, decodes):
    batch, record = decodes["two"], RECORDS["two"]  # v1 from token 32, v2 from token 64
    spans = [pairs(s) for s in batch.samples]
    assert [(0, 0), (1, 32), (2, 64)] in spans, spans  # some sample spans all three versions
    validator = Validator(files)
    verdicts = validator.judge(batch, record)
    assert [v.reason for v in verdicts] == ["ok"] * len(batch.samples), [(v.reason, v.detail) for v in verdicts]
    assert validator.loads == [1, 2]  # each further version once for the whole batch
    for v, s in zip(verdicts, batch.samples, strict=True):  # fp32: the chained forwards reproduce the decode
        assert max(abs(a - b) for a, b in zip(v.logprobs, s.inference_logprobs, strict=True)) < 1e-4


def test_a_span_claiming_a_newer_version_than_generated_it_is_span_version_forged(files, decodes):
    """The switch to v1 at 32 was announced (recorded), but the worker went on with v0."""
    batch, record = decodes["none"], RECORDS["one"]  # all of it generated with v0 ...
    forged = with_spans(batch, lambda s: [(0, 0), (1, 32)] if len(s.completion_tokens) > 32 else None)  # ... labelled v1 from 32
    verdicts = Validator(files).judge(forged, record)
    assert own_reasons(verdicts) == {Reason.SPAN_VERSION_FORGED}, [(v.reason, v.detail) for v in verdicts]


def test_a_switch_made_before_its_announced_boundary_is_span_boundary_mismatch(files, decodes):
    """The worker announced v1 at chunk 2 (token 64) and claims it there, but switched at 32: the
    spans match the record, the proofs name the mismatch."""
    batch = decodes["one"]  # switched at 32
    record = RECORD.model_copy(update={"switches": [LeaseSwitch(policy_version=1, chunk=2, announced_at=0.0)]})
    shifted = with_spans(batch, lambda s: [(0, 0), (1, 64)] if len(s.completion_tokens) > 64 else None)
    verdicts = Validator(files).judge(shifted, record)
    reasons = own_reasons(verdicts)
    # Samples longer than 64 fail in span 0's tail; those ending in (32, 64] now claim v0 for v1's tokens.
    assert Reason.SPAN_BOUNDARY_MISMATCH in reasons and reasons <= {Reason.SPAN_BOUNDARY_MISMATCH, Reason.PROOF_FAILED}


def test_a_span_of_an_uncommitted_version_is_span_version_future_before_any_prefill(files, decodes):
    batch, record = decodes["one"], RECORDS["one"]
    validator = Validator(files)
    verdicts = validator.judge(batch, record, newest_version=0)  # v1 is not committed yet
    assert own_reasons(verdicts) == {Reason.SPAN_VERSION_FUTURE} and validator.loads == []


def test_dropping_or_merging_a_recorded_switch_on_one_sample_is_caught_before_any_prefill(files, decodes):
    batch, record = decodes["two"], RECORDS["two"]
    three = next(i for i, s in enumerate(batch.samples) if pairs(s) == [(0, 0), (1, 32), (2, 64)])
    dropped = with_spans(batch, lambda s: None if s is batch.samples[three] else pairs(s))
    merged = with_spans(batch, lambda s: [(0, 0), (2, 32)] if s is batch.samples[three] else pairs(s))
    for forgery, reason in ((dropped, Reason.SPAN_MISSING_MANDATORY), (merged, Reason.SPAN_BOUNDARY_MISMATCH)):
        validator = Validator(files)
        verdicts = validator.judge(forgery, record)
        assert own_reasons(verdicts) == {reason} and validator.loads == []


def test_spans_dropped_on_every_sample_are_span_missing_mandatory(files, decodes):
    """The lease's record says it switched at 32: every sample longer than that must carry the span."""
    batch, record = decodes["one"], RECORDS["one"]
    verdicts = Validator(files).judge(with_spans(batch, lambda s: None), record)
    assert own_reasons(verdicts) == {Reason.SPAN_MISSING_MANDATORY}


def test_malformed_spans_in_a_stored_batch_are_span_malformed(files, decodes):
    batch, record = decodes["one"], RECORDS["one"]
    bad = with_spans(batch, lambda s: [(0, 0), (1, 40)] if pairs(s) else None)  # not a chunk boundary
    assert own_reasons(Validator(files).judge(bad, record)) == {Reason.SPAN_MALFORMED}


def test_proof_failures_are_named_by_where_they_fall():
    spans = [VersionSpan(policy_version=0, first_token=0), VersionSpan(policy_version=1, first_token=64)]
    # chunks 0,1 are span 0; 2,3 span 1
    assert proof_reason([False, True, True, True], spans)[0] == "span_boundary_mismatch"  # span 0's tail
    assert proof_reason([False, False, True, True], spans)[0] == "span_version_forged"  # all of span 1
    assert proof_reason([False, False, True, False], spans)[0] == "span_boundary_mismatch"  # span 1's head only
    assert proof_reason([False, False, False, True], spans)[0] == "toploc_mismatch"
    assert proof_reason([True, False, False, False], spans)[0] == "toploc_mismatch"


# ------------------------------------------------------------------ the wire


def span_list(*points: tuple[int, int]) -> list[VersionSpan]:
    return [VersionSpan(policy_version=v, first_token=b) for v, b in points]


@pytest.mark.parametrize(
    ("points", "max_versions", "message"),
    [
        ([], 4, "spans is empty"),
        ([(1, 0)], 4, "it must be the lease's version from token 0"),
        ([(0, 32)], 4, "it must be the lease's version from token 0"),
        ([(0, 0), (1, 32), (2, 32)], 4, "is not after"),
        ([(0, 0), (1, 40)], 4, "not a multiple of the proof chunk 32"),
        ([(0, 0), (1, 96)], 4, "not inside the completion (96 tokens)"),
        ([(0, 0), (2, 32), (1, 64)], 4, "not newer than"),
        ([(0, 0), (1, 32), (2, 64)], 2, "at most 2 versions per sample"),
    ],
)
def test_each_span_rule_has_its_own_message(points, max_versions, message):
    problem = spans_problem(span_list(*points), 96, start_version=0, max_versions=max_versions)
    assert problem is not None and message in problem


def test_good_spans_pass_and_future_ones_are_found():
    spans = span_list((3, 0), (4, 32), (6, 64))
    assert spans_problem(spans, 65, start_version=3, max_versions=4) is None
    assert future_span(spans, 6) is None and future_span(spans, 5) == spans[2]


def test_spans_survive_the_store_and_absent_spans_stay_absent(decodes):
    batch = decodes["one"]
    table = pa.Table.from_pydict(dict(batch_rows(batch)), schema=BATCH_SCHEMA)
    assert rollout_samples(table) == batch.samples
    assert any(s.spans is None for s in batch.samples) and any(s.spans for s in batch.samples)


def test_submission_refuses_bad_spans_with_422_and_stores_good_ones(server_factory, batch_for):
    server = server_factory(*INFLIGHT)
    client = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    reg = client.register()
    lease = client.get_tasks(reg.worker_id)
    batch = batch_for(lease)  # two-token completions at version 0 (the only committed one)
    cases = {
        "it must be the lease's version from token 0": [(1, 0)],
        "is not inside the completion": [(0, 0), (1, 32)],  # 2 tokens: no boundary fits
    }
    for message, points in cases.items():
        bad = with_spans(batch, lambda s, points=points: points)
        with pytest.raises(ClientRequestError) as error:
            client.submit_rollouts(bad)
        assert error.value.status == 422 and error.value.error == "bad_spans" and message in error.value.message
    long = batch.model_copy(
        update={
            "samples": [
                s.model_copy(update={"completion_tokens": [4] * 40, "inference_logprobs": [-0.5] * 40})
                for s in batch.samples
            ]
        }
    )
    with pytest.raises(ClientRequestError) as error:
        client.submit_rollouts(with_spans(long, lambda s: [(0, 0), (1, 32)]))
    assert error.value.status == 422 and "not committed" in error.value.message
    client.submit_rollouts(with_spans(batch, lambda s: [(0, 0)]))
    stored = client.pending().batches[0].samples
    assert [pairs(s) for s in stored] == [[(0, 0)]] * len(stored)


# ------------------------------------------------------------------ a real worker, over HTTP


@pytest.mark.slow
@pytest.mark.timeout(600)  # two 8-sample leases of 64 tokens and a validation: 274 s on a loaded 2-core box
def test_a_worker_switches_mid_lease_when_a_version_is_committed_and_the_validator_accepts_it(tmp_path, tiny_lm_dir):
    """A ``Worker`` with ``workers.inflight_updates`` follows shardcast, answers its second lease while
    the orchestrator commits v1 (the trainer's claim and commit are played from inside its first
    chunk-boundary check, so the commit lands mid-lease), switches, submits spans that pass the
    submission rules, and the validator accepts the stored batch by chained forwards."""
    import shardcast
    from prime_rl.orchestrator.server import OrchestratorServer
    from prime_rl.tasks import load_tasks
    from prime_rl.validator.checks import Checks
    from prime_rl.worker.process import Worker

    origin_port = free_port()
    config = worker_loop_config(tmp_path / "run", tiny_lm_dir, origin_port, *INFLIGHT)
    v1 = save_policy(make_tiny_lm(seed=1).state_dict(), tmp_path / "v1" / "model.safetensors")
    with (
        OrchestratorServer(config, load_tasks(config.tasks)) as server,
        shardcast.Origin(tmp_path / "origin", port=origin_port) as origin,
        OrchestratorClient(server.url, admin_token=server.admin_token) as trainer,
    ):
        worker = Worker(config, "worker-0")
        source = worker.backend.version_source
        assert isinstance(source, CommittedVersions)
        origin.publish(v1, version=1)  # downloaded early, but not committed: no switch in the first lease
        source.newer = commit_during_second_lease(worker, server, trainer, source)  # type: ignore[method-assign]
        worker.run_loop()
        assert worker.submitted == 2 and worker.backend.policy_version == 1
        second = trainer.pending().batches[0]
        assert second.policy_version == 0 and second.step == 0
        switched = [pairs(s) for s in second.samples if s.spans]
        assert switched and all(p[0] == (0, 0) and p[1][0] == 1 for p in switched), switched
        worker.close()

        backend = HFBackend(tiny_lm_dir)
        files = {0: worker.store.path(0), 1: v1}

        def backend_for(version: int) -> HFBackend:
            if version != backend.policy_version:
                backend.load_weights(files[version], version)
            return backend

        checks = Checks.from_config(
            config, vocab_size=100, eos_token_ids=backend.eos_token_ids, assignment_key=server.trusted.assignment_key,
            hidden_size=backend.model.config.hidden_size,
        )  # fmt: skip
        verdicts = validate_batch(
            second, tasks=worker.tasks, backend_for=backend_for, checks=checks, newest_version=1,
            decode=lambda t: backend.tokenizer.decode(list(t), skip_special_tokens=True),
        )  # fmt: skip
        assert {v.reason for v in verdicts} == {Reason.ACCEPTED}, [(v.reason, v.detail) for v in verdicts]
