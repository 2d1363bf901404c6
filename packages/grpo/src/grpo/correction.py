"""Importance-sampling corrections for the trainer/inference mismatch of asynchronous rollouts.

The inference engine (vLLM) samples from μ, whose log-probs ℓ^μ differ from the trainer's
recomputation ℓ_old of the same weights (kernels, precision, staleness). These functions
return per-token weights ``w [B, T]`` that multiply the per-token loss before aggregation
(``loss = w * ppo_clip(...)``), verl's "decoupled" mode (arXiv 2510.18855, Yao et al.
fengyao.notion.site/off-policy-rl):

* token level: log ρ_t = ℓ_old,t − ℓ^μ_t;
* sequence level: log ρ_i = Σ_t m·(ℓ_old − ℓ^μ) (a product of token ratios), broadcast over
  the sequence's tokens.

Weights are always detached (∇(w·L) = w·∇L; no bias term L·∇w), 0 at masked positions, and
the log-ratio is clamped to ±20 before ``exp``.

Pitfall: the sequence IS weight uses the *sum* of log-ratios, GSPO's ratio the *mean*
(:func:`grpo.sequence_mean_log_ratio`); they are different quantities.
"""

from __future__ import annotations

from typing import Literal

import torch

from grpo.errors import InvalidParameterError, check_positive, check_weight_band
from grpo.objectives import LOG_RATIO_CLAMP
from grpo.tensor_checks import as_bool_mask, check_2d, check_same_shape

__all__ = ["Level", "importance_log_ratio", "masked_is_weights", "truncated_is_weights"]

Level = Literal["token", "sequence"]


def importance_log_ratio(
    old_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    level: Level = "token",
) -> torch.Tensor:
    """Detached log ρ ``[B, T]``: ℓ_old − ℓ^μ per token, or its masked row sum broadcast (sequence).

    Clamped to ±20; 0 at masked positions (NaN/inf there never leaks).
    """
    check_2d("old_logprobs", old_logprobs)
    check_2d("inference_logprobs", inference_logprobs)
    check_same_shape("old_logprobs", old_logprobs, inference_logprobs=inference_logprobs)
    valid = as_bool_mask(mask, old_logprobs)
    zero = torch.zeros((), dtype=old_logprobs.dtype, device=old_logprobs.device)
    log_ratio = torch.where(valid, old_logprobs.detach() - inference_logprobs.detach(), zero)
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    elif level != "token":
        raise InvalidParameterError(f"level must be 'token' or 'sequence', got {level!r}")
    return torch.where(valid, log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), zero)


def truncated_is_weights(
    old_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    cap: float = 2.0,
    level: Level = "token",
) -> torch.Tensor:
    """Truncated importance sampling (TIS): w = sg[min(ρ, cap)], ``[B, T]``.

    Shapes: ``old_logprobs``, ``inference_logprobs``, ``mask`` ``[B, T]`` -> ``[B, T]``.
    Default ``cap = 2.0``: verl ``rollout_is_threshold`` (TIS blog, Yao et al.).
    Pitfall: truncation keeps far-off-policy tokens at weight ``cap``; to drop them use
    :func:`masked_is_weights`.
    """
    check_positive("cap", cap)
    valid = as_bool_mask(mask, old_logprobs)
    log_ratio = importance_log_ratio(old_logprobs, inference_logprobs, valid, level=level)
    weights = torch.exp(log_ratio).clamp(max=cap)
    return torch.where(valid, weights, torch.zeros_like(weights)).detach()


def masked_is_weights(
    old_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    low: float = 0.5,
    high: float = 2.0,
    level: Level = "token",
) -> torch.Tensor:
    """Masked importance sampling (MIS / IcePop, arXiv 2510.18855): w = sg[ρ·1[low <= ρ <= high]].

    Tokens (or whole sequences, ``level="sequence"``) whose ratio leaves the band get weight
    0 instead of a truncated one. Shapes as :func:`truncated_is_weights`.

    Defaults: the band [0.5, 2.0] is symmetric in log space around verl's TIS threshold
    2.0; TRL's ``sequence_mask`` uses (None, 3.0), prime-rl@5f47740dd token masks use
    [0.125, 8].
    Pitfall: masked tokens still count in a token-mean denominator unless you also drop
    them from the loss mask (``mask & (w > 0)``); choose deliberately.
    """
    check_weight_band("low", low, "high", high)
    valid = as_bool_mask(mask, old_logprobs)
    log_ratio = importance_log_ratio(old_logprobs, inference_logprobs, valid, level=level)
    ratio = torch.exp(log_ratio)
    keep = valid & (ratio >= low) & (ratio <= high)
    return torch.where(keep, ratio, torch.zeros_like(ratio)).detach()
