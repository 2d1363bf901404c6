"""A steering worker's draw, for tests: toploc's seeded sampler, except that it takes the runner-up
wherever that scores within ``within`` of the sampler's choice. Inside the validator's per-sample
sampling tolerance (0.25) no sample alone looks wrong; only per-worker evidence catches it."""

from __future__ import annotations

from collections.abc import Callable

import torch

import toploc
from prime_rl.inference.backend import SAMPLER_SEED

SampleNext = Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]


def steering_sampler(within: float, swapped: set[int] | None = None) -> SampleNext:
    """A replacement for ``prime_rl.inference.backend.sample_next`` that steers inside ``within``.

    ``swapped`` collects the sampling seeds of the sequences that took a runner-up at least once: a
    sequence with no close call is drawn exactly as an honest worker would, so it is no attack."""

    def sample_next(logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float) -> torch.Tensor:
        positions = torch.full_like(seeds, position)
        noise = toploc.gumbel_noise(SAMPLER_SEED, seeds, positions, logits.shape[-1])
        top = (logits.double() + temperature * noise).topk(2, dim=-1)
        tokens = top.indices[:, 0].clone()
        close = (top.values[:, 0] - top.values[:, 1]) < within
        tokens[close] = top.indices[close, 1]
        if swapped is not None:
            swapped.update(int(seed) for seed in seeds[close].tolist())
        return tokens

    return sample_next
