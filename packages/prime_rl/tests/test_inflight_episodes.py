"""In-flight weight updates on multi-turn episodes: versions switch only at a model turn's start.

A real HF episode lease (the tiny model built in code, fp32; three tiny models seeded 0, 1, 2 are
versions 0, 1, 2) switches to a newer version before a model turn; each turn's generate prefills
the whole context again with the weights loaded then (recompute-KV), and the validator re-derives
it with one prefill per version (``validator/episode_spans.py``). Every forgery starts from a real
decode. The switch record: the episode loop announces ``(lease, version, model turn)`` before the
turn (here to an in-process record that answers as the orchestrator does: the first announcement
per version stands, the nonce keyed on the turn), every episode draws the turns after a switch with
``switched_turn_seed``, and the validator holds each episode to the lease's records by turn index.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from calculator_tasks import TEMPLATE, segment_starts, sum_prompt, sum_tasks  # tests/support
from inflight_harness import VersionedValidator, hold_lease_while_v1_commits
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

from prime_rl.api.assignment import switch_nonce
from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import (
    LeaseRecord,
    LeaseSwitch,
    PendingBatch,
    RolloutBatch,
    RolloutSample,
    Segment,
    VersionSpan,
)
from prime_rl.api.segments import switched_turn_seed, turn_seed, turn_starts
from prime_rl.api.spans import spans_problem
from prime_rl.episodes import EpisodeEnv
from prime_rl.inference.backend import HFBackend
from prime_rl.inference.contract import VersionSwitch
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.validator.checks import Reason
from prime_rl.validator.episode_spans import episode_proof_reason
from prime_rl.validator.episodes import ModelSpan
from prime_rl.validator.verdicts import validate_batch
from prime_rl.weights.files import save_policy
from prime_rl.worker.episodes import build_episode_batch
from prime_rl.worker.inflight import CommittedVersions
from verifiers.envs import CalculatorEnv

from .conftest import INFLIGHT, make_config

KEY = b"inflight-episodes-test-key"
NUM_TASKS, GROUP, PER_BATCH, MAX_NEW, TURNS = 12, 2, 2, 5, 3
TOKENIZER = make_tiny_tokenizer()
RUN = TinyRun(KEY, TOKENIZER, sum_prompt, NUM_TASKS, GROUP, PER_BATCH, MAX_NEW)
TASKS = sum_tasks(NUM_TASKS)
# The calculator answers every wrong answer with feedback; the tiny random model is never right, so
# every episode plays all TURNS model turns (model, env, model, env, model).
ENV = EpisodeEnv(
    CalculatorEnv(max_turns=TURNS, feedback=True),
    TASKS,
    TOKENIZER,
    turn_template=TEMPLATE,
)
# A run allows one switch per lease (orchestrator/switches.py); the validator's chained forwards are
# general, and these validator tests also chain three versions (records made by hand), so their checks
# allow three spans.
CHECKS = dataclasses.replace(RUN.checks(*INFLIGHT), episode_env=ENV, max_versions_per_sample=3)
FOLLOWERS = {Reason.LEASE_REJECTED, Reason.GROUP_REJECTED}
LEASE, RECORD = RUN.lease("w-episodes", 0, 0)


def nonce(version: int, turn: int) -> int:
    return switch_nonce(
        key=KEY, worker_id=LEASE.worker_id, step=LEASE.step, batch_index=LEASE.batch_index,
        policy_version=version, chunk=turn,
    )  # fmt: skip


def recorded(*switches: tuple[int, int]) -> LeaseRecord:
    """The lease's record with the switches ``(version, turn)`` announced."""
    return RECORD.model_copy(
        update={"switches": [LeaseSwitch(policy_version=v, chunk=t, announced_at=time.time()) for v, t in switches]}
    )


