"""Oracle rows of shared/reference/grpo.md §4 for quantities read from logits (O12, O13):
selective log-softmax (with temperature, fp32/bf16 paths) and entropy, values and gradients.
"""

from __future__ import annotations

import math

import pytest
import torch
from grpo_oracles_lib import (  # type: ignore[import-not-found]
    F64,
    ROUNDED,
    close,
    grad_of,
)

import grpo


def test_o12_selective_log_softmax() -> None:
    # [0, 0], idx 0: log(1/2) = −0.69315. [2, 0] at T = 2 -> z = [1, 0]: 1 − log(e + 1) = −0.31326.
    close(grpo.selective_log_softmax(torch.zeros(1, 2, dtype=F64), torch.tensor([0])), -math.log(2))
    value = grpo.selective_log_softmax(
        torch.tensor([[2.0, 0.0]], dtype=F64), torch.tensor([0]), temperature=2.0
    )
    close(value, 1 - math.log(math.e + 1))
    close(value, -0.31326, atol=ROUNDED)
    # Gradient of log p_0 w.r.t. the logits: (onehot − p)/T = ([1, 0] − [e, 1]/(e + 1))/2.
    logits = torch.tensor([[2.0, 0.0]], dtype=F64, requires_grad=True)
    grad = grad_of(grpo.selective_log_softmax(logits, torch.tensor([0]), 2.0).sum(), logits)
    p0 = math.e / (math.e + 1)
    close(grad, [[(1 - p0) / 2, -(1 - p0) / 2]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_o12_fp32_and_bf16_paths_equal_log_softmax_gather(dtype: torch.dtype) -> None:
    # Both paths compute in fp32: equal to log_softmax(logits.float()).gather up to fp32 rounding.
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 50, generator=generator) * 4).to(dtype)
    tokens = torch.randint(0, 50, (3, 5), generator=generator)
    expected = torch.log_softmax(logits.float() / 0.7, dim=-1).gather(-1, tokens[..., None])[..., 0]
    actual = grpo.selective_log_softmax(logits, tokens, temperature=0.7)
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual, expected, rtol=0, atol=2e-6)


def test_o13_entropy() -> None:
    # Uniform over V = 4: ln 4 = 1.38629. [100, 0, 0]: p ≈ [1, e^−100, e^−100] -> H ≈ 202·e^−100 ≈ 0.
    close(grpo.entropy_from_logits(torch.zeros(1, 4, dtype=F64)), math.log(4))
    close(grpo.entropy_from_logits(torch.tensor([[100.0, 0.0, 0.0]], dtype=F64)), 0.0, atol=1e-40)
    # Gradient dH/dz = −p(z − E z): zero at the uniform distribution (a maximum).
    logits = torch.zeros(1, 4, dtype=F64, requires_grad=True)
    close(grad_of(grpo.entropy_from_logits(logits).sum(), logits), 0.0)
