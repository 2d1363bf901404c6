"""Document attention over packed rows: equal to the dense block-causal mask and to separate forwards
(values and gradients), an exact FlexAttention block mask, and no ``L x L`` tensor anywhere."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from grpo_attention_checks import assert_block_mask_tiles_exact, assert_packed_equals_separate
from hypothesis import given, settings
from hypothesis import strategies as st
from tensor_guard import LargestTensors, forbid_dense_masks

import grpo
from grpo.attention import document_attention, document_block_mask, document_kwargs, use_document_attention


def packed_rows(lengths: list[int], width: int) -> grpo.PackedBatch:
    g = torch.Generator().manual_seed(len(lengths))
    return grpo.pack_sequences([torch.randint(3, 90, (n,), generator=g) for n in lengths], width)


def dense_reference(query, key, value, packed: grpo.PackedBatch) -> torch.Tensor:
    """SDPA with the dense block-causal mask (the path document attention replaces)."""
    allowed = grpo.block_causal_mask(packed.sequence_index, torch.float64) == 0
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 24), min_size=1, max_size=8),
    st.integers(24, 40),
    st.sampled_from([(4, 4), (4, 2), (6, 1)]),
)
def test_sdpa_backend_equals_dense_mask_values_and_gradients(lengths, width, heads) -> None:
    packed = packed_rows(lengths, width)
    rows, g = packed.input_ids.shape[0], torch.Generator().manual_seed(width)
    q = torch.randn(rows, heads[0], width, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(rows, heads[1], width, 8, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in "kv"
    )
    real = (packed.sequence_index >= 0)[:, None, :, None]  # padding differs: self-only vs causal block
    weights = torch.randn(q.shape, generator=g, dtype=torch.float64) * real

    ours = document_attention(q, k, v, packed.cu_seqlens(), backend="sdpa")
    grads = torch.autograd.grad((ours * weights).sum(), (q, k, v))
    reference = dense_reference(q, k, v, packed)
    reference_grads = torch.autograd.grad((reference * weights).sum(), (q, k, v))
    torch.testing.assert_close(ours * real, reference * real, rtol=0, atol=1e-12)
    for mine, expected in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(mine, expected, rtol=0, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 70), min_size=1, max_size=10), st.sampled_from([4, 8, 16, 32]))
def test_block_mask_tiles_are_exact(lengths: list[int], block: int) -> None:
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    document = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    positions = torch.arange(total)
    allowed = (document[:, None] == document[None, :]) & (positions[:, None] >= positions[None, :])
    assert_block_mask_tiles_exact(document_block_mask(cu, total, block_size=block), allowed, block)


def test_flex_backend_values_on_cpu() -> None:
    # CPU FlexAttention has no backward and runs uncompiled here: this checks the mask, not speed.
    lengths, g = [150, 3, 97, 1, 140], torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, sum(lengths), 16, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, sum(lengths), 16, generator=g, dtype=torch.float64)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        flex = document_attention(q, k, v, cu, backend="flex", scale=0.3)
    torch.testing.assert_close(
        flex, document_attention(q, k, v, cu, backend="sdpa", scale=0.3), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_hf_forward_equals_separate_forwards_values_and_gradients(arch: str) -> None:
    from tiny_lm import make_tiny_lm

    model = make_tiny_lm(arch=arch, dtype=torch.float64).train()
    lengths, g = [5, 9, 3, 12, 7, 4, 1], torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, model.config.vocab_size, (n,), generator=g) for n in lengths]
    packed = grpo.pack_sequences(sequences, 16)
    assert packed.input_ids.shape[0] < len(sequences) and (packed.sequence_index < 0).any()  # shared, padded
    weights = [torch.randn(n - 1, generator=g, dtype=torch.float64) for n in lengths]

    with use_document_attention(model):
        logits = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            **document_kwargs(packed.cu_seqlens()),
        ).logits
    assert model.config._attn_implementation == "sdpa"  # restored
    assert_packed_equals_separate(model, packed.unpack(logits), sequences, weights)


def test_packed_hf_forward_builds_no_square_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiny_lm import make_tiny_lm

    forbid_dense_masks(monkeypatch)
    model = make_tiny_lm(arch="qwen2").train()
    lengths = [300, 41, 200, 7, 476]  # L = 1024
    packed = packed_rows(lengths, sum(lengths))
    with LargestTensors() as seen, use_document_attention(model):
        logits = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            **document_kwargs(packed.cu_seqlens()),
        ).logits
        logits.logsumexp(-1).sum().backward()
    seen.assert_no_square(sum(lengths))


def test_square_guard_catches_the_dense_mask(tiny_lm) -> None:
    # The guard above can fail: the dense-mask forward of the same row trips it.
    lengths = [300, 41, 200, 7, 476]
    packed = packed_rows(lengths, sum(lengths))
    with LargestTensors() as seen, torch.no_grad():
        tiny_lm(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=grpo.block_causal_mask(packed.sequence_index),
        )
    with pytest.raises(AssertionError, match="L, L"):
        seen.assert_no_square(sum(lengths))


def test_errors(tiny_lm) -> None:
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(grpo.ShapeError, match="cu_seqlens must rise"):
        document_attention(q, q, q, torch.tensor([0, 3]), backend="sdpa")
    with pytest.raises(grpo.ShapeError, match="do not fit"):
        document_attention(q, torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8), torch.tensor([0, 4]))
    with pytest.raises(grpo.InvalidParameterError, match="backend"):
        document_attention(q, q, q, torch.tensor([0, 4]), backend="xformers")  # type: ignore[arg-type]
    with pytest.raises(grpo.InvalidParameterError, match="no dropout"):
        document_attention(q, q, q, torch.tensor([0, 4]), backend="flex", dropout_p=0.1)
    ids = torch.tensor([[5, 6, 7, 8]])
    with use_document_attention(tiny_lm), pytest.raises(grpo.InvalidParameterError, match="document_kwargs"):
        tiny_lm(input_ids=ids)
    with use_document_attention(tiny_lm), pytest.raises(grpo.InvalidParameterError, match="attention_mask"):
        tiny_lm(
            input_ids=ids, attention_mask=torch.zeros(1, 1, 4, 4), **document_kwargs(torch.tensor([0, 4]))
        )
    assert tiny_lm.config._attn_implementation == "sdpa"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def attention_and_grads(backend, dtype, q64, k64, v64, weights, cu_seqlens, max_seqlen) -> list[torch.Tensor]:
    """Output and its q, k, v gradients (of ``(out * weights).sum()``) in ``dtype``, as float64."""
    q, k, v = (x.to(dtype).requires_grad_() for x in (q64, k64, v64))
    out = document_attention(q, k, v, cu_seqlens, max_seqlen=max_seqlen, backend=backend)
    grads = torch.autograd.grad((out.double() * weights).sum(), (q, k, v))
    return [x.double() for x in (out, *grads)]


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["flex", "flash", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_backends_as_exact_as_per_document_sdpa(backend: str, dtype: torch.dtype) -> None:
    # Against an fp64 reference, each fused backend's error (values and gradients) is at most twice
    # that of per-document SDPA in the same dtype (plus a floor): equal up to rounding.
    if backend == "flash" and (dtype == torch.float32 or not grpo.attention._installed("flash_attn")):
        pytest.skip("flash-attn varlen: fp16/bf16 with flash-attn installed")
    floor = 1e-5 if dtype == torch.float32 else 1e-3
    for lengths in (
        [700, 3, 129, 1, 1200, 15],
        [64, 64, 300],
    ):  # a second length: the compiled kernel reshapes
        g, total = torch.Generator(device="cuda").manual_seed(len(lengths)), sum(lengths)
        q64 = torch.randn(1, 8, total, 64, generator=g, device="cuda", dtype=torch.float64)
        k64, v64 = torch.randn(2, 1, 2, total, 64, generator=g, device="cuda", dtype=torch.float64)
        inputs = (q64, k64, v64, torch.randn(q64.shape, generator=g, device="cuda", dtype=torch.float64))
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        exact = attention_and_grads("sdpa", torch.float64, *inputs, cu, max(lengths))
        ours = attention_and_grads(backend, dtype, *inputs, cu, max(lengths))
        sdpa = attention_and_grads("sdpa", dtype, *inputs, cu, max(lengths))
        for name, mine, theirs, truth in zip(("out", "dq", "dk", "dv"), ours, sdpa, exact, strict=True):
            error, baseline = (mine - truth).abs().max().item(), (theirs - truth).abs().max().item()
            assert error <= 2 * baseline + floor, (name, total, error, baseline)