class TurnOffer:
    """A version source with ``after[v]``: version ``v`` ready from the ``after[v]``-th time it is asked
    (the episode loop asks once before each model turn after the first). Each switch it offers is
    announced for the turn (``at_turn``) and recorded as the orchestrator records it, and answered with
    its nonce; ``nonces=False``: the switch is recorded but offered without a nonce, so the loop
    keeps the plain turn seeds (a worker ignoring the record's seeds)."""

    def __init__(
        self, files: dict[int, Path], after: dict[int, int], max_versions: int = 4, nonces: bool = True
    ) -> None:
        self.files, self.after, self.max_versions, self.nonces = files, after, max_versions, nonces
        self.asked, self.turns, self.switches = 0, [], []

    def at_turn(self, current: int, turn: int) -> VersionSwitch | None:
        self.asked += 1
        self.turns.append(turn)
        ready = [v for v, n in self.after.items() if v > current and self.asked >= n]
        if not ready:
            return None
        self.switches.append((max(ready), turn))
        return VersionSwitch(max(ready), self.files[max(ready)], nonce(max(ready), turn) if self.nonces else None)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("versions")
    return {v: save_policy(make_tiny_lm(seed=v).state_dict(), root / f"v{v}.safetensors") for v in range(3)}


SWITCHES = {"none": None, "one": {1: 1}, "two": {1: 1, 2: 2}, "plain_seeds": {1: 1}}
"""Plays of one lease: no switch; v1 from turn 1; v1 from turn 1 and v2 from turn 2 (honest); v1
from turn 1 recorded, but the later turns drawn with the plain turn seeds (not the record's)."""
RECORDS: dict[str, LeaseRecord] = {}
"""Each play's lease record, with the switches it announced."""


@pytest.fixture(scope="module")
def plays(files: dict[int, Path]) -> dict[str, RolloutBatch]:
    out = {}
    for name, after in SWITCHES.items():
        backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER, decode="dynamic")
        offer = TurnOffer(files, after, nonces=name != "plain_seeds") if after else None
        backend.version_source = offer
        out[name] = build_episode_batch(LEASE, backend, ENV, encode=RUN.encode)[0]
        assert backend.policy_version == (max(after) if after else 0)
        assert backend.version_source is offer  # detached only while the episodes played
        RECORDS[name] = recorded(*(offer.switches if offer is not None else []))
        if offer is not None:
            # announced before each model turn after the first, never inside one, by turn index
            assert offer.asked == TURNS - 1 and offer.turns == list(range(1, TURNS))
    assert [(s.policy_version, s.chunk) for s in RECORDS["two"].switches] == [(1, 1), (2, 2)]
    return out


def Validator(files: dict[int, Path]) -> VersionedValidator:
    """One backend loading each version in place as ``backend_for`` asks (loads counted)."""
    return VersionedValidator(HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER), files, RUN, CHECKS)


def pairs(sample: RolloutSample) -> list[tuple[int, int]] | None:
    return None if sample.spans is None else [(s.policy_version, s.first_token) for s in sample.spans]


def with_spans(batch: RolloutBatch, spans_of) -> RolloutBatch:
    samples = []
    for s in batch.samples:
        spans = spans_of(s)
        samples.append(
            s.model_copy(
                update={
                    "spans": None
                    if spans is None
                    else [VersionSpan(policy_version=v, first_token=b) for v, b in spans]
                }
            )
        )
    return batch.model_copy(update={"samples": samples})


def own_reasons(verdicts) -> set[str]:
    return {v.reason for v in verdicts if not v.accepted} - FOLLOWERS


# ------------------------------------------------------------------ the worker


def test_the_episode_loop_switches_only_at_model_turn_starts(plays):
    plain, one, two = plays["none"], plays["one"], plays["two"]
    assert one.policy_version == two.policy_version == 0  # the batch states its start version
    for p, s, t in zip(plain.samples, one.samples, two.samples, strict=True):
        starts = turn_starts(s.segments)
        assert len(starts) == TURNS
        assert pairs(s) == [(0, 0), (1, starts[1])]
        assert pairs(t) == [(0, 0), (1, turn_starts(t.segments)[1]), (2, turn_starts(t.segments)[2])]
        # turn 0 is v0's draw in every play: the switch comes after it, never inside it
        assert s.completion_tokens[: starts[1]] == p.completion_tokens[: starts[1]]
    # the switched plays draw their later turns from other weights
    assert any(
        s.completion_tokens != p.completion_tokens for s, p in zip(one.samples, plain.samples, strict=True)
    )


