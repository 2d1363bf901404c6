"""Aggregation: per-token loss ``[B, T]`` and mask -> scalar loss.

With S = Σ_{i,t} m_{i,t}·L_{i,t} and |o_i| = Σ_t m_{i,t}:

=======================  ===========================================  ==============================
mode                     scalar                                       used by
=======================  ===========================================  ==============================
``token_mean``           S / num_tokens                               DAPO, TRL ``dapo``/``bnpo``
``seq_mean_token_mean``  (1/num_seqs) Σ_i (1/|o_i|) Σ_t m·L           GRPO paper, TRL ``grpo``, GSPO
``seq_mean_token_sum``   S / num_seqs                                 verl ``seq-mean-token-sum``
``constant``             S / (num_seqs · constant)                    Dr.GRPO, INTELLECT-2
=======================  ===========================================  ==============================

Normalisers default to the local batch: ``num_tokens = Σ m`` and ``num_seqs`` = rows with at
least one valid token. For gradient accumulation or data parallelism pass the *global*
counts of the whole optimiser step; then the sum of the micro-batch losses (and of their
gradients) equals the loss of the full batch. Under DDP/FSDP, which *average* gradients
over ranks, multiply the global normaliser's effect back by ``world_size`` (i.e. pass
``num_tokens = global_tokens / world_size``); that scaling is the caller's job.
"""

from __future__ import annotations

import torch

from grpo.errors import InvalidParameterError, check_positive
from grpo.recipes import AGGREGATION_MODES, AggregationMode
from grpo.tensor_checks import as_bool_mask, check_2d

__all__ = ["AGGREGATION_MODES", "AggregationMode", "aggregate"]


def _normaliser(name: str, value: float | None, local: torch.Tensor) -> torch.Tensor | float:
    if value is None:
        return local.clamp(min=1)  # an all-masked micro-batch contributes 0, not NaN
    if isinstance(value, torch.Tensor):
        value = float(value)
    check_positive(name, value)
    return value


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor | None,
    mode: AggregationMode,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    """Reduce ``per_token_loss [B, T]`` over valid tokens (``mask [B, T]``) to a 0-dim tensor.

    ``mode`` is one of ``token_mean``, ``seq_mean_token_mean``, ``seq_mean_token_sum``,
    ``constant`` (formulas in the module docstring). ``num_tokens`` (token_mean) and
    ``num_seqs`` (the other modes) override the local counts; ``constant`` (required for
    ``constant``) is the per-sequence normaliser C: Dr.GRPO uses the generation budget
    (``max_completion_length``; Dr.GRPO code uses 3000), INTELLECT-2 the padded sequence
    length (prime-rl@4bb0ff01f divides by rows × columns of the micro-batch).

    Masked positions are *selected away* (``torch.where``), so NaN/inf there never reaches
    the result or its gradient.

    Pitfall: a per-micro-batch mean (the local default) of unequal micro-batches is not the
    full-batch mean (1 token of loss 1 and 3 tokens of loss 0 give 0.5, not 0.25); pass
    global normalisers. Never use the padded width as ``constant`` if padding varies.
    """
    check_2d("per_token_loss", per_token_loss)
    valid = as_bool_mask(mask, per_token_loss)
    zero = torch.zeros((), dtype=per_token_loss.dtype, device=per_token_loss.device)
    masked = torch.where(valid, per_token_loss, zero)  # [B, T]
    lengths = valid.sum(dim=-1)  # [B]
    local_seqs = (lengths > 0).sum().to(per_token_loss.dtype)
    if mode == "token_mean":
        local_tokens = lengths.sum().to(per_token_loss.dtype)
        return masked.sum() / _normaliser("num_tokens", num_tokens, local_tokens)
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(dim=-1) / lengths.clamp(min=1).to(per_token_loss.dtype)
        return per_seq.sum() / _normaliser("num_seqs", num_seqs, local_seqs)
    if mode == "seq_mean_token_sum":
        return masked.sum() / _normaliser("num_seqs", num_seqs, local_seqs)
    if mode == "constant":
        if constant is None:
            raise InvalidParameterError(
                "mode 'constant' needs constant= (e.g. max_completion_length for Dr.GRPO, "
                "the packed sequence length for INTELLECT-2)"
            )
        check_positive("constant", constant)
        return masked.sum() / (_normaliser("num_seqs", num_seqs, local_seqs) * constant)
    raise InvalidParameterError(f"unknown aggregation mode {mode!r}; choose one of {AGGREGATION_MODES}")
