"""A recipe as a callable loss: one object composing advantage, objective, aggregation, regularisers.

The recipes themselves (:class:`~grpo.recipes.LossConfig`, :data:`~grpo.recipes.RECIPES`) are
torch-free plain data in :mod:`grpo.recipes`; :class:`Loss` is what computes with them.

>>> loss_fn = Loss("dapo")
>>> out = loss_fn(logprobs, old_logprobs, advantages, mask, num_tokens=global_tokens)  # doctest: +SKIP
>>> out.loss.backward()  # doctest: +SKIP

Per-token loss = w_IS · objective + kl_coef · KL − entropy_coef · H, then :func:`grpo.aggregate`.

==============  ============  =========================  ======================  ==============
recipe          advantage     objective                  aggregation             regularisers
==============  ============  =========================  ======================  ==============
``intellect2``  group_zscore  ppo_clip ε 0.2/0.2, δ = 4  constant (C = seq len)  entropy 0.001
``grpo``        group_zscore  ppo_clip ε 0.2/0.2         seq_mean_token_mean     k3 KL β = 0.04
``dr_grpo``     group_center  ppo_clip ε 0.2/0.2         constant (C = max gen)  none
``dapo``        group_zscore  ppo_clip ε 0.2/0.28        token_mean              none
``gspo``        group_zscore  gspo ε 3e-4/4e-4           seq_mean_token_mean     none
``cispo``       group_zscore  cispo is_cap 5             token_mean              none
``sapo``        group_zscore  sapo τ 1.0/1.05            seq_mean_token_mean     none
==============  ============  =========================  ======================  ==============

Sources: INTELLECT-2 (arXiv 2505.07291; prime-rl@4bb0ff01f ``train.py`` defaults), GRPO
(DeepSeekMath arXiv 2402.03300 §4.1, β = 0.04), Dr.GRPO (arXiv 2503.20783), DAPO (arXiv
2503.14476), GSPO (arXiv 2507.18071 v2 §5.1), CISPO (arXiv 2506.13585; ScaleRL cap 5), SAPO
(arXiv 2511.20347; τ as TRL and verl).

Micro-batching: call the loss once per micro-batch with the *global* normalisers of the
optimiser step (``num_tokens`` for token_mean, ``num_seqs`` for the sequence modes,
``constant`` for constant) and sum the results (or call ``backward`` on each); the
accumulated gradient then equals the full-batch gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo.advantages import group_center, group_zscore, rloo
from grpo.aggregation import aggregate
from grpo.correction import Level, masked_is_weights, truncated_is_weights
from grpo.errors import InvalidParameterError
from grpo.objectives import (
    LOG_RATIO_CLAMP,
    ClipStats,
    cispo,
    clip_stats,
    gspo,
    ppo_clip,
    sapo,
    sequence_mean_log_ratio,
)
from grpo.recipes import LossConfig, loss_config
from grpo.regularizers import entropy_bonus, kl_k3, kl_penalty
from grpo.tensor_checks import as_bool_mask, check_2d, check_same_shape

__all__ = ["Loss", "LossMetrics", "LossOutput"]

_ADVANTAGES = {"group_zscore": group_zscore, "group_center": group_center, "rloo": rloo}


@dataclass(frozen=True)
class LossMetrics:
    """Detached diagnostics of one call, as masked means over its valid tokens.

    ``kl``, ``entropy`` and ``mismatch_kl`` are None when their inputs were not given.
    ``mismatch_kl`` is the k3 estimate of KL(μ ‖ π_old) between the inference engine μ
    and the trainer's ℓ_old; ``is_masked_fraction`` is the share of valid tokens an MIS
    correction zeroed.
    """

    clip_low_fraction: float
    clip_high_fraction: float
    delta_capped_fraction: float
    mean_ratio: float
    policy_loss: float
    num_tokens: int
    kl: float | None = None
    entropy: float | None = None
    mismatch_kl: float | None = None
    is_masked_fraction: float | None = None

    def as_dict(self) -> dict[str, float]:
        """Metrics under TRL-style names, omitting the ones that were not computed."""
        names = {
            "clip_ratio/low_mean": self.clip_low_fraction,
            "clip_ratio/high_mean": self.clip_high_fraction,
            "clip_ratio/delta_mean": self.delta_capped_fraction,
            "ratio/mean": self.mean_ratio,
            "loss/policy": self.policy_loss,
            "num_tokens": float(self.num_tokens),
            "kl": self.kl,
            "entropy": self.entropy,
            "mismatch_kl": self.mismatch_kl,
            "is_masked": self.is_masked_fraction,
        }
        return {k: float(v) for k, v in names.items() if v is not None}


@dataclass(frozen=True)
class LossOutput:
    """``loss``: 0-dim tensor to backpropagate; ``metrics``: detached :class:`LossMetrics`."""

    loss: torch.Tensor
    metrics: LossMetrics


def _objective(
    cfg: LossConfig, logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    if cfg.objective == "ppo_clip":
        return ppo_clip(logprobs, old, adv, mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high, delta=cfg.delta)
    if cfg.objective == "gspo":
        return gspo(logprobs, old, adv, mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high)
    if cfg.objective == "sapo":
        return sapo(logprobs, old, adv, mask, tau_pos=cfg.tau_pos, tau_neg=cfg.tau_neg)
    return cispo(logprobs, old, adv, mask, is_cap=cfg.is_cap, is_floor=cfg.is_floor)


def _masked_mean(values: torch.Tensor, valid: torch.Tensor) -> float:
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    return float(torch.where(valid, values.detach(), zero).sum() / max(int(valid.sum()), 1))


class Loss:
    """A recipe's loss as a callable: ``Loss("intellect2", constant=seq_len)(ℓ, ℓ_old, Â, mask)``.

    ``recipe`` names an entry of :data:`~grpo.recipes.RECIPES` (or pass a :class:`LossConfig`); keyword
    ``overrides`` replace single fields, e.g. ``Loss("dapo", kl_coef=0.001)``. The config is
    frozen and validated at construction.
    """

    def __init__(self, recipe: str | LossConfig = "intellect2", **overrides: Any) -> None:
        self.config: LossConfig = loss_config(recipe, **overrides)

    def __repr__(self) -> str:
        return f"Loss({self.config!r})"

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """The recipe's advantages ``[N]`` for rewards ``[N]`` in contiguous groups of ``group_size``."""
        if self.config.advantage == "group_zscore":
            return group_zscore(rewards, group_size, eps=self.config.std_eps)
        return _ADVANTAGES[self.config.advantage](rewards, group_size)

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        inference_logprobs: torch.Tensor | None = None,
        is_weights: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        num_tokens: float | None = None,
        num_seqs: float | None = None,
        constant: float | None = None,
    ) -> LossOutput:
        """Scalar loss and metrics for one (micro-)batch.

        Shapes: ``logprobs``, ``old_logprobs``, ``mask``, ``inference_logprobs``,
        ``ref_logprobs``, ``entropy`` ``[B, T]``; ``advantages`` ``[B]`` or ``[B, T]``.
        ``num_tokens`` / ``num_seqs`` / ``constant`` are the aggregation normalisers
        (global counts under micro-batching; local counts by default).
        ``is_weights [B, T]``: importance weights a trainer already computed for the
        trainer/inference mismatch (verl's ``rollout_is_weights``, TRL's
        ``importance_sampling_ratio``); detached, they multiply the objective as
        ``is_correction`` does, and exclude it.
        Pitfall: a recipe with ``entropy_coef`` > 0 (intellect2) needs ``entropy`` with
        grad, and one with ``kl_coef`` > 0 (grpo) needs ``ref_logprobs``; missing inputs
        raise rather than silently dropping the term.
        """
        cfg = self.config
        check_2d("logprobs", logprobs)
        check_same_shape(
            "logprobs",
            logprobs,
            inference_logprobs=inference_logprobs,
            is_weights=is_weights,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
        )
        valid = as_bool_mask(mask, logprobs)
        if cfg.kl_coef > 0 and ref_logprobs is None:
            raise InvalidParameterError(f"kl_coef={cfg.kl_coef} needs ref_logprobs (or pass kl_coef=0)")
        if cfg.entropy_coef > 0 and entropy is None:
            raise InvalidParameterError(
                f"entropy_coef={cfg.entropy_coef} needs entropy= (e.g. logprobs_from_hidden(..., return_entropy=True)) "
                "or entropy_coef=0"
            )
        policy = _objective(cfg, logprobs, old_logprobs, advantages, valid)  # [B, T]
        is_masked_fraction = None
        mismatch_kl = None
        if inference_logprobs is not None:
            # k3 with x = ℓ_old − ℓ^μ on tokens sampled from μ estimates KL(μ ‖ π_old).
            mismatch_kl = _masked_mean(kl_k3(inference_logprobs.detach(), old_logprobs, valid), valid)
            if cfg.is_correction is not None:
                level: Level = "token" if cfg.is_correction.startswith("token") else "sequence"
                if cfg.is_correction.endswith("truncate"):
                    weights = truncated_is_weights(
                        old_logprobs, inference_logprobs, valid, cap=cfg.is_threshold, level=level
                    )
                else:
                    weights = masked_is_weights(
                        old_logprobs,
                        inference_logprobs,
                        valid,
                        low=cfg.is_low,
                        high=cfg.is_threshold,
                        level=level,
                    )
                    is_masked_fraction = float(((weights == 0) & valid).sum()) / max(int(valid.sum()), 1)
                policy = policy * weights
        elif cfg.is_correction is not None:
            raise InvalidParameterError(f"is_correction={cfg.is_correction!r} needs inference_logprobs")
        if is_weights is not None:
            if cfg.is_correction is not None:
                raise InvalidParameterError(
                    f"is_weights and is_correction={cfg.is_correction!r} would correct twice; pass one"
                )
            policy = policy * torch.where(valid, is_weights.detach(), torch.zeros_like(policy))
        per_token = policy
        kl_value = None
        if ref_logprobs is not None:
            kl = kl_penalty(logprobs, ref_logprobs, valid, estimator=cfg.kl_estimator)
            kl_value = _masked_mean(kl, valid)
            if cfg.kl_coef > 0:
                per_token = per_token + cfg.kl_coef * kl
        entropy_value = None
        if entropy is not None:
            entropy_value = _masked_mean(entropy, valid)
            if cfg.entropy_coef > 0:
                per_token = per_token + entropy_bonus(entropy, valid, coef=cfg.entropy_coef)
        norm = {
            "num_tokens": num_tokens,
            "num_seqs": num_seqs,
            "constant": constant if constant is not None else cfg.constant,
        }
        loss = aggregate(per_token, valid, cfg.aggregation, **norm)
        stats = self._clip_stats(logprobs, old_logprobs, advantages, valid)
        metrics = LossMetrics(
            clip_low_fraction=float(stats.low_fraction),
            clip_high_fraction=float(stats.high_fraction),
            delta_capped_fraction=float(stats.delta_fraction),
            mean_ratio=float(stats.mean_ratio),
            policy_loss=float(aggregate(policy.detach(), valid, cfg.aggregation, **norm)),
            num_tokens=stats.num_tokens,
            kl=kl_value,
            entropy=entropy_value,
            mismatch_kl=mismatch_kl,
            is_masked_fraction=is_masked_fraction,
        )
        return LossOutput(loss=loss, metrics=metrics)

    def _clip_stats(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        valid: torch.Tensor,
    ) -> ClipStats:
        cfg = self.config
        zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        if cfg.objective == "gspo":
            seq = sequence_mean_log_ratio(logprobs.detach(), old_logprobs, valid)
            log_ratio = seq[:, None].expand_as(logprobs)
        else:
            log_ratio = torch.where(valid, logprobs.detach() - old_logprobs.detach(), zero)
        ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        if cfg.objective in ("cispo", "sapo"):  # neither zeroes a token's gradient
            count = int(valid.sum())
            mean_ratio = torch.where(valid, ratio, zero).sum() / max(count, 1)
            if cfg.objective == "sapo":
                return ClipStats(zero, zero, zero, mean_ratio, count)
            # "low"/"high" = IS weight raised to is_floor / capped at is_cap
            floored = ((ratio < cfg.is_floor) & valid).sum().to(ratio.dtype) / max(count, 1)
            capped = ((ratio > cfg.is_cap) & valid).sum().to(ratio.dtype) / max(count, 1)
            return ClipStats(floored, capped, zero, mean_ratio, count)
        return clip_stats(
            ratio, advantages, valid, eps_low=cfg.eps_low, eps_high=cfg.eps_high, delta=cfg.delta
        )
