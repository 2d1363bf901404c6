"""A loss recipe as plain data: :class:`LossConfig`, the named :data:`RECIPES`, :func:`loss_config`.

Torch-free on purpose: a process that only loads and checks a run's configuration (an
orchestrator on a small machine, a launcher) validates a loss here, with the same errors the
trainer would raise, without importing torch. :class:`grpo.Loss` turns a config into the
callable loss.

>>> loss_config("dapo", kl_coef=0.001).eps_high
0.28

See :mod:`grpo.loss` for the table of recipes and their sources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from grpo.errors import (
    InvalidParameterError,
    check_clip,
    check_nonnegative,
    check_positive,
    check_weight_band,
)

__all__ = [
    "AGGREGATION_MODES",
    "RECIPES",
    "AdvantageName",
    "AggregationMode",
    "ISCorrection",
    "KLEstimator",
    "LossConfig",
    "ObjectiveName",
    "loss_config",
]

AdvantageName = Literal["group_zscore", "group_center", "rloo"]
ObjectiveName = Literal["ppo_clip", "gspo", "cispo", "sapo"]
AggregationMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant"]
"""How per-token losses become one scalar (see :func:`grpo.aggregate`)."""
AGGREGATION_MODES: tuple[str, ...] = get_args(AggregationMode)
"""The names of :data:`AggregationMode`, for validation and choices."""
KLEstimator = Literal["k1", "k2", "k3"]
ISCorrection = Literal["token_truncate", "sequence_truncate", "token_mask", "sequence_mask"]


@dataclass(frozen=True)
class LossConfig:
    """Every axis of a recipe as a flat, validated, immutable config."""

    advantage: AdvantageName = "group_zscore"
    """Advantage estimator used by :meth:`grpo.Loss.advantages`."""
    std_eps: float = 1e-6
    """ε of group_zscore (verl / INTELLECT-2 1e-6; TRL 1e-4)."""
    objective: ObjectiveName = "ppo_clip"
    """Per-token objective: ppo_clip, gspo, cispo or sapo."""
    eps_low: float = 0.2
    """Clip offset below 1 (ppo_clip, gspo)."""
    eps_high: float = 0.2
    """Clip offset above 1 (ppo_clip, gspo); DAPO clip-higher 0.28."""
    delta: float | None = None
    """INTELLECT-2 two-sided cap on the ratio (ppo_clip only); must exceed 1 + eps_high."""
    is_cap: float = 5.0
    """CISPO absolute cap on the detached IS weight."""
    is_floor: float = 0.0
    """CISPO absolute floor on the detached IS weight (verl's CISPO uses 1 − clip_ratio_low)."""
    tau_pos: float = 1.0
    """SAPO gate temperature where Â > 0."""
    tau_neg: float = 1.05
    """SAPO gate temperature where Â <= 0."""
    aggregation: AggregationMode = "token_mean"
    """How per-token losses become a scalar (see :func:`grpo.aggregate`)."""
    constant: float | None = None
    """Per-sequence normaliser C for aggregation 'constant' (may be given per call instead)."""
    kl_coef: float = 0.0
    """β of the KL-to-reference term (needs ``ref_logprobs``)."""
    kl_estimator: KLEstimator = "k3"
    """KL estimator for the penalty: k1, k2 or k3."""
    entropy_coef: float = 0.0
    """α of the entropy bonus (needs ``entropy``)."""
    is_correction: ISCorrection | None = None
    """Trainer/inference mismatch correction applied when ``inference_logprobs`` are given."""
    is_threshold: float = 2.0
    """TIS cap (truncate modes) or the upper bound of the MIS band (mask modes)."""
    is_low: float = 0.5
    """Lower bound of the MIS band (mask modes)."""

    def __post_init__(self) -> None:
        _check_choice("advantage", self.advantage, get_args(AdvantageName))
        _check_choice("objective", self.objective, get_args(ObjectiveName))
        _check_choice("aggregation", self.aggregation, AGGREGATION_MODES)
        _check_choice("KL estimator", self.kl_estimator, get_args(KLEstimator))
        if self.is_correction is not None:
            _check_choice("is_correction", self.is_correction, get_args(ISCorrection))
        for name in ("std_eps", "kl_coef", "entropy_coef"):
            check_nonnegative(name, getattr(self, name))
        if self.constant is not None:
            check_positive("constant", self.constant)
        # The objective's and the correction's own checks, so a bad value fails here, not at the
        # first step.
        if self.delta is not None and self.objective != "ppo_clip":
            raise InvalidParameterError("delta applies to the ppo_clip objective only")
        if self.objective == "cispo":
            check_weight_band("is_floor", self.is_floor, "is_cap", self.is_cap)
        elif self.objective == "sapo":
            check_positive("tau_pos", self.tau_pos)
            check_positive("tau_neg", self.tau_neg)
        else:
            check_clip(self.eps_low, self.eps_high, self.delta)
        if self.is_correction is not None and self.is_correction.endswith("truncate"):
            check_positive("cap", self.is_threshold)
        elif self.is_correction is not None:
            check_weight_band("low", self.is_low, "high", self.is_threshold)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidParameterError(f"unknown {name} {value!r}; choose one of {list(choices)}")


RECIPES: Mapping[str, LossConfig] = {
    "intellect2": LossConfig(delta=4.0, aggregation="constant", entropy_coef=0.001),
    "grpo": LossConfig(aggregation="seq_mean_token_mean", kl_coef=0.04),
    "dr_grpo": LossConfig(advantage="group_center", aggregation="constant"),
    "dapo": LossConfig(eps_high=0.28, aggregation="token_mean"),
    "gspo": LossConfig(objective="gspo", eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean_token_mean"),
    "cispo": LossConfig(objective="cispo", aggregation="token_mean"),
    "sapo": LossConfig(objective="sapo", aggregation="seq_mean_token_mean"),
}
"""The named recipes ``Loss(name)`` and :func:`loss_config` start from (table in :mod:`grpo.loss`)."""


def loss_config(recipe: str | LossConfig = "intellect2", **overrides: Any) -> LossConfig:
    """``recipe`` (a name in :data:`RECIPES`, or a :class:`LossConfig`) with single fields replaced.

    >>> loss_config("intellect2", delta=8.0).delta
    8.0

    Raises :class:`grpo.InvalidParameterError` for an unknown recipe, an unknown field name or
    an invalid value (the same checks the loss functions apply).
    """
    if isinstance(recipe, LossConfig):
        base = recipe
    elif isinstance(recipe, str) and recipe in RECIPES:
        base = RECIPES[recipe]
    else:
        raise InvalidParameterError(f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    unknown = set(overrides) - {field.name for field in dataclasses.fields(LossConfig)}
    if unknown:
        raise InvalidParameterError(f"unknown LossConfig fields {sorted(unknown)}")
    return dataclasses.replace(base, **overrides)
