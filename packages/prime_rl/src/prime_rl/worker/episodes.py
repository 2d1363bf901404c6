"""Multi-turn rollouts: every sample of a lease played as an episode of the run's environment.

All episodes of a lease advance in lockstep: model turn ``k`` of every live episode is one
``backend.generate`` call whose prompts are each episode's tokens so far (prompt, earlier turns,
environment replies) and whose seeds are ``turn_seed(sampling_seed, k)`` (``api/segments.py``),
so each turn is drawn by the contract's seeded sampler and proven by toploc over its own tokens:
the proofs of an episode are its model turns' proofs, turn after turn. The environment's reply
(``episodes.EpisodeEnv.step``) is appended as an ``env`` segment with log-prob 0.0 (nothing was
sampled there). No I/O; the validator re-derives everything built here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prime_rl.api.protocol import RolloutBatch, RolloutSample, Segment, TaskLease
from prime_rl.api.segments import turn_seed
from prime_rl.episodes import EpisodeEnv
from prime_rl.inference.backend import GenerationBackend, SamplingParams
from prime_rl.worker.rollout import PlannedTask, group_advantages, lease_batch, plan_lease, sampling_params
from verifiers.envs import Message

__all__ = ["Episode", "build_episode_batch", "episode_samples", "generate_episodes"]


@dataclass
class Episode:
    """One episode while it is played, then as submitted (``reward`` set once it is scored)."""

    task_id: int
    prompt_tokens: tuple[int, ...]
    seed: int
    messages: tuple[Message, ...]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    proofs: bytes = b""
    segments: list[Segment] = field(default_factory=list)
    done: bool = False
    reward: float = 0.0

    @property
    def model_turns(self) -> int:
        return sum(s.kind == "model" for s in self.segments)

    @property
    def env_turns(self) -> int:
        return sum(s.kind == "env" for s in self.segments)


def generate_episodes(
    backend: GenerationBackend, plan: Sequence[PlannedTask], params: SamplingParams, env: EpisodeEnv
) -> list[list[Episode]]:
    """Play ``len(task.seeds)`` episodes per planned task; one list per task, scored."""
    episodes = [
        Episode(t.task_id, t.prompt_tokens, seed, env.start(t.task_id)) for t in plan for seed in t.seeds
    ]
    for turn in range(env.max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        prompts = [(*e.prompt_tokens, *e.tokens) for e in live]
        completions = backend.generate(prompts, [turn_seed(e.seed, turn) for e in live], params)
        for e, c in zip(live, completions, strict=True):
            e.tokens += c.completion_tokens
            e.logprobs += c.logprobs
            e.proofs += c.proofs
            e.segments.append(Segment(kind="model", length=len(c.completion_tokens), turn=turn))
            step = env.step(e.task_id, e.messages, c.text, final=turn + 1 == env.max_turns)
            e.messages = step.messages
            if step.done:  # a final answer, or the last turn (whose reply is never inserted)
                e.done = True
                continue
            e.tokens += step.tokens
            e.logprobs += [0.0] * len(step.tokens)
            e.segments.append(Segment(kind="env", length=len(step.tokens), turn=turn))
    for e in episodes:
        e.reward = env.score(e.task_id, e.messages)
    groups, start = [], 0
    for t in plan:
        groups.append(episodes[start : start + len(t.seeds)])
        start += len(t.seeds)
    return groups


def episode_samples(group: Sequence[Episode], temperature: float) -> list[RolloutSample]:
    """Wire samples of one group of episodes, with their group advantages."""
    advantages = group_advantages([e.reward for e in group])
    return [
        RolloutSample(
            task_id=e.task_id,
            group_index=g,
            prompt_tokens=list(e.prompt_tokens),
            completion_tokens=list(e.tokens),
            sampling_seed=e.seed,
            temperature=float(temperature),
            reward=float(e.reward),
            advantage=float(a),
            proofs=e.proofs,
            inference_logprobs=[float(x) for x in e.logprobs],
            segments=list(e.segments),
        )
        for g, (e, a) in enumerate(zip(group, advantages, strict=True))
    ]


def build_episode_batch(
    lease: TaskLease,
    backend: GenerationBackend,
    env: EpisodeEnv,
    *,
    encode: Callable[[str], Sequence[int]],
    plan: Sequence[PlannedTask] | None = None,
) -> tuple[RolloutBatch, list[Episode]]:
    """The honest answer to ``lease`` in a multi-turn run (``rollout.build_batch``'s counterpart).

    Returns the batch and its episodes (for the worker's logs: turns and rewards)."""
    plan = list(plan) if plan is not None else plan_lease(lease, encode)
    params = sampling_params(lease)
    samples: list[RolloutSample] = []
    played: list[Episode] = []
    for group in generate_episodes(backend, plan, params, env):
        samples.extend(episode_samples(group, params.temperature))
        played.extend(group)
    return lease_batch(lease, backend, samples), played
