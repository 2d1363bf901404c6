"""Shared-prefix attention and packing: equal to a dense reference mask and to separate forwards of
each ``prompt ⧺ completion`` (values and every parameter gradient), an exact block mask, no
``L x L`` tensor, no mixed devices."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from fp64_norm import rms_norm_in_input_dtype
from grpo_attention_checks import assert_block_mask_tiles_exact, assert_packed_equals_separate
from hypothesis import given, settings
from hypothesis import strategies as st
from tensor_guard import LargestTensors, forbid_dense_masks

import grpo
from grpo.shared_prefix import SharedPrefixStructure, shared_prefix_attention, shared_prefix_block_mask

group_layouts = st.lists(
    st.tuples(st.integers(1, 20), st.lists(st.integers(1, 12), min_size=0, max_size=5)),
    min_size=1,
    max_size=5,
)


def allowed_pairs(structure: SharedPrefixStructure) -> torch.Tensor:
    """The rule written out densely, pair by pair (the slow reference): ``[L, L]`` bool."""
    segment_of, root_of = [], []
    for s, (a, b) in enumerate(zip(structure.bounds, structure.bounds[1:], strict=False)):
        segment_of += [s] * (b - a)
        root_of += [structure.prefix_of[s]] * (b - a)
    n = structure.length
    return torch.tensor(
        [[j <= i and segment_of[j] in (segment_of[i], root_of[i]) for j in range(n)] for i in range(n)]
    )


def random_qkv(length: int, heads: tuple[int, int], seed: int, grad: bool = True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads[0], length, 8, generator=g, dtype=torch.float64, requires_grad=grad)
    k, v = (
        torch.randn(1, heads[1], length, 8, generator=g, dtype=torch.float64, requires_grad=grad)
        for _ in "kv"
    )
    return q, k, v, torch.randn(q.shape, generator=g, dtype=torch.float64)


@settings(max_examples=30, deadline=None)
@given(group_layouts, st.sampled_from([(4, 4), (4, 2), (6, 1)]))
def test_sdpa_equals_the_dense_rule_values_and_gradients(groups, heads) -> None:
    structure = SharedPrefixStructure.from_groups(groups)
    q, k, v, weights = random_qkv(structure.length, heads, seed=len(groups))
    ours = shared_prefix_attention(q, k, v, structure, backend="sdpa")
    grads = torch.autograd.grad((ours * weights).sum(), (q, k, v))
    repeat = heads[0] // heads[1]
    reference = F.scaled_dot_product_attention(
        q, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1), attn_mask=allowed_pairs(structure)
    )
    reference_grads = torch.autograd.grad((reference * weights).sum(), (q, k, v))
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)
    for mine, expected in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(mine, expected, rtol=0, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(group_layouts, st.sampled_from([2, 4, 8, 16]))
def test_block_mask_tiles_are_exact(groups, block: int) -> None:
    structure = SharedPrefixStructure.from_groups(groups)
    allowed = allowed_pairs(structure)
    assert_block_mask_tiles_exact(shared_prefix_block_mask(structure, block_size=block), allowed, block)


def test_flex_backend_values_on_cpu() -> None:
    # CPU FlexAttention runs uncompiled and has no backward: this checks the block mask end to end.
    structure = SharedPrefixStructure.from_groups([(150, [40, 97, 3]), (20, []), (300, [1, 140]), (9, [5])])
    q, k, v, _ = random_qkv(structure.length, (4, 2), seed=0, grad=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        flex = shared_prefix_attention(q, k, v, structure, backend="flex", scale=0.3)
    expected = shared_prefix_attention(q, k, v, structure, backend="sdpa", scale=0.3)
    torch.testing.assert_close(flex, expected, rtol=0, atol=1e-12)


def test_documents_only_is_document_attention() -> None:
    structure = SharedPrefixStructure.from_groups([(5, []), (7, []), (3, [])])
    assert not structure.has_suffixes and structure.max_span == 7
    q, k, v, _ = random_qkv(15, (4, 2), seed=1, grad=False)
    torch.testing.assert_close(
        shared_prefix_attention(q, k, v, structure),
        grpo.document_attention(q, k, v, structure.cu_seqlens(), backend="sdpa"),
        rtol=0,
        atol=0,
    )


def random_groups(vocab: int, layout: list[tuple[int, list[int]]], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(3, vocab, (p,), generator=g), [torch.randint(3, vocab, (c,), generator=g) for c in cs])
        for p, cs in layout
    ]


# Different prompt lengths, a group of 1, a group with an empty completion, and padding.
LAYOUT = [(9, [4, 7, 1, 5]), (3, [6]), (14, [2, 8, 3]), (5, [0, 6, 2])]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_hf_forward_equals_separate_forwards_values_and_gradients(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiny_lm import make_tiny_lm

    rms_norm_in_input_dtype(monkeypatch)  # fp64 throughout (see tests/support/fp64_norm.py)
    model = make_tiny_lm(arch=arch, dtype=torch.float64).train()
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA
    groups = random_groups(model.config.vocab_size, LAYOUT)
    pack = grpo.pack_shared_prefix(groups, length=100)
    sequences = [torch.cat([prompt, c]) for prompt, completions in groups for c in completions]
    assert pack.structure.has_suffixes and pack.input_ids.shape == (1, 100)
    assert sum(len(s) for s in sequences) > pack.input_ids.shape[1] - 100 + sum(p + sum(c) for p, c in LAYOUT)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(len(s) - 1, generator=g, dtype=torch.float64) for s in sequences]

    with grpo.use_document_attention(model):
        logits = model(
            input_ids=pack.input_ids,
            position_ids=pack.position_ids,
            **grpo.shared_prefix_kwargs(pack.structure),
        ).logits
    assert_packed_equals_separate(model, pack.unpack(logits), sequences, weights)


def test_placements_and_positions_by_hand() -> None:
    pack = grpo.pack_shared_prefix([([5, 6, 7], [[8, 9], [10]]), ([11, 12], [[13, 14]])], length=11)
    # row: 5 6 7 | 8 9 | 10 | 11 12 13 14 (a group of 1: one document) | pad
    assert pack.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2, 3, 0]]
    assert pack.structure.bounds == (0, 3, 5, 6, 10, 11) and pack.structure.prefix_of == (0, 0, 0, 3, 4)
    first, second, alone = pack.placements
    assert first.predictor_positions() == [2, 3] and second.predictor_positions() == [2]
    assert second.token_positions() == [0, 1, 2, 5] and alone.predictor_positions() == [7, 8]


def test_shared_forward_builds_no_square_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiny_lm import make_tiny_lm

    forbid_dense_masks(monkeypatch)
    model = make_tiny_lm(arch="qwen2").train()
    groups = random_groups(model.config.vocab_size, [(150, [60] * 8), (100, [90, 30, 150, 14]), (30, [110])])
    pack = grpo.pack_shared_prefix(groups)
    length = pack.input_ids.shape[1]
    with LargestTensors() as seen, grpo.use_document_attention(model):
        logits = model(
            input_ids=pack.input_ids,
            position_ids=pack.position_ids,
            **grpo.shared_prefix_kwargs(pack.structure),
        ).logits
        logits.logsumexp(-1).sum().backward()
    seen.assert_no_square(length)


def test_no_mixed_devices() -> None:
    from device_guard import simulated_device
    from tiny_lm import make_tiny_lm

    model = make_tiny_lm(arch="llama").train()
    pack = grpo.pack_shared_prefix(random_groups(model.config.vocab_size, LAYOUT))
    with simulated_device() as device, grpo.use_document_attention(model):
        device.place(model)
        on_device = torch.device("cpu")  # the compute device, to the guard
        inputs = {"input_ids": pack.input_ids.to(on_device), "position_ids": pack.position_ids.to(on_device)}
        logits = model(**inputs, **grpo.shared_prefix_kwargs(pack.structure)).logits
        values = pack.unpack(logits)
        assert len(values) == sum(len(completions) for _, completions in LAYOUT)  # one per sequence
        sum(v.sum() for v in values).backward()
        assert all(device.on_device(v) for v in values)


def test_errors(tiny_lm) -> None:
    with pytest.raises(grpo.ShapeError, match="rise strictly"):
        SharedPrefixStructure((0, 3, 3), (0, 0))
    with pytest.raises(grpo.ShapeError, match="not an earlier prefix"):
        SharedPrefixStructure((0, 3, 5), (1, 1))
    with pytest.raises(grpo.ShapeError, match="not next to its group"):
        SharedPrefixStructure((0, 3, 5, 6), (0, 1, 0))
    with pytest.raises(grpo.ShapeError, match="prefix_of entries"):
        SharedPrefixStructure((0, 3, 5), (0,))
    structure = SharedPrefixStructure.from_groups([(2, [1, 1])])
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(grpo.ShapeError, match="covers 4 tokens"):
        shared_prefix_attention(q[:, :, :3], q[:, :, :3], q[:, :, :3], structure)
    with pytest.raises(grpo.InvalidParameterError, match="no shared prefixes"):
        shared_prefix_attention(q, q, q, structure, backend="flash")
    with pytest.raises(grpo.InvalidParameterError, match="no dropout"):
        shared_prefix_attention(q, q, q, structure, backend="flex", dropout_p=0.1)
    with pytest.raises(grpo.InvalidParameterError, match="backend"):
        shared_prefix_attention(q, q, q, structure, backend="xformers")  # type: ignore[arg-type]
    with pytest.raises(grpo.InvalidParameterError, match="non-empty prompt"):
        grpo.pack_shared_prefix([([], [[1]])])
    with pytest.raises(grpo.InvalidParameterError, match="at least one completion"):
        grpo.pack_shared_prefix([([1], [])])
    with pytest.raises(grpo.InvalidParameterError, match="5 tokens > length 4"):
        grpo.pack_shared_prefix([([1, 2], [[3, 4], [5]])], length=4)
    with pytest.raises(grpo.InvalidParameterError, match="SharedPrefixStructure"):
        grpo.shared_prefix_kwargs(structure.bounds)  # type: ignore[arg-type]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run(q64, k64, v64, weights, structure, backend: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Output and its q, k, v gradients (of ``(out * weights).sum()``) in ``dtype``, as float64."""
    q, k, v = (x.to(dtype).requires_grad_() for x in (q64, k64, v64))
    out = shared_prefix_attention(q, k, v, structure, backend=backend)  # type: ignore[arg-type]
    grads = torch.autograd.grad((out.double() * weights).sum(), (q, k, v))
    return [x.double() for x in (out, *grads)]


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_flex_as_exact_as_per_segment_sdpa(dtype: torch.dtype) -> None:
    # Against an fp64 reference, compiled FlexAttention's error (values and gradients) is at most
    # twice that of the per-segment SDPA path in the same dtype (plus a floor): equal up to rounding.
    floor = 1e-5 if dtype == torch.float32 else 1e-3
    for groups in ([(700, [129, 1, 300, 64]), (15, [])], [(150, [64] * 16), (1000, [200] * 8)]):
        structure = SharedPrefixStructure.from_groups(groups)
        g = torch.Generator(device="cuda").manual_seed(structure.length)
        shape = (1, 8, structure.length, 64)
        q64 = torch.randn(shape, generator=g, device="cuda", dtype=torch.float64)
        k64, v64 = torch.randn(2, 1, 2, structure.length, 64, generator=g, device="cuda", dtype=torch.float64)
        weights = torch.randn(shape, generator=g, device="cuda", dtype=torch.float64)

        inputs = (q64, k64, v64, weights, structure)
        exact, ours = run(*inputs, "sdpa", torch.float64), run(*inputs, "flex", dtype)
        sdpa = run(*inputs, "sdpa", dtype)
        for name, mine, theirs, truth in zip(("out", "dq", "dk", "dv"), ours, sdpa, exact, strict=True):
            error, baseline = (mine - truth).abs().max().item(), (theirs - truth).abs().max().item()
            assert error <= 2 * baseline + floor, (name, structure.length, error, baseline)
