"""The honest side of tool replay (issue 35, item 3): a tool output no replay reproduces exactly is
``tool_unverifiable`` (no ban count), a forged one stays ``tool_output_mismatch``; and the cost side
(issue 34, item 1): no tool runs for a lease whose proofs fail.

Episodes are scripted (the tiny random model never writes a tool call): a model turn with one Python
tool call, the tool's reply as the worker's own sandbox gave it, a final answer. The worker's and the
validator's environments are the same class; a different time limit on one side stands for a machine
that is slower there.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from types import SimpleNamespace

import pytest

from prime_rl.api.protocol import PendingBatch, RolloutSample, Segment, Verdict
from prime_rl.episodes import EpisodeEnv
from prime_rl.tasks import TaskSet
from prime_rl.validator import checks as checks_module
from prime_rl.validator.checks import Reason, replay_checks
from prime_rl.validator.episodes import replay_episode
from prime_rl.validator.verdicts import ban_counts, validate_batch
from verifiers import Task
from verifiers.envs import Message, PythonToolEnv, ToolEnv

TEMPLATE = "\n<{role}>\n{content}\n</{role}>\n"
TASKS = TaskSet([Task("7 * 6?", "verifiable_math", {"ground_truth": "42"})])


class Codepoints:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def decode(tokens) -> str:
    return "".join(chr(t) for t in tokens)


def env(timeout_s: float = 2.0) -> EpisodeEnv:
    return EpisodeEnv(PythonToolEnv(max_turns=2, timeout_s=timeout_s), TASKS, Codepoints(), turn_template=TEMPLATE)


def played(code: str, worker: EpisodeEnv, reply: list[int] | None = None) -> RolloutSample:
    """The episode a worker with environment ``worker`` sends (``reply``: its env tokens instead)."""
    turn0 = "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
    if reply is None:
        reply = list(worker.step(0, worker.start(0), turn0).tokens)
    turn1 = "\\boxed{42}"
    tokens = [*map(ord, turn0), *reply, *map(ord, turn1)]
    segments = [Segment(kind="model", length=len(turn0), turn=0), Segment(kind="env", length=len(reply), turn=0),
                Segment(kind="model", length=len(turn1), turn=1)]  # fmt: skip
    return RolloutSample(
        task_id=0, group_index=0, prompt_tokens=[1], completion_tokens=tokens, sampling_seed=1, temperature=1.0,
        reward=1.0, advantage=0.0, proofs=b"", inference_logprobs=[0.0] * len(tokens), segments=segments,
    )  # fmt: skip


def verdict(code: str) -> Verdict:
    return Verdict(sample_index=0, accepted=not code, reason=code or "ok", detail="", reward=0.0, advantage=0.0)


@pytest.mark.parametrize(
    "code",
    ["import time\nprint(time.time())", "print(id(object()))", "raise RuntimeError(object())"],
    ids=["clock", "address", "address-in-error"],
)
def test_an_output_that_differs_between_two_replays_is_unverifiable_and_counts_nothing(code):
    replay = replay_episode(played(code, env()), env(), decode)
    assert replay.code == "tool_unverifiable", replay
    assert "not deterministic" in replay.detail
    assert ban_counts([verdict(replay.code), verdict(""), verdict("lease_rejected")]) == (0, 0)


def test_a_program_that_raises_is_replayed_exactly_and_accepted():
    replay = replay_episode(played("raise ValueError('bad input')", env()), env(), decode)
    assert (replay.code, replay.detail) == ("", "")
    assert "ValueError: bad input" in replay.transcript[-2].content and replay.tool_seconds > 0


def test_a_replay_cut_short_by_the_validators_machine_is_unverifiable():
    """The worker's run finished; the validator's machine (here: a limit of 0.3 s) cut both replays short."""
    code = "import time\ntime.sleep(0.6)\nprint('done')"
    replay = replay_episode(played(code, env(2.0)), env(0.3), decode)
    assert replay.code == "tool_unverifiable" and "machine limit (tool_timeout)" in replay.detail, replay


def test_a_worker_output_cut_short_by_the_workers_machine_is_unverifiable():
    """The worker's machine timed out after printing "started"; the validator's replays finish alike."""
    code = "import time\nprint('started', flush=True)\ntime.sleep(0.6)\nprint('done')"
    sample = played(code, env(0.3))
    assert "started\n\n[timeout]\n" in decode(sample.completion_tokens)
    replay = replay_episode(sample, env(2.0), decode)
    assert replay.code == "tool_unverifiable" and "shows [timeout] after output the replay agrees" in replay.detail


@pytest.mark.parametrize(
    "forged",
    ["43\n", "41\n\n[timeout]\n", "420\n", "\n"],
    ids=["changed-digit", "timeout-after-made-up-text", "extra-digit", "empty"],
)
def test_forged_outputs_of_a_deterministic_program_stay_tool_output_mismatch(forged):
    """A made-up output is tool_output_mismatch, also one dressed as a machine limit after text the
    program never printed ("41" where it prints "42"). Only a cut after output the replay agrees with
    is the machine's (the worker then learns nothing it could not have had honestly)."""
    reply = list(map(ord, TEMPLATE.format(role="tool", content=forged)))
    replay = replay_episode(played("print(6 * 7)", env(), reply), env(), decode)
    assert replay.code == "tool_output_mismatch", replay
    assert "clean replays agree with each other" in replay.detail
    assert ban_counts([verdict(replay.code), verdict("lease_rejected")]) == (0, 2)


