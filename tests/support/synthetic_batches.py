"""One builder of synthetic rollout batches, for the orchestrator's tests and benchmarks.

A batch that answers a lease structurally (every task of the lease, one sample per sampling seed,
in order) with contents that are not a real model's: the control plane stores, leases, judges
and claims such batches without a model. Each caller sets what it measures or checks: token
counts and values, rewards and advantages per group index, log-probs, proof bytes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

from prime_rl.api.protocol import RolloutBatch, RolloutSample

ZERO_PROOFS = base64.b64encode(b"\x00" * 258).decode()
"""One proof chunk's worth of zero bytes (toploc's 258-byte chunk), base64."""


def synthetic_batch(
    lease: Any,
    policy_version: int = 0,
    *,
    prompt_tokens: Sequence[int] = (1, 2, 3),
    completion: Sequence[int] | Callable[[int], Sequence[int]] = (4, 5),
    reward: Callable[[int], float] = lambda g: float(g == 0),
    advantage: Callable[[int], float] = lambda g: 1.0 if g == 0 else -1.0,
    advantages: Sequence[float] | None = None,
    logprobs: Sequence[float] | None = None,
    proofs: str = ZERO_PROOFS,
    temperature: float | None = None,
) -> RolloutBatch:
    """A batch answering ``lease`` (a ``TaskLease``) with ``policy_version``.

    ``completion``, ``reward`` and ``advantage`` may depend on the sample's group index g;
    ``advantages`` (one per sample, in batch order) overrides ``advantage``; ``logprobs``
    defaults to -0.5 per completion token; ``temperature`` to the lease's.
    """
    samples = []
    for task in lease.tasks:
        for g, seed in enumerate(task.sampling_seeds):
            tokens = list(completion(g) if callable(completion) else completion)
            samples.append(
                RolloutSample(
                    task_id=task.task_id, group_index=g, prompt_tokens=list(prompt_tokens), completion_tokens=tokens,
                    sampling_seed=seed, temperature=lease.temperature if temperature is None else temperature,
                    reward=reward(g), advantage=advantage(g) if advantages is None else advantages[len(samples)],
                    proofs=proofs, inference_logprobs=list(logprobs) if logprobs is not None else [-0.5] * len(tokens),
                )
            )  # fmt: skip
    return RolloutBatch(
        worker_id=lease.worker_id, step=lease.step, batch_index=lease.batch_index, policy_version=policy_version,
        samples=samples,
    )  # fmt: skip