def test_turns_after_a_switch_draw_with_the_nonce_derived_seeds(plays):
    """Same weights, same record: the turns after the switch differ only by their seeds."""
    one, plain_seeds = plays["one"], plays["plain_seeds"]
    assert [pairs(s) for s in one.samples] == [pairs(s) for s in plain_seeds.samples]
    for s, q in zip(one.samples, plain_seeds.samples, strict=True):
        first = turn_starts(s.segments)[1]
        assert s.completion_tokens[:first] == q.completion_tokens[:first]
    assert any(s.completion_tokens != q.completion_tokens for s, q in zip(one.samples, plain_seeds.samples, strict=True))
    assert switched_turn_seed(7, 2, []) == turn_seed(7, 2)
    assert switched_turn_seed(7, 2, [nonce(1, 1)]) != turn_seed(7, 2)
    assert switched_turn_seed(7, 2, [nonce(1, 1), nonce(2, 2)]) != switched_turn_seed(7, 2, [nonce(1, 1)])


def test_committed_versions_announces_a_turn_switch_and_answers_its_nonce(tmp_path):
    (tmp_path / "v1").write_bytes(b"x")
    announced: list[tuple[int, int, int, int]] = []
    refuse = [False]

    def announce(step: int, batch_index: int, version: int, chunk: int) -> int:
        announced.append((step, batch_index, version, chunk))
        if refuse[0]:
            raise ClientRequestError(409, "conflict", "announced for this lease at chunk 2", "/leases/switch")
        return 500 + chunk

    source = CommittedVersions(
        lambda: 1, lambda: 1, lambda v: tmp_path / f"v{v}", max_versions=4, poll_s=0.0, announce=announce
    )
    assert source.at_turn(0, 1) is None and announced == []  # no lease set: no switch, no request
    source.lease = (4, 2)
    assert source.at_turn(0, 0) is None  # turn 0 is the lease's own version
    assert source.at_turn(0, 2) == VersionSwitch(1, tmp_path / "v1", 502)
    assert announced == [(4, 2, 1, 2)]  # chunk = the model turn
    source.lease, refuse[0] = (5, 0), True
    assert source.at_turn(0, 1) is None and source.at_turn(0, 2) is None  # refused: no switch, not asked again
    assert announced[1:] == [(5, 0, 1, 1)]


# ------------------------------------------------------------------ the validator


def test_an_honest_episode_lease_switching_at_turn_starts_is_accepted_one_prefill_per_version(files, plays):
    batch = plays["two"]
    validator = Validator(files)
    verdicts = validator.judge(batch, RECORDS["two"])
    assert [v.reason for v in verdicts] == [Reason.ACCEPTED] * len(verdicts), [
        (v.reason, v.detail) for v in verdicts
    ]
    assert validator.loads == [1, 2]  # each further version loaded once for the whole batch
    for v, s in zip(verdicts, batch.samples, strict=True):
        model = [i for start, g in segment_starts(s) if g.kind == "model" for i in range(start, start + g.length)]
        # fp32: each turn's log-probs under its own version, recomputed from a fresh prefix (recompute-KV)
        assert max(abs(v.logprobs[i] - s.inference_logprobs[i]) for i in model) < 1e-4
        assert all(v.logprobs[i] == 0.0 for i in range(len(s.completion_tokens)) if i not in model)


class _Tasks:
    """The orchestrator's task set: RUN's prompts."""

    def __len__(self) -> int:
        return NUM_TASKS

    def prompt(self, task_id: int) -> str:
        return TASKS.task(task_id).prompt