def test_text_after_a_limit_marker_cannot_be_checked_and_is_never_accepted():
    """What follows a limit marker is the program's stderr tail, which an honest slow machine may
    have cut anywhere: unverifiable (no ban), and the lease is rejected, so nothing of it is trained."""
    reply = list(map(ord, TEMPLATE.format(role="tool", content="\n[timeout]\n42\n")))
    replay = replay_episode(played("print(6 * 7)", env(), reply), env(), decode)
    assert replay.code == "tool_unverifiable" and replay.transcript == ()


def test_a_second_replay_that_prints_what_the_worker_got_passes():
    """A call that prints "first" on its first run and "second" after: a worker that got "second" is
    confirmed by the validator's second replay; one that got anything else is not (replays differ)."""

    def counter(outputs):
        runs = iter(outputs)
        return lambda arguments: next(runs)

    call = {"name": "count", "arguments": {}}

    def episode(worker_output: str, outputs: list[str]):
        validator = EpisodeEnv(ToolEnv({"count": counter(outputs)}, max_turns=2, replayable=True), TASKS,
                               Codepoints(), turn_template=TEMPLATE)  # fmt: skip
        reply = list(map(ord, TEMPLATE.format(role="tool", content=worker_output)))
        turn0 = "<tool_call>" + json.dumps(call) + "</tool_call>"
        sample = played("", validator, reply)
        sample = sample.model_copy(update={"completion_tokens": [*map(ord, turn0), *sample.completion_tokens[sample.segments[0].length:]],
                                           "segments": [Segment(kind="model", length=len(turn0), turn=0), *sample.segments[1:]]})  # fmt: skip
        sample = sample.model_copy(update={"inference_logprobs": [0.0] * len(sample.completion_tokens)})
        return replay_episode(sample, validator, decode)

    confirmed = episode("second", ["first", "second"])
    assert confirmed.code == "" and confirmed.transcript[-2].content == "second"
    assert episode("third", ["first", "second"]).code == "tool_unverifiable"
    assert episode("third", ["first", "first"]).code == "tool_output_mismatch"


def test_the_honest_output_of_a_deterministic_program_is_accepted():
    replay = replay_episode(played("print(6 * 7)", env()), env(), decode)
    assert replay.code == "" and replay.transcript[-2].content == "42\n"


def test_the_lease_tool_budget_bounds_the_replay_time():
    slow = played("import time\ntime.sleep(0.3)\nprint(1)", env())
    replay = replay_episode(slow, env(), decode, seconds_left=0.0)
    assert replay.code == "" and replay.tool_seconds >= 0.3  # the first turn always runs
    check = SimpleNamespace(episode_env=env(), validator=SimpleNamespace(tool_seconds_per_lease=0.2))
    pending = [checks_module.Pending(i, slow) for i in range(3)]
    replay_checks(pending, decode, check)
    assert [p.reason for p in pending] == [Reason.ACCEPTED, Reason.TOOL_UNVERIFIABLE, Reason.ACCEPTED]


