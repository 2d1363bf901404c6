"""Deterministic top-k: the threshold path equals the key path and a brute-force oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toploc import ActivationError, build_proofs_bytes, verify_proofs_bytes
from toploc.selection import select_topk


def _oracle(bits: torch.Tensor, k: int) -> list[list[int]]:
    """Sort every chunk by (|value| desc, index asc) in plain Python."""
    out = []
    for row in bits.tolist():
        order = sorted(range(len(row)), key=lambda i: (-(row[i] & 0x7FFF), i))
        out.append(order[:k])
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.sampled_from([256 * 4, 256 * 9]),
    st.integers(1, 4),
    st.integers(0, 2**31 - 1),
    st.sampled_from([1, 4, 64]),
)
def test_threshold_path_equals_key_path_and_oracle(
    chunks: int, n: int, k: int, seed: int, levels: int
) -> None:
    """``levels`` small forces massive ties (values drawn from a few magnitudes and signs)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-levels, levels + 1, (chunks, n), generator=g).to(torch.bfloat16)
    bits = values.view(torch.int16)
    fast_idx, fast_val = select_topk(bits, k, method="threshold")
    key_idx, key_val = select_topk(bits, k, method="keys")
    assert torch.equal(fast_idx, key_idx) and torch.equal(fast_val, key_val)
    assert fast_idx.tolist() == _oracle(bits, k)


def test_selection_is_tie_break_by_lowest_index() -> None:
    bits = torch.full((1, 1024), 3.0, dtype=torch.bfloat16).view(torch.int16)
    bits[0, 700] = torch.tensor(-3.0, dtype=torch.bfloat16).view(torch.int16)
    idx, _ = select_topk(bits, 4)
    assert idx.tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_activations_are_rejected(bad: float) -> None:
    acts = torch.randn(32, 64)
    acts[5, 7] = bad
    with pytest.raises(ActivationError, match="NaN or Inf"):
        build_proofs_bytes(acts, 32, 128, True)


def test_dtype_policy() -> None:
    acts = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    as_bf16 = build_proofs_bytes(acts.to(torch.bfloat16), 32, 128, True)
    assert build_proofs_bytes(acts, 32, 128, True) == as_bf16  # fp32 rounds to bf16
    assert build_proofs_bytes(acts.double(), 32, 128, True) == as_bf16
    fp16 = build_proofs_bytes(acts.half(), 32, 128, True)
    assert verify_proofs_bytes(acts.half(), fp16, 32, 128, True)[0].exp_mismatches == 0
    for bad in (acts.to(torch.int32), acts > 0, acts.to(torch.int64)):
        with pytest.raises(ActivationError, match="floating point"):
            build_proofs_bytes(bad, 32, 128, True)


def test_non_contiguous_and_list_inputs_agree() -> None:
    base = torch.randn(64, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    wide = torch.zeros(128, 64, dtype=torch.bfloat16)
    transposed = base.T.contiguous().T  # same values, non-contiguous strides
    assert not transposed.is_contiguous()
    expected = build_proofs_bytes(base, 32, 128, False)
    assert build_proofs_bytes(transposed, 32, 128, False) == expected
    assert build_proofs_bytes(list(base), 32, 128, False) == expected
    assert build_proofs_bytes([row[None] for row in base], 32, 128, False) == expected
    assert len(build_proofs_bytes(wide.T.contiguous() + 1, 32, 64, True)) == 2


def test_chunk_counts_and_short_tail() -> None:
    acts = torch.randn(70, 64, generator=torch.Generator().manual_seed(3))
    assert len(build_proofs_bytes(acts, 32, 64, True)) == 3  # 32 + 32 + 6
    assert len(build_proofs_bytes(acts, 32, 64, False)) == 4  # row 0 is the prefill
    with pytest.raises(ActivationError, match="topk=512"):
        build_proofs_bytes(acts, 32, 512, True)  # the 6-row tail has 384 elements
    with pytest.raises(ValueError, match="decode_batching_size"):
        build_proofs_bytes(acts, 0, 64, True)
    with pytest.raises(ActivationError, match="same number of elements"):
        build_proofs_bytes([torch.randn(3, 4), torch.randn(64), torch.randn(65)], 32, 4, False)


def test_sign_flip_is_detected() -> None:
    """Reference defect 2: negating every activation verified as (0, 0, 0)."""
    from toploc import Thresholds

    acts = torch.randn(32, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    proofs = build_proofs_bytes(acts, 32, 128, True)
    (result,) = verify_proofs_bytes(-acts, proofs, 32, 128, True)
    assert result.exp_mismatches == 0 and result.sign_mismatches == 128
    verdict = Thresholds().check(result)
    assert not verdict.passed and "sign" in verdict.reason


def test_huge_prefill_indices_use_int64() -> None:
    bits = torch.zeros((1, 2**20), dtype=torch.int16)
    bits[0, -3:] = 0x4000
    idx, _ = select_topk(bits, 3)
    assert idx.dtype == torch.int64 and idx.tolist() == [[2**20 - 3, 2**20 - 2, 2**20 - 1]]
    assert np.iinfo(np.int64).max > 2**40
