"""Train with any :class:`grpo.Loss` in TRL: :class:`GrpoTrainer`, a ``trl.GRPOTrainer`` subclass.

.. code-block:: python

    import grpo
    from grpo.integrations.trl import GrpoTrainer
    from trl import GRPOConfig

    trainer = GrpoTrainer(
        loss=grpo.Loss("dapo"), model=model, reward_funcs=reward, train_dataset=dataset,
        args=GRPOConfig(output_dir="out", num_generations=8),
    )
    trainer.train()

TRL 1.16 has no loss hook: its whole objective sits in the private ``GRPOTrainer._compute_loss``.
This class overrides that one method and keeps the rest of TRL (generation, reward functions,
advantages, the reference model, vLLM, logging). It needs ``trl >= 1.16``
(``pip install "intellect2-grpo[trl]"``).

Who decides what:

* The :class:`grpo.Loss` decides the objective, its clip parameters, the aggregation, the KL term
  and the entropy bonus. TRL's own loss options (``loss_type``, ``epsilon``, ``epsilon_high``,
  ``delta``, ``importance_sampling_level``, ``sapo_temperature_*``, ``entropy_coef``,
  ``top_entropy_quantile``, ``off_policy_mask_threshold``, ...) are not read; set to anything
  but their TRL defaults they raise :class:`grpo.InvalidParameterError` naming the field of the
  Loss to set instead (packages/grpo/README.md has the full name table).
* TRL computes the advantages. The Loss's ``advantage`` picks TRL's ``scale_rewards``:
  ``group_zscore`` -> ``"group"``, ``group_center`` -> ``"none"`` (``rloo`` has no GRPOTrainer
  equivalent and raises). TRL divides by std + 1e-4 where ``group_zscore`` uses ``std_eps``
  (1e-6 by default).
* TRL loads a reference model only when ``beta != 0``: the adapter sets ``beta`` to the Loss's
  ``kl_coef`` and gives the Loss TRL's reference log-probs. A ``beta`` set to another non-zero
  value raises.
* vLLM mismatch: with ``use_vllm`` and TRL's ``vllm_importance_sampling_correction`` (TRL's
  default), TRL's ratio multiplies the objective (``Loss(..., is_weights=)``); a Loss with its
  own ``is_correction`` needs ``vllm_importance_sampling_correction=False``.

Normalisers: each micro-batch's loss is divided so that the accumulated gradient is that of the
optimiser step's batch, as TRL does: ``token_mean`` by TRL's token count of the accumulation
window, the sequence modes and ``constant`` by the window's sequence count (per process, since
DDP averages ranks); ``constant`` defaults to ``max_completion_length`` (TRL's ``dr_grpo``).

Metrics: what TRL's own ``GRPOTrainer`` logs for the same quantity is logged under TRL's name and
equals TRL's value (tested): ``policy_loss`` (the loss with its KL term, without the entropy bonus,
per micro-batch as TRL reports it; TRL logs it only with its entropy bonus on), ``kl``, ``entropy``, ``clip_ratio/low_mean``,
``clip_ratio/high_mean`` and ``clip_ratio/region_mean`` (``ppo_clip``), ``cispo_clip_ratio``
(``cispo``: ratio above ``is_cap`` with Â > 0). Quantities TRL does not log keep grpo's names
(``ratio/mean``, ``clip_ratio/delta_mean``, ``mismatch_kl``, ``is_masked``). Not logged: TRL's
per-sequence extremes ``clip_ratio/low_min`` and ``clip_ratio/high_max``. Pitfall: ``gspo``'s
``clip_ratio/*`` are token-weighted fractions where TRL's sequence-level ones weight each sequence
once.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, cast

import torch

from grpo.aggregation import aggregate
from grpo.errors import InvalidParameterError
from grpo.loss import Loss, LossOutput
from grpo.objectives import LOG_RATIO_CLAMP
from grpo.recipes import LossConfig
from grpo.regularizers import entropy_bonus

try:
    from trl import GRPOConfig, GRPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('grpo.integrations.trl needs TRL: pip install "intellect2-grpo[trl]"') from exc

__all__ = ["GrpoTrainer", "trl_settings"]

# TRL's loss options that the Loss replaces, with the LossConfig field (or advice) to use instead.
_REPLACED_OPTIONS = {
    "loss_type": "the Loss recipe (objective and aggregation)",
    "epsilon": "eps_low",
    "epsilon_high": "eps_high (ppo_clip, gspo) or is_cap (cispo)",
    "delta": "delta",
    "importance_sampling_level": 'objective="gspo" (the sequence ratio)',
    "sapo_temperature_pos": "tau_pos of grpo.sapo",
    "sapo_temperature_neg": "tau_neg of grpo.sapo",
    "entropy_coef": "entropy_coef",
    "use_adaptive_entropy": "entropy_coef (grpo has no adaptive entropy control)",
    "top_entropy_quantile": "grpo.high_entropy_mask in your own loop",
    "off_policy_mask_threshold": "no equivalent",
}

_SCALE_REWARDS = {"group_zscore": "group", "group_center": "none"}


def _trl_default(name: str) -> Any:
    return GRPOConfig.__dataclass_fields__[name].default


def trl_settings(config: LossConfig) -> dict[str, Any]:
    """The ``GRPOConfig`` fields a Loss needs TRL to use: ``beta`` and ``scale_rewards``.

    >>> trl_settings(grpo.loss_config("grpo"))  # doctest: +SKIP
    {'beta': 0.04, 'scale_rewards': 'group'}
    """
    if config.advantage not in _SCALE_REWARDS:
        raise InvalidParameterError(
            f"advantage={config.advantage!r} has no TRL GRPOTrainer equivalent; "
            f"use one of {sorted(_SCALE_REWARDS)}"
        )
    return {"beta": config.kl_coef, "scale_rewards": _SCALE_REWARDS[config.advantage]}


def _reconcile(args: GRPOConfig, config: LossConfig) -> GRPOConfig:
    """``args`` with the Loss's TRL settings; raise where the user set something the Loss contradicts."""
    for name, instead in _REPLACED_OPTIONS.items():
        if getattr(args, name) != _trl_default(name):
            raise InvalidParameterError(
                f"GRPOConfig.{name}={getattr(args, name)!r} is not applied by GrpoTrainer: the grpo.Loss "
                f"decides the loss; leave {name} at its default and use {instead}"
            )
    wanted = trl_settings(config)
    for name, value in wanted.items():
        current = getattr(args, name)
        if current not in (_trl_default(name), value):
            raise InvalidParameterError(
                f"GRPOConfig.{name}={current!r} contradicts the Loss, which needs {name}={value!r}"
            )
    if config.is_correction is not None and args.use_vllm and args.vllm_importance_sampling_correction:
        raise InvalidParameterError(
            f"the Loss corrects the vLLM mismatch itself (is_correction={config.is_correction!r}); "
            "set GRPOConfig(vllm_importance_sampling_correction=False)"
        )
    # A copy with the fields set, not dataclasses.replace: GRPOConfig.__post_init__ refuses to run
    # again on its own derived fields (generation_batch_size and steps_per_generation).
    args = copy.copy(args)
    for name, value in wanted.items():
        setattr(args, name, value)
    return args


class GrpoTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with its loss replaced by ``loss`` (a :class:`grpo.Loss`).

    Every other argument is ``GRPOTrainer``'s. ``args`` defaults to ``GRPOConfig("<model name>-GRPO")``
    as in TRL; it is copied with ``beta`` and ``scale_rewards`` taken from the Loss
    (:func:`trl_settings`).
    """

    def __init__(self, *args: Any, loss: Loss, **kwargs: Any) -> None:
        if not isinstance(loss, Loss):
            raise InvalidParameterError(f"loss must be a grpo.Loss, got {type(loss).__name__}")
        self.grpo_loss = loss
        if len(args) > 2:
            raise TypeError("pass GrpoTrainer's arguments after reward_funcs by keyword")
        training_args = kwargs.get("args")
        if training_args is None:
            model = args[0] if args else kwargs["model"]
            name = model if isinstance(model, str) else model.config._name_or_path
            training_args = GRPOConfig(f"{name.split('/')[-1]}-GRPO")
        kwargs["args"] = _reconcile(training_args, loss.config)
        super().__init__(*args, **kwargs)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        logprobs, entropy, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([prompt_mask, completion_mask], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _MULTIMODAL_KEYS},
        )
        old = inputs.get("old_per_token_logps")
        old = logprobs.detach() if old is None else old  # one step per generation: ℓ_old = ℓ
        is_weights = inputs.get("importance_sampling_ratio") if self.grpo_loss.config.is_correction is None else None
        inference = inputs.get("sampling_per_token_logps")
        norm = self._normalisers(inputs, rows=completion_ids.size(0))
        out = self.grpo_loss(
            logprobs,
            old,
            inputs["advantages"],
            mask.bool(),
            inference_logprobs=inference if self.grpo_loss.config.is_correction is not None else None,
            is_weights=None if is_weights is None else is_weights.expand_as(logprobs),
            ref_logprobs=inputs.get("ref_per_token_logps"),
            entropy=entropy,
            num_tokens=norm.get("num_tokens"),
            num_seqs=norm.get("num_seqs"),
            constant=norm.get("constant"),
        )
        self._log_grpo_metrics(out, _TrlLossInputs(logprobs, old, inputs["advantages"], mask.bool(), entropy, norm))
        loss = out.loss
        if aux_loss is not None:  # MoE load balancing, as TRL adds it
            loss = loss + self.router_aux_loss_coef * aux_loss / self._accumulation()
        return loss

    def _training(self) -> bool:
        return self.model is not None and self.model.training

    def _accumulation(self) -> float:
        return float(self.current_gradient_accumulation_steps) if self._training() else 1.0

    def _normalisers(self, inputs: dict[str, Any], *, rows: int) -> dict[str, float]:
        """Global normalisers of this micro-batch's accumulation window (TRL's own arithmetic)."""
        cfg = self.grpo_loss.config
        args = cast(GRPOConfig, self.args)
        if cfg.aggregation == "token_mean":
            tokens = float(inputs["num_items_in_batch"].clamp(min=1.0)) / self.accelerator.num_processes
            if self._training():
                tokens *= self.current_gradient_accumulation_steps / cast(int, args.steps_per_generation)
            return {"num_tokens": tokens}
        norm = {"num_seqs": float(rows) * self._accumulation()}
        if cfg.aggregation == "constant" and cfg.constant is None:
            norm["constant"] = float(cast(int, args.max_completion_length))
        return norm

    def _log_grpo_metrics(self, out: LossOutput, seen: _TrlLossInputs) -> None:
        """The Loss's metrics, under TRL's names where TRL logs the same quantity (module docstring)."""
        cfg = self.grpo_loss.config
        metrics = out.metrics.as_dict()
        del metrics["num_tokens"], metrics["loss/policy"]
        low, high = metrics.pop("clip_ratio/low_mean"), metrics.pop("clip_ratio/high_mean")
        if cfg.objective in ("ppo_clip", "gspo"):
            # Disjoint (Â < 0 vs Â > 0), so the region is their sum, as TRL's is_low | is_high.
            metrics |= {"clip_ratio/low_mean": low, "clip_ratio/high_mean": high, "clip_ratio/region_mean": low + high}
        elif cfg.objective == "cispo":
            log_ratio = (seen.logprobs.detach() - seen.old.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            capped = (log_ratio.exp() > cfg.is_cap) & (seen.advantages.reshape(-1, 1) > 0) & seen.mask
            metrics["cispo_clip_ratio"] = float(capped.sum() / seen.mask.sum().clamp(min=1))
        # TRL's policy_loss: the aggregated loss before its entropy bonus, and before the division by
        # the accumulation steps for the modes TRL divides afterwards (all but its token count).
        policy_loss = out.loss.detach()
        if cfg.entropy_coef > 0:
            bonus = entropy_bonus(seen.entropy.detach(), seen.mask, coef=cfg.entropy_coef)
            norm = {"constant": cfg.constant, **seen.normalisers}
            policy_loss = policy_loss - aggregate(bonus, seen.mask, cfg.aggregation, **norm)
        if cfg.aggregation != "token_mean":
            policy_loss = policy_loss * self._accumulation()
        metrics["policy_loss"] = float(policy_loss)
        mode = "train" if self._training() else "eval"
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)


@dataclass(frozen=True)
class _TrlLossInputs:
    """What one ``_compute_loss`` call gave the Loss, for the metrics TRL computes from it."""

    logprobs: torch.Tensor
    old: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor
    normalisers: dict[str, float]


# Model inputs TRL forwards for vision-language models (GRPOTrainer._compute_loss, TRL 1.16).
_MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
