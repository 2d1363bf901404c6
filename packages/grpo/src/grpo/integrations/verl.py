"""Any :class:`grpo.Loss` as a verl policy loss: registered in verl's policy-loss registry.

With ``intellect2-grpo`` installed next to verl (>= 0.9), verl loads this module through its
``verl.plugins`` entry point in every process that imports verl, and each recipe of
:data:`grpo.RECIPES` is a ``loss_mode``::

    actor_rollout_ref.actor.policy_loss.loss_mode=grpo_intellect2 \\
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm

(Where plugins are disabled, ``VERL_USE_EXTERNAL_MODULES=grpo.integrations.verl`` does the
same.) A Loss of your own: ``register("my_loss", grpo.Loss("dapo", eps_high=0.3))`` in a module
verl imports.

The registered function has verl's ``PolicyLossFn`` signature, ``(old_log_prob, log_prob,
advantages, response_mask, loss_agg_mode, config, rollout_is_weights) -> (pg_loss, metrics)``,
and computes the Loss's objective and aggregation. verl adds the KL and entropy terms itself,
from its own config, after the policy loss; so the function checks that verl's config applies
the Loss's (``loss_agg_mode``, ``use_kl_loss``/``kl_loss_coef``/``kl_loss_type``,
``entropy_coeff``) and raises :class:`grpo.InvalidParameterError` naming the verl keys to set
when it does not. verl's ``clip_ratio*``, ``clip_ratio_c`` and ``tau_*`` are not read: the Loss
holds those (packages/grpo/README.md maps the names). verl's ``rollout_is_weights`` multiply the
objective (``Loss(..., is_weights=)``); a Loss with its own ``is_correction`` is refused, since
verl does not pass the inference log-probs.

Normalisers come from verl's ``config.global_batch_info`` as verl's ``agg_loss`` uses them
(``batch_num_tokens / dp_size``, ``global_batch_size / dp_size``), so micro-batches and data
parallel ranks add up to the step's loss; ``constant`` is ``loss_scale_factor`` or, unset, the
Loss's ``constant`` or the padded response length (verl's ``seq-mean-token-sum-norm``).

This module imports without verl: :func:`policy_loss` builds the function for any caller;
:func:`register` and the recipe registration at import need verl.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from grpo.errors import InvalidParameterError
from grpo.loss import Loss
from grpo.recipes import RECIPES, LossConfig, loss_config

__all__ = ["VERL_AGGREGATION", "PolicyLossFn", "policy_loss", "register"]

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]

VERL_AGGREGATION = {
    "token_mean": "token-mean",
    "seq_mean_token_mean": "seq-mean-token-mean",
    "seq_mean_token_sum": "seq-mean-token-sum",
    "constant": "seq-mean-token-sum-norm",
}
"""grpo aggregation mode -> verl ``loss_agg_mode`` (verl's ``token-sum`` has no grpo mode)."""

# grpo KL estimator -> the names verl's kl_penalty accepts for it.
_VERL_KL = {"k1": ("k1", "kl"), "k2": ("k2", "mse"), "k3": ("k3", "low_var_kl")}


def _option(config: Any, name: str, default: Any = None) -> Any:
    """``config.name`` for verl's ActorConfig, an OmegaConf DictConfig or a plain dict."""
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _check_verl_config(cfg: LossConfig, loss_agg_mode: str, config: Any) -> None:
    wanted = VERL_AGGREGATION[cfg.aggregation]
    problems = []
    if loss_agg_mode != wanted:
        problems.append(f"loss_agg_mode={wanted} (is {loss_agg_mode})")
    if config is not None:
        entropy_coeff = float(_option(config, "entropy_coeff", 0.0) or 0.0)
        if entropy_coeff != cfg.entropy_coef:
            problems.append(f"entropy_coeff={cfg.entropy_coef} (is {entropy_coeff})")
        use_kl = bool(_option(config, "use_kl_loss", False))
        if cfg.kl_coef > 0:
            coef, kind = _option(config, "kl_loss_coef"), _option(config, "kl_loss_type")
            if not use_kl or coef != cfg.kl_coef or kind not in _VERL_KL[cfg.kl_estimator]:
                problems.append(
                    f"use_kl_loss=true kl_loss_coef={cfg.kl_coef} kl_loss_type={_VERL_KL[cfg.kl_estimator][-1]} "
                    f"(is {use_kl}, {coef}, {kind})"
                )
        elif use_kl:
            problems.append("use_kl_loss=false (the Loss has kl_coef=0)")
    if problems:
        raise InvalidParameterError(
            "verl's actor config does not apply this grpo.Loss; set actor_rollout_ref.actor."
            + ", actor_rollout_ref.actor.".join(problems)
        )


def _normalisers(cfg: LossConfig, config: Any, response_mask: torch.Tensor) -> dict[str, float]:
    info = (_option(config, "global_batch_info", None) if config is not None else None) or {}
    dp_size = float(info.get("dp_size") or 1)
    if cfg.aggregation == "token_mean":
        tokens = info.get("batch_num_tokens")
        return {} if tokens is None else {"num_tokens": float(tokens) / dp_size}
    seqs = info.get("global_batch_size")
    norm = {} if seqs is None else {"num_seqs": float(seqs) / dp_size}
    if cfg.aggregation == "constant":
        scale = info.get("loss_scale_factor")
        if scale is not None and cfg.constant is not None and float(scale) != cfg.constant:
            raise InvalidParameterError(
                f"verl's loss_scale_factor={scale} contradicts the Loss's constant={cfg.constant}; set one"
            )
        constant = scale if scale is not None else cfg.constant
        norm["constant"] = float(constant if constant is not None else response_mask.shape[-1])
    return norm


def policy_loss(loss: Loss | LossConfig | str) -> PolicyLossFn:
    """A function with verl's policy-loss signature computing ``loss`` (a Loss, config or recipe name)."""
    cfg = loss.config if isinstance(loss, Loss) else loss_config(loss)
    if cfg.is_correction is not None:
        raise InvalidParameterError(
            f"is_correction={cfg.is_correction!r} needs the inference log-probs, which verl does not pass; "
            "use verl's algorithm.rollout_correction (its rollout_is_weights multiply the objective)"
        )
    # verl adds KL and entropy outside the policy loss; the policy part is the Loss without them.
    policy_only = Loss(dataclasses.replace(cfg, kl_coef=0.0, entropy_coef=0.0))

    def grpo_policy_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = VERL_AGGREGATION[cfg.aggregation],
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        _check_verl_config(cfg, loss_agg_mode, config)
        mask = response_mask.bool()
        norm = _normalisers(cfg, config, response_mask)
        out = policy_only(
            log_prob,
            old_log_prob,
            advantages,
            mask,
            is_weights=rollout_is_weights,
            num_tokens=norm.get("num_tokens"),
            num_seqs=norm.get("num_seqs"),
            constant=norm.get("constant"),
        )
        m = out.metrics
        old_minus_new = torch.where(mask, old_log_prob.detach() - log_prob.detach(), torch.zeros_like(log_prob))
        metrics = {
            "actor/pg_clipfrac": m.clip_low_fraction + m.clip_high_fraction,
            "actor/ppo_kl": float(old_minus_new.sum()) / max(int(mask.sum()), 1),
            "actor/pg_clipfrac_lower": m.delta_capped_fraction,
            "actor/grpo/mean_ratio": m.mean_ratio,
        }
        return out.loss, metrics

    grpo_policy_loss.__qualname__ = grpo_policy_loss.__name__ = f"grpo_policy_loss_{cfg.objective}"
    return grpo_policy_loss


def register(name: str, loss: Loss | LossConfig | str) -> PolicyLossFn:
    """Register ``loss`` in verl's policy-loss registry as ``name`` (``policy_loss.loss_mode=name``)."""
    try:
        from verl.trainer.ppo.core_algos import register_policy_loss
    except ImportError as exc:
        raise ImportError('grpo.integrations.verl.register needs verl: pip install "intellect2-grpo[verl]"') from exc
    return register_policy_loss(name)(policy_loss(loss))


def _register_recipes() -> None:
    """``grpo_<recipe>`` for every recipe, where verl is installed (a no-op elsewhere)."""
    try:
        import verl.trainer.ppo.core_algos  # noqa: F401
    except ImportError:
        return
    for recipe in RECIPES:
        register(f"grpo_{recipe}", recipe)


_register_recipes()
