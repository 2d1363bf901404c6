"""Regularisers added to the per-token loss before aggregation: KL to a reference, entropy.

KL estimators (Schulman, joschu.net/blog/kl-approx.html) with x = ℓ_ref − ℓ, sampled under
the current policy, estimate KL(π_θ ‖ π_ref):

* k1 = −x (unbiased, can be negative), k2 = x²/2, k3 = e^x − x − 1 (unbiased, >= 0;
  verl's ``low_var_kl``).

The gradient flows through the *current* log-probs ℓ; ℓ_ref is detached.
Pitfall: feeding log-probs computed under ``no_grad`` (as prime-rl@4bb0ff01f did) makes the
KL term a constant with zero gradient; pass the ℓ you backpropagate through.
"""

from __future__ import annotations

import torch

from grpo.errors import InvalidParameterError, ShapeError, check_finite_param
from grpo.objectives import LOG_RATIO_CLAMP
from grpo.recipes import KLEstimator
from grpo.tensor_checks import as_bool_mask, check_2d, check_same_shape

__all__ = [
    "KLEstimator",
    "entropy_bonus",
    "high_entropy_mask",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty",
]


def _ref_log_ratio(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid, x = ℓ_ref − ℓ clamped to ±20 and 0 at masked positions), both ``[B, T]``."""
    check_2d("logprobs", logprobs)
    check_2d("ref_logprobs", ref_logprobs)
    check_same_shape("logprobs", logprobs, ref_logprobs=ref_logprobs)
    valid = as_bool_mask(mask, logprobs)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    x = torch.where(valid, ref_logprobs.detach() - logprobs, zero)
    return valid, x.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def kl_k1(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k1 = ℓ − ℓ_ref per token ``[B, T]`` (0 at masked positions)."""
    _, x = _ref_log_ratio(logprobs, ref_logprobs, mask)
    return -x


def kl_k2(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k2 = (ℓ_ref − ℓ)²/2 per token ``[B, T]`` (0 at masked positions)."""
    _, x = _ref_log_ratio(logprobs, ref_logprobs, mask)
    return 0.5 * x * x


def kl_k3(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k3 = e^x − x − 1 with x = ℓ_ref − ℓ, per token ``[B, T]`` (>= 0; 0 at masked positions).

    GRPO's KL term (DeepSeekMath, arXiv 2402.03300, eq. 4); verl ``low_var_kl``.
    """
    _, x = _ref_log_ratio(logprobs, ref_logprobs, mask)
    return torch.expm1(x) - x


_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    estimator: KLEstimator = "k3",
) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` by name (``k1``, ``k2``, ``k3``; default k3 as GRPO).

    Add ``beta * kl_penalty(...)`` to the per-token loss before aggregation (TRL does).
    Defaults for β: DeepSeekMath 0.04; TRL 0.0; verl ``kl_loss_coef`` 0.001.
    """
    if estimator not in _ESTIMATORS:
        raise InvalidParameterError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")
    return _ESTIMATORS[estimator](logprobs, ref_logprobs, mask)


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor | None = None, *, coef: float = 0.001
) -> torch.Tensor:
    """Per-token entropy bonus term −coef·H ``[B, T]`` to *add* to the per-token loss.

    ``entropy [B, T]`` from :func:`grpo.entropy_from_logits` or
    :func:`grpo.logprobs_from_hidden` (with grad, or the bonus does nothing).
    Default coef = 0.001 (INTELLECT-2, prime-rl@4bb0ff01f ``entropy_loss_coeff``).
    """
    check_2d("entropy", entropy)
    check_finite_param("coef", coef)
    valid = as_bool_mask(mask, entropy)
    return torch.where(valid, -coef * entropy, torch.zeros((), dtype=entropy.dtype, device=entropy.device))


def high_entropy_mask(
    entropy: torch.Tensor, mask: torch.Tensor | None, *, top_fraction: float = 0.2
) -> torch.Tensor:
    """Keep only the highest-entropy tokens ("Beyond the 80/20 Rule", arXiv 2506.01939).

    Returns a bool ``[B, T]`` mask: valid tokens with H >= q, q the (1 − top_fraction)
    quantile of H over valid tokens with linear interpolation (as ``torch.quantile``);
    ties at q are kept. Default top_fraction = 0.2 (the paper's recommendation).
    Pitfall: under data parallelism the quantile should be over all ranks' tokens; this
    function sees only the local batch.
    """
    check_2d("entropy", entropy)
    check_finite_param("top_fraction", top_fraction)
    if not 0.0 < top_fraction <= 1.0:
        raise InvalidParameterError(f"top_fraction must be in (0, 1], got {top_fraction}")
    valid = as_bool_mask(mask, entropy)
    values = entropy.detach()[valid]
    if values.numel() == 0:
        return valid.clone()
    if not bool(torch.isfinite(values).all()):
        raise ShapeError("entropy has NaN/inf at valid positions")
    ordered = values.sort().values
    position = (1.0 - top_fraction) * (ordered.numel() - 1)
    below = int(position)
    above = min(below + 1, ordered.numel() - 1)
    threshold = ordered[below] + (position - below) * (ordered[above] - ordered[below])
    return valid & (entropy.detach() >= threshold)
