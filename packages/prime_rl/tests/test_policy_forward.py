"""The chunked-LM-head forward equals the full-logits forward: values, entropy and every gradient."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import make_tiny_lm

from prime_rl.trainer.batching import empty_micro_batch, make_micro_batches
from prime_rl.trainer.forward import completion_forward, supports_fused_head

CPU = torch.device("cpu")


def grads_of(model: torch.nn.Module, micro, *, fused: bool, temperature: float):
    """Values and parameter gradients of a loss that weighs every log-prob and entropy differently."""
    model.zero_grad(set_to_none=True)
    out = completion_forward(model, micro, CPU, temperature, entropy=True, fused=fused)
    g = torch.Generator().manual_seed(1)
    weights = torch.randn(out.logprobs.shape, generator=g, dtype=torch.float64)
    (out.logprobs * weights).sum().add((out.entropy * weights.flip(0)).sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_head_equals_full_logits(arch: str, tied: bool, temperature: float, random_samples) -> None:
    model = make_tiny_lm(arch=arch, dtype=torch.float64).train()
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.get_input_embeddings().weight
    micro = make_micro_batches(random_samples(6), max_tokens=30)[0]
    assert micro.num_sequences > 1  # packed: positions restart inside the row
    full, full_grads = grads_of(model, micro, fused=False, temperature=temperature)
    fused, fused_grads = grads_of(model, micro, fused=True, temperature=temperature)
    torch.testing.assert_close(fused.logprobs, full.logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(fused.entropy, full.entropy, rtol=0, atol=1e-12)
    assert (fused.logprobs[~micro.mask] == 0).all() and (fused.logprobs[micro.mask] < 0).all()
    # Tied: one parameter (listed as the embedding) gets both the embedding and the head gradient.
    assert fused_grads.keys() == full_grads.keys() and ("lm_head.weight" in fused_grads) != tied
    for name, grad in full_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_padding_micro_batch_gives_zeros_and_zero_gradients() -> None:
    model = make_tiny_lm(dtype=torch.float64).train()
    out = completion_forward(model, empty_micro_batch(), CPU, 1.0, entropy=True)
    assert out.logprobs.shape == out.entropy.shape == (1, 1)
    assert out.logprobs.item() == 0.0 and out.entropy.item() == 0.0
    (out.logprobs.sum() + out.entropy.sum()).backward()
    for name, param in model.named_parameters():
        assert param.grad is None or not param.grad.any(), name


def test_head_is_restored_and_parameter_names_unchanged(random_samples) -> None:
    model = make_tiny_lm().eval()
    head, names = model.lm_head, list(model.state_dict())
    micro = make_micro_batches(random_samples(2), max_tokens=100)[0]
    completion_forward(model, micro, CPU, 1.0)
    assert model.lm_head is head and list(model.state_dict()) == names
    broken = make_micro_batches(random_samples(2), max_tokens=100)[0]
    broken.input_ids[0, 0] = model.config.vocab_size + 5  # the embedding lookup fails mid-forward
    with pytest.raises(IndexError):
        completion_forward(model, broken, CPU, 1.0)
    assert model.lm_head is head


def test_models_that_post_process_logits_use_full_logits(random_samples) -> None:
    model = make_tiny_lm()
    assert supports_fused_head(model)
    model.config.final_logit_softcapping = 30.0  # Gemma-2 style: logits = c·tanh(z / c)
    assert not supports_fused_head(model)
    biased = make_tiny_lm()
    biased.lm_head = torch.nn.Linear(64, biased.config.vocab_size, bias=True)
    assert not supports_fused_head(biased)
    micro = make_micro_batches(random_samples(2), max_tokens=100)[0]
    with torch.no_grad():
        out = completion_forward(biased, micro, CPU, 1.0, fused=True)  # falls back, bias included
        inputs = {"position_ids": micro.position_ids, "attention_mask": micro.attention_mask}
        logits = biased(input_ids=micro.input_ids, **inputs).logits
    first, start = micro.completion_lengths[0], micro.placements[0].offset + micro.prompt_lengths[0] - 1
    expected = torch.log_softmax(logits[0, start : start + first], -1)
    expected = expected.gather(-1, micro.input_ids[0, start + 1 : start + 1 + first, None])[:, 0]
    torch.testing.assert_close(out.logprobs[0, :first], expected, rtol=0, atol=1e-5)
