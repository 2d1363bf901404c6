"""Hostile worker behaviours, selectable by name, for tests and red-team runs.

Each behaviour answers a lease the way a cheating worker would; the validator must reject every
sample with the reason in parentheses (the honest worker's samples must all be accepted):

=========================  ====================================================  ======================
name                       what it does                                          expected verdict
=========================  ====================================================  ======================
``other_weights``          samples with a perturbed copy of the policy           ``toploc_mismatch``
``changed_prompt``         generates for (and submits) an edited prompt          ``wrong_prompt``
``fabricated_completion``  submits made-up completions "proved" by one prefill   ``sampling_mismatch``
                           (honest proofs and log-probs over unsampled tokens)
``inflated_rewards``       claims reward + 1 for every completion                ``reward_mismatch``
``stale_policy``           never reloads weights, claims its true old version    ``stale_policy``
                           (the worker loop only takes leases once
                           ``min_policy_version > 0``, so every batch is stale)
``unassigned_tasks``       answers tasks that are not in its lease               ``not_assigned``
``garbage``                posts garbage bytes (answered 400) and submits        ``malformed_proof``
                           random proof bytes                                    or ``toploc_mismatch``
``mixed``                  one of the above per batch (``MIXED_CYCLE`` by batch  the chosen one's
                           index); its ``stale_policy`` claims version
                           ``min_policy_version - 1`` (inflated rewards while
                           that would be negative)
=========================  ====================================================  ======================

Other members of a rejected sample's group get ``group_rejected``.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from prime_rl.api.protocol import RolloutBatch, RolloutSample, TaskLease
from prime_rl.inference.backend import (
    Completion,
    GenerationBackend,
    HFBackend,
    build_proofs,
    token_logprobs,
)
from prime_rl.worker.rollout import (
    PlannedTask,
    build_batch,
    group_advantages,
    plan_lease,
    sampling_params,
    to_samples,
)

BEHAVIOURS = (
    "honest",
    "other_weights",
    "changed_prompt",
    "fabricated_completion",
    "inflated_rewards",
    "stale_policy",
    "unassigned_tasks",
    "garbage",
    "mixed",
)

MIXED_CYCLE = (
    "other_weights",
    "changed_prompt",
    "fabricated_completion",
    "inflated_rewards",
    "unassigned_tasks",
    "garbage",
    "stale_policy",
)
"""The order in which ``mixed`` cycles through the attacks (by lease batch index)."""

EXPECTED_REASONS: dict[str, tuple[str, ...]] = {
    "honest": ("ok",),
    "other_weights": ("toploc_mismatch",),
    "changed_prompt": ("wrong_prompt",),
    "fabricated_completion": ("sampling_mismatch",),
    "inflated_rewards": ("reward_mismatch",),
    "stale_policy": ("stale_policy",),
    "unassigned_tasks": ("not_assigned",),
    "garbage": ("malformed_proof", "toploc_mismatch"),
}
"""Verdict reasons each behaviour's samples must get (group mates of a rejected sample: ``group_rejected``)."""