def test_an_honest_episode_lease_announcing_through_a_real_orchestrator_is_accepted(files, tmp_path):
    """A real orchestrator in a multi-turn run (calculator, max_turns 3): the worker's
    ``CommittedVersions`` announces v1 for model turn 1 of its open lease, the orchestrator records it
    and answers the nonce, the episodes draw turns 1 and 2 with the nonce's seeds, the stored batch
    carries the record, and the validator accepts every episode against it (fp32)."""
    config = make_config(
        tmp_path, *INFLIGHT, "--sampling.max_new_tokens", str(MAX_NEW), "--sampling.stop", "[]", "--sampling.temperature", "1.0",
        "--orchestrator.max_decode_tokens_per_s", "64", "--tasks.environment.name", "calculator",
        "--tasks.environment.max_turns", str(TURNS),
    )  # fmt: skip
    with OrchestratorServer(config, _Tasks()) as server:
        held = hold_lease_while_v1_commits(server, "episodes")
        trainer, worker, worker_id, lease = held.trainer, held.worker, held.worker_id, held.lease
        source = held.source(files)
        backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER, decode="dynamic")
        backend.version_source = source
        batch = build_episode_batch(lease, backend, ENV, encode=RUN.encode)[0]
        assert source.announced == [(lease.step, lease.batch_index, 1, 1)]
        assert all(pairs(s) == [(0, 0), (1, turn_starts(s.segments)[1])] for s in batch.samples)
        worker.submit_rollouts(batch)
        pending = next(b for b in trainer.pending(32).batches if b.worker_id == worker_id)
        assert pending.lease is not None and [(s.policy_version, s.chunk) for s in pending.lease.switches] == [(1, 1)]
        run = TinyRun(server.trusted.assignment_key, TOKENIZER, RUN.prompt_text, NUM_TASKS, GROUP, PER_BATCH, MAX_NEW)
        validator = Validator(files)
        verdicts = validate_batch(
            pending, tasks=run, backend_for=validator.backend_for, decode=run.decode,
            checks=dataclasses.replace(run.checks(*INFLIGHT), episode_env=ENV), newest_version=1,
        )  # fmt: skip
        assert [v.reason for v in verdicts] == [Reason.ACCEPTED] * len(verdicts), [(v.reason, v.detail) for v in verdicts]
        assert validator.loads == [1]


def test_an_episode_switch_with_no_record_is_span_unannounced_before_any_prefill(files, plays):
    validator = Validator(files)
    verdicts = validator.judge(plays["one"], RECORD)  # switched at turn 1, nothing announced
    assert own_reasons(verdicts) == {Reason.SPAN_UNANNOUNCED}, [(v.reason, v.detail) for v in verdicts]
    assert validator.loads == []


def test_a_candidate_switching_at_another_turn_than_recorded_is_span_boundary_mismatch(files, plays):
    """The worker announced v1 at turn 2, then submits the candidate it decoded switching at turn 1
    (or announced turn 1 and claims the switch from turn 2): the record fixes the turn."""
    late = with_spans(plays["one"], lambda s: [(0, 0), (1, turn_starts(s.segments)[2])])
    for batch, record in ((plays["one"], recorded((1, 2))), (late, RECORDS["one"])):
        validator = Validator(files)
        verdicts = validator.judge(batch, record)
        assert own_reasons(verdicts) == {Reason.SPAN_BOUNDARY_MISMATCH}, [(v.reason, v.detail) for v in verdicts]
        assert validator.loads == []


def test_turns_drawn_with_the_plain_turn_seeds_after_a_recorded_switch_are_sampling_mismatch(files, plays):
    verdicts = Validator(files).judge(plays["plain_seeds"], RECORDS["plain_seeds"])
    assert own_reasons(verdicts) == {Reason.SAMPLING_FAILED}, [(v.reason, v.detail) for v in verdicts]


def test_switched_episodes_with_every_span_dropped(files, plays):
    """Against the record: every episode still ran at turn 1, so each misses the recorded switch.
    With no record, nothing is mandatory: the later version's turns fail against v0."""
    dropped = with_spans(plays["one"], lambda s: None)
    assert own_reasons(Validator(files).judge(dropped, RECORDS["one"])) == {Reason.SPAN_MISSING_MANDATORY}
    assert own_reasons(Validator(files).judge(dropped, RECORD)) == {Reason.PROOF_FAILED}


