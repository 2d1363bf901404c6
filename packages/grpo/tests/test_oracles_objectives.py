"""Oracle rows of shared/reference/grpo.md §4 for the per-token objectives (O2–O9, O16, O23,
O24): PPO clip with INTELLECT-2's δ, GSPO, CISPO, SAPO, and masked-position robustness.
Values and gradients in float64, rtol 0; each test carries the hand derivation.
"ratio = 1" means ℓ_old is ℓ detached, so r ≡ 1 in value while the gradient still flows through ℓ.
"""

from __future__ import annotations

import math

import pytest
import torch
from grpo_oracles_lib import (  # type: ignore[import-not-found]
    F64,
    O1_MASK,
    ROUNDED,
    close,
    grad_of,
    leaf,
)

import grpo


def test_o2_loss_zero_but_gradient_not() -> None:
    # Â = [+1, −1], r = 1: 𝓛 = (−1 + 1)/2 = 0 but ∂𝓛/∂ℓ = −r·Â/2 = [−0.5, +0.5] (pitfall 3).
    logprobs = leaf([[-0.7, -1.3]])
    per_token = grpo.ppo_clip(logprobs, logprobs.detach(), torch.tensor([[1.0, -1.0]], dtype=F64))
    loss = grpo.aggregate(per_token, None, "token_mean")
    close(loss, 0.0)
    close(grad_of(loss, logprobs), [[-0.5, 0.5]])


@pytest.mark.parametrize(("eps_high", "expected"), [(0.2, -1.2), (0.28, -1.28)])
def test_o3_clip_positive_advantage(eps_high: float, expected: float) -> None:
    # Â = 1, r = e^0.5 = 1.6487 > 1 + ε_high: L = −min(1.6487, 1 + ε_high) = −(1 + ε_high); grad 0.
    logprobs = leaf([[0.5]])
    loss = grpo.ppo_clip(logprobs, torch.zeros(1, 1, dtype=F64), torch.ones(1, dtype=F64), eps_high=eps_high)
    close(loss, expected)
    close(grad_of(loss.sum(), logprobs), 0.0)


def test_o4_clip_negative_advantage() -> None:
    # Â = −1, r = e^−0.5 = 0.6065 < 0.8: L = max(0.6065, 0.8) = 0.8 (clipped branch); grad 0.
    logprobs = leaf([[-0.5]])
    loss = grpo.ppo_clip(logprobs, torch.zeros(1, 1, dtype=F64), -torch.ones(1, dtype=F64))
    close(loss, 0.8)
    close(grad_of(loss.sum(), logprobs), 0.0)


@pytest.mark.parametrize(
    ("delta", "expected", "expected_grad"),
    [
        (None, math.exp(2), math.exp(2)),  # vanilla: L = −r·Â = e² = 7.389, ∂L/∂ℓ = −r·Â = 7.389
        (4.0, 4.0, 0.0),  # INTELLECT-2 δ = 4: ρ₁ = min(e², 4) = 4, L = 4, no gradient
        (3.0, 3.0, 0.0),  # verl dual-clip c = 3 is the same function: L = 3, no gradient
    ],
)
def test_o5_large_ratio_negative_advantage(
    delta: float | None, expected: float, expected_grad: float
) -> None:
    logprobs = leaf([[2.0]])
    loss = grpo.ppo_clip(logprobs, torch.zeros(1, 1, dtype=F64), -torch.ones(1, dtype=F64), delta=delta)
    close(loss, expected)
    close(grad_of(loss.sum(), logprobs), expected_grad)
    if delta is None:
        close(loss, 7.389, atol=1e-4)


