"""In-flight weight updates on multi-turn episodes: versions switch only at a model turn's start.

A real HF episode lease (the tiny model built in code, fp32; three tiny models seeded 0, 1, 2 are
versions 0, 1, 2) switches to a newer version before a model turn; each turn's generate prefills
the whole context again with the weights loaded then (recompute-KV), and the validator re-derives
it with one prefill per version (``validator/episode_spans.py``). Every forgery starts from a real
decode.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

from prime_rl.api.client import ClientRequestError, OrchestratorClient
from prime_rl.api.protocol import PendingBatch, RolloutBatch, RolloutSample, Segment, VersionSpan
from prime_rl.api.segments import turn_starts
from prime_rl.api.spans import spans_problem
from prime_rl.episodes import EpisodeEnv
from prime_rl.inference.backend import HFBackend
from prime_rl.inference.contract import VersionSwitch
from prime_rl.tasks import TaskSet
from prime_rl.validator.checks import Reason
from prime_rl.validator.episode_spans import episode_proof_reason
from prime_rl.validator.episodes import ModelSpan
from prime_rl.validator.verdicts import validate_batch
from prime_rl.weights.files import save_policy
from prime_rl.worker.episodes import build_episode_batch
from verifiers import Task
from verifiers.envs import CalculatorEnv

KEY = b"inflight-episodes-test-key"
NUM_TASKS, GROUP, PER_BATCH, MAX_NEW, TURNS = 12, 2, 2, 5, 3
TOKENIZER = make_tiny_tokenizer()
RUN = TinyRun(KEY, TOKENIZER, lambda t: f"{t}+{t * 3}=", NUM_TASKS, GROUP, PER_BATCH, MAX_NEW)
TASKS = TaskSet(
    [Task(f"{t}+{t * 3}=", "verifiable_math", {"ground_truth": str(4 * t + 1)}) for t in range(NUM_TASKS)]
)
# The calculator answers every wrong answer with feedback; the tiny random model is never right, so
# every episode plays all TURNS model turns (model, env, model, env, model).
ENV = EpisodeEnv(
    CalculatorEnv(max_turns=TURNS, feedback=True),
    TASKS,
    TOKENIZER,
    turn_template="\n<{role}>\n{content}\n</{role}>\n",
)
CHECKS = dataclasses.replace(RUN.checks(), episode_env=ENV)
FOLLOWERS = {Reason.LEASE_REJECTED, Reason.GROUP_REJECTED}
LEASE, RECORD = RUN.lease("w-episodes", 0, 0)


class TurnOffer:
    """A version source with ``after[v]``: version ``v`` ready from the ``after[v]``-th time it is asked
    (the episode loop asks once before each model turn after the first)."""

    def __init__(self, files: dict[int, Path], after: dict[int, int], max_versions: int = 4) -> None:
        self.files, self.after, self.max_versions, self.asked, self.boundaries = (
            files,
            after,
            max_versions,
            0,
            [],
        )

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        self.asked += 1
        self.boundaries.append(boundary)
        ready = [v for v, n in self.after.items() if v > current and self.asked >= n]
        return VersionSwitch(max(ready), self.files[max(ready)]) if ready else None


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("versions")
    return {v: save_policy(make_tiny_lm(seed=v).state_dict(), root / f"v{v}.safetensors") for v in range(3)}


SWITCHES = {"none": None, "one": {1: 1}, "two": {1: 1, 2: 2}}
"""Honest plays of one lease: no switch; v1 from turn 1; v1 from turn 1 and v2 from turn 2."""


@pytest.fixture(scope="module")
def plays(files: dict[int, Path]) -> dict[str, RolloutBatch]:
    out = {}
    for name, after in SWITCHES.items():
        backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER, decode="dynamic")
        offer = TurnOffer(files, after) if after else None
        backend.version_source = offer
        out[name] = build_episode_batch(LEASE, backend, ENV, encode=RUN.encode)[0]
        assert backend.policy_version == (max(after) if after else 0)
        assert backend.version_source is offer  # detached only while the episodes played
        if offer is not None:
            assert offer.asked == TURNS - 1  # asked before each model turn after the first, never inside one
            # the boundary it is shown: the earliest first token of turn 1 among the lease's episodes
            assert offer.boundaries[0] == min(turn_starts(s.segments)[1] for s in out[name].samples)
    return out


class Validator:
    """One backend loading each version in place as ``backend_for`` asks (loads counted)."""

    def __init__(self, files: dict[int, Path]) -> None:
        self.files, self.loads = files, []
        self.backend = HFBackend("unused", model=make_tiny_lm(seed=0), tokenizer=TOKENIZER)

    def backend_for(self, version: int) -> HFBackend | None:
        if version not in self.files:
            return None
        if version != self.backend.policy_version:
            self.backend.load_weights(self.files[version], version)
            self.loads.append(version)
        return self.backend

    def judge(self, batch: RolloutBatch, newest_version: int = 2) -> list:
        pending = PendingBatch(
            batch_id=f"{batch.worker_id}-s{batch.step}-b{batch.batch_index}", worker_id=batch.worker_id,
            step=batch.step, batch_index=batch.batch_index, policy_version=batch.policy_version,
            received_at=time.time(), lease=RECORD, samples=batch.samples,
        )  # fmt: skip
        return validate_batch(
            pending,
            tasks=RUN,
            backend_for=self.backend_for,
            decode=RUN.decode,
            checks=CHECKS,
            newest_version=newest_version,
        )


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


# ------------------------------------------------------------------ the validator


def test_an_honest_episode_lease_switching_at_turn_starts_is_accepted_one_prefill_per_version(files, plays):
    batch = plays["two"]
    validator = Validator(files)
    verdicts = validator.judge(batch)
    assert [v.reason for v in verdicts] == [Reason.ACCEPTED] * len(verdicts), [
        (v.reason, v.detail) for v in verdicts
    ]
    assert validator.loads == [1, 2]  # each further version loaded once for the whole batch
    for v, s in zip(verdicts, batch.samples, strict=True):
        model = [i for start, g in _starts(s) if g.kind == "model" for i in range(start, start + g.length)]
        # fp32: each turn's log-probs under its own version, recomputed from a fresh prefix (recompute-KV)
        assert max(abs(v.logprobs[i] - s.inference_logprobs[i]) for i in model) < 1e-4
        assert all(v.logprobs[i] == 0.0 for i in range(len(s.completion_tokens)) if i not in model)


def test_switched_episodes_with_every_span_dropped_fail_the_proofs(files, plays):
    """Nothing left to compare lease-wide: the later version's turns fail against v0."""
    verdicts = Validator(files).judge(with_spans(plays["one"], lambda s: None))
    assert own_reasons(verdicts) == {Reason.PROOF_FAILED}


