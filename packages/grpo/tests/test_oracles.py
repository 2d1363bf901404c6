"""Every oracle row of shared/reference/grpo.md §4, values and gradients, float64, rtol 0.

Each test carries the hand derivation. "ratio = 1" means ℓ_old is ℓ detached, so r ≡ 1 in
value while the gradient still flows through ℓ.
"""

from __future__ import annotations

import math

import pytest
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


def test_o1_token_mean_value_and_gradient() -> None:
    # S = Σ m·L = −3 + 2 = −1 over 5 valid tokens -> −0.2; ∂𝓛/∂ℓ = −r·Â/5 = −Â/5 on valid tokens.
    logprobs = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]])
    per_token, mask = o1_per_token(logprobs)
    loss = grpo.aggregate(per_token, mask, "token_mean")
    close(loss, -0.2)
    close(grad_of(loss, logprobs), [[-0.2, -0.2, -0.2], [0.2, 0.2, 0.0]])


def test_o1b_seq_mean_token_mean() -> None:
    # Row means: −3/3 = −1 and +2/2 = +1; their mean is 0 (the length bias is invisible).
    # Gradient: row 1 −1/(2·3) per token, row 2 +1/(2·2) per token.
    logprobs = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]])
    per_token, mask = o1_per_token(logprobs)
    loss = grpo.aggregate(per_token, mask, "seq_mean_token_mean")
    close(loss, 0.0)
    close(grad_of(loss, logprobs), [[-1 / 6, -1 / 6, -1 / 6], [0.25, 0.25, 0.0]])


def test_o1c_seq_mean_token_sum() -> None:
    # (−3 + 2)/B with B = 2 -> −0.5; gradient −Â/2.
    logprobs = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]])
    per_token, mask = o1_per_token(logprobs)
    loss = grpo.aggregate(per_token, mask, "seq_mean_token_sum")
    close(loss, -0.5)
    close(grad_of(loss, logprobs), [[-0.5, -0.5, -0.5], [0.5, 0.5, 0.0]])


@pytest.mark.parametrize(("constant", "expected"), [(3.0, -1 / 6), (4.0, -0.125)])
def test_o1d_dr_grpo_constant(constant: float, expected: float) -> None:
    # S/(B·C): Dr.GRPO C = 3 -> −1/(2·3) = −0.16667; TRL dr_grpo C = 4 -> −1/(2·4) = −0.125.
    logprobs = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]])
    per_token, mask = o1_per_token(logprobs)
    loss = grpo.aggregate(per_token, mask, "constant", constant=constant)
    close(loss, expected)
    close(loss, round(expected, 5), atol=ROUNDED)
    close(grad_of(loss, logprobs), torch.tensor([[-1, -1, -1], [1, 1, 0]], dtype=F64) / (2 * constant))


def test_o1e_intellect2_rows_times_columns() -> None:
    # prime-rl@4bb0ff01f divides the masked sum by B·L = 2·3 = 6 -> −1/6 = "constant" with C = L.
    logprobs = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]])
    per_token, mask = o1_per_token(logprobs)
    loss = grpo.aggregate(per_token, mask, "constant", num_seqs=2, constant=3)
    close(loss, -1 / 6)


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


def test_o10_group_zscore() -> None:
    # r = [1,0,0,0]: mean 0.25, sample std sqrt((0.5625 + 3·0.0625)/3) = 0.5 ->
    # [0.75, −0.25, −0.25, −0.25]/(0.5 + 1e-6) = [1.5, −0.5, −0.5, −0.5]·(1 − 2e-6 + …).
    adv = grpo.group_zscore(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64), 4, eps=1e-6)
    close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=F64) / (0.5 + 1e-6))
    close(adv, [1.5, -0.5, -0.5, -0.5], atol=4e-6)
    assert adv.requires_grad is False


def test_o10b_dr_grpo_and_rloo() -> None:
    # group_center: r − 0.25; RLOO: r_i − mean of the other three = 4/3·(r − 0.25).
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    close(grpo.group_center(rewards, 4), [0.75, -0.25, -0.25, -0.25])
    close(grpo.rloo(rewards, 4), [1.0, -1 / 3, -1 / 3, -1 / 3])