@pytest.mark.parametrize("delta", [None, 4.0, 1.5])
def test_o6_small_ratio_positive_advantage_not_clipped(delta: float | None) -> None:
    # Â = +1, r = e^−2 = 0.13534: −r·Â = −0.13534 > −0.8·Â, so L = −0.13534, ∂L/∂ℓ = −r·Â = −0.13534.
    logprobs = leaf([[-2.0]])
    loss = grpo.ppo_clip(logprobs, torch.zeros(1, 1, dtype=F64), torch.ones(1, dtype=F64), delta=delta)
    close(loss, -math.exp(-2))
    close(loss, -0.13534, atol=ROUNDED)
    close(grad_of(loss.sum(), logprobs), -math.exp(-2))


def test_o7_gspo_vs_token_clip() -> None:
    # log-ratios [0.3, −0.3], Â = 1. GSPO: log s = 0 -> s = 1 -> L = −1.
    # Token clip: e^0.3 = 1.3499 -> −1.2; e^−0.3 = 0.7408 (inside [0.8, 1.2]? no, below, but Â > 0 so
    # −min(0.7408, 0.8) = −0.7408); mean = −(1.2 + e^−0.3)/2 = −0.97041.
    old = torch.zeros(1, 2, dtype=F64)
    logprobs = leaf([[0.3, -0.3]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.ones(1, dtype=F64)
    gspo_loss = grpo.aggregate(grpo.gspo(logprobs, old, adv, mask), mask, "seq_mean_token_mean")
    close(gspo_loss, -1.0)
    token_loss = grpo.aggregate(grpo.ppo_clip(logprobs, old, adv, mask), mask, "token_mean")
    close(token_loss, -(1.2 + math.exp(-0.3)) / 2)
    close(token_loss, -0.97041, atol=ROUNDED)


def test_o7b_gspo_clip() -> None:
    # log-ratios [3, −3, 0.6]: mean 0.2 -> s = e^0.2 = 1.2214 > 1.2 -> L = −1.2 with ε = 0.2, grad 0.
    # Token clip: −1.2, −e^−3 = −0.049787, −1.2 -> mean −0.81660.
    old = torch.zeros(1, 3, dtype=F64)
    logprobs = leaf([[3.0, -3.0, 0.6]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.ones(1, dtype=F64)
    gspo_loss = grpo.aggregate(
        grpo.gspo(logprobs, old, adv, mask, eps_low=0.2, eps_high=0.2), mask, "seq_mean_token_mean"
    )
    close(gspo_loss, -1.2)
    close(grad_of(gspo_loss, logprobs), [[0.0, 0.0, 0.0]])
    token_loss = grpo.aggregate(grpo.ppo_clip(logprobs, old, adv, mask), mask, "token_mean")
    close(token_loss, -(2.4 + math.exp(-3)) / 3)
    close(token_loss, -0.81660, atol=ROUNDED)


@pytest.mark.parametrize(
    ("log_ratio", "is_floor", "is_cap", "expected_grad"),
    [
        (0.0, 0.0, 5.0, -1.0),  # r = 1: w = 1, ∂L/∂ℓ = −w·Â = −1
        (2.0, 0.0, 5.0, -5.0),  # r = e² = 7.39 capped at TRL/ScaleRL's absolute 5 -> −5
        (2.0, 0.8, 1.2, -1.2),  # verl's offset form clip(r, 1 − 0.2, 1 + 0.2) -> −1.2
    ],
)
def test_o8_cispo(log_ratio: float, is_floor: float, is_cap: float, expected_grad: float) -> None:
    # ℓ = −1, Â = 1: L = −sg[w]·Â·ℓ = w; with r = 1 the value is 1.0.
    logprobs = leaf([[-1.0]])
    old = torch.tensor([[-1.0 - log_ratio]], dtype=F64)
    loss = grpo.cispo(logprobs, old, torch.ones(1, dtype=F64), is_cap=is_cap, is_floor=is_floor)
    close(loss, -expected_grad)  # value w·1 = −(∂L/∂ℓ)
    close(grad_of(loss.sum(), logprobs), expected_grad)
    if log_ratio == 0.0:
        close(loss, 1.0)


@pytest.mark.parametrize(("adv", "expected"), [(1.0, -2.0), (-1.0, 2 / 1.05)])
def test_o9_sapo(adv: float, expected: float) -> None:
    # r = 1: L = −Â·σ(0)·4/τ = −2Â/τ: τ = 1, Â = 1 -> −2; τ = 1.05, Â = −1 -> +1.90476.
    # ∂L/∂r = −Â·τσ'(0)·4/τ = −Â (σ'(0) = 1/4), and ∂r/∂ℓ = r = 1, so ∂L/∂ℓ = −Â.
    logprobs = leaf([[-0.4]])
    loss = grpo.sapo(logprobs, logprobs.detach(), torch.tensor([adv], dtype=F64))
    close(loss, expected)
    close(grad_of(loss.sum(), logprobs), -adv)
    if adv < 0:
        close(loss, 1.90476, atol=ROUNDED)


def test_o16_mask_robustness() -> None:
    # +inf / NaN in ℓ, ℓ_old and Â at masked positions: loss and gradient equal the O1 values, finite.
    logprobs = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.5, float("inf")]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.5, float("nan")]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, float("nan")]], dtype=F64)
    # ratio = 1 on valid tokens: old equals ℓ there.
    mask = torch.tensor(O1_MASK, dtype=torch.bool)
    for objective in (grpo.ppo_clip, grpo.gspo, grpo.cispo, grpo.sapo):
        per_token = objective(logprobs, old, adv, mask)
        loss = grpo.aggregate(per_token, mask, "token_mean")
        grad = grad_of(loss, logprobs)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), objective.__name__
        assert grad[1, 2] == 0
    ppo = grpo.aggregate(grpo.ppo_clip(logprobs, old, adv, mask), mask, "token_mean")
    close(ppo, -0.2)
    close(grad_of(ppo, logprobs), [[-0.2, -0.2, -0.2], [0.2, 0.2, 0.0]])
    ref = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.5, float("-inf")]], dtype=F64)
    kl = grpo.aggregate(grpo.kl_k3(logprobs, ref, mask), mask, "token_mean")
    close(kl, 0.0)
    assert torch.isfinite(grad_of(kl, logprobs)).all()


