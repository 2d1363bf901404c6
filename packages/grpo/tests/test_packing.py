"""Sequence packing: first-fit-decreasing bins, position resets, pack/unpack round trips, and a
packed forward pass of the tiny Llama giving the same log-probs as one row per sequence."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo


def test_first_fit_decreasing_example() -> None:
    # Sorted: 7 (i=1), 5 (i=0), 4 (i=3), 3 (i=2), 2 (i=4). Capacity 10:
    # 7 -> bin0 (room 3); 5 -> bin1 (room 5); 4 -> bin1 (room 1); 3 -> bin0 (room 0); 2 -> bin2.
    assert grpo.first_fit_decreasing([5, 7, 3, 4, 2], 10) == [[1, 2], [0, 3], [4]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=30), st.integers(20, 40))
def test_first_fit_decreasing_properties(lengths: list[int], capacity: int) -> None:
    bins = grpo.first_fit_decreasing(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))  # every sequence exactly once
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)  # no overflow
    # First-fit property: no later bin's first item would have fitted an earlier bin at that time,
    # which implies at most one bin is at most half full.
    assert sum(1 for b in bins if sum(lengths[i] for i in b) <= capacity / 2) <= 1
    assert len(bins) >= -(-sum(lengths) // capacity)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 99), min_size=1, max_size=12), min_size=1, max_size=12),
    st.integers(12, 30),
)
def test_pack_unpack_round_trip(sequences: list[list[int]], max_length: int) -> None:
    packed = grpo.pack_sequences(sequences, max_length, pad_id=-7)
    assert packed.input_ids.shape[1] == max_length
    assert [t.tolist() for t in packed.unpack(packed.input_ids)] == sequences
    assert [t.tolist() for t in packed.unpack(packed.position_ids)] == [
        list(range(len(s))) for s in sequences
    ]
    pad = packed.sequence_index < 0
    assert (packed.input_ids[pad] == -7).all() and (packed.position_ids[pad] == 0).all()
    assert int((~pad).sum()) == sum(map(len, sequences))
    # Per-token values (e.g. advantages) travel with their tokens.
    values = [torch.full((len(s), 2), float(i)) for i, s in enumerate(sequences)]
    repacked = packed.pack(values, pad_value=-1.0)
    assert all(torch.equal(a, b) for a, b in zip(packed.unpack(repacked), values, strict=True))
    bounds = packed.cu_seqlens()
    assert bounds[0] == 0 and bounds[-1] == packed.input_ids.numel() and (bounds.diff() > 0).all()


def test_block_causal_mask() -> None:
    # Row: seq 0 (2 tokens), seq 1 (2 tokens), 1 pad. Allowed = causal within a sequence; pad sees itself.
    mask = grpo.block_causal_mask(torch.tensor([[0, 0, 1, 1, -1]]))
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ]
    assert mask.shape == (1, 1, 5, 5) and mask.min() == torch.finfo(torch.float32).min


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_forward_matches_unpacked_log_probs(tiny_lm, attention: str) -> None:
    lengths = [5, 9, 3, 12, 7, 4, 1]
    g = torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, tiny_lm.config.vocab_size, (n,), generator=g) for n in lengths]
    packed = grpo.pack_sequences(sequences, 16)
    assert packed.input_ids.shape[0] < len(sequences)  # several sequences share a row
    previous = tiny_lm.config._attn_implementation
    tiny_lm.config._attn_implementation = attention
    try:
        with torch.no_grad():
            logits = tiny_lm(
                input_ids=packed.input_ids,
                position_ids=packed.position_ids,
                attention_mask=grpo.block_causal_mask(packed.sequence_index),
            ).logits
            unpacked = [tiny_lm(input_ids=s[None]).logits[0] for s in sequences]
    finally:
        tiny_lm.config._attn_implementation = previous
    for seq, packed_logits, row_logits in zip(sequences, packed.unpack(logits), unpacked, strict=True):
        ours = grpo.selective_log_softmax(packed_logits[:-1], seq[1:])
        reference = grpo.selective_log_softmax(row_logits[:-1], seq[1:])
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: grpo.pack_sequences([[1, 2, 3]], 2), "max_length"),
        (lambda: grpo.pack_sequences([[1], []], 4), "invalid length"),
        (lambda: grpo.pack_sequences([], 4), "no sequences"),
        (lambda: grpo.first_fit_decreasing([1], 0), "capacity"),
        (lambda: grpo.pack_sequences([[1]], 4).pack([torch.zeros(2)]), "values"),
        (lambda: grpo.pack_sequences([[1]], 4).unpack(torch.zeros(2, 4)), "shape"),
        (lambda: grpo.block_causal_mask(torch.zeros(3)), "sequence_index"),
    ],
)
def test_bad_inputs(call, message: str) -> None:
    with pytest.raises(grpo.GrpoError, match=message):
        call()
