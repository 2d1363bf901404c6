"""Turning a task lease into a rollout batch: generate, score, compute advantages (no I/O).

Shared by the honest worker, the hostile behaviours (which perturb its steps) and the tests.
The validator re-derives every field built here; see :mod:`prime_rl.validator.checks`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

import grpo
from prime_rl.api.protocol import RolloutBatch, RolloutSample, TaskLease
from prime_rl.api.spans import as_spans
from prime_rl.inference.backend import Completion, GenerationBackend, SamplingParams


@dataclass(frozen=True)
class PlannedTask:
    """One prompt to sample ``len(seeds)`` times."""

    task_id: int
    prompt_tokens: tuple[int, ...]
    seeds: tuple[int, ...]


def plan_lease(lease: TaskLease, encode: Callable[[str], Sequence[int]]) -> list[PlannedTask]:
    """The lease's prompts tokenised, with their per-completion seeds."""
    return [
        PlannedTask(t.task_id, tuple(int(x) for x in encode(t.prompt)), tuple(t.sampling_seeds))
        for t in lease.tasks
    ]


def sampling_params(lease: TaskLease) -> SamplingParams:
    return SamplingParams(
        temperature=lease.temperature, max_new_tokens=lease.max_new_tokens, stop=tuple(lease.stop)
    )


def generate_groups(
    backend: GenerationBackend, plan: Sequence[PlannedTask], params: SamplingParams
) -> list[list[Completion]]:
    """All completions of all tasks in one backend call; one list of ``group_size`` per task."""
    prompts = [task.prompt_tokens for task in plan for _ in task.seeds]
    seeds = [seed for task in plan for seed in task.seeds]
    flat = backend.generate(prompts, seeds, params)
    groups, start = [], 0
    for task in plan:
        groups.append(flat[start : start + len(task.seeds)])
        start += len(task.seeds)
    return groups


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """GRPO z-score advantages of one group (``grpo.group_zscore``, sample std, eps 1e-6)."""
    values = torch.tensor(list(rewards), dtype=torch.float64)
    return [float(a) for a in grpo.group_zscore(values, len(rewards)).tolist()]


def to_samples(
    task_id: int,
    completions: Sequence[Completion],
    rewards: Sequence[float],
    advantages: Sequence[float],
    temperature: float,
) -> list[RolloutSample]:
    """Wire samples of one group (``group_index`` = position in the group)."""
    return [
        RolloutSample(
            task_id=task_id,
            group_index=g,
            prompt_tokens=list(c.prompt_tokens),
            completion_tokens=list(c.completion_tokens),
            sampling_seed=c.seed,
            temperature=float(temperature),
            reward=float(r),
            advantage=float(a),
            proofs=c.proofs,
            inference_logprobs=[float(x) for x in c.logprobs],
            spans=as_spans(c.spans) if c.spans else None,
        )
        for g, (c, r, a) in enumerate(zip(completions, rewards, advantages, strict=True))
    ]


def build_batch(
    lease: TaskLease,
    backend: GenerationBackend,
    *,
    encode: Callable[[str], Sequence[int]],
    score: Callable[[int, str, int], float],
    plan: Sequence[PlannedTask] | None = None,
) -> tuple[RolloutBatch, list[float]]:
    """The honest answer to ``lease``: generate, score with ``score(task_id, text, num_tokens)``, z-score.

    Returns the batch and the rewards (for the worker's own logs).
    """
    plan = list(plan) if plan is not None else plan_lease(lease, encode)
    params = sampling_params(lease)
    samples: list[RolloutSample] = []
    rewards_all: list[float] = []
    for task, completions in zip(plan, generate_groups(backend, plan, params), strict=True):
        rewards = [float(score(task.task_id, c.text, len(c.completion_tokens))) for c in completions]
        advantages = group_advantages(rewards)
        samples.extend(to_samples(task.task_id, completions, rewards, advantages, params.temperature))
        rewards_all.extend(rewards)
    return lease_batch(lease, backend, samples), rewards_all


def lease_batch(lease: TaskLease, backend: GenerationBackend, samples: list[RolloutSample]) -> RolloutBatch:
    """The wire batch answering ``lease`` with ``samples``, stamped with the version they started on:
    the backend's, or, after an in-flight switch, the first span's."""
    started = next((s.spans[0].policy_version for s in samples if s.spans), backend.policy_version)
    return RolloutBatch(
        worker_id=lease.worker_id,
        step=lease.step,
        batch_index=lease.batch_index,
        policy_version=started,
        samples=samples,
    )