@pytest.mark.parametrize(
    ("eps", "expected"), [(0.0, 1 / math.sqrt(2)), (1e-4, 0.5 / (math.sqrt(0.5) + 1e-4))]
)
def test_o10c_group_of_two(eps: float, expected: float) -> None:
    # r = [0, 1]: mean 0.5, sample std sqrt(0.5) = 0.70711 -> ±0.5/0.70711 = ±0.70711 (TRL ε 1e-4: ±0.70701).
    adv = grpo.group_zscore(torch.tensor([0.0, 1.0], dtype=F64), 2, eps=eps)
    close(adv, [-expected, expected])
    close(adv[1], 0.70711 if eps == 0 else 0.70701, atol=ROUNDED)


def test_o10d_degenerate_groups() -> None:
    # All-equal group: 0/(0 + ε) = 0 exactly for every estimator; singleton group: 0 (TRL's choice).
    equal = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.35, 0.35, 0.35, 0.35], dtype=F64)
    for estimator in (grpo.group_zscore, grpo.group_center, grpo.rloo):
        assert torch.equal(estimator(equal, 4), torch.zeros(8, dtype=F64))
        assert torch.equal(estimator(torch.tensor([3.0, -1.0, 0.5]), 1), torch.zeros(3))
    # Non-dyadic 0.35 in fp32 must still give an exact 0 (NeMo-RL #4161's residue).
    assert torch.equal(grpo.group_zscore(torch.full((16,), 0.35), 16), torch.zeros(16))


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


def test_o14_micro_batch_invariance() -> None:
    # mb1: 1 token of loss 1; mb2: 3 tokens of loss 0. Global token-mean = 1/4 = 0.25.
    # Local means would give (1 + 0)/2 = 0.5 (the bug).
    mb1, m1 = torch.tensor([[1.0]], dtype=F64), torch.ones(1, 1)
    mb2, m2 = torch.zeros(1, 3, dtype=F64), torch.ones(1, 3)
    global_sum = grpo.aggregate(mb1, m1, "token_mean", num_tokens=4) + grpo.aggregate(
        mb2, m2, "token_mean", num_tokens=4
    )
    close(global_sum, 0.25)
    full = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64)
    close(grpo.aggregate(full, torch.ones(1, 4), "token_mean"), 0.25)
    naive = (grpo.aggregate(mb1, m1, "token_mean") + grpo.aggregate(mb2, m2, "token_mean")) / 2
    close(naive, 0.5)


def test_o15_padding_invariance() -> None:
    # O1 padded from L = 3 to L = 6: token-mean −0.2, seq-mean-token-mean 0, constant C = 3 −1/6 unchanged.
    # Using the padded width as C (6) changes the value to −1/12: never derive C from the padding.
    lp3 = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]])
    lp6 = torch.cat([lp3.detach(), torch.full((2, 3), -9.0, dtype=F64)], dim=1).requires_grad_(True)
    for mode, extra in (("token_mean", {}), ("seq_mean_token_mean", {}), ("constant", {"constant": 3})):
        pt3, mask3 = o1_per_token(lp3)
        pt6, mask6 = o1_per_token(lp6, width=6)
        a = grpo.aggregate(pt3, mask3, mode, **extra)  # type: ignore[arg-type]
        b = grpo.aggregate(pt6, mask6, mode, **extra)  # type: ignore[arg-type]
        close(b, a.detach())
        close(grad_of(b, lp6)[:, :3], grad_of(a, lp3))
    pt6, mask6 = o1_per_token(lp6, width=6)
    close(grpo.aggregate(pt6, mask6, "constant", constant=6), -1 / 12)


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


def test_o19_soft_overlong_penalty() -> None:
    # L_max = 100, L_cache = 20: |y| <= 80 -> 0; 90 -> (80 − 90)/20 = −0.5; 100 -> −1; 101 > L_max -> −1.
    penalty = grpo.soft_overlong_penalty(torch.tensor([80, 90, 100, 101]), max_length=100, cache_length=20)
    close(penalty, [0.0, -0.5, -1.0, -1.0])


def test_o20_dynamic_sampling() -> None:
    # Groups [1,1,1,1], [0,0,0,0], [1,0,0,0]: only the third has a reward spread.
    rewards = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0], dtype=F64)
    assert grpo.informative_groups(rewards, 4).tolist() == [False, False, True]
    # Float rewards: a 1e-9 spread is noise with tol = 1e-6, not information.
    noisy = torch.tensor([0.35, 0.35 + 1e-9, 0.35, 0.35], dtype=F64)
    assert grpo.informative_groups(noisy, 4, tol=1e-6).tolist() == [False]


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
