"""grpo.integrations.verl: verl's policy-loss signature, its registry, and a tiny-model step.

verl 0.9.1 requires transformers < 5.11 and cannot be installed next to this workspace's
transformers 5.19.0 (pip: "Cannot install transformers==5.19.0 and verl==0.9.1 because these
package versions have conflicting dependencies"). Without it these tests call the function the
way verl's ``workers/utils/losses.py`` does (its documented ``PolicyLossFn`` keywords, a config
with verl's field names) and compare with verl's loss code as transcribed in parity_peers.py;
with verl installed the registry tests run too and the config is verl's own ``FSDPActorConfig``.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import parity_peers as peers
import pytest
import torch
from parity_peers import T, VerlActor, make_batch

import grpo
from grpo.integrations.verl import VERL_AGGREGATION, policy_loss, register


def actor_config(**fields: Any) -> Any:
    """verl's actor config: the real FSDPActorConfig where verl is installed, else its fields."""
    base = {"clip_ratio_c": 3.0, "entropy_coeff": 0.0, "use_kl_loss": False, "kl_loss_coef": 0.001,
            "kl_loss_type": "low_var_kl", "loss_agg_mode": "token-mean"}
    base.update(fields)
    info = base.pop("global_batch_info", {})
    if peers.verl_installed():
        from verl.workers.config import FSDPActorConfig

        config = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **base)
        config.global_batch_info.update(info)
        return config
    return types.SimpleNamespace(global_batch_info=dict(info), **base)


def call(fn, batch, logprobs, agg: str, config: Any, weights: torch.Tensor | None = None):
    # Keywords exactly as verl 0.9.1 workers/utils/losses.py calls a registered policy loss.
    return fn(
        old_log_prob=batch.old,
        log_prob=logprobs,
        advantages=batch.advantages[:, None].expand_as(batch.old),
        response_mask=batch.mask,
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=weights,
    )


CASES = [  # (grpo Loss, verl loss_mode, verl actor fields)
    (grpo.Loss("dapo", delta=3.0), "vanilla", VerlActor(clip_ratio_high=0.28)),
    (grpo.Loss("intellect2", entropy_coef=0.0), "vanilla", VerlActor(clip_ratio_c=4.0, loss_scale_factor=T)),
    (grpo.Loss("dr_grpo", constant=T, delta=3.0), "vanilla", VerlActor(loss_scale_factor=T)),
    (grpo.Loss("cispo", is_floor=0.8, is_cap=1.2), "cispo", VerlActor()),
    (grpo.Loss("sapo"), "sapo", VerlActor()),
    (grpo.Loss("gspo"), "gspo", VerlActor(clip_ratio_low=3e-4, clip_ratio_high=4e-4)),
]


@pytest.mark.parametrize("spread", ["normal", "extreme"])
@pytest.mark.parametrize(("loss", "mode", "actor"), CASES, ids=lambda x: getattr(x, "config", x).__repr__()[:30])
def test_registered_function_equals_verls_loss(loss: grpo.Loss, mode: str, actor: VerlActor, spread: str) -> None:
    batch = make_batch(spread)
    agg = VERL_AGGREGATION[loss.config.aggregation]
    info = {} if actor.loss_scale_factor is None else {"loss_scale_factor": actor.loss_scale_factor}
    logprobs = batch.fresh()
    ours, metrics = call(policy_loss(loss), batch, logprobs, agg, actor_config(loss_agg_mode=agg, global_batch_info=info))
    (grad,) = torch.autograd.grad(ours, logprobs)
    theirs, their_grad = peers.verl_loss(batch, mode, agg, actor)
    torch.testing.assert_close(ours.detach(), theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, their_grad, rtol=1e-12, atol=1e-12)
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())