def test_o23_delta_inert_for_positive_advantage() -> None:
    # Â = +1, r = 10, δ = 4, ε = 0.2: ρ₁ = 4, ρ₂ = 1.2, L = max(−4, −1.2) = −1.2, as without δ; grad 0.
    logprobs = leaf([[math.log(10)]])
    old = torch.zeros(1, 1, dtype=F64)
    adv = torch.ones(1, dtype=F64)
    with_delta = grpo.ppo_clip(logprobs, old, adv, delta=4.0)
    close(with_delta, -1.2)
    close(grpo.ppo_clip(logprobs, old, adv), -1.2)
    close(grad_of(with_delta.sum(), logprobs), 0.0)


def test_o24_gspo_gradient() -> None:
    # B = 1, |o| = 3 valid tokens (+1 pad), log-ratios [0.1, −0.05, 0]: log s = 0.05/3, s = e^(1/60),
    # unclipped with ε = 0.2, Â = 2 -> 𝓛 = −s·Â and ∂𝓛/∂ℓ_t = −Â·s/|o| on every valid token.
    logprobs = leaf([[-1.0, -2.0, -0.5, -4.0]])
    old = logprobs.detach() - torch.tensor([[0.1, -0.05, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([2.0], dtype=F64)
    loss = grpo.aggregate(
        grpo.gspo(logprobs, old, adv, mask, eps_low=0.2, eps_high=0.2), mask, "seq_mean_token_mean"
    )
    s = math.exp(0.05 / 3)
    close(loss, -2.0 * s)
    g = -2.0 * s / 3
    close(grad_of(loss, logprobs), [[g, g, g, 0.0]])
