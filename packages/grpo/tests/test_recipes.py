"""Recipes as plain data: LossConfig validates without torch, with the very checks the loss
functions apply at call time, and the package loads its tensor code only when it is used."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

import grpo
from grpo.recipes import RECIPES, LossConfig, loss_config

LP = torch.zeros(2, 3)
ADV = torch.zeros(2)


def _raises(make) -> str | None:  # type: ignore[no-untyped-def]
    """The GrpoError message of ``make()``, or None when it does not raise."""
    try:
        make()
    except grpo.GrpoError as error:
        return str(error)
    return None


def test_config_validation_needs_no_torch() -> None:
    code = (
        "import sys, grpo, grpo.recipes\n"
        "cfg = grpo.loss_config('dapo', eps_high=0.3)\n"
        "assert cfg.eps_high == 0.3 and cfg == grpo.LossConfig(eps_high=0.3, aggregation='token_mean')\n"
        "for bad in ({'delta': 1.1}, {'kl_coef': 'x'}, {'aggregation': 'mean'}, {'nope': 1}):\n"
        "    try:\n"
        "        grpo.loss_config('intellect2', **bad)\n"
        "    except grpo.InvalidParameterError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(f'accepted {bad}')\n"
        "assert 'torch' not in sys.modules, 'recipes imported torch'\n"
        "grpo.ppo_clip\n"  # the first tensor function loads torch
        "assert 'torch' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("eps_low", "eps_high", "delta"),
    [(0.2, 0.2, 4.0), (0.2, 0.28, 1.28), (0.2, 0.28, 1.29), (1.0, 0.2, None), (-0.1, 0.2, None),
     (0.2, -0.1, None), (0.2, 0.2, float("inf")), (float("nan"), 0.2, None), (0.0, 0.0, 1.0 + 1e-9)],
)  # fmt: skip
def test_clip_params_rejected_exactly_when_ppo_clip_rejects_them(eps_low, eps_high, delta) -> None:  # type: ignore[no-untyped-def]
    by_function = _raises(lambda: grpo.ppo_clip(LP, LP, ADV, eps_low=eps_low, eps_high=eps_high, delta=delta))
    by_config = _raises(lambda: LossConfig(eps_low=eps_low, eps_high=eps_high, delta=delta))
    assert by_config == by_function


@pytest.mark.parametrize("value", [5.0, 1e-9, 0.0, -1.0, float("inf")])
def test_is_cap_and_is_bands_rejected_exactly_when_the_functions_reject_them(value: float) -> None:
    assert _raises(lambda: LossConfig(objective="cispo", is_cap=value)) == _raises(
        lambda: grpo.cispo(LP, LP, ADV, is_cap=value)
    )
    truncate = _raises(lambda: LossConfig(is_correction="token_truncate", is_threshold=value))
    assert truncate == _raises(lambda: grpo.truncated_is_weights(LP, LP, cap=value))
    band = _raises(lambda: LossConfig(is_correction="sequence_mask", is_low=0.5, is_threshold=value))
    assert band == _raises(lambda: grpo.masked_is_weights(LP, LP, low=0.5, high=value))


def test_loss_config_is_recipe_plus_overrides() -> None:
    for name, recipe in RECIPES.items():
        assert loss_config(name) == recipe and grpo.Loss(name).config == recipe
    assert loss_config("dapo", kl_coef=0.01) == dataclasses.replace(RECIPES["dapo"], kl_coef=0.01)
    assert loss_config(RECIPES["gspo"], eps_high=1e-3).eps_high == 1e-3
    assert loss_config() == RECIPES["intellect2"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: loss_config(["intellect2"]), "unknown recipe"),  # unhashable: still a clear error
        (lambda: loss_config("intellect2", kl_estimator="k4"), "unknown KL estimator"),
        (lambda: loss_config("intellect2", entropy_coef=-0.1), "entropy_coef must be >= 0"),
        (lambda: loss_config("intellect2", std_eps=None), "std_eps must be a finite number"),
        (lambda: loss_config("intellect2", constant=0.0), "constant must be > 0"),
        (lambda: loss_config("intellect2", advantage="ppo"), "unknown advantage"),
        (lambda: loss_config("intellect2", objective="dppo"), "unknown objective"),
    ],
)
def test_bad_values_raise_at_construction(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpo.InvalidParameterError, match=message):
        make()


def test_lazy_names_resolve_to_functions_and_submodules() -> None:
    import grpo.aggregation  # importing a submodule must not hide the function of the same role

    assert callable(grpo.aggregate) and grpo.aggregate is grpo.aggregation.aggregate
    assert grpo.logprobs.CHUNK_ELEMENTS > 0  # submodules resolve on attribute access
    assert set(grpo.__all__) <= set(dir(grpo)) and all(hasattr(grpo, name) for name in grpo.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        grpo.nope  # noqa: B018