def test_rollout_weights_and_global_normalisers() -> None:
    # verl's agg_loss: token-mean = Σ m·L / batch_num_tokens · dp_size; the rollout IS weights
    # multiply each token's loss.
    batch = make_batch("normal")
    weights = torch.linspace(0.5, 1.5, batch.mask.numel(), dtype=torch.float64).reshape(batch.mask.shape)
    config = actor_config(global_batch_info={"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 8})
    loss, _ = call(policy_loss("dapo"), batch, batch.fresh(), "token-mean", config, weights)
    per_token = grpo.ppo_clip(batch.logprobs.detach(), batch.old, batch.advantages, batch.mask, eps_high=0.28)
    expected = (per_token * weights).sum() / 40 * 2
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-12, atol=1e-12)
    seq, _ = call(policy_loss(grpo.Loss("grpo", kl_coef=0.0)), batch, batch.fresh(), "seq-mean-token-mean", config)
    per_seq = grpo.ppo_clip(batch.logprobs.detach(), batch.old, batch.advantages, batch.mask).sum(-1) / batch.mask.sum(-1)
    torch.testing.assert_close(seq.detach(), per_seq.sum() / 8 * 2, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("loss", "agg", "fields", "message"),
    [
        (grpo.Loss("dapo"), "seq-mean-token-mean", {}, "loss_agg_mode=token-mean"),
        (grpo.Loss("grpo"), "seq-mean-token-mean", {}, "use_kl_loss=true kl_loss_coef=0.04 kl_loss_type=low_var_kl"),
        (grpo.Loss("dapo"), "token-mean", {"use_kl_loss": True}, "use_kl_loss=false"),
        (grpo.Loss("intellect2"), "seq-mean-token-sum-norm", {}, "entropy_coeff=0.001"),
    ],
)
def test_a_verl_config_that_contradicts_the_loss_raises(loss, agg, fields, message) -> None:
    batch = make_batch("normal")
    with pytest.raises(grpo.InvalidParameterError, match=message):
        call(policy_loss(loss), batch, batch.fresh(), agg, actor_config(**fields))


def test_the_loss_with_verls_kl_and_entropy_settings_runs() -> None:
    batch = make_batch("normal")
    config = actor_config(use_kl_loss=True, kl_loss_coef=0.04, entropy_coeff=0.0)
    loss, _ = call(policy_loss("grpo"), batch, batch.fresh(), "seq-mean-token-mean", config)
    assert torch.isfinite(loss)
    with pytest.raises(grpo.InvalidParameterError, match="rollout_correction"):
        policy_loss(grpo.Loss("dapo", is_correction="token_truncate"))


def test_a_tiny_model_step(tiny_lm) -> None:
    # One optimiser step of a tiny Llama through the registered function, as verl's actor does:
    # log-probs of sampled tokens, the policy loss, backward, step.
    import copy

    model = copy.deepcopy(tiny_lm).train()
    torch.manual_seed(0)
    tokens = torch.randint(3, 100, (4, 10))
    logits = model(tokens).logits[:, :-1].float()
    logprobs = grpo.selective_log_softmax(logits, tokens[:, 1:])
    old = logprobs.detach() + 0.05 * torch.randn_like(logprobs)
    mask = torch.ones_like(logprobs, dtype=torch.bool)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand_as(logprobs)
    fn = policy_loss("intellect2") if not peers.verl_installed() else _registered("grpo_intellect2")
    config = actor_config(entropy_coeff=0.001, global_batch_info={"loss_scale_factor": 9})
    loss, metrics = fn(
        old_log_prob=old, log_prob=logprobs, advantages=advantages, response_mask=mask,
        loss_agg_mode="seq-mean-token-sum-norm", config=config, rollout_is_weights=None,
    )
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    loss.backward()
    optimiser.step()
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0


def _registered(name: str):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    return get_policy_loss_fn(name)


def test_registry() -> None:
    if not peers.verl_installed():
        with pytest.raises(ImportError, match=r"intellect2-grpo\[verl\]"):
            register("grpo_mine", "dapo")
        pytest.skip("verl is not installed here (it pins transformers<5.11); the registry is verl's")
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    assert {f"grpo_{name}" for name in grpo.RECIPES} <= set(POLICY_LOSS_REGISTRY)
    fn = register("grpo_mine", grpo.Loss("dapo", eps_high=0.3))
    assert _registered("grpo_mine") is fn


def test_verl_transcription_matches_verl() -> None:
    if not peers.verl_installed():
        pytest.skip("verl is not installed here (it pins transformers<5.11): the transcription stands in")
    for spread in ("normal", "extreme"):
        assert peers.transcription_matches_verl(make_batch(spread)) == []
    from verl.workers.config import FSDPActorConfig

    real = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    for field in dataclasses.fields(VerlActor):
        assert getattr(real, field.name) == field.default, field.name
