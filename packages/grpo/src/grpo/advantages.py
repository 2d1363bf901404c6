"""Advantage estimators: rewards of G completions per prompt -> one advantage per completion.

Rewards are a flat ``[num_groups * group_size]`` tensor with each group's completions
contiguous (``rewards.view(num_groups, group_size)``). Every estimator works group by
group, so changing one group's rewards never changes another group's advantages.
Outputs have the rewards' shape and dtype (floating point) and carry no gradient.
"""

from __future__ import annotations

import torch

from grpo.errors import InvalidParameterError, ShapeError, check_nonnegative

__all__ = ["group_center", "group_zscore", "rloo"]


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Validate ``rewards`` and return it as ``[num_groups, group_size]`` (detached, floating)."""
    if not isinstance(rewards, torch.Tensor):
        raise ShapeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() != 1:
        raise ShapeError(f"rewards must be 1-D [num_groups * group_size], got {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidParameterError(f"group_size must be an int >= 1, got {group_size!r}")
    if rewards.numel() % group_size != 0:
        raise ShapeError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if not bool(torch.isfinite(rewards).all()):
        raise ShapeError("rewards contain NaN or inf; score or drop those completions first")
    return rewards.detach().view(-1, group_size)


def group_zscore(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantage: Â_i = (r_i − mean_g r) / (std_g r + eps), std with Bessel's correction.

    Shapes: ``rewards [N]`` with ``N = num_groups * group_size`` -> ``[N]``.

    Defaults: sample (unbiased) std as TRL and verl; ``eps = 1e-6`` as verl and
    INTELLECT-2 (prime-rl@4bb0ff01f ``compute_advantages_grpo``); TRL uses 1e-4.
    Degenerate groups: an all-equal group gives exactly 0 (0 / (0 + eps)); a singleton
    group (``group_size == 1``) gives 0, the TRL choice (verl returns r instead).

    Pitfall: with non-dyadic rewards an all-equal group can leave a tiny float std
    residue that eps alone does not absorb; here the numerator is exactly 0 in that
    case, so the advantage stays exactly 0.
    """
    check_nonnegative("eps", eps)
    grouped = _grouped(rewards, group_size)
    if group_size == 1:
        return torch.zeros_like(grouped).view(-1)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True, correction=1)
    # All-equal groups: an exact 0 (mean() of identical floats can be off by an ulp, and
    # with eps = 0 the quotient would be 0/0).
    equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    zscore = centred / torch.where(equal, torch.ones_like(std), std + eps)
    return torch.where(equal, torch.zeros_like(zscore), zscore).view(-1)


def group_center(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr.GRPO advantage: Â_i = r_i − mean_g r (no std division).

    Shapes: ``rewards [N]`` -> ``[N]``. Dr.GRPO (arXiv 2503.20783 §3) drops the std because
    it up-weights prompts that are too easy or too hard ("question-level difficulty bias").
    All-equal and singleton groups give exactly 0.
    """
    grouped = _grouped(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(equal, torch.zeros_like(centred), centred).view(-1)


def rloo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out: Â_i = r_i − (1/(G−1)) Σ_{j≠i} r_j = G/(G−1)·(r_i − mean_g r).

    Shapes: ``rewards [N]`` -> ``[N]``. RLOO, arXiv 2402.14740 (verl
    ``compute_rloo_outcome_advantage`` uses the second form). A singleton group has no
    baseline (0/0); it gets 0, as TRL's ``nan_to_num``.
    """
    grouped = _grouped(rewards, group_size)
    if group_size == 1:
        return torch.zeros_like(grouped).view(-1)
    return (group_center(rewards, group_size).view_as(grouped) * (group_size / (group_size - 1))).view(-1)
