"""The trainer's shared-prompt rows: a GRPO group's prompt packed once gives every completion's
log-prob, entropy and every parameter gradient exactly as one sequence per sample does (fp64, both
heads), and a whole optimizer step likewise; parts that fit a row; the loss-mask seam; no ``[L, L]``
tensor; no mixed devices."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from device_guard import simulated_device
from forward_grads import assert_cuda_forward_equals_cpu, values_and_grads  # tests/support
from fp64_norm import rms_norm_in_input_dtype
from tensor_guard import LargestTensors, forbid_dense_masks
from tiny_lm import make_tiny_lm
from train_samples import grouped_samples

import grpo
from prime_rl.trainer.batching import make_micro_batches, prompt_groups
from prime_rl.trainer.forward import completion_forward
from prime_rl.trainer.step import train_minibatch

CPU = torch.device("cpu")


# Different prompt lengths, a group of 1, completions of length 1.
GROUPS = [(9, [4, 7, 1, 5]), (3, [6]), (14, [2, 8, 3, 1]), (5, [6, 2])]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("fused", [True, False])
def test_shared_prompt_row_equals_one_sequence_per_sample(arch, fused, monkeypatch) -> None:
    rms_norm_in_input_dtype(monkeypatch)  # fp64 throughout (see tests/support/fp64_norm.py)
    model = make_tiny_lm(arch=arch, dtype=torch.float64).train()
    samples = grouped_samples(GROUPS)
    (shared,) = make_micro_batches(samples, max_tokens=10_000)
    (separate,) = make_micro_batches(samples, max_tokens=10_000, share_prompts=False)
    assert shared.structure.has_suffixes and not separate.structure.has_suffixes
    # Each prompt once: 31 prompt tokens instead of 9·4 + 3 + 14·4 + 5·2 = 105.
    assert shared.input_ids.shape[1] == 31 + 45 and separate.input_ids.shape[1] == 105 + 45
    assert shared.sample_ids == separate.sample_ids == tuple(s.sample_id for s in samples)
    torch.testing.assert_close(shared.mask, separate.mask, rtol=0, atol=0)
    ours, our_grads = values_and_grads(model, shared, fused=fused, temperature=0.7)
    reference, reference_grads = values_and_grads(model, separate, fused=fused, temperature=0.7)
    torch.testing.assert_close(ours.logprobs, reference.logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours.entropy, reference.entropy, rtol=0, atol=1e-12)
    for name, grad in reference_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_shared_prompt_optimizer_step_equals_separate(monkeypatch) -> None:
    rms_norm_in_input_dtype(monkeypatch)
    samples = grouped_samples([(20, [5, 9, 3, 7]), (6, [12, 2, 4, 4])], seed=3)
    results = []
    for share in (True, False):
        model = make_tiny_lm(dtype=torch.float64).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        micro = make_micro_batches(samples, 40, share_prompts=share)
        metrics = train_minibatch(
            model, optimizer, micro, None, grpo.Loss("intellect2"), temperature=1.0, constant=12.0,
            max_grad_norm=1e9, device=CPU,
        )  # fmt: skip
        results.append((len(micro), metrics, [p.detach().clone() for p in model.parameters()]))
    (rows, shared, after), (separate_rows, separate, separate_after) = results
    assert rows < separate_rows  # 80 tokens in 2 rows against 110 in 3
    assert shared.loss == pytest.approx(separate.loss, rel=1e-12)
    assert shared.grad_norm == pytest.approx(separate.grad_norm, rel=1e-10)
    assert shared.num_tokens == separate.num_tokens == 46
    for mine, theirs in zip(after, separate_after, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-14)


def test_prompt_groups_gather_by_prompt_and_fit_a_row() -> None:
    samples = grouped_samples([(10, [5, 5, 5, 5]), (4, [30]), (3, [2, 2])])
    shuffled = [samples[i] for i in (0, 4, 1, 5, 2, 6, 3)]  # groups interleaved: still gathered
    parts = prompt_groups(shuffled, max_tokens=21)
    # 10 + 5 + 5 = 20 fits 21, a third completion would not; the 34-token sample is a part alone.
    assert [[s.sample_id for s in p] for p in parts] == [
        ["b/0/0", "b/0/1"], ["b/0/2", "b/0/3"], ["b/1/0"], ["b/2/0", "b/2/1"],
    ]  # fmt: skip
    assert [len(p) for p in prompt_groups(shuffled, 21, share_prompts=False)] == [1] * 7
    micro = make_micro_batches(shuffled, 21)
    # Rows of max(21, 34) tokens, first-fit-decreasing over parts of 34, 20, 20 and 7 tokens.
    assert sorted(m.input_ids.shape[1] for m in micro) == [20, 27, 34]
    assert sum(m.num_sequences for m in micro) == 7


def test_loss_mask_seam_computes_only_loss_tokens() -> None:
    # A multi-turn episode masks out environment-inserted completion tokens: the forward computes
    # only the masked-in tokens, at the same values, and leaves the others at 0.
    model = make_tiny_lm(dtype=torch.float64).train()
    (micro,) = make_micro_batches(grouped_samples(GROUPS), max_tokens=10_000)
    mask = micro.mask.clone()
    mask[0, 1:3] = False
    mask[5, 0] = False  # a first token: predicted by the shared prompt's last position
    partial = dataclasses.replace(micro, mask=mask)
    for fused in (True, False):
        full = completion_forward(model, micro, CPU, 1.0, entropy=True, fused=fused)
        masked = completion_forward(model, partial, CPU, 1.0, entropy=True, fused=fused)
        torch.testing.assert_close(masked.logprobs, full.logprobs * mask, rtol=0, atol=1e-12)
        torch.testing.assert_close(masked.entropy, full.entropy * mask, rtol=0, atol=1e-12)


def test_shared_prompt_step_builds_no_square_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_dense_masks(monkeypatch)
    model = make_tiny_lm().train()
    micro = make_micro_batches(grouped_samples([(300, [80] * 8), (100, [60] * 4), (4, [1])]), 2048)
    assert len(micro) == 1 and micro[0].input_ids.shape == (1, 1285)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with LargestTensors() as seen:
        train_minibatch(
            model, optimizer, micro, None, grpo.Loss("intellect2"), temperature=1.0, constant=80.0,
            max_grad_norm=1.0, device=CPU,
        )  # fmt: skip
    seen.assert_no_square(1285)


@pytest.mark.parametrize("fused", [True, False], ids=["chunked_head", "full_logits"])
def test_shared_prompt_forward_keeps_tensors_on_the_compute_device(fused: bool) -> None:
    model = make_tiny_lm()
    (micro,) = make_micro_batches(grouped_samples(GROUPS), max_tokens=10_000)
    expected = completion_forward(model, micro, CPU, 1.0, entropy=True, fused=fused)
    with simulated_device() as device:
        device.place(model)
        got = completion_forward(model, micro, CPU, 1.0, entropy=True, fused=fused)
        assert device.on_device(got.logprobs)
    torch.testing.assert_close(got.logprobs, expected.logprobs, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
@pytest.mark.parametrize("fused", [True, False])
def test_cuda_shared_prompt_forward_equals_cpu(fused: bool) -> None:
    # On the GPU the shared-prompt row runs compiled FlexAttention with the shared-prefix block mask.
    (micro,) = make_micro_batches(grouped_samples([(150, [64] * 8), (40, [200, 3, 129]), (7, [30])]), 10_000)
    assert_cuda_forward_equals_cpu(lambda: make_tiny_lm(arch="qwen2").train(), micro, fused=fused, temperature=0.7)