def test_a_forged_span_version_on_an_episode_is_span_version_forged(files, plays):
    batch = plays["none"]  # every turn played by v0 ...
    forged = with_spans(batch, lambda s: [(0, 0), (1, turn_starts(s.segments)[2])])  # ... turn 2 labelled v1
    verdicts = Validator(files).judge(forged)
    assert own_reasons(verdicts) == {Reason.SPAN_VERSION_FORGED}, [(v.reason, v.detail) for v in verdicts]


def test_a_switch_claimed_a_turn_late_is_span_boundary_mismatch(files, plays):
    batch = plays["one"]  # v1 from turn 1, claimed from turn 2
    late = with_spans(batch, lambda s: [(0, 0), (1, turn_starts(s.segments)[2])])
    assert own_reasons(Validator(files).judge(late)) == {Reason.SPAN_BOUNDARY_MISMATCH}


def test_an_episode_dropping_the_leases_switch_is_span_not_lease_wide_before_any_prefill(files, plays):
    batch = plays["one"]
    dropped = with_spans(batch, lambda s: None if s is batch.samples[0] else pairs(s))
    # the same switch on another turn: turn indices are compared, not token indices
    moved = with_spans(
        batch, lambda s: [(0, 0), (1, turn_starts(s.segments)[2])] if s is batch.samples[0] else pairs(s)
    )
    for forgery in (dropped, moved):
        validator = Validator(files)
        verdicts = validator.judge(forgery)
        assert own_reasons(verdicts) == {Reason.SPAN_NOT_LEASE_WIDE}, [(v.reason, v.detail) for v in verdicts]
        assert validator.loads == []


def test_a_boundary_inside_a_model_turn_is_span_malformed(files, plays):
    batch = plays["one"]
    inside = with_spans(batch, lambda s: [(0, 0), (1, turn_starts(s.segments)[1] + 1)])
    verdicts = Validator(files).judge(inside)
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
    server, batch_for
):
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


def _starts(sample):
    out, start = [], 0
    for g in sample.segments:
        out.append((start, g))
        start += g.length
    return out


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
    """Lease-wide by turn index: an episode of two model turns is not expected to carry the switch at
    turn 2 (it was no longer running), but must carry the one at turn 1."""
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

    def checked(sample: RolloutSample) -> list:
        samples = [sample, *batch.samples[1:]]
        pending = PendingBatch(
            batch_id="b", worker_id=batch.worker_id, step=batch.step, batch_index=batch.batch_index,
            policy_version=batch.policy_version, received_at=time.time(), lease=RECORD, samples=samples,
        )  # fmt: skip
        return span_checks(pending, newest_version=2, max_versions=4)

    assert checked(short) == [None] * len(batch.samples)
    missing = checked(short.model_copy(update={"spans": None}))
    assert (
        missing[0] is not None
        and missing[0][0] == "span_not_lease_wide"
        and missing[1:] == [None] * (len(batch.samples) - 1)
    )