def test_a_forged_span_version_on_an_episode_is_span_version_forged(files, plays):
    batch = plays["none"]  # every turn played by v0 ...
    forged = with_spans(batch, lambda s: [(0, 0), (1, turn_starts(s.segments)[2])])  # ... turn 2 labelled v1
    verdicts = Validator(files).judge(forged, recorded((1, 2)))  # announced like an honest worker
    assert own_reasons(verdicts) == {Reason.SPAN_VERSION_FORGED}, [(v.reason, v.detail) for v in verdicts]


def test_an_episode_dropping_or_moving_the_leases_switch_fails_the_record_before_any_prefill(files, plays):
    batch = plays["one"]
    dropped = with_spans(batch, lambda s: None if s is batch.samples[0] else pairs(s))
    # the same switch on another turn: turn indices are compared, not token indices
    moved = with_spans(
        batch, lambda s: [(0, 0), (1, turn_starts(s.segments)[2])] if s is batch.samples[0] else pairs(s)
    )
    for forgery, reason in ((dropped, Reason.SPAN_MISSING_MANDATORY), (moved, Reason.SPAN_BOUNDARY_MISMATCH)):
        validator = Validator(files)
        verdicts = validator.judge(forgery, RECORDS["one"])
        assert own_reasons(verdicts) == {reason}, [(v.reason, v.detail) for v in verdicts]
        assert verdicts[0].reason == reason
        assert validator.loads == []


def test_a_boundary_inside_a_model_turn_is_span_malformed(files, plays):
    batch = plays["one"]
    inside = with_spans(batch, lambda s: [(0, 0), (1, turn_starts(s.segments)[1] + 1)])
    verdicts = Validator(files).judge(inside, RECORDS["one"])
    assert own_reasons(verdicts) == {Reason.SPAN_MALFORMED}
    assert all(
        "first token of a model turn" in v.detail for v in verdicts if v.reason == Reason.SPAN_MALFORMED
    )


def test_episode_proof_failures_are_named_by_turns():
    turns = [ModelSpan(0, 5, 0), ModelSpan(8, 40, 1), ModelSpan(50, 5, 2)]  # chunks: 1, 2, 1
    spans = [VersionSpan(policy_version=0, first_token=0), VersionSpan(policy_version=1, first_token=8)]
    versions = [0, 1, 1]
    assert episode_proof_reason([False, True, True, True], turns, versions, spans)[0] == "span_version_forged"
    assert (
        episode_proof_reason([False, True, True, False], turns, versions, spans)[0]
        == "span_boundary_mismatch"
    )
    assert episode_proof_reason([False, False, True, False], turns, versions, spans)[0] == "toploc_mismatch"
    late = [0, 0, 1]  # v1 claimed from turn 2; turn 1 (v0's last) fails whole
    assert (
        episode_proof_reason(
            [False, True, True, False], turns, late, [spans[0], VersionSpan(policy_version=1, first_token=50)]
        )[0]
        == "span_boundary_mismatch"
    )


# ------------------------------------------------------------------ the wire


def test_spans_on_episodes_must_switch_at_a_model_turn_start():
    segments = [
        Segment(kind="model", length=4, turn=0),
        Segment(kind="env", length=2, turn=0),
        Segment(kind="model", length=4, turn=1),
    ]
    starts = turn_starts(segments)
    assert starts == [0, 6] and turn_starts(None) == [0]

    def problem(*points):
        spans = [VersionSpan(policy_version=v, first_token=b) for v, b in points]
        return spans_problem(spans, 10, start_version=0, max_versions=4, turn_starts=starts)

    assert problem((0, 0), (1, 6)) is None  # not a multiple of 32: an episode's rule is the turn start
    for inside in (2, 4, 7):  # inside turn 0, in the env segment, inside turn 1
        found = problem((0, 0), (1, inside))
        assert found is not None and "not the first token of a model turn" in found


