"""``compare`` (torch, on the patterns' device) equals the numpy loop it replaced, chunk by chunk."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toploc.proofs import compare
from toploc.results import VerificationResult


def reference_compare(committed: np.ndarray, values: np.ndarray) -> list[VerificationResult]:
    """The previous implementation, verbatim: numpy arrays, a sort with a 1 << 20 sentinel, a loop."""
    num_chunks_, k = values.shape
    exp_u, exp_v = (committed & 0x7F80) >> 7, (values & 0x7F80) >> 7
    sign_u, sign_v = (committed >> 15) & 1, (values >> 15) & 1
    matched = exp_u == exp_v
    mant_err = np.abs((committed & 0x7F) - (values & 0x7F))
    n_matched = matched.sum(axis=1)
    exp_mismatches = k - n_matched
    sums = np.where(matched, mant_err, 0).sum(axis=1)
    ordered = np.sort(np.where(matched, mant_err, 1 << 20), axis=1)
    median = ordered[np.arange(num_chunks_), np.minimum(n_matched // 2, k - 1)]
    sign_mismatches = (matched & (sign_u != sign_v)).sum(axis=1)
    agreement = ((sign_u == sign_v) & (np.abs(exp_u - exp_v) <= 1)).sum(axis=1)
    results = []
    for c in range(num_chunks_):
        n = int(n_matched[c])
        results.append(
            VerificationResult(
                exp_mismatches=int(exp_mismatches[c]),
                mant_err_mean=float(sums[c]) / n if n else float("inf"),
                mant_err_median=float(median[c]) if n else float("inf"),
                sign_mismatches=int(sign_mismatches[c]),
                index_agreement=int(agreement[c]),
                topk=k,
            )
        )
    return results


@settings(max_examples=60, deadline=None)
@given(
    chunks=st.integers(1, 12),
    k=st.sampled_from([1, 2, 7, 128]),
    flips=st.integers(0, 0xFFFF),
    seed=st.integers(0, 2**16),
)
def test_compare_equals_the_numpy_reference(chunks, k, flips, seed) -> None:
    # Honest-looking rows (a few bits flipped), random rows (mostly unmatched) and one row with
    # every exponent wrong (n = 0: inf mean and median) in the same call.
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 1 << 16, (chunks, k)).astype(np.int64)
    committed = values ^ (rng.integers(0, 2, (chunks, k)) * (flips & rng.integers(0, 1 << 16, (chunks, k))))
    committed[0] = values[0] ^ 0x4000  # flips an exponent bit everywhere
    got = compare(committed, values)
    assert got == reference_compare(committed, values)
    assert got == compare(torch.from_numpy(committed), torch.from_numpy(values).to(torch.int32))


def test_compare_hand_oracle() -> None:
    # u = 0x3F81 (exp 0x7F, mant 1) vs v = 0x3F84 (exp 0x7F, mant 4): matched, error 3.
    # u = 0xBF80 vs v = 0x3F80: matched exponent, sign differs, error 0.
    # u = 0x4000 (exp 0x80) vs v = 0x3F80 (exp 0x7F): exponent mismatch, within ±1 -> agreement.
    committed = np.array([[0x3F81, 0xBF80, 0x4000]])
    values = np.array([[0x3F84, 0x3F80, 0x3F80]])
    (result,) = compare(committed, values)
    assert result == VerificationResult(
        exp_mismatches=1, mant_err_mean=1.5, mant_err_median=3.0, sign_mismatches=1, index_agreement=2, topk=3
    )


def test_results_behave_as_the_dataclass_built_them() -> None:
    # compare builds each result by setting its __dict__ (verify's host time), not through
    # __init__: equality, hashing, repr, as_tuple and immutability must be the dataclass's own.
    committed = np.array([[0x3F81, 0xBF80, 0x4000], [0x4000, 0x4000, 0x4000]])
    values = np.array([[0x3F84, 0x3F80, 0x3F80], [0x3F80, 0x3F80, 0x3F80]])
    fast, unmatched = compare(committed, values)
    slow = VerificationResult(1, 1.5, 3.0, sign_mismatches=1, index_agreement=2, topk=3)
    assert type(fast) is VerificationResult
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert fast.as_tuple() == (1, 1.5, 3.0)
    assert unmatched.as_tuple() == (3, float("inf"), float("inf"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.exp_mismatches = 0  # type: ignore[misc]
