"""Oracle rows of shared/reference/grpo.md §4 for loss aggregation (O1, O1b–O1e, O14, O15):
token-mean, sequence-mean and constant normalisers, micro-batch and padding invariance.
Values and gradients in float64, rtol 0; each test carries the hand derivation.
"ratio = 1" means ℓ_old is ℓ detached, so r ≡ 1 in value while the gradient still flows through ℓ.
"""

from __future__ import annotations

import pytest
import torch
from grpo_oracles_lib import (  # type: ignore[import-not-found]
    F64,
    ROUNDED,
    close,
    grad_of,
    leaf,
    o1_per_token,
)

import grpo


def o1_loss(mode: str, **options: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(𝓛, ℓ): the O1 batch (ℓ a leaf, ratio = 1) through ppo_clip, aggregated by ``mode``."""
    logprobs = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]])
    per_token, mask = o1_per_token(logprobs)
    return grpo.aggregate(per_token, mask, mode, **options), logprobs


def test_o1_token_mean_value_and_gradient() -> None:
    # S = Σ m·L = −3 + 2 = −1 over 5 valid tokens -> −0.2; ∂𝓛/∂ℓ = −r·Â/5 = −Â/5 on valid tokens.
    loss, logprobs = o1_loss("token_mean")
    close(loss, -0.2)
    close(grad_of(loss, logprobs), [[-0.2, -0.2, -0.2], [0.2, 0.2, 0.0]])


def test_o1b_seq_mean_token_mean() -> None:
    # Row means: −3/3 = −1 and +2/2 = +1; their mean is 0 (the length bias is invisible).
    # Gradient: row 1 −1/(2·3) per token, row 2 +1/(2·2) per token.
    loss, logprobs = o1_loss("seq_mean_token_mean")
    close(loss, 0.0)
    close(grad_of(loss, logprobs), [[-1 / 6, -1 / 6, -1 / 6], [0.25, 0.25, 0.0]])


def test_o1c_seq_mean_token_sum() -> None:
    # (−3 + 2)/B with B = 2 -> −0.5; gradient −Â/2.
    loss, logprobs = o1_loss("seq_mean_token_sum")
    close(loss, -0.5)
    close(grad_of(loss, logprobs), [[-0.5, -0.5, -0.5], [0.5, 0.5, 0.0]])


@pytest.mark.parametrize(("constant", "expected"), [(3.0, -1 / 6), (4.0, -0.125)])
def test_o1d_dr_grpo_constant(constant: float, expected: float) -> None:
    # S/(B·C): Dr.GRPO C = 3 -> −1/(2·3) = −0.16667; TRL dr_grpo C = 4 -> −1/(2·4) = −0.125.
    loss, logprobs = o1_loss("constant", constant=constant)
    close(loss, expected)
    close(loss, round(expected, 5), atol=ROUNDED)
    close(grad_of(loss, logprobs), torch.tensor([[-1, -1, -1], [1, 1, 0]], dtype=F64) / (2 * constant))


def test_o1e_intellect2_rows_times_columns() -> None:
    # prime-rl@4bb0ff01f divides the masked sum by B·L = 2·3 = 6 -> −1/6 = "constant" with C = L.
    loss, _ = o1_loss("constant", num_seqs=2, constant=3)
    close(loss, -1 / 6)


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
