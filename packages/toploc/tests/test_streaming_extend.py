"""``ProofBuilder.extend`` (a window of rows per call) equals one ``add`` per row, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toploc import ActivationError, ProofBuilder, build_proofs_bytes, split_proofs


def _by_add(rows: torch.Tensor, lengths: list[int], dbs: int, topk: int) -> list[bytes]:
    builder = ProofBuilder(rows.shape[0], rows.shape[-1], dbs, topk)
    for t in range(rows.shape[1]):
        builder.add(rows[:, t], active_mask=[t < n for n in lengths])
    return builder.finish()


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 45), min_size=1, max_size=5),
    window=st.integers(1, 20),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_extend_in_windows_equals_add_per_row(lengths, window, dtype, seed) -> None:
    # Windows of any size, ragged ends inside a window, fp32 rows rounded by the copy itself.
    total = max(lengths)
    rows = torch.randn(len(lengths), total, 16, generator=torch.Generator().manual_seed(seed)).to(dtype)
    builder = ProofBuilder(len(lengths), 16, decode_batching_size=8, topk=16)
    for start in range(0, total, window):
        stop = min(start + window, total)
        builder.extend(rows[:, start:stop], [min(max(n - start, 0), stop - start) for n in lengths])
    assert builder.tokens.tolist() == lengths
    proofs = builder.finish()
    assert proofs == _by_add(rows, lengths, 8, 16)
    for s, n in enumerate(lengths):
        assert split_proofs(proofs[s], 16) == (build_proofs_bytes(rows[s, :n], 8, 16, True) if n else [])


def test_extend_after_add_crosses_chunk_boundaries() -> None:
    # Open chunks at different fills (3 and 0), then one 20-row window: 2 chunk closes per sequence.
    rows = torch.randn(2, 23, 32, generator=torch.Generator().manual_seed(3))
    builder = ProofBuilder(2, 32, decode_batching_size=8, topk=32)
    for t in range(3):
        builder.add(rows[:, t], active_mask=[True, False])
    builder.extend(rows[:, 3:23], np.array([20, 20]))
    proofs = builder.finish()
    assert split_proofs(proofs[0], 32) == build_proofs_bytes(rows[0], 8, 32, True)
    assert split_proofs(proofs[1], 32) == build_proofs_bytes(rows[1, 3:23], 8, 32, True)


def test_extend_errors() -> None:
    builder = ProofBuilder(2, 8, decode_batching_size=4, topk=8)
    with pytest.raises(ActivationError, match="num_sequences, n, hidden_size"):
        builder.extend(torch.zeros(2, 8))
    with pytest.raises(ActivationError, match=r"\[2, 8\]"):
        builder.extend(torch.zeros(3, 1, 8))
    with pytest.raises(ValueError, match="counts"):
        builder.extend(torch.zeros(2, 3, 8), [4, 0])
    with pytest.raises(ActivationError, match="floating"):
        builder.extend(torch.zeros(2, 3, 8, dtype=torch.int32))


@settings(max_examples=30, deadline=None)
@given(masks=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=30), seed=st.integers(0, 99))
def test_add_with_ragged_fills_equals_batch_api(masks, seed) -> None:
    # Sequences that pause and resume (vLLM batch slots) sit at different fills: rows scatter.
    rows = torch.randn(len(masks), 3, 16, generator=torch.Generator().manual_seed(seed))
    builder = ProofBuilder(3, 16, decode_batching_size=4, topk=16)
    for t, mask in enumerate(masks):
        builder.add(rows[t], active_mask=mask)
    proofs = builder.finish()
    for s in range(3):
        kept = rows[[t for t, mask in enumerate(masks) if mask[s]], s]
        assert split_proofs(proofs[s], 16) == (build_proofs_bytes(kept, 4, 16, True) if len(kept) else [])
