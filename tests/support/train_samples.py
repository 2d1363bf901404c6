"""Train samples made in code for the trainer's tests: GRPO groups whose samples share a prompt."""

from __future__ import annotations

import torch

from prime_rl.api.protocol import TrainSample


def grouped_samples(groups: list[tuple[int, list[int]]], seed: int = 0) -> list[TrainSample]:
    """Per ``(prompt length, completion lengths)``: one task, its prompt shared by its samples
    (random ids in 3..99, rewards alternating 0/1, advantages of alternating sign)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for task, (prompt_length, completions) in enumerate(groups):
        prompt = torch.randint(3, 100, (prompt_length,), generator=g).tolist()
        for index, length in enumerate(completions):
            out.append(
                TrainSample(
                    sample_id=f"b/{task}/{index}", batch_id="b", worker_id="w", task_id=task, group_index=index,
                    policy_version=0, prompt_tokens=prompt,
                    completion_tokens=torch.randint(3, 100, (length,), generator=g).tolist(),
                    behaviour_logprobs=[-4.0] * length, temperature=1.0, reward=float(index % 2),
                    advantage=(-1.0) ** index * (1 + task / 10),
                )
            )  # fmt: skip
    return out
