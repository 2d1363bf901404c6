"""The single-turn forgeries: batches built from an honest decode, then changed before submission.

The family of attacks in :data:`~prime_rl.redteam.attacks.ATTACKS` that need neither an episode
environment (those are :mod:`prime_rl.redteam.episodes`) nor in-flight switches (those are
:mod:`prime_rl.redteam.spans`): other weights, an edited prompt, made-up completions, inflated
rewards, garbage proofs. :class:`~prime_rl.redteam.attacks.HostileWorker` picks the attack and
calls these; each is what a cheating worker would do to an honest batch, and the validator must
reject it with the attack's expected reason.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable, Sequence

import torch

from prime_rl.api.protocol import RolloutBatch, RolloutSample, TaskLease
from prime_rl.inference.backend import Completion, GenerationBackend, HFBackend, build_proofs, token_logprobs
from prime_rl.worker.rollout import group_advantages, plan_lease, sampling_params, to_samples

__all__ = [
    "edited_prompt", "fabricated_batch", "garbage_body", "garbled", "inflated", "padded_to_end", "perturbed_copy",
]  # fmt: skip


def perturbed_copy(backend: GenerationBackend) -> HFBackend:
    """``other_weights``' model: a copy of the HF backend with every weight perturbed by seeded noise
    of its own scale (it samples a different distribution than the committed policy)."""
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
    return other


def fabricated_batch(
    lease: TaskLease,
    backend: GenerationBackend,
    *,
    encode: Callable[[str], Sequence[int]],
    score: Callable[[int, str, int], float],
) -> RolloutBatch:
    """``fabricated_completion``'s batch: made-up completions (numbers the worker wants trained on,
    repeated up to the length limit) with proofs and log-probs from one honest prefill over them."""
    params = sampling_params(lease)
    rng = random.Random(lease.batch_index)
    samples: list[RolloutSample] = []
    for task in plan_lease(lease, encode):
        # "Answers" the worker wants to be trained on, then whatever ends a completion.
        texts = [str(rng.randint(0, 99)) for _ in task.seeds]
        completions_tokens = [tuple(encode(t))[: params.max_new_tokens] or (0,) for t in texts]
        completions_tokens = [padded_to_end(c, params.max_new_tokens) for c in completions_tokens]
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
        rewards = [float(score(task.task_id, c.text, len(c.completion_tokens))) for c in completions]
        samples += to_samples(task.task_id, completions, rewards, group_advantages(rewards), params.temperature)
    return RolloutBatch(
        worker_id=lease.worker_id,
        step=lease.step,
        batch_index=lease.batch_index,
        policy_version=backend.policy_version,
        samples=samples,
    )


def edited_prompt(tokens: tuple[int, ...]) -> tuple[int, ...]:
    """The prompt with its first token changed (a different question, same length)."""
    return (tokens[0] - 1 if tokens[0] > 0 else 1, *tokens[1:])


def padded_to_end(tokens: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    """Repeat the made-up answer up to the length limit so the completion ends like a real one."""
    out = list(tokens)
    while len(out) < max_new_tokens:
        out.append(tokens[len(out) % len(tokens)])
    return tuple(out)


def inflated(batch: RolloutBatch) -> RolloutBatch:
    """``inflated_rewards``: every reward + 1, advantages recomputed per task so they stay consistent."""
    samples = list(batch.samples)
    by_task: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_task.setdefault(s.task_id, []).append(i)
    for indices in by_task.values():
        rewards = [samples[i].reward + 1.0 for i in indices]
        for i, r, a in zip(indices, rewards, group_advantages(rewards), strict=True):
            samples[i] = samples[i].model_copy(update={"reward": r, "advantage": a})
    return batch.model_copy(update={"samples": samples})


def garbled(batch: RolloutBatch) -> RolloutBatch:
    """``garbage``: every sample's proof replaced by random bytes of the same length."""
    samples = []
    for s in batch.samples:
        samples.append(s.model_copy(update={"proofs": os.urandom(len(s.proofs))}))
    return batch.model_copy(update={"samples": samples})


def garbage_body(size: int = 512) -> bytes:
    """Random bytes to POST as a rollout body (the orchestrator must answer 400, not crash)."""
    return os.urandom(size)