def test_submission_refuses_a_boundary_inside_a_turn_with_422_and_lets_a_turn_start_through(
    server_factory, batch_for
):
    server = server_factory(*INFLIGHT)
    client = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    reg = client.register()
    batch = batch_for(client.get_tasks(reg.worker_id))
    segments = [
        Segment(kind="model", length=4, turn=0),
        Segment(kind="env", length=2, turn=0),
        Segment(kind="model", length=4, turn=1),
    ]
    episodes = batch.model_copy(
        update={
            "samples": [
                s.model_copy(
                    update={
                        "completion_tokens": [4] * 10,
                        "inference_logprobs": [-0.5] * 4 + [0.0] * 2 + [-0.5] * 4,
                        "segments": segments,
                    }
                )
                for s in batch.samples
            ]
        }
    )
    with pytest.raises(ClientRequestError) as error:
        client.submit_rollouts(with_spans(episodes, lambda s: [(0, 0), (1, 7)]))
    assert error.value.status == 422 and error.value.error == "bad_spans"
    assert "not the first token of a model turn" in error.value.message
    # at a turn start the episode rule passes; v1 is refused only because it is not committed yet
    with pytest.raises(ClientRequestError) as error:
        client.submit_rollouts(with_spans(episodes, lambda s: [(0, 0), (1, 6)]))
    assert error.value.status == 422 and "not committed" in error.value.message



class RecordingBackend(HFBackend):
    """An HF backend that records the version source each ``generate`` call would switch with."""

    def __init__(self) -> None:
        super().__init__("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER, decode="dynamic")
        self.sources_seen: list[object] = []

    def generate(self, prompts, seeds, params):
        self.sources_seen.append(self.version_source)
        return super().generate(prompts, seeds, params)


def test_the_backends_mid_decode_switch_is_held_off_inside_model_turns(files):
    """The trap: a turn's generate re-prefills the context, so a switch inside a turn (the backend's
    own, at a 32-token boundary) would be keep-KV over a recompute-KV prefix, which nothing verifies.
    Every turn's generate runs with no source; the source is back on the backend afterwards."""
    backend = RecordingBackend()
    offer = TurnOffer(files, {1: 1})
    backend.version_source = offer
    batch = build_episode_batch(LEASE, backend, ENV, encode=RUN.encode)[0]
    assert backend.sources_seen == [None] * TURNS and backend.version_source is offer
    assert all(pairs(s) == [(0, 0), (1, turn_starts(s.segments)[1])] for s in batch.samples)


def test_an_episode_that_ended_before_a_switch_turn_need_not_carry_it(plays):
    """By turn index, against the record (and lease-wide for a batch without a lease): an episode of
    two model turns is not expected to carry the switch at turn 2 (it was no longer running), but must
    carry the one at turn 1."""
    from prime_rl.validator.spans import span_checks

    batch = plays["two"]
    first = batch.samples[0]
    cut = sum(g.length for g in first.segments[:3])  # model, env, model: turns 0 and 1
    short = first.model_copy(
        update={
            "completion_tokens": first.completion_tokens[:cut],
            "inference_logprobs": first.inference_logprobs[:cut],
            "segments": first.segments[:3],
            "spans": first.spans[:2],
        }
    )

    def checked(sample: RolloutSample, record: LeaseRecord | None) -> list:
        samples = [sample, *batch.samples[1:]]
        pending = PendingBatch(
            batch_id="b", worker_id=batch.worker_id, step=batch.step, batch_index=batch.batch_index,
            policy_version=batch.policy_version, received_at=time.time(), lease=record, samples=samples,
        )  # fmt: skip
        return span_checks(pending, newest_version=2, max_versions=4)

    for record, reason in ((RECORDS["two"], "span_missing_mandatory"), (None, "span_not_lease_wide")):
        assert checked(short, record) == [None] * len(batch.samples)
        missing = checked(short.model_copy(update={"spans": None}), record)
        assert (
            missing[0] is not None
            and missing[0][0] == reason
            and missing[1:] == [None] * (len(batch.samples) - 1)
        ), missing
