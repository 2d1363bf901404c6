"""Oracle rows of shared/reference/grpo.md §4 for what reweights or masks the objective (O11,
O17, O18, O21, O22): KL estimators, truncated/masked importance weights (detached), the
high-entropy token mask and the DPPO total-variation mask. Float64, rtol 0, hand derivations.
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
    leaf,
)

import grpo


@pytest.mark.parametrize("x", [0.0, math.log(2), -math.log(2)])
def test_o11_kl_estimators(x: float) -> None:
    # x = ℓ_ref − ℓ. k3 = e^x − x − 1: 0, 2 − ln2 − 1 = 0.30685, 0.5 + ln2 − 1 = 0.19315; k1 = −x; k2 = x²/2.
    # Gradients w.r.t. ℓ (dx/dℓ = −1): k1 -> 1, k2 -> −x, k3 -> 1 − e^x.
    logprobs = leaf([[-1.0]])
    ref = logprobs.detach() + x
    k3 = grpo.kl_k3(logprobs, ref)
    close(k3, math.exp(x) - x - 1)
    close(k3, {0.0: 0.0, math.log(2): 0.30685, -math.log(2): 0.19315}[x], atol=ROUNDED)
    close(grad_of(k3.sum(), logprobs), 1 - math.exp(x))
    k1 = grpo.kl_k1(logprobs, ref)
    close(k1, -x)
    close(grad_of(k1.sum(), logprobs), 1.0)
    k2 = grpo.kl_k2(logprobs, ref)
    close(k2, x * x / 2)
    close(grad_of(k2.sum(), logprobs), -x)
    close(grpo.kl_penalty(logprobs, ref, estimator="k2"), x * x / 2)


def test_o17_truncated_and_masked_is() -> None:
    # Token log ρ = ln 3 -> ρ = 3: TIS min(3, 2) = 2.0; MIS band [0.5, 2] -> 0.
    # Sequence: log ρ = ln 2 + ln 2 -> ρ = 4: TIS 2, MIS 0 (on both tokens). Weights carry no grad.
    old = torch.tensor([[math.log(3)]], dtype=F64, requires_grad=True)
    inference = torch.zeros(1, 1, dtype=F64)
    tis = grpo.truncated_is_weights(old, inference, cap=2.0)
    close(tis, 2.0)
    assert not tis.requires_grad
    close(grpo.masked_is_weights(old, inference, low=0.5, high=2.0), 0.0)
    seq_old = torch.tensor([[math.log(2), math.log(2)]], dtype=F64, requires_grad=True)
    seq_inf = torch.zeros(1, 2, dtype=F64)
    close(grpo.truncated_is_weights(seq_old, seq_inf, cap=2.0, level="sequence"), [[2.0, 2.0]])
    close(grpo.masked_is_weights(seq_old, seq_inf, low=0.5, high=2.0, level="sequence"), [[0.0, 0.0]])
    # And inside the band MIS keeps ρ itself: ρ = 1.5 -> 1.5.
    close(grpo.masked_is_weights(torch.tensor([[math.log(1.5)]], dtype=F64), inference), 1.5)


def test_o18_high_entropy_mask() -> None:
    # Valid H = 0.1 … 1.0 (10 values); the 0.8 quantile by linear interpolation is at position
    # 0.8·9 = 7.2 -> 0.8 + 0.2·(0.9 − 0.8) = 0.82, so only 0.9 and 1.0 are kept.
    entropy = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 5.0, 5.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    keep = grpo.high_entropy_mask(entropy, mask, top_fraction=0.2)
    expected = torch.zeros(2, 6, dtype=torch.bool)
    expected[1, 2] = expected[1, 3] = True
    assert torch.equal(keep, expected)
    assert torch.isclose(torch.quantile(entropy[mask], 0.8), torch.tensor(0.82, dtype=F64))


@pytest.mark.parametrize(("adv", "kept"), [(1.0, False), (-1.0, True)])
def test_o21_dppo_tv_mask(adv: float, kept: bool) -> None:
    # p_old = 0.5 -> p = 0.75: p − p_old = 0.25 > δ = 0.2. Â > 0 -> masked (gradient 0); Â < 0 -> kept.
    logprobs = leaf([[math.log(0.75)]])
    old = torch.tensor([[math.log(0.5)]], dtype=F64)
    advantages = torch.tensor([adv], dtype=F64)
    keep = grpo.dppo_tv_mask(logprobs, old, advantages, delta_low=0.2, delta_high=0.2)
    assert keep.tolist() == [[kept]]
    per_token = grpo.ppo_clip(logprobs, old, advantages, eps_low=0.9, eps_high=0.9)
    grad = grad_of(grpo.aggregate(per_token, keep, "token_mean"), logprobs)
    close(grad, -1.5 * adv if kept else 0.0)  # kept: −r·Â with r = 1.5


def test_o22_is_weight_detached() -> None:
    # Bypass-style worst case: the weight is computed from the very ℓ we differentiate.
    # ∂(w·L)/∂ℓ must equal w·∂L/∂ℓ, with no L·∂w/∂ℓ term.
    logprobs = leaf([[-1.0, -0.2, -3.0]])
    inference = torch.tensor([[-1.5, -0.2, -2.0]], dtype=F64)
    old = torch.tensor([[-1.2, -0.1, -2.9]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=F64)
    for weights in (
        grpo.truncated_is_weights(logprobs, inference, cap=1.5),
        grpo.masked_is_weights(logprobs, inference, low=0.5, high=2.0),
        grpo.truncated_is_weights(logprobs, inference, cap=1.5, level="sequence"),
    ):
        weighted = grad_of((weights * grpo.ppo_clip(logprobs, old, adv)).sum(), logprobs)
        plain = grad_of(grpo.ppo_clip(logprobs, old, adv).sum(), logprobs)
        close(weighted, weights * plain)
