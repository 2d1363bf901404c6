"""grpo.integrations.trl: a real TRL training step with a grpo.Loss, and its loss equal to TRL's own.

The tiny model and tokenizer are built in code (tests/support/tiny_lm.py); nothing comes from a hub.
"""

from __future__ import annotations

import tempfile

import parity_peers as peers
import pytest
import torch
from parity_peers import B, T, make_batch

import grpo

pytest.importorskip("trl")
from datasets import Dataset
from tiny_lm import make_tiny_tokenizer
from trl import GRPOConfig

from grpo.integrations.trl import GrpoTrainer, trl_settings


def reward_length(completions, **_):
    return [len(c) / 10 for c in completions]


def config(**kwargs) -> GRPOConfig:
    return GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo-trl-"),
        per_device_train_batch_size=B,
        num_generations=2,
        max_completion_length=T,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-2,
        **kwargs,
    )


def trainer(loss: grpo.Loss, **kwargs) -> GrpoTrainer:
    return GrpoTrainer(
        loss=loss,
        model=peers._tiny_lm_dir(),
        reward_funcs=reward_length,
        args=config(**kwargs),
        train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+3=", "4+4=", "9-2="]}),
        processing_class=make_tiny_tokenizer(),
    )


@pytest.mark.parametrize("recipe", ["intellect2", "grpo"])
def test_a_real_training_step(recipe: str) -> None:
    # intellect2: δ, constant normaliser and the entropy bonus; grpo: the KL, so TRL loads a reference model.
    run = trainer(grpo.Loss(recipe), max_steps=1)
    before = {name: p.detach().clone() for name, p in run.model.named_parameters()}
    result = run.train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))
    changed = [name for name, p in run.model.named_parameters() if not torch.equal(p, before[name])]
    assert changed, "the optimiser step moved no weight"
    logged = run.state.log_history[0]
    assert {"clip_ratio/low_mean", "clip_ratio/region_mean", "ratio/mean", "policy_loss", "entropy"} <= set(logged)
    if recipe == "grpo":
        assert run.args.beta == 0.04 and run.ref_model is not None and "kl" in logged
    # TRL's entropies carry a gradient, so the Loss's entropy bonus (intellect2) acts on the policy.
    ids = torch.ones(2, 5, dtype=torch.long) * 20
    _, entropy, _ = run._get_per_token_logps_and_entropies(run.model, ids, torch.ones_like(ids), 3, compute_entropy=True)
    assert entropy.requires_grad


# Each grpo Loss and the TRL settings TRL's own loss needs to compute the same thing.
SAME_AS_TRL = [
    (grpo.Loss("grpo", kl_coef=0.0), {"loss_type": "grpo"}),
    (grpo.Loss("grpo"), {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False}),
    (grpo.Loss("dapo"), {"loss_type": "dapo", "epsilon_high": 0.28}),
    (grpo.Loss("dr_grpo"), {"loss_type": "dr_grpo", "scale_rewards": "none"}),
    (grpo.Loss("cispo"), {"loss_type": "cispo", "epsilon_high": 5.0}),
    # TRL logs policy_loss only with its entropy bonus on; with the test's zero entropies both bonuses are 0.
    (grpo.Loss("dr_grpo", entropy_coef=0.01), {"loss_type": "dr_grpo", "scale_rewards": "none", "entropy_coef": 0.01}),
]


@pytest.mark.parametrize("accumulation", [1, 3])
@pytest.mark.parametrize(("loss", "settings"), SAME_AS_TRL, ids=lambda x: repr(x)[:40])
def test_the_adapter_computes_trls_loss(loss: grpo.Loss, settings: dict, accumulation: int) -> None:
    # Same fixed inputs through GrpoTrainer._compute_loss and TRL's own, including TRL's division
    # by the accumulation window (token_mean over num_items_in_batch, the rest per micro-batch).
    batch = make_batch("normal")
    ours = trainer(loss)
    theirs = peers._trl_trainer(tuple(sorted({**settings, "max_completion_length": T}.items())))
    results, logged = [], []
    for run in (ours, theirs):
        run._metrics["train"].clear()
        run.model.train()
        run.current_gradient_accumulation_steps = accumulation
        logprobs, inputs = peers.trl_fixed_inputs(run, batch, accumulation)
        value = run._compute_loss(run.model, inputs)
        results.append((value.detach(), torch.autograd.grad(value, logprobs)[0]))
        logged.append({name: values[-1] for name, values in run._metrics["train"].items()})
    theirs.current_gradient_accumulation_steps = 1
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-12, atol=1e-12)
    # Every metric TRL logs for this loss, under TRL's name and with TRL's value (the adapter does not
    # log TRL's per-sequence extremes), and no grpo name for a quantity TRL names otherwise.
    ours_logged, trls = logged[0], {k: v for k, v in logged[1].items() if k not in TRL_ONLY_METRICS}
    assert set(trls) <= set(ours_logged), f"missing TRL names: {sorted(set(trls) - set(ours_logged))}"
    for name, value in trls.items():
        # rel 1e-6: TRL takes its fractions of float32 masks (1/6 -> 0.1666666716), grpo in float64.
        assert ours_logged[name] == pytest.approx(value, rel=1e-6, abs=1e-12), name
    assert "loss/policy" not in ours_logged


TRL_ONLY_METRICS = {"clip_ratio/low_min", "clip_ratio/high_max", "entropy_coef"}


def test_trl_settings_follow_the_loss() -> None:
    assert trl_settings(grpo.loss_config("grpo")) == {"beta": 0.04, "scale_rewards": "group"}
    assert trl_settings(grpo.loss_config("dr_grpo")) == {"beta": 0.0, "scale_rewards": "none"}
    with pytest.raises(grpo.InvalidParameterError, match="no TRL GRPOTrainer equivalent"):
        trl_settings(grpo.loss_config("dapo", advantage="rloo"))
    assert trainer(grpo.Loss("dr_grpo")).args.scale_rewards == "none"


@pytest.mark.parametrize(
    ("loss", "kwargs", "message"),
    [
        (grpo.Loss("dapo"), {"epsilon_high": 0.28}, "use eps_high"),
        (grpo.Loss("dapo"), {"loss_type": "grpo"}, "the Loss recipe"),
        (grpo.Loss("cispo"), {"epsilon_high": 5.0}, "is_cap"),
        (grpo.Loss("dapo"), {"beta": 0.04}, "needs beta=0.0"),
        (grpo.Loss("grpo"), {"beta": 0.1}, "needs beta=0.04"),
        (grpo.Loss("dapo"), {"top_entropy_quantile": 0.2}, "high_entropy_mask"),
    ],
)
def test_trl_options_the_loss_replaces_raise(loss: grpo.Loss, kwargs: dict, message: str) -> None:
    with pytest.raises(grpo.InvalidParameterError, match=message):
        trainer(loss, **kwargs)
