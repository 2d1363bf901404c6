"""The GRPO-family RL objective for language models as small, exact, tested functions over tensors.

Three independent axes, each a pure function over tensors:

* advantages (rewards -> Â): :func:`group_zscore`, :func:`group_center`, :func:`rloo`;
* per-token objectives (ℓ, ℓ_old, Â -> L ``[B, T]``): :func:`ppo_clip` (clip-higher,
  INTELLECT-2 δ), :func:`gspo`, :func:`cispo`, :func:`sapo`; IS corrections
  :func:`truncated_is_weights`, :func:`masked_is_weights`;
* aggregation (L, mask -> scalar): :func:`aggregate`.

Plus regularisers (:func:`kl_k1`, :func:`kl_k2`, :func:`kl_k3`, :func:`entropy_bonus`),
memory-lean log-probs (:func:`selective_log_softmax`, :func:`entropy_from_logits`,
:func:`logprobs_from_hidden`), filters, sequence packing and the :class:`Loss` recipe helper.
"""

from grpo.advantages import group_center, group_zscore, rloo
from grpo.aggregate import AGGREGATION_MODES, AggregationMode, aggregate
from grpo.correction import importance_log_ratio, masked_is_weights, truncated_is_weights
from grpo.errors import GrpoError, InvalidParameterError, ShapeError
from grpo.filters import informative_groups, mask_truncated, nonzero_advantage_mask, soft_overlong_penalty
from grpo.hidden import LogprobsAndEntropy, logprobs_from_hidden
from grpo.logprobs import entropy_from_logits, selective_log_softmax
from grpo.loss import RECIPES, Loss, LossConfig, LossMetrics, LossOutput
from grpo.objectives import (
    ClipStats,
    cispo,
    clip_stats,
    dppo_tv_mask,
    gspo,
    ppo_clip,
    sapo,
    sequence_mean_log_ratio,
)
from grpo.packing import PackedBatch, Placement, block_causal_mask, first_fit_decreasing, pack_sequences
from grpo.regularizers import entropy_bonus, high_entropy_mask, kl_k1, kl_k2, kl_k3, kl_penalty

__version__ = "0.1.0"

__all__ = [
    "AGGREGATION_MODES",
    "RECIPES",
    "AggregationMode",
    "ClipStats",
    "GrpoError",
    "InvalidParameterError",
    "LogprobsAndEntropy",
    "Loss",
    "LossConfig",
    "LossMetrics",
    "LossOutput",
    "PackedBatch",
    "Placement",
    "ShapeError",
    "__version__",
    "aggregate",
    "block_causal_mask",
    "cispo",
    "clip_stats",
    "dppo_tv_mask",
    "entropy_bonus",
    "entropy_from_logits",
    "first_fit_decreasing",
    "group_center",
    "group_zscore",
    "gspo",
    "high_entropy_mask",
    "importance_log_ratio",
    "informative_groups",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty",
    "logprobs_from_hidden",
    "mask_truncated",
    "masked_is_weights",
    "nonzero_advantage_mask",
    "pack_sequences",
    "ppo_clip",
    "rloo",
    "sapo",
    "selective_log_softmax",
    "sequence_mean_log_ratio",
    "soft_overlong_penalty",
    "truncated_is_weights",
]
