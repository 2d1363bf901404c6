"""Hostile inputs give a specific GrpoError with a message that says what to fix, never a crash."""

from __future__ import annotations

import pytest
import torch

import grpo

LP = torch.zeros(2, 3)
ADV = torch.zeros(2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: grpo.group_zscore(torch.zeros(5), 2), "do not split"),
        (lambda: grpo.group_zscore(torch.zeros(4), 0), "group_size"),
        (lambda: grpo.group_zscore(torch.zeros(2, 2), 2), "1-D"),
        (lambda: grpo.group_zscore(torch.tensor([1.0, float("nan")]), 2), "NaN"),
        (lambda: grpo.group_zscore(torch.zeros(4), 2, eps=-1.0), "eps"),
        (lambda: grpo.rloo([1.0, 0.0], 2), "torch.Tensor"),  # type: ignore[arg-type]
        (lambda: grpo.ppo_clip(LP, LP, ADV, delta=1.2), "delta must be > 1 \\+ eps_high"),
        (lambda: grpo.ppo_clip(LP, LP, ADV, eps_low=1.0), "eps_low"),
        (lambda: grpo.ppo_clip(LP, LP, ADV, eps_high=-0.1), "eps_high"),
        (lambda: grpo.ppo_clip(LP, LP, ADV, delta=float("inf")), "finite"),
        (lambda: grpo.ppo_clip(LP, LP[:, :2], ADV), "old_logprobs has shape"),
        (lambda: grpo.ppo_clip(LP, LP, torch.zeros(3)), "advantages must have shape"),
        (lambda: grpo.ppo_clip(LP, LP, ADV, torch.ones(2, 2)), "mask has shape"),
        (lambda: grpo.ppo_clip(LP[0], LP[0], ADV), r"\[B, T\]"),
        (lambda: grpo.ppo_clip(LP.long(), LP, ADV), "floating-point"),
        (lambda: grpo.cispo(LP, LP, ADV, is_cap=0.0), "is_floor < is_cap"),
        (lambda: grpo.sapo(LP, LP, ADV, tau_pos=0.0), "tau"),
        (lambda: grpo.aggregate(LP, None, "mean"), "unknown aggregation"),  # type: ignore[arg-type]
        (lambda: grpo.aggregate(LP, None, "constant"), "needs constant"),
        (lambda: grpo.aggregate(LP, None, "token_mean", num_tokens=-3), "num_tokens"),
        (lambda: grpo.aggregate(LP, None, "seq_mean_token_sum", num_seqs=float("nan")), "num_seqs"),
        (lambda: grpo.aggregate(LP, torch.full((2, 3), 2), "token_mean"), "0 and 1"),
        (lambda: grpo.truncated_is_weights(LP, LP, cap=0.0), "cap"),
        (lambda: grpo.masked_is_weights(LP, LP, low=2.0, high=1.0), "low < high"),
        (lambda: grpo.truncated_is_weights(LP, LP, level="row"), "level"),  # type: ignore[arg-type]
        (lambda: grpo.kl_penalty(LP, LP, estimator="k4"), "estimator"),  # type: ignore[arg-type]
        (lambda: grpo.high_entropy_mask(LP, None, top_fraction=0.0), "top_fraction"),
        (
            lambda: grpo.soft_overlong_penalty(torch.tensor([1]), max_length=10, cache_length=20),
            "cache_length",
        ),
        (lambda: grpo.informative_groups(torch.zeros(3), 2), "do not split"),
        (lambda: grpo.mask_truncated(torch.ones(2, 3), torch.ones(3, dtype=torch.bool)), "truncated"),
        (lambda: grpo.nonzero_advantage_mask(torch.zeros(1, 2, 3)), r"\[B\]"),
    ],
)
def test_hostile_inputs(call, message: str) -> None:
    with pytest.raises(grpo.GrpoError, match=message):
        call()


def test_errors_are_value_errors() -> None:
    assert issubclass(grpo.ShapeError, ValueError) and issubclass(grpo.InvalidParameterError, ValueError)


def test_all_masked_batch_gives_zero_loss_and_gradient() -> None:
    # An empty micro-batch (all padding) must contribute 0, not NaN, and keep the graph connected.
    logprobs = torch.full((2, 3), float("nan"), requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        loss = grpo.aggregate(grpo.ppo_clip(logprobs, logprobs.detach(), ADV, mask), mask, mode)
        (grad,) = torch.autograd.grad(loss, logprobs)
        assert loss.item() == 0.0 and torch.equal(grad, torch.zeros(2, 3))


def test_filters_happy_path() -> None:
    assert grpo.nonzero_advantage_mask(torch.tensor([0.0, 1.5, -0.0])).tolist() == [False, True, False]
    assert grpo.nonzero_advantage_mask(torch.tensor([[0.0, 0.0], [0.0, 2.0]])).tolist() == [False, True]
    mask = grpo.mask_truncated(torch.ones(2, 3), torch.tensor([True, False]))
    assert mask.tolist() == [[False] * 3, [True] * 3]
