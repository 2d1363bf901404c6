"""Activation checkpointing under document attention: equal values and gradients with and without
(packed documents with padding, shared prefixes), and a recompute under another attention than its
forward's raises instead of computing other gradients."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_lm import make_tiny_lm

import grpo


def documents_batch(vocab: int) -> tuple[dict[str, Any], list[int]]:
    """Two padded rows of packed documents -> (forward kwargs, lengths)."""
    g, lengths = torch.Generator().manual_seed(0), [5, 9, 3, 12, 7, 4, 1]
    packed = grpo.pack_sequences([torch.randint(3, vocab, (n,), generator=g) for n in lengths], 24)
    assert packed.input_ids.shape[0] == 2 and (packed.sequence_index < 0).any()
    inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
    return inputs | grpo.document_kwargs(packed.cu_seqlens()), lengths


def shared_prefix_batch(vocab: int) -> dict[str, Any]:
    """Three GRPO groups (one of a single completion), each prompt once, in one padded row."""
    g = torch.Generator().manual_seed(1)

    def tokens(n: int) -> torch.Tensor:
        return torch.randint(3, vocab, (n,), generator=g)

    groups = [
        (tokens(9), [tokens(4), tokens(7), tokens(1)]),
        (tokens(3), [tokens(6), tokens(2)]),
        (tokens(5), [tokens(3)]),
    ]
    pack = grpo.pack_shared_prefix(groups, length=48)
    assert pack.structure.has_suffixes
    inputs = {"input_ids": pack.input_ids, "position_ids": pack.position_ids}
    return inputs | grpo.shared_prefix_kwargs(pack.structure)


def forward_backward(inputs: dict[str, Any], *, checkpointing: bool):
    """Logits and every parameter gradient of a fixed weighting of them, inside the attention block."""
    model = make_tiny_lm(arch="qwen2", dtype=torch.float64).train()
    if checkpointing:
        grpo.enable_activation_checkpointing(model)
    with grpo.use_document_attention(model):
        logits = model(**inputs, use_cache=False).logits
        weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        (logits * weights).sum().backward()
    return logits.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("layout", ["documents", "shared_prefix"])
def test_checkpointed_forward_equals_the_forward_without(layout: str) -> None:
    vocab = make_tiny_lm().config.vocab_size
    inputs = documents_batch(vocab)[0] if layout == "documents" else shared_prefix_batch(vocab)
    logits, grads = forward_backward(inputs, checkpointing=False)
    ours, our_grads = forward_backward(inputs, checkpointing=True)
    torch.testing.assert_close(ours, logits, rtol=0, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=0, atol=0, msg=name)


def test_backward_after_the_block_raises_and_inside_it_recomputes() -> None:
    model = make_tiny_lm(arch="qwen2", dtype=torch.float64).train()
    grpo.enable_activation_checkpointing(model)
    inputs, _ = documents_batch(model.config.vocab_size)
    with grpo.use_document_attention(model, backend="sdpa"):
        loss = model(**inputs, use_cache=False).logits.square().sum()
    # The block restored 'sdpa': recomputing now would attend causally across the packed documents.
    with pytest.raises(grpo.RecomputeError, match="'sdpa', but its forward ran with 'grpo_document_sdpa'"):
        loss.backward()
    model.zero_grad(set_to_none=True)  # the head's and final norm's gradients came before the refusal
    with grpo.use_document_attention(model, backend="sdpa"):
        loss = model(**inputs, use_cache=False).logits.square().sum()
        loss.backward(retain_graph=True)  # each recompute is checked, the second one too
        first = {name: p.grad.clone() for name, p in model.named_parameters()}
        loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[name], rtol=1e-14, atol=0, msg=name)


def test_disable_leaves_the_model_as_it_was() -> None:
    model = make_tiny_lm(arch="qwen2")
    grpo.enable_activation_checkpointing(model)
    assert model.is_gradient_checkpointing
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    assert not model.get_input_embeddings()._forward_hooks  # transformers' input-grad hook is gone too
    with pytest.raises(grpo.InvalidParameterError, match="does not support gradient checkpointing"):
        grpo.enable_activation_checkpointing(torch.nn.Linear(2, 2))
