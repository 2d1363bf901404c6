"""Data filters and length shaping applied around the advantage computation.

* :func:`informative_groups` -- DAPO dynamic sampling: keep groups whose rewards differ.
* :func:`nonzero_advantage_mask` -- INTELLECT-2 ``ignore_zero_advantages``.
* :func:`mask_truncated` -- DAPO overlong filtering: no loss on truncated completions.
* :func:`soft_overlong_penalty` -- DAPO soft overlong punishment (reward shaping).

Pitfall: filter *after* computing advantages over the full groups (truncated samples still
belong to their group's mean/std), unless you mean to change the baseline.
"""

from __future__ import annotations

import torch

from grpo.errors import InvalidParameterError, ShapeError, check_finite_param
from grpo.tensor_checks import as_bool_mask

__all__ = ["informative_groups", "mask_truncated", "nonzero_advantage_mask", "soft_overlong_penalty"]


def informative_groups(rewards: torch.Tensor, group_size: int, *, tol: float = 0.0) -> torch.Tensor:
    """Bool ``[num_groups]``: True where a group's rewards are not all equal (max − min > tol).

    DAPO dynamic sampling (arXiv 2503.14476): a group whose completions all score the same
    has zero advantage everywhere and contributes no gradient. Expand to samples with
    ``keep.repeat_interleave(group_size)``.
    Pitfall: for float rewards compare with a tolerance, not ``std == 0``.
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        raise ShapeError("rewards must be a 1-D tensor [num_groups * group_size]")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidParameterError(f"group_size must be an int >= 1, got {group_size!r}")
    if rewards.numel() % group_size:
        raise ShapeError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    check_finite_param("tol", tol)
    grouped = rewards.detach().view(-1, group_size)
    spread = grouped.amax(dim=1) - grouped.amin(dim=1)
    return spread > tol


def nonzero_advantage_mask(advantages: torch.Tensor) -> torch.Tensor:
    """Bool ``[B]``: True for samples whose advantage is not exactly 0.

    INTELLECT-2 ``ignore_zero_advantages=true`` dropped such samples (prime-rl@4bb0ff01f
    ``data.py``); it relies on all-equal groups giving an exact 0 (see
    :func:`grpo.group_zscore`). ``[B, T]`` advantages: True where any token is non-zero.
    Pitfall: dropped tokens also leave a token-mean denominator, which changes the
    effective step size compared with keeping them.
    """
    if not isinstance(advantages, torch.Tensor) or advantages.dim() not in (1, 2):
        raise ShapeError("advantages must be a [B] or [B, T] tensor")
    nonzero = advantages.detach() != 0
    return nonzero if nonzero.dim() == 1 else nonzero.any(dim=-1)


def mask_truncated(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Loss mask ``[B, T]`` with every row of a truncated completion switched off.

    ``truncated [B]`` bool: the completion hit the length limit without EOS (TRL
    ``mask_truncated_completions``; DAPO overlong filtering). Returns a bool mask.
    """
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ShapeError("mask must be a [B, T] tensor")
    valid = as_bool_mask(mask, mask)
    if not isinstance(truncated, torch.Tensor) or truncated.shape != (mask.shape[0],):
        raise ShapeError(f"truncated must be a [B]={mask.shape[0]} tensor")
    return valid & ~truncated.bool()[:, None]


def soft_overlong_penalty(lengths: torch.Tensor, *, max_length: int, cache_length: int) -> torch.Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476, eq. 13), a reward term ``[B]``.

    With L_max = ``max_length`` and L_cache = ``cache_length``:
    R = 0 if |y| <= L_max − L_cache; ((L_max − L_cache) − |y|)/L_cache if
    L_max − L_cache < |y| <= L_max; −1 if |y| > L_max. DAPO used L_max = 20480,
    L_cache = 4096 (TRL ``get_soft_overlong_punishment``). Add it to the task reward before
    computing advantages.
    """
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
        raise ShapeError("lengths must be a 1-D tensor [B] of completion lengths")
    if (
        not (isinstance(max_length, int) and isinstance(cache_length, int))
        or not 0 < cache_length <= max_length
    ):
        raise InvalidParameterError(
            f"need ints 0 < cache_length <= max_length, got cache_length={cache_length!r}, max_length={max_length!r}"
        )
    lengths = lengths.to(torch.float64)
    start = max_length - cache_length
    ramp = (start - lengths) / cache_length
    penalty = torch.where(lengths <= start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty).to(
        torch.get_default_dtype()
    )
