"""The trainer's forward: the chunked LM head equals full logits, and the packed row (document
attention, no dense mask) equals one row per sequence: values, entropy and every gradient."""

from __future__ import annotations

import pytest
import torch
from forward_grads import assert_cuda_forward_equals_cpu, loss_weights, values_and_grads  # tests/support
from tensor_guard import LargestTensors, forbid_dense_masks
from tiny_lm import make_tiny_lm

import grpo
from prime_rl.api.protocol import TrainSample
from prime_rl.trainer.batching import empty_micro_batch, make_micro_batches
from prime_rl.trainer.forward import completion_forward, supports_fused_head
from prime_rl.trainer.step import train_minibatch

CPU = torch.device("cpu")


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
    full, full_grads = values_and_grads(model, micro, fused=False, temperature=temperature)
    fused, fused_grads = values_and_grads(model, micro, fused=True, temperature=temperature)
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
    place, first, prompt = micro.placements[0], micro.completion_lengths[0], micro.prompt_lengths[0]
    alone = micro.input_ids[:, place.prompt_offset : place.completion_offset + first]  # the first sequence
    with torch.no_grad():
        out = completion_forward(biased, micro, CPU, 1.0, fused=True)  # falls back, bias included
        logits = biased(input_ids=alone).logits
    expected = torch.log_softmax(logits[0, prompt - 1 : prompt - 1 + first], -1)
    expected = expected.gather(-1, alone[0, prompt : prompt + first, None])[:, 0]
    torch.testing.assert_close(out.logprobs[0, :first], expected, rtol=0, atol=1e-5)


def samples_of(lengths: list[tuple[int, int]], seed: int = 0) -> list[TrainSample]:
    """One sample per ``(prompt, completion)`` length pair, random tokens of the tiny vocabulary."""
    g = torch.Generator().manual_seed(seed)
    return [
        TrainSample(
            sample_id=f"b/{i}", batch_id="b", worker_id="w", task_id=i // 4, group_index=i % 4, policy_version=0,
            prompt_tokens=torch.randint(3, 100, (p,), generator=g).tolist(),
            completion_tokens=torch.randint(3, 100, (c,), generator=g).tolist(),
            behaviour_logprobs=[-4.0] * c, temperature=1.0, reward=float(i % 2), advantage=(-1.0) ** i,
        )
        for i, (p, c) in enumerate(lengths)
    ]  # fmt: skip


@pytest.mark.parametrize("fused", [True, False])
def test_packed_row_equals_one_row_per_sequence(fused: bool) -> None:
    # Document attention: the packed row gives each sequence's values and gradients exactly as a
    # forward of that sequence alone does (fp64; both heads).
    model = make_tiny_lm(arch="qwen2", dtype=torch.float64).train()
    samples = samples_of([(7, 5), (3, 9), (12, 1), (2, 2), (5, 11)])
    packed = make_micro_batches(samples, max_tokens=10_000)[0]
    assert packed.num_sequences == len(samples)
    by_id = {s.sample_id: s for s in samples}
    alone = [make_micro_batches([by_id[i]], 10_000)[0] for i in packed.sample_ids]
    out, grads = values_and_grads(model, packed, fused=fused, temperature=0.7)
    weights = loss_weights(out.logprobs)
    model.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64)
    for row, micro in enumerate(alone):
        single = completion_forward(model, micro, CPU, 0.7, entropy=True, fused=fused)
        width = micro.completion_lengths[0]
        torch.testing.assert_close(out.logprobs[row, :width], single.logprobs[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(out.entropy[row, :width], single.entropy[0], rtol=0, atol=1e-12)
        total = total + (single.logprobs[0] * weights[row, :width]).sum()
        total = total + (single.entropy[0] * weights.flip(0)[row, :width]).sum()
    total.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("fused", [True, False])
def test_train_step_builds_no_dense_mask(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # A 1,024-token row of five sequences: neither grpo's nor transformers' dense mask builder runs,
    # and no op, forward or backward, returns an [L, L] tensor (the old step built one per forward).
    forbid_dense_masks(monkeypatch)
    model = make_tiny_lm().train()
    micro = make_micro_batches(samples_of([(100, 200), (20, 21), (60, 140), (3, 4), (176, 300)]), 1024)
    assert len(micro) == 1 and micro[0].input_ids.shape == (1, 1024)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with LargestTensors() as seen:
        train_minibatch(
            model, optimizer, micro, None, grpo.Loss("intellect2"), temperature=1.0, constant=300.0,
            max_grad_norm=1.0, device=CPU, fused_lm_head=fused,
        )  # fmt: skip
    seen.assert_no_square(1024)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
@pytest.mark.parametrize("fused", [True, False])
def test_cuda_forward_equals_cpu(fused: bool) -> None:
    # The packed forward on the GPU (document attention: flex, or flash varlen where installed) gives
    # the CPU's values and gradients (fp32).
    micro = make_micro_batches(samples_of([(40, 60), (3, 200), (129, 1), (64, 64)]), 1024)[0]
    assert_cuda_forward_equals_cpu(lambda: make_tiny_lm(arch="qwen2").train(), micro, fused=fused, temperature=0.7)
