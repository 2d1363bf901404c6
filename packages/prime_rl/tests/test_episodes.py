"""Multi-turn episodes (issue 28): the wire format, the worker's episodes, the validator's episode checks
and the trainer's loss mask, in process with the tiny character-level model."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
from calculator_tasks import TEMPLATE, segment_starts, sum_prompt, sum_tasks  # tests/support
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from validator_setup import TinyRun

from prime_rl.api.protocol import PendingBatch, RolloutSample, Segment, TrainSample
from prime_rl.api.segments import model_token_mask, segments_problem, turn_seed
from prime_rl.episodes import EpisodeEnv
from prime_rl.inference.backend import HFBackend, SamplingParams
from prime_rl.redteam.attacks import ATTACKS, HostileWorker
from prime_rl.redteam.episodes import forge_tool_output
from prime_rl.trainer.batching import (
    completion_logprobs,
    completion_positions,
    completion_targets,
    make_micro_batches,
)
from prime_rl.validator.checks import Reason
from prime_rl.validator.episodes import episode_problem
from prime_rl.validator.verdicts import ban_counts, validate_batch
from verifiers.envs import CalculatorEnv, PythonToolEnv

KEY = b"episode-test-assignment-key"
NUM_TASKS = 12
GROUP, PER_BATCH, MAX_NEW, TURNS = 2, 2, 5, 3
TOKENIZER = make_tiny_tokenizer()
RUN = TinyRun(KEY, TOKENIZER, sum_prompt, NUM_TASKS, GROUP, PER_BATCH, MAX_NEW)
TASKS = sum_tasks(NUM_TASKS)


def feedback_env(env_class=CalculatorEnv) -> EpisodeEnv:
    """A calculator environment that answers every wrong final answer with "try again" (the tiny
    random model never answers right, so every episode runs all TURNS turns)."""
    return EpisodeEnv(env_class(max_turns=TURNS, feedback=True), TASKS, TOKENIZER, turn_template=TEMPLATE)


ENV = feedback_env()
CHECKS = dataclasses.replace(RUN.checks(), episode_env=ENV)


@pytest.fixture(scope="module")
def backend():
    return HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)


def worker(behaviour: str, env: EpisodeEnv = ENV) -> HostileWorker:
    return HostileWorker(behaviour, RUN.encode, RUN.score, RUN.prompt_tokens, NUM_TASKS, env=env)


def judge(batch, record, backend, checks=CHECKS):
    return RUN.judge(batch, record, checks, lambda v: backend)


@pytest.fixture(scope="module")
def honest(backend):
    lease, record = RUN.lease("honest-episodes", 0, 0)
    return lease, record, worker("honest").answer(lease, backend)


# ------------------------------------------------------------------ wire format


def _sample(segments, logprobs=None, n=5):
    return {
        "task_id": 0, "group_index": 0, "prompt_tokens": [1], "completion_tokens": list(range(3, 3 + n)),
        "sampling_seed": 1, "temperature": 1.0, "reward": 0.0, "advantage": 0.0, "proofs": "",
        "inference_logprobs": logprobs if logprobs is not None else [0.0] * n, "segments": segments,
    }  # fmt: skip


def seg(kind, length, turn):
    return {"kind": kind, "length": length, "turn": turn}


@pytest.mark.parametrize(
    ("segments", "why"),
    [
        ([seg("model", 2, 0), seg("env", 2, 0)], "ends with a model segment"),
        ([seg("model", 2, 0), seg("env", 2, 0), seg("model", 2, 1)], "add up to 6"),
        ([seg("env", 2, 0), seg("model", 3, 0)], "alternate"),
        ([seg("model", 2, 0), seg("model", 3, 1)], "alternate"),
        ([], "0 segments"),
        ([seg("model", 1, 0), seg("env", 1, 0)] * 32 + [seg("model", 1, 1)], "65 segments"),
    ],
)
def test_malformed_segments_are_refused_on_the_wire(segments, why):
    n = (sum(s["length"] for s in segments) or 5) if why != "add up to 6" else 5
    with pytest.raises(ValueError, match=why):
        RolloutSample.model_validate_json(json.dumps(_sample(segments, n=n)))


def test_wire_segments_are_strict_and_single_turn_samples_are_unchanged():
    for bad in ({"kind": "tool", "length": 1, "turn": 0}, {"kind": "model", "length": 0, "turn": 0},
                {"kind": "model", "length": "1", "turn": 0}, {"kind": "model", "length": 1, "turn": 0, "x": 1}):  # fmt: skip
        with pytest.raises(ValueError):
            RolloutSample.model_validate_json(json.dumps(_sample([bad], n=1)))
    # a claimed log-prob at an env position: something "sampled" where nothing was
    with pytest.raises(ValueError, match=r"must be 0\.0"):
        RolloutSample.model_validate_json(
            json.dumps(
                _sample(
                    [seg("model", 2, 0), seg("env", 1, 0), seg("model", 2, 1)], [0.1, 0.1, -0.5, 0.1, 0.1]
                )
            )
        )
    single = {k: v for k, v in _sample(None).items() if k != "segments"}
    parsed = RolloutSample.model_validate_json(json.dumps(single))
    assert parsed.segments is None and "segments" not in parsed.model_dump(exclude_defaults=True)
    assert segments_problem([Segment(kind="model", length=5, turn=0)], 5, [0.0] * 5) is None


def test_turn_seeds_are_fixed_distinct_and_turn_zero_is_the_sample_seed():
    assert turn_seed(12345, 0) == 12345
    seeds = {turn_seed(12345, k) for k in range(32)}
    assert len(seeds) == 32 and all(0 <= s < 2**63 for s in seeds)
    assert turn_seed(12345, 3) == turn_seed(12345, 3) != turn_seed(12346, 3)


# ------------------------------------------------------------------ worker and validator


def test_honest_episodes_interleave_model_turns_and_environment_replies(honest, backend):
    _lease, _, batch = honest
    assert len(batch.samples) == GROUP * PER_BATCH
    for s in batch.samples:
        kinds = [g.kind for g in s.segments]
        assert kinds == ["model", "env"] * (TURNS - 1) + ["model"]  # the random model is never right
        assert [g.turn for g in s.segments] == [0, 0, 1, 1, 2]
        # every env segment is the environment's feedback, as the template renders it
        env_tokens = [s.completion_tokens[a : a + g.length] for a, g in segment_starts(s) if g.kind == "env"]
        assert all(tuple(t) == ENV.render(_feedback()) for t in env_tokens)
    # turn k of an episode is exactly what the seeded sampler draws for turn_seed(seed, k) after
    # the episode's tokens so far (one model turn re-generated alone)
    s = batch.samples[1]
    a, g = segment_starts(s)[2]
    again = backend.generate(
        [s.prompt_tokens + s.completion_tokens[:a]], [turn_seed(s.sampling_seed, 1)],
        SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW),
    )[0]  # fmt: skip
    assert list(again.completion_tokens) == s.completion_tokens[a : a + g.length]


def _feedback():
    from verifiers.envs import FEEDBACK, Message

    return (Message("user", FEEDBACK),)


def test_honest_episodes_are_accepted_with_env_positions_zero_in_the_trainers_logprobs(honest, backend):
    _, record, batch = honest
    verdicts = judge(batch, record, backend)
    assert [v.reason for v in verdicts] == [Reason.ACCEPTED] * len(verdicts), [v.detail for v in verdicts]
    for v, s in zip(verdicts, batch.samples, strict=True):
        mask = model_token_mask(s.segments, len(s.completion_tokens))
        assert len(v.logprobs) == len(s.completion_tokens)
        assert all(x == 0.0 for x, m in zip(v.logprobs, mask, strict=True) if not m)
        assert all(x < 0.0 for x, m in zip(v.logprobs, mask, strict=True) if m)
        assert v.reward == s.reward == 0.0


EPISODE_ATTACKS = (
    "dropped_turn",
    "reordered_turn",
    "truncated_episode",
    "model_as_env",
    "env_as_model",
)


@pytest.mark.parametrize("behaviour", EPISODE_ATTACKS)
def test_each_episode_tampering_is_rejected_with_its_own_reason_before_any_prefill(backend, behaviour):
    lease, record = RUN.lease(f"bad-{behaviour.replace('_', '-')}", 0, 1)
    batch = worker(behaviour).answer(lease, backend)
    prefilled = []

    def backend_for(version):
        prefilled.append(version)
        return backend

    pending = PendingBatch(
        batch_id="b", worker_id=batch.worker_id, step=0, batch_index=1, policy_version=0,
        received_at=time.time(), lease=record, samples=batch.samples,
    )  # fmt: skip
    verdicts = validate_batch(pending, tasks=RUN, backend_for=backend_for, decode=RUN.decode, checks=CHECKS)
    own = {v.reason for v in verdicts} - {Reason.GROUP_REJECTED, Reason.LEASE_REJECTED}
    assert own == {Reason(r) for r in ATTACKS[behaviour].expected}, [(v.reason, v.detail) for v in verdicts]
    # a stop where the environment would have replied is found by running the environment, which
    # happens only after the prefill has proven every model turn (validator/episodes.py, check 3)
    assert not any(v.accepted for v in verdicts) and prefilled == ([0] if behaviour == "truncated_episode" else [])


def test_a_played_forged_tool_output_passes_the_prefill_and_fails_the_replay(backend):
    """The model answered the made-up reply, so every turn's proofs pass over the episode as sent;
    the validator's replay (after the prefill) gives other tokens, twice alike: tool_output_mismatch.
    Patched in after generation instead, the forgery fails the proofs before any tool runs."""
    lease, record = RUN.lease("bad-forged-tool-output", 0, 1)
    batch = worker("forged_tool_output").answer(lease, backend)
    verdicts = judge(batch, record, backend)
    own = {v.reason for v in verdicts} - {Reason.GROUP_REJECTED, Reason.LEASE_REJECTED}
    assert own == {Reason.TOOL_OUTPUT_MISMATCH}, [(v.reason, v.detail) for v in verdicts]
    assert "clean replays agree with each other" in verdicts[0].detail
    assert ban_counts(verdicts) == (0, len(verdicts))
    patched = batch.model_copy(update={"samples": [forge_tool_output(s) for s in worker("honest").answer(lease, backend).samples]})
    own = {v.reason for v in judge(patched, record, backend)} - {Reason.GROUP_REJECTED, Reason.LEASE_REJECTED}
    assert own == {Reason.PROOF_FAILED}


def test_the_existing_attacks_on_episodes_are_still_rejected(backend):
    """Attacks that play (then perturb) whole episodes get their usual reason; fabricated_completion's
    made-up single-turn-shaped samples fail the prefill's sampling check, before the environment
    replay would have found them truncated (no tool runs for them)."""
    for behaviour in (
        "other_weights",
        "fabricated_completion",
        "inflated_rewards",
        "changed_prompt",
        "garbage",
    ):
        lease, record = RUN.lease(f"old-{behaviour.replace('_', '-')}", 0, 2)
        verdicts = judge(worker(behaviour).answer(lease, backend), record, backend)
        reasons = {v.reason for v in verdicts} - {Reason.GROUP_REJECTED, Reason.LEASE_REJECTED}
        expected = {Reason(r) for r in ATTACKS[behaviour].expected}
        assert reasons and reasons <= expected, (behaviour, reasons)
        assert not any(v.accepted for v in verdicts)


def test_an_episode_replayed_with_relabelled_turn_seeds_fails_sampling(honest, backend):
    """A worker that renumbers the turns after dropping one passes the turn-order check, and the
    seeded sampler (turn k's seed is turn_seed(seed, k)) and the proofs (other context) catch it."""
    _, record, batch = honest
    samples = []
    for s in batch.samples:
        segs = s.segments
        cut = segs[0].length + segs[1].length
        proofs, size = s.proofs, len(s.proofs) // TURNS  # one proof per turn of <= 32 tokens
        renumbered = [g.model_copy(update={"turn": g.turn - 1}) for g in segs[2:]]
        samples.append(
            s.model_copy(
                update={
                    "completion_tokens": s.completion_tokens[cut:],
                    "inference_logprobs": s.inference_logprobs[cut:],
                    "proofs": proofs[size:],
                    "segments": renumbered,
                }
            )
        )
    # an environment of TURNS - 1 turns, so that the renumbered episode is complete in it
    shorter = EpisodeEnv(
        CalculatorEnv(max_turns=TURNS - 1, feedback=True), TASKS, TOKENIZER, turn_template=TEMPLATE
    )
    checks = dataclasses.replace(CHECKS, episode_env=shorter)
    verdicts = judge(batch.model_copy(update={"samples": samples}), record, backend, checks)
    reasons = {v.reason for v in verdicts} - {Reason.GROUP_REJECTED, Reason.LEASE_REJECTED}
    assert reasons and reasons <= {Reason.PROOF_FAILED, Reason.SAMPLING_FAILED, Reason.LOGPROBS_MISMATCH}
    assert not any(v.accepted for v in verdicts)


def test_a_non_replayable_environment_refuses_every_episode_with_a_tool_output(honest, backend):
    _, record, batch = honest

    class Clock(CalculatorEnv):  # a tool reading the wall clock would declare this
        replayable = False

    env = EpisodeEnv(Clock(max_turns=TURNS, feedback=True), TASKS, TOKENIZER, turn_template=TEMPLATE)
    env.env.replayable = False
    verdicts = judge(batch, record, backend, dataclasses.replace(CHECKS, episode_env=env))
    assert {v.reason for v in verdicts} - {Reason.LEASE_REJECTED} == {Reason.TOOL_NOT_REPLAYABLE}


def test_episode_segments_in_a_single_turn_run_are_malformed(honest, backend):
    _, record, batch = honest
    verdicts = judge(batch, record, backend, dataclasses.replace(CHECKS, episode_env=None))
    assert {v.reason for v in verdicts} - {Reason.LEASE_REJECTED} == {Reason.MALFORMED}


def test_python_tool_outputs_are_re_derived_in_the_sandbox_and_a_forged_one_is_caught():
    """The validator re-runs the Python tool on the model turn as sent: the honest output passes,
    one changed digit of it does not (scripted turns: the tiny random model never writes a tool call)."""
    env = EpisodeEnv(PythonToolEnv(max_turns=TURNS), TASKS, TOKENIZER, turn_template=TEMPLATE)
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    step = env.step(0, env.start(0), call)
    assert not step.done and step.messages[-1].content == "42\n"
    assert TOKENIZER.decode(list(step.tokens)) == "\n<tool>\n42\n\n</tool>\n"
    eos = 2
    turn0, turn1 = [*RUN.encode(call), eos], [*RUN.encode("\\boxed{1}"), eos]  # task 0's answer is 1

    def sample(env_tokens):
        segments = [Segment(kind="model", length=len(turn0), turn=0), Segment(kind="env", length=len(env_tokens), turn=0),
                    Segment(kind="model", length=len(turn1), turn=1)]  # fmt: skip
        tokens = [*turn0, *env_tokens, *turn1]
        return RolloutSample(
            task_id=0, group_index=0, prompt_tokens=[1], completion_tokens=tokens, sampling_seed=1, temperature=1.0,
            reward=1.0, advantage=0.0, proofs=b"", inference_logprobs=[0.0] * len(tokens), segments=segments,
        )  # fmt: skip

    rules = {"eos": frozenset({eos}), "stop": (), "max_new_tokens": 100}
    code, detail, transcript = episode_problem(sample(list(step.tokens)), env, RUN.decode, **rules)
    assert (code, detail) == ("", "")
    assert [m.role for m in transcript][-3:] == ["assistant", "tool", "assistant"] and env.score(
        0, transcript
    ) == 1.0
    forged = list(step.tokens)
    forged[forged.index(RUN.encode("4")[0])] = RUN.encode("5")[0]  # "52": a made-up result
    code, detail, _ = episode_problem(sample(forged), env, RUN.decode, **rules)
    assert code == "tool_output_mismatch" and "first difference at token 8" in detail, (
        detail
    )  # after "\\n<tool>\\n"
    # a forged reply of another length, and a reply inserted after the final answer
    assert (
        episode_problem(sample(list(step.tokens)[:-1]), env, RUN.decode, **rules)[0] == "tool_output_mismatch"
    )
    answered_first = sample(list(step.tokens)).model_copy(
        update={"completion_tokens": [*turn1, *step.tokens, *turn1], "segments": [
            Segment(kind="model", length=len(turn1), turn=0), Segment(kind="env", length=len(step.tokens), turn=0),
            Segment(kind="model", length=len(turn1), turn=1)]}
    )  # fmt: skip
    assert episode_problem(answered_first, env, RUN.decode, **rules)[0] == "tool_output_mismatch"


# ------------------------------------------------------------------ trainer


def test_the_trainers_loss_mask_covers_model_tokens_only(honest):
    _, _, batch = honest
    samples = [
        TrainSample(
            sample_id=f"b/{i}",
            batch_id="b",
            worker_id="w",
            task_id=s.task_id,
            group_index=s.group_index,
            policy_version=0,
            prompt_tokens=s.prompt_tokens,
            completion_tokens=s.completion_tokens,
            behaviour_logprobs=s.inference_logprobs,
            temperature=1.0,
            reward=0.0,
            advantage=1.0,
            segments=s.segments,
        )
        for i, s in enumerate(batch.samples)
    ]
    model_tokens = sum(g.length for s in batch.samples for g in s.segments if g.kind == "model")
    for share_prompts in (False, True):  # one sequence per sample; a group's prompt packed once
        micro = make_micro_batches(samples, 1 << 12, share_prompts=share_prompts)[0]
        assert micro.num_loss_tokens == model_tokens < sum(len(s.completion_tokens) for s in batch.samples)
        # every loss target is a model-sampled token, never an env token (hand-computed oracle)
        expected = [
            token
            for s in samples
            for token, m in zip(s.completion_tokens, model_token_mask(s.segments, len(s.completion_tokens)), strict=True)
            if m
        ]
        assert completion_targets(micro).tolist() == expected
        if not share_prompts:  # there, sequence k's completion token t is predicted at its start + P - 1 + t
            starts = [place.prompt_offset for place in micro.placements]
            positions = [
                start + len(s.prompt_tokens) - 1 + t
                for start, s in zip(starts, samples, strict=True)
                for t, m in enumerate(model_token_mask(s.segments, len(s.completion_tokens)))
                if m
            ]
            assert completion_positions(micro).tolist() == positions
    # log-probs from random logits land on model positions, 0 on env positions
    logits = torch.randn(1, micro.input_ids.shape[1], 100)
    values = completion_logprobs(logits, micro, 1.0)
    assert bool((values[~micro.mask] == 0).all()) and bool((values[micro.mask] < 0).all())


# ------------------------------------------------------------------ devices


def _episodes_judged_on(backend) -> list[str]:
    lease, record = RUN.lease("device-episodes", 0, 0)
    return [v.reason for v in judge(worker("honest").answer(lease, backend), record, backend)]


def test_episode_worker_and_validator_keep_tensors_on_the_compute_device():
    """Per-turn proofs, margins and log-probs under the simulated second device (device_guard)."""
    from device_guard import simulated_device

    backend = HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER)
    with simulated_device() as device:
        device.place(backend.model)
        reasons = _episodes_judged_on(backend)
    assert reasons == [Reason.ACCEPTED] * len(reasons)  # a mixed-device bug would be internal_error


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_episodes_on_cuda():
    backend = HFBackend("unused", model=make_tiny_lm(), tokenizer=TOKENIZER, device="cuda")
    reasons = _episodes_judged_on(backend)
    assert reasons == [Reason.ACCEPTED] * len(reasons)


def test_the_run_summary_counts_episodes_model_turns_and_tool_turns(tmp_path):
    from prime_rl.launch.report import render_summary, summarize_run

    (tmp_path / "metrics").mkdir()
    lines = [
        {"event": "rollouts", "samples": 8, "model_turns": 20, "env_turns": 12, "behaviour": "honest"},
        {"event": "rollouts", "samples": 8, "model_turns": 24, "env_turns": 16, "behaviour": "honest"},
        {"event": "rollouts", "samples": 8, "model_turns": 8, "env_turns": "x"},  # an odd line counts 0
    ]
    (tmp_path / "metrics" / "worker-0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = summarize_run(tmp_path)
    assert summary.turns == {"episodes": 24, "model_turns": 52, "env_turns": 28}
    assert "episodes: 24 submitted with 52 model turns and 28 tool/environment turns" in render_summary(
        summary
    )
    single = [{"event": "rollouts", "samples": 8, "completion_tokens": 30}]  # a single-turn run: no line
    (tmp_path / "metrics" / "worker-0.jsonl").write_text(json.dumps(single[0]) + "\n")
    assert summarize_run(tmp_path).turns == {} and "episodes:" not in render_summary(summarize_run(tmp_path))
