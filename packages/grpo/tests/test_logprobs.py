"""selective_log_softmax / entropy_from_logits / logprobs_from_hidden equal the naive full-softmax
computation, values and gradients, for several chunk sizes (float64: agreement to ~1e-12)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo
import grpo.logprobs

F64 = torch.float64


def naive(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, tokens[..., None])[..., 0], entropy


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(2, 40),
    st.sampled_from([1.0, 0.6, 1.7]),
    st.integers(1, 64),
)
def test_selective_log_softmax_and_entropy_match_naive(
    seed, batch, time, vocab, temperature, chunk_elements
) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, time, vocab, generator=g, dtype=F64) * 3).requires_grad_(True)
    tokens = torch.randint(0, vocab, (batch, time), generator=g)
    weights = torch.randn(2, batch, time, generator=g, dtype=F64)
    original = grpo.logprobs.CHUNK_ELEMENTS
    grpo.logprobs.CHUNK_ELEMENTS = chunk_elements  # force many row chunks (1 row minimum)
    try:
        lp = grpo.selective_log_softmax(logits, tokens, temperature)
        entropy = grpo.entropy_from_logits(logits, temperature)
        (grad,) = torch.autograd.grad((lp * weights[0]).sum() + (entropy * weights[1]).sum(), logits)
    finally:
        grpo.logprobs.CHUNK_ELEMENTS = original
    lp_ref, entropy_ref = naive(logits, tokens, temperature)
    (grad_ref,) = torch.autograd.grad((lp_ref * weights[0]).sum() + (entropy_ref * weights[1]).sum(), logits)
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, entropy_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-12)


def test_selective_log_softmax_bf16_gradient_matches_fp32_math() -> None:
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 3, 30, generator=g) * 3).to(torch.bfloat16).requires_grad_(True)
    tokens = torch.randint(0, 30, (2, 3), generator=g)
    (grad,) = torch.autograd.grad(grpo.selective_log_softmax(logits, tokens).sum(), logits)
    assert grad.dtype == torch.bfloat16
    reference = logits.detach().float().requires_grad_(True)
    (grad_ref,) = torch.autograd.grad(naive(reference, tokens, 1.0)[0].sum(), reference)
    torch.testing.assert_close(grad.float(), grad_ref.to(torch.bfloat16).float(), rtol=0, atol=1e-2)


@pytest.mark.parametrize(("chunk_size", "row_chunk_size"), [(1, 1), (7, 3), (16, 5), (50, 4096), (4096, 2)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_from_hidden_matches_naive(chunk_size: int, row_chunk_size: int, temperature: float) -> None:
    # Vocabulary 50, hidden 12, 2x5 tokens; tiles from 1x1 to the whole matrix.
    g = torch.Generator().manual_seed(chunk_size * 31 + row_chunk_size)
    hidden = torch.randn(2, 5, 12, generator=g, dtype=F64, requires_grad=True)
    weight = torch.randn(50, 12, generator=g, dtype=F64, requires_grad=True)
    tokens = torch.randint(0, 50, (2, 5), generator=g)
    w_lp, w_h = torch.randn(2, 2, 5, generator=g, dtype=F64)
    out = grpo.logprobs_from_hidden(
        hidden, weight, tokens, temperature, chunk_size, row_chunk_size=row_chunk_size, return_entropy=True
    )
    grads = torch.autograd.grad((out.logprobs * w_lp).sum() + (out.entropy * w_h).sum(), (hidden, weight))
    lp_ref, entropy_ref = naive(hidden @ weight.T, tokens, temperature)
    grads_ref = torch.autograd.grad(
        (lp_ref * w_lp).sum() + (entropy_ref * w_h).sum(), (hidden, weight), retain_graph=True
    )
    torch.testing.assert_close(out.logprobs, lp_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.entropy, entropy_ref, rtol=0, atol=1e-12)
    for actual, expected in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)
    # Log-probs only: same values, and the gradient of just the log-probs.
    lp_only = grpo.logprobs_from_hidden(
        hidden, weight, tokens, temperature, chunk_size, row_chunk_size=row_chunk_size
    )
    torch.testing.assert_close(lp_only, lp_ref, rtol=0, atol=1e-12)
    (g_hidden,) = torch.autograd.grad(lp_only.sum(), hidden)
    (g_hidden_ref,) = torch.autograd.grad(lp_ref.sum(), hidden)
    torch.testing.assert_close(g_hidden, g_hidden_ref, rtol=0, atol=1e-12)


def test_logprobs_from_hidden_frozen_head_and_bf16() -> None:
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 16, generator=g).to(torch.bfloat16).requires_grad_(True)
    weight = torch.randn(40, 16, generator=g).to(torch.bfloat16)  # frozen: no grad requested
    tokens = torch.randint(0, 40, (4,), generator=g)
    lp = grpo.logprobs_from_hidden(hidden, weight, tokens, chunk_size=8)
    assert lp.dtype == torch.float32
    expected = torch.log_softmax((hidden @ weight.T).float(), -1).gather(-1, tokens[:, None])[:, 0]
    torch.testing.assert_close(lp, expected, rtol=0, atol=1e-5)
    (grad,) = torch.autograd.grad(lp.sum(), hidden)
    assert grad.dtype == torch.bfloat16 and torch.isfinite(grad.float()).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_logprobs_from_hidden_with_no_rows_gives_zero_gradients(dtype: torch.dtype) -> None:
    # An all-padding micro-batch selects no completion positions; its backward must still give
    # exact zeros (it once returned an uninitialised buffer as the weight gradient).
    hidden = torch.randn(0, 8, dtype=dtype, requires_grad=True)
    weight = torch.randn(20, 8, dtype=dtype, requires_grad=True)
    out = grpo.logprobs_from_hidden(hidden, weight, torch.zeros(0, dtype=torch.long), return_entropy=True)
    assert out.logprobs.shape == out.entropy.shape == (0,)
    (out.logprobs.sum() + out.entropy.sum()).backward()
    assert hidden.grad is not None and hidden.grad.shape == (0, 8)
    assert weight.grad is not None and torch.equal(weight.grad, torch.zeros_like(weight))


def test_logprobs_from_hidden_on_tiny_lm_equals_model_logits(tiny_lm) -> None:
    # The real use: final-norm hidden states of a causal LM and its lm_head.
    ids = torch.randint(3, tiny_lm.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = tiny_lm(input_ids=ids, output_hidden_states=True)
    hidden = out.hidden_states[-1][:, :-1]
    lp = grpo.logprobs_from_hidden(hidden, tiny_lm.lm_head.weight, ids[:, 1:], 0.6, chunk_size=16)
    expected = grpo.selective_log_softmax(out.logits[:, :-1], ids[:, 1:], 0.6)
    torch.testing.assert_close(lp, expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: grpo.selective_log_softmax(torch.zeros(2, 5), torch.tensor([0, 5])), "token ids"),
        (lambda: grpo.selective_log_softmax(torch.zeros(2, 5), torch.tensor([0, -1])), "token ids"),
        (lambda: grpo.selective_log_softmax(torch.zeros(2, 5), torch.tensor([[0, 1]])), "shape"),
        (lambda: grpo.selective_log_softmax(torch.zeros(2, 5), torch.tensor([0.0, 1.0])), "integer"),
        (lambda: grpo.selective_log_softmax(torch.zeros(2, 5), torch.tensor([0, 1]), 0.0), "temperature"),
        (lambda: grpo.entropy_from_logits(torch.zeros(2, 5), float("nan")), "temperature"),
        (
            lambda: grpo.logprobs_from_hidden(torch.zeros(2, 3), torch.zeros(5, 4), torch.tensor([0, 1])),
            "hidden size",
        ),
        (
            lambda: grpo.logprobs_from_hidden(torch.zeros(2, 3), torch.zeros(5, 3), torch.tensor([0, 9])),
            "token ids",
        ),
        (
            lambda: grpo.logprobs_from_hidden(
                torch.zeros(2, 3), torch.zeros(5, 3), torch.tensor([0, 1]), chunk_size=0
            ),
            "chunk_size",
        ),
        (
            lambda: grpo.logprobs_from_hidden(
                torch.zeros(2, 3), torch.zeros(5, 3, dtype=F64), torch.tensor([0, 1])
            ),
            "cast",
        ),
    ],
)
def test_bad_inputs_raise_clear_errors(call, message: str) -> None:
    with pytest.raises(grpo.GrpoError, match=message):
        call()