def test_a_lease_whose_budget_is_spent_runs_no_tool() -> None:
    slow = played("import time\ntime.sleep(0.3)\nprint(1)", env())
    check = SimpleNamespace(episode_env=env(), validator=SimpleNamespace(tool_seconds_per_lease=60.0))
    pending = [checks_module.Pending(i, slow) for i in range(2)]
    before = checks_module.tool_seconds()
    replay_checks(pending, decode, check, budget_s=0.0)
    assert pending[0].reason == Reason.TOOL_UNVERIFIABLE  # (the lease is lost: nothing else replays)
    assert checks_module.tool_seconds() == before  # nothing ran
    pending = [checks_module.Pending(i, slow) for i in range(2)]
    replay_checks(pending, decode, check, budget_s=0.2)  # the first replay spends it: the second runs nothing
    assert [p.reason for p in pending] == [Reason.ACCEPTED, Reason.TOOL_UNVERIFIABLE]


def test_a_fabricated_lease_with_looping_tool_calls_costs_no_tool_time(monkeypatch):
    """Issue 34 item 1: random proofs and tool calls that loop until their timeout. The prefill rejects
    every sample first; no tool runs (the sandbox is never entered), and the validator's CPU time for
    the lease (after a first lease warmed torch up) is under 2 s (before: every sample's tool calls ran
    first, each until its 5 s timeout)."""
    from tiny_lm import make_tiny_lm, make_tiny_tokenizer
    from validator_setup import TinyRun

    from prime_rl.inference.backend import HFBackend, proof_size, proof_topk
    from verifiers.envs import tools as tools_module

    runs: list[str] = []
    real = tools_module.run_in_sandbox
    monkeypatch.setattr(tools_module, "run_in_sandbox", lambda *a, **k: runs.append("run") or real(*a, **k))
    tokenizer = make_tiny_tokenizer()
    run = TinyRun(b"fabricated-tools-key", tokenizer, lambda t: f"{t}+1=", 4, 2, 2, 200)
    tasks = TaskSet([Task(f"{t}+1=", "verifiable_math", {"ground_truth": str(t + 1)}) for t in range(4)])
    episode_env = EpisodeEnv(PythonToolEnv(max_turns=2, timeout_s=5.0), tasks, tokenizer, turn_template=TEMPLATE)
    checks = dataclasses.replace(run.checks(), episode_env=episode_env)
    backend = HFBackend("unused", model=make_tiny_lm(), tokenizer=tokenizer)
    loop = '<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>'
    eos = tokenizer.eos_token_id
    turn0, turn1 = [*run.encode(loop), eos], [*run.encode("\\boxed{1}"), eos]
    reply = list(episode_env.render((Message("tool", "\n[timeout]\n"),)))
    tokens = [*turn0, *reply, *turn1]
    chunks = -(-len(turn0) // 32) + -(-len(turn1) // 32)
    rng = random.Random(0)

    def fabricated(batch_index: int) -> list[Verdict]:
        lease, record = run.lease("fabricator", 0, batch_index)
        samples = []
        for task in lease.tasks:
            for g, seed in enumerate(task.sampling_seeds):
                samples.append(RolloutSample(
                    task_id=task.task_id, group_index=g, prompt_tokens=run.prompt_tokens(task.task_id),
                    completion_tokens=tokens, sampling_seed=seed, temperature=1.0, reward=0.0, advantage=0.0,
                    proofs=bytes(rng.randrange(256) for _ in range(chunks * proof_size(proof_topk(checks.hidden_size)))),
                    inference_logprobs=[-1.0] * len(turn0) + [0.0] * len(reply) + [-1.0] * len(turn1),
                    segments=[Segment(kind="model", length=len(turn0), turn=0), Segment(kind="env", length=len(reply), turn=0),
                              Segment(kind="model", length=len(turn1), turn=1)],
                ))  # fmt: skip
        batch = PendingBatch(
            batch_id=f"fabricated-{batch_index}", worker_id="fabricator", step=0, batch_index=batch_index,
            policy_version=0, received_at=time.time(), lease=record, samples=samples,
        )  # fmt: skip
        return validate_batch(batch, tasks=run, backend_for=lambda v: backend, decode=run.decode, checks=checks)

    fabricated(0)  # first calls into torch and the tokenizer
    started = time.process_time()  # the validator's own CPU (a tool run would be a child: runs says)
    verdicts = fabricated(1)
    seconds = time.process_time() - started
    own = {v.reason for v in verdicts} - {Reason.LEASE_REJECTED, Reason.GROUP_REJECTED}
    assert own and own <= {Reason.PROOF_FAILED, Reason.MALFORMED_PROOF, Reason.SAMPLING_FAILED}, own
    assert runs == [] and seconds < 2.0, (runs, seconds)
    assert ban_counts(verdicts) == (0, len(verdicts))
