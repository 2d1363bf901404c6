"""``[trainer] activation_checkpointing``: a step whose decoder layers are recomputed in backward
gives the loss and every parameter gradient of the step without (fp64 Qwen2; packed documents and
shared-prompt rows; both heads); a recompute under another attention than its forward's raises;
the option loads from TOML and the command line and reaches the trainer process's model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tiny_lm import make_tiny_lm
from train_samples import grouped_samples

import grpo
from prime_rl.config import ConfigError, load_config
from prime_rl.trainer.batching import MicroBatch, make_micro_batches
from prime_rl.trainer.forward import completion_forward
from prime_rl.trainer.process import Trainer
from prime_rl.trainer.step import StepMetrics, train_minibatch

CPU = torch.device("cpu")
# (prompt length, completion lengths) per GRPO group: different prompts, a group of 1, a 1-token completion.
GROUPS = [(9, [4, 7, 1, 5]), (3, [6]), (14, [2, 8, 3, 1]), (5, [6, 2])]


@dataclass(frozen=True)
class StepResult:
    metrics: StepMetrics
    grads: dict[str, torch.Tensor]
    layer_calls: int  # forwards of decoder layers: twice per layer and micro-batch when recomputed


def step(micro: list[MicroBatch], *, checkpointing: bool, fused: bool) -> StepResult:
    """One ``train_minibatch`` (lr 0, no clipping) on a fresh fp64 Qwen2 -> loss, gradients, layer calls."""
    model = make_tiny_lm(arch="qwen2", dtype=torch.float64).train()
    if checkpointing:
        grpo.enable_activation_checkpointing(model)
    calls = [0]
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    metrics = train_minibatch(
        model, torch.optim.SGD(model.parameters(), lr=0.0), micro, None, grpo.Loss("intellect2"),
        temperature=0.7, constant=8.0, max_grad_norm=1e9, device=CPU, fused_lm_head=fused,
    )  # fmt: skip
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return StepResult(metrics, grads, calls[0])


@pytest.mark.parametrize("fused", [True, False], ids=["chunked_head", "full_logits"])
@pytest.mark.parametrize("share_prompts", [False, True], ids=["documents", "shared_prompts"])
def test_checkpointed_step_equals_the_step_without(share_prompts: bool, fused: bool) -> None:
    micro = make_micro_batches(grouped_samples(GROUPS), 60, share_prompts=share_prompts)
    # Several rows (several backward passes under the step's one attention block), several
    # documents per row, and prompts shared exactly in the shared layout.
    assert len(micro) >= 2 and all(len(m.structure.bounds) > 3 for m in micro)
    assert any(m.structure.has_suffixes for m in micro) == share_prompts
    reference = step(micro, checkpointing=False, fused=fused)
    ours = step(micro, checkpointing=True, fused=fused)
    assert ours.layer_calls == 2 * reference.layer_calls == 2 * 2 * len(micro)  # recomputed in backward
    # The recompute repeats the forward's operations on the same inputs: equal to the last bit.
    assert ours.metrics == reference.metrics
    assert ours.grads.keys() == reference.grads.keys()
    for name, grad in reference.grads.items():
        assert grad.abs().sum() > 0, name  # every parameter is reached, so each comparison counts
        torch.testing.assert_close(ours.grads[name], grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("share_prompts", [False, True], ids=["documents", "shared_prompts"])
def test_recompute_after_the_attention_block_raises(share_prompts: bool) -> None:
    # The trap: completion_forward's `with grpo.use_document_attention(model)` has exited (the model
    # is back on 'sdpa') when backward recomputes the layers, which would then attend causally
    # across the whole row. The guard refuses before anything is recomputed.
    model = make_tiny_lm(arch="qwen2", dtype=torch.float64).train()
    grpo.enable_activation_checkpointing(model)
    (micro,) = make_micro_batches(grouped_samples(GROUPS), 10_000, share_prompts=share_prompts)
    out = completion_forward(model, micro, CPU, 1.0)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(grpo.RecomputeError, match="'sdpa', but its forward ran with 'grpo_document'"):
        out.logprobs.sum().backward()


def test_option_loads_from_toml_and_the_command_line(tmp_path: Path) -> None:
    assert load_config(None).trainer.activation_checkpointing is False
    path = tmp_path / "run.toml"
    path.write_text("[trainer]\nactivation_checkpointing = true\n")
    assert load_config(path).trainer.activation_checkpointing is True
    overridden = load_config(path, ["--trainer.activation_checkpointing", "false"])
    assert overridden.trainer.activation_checkpointing is False
    from_cli = load_config(None, ["--trainer.activation_checkpointing=true"])
    assert from_cli.trainer.activation_checkpointing is True
    with pytest.raises(ConfigError, match=r"trainer\.activation_checkpointing"):
        load_config(None, ["--trainer.activation_checkpointing", "sometimes"])


def test_trainer_process_checkpoints_its_model(tmp_path: Path, tiny_lm_dir: Path) -> None:
    samples = grouped_samples([(6, [3, 5, 2, 4]), (4, [6, 1, 3, 2])], seed=1)
    after: dict[bool, dict[str, torch.Tensor]] = {}
    for checkpointing in (False, True):
        config = load_config(
            None,
            [
                "--run_dir", str(tmp_path / f"run-{checkpointing}"), "--model.path", str(tiny_lm_dir),
                "--sampling.group_size", "4", "--trainer.samples_per_step", "8", "--trainer.lr", "1e-2",
                "--trainer.micro_batch_tokens", "32",
                "--trainer.activation_checkpointing", str(checkpointing).lower(),
            ],
        )  # fmt: skip
        trainer = Trainer(config)
        try:
            assert trainer.model.is_gradient_checkpointing is checkpointing
            initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
            trainer.train_step(samples)  # recomputed old log-probs, then one AdamW step
        finally:
            trainer.close()
        after[checkpointing] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        assert all(not torch.equal(v, initial[k]) for k, v in after[checkpointing].items())  # all trained
    for name, value in after[False].items():
        torch.testing.assert_close(after[True][name], value, rtol=0, atol=0, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
@pytest.mark.parametrize("share_prompts", [False, True], ids=["documents", "shared_prompts"])
def test_cuda_checkpointed_step_equals_the_step_without(share_prompts: bool) -> None:
    # On the GPU the recompute runs compiled FlexAttention (or flash-attention varlen) inside backward.
    micro = make_micro_batches(grouped_samples(GROUPS), 60, share_prompts=share_prompts)
    results = []
    for checkpointing in (False, True):
        model = make_tiny_lm(arch="qwen2").train().cuda()
        if checkpointing:
            grpo.enable_activation_checkpointing(model)
        metrics = train_minibatch(
            model, torch.optim.SGD(model.parameters(), lr=0.0), micro, None, grpo.Loss("intellect2"),
            temperature=0.7, constant=8.0, max_grad_norm=1e9, device=torch.device("cuda"),
        )  # fmt: skip
        results.append((metrics, {name: p.grad.cpu() for name, p in model.named_parameters()}))
    (reference, reference_grads), (ours, our_grads) = results
    assert ours.loss == pytest.approx(reference.loss, rel=1e-6)
    for name, grad in reference_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
