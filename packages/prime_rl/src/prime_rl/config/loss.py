"""``[trainer.loss]``: the run's loss, in one key that is a recipe table or an import path.

The two shapes (prime-rl's), both checked when the config loads::

    [trainer.loss]               # a grpo recipe plus single-field overrides, validated by grpo
    recipe = "intellect2"        # a name in grpo.RECIPES (default intellect2)
    delta = 4.0                  # any grpo.LossConfig field: eps_low, eps_high, entropy_coef, ...

    [trainer]
    loss = "examples/intellect2.py:loss"   # a grpo.Loss or grpo.LossConfig by import path

A table resolves to the ``grpo.LossConfig`` it names (every field, so ``--print-config`` shows
the loss that will run). An import path is checked for syntax here and imported by the trainer
at start-up (:func:`load_loss`), torch and all; the config stays torch-free.

:func:`loss_problem` is the one guard both shapes pass: the trainer steps on the advantages the
validator recomputed, which are group z-scores (eps 1e-6) by protocol, so a loss with another
advantage estimator is refused rather than trained on advantages it does not name; and an
importance-sampling correction is refused where it would weigh by 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator

from grpo.recipes import LossConfig, loss_config
from prime_rl.config.components import ComponentError, ImportPath, load_component

__all__ = ["DEFAULT_RECIPE", "LOSS_FIELDS", "LossSetting", "load_loss", "loss_config_of", "loss_problem"]

DEFAULT_RECIPE = "intellect2"
LOSS_FIELDS = frozenset({"recipe"} | {field.name for field in dataclasses.fields(LossConfig)})
"""The keys of a ``[trainer.loss]`` table."""

ADVANTAGE = ("group_zscore", 1e-6)
"""(estimator, std_eps) of the advantages workers compute and the validator checks: the protocol's."""


def loss_problem(loss: LossConfig, old_logprobs: str) -> str | None:
    """What makes ``loss`` untrainable here with ``[trainer] old_logprobs``, as a sentence; None if nothing."""
    if (loss.advantage, loss.std_eps) != ADVANTAGE:
        return (
            f"its advantage is {loss.advantage} (std_eps {loss.std_eps}), but this runtime trains on "
            "group z-score advantages (std_eps 1e-6) that workers compute and the validator checks"
        )
    if loss.is_correction is not None and old_logprobs == "inference":
        return (
            "it sets is_correction, which weights by π_old/μ, and that is 1 when [trainer] old_logprobs = "
            "'inference'; use old_logprobs = 'recompute' with it, or drop is_correction"
        )
    return None


def _setting(value: object) -> LossConfig | str:
    """A table ``{"recipe": name, **fields}`` -> ``grpo.loss_config(name, **fields)``; an import path as given."""
    if isinstance(value, LossConfig):
        return value
    if isinstance(value, str):
        ImportPath.parse(value)  # a ComponentError is a ValueError: pydantic names the key
        return value
    if not isinstance(value, Mapping):
        raise ValueError(
            "[trainer.loss] must be a table of grpo.LossConfig fields and 'recipe', or an import path "
            f"'module:attribute' of a grpo.Loss, got {value!r}"
        )
    fields = dict(value)
    return loss_config(fields.pop("recipe", DEFAULT_RECIPE), **fields)


def _dump(value: LossConfig | str) -> dict[str, Any] | str:
    return value if isinstance(value, str) else dataclasses.asdict(value)


LossSetting = Annotated[
    LossConfig | str,
    PlainValidator(_setting),
    PlainSerializer(_dump, return_type=dict[str, Any] | str),
]
"""``[trainer.loss]``: the resolved ``grpo.LossConfig`` of a table, or an import path (a str)."""


def loss_config_of(value: object) -> LossConfig | None:
    """The ``LossConfig`` of a loss component: itself, or the ``.config`` of a callable ``grpo.Loss``."""
    if isinstance(value, LossConfig):
        return value
    config = getattr(value, "config", None)
    return config if callable(value) and isinstance(config, LossConfig) else None


def load_loss(path: str, old_logprobs: str, key: str = "trainer.loss") -> Any:
    """The ``grpo.Loss`` or ``grpo.LossConfig`` that ``path`` names, past :func:`loss_problem`.

    Raises ``ComponentError`` naming ``key`` and ``path`` for anything else (a module not found, a
    missing attribute, another kind of object, a loss the runtime cannot train on).
    """

    def accepts(value: object) -> str | None:
        config = loss_config_of(value)
        if config is None:
            return f"must be a grpo.Loss or grpo.LossConfig, got {type(value).__name__} {value!r:.80}"
        return loss_problem(config, old_logprobs)

    return load_component(key, path, accepts)


def differences(first: LossConfig, second: LossConfig) -> list[str]:
    """``["eps_high 0.28 vs 0.2", ...]``: the fields where two loss configs differ."""
    return [
        f"{field.name} {getattr(first, field.name)!r} vs {getattr(second, field.name)!r}"
        for field in dataclasses.fields(LossConfig)
        if getattr(first, field.name) != getattr(second, field.name)
    ]


def check_one_loss(setting: LossConfig | str, recipe_path: str, recipe_loss: object, source: str) -> None:
    """Raises ``ComponentError`` naming both when the config's loss ``setting`` (from ``source``) is
    not the recipe's loss (``recipe_loss``, imported from ``recipe_path``)."""
    if setting == recipe_path:
        return
    if isinstance(setting, str):
        if load_component("trainer.loss", setting) is recipe_loss:
            return
        mismatch = f"[trainer.loss] = {setting!r} in {source} is another object than the recipe's loss {recipe_path}"
    else:
        recipe_config = loss_config_of(recipe_loss)
        assert recipe_config is not None  # load_loss accepted it
        found = differences(setting, recipe_config)
        if not found:
            return
        mismatch = (
            f"[trainer.loss] in {source} and the recipe's loss {recipe_path} differ: {', '.join(found)} "
            "(config vs recipe)"
        )
    raise ComponentError(
        f"two losses: {mismatch}. The loss has one home: edit the recipe's loss line, or make [trainer.loss] "
        "name the same loss (or leave it out)"
    )
