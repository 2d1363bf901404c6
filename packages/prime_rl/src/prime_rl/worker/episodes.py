"""Multi-turn rollouts: every sample of a lease played as an episode of the run's environment.

All episodes of a lease advance in lockstep: model turn ``k`` of every live episode is one
``backend.generate`` call whose prompts are each episode's tokens so far (prompt, earlier turns,
environment replies) and whose seeds are ``turn_seed(sampling_seed, k)`` (``api/segments.py``),
so each turn is drawn by the contract's seeded sampler and proven by toploc over its own tokens:
the proofs of an episode are its model turns' proofs, turn after turn. The environment's reply
(``episodes.EpisodeEnv.step``) is appended as an ``env`` segment with log-prob 0.0 (nothing was
sampled there). No I/O; the validator re-derives everything built here.

In-flight updates (``workers.inflight_updates``, ``HFBackend.version_source``): an episode switches
versions only at the start of a model turn. Before turn ``t >= 1`` the loop asks the source for a
newer committed, downloaded version and loads it; every episode still running records the span
``(version, its completion length)``, the first token of its turn ``t``. Each turn's ``generate``
prefills the whole context again under the weights loaded then, so turn ``t`` is generated entirely
by one version over keys and values that version recomputed (recompute-KV): exactly what the
validator re-derives with one prefill per version (``validator/spans.py``). The backend's
own mid-decode switch is held off during the turns (:func:`turn_start_switches`): a switch inside a
turn would be keep-KV over a re-prefilled context, which nothing verifies.

The switch record (``POST /leases/switch``, ``docs/inflight.md`` section 4): a source that announces
turn switches (``at_turn(current, turn)``, ``CommittedVersions``) announces ``(lease, version,
turn t)`` before turn ``t``'s generate and answers the orchestrator's nonce; a refusal or an
unreachable orchestrator is no switch. The spans and nonces are kept as the backends keep theirs
(``inference/switching.py``). From turn ``t`` on every episode still running draws with
``switched_turn_seed(seed, turn, nonces)`` (``api/segments.py``: the turn seed chained through
each switch's nonce), so the worker learns the post-switch noise of one switch turn only, the
one it announced first. A source with ``newer`` only (tests) is asked with the boundary instead,
and its nonce, if any, is used the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prime_rl.api.protocol import RolloutBatch, RolloutSample, Segment, TaskLease
from prime_rl.api.segments import switched_turn_seed
from prime_rl.api.spans import as_spans
from prime_rl.episodes import EpisodeEnv
from prime_rl.inference.backend import GenerationBackend, SamplingParams
from prime_rl.inference.contract import VersionSource
from prime_rl.inference.switching import RowSpans
from prime_rl.worker.rollout import PlannedTask, group_advantages, lease_batch, plan_lease, sampling_params
from verifiers.envs import Message

__all__ = ["Episode", "build_episode_batch", "episode_samples", "generate_episodes", "turn_start_switches"]


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
    spans: list[tuple[int, int]] = field(default_factory=list)
    """``(policy_version, first_token)`` per version span, the start version from token 0 first;
    empty: one version played every turn."""
    done: bool = False
    reward: float = 0.0

    @property
    def model_turns(self) -> int:
        return sum(s.kind == "model" for s in self.segments)

    @property
    def env_turns(self) -> int:
        return sum(s.kind == "env" for s in self.segments)


def generate_episodes(
    backend: GenerationBackend,
    plan: Sequence[PlannedTask],
    params: SamplingParams,
    env: EpisodeEnv,
    source: VersionSource | None = None,
) -> list[list[Episode]]:
    """Play ``len(task.seeds)`` episodes per planned task; one list per task, scored. ``source``: where
    to find a newer version to switch to at a model turn's start (module docstring); None: no switch."""
    episodes = [
        Episode(t.task_id, t.prompt_tokens, seed, env.start(t.task_id)) for t in plan for seed in t.seeds
    ]
    rows = RowSpans([e.seed for e in episodes], backend.policy_version)  # spans and switch nonces so far
    for turn in range(env.max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        if turn > 0 and source is not None and rows.versions < source.max_versions:
            # the boundary a source sees: the earliest first token of this turn among the live episodes
            at_turn = getattr(source, "at_turn", None)
            if at_turn is not None:  # announced for (lease, version, turn): the nonce seeds turns >= turn
                switch = at_turn(backend.policy_version, turn)
            else:
                switch = source.newer(backend.policy_version, min(len(e.tokens) for e in live))
            if switch is not None:  # every episode still running opens the span at its turn's first token
                backend.load_weights(switch.path, switch.version)
                rows.switch(switch, {i: len(e.tokens) for i, e in enumerate(episodes) if not e.done})
        prompts = [(*e.prompt_tokens, *e.tokens) for e in live]
        completions = backend.generate(prompts, [switched_turn_seed(e.seed, turn, rows.nonces) for e in live], params)
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
    for i, e in enumerate(episodes):
        e.spans = list(rows.spans(i))
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
            spans=as_spans(e.spans) if e.spans else None,
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
    with turn_start_switches(backend) as source:
        groups = generate_episodes(backend, plan, params, env, source)
    for group in groups:
        samples.extend(episode_samples(group, params.temperature))
        played.extend(group)
    return lease_batch(lease, backend, samples), played


@contextlib.contextmanager
def turn_start_switches(backend: GenerationBackend) -> Iterator[VersionSource | None]:
    """The backend's in-flight version source (None: in-flight updates off), detached from the backend
    while the episodes play, so that versions switch only at model-turn starts, never inside a turn."""
    source = getattr(backend, "version_source", None)
    if source is None:
        yield None
        return
    backend.version_source = None  # type: ignore[attr-defined]
    try:
        yield source
    finally:
        backend.version_source = source  # type: ignore[attr-defined]
