"""Shared helpers of the test_oracles_*.py files: the float64 assertion with rtol 0, gradient
extraction, and reference grpo.md §4's O1 data (used by the aggregation and objective oracles).

"ratio = 1" means ℓ_old is ℓ detached, so r ≡ 1 in value while the gradient still flows through ℓ.
"""

from __future__ import annotations

import torch

import grpo

F64 = torch.float64
EXACT = 1e-12  # for expectations computed with the same closed form in Python floats
ROUNDED = 5e-6  # for the 5-significant-digit numbers printed in the reference table


def close(actual: torch.Tensor | float, expected: object, atol: float = EXACT) -> None:
    actual_t = torch.as_tensor(actual, dtype=F64)
    expected_t = torch.as_tensor(expected, dtype=F64)
    torch.testing.assert_close(actual_t, expected_t.expand_as(actual_t), rtol=0.0, atol=atol)


def leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=True)


def grad_of(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


# O1 data: Â = [[1,1,1],[−1,−1,·]], m = [[1,1,1],[1,1,0]], ratio = 1 -> per-token L = −Â.
O1_ADV = [[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]
O1_MASK = [[1, 1, 1], [1, 1, 0]]


def o1_per_token(logprobs: torch.Tensor, width: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    adv = torch.zeros(2, width, dtype=F64)
    adv[:, :3] = torch.tensor(O1_ADV, dtype=F64)
    mask = torch.zeros(2, width, dtype=torch.bool)
    mask[:, :3] = torch.tensor(O1_MASK, dtype=torch.bool)
    return grpo.ppo_clip(logprobs, logprobs.detach(), adv, mask), mask
