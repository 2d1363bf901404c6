"""The GRPO-family RL objective for language models as small, exact, tested functions over tensors.

Three independent axes, each a pure function over tensors:

* advantages (rewards -> Â): :func:`group_zscore`, :func:`group_center`, :func:`rloo`;
* per-token objectives (ℓ, ℓ_old, Â -> L ``[B, T]``): :func:`ppo_clip` (clip-higher,
  INTELLECT-2 δ), :func:`gspo`, :func:`cispo`, :func:`sapo`; IS corrections
  :func:`truncated_is_weights`, :func:`masked_is_weights`;
* aggregation (L, mask -> scalar): :func:`aggregate`.

Plus regularisers (:func:`kl_k1`, :func:`kl_k2`, :func:`kl_k3`, :func:`entropy_bonus`),
memory-lean log-probs (:func:`selective_log_softmax`, :func:`entropy_from_logits`,
:func:`logprobs_from_hidden`), filters, sequence packing, attention within the packed sequences
(:func:`document_attention`, no ``L x L`` mask), a GRPO group's shared prompt computed once
(:func:`pack_shared_prefix`, :func:`shared_prefix_attention`), activation checkpointing that
recomputes with the forward's attention (:func:`enable_activation_checkpointing`) and the
:class:`Loss` recipe helper.

Import cost: the errors and the recipes as plain data (:class:`LossConfig`, :data:`RECIPES`,
:func:`loss_config`) load with the package and need no torch, so a config loader can validate a
loss on a machine that never trains. Every name that computes with tensors is imported on first
use (PEP 562 ``__getattr__``), which is when torch loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from grpo.errors import GrpoError, InvalidParameterError, RecomputeError, ShapeError
from grpo.recipes import AGGREGATION_MODES, RECIPES, AggregationMode, LossConfig, loss_config

__version__ = "0.1.0"

from grpo._name_clash import warn_on_name_clash as _warn_on_name_clash

_warn_on_name_clash("grpo", "intellect2-grpo", others_hint="an unrelated PyPI project `grpo`")

# Name -> submodule, for the names that need torch (imported on first attribute access).
_TORCH_EXPORTS = {
    "group_center": "advantages",
    "document_attention": "attention",
    "document_block_mask": "attention",
    "document_kwargs": "attention",
    "use_document_attention": "attention",
    "enable_activation_checkpointing": "activation_checkpointing",
    "group_zscore": "advantages",
    "rloo": "advantages",
    "aggregate": "aggregation",
    "importance_log_ratio": "correction",
    "masked_is_weights": "correction",
    "truncated_is_weights": "correction",
    "informative_groups": "filters",
    "mask_truncated": "filters",
    "nonzero_advantage_mask": "filters",
    "soft_overlong_penalty": "filters",
    "LogprobsAndEntropy": "hidden",
    "logprobs_from_hidden": "hidden",
    "entropy_from_logits": "logprobs",
    "selective_log_softmax": "logprobs",
    "Loss": "loss",
    "LossMetrics": "loss",
    "LossOutput": "loss",
    "ClipStats": "objectives",
    "cispo": "objectives",
    "clip_stats": "objectives",
    "dppo_tv_mask": "objectives",
    "gspo": "objectives",
    "ppo_clip": "objectives",
    "sapo": "objectives",
    "sequence_mean_log_ratio": "objectives",
    "PackedBatch": "packing",
    "Placement": "packing",
    "block_causal_mask": "packing",
    "first_fit_decreasing": "packing",
    "pack_sequences": "packing",
    "SharedPlacement": "prefix_packing",
    "SharedPrefixPack": "prefix_packing",
    "pack_shared_prefix": "prefix_packing",
    "SharedPrefixStructure": "shared_prefix",
    "shared_prefix_attention": "shared_prefix",
    "shared_prefix_block_mask": "shared_prefix",
    "shared_prefix_kwargs": "shared_prefix",
    "entropy_bonus": "regularizers",
    "high_entropy_mask": "regularizers",
    "kl_k1": "regularizers",
    "kl_k2": "regularizers",
    "kl_k3": "regularizers",
    "kl_penalty": "regularizers",
}

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
    "RecomputeError",
    "ShapeError",
    "SharedPlacement",
    "SharedPrefixPack",
    "SharedPrefixStructure",
    "__version__",
    "aggregate",
    "block_causal_mask",
    "cispo",
    "clip_stats",
    "document_attention",
    "document_block_mask",
    "document_kwargs",
    "dppo_tv_mask",
    "enable_activation_checkpointing",
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
    "loss_config",
    "mask_truncated",
    "masked_is_weights",
    "nonzero_advantage_mask",
    "pack_sequences",
    "pack_shared_prefix",
    "ppo_clip",
    "rloo",
    "sapo",
    "selective_log_softmax",
    "sequence_mean_log_ratio",
    "shared_prefix_attention",
    "shared_prefix_block_mask",
    "shared_prefix_kwargs",
    "soft_overlong_penalty",
    "truncated_is_weights",
    "use_document_attention",
]


# Submodules load on first access too (``grpo.logprobs.CHUNK_ELEMENTS``). No submodule shares a
# name with an exported function: importing ``grpo.x`` sets the package attribute ``x`` to the
# module, which would hide a function ``grpo.x`` (hence ``aggregation.py`` holds ``aggregate``).
_SUBMODULES = frozenset(_TORCH_EXPORTS.values()) | {"tensor_checks"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"grpo.{name}")
    module = _TORCH_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"grpo.{module}"), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from grpo.activation_checkpointing import enable_activation_checkpointing
    from grpo.advantages import group_center, group_zscore, rloo
    from grpo.aggregation import aggregate
    from grpo.attention import (
        document_attention,
        document_block_mask,
        document_kwargs,
        use_document_attention,
    )
    from grpo.correction import importance_log_ratio, masked_is_weights, truncated_is_weights
    from grpo.filters import informative_groups, mask_truncated, nonzero_advantage_mask, soft_overlong_penalty
    from grpo.hidden import LogprobsAndEntropy, logprobs_from_hidden
    from grpo.logprobs import entropy_from_logits, selective_log_softmax
    from grpo.loss import Loss, LossMetrics, LossOutput
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
    from grpo.prefix_packing import SharedPlacement, SharedPrefixPack, pack_shared_prefix
    from grpo.regularizers import entropy_bonus, high_entropy_mask, kl_k1, kl_k2, kl_k3, kl_penalty
    from grpo.shared_prefix import (
        SharedPrefixStructure,
        shared_prefix_attention,
        shared_prefix_block_mask,
        shared_prefix_kwargs,
    )