@dataclass
class HostileWorker:
    """Builds rollout batches for one behaviour (``"honest"`` = the real worker's answer).

    ``encode(text)`` tokenises a prompt, ``score(task_id, text, num_tokens)`` is the worker's reward,
    ``prompt_tokens(task_id)`` gives any task's prompt (for unassigned tasks), ``num_tasks`` is
    the task set's size. (No worker can compute the assignment: it is keyed with a secret.)
    """

    behaviour: str
    encode: Callable[[str], Sequence[int]]
    score: Callable[[int, str, int], float]
    prompt_tokens: Callable[[int], Sequence[int]]
    num_tasks: int
    _other: GenerationBackend | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {self.behaviour!r}; choose one of {BEHAVIOURS}")

    @property
    def follows_new_weights(self) -> bool:
        return self.behaviour != "stale_policy"

    def resolve(self, lease: TaskLease) -> str:
        """The concrete behaviour used for ``lease`` (``mixed`` picks one by batch index)."""
        if self.behaviour != "mixed":
            return self.behaviour
        kind = MIXED_CYCLE[lease.batch_index % len(MIXED_CYCLE)]
        if kind == "stale_policy" and lease.min_policy_version == 0:
            return "inflated_rewards"  # no version is too old yet
        return kind

    def answer(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        """The batch this behaviour submits for ``lease``."""
        kind = self.resolve(lease)
        if kind == "stale_policy" and self.behaviour == "mixed":
            # Generated with current weights, but claims a version older than the lease allows.
            batch = build_batch(lease, backend, encode=self.encode, score=self.score)[0]
            return batch.model_copy(update={"policy_version": lease.min_policy_version - 1})
        if kind in ("honest", "stale_policy"):
            return build_batch(lease, backend, encode=self.encode, score=self.score)[0]
        if kind == "other_weights":
            return self._with_other_weights(lease, backend)
        if kind == "changed_prompt":
            plan = [
                PlannedTask(t.task_id, _edit(t.prompt_tokens), t.seeds)
                for t in plan_lease(lease, self.encode)
            ]
            return build_batch(lease, backend, encode=self.encode, score=self.score, plan=plan)[0]
        if kind == "fabricated_completion":
            return self._fabricate(lease, backend)
        if kind == "inflated_rewards":
            batch = build_batch(lease, backend, encode=self.encode, score=self.score)[0]
            return _inflate(batch)
        if kind == "unassigned_tasks":
            return build_batch(
                lease, backend, encode=self.encode, score=self.score, plan=self._unassigned(lease)
            )[0]
        batch = build_batch(lease, backend, encode=self.encode, score=self.score)[0]
        return _garble(batch)

    def _with_other_weights(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        if self._other is None:
            if not isinstance(backend, HFBackend):
                raise TypeError("other_weights needs an HFBackend to copy")
            other = copy.copy(backend)
            other.model = copy.deepcopy(backend.model)
            with torch.no_grad():
                generator = torch.Generator().manual_seed(1234)
                for p in other.model.parameters():
                    p.add_(torch.randn(p.shape, generator=generator).to(p) * (p.std() + 0.1))
            other._decoder = other.model.get_decoder()
            other._lm_head = other.model.get_output_embeddings()
            self._other = other
        batch = build_batch(lease, self._other, encode=self.encode, score=self.score)[0]
        return batch.model_copy(update={"policy_version": backend.policy_version})

    def _fabricate(self, lease: TaskLease, backend: GenerationBackend) -> RolloutBatch:
        """Made-up completions with proofs and log-probs from one honest prefill over them."""
        params = sampling_params(lease)
        rng = random.Random(lease.batch_index)
        samples: list[RolloutSample] = []
        for task in plan_lease(lease, self.encode):
            # "Answers" the worker wants to be trained on, then whatever ends a completion.
            texts = [str(rng.randint(0, 99)) for _ in task.seeds]
            completions_tokens = [tuple(self.encode(t))[: params.max_new_tokens] or (0,) for t in texts]
            completions_tokens = [_pad_to_end(c, params.max_new_tokens) for c in completions_tokens]
            prefills = backend.prefill([task.prompt_tokens] * len(texts), completions_tokens)
            completions = []
            for seed, tokens, pre, text in zip(task.seeds, completions_tokens, prefills, texts, strict=True):
                logp = token_logprobs(pre.logits, torch.tensor(tokens), params.temperature)
                completions.append(
                    Completion(
                        prompt_tokens=task.prompt_tokens,
                        completion_tokens=tokens,
                        logprobs=tuple(float(x) for x in logp),
                        proofs=build_proofs(pre.hidden),
                        seed=seed,
                        finish_reason="length",
                        text=text,
                    )
                )
            rewards = [float(self.score(task.task_id, c.text, len(c.completion_tokens))) for c in completions]
            samples += to_samples(
                task.task_id, completions, rewards, group_advantages(rewards), params.temperature
            )
        return RolloutBatch(
            worker_id=lease.worker_id,
            step=lease.step,
            batch_index=lease.batch_index,
            policy_version=backend.policy_version,
            samples=samples,
        )

    def _unassigned(self, lease: TaskLease) -> list[PlannedTask]:
        assigned = {t.task_id for t in lease.tasks}
        free = [t for t in range(self.num_tasks) if t not in assigned]
        plan = []
        for original, task_id in zip(lease.tasks, free, strict=False):  # the lease's seeds, other tasks
            plan.append(PlannedTask(task_id, tuple(self.prompt_tokens(task_id)), tuple(original.sampling_seeds)))
        return plan


def _edit(tokens: tuple[int, ...]) -> tuple[int, ...]:
    """The prompt with its first token changed (a different question, same length)."""
    return (tokens[0] - 1 if tokens[0] > 0 else 1, *tokens[1:])


def _pad_to_end(tokens: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    """Repeat the made-up answer up to the length limit so the completion ends like a real one."""
    out = list(tokens)
    while len(out) < max_new_tokens:
        out.append(tokens[len(out) % len(tokens)])
    return tuple(out)


def _inflate(batch: RolloutBatch) -> RolloutBatch:
    samples = list(batch.samples)
    by_task: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_task.setdefault(s.task_id, []).append(i)
    for indices in by_task.values():
        rewards = [samples[i].reward + 1.0 for i in indices]
        for i, r, a in zip(indices, rewards, group_advantages(rewards), strict=True):
            samples[i] = samples[i].model_copy(update={"reward": r, "advantage": a})
    return batch.model_copy(update={"samples": samples})


def _garble(batch: RolloutBatch) -> RolloutBatch:
    samples = []
    for s in batch.samples:
        samples.append(s.model_copy(update={"proofs": os.urandom(len(s.proofs))}))
    return batch.model_copy(update={"samples": samples})


def garbage_body(size: int = 512) -> bytes:
    """Random bytes to POST as a rollout body (the orchestrator must answer 400, not crash)."""
    return os.urandom(size)
