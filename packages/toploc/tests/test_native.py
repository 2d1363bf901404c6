"""The C kernels (toploc.native) equal the numpy/torch path bit for bit, on random and adversarial input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toploc import ActivationError, build_proofs_bytes, native, verify_proofs_bytes
from toploc.field import evaluate, find_injective_moduli, interpolate
from toploc.selection import select_topk

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the numpy path is used")


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 3000),
    st.integers(1, 140),
    st.integers(0, 2**31 - 1),
    st.sampled_from([1, 3, 1000]),
)
def test_select_equals_key_path(chunks: int, n: int, k: int, seed: int, levels: int) -> None:
    k = min(k, n)
    g = torch.Generator().manual_seed(seed)
    bits = (torch.randint(-levels, levels + 1, (chunks, n), generator=g).to(torch.bfloat16) / 7).view(
        torch.int16
    )
    idx, val = select_topk(bits, k, method="native")
    key_idx, key_val = select_topk(bits, k, method="keys")
    assert torch.equal(idx, key_idx) and torch.equal(val, key_val)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 130), st.integers(0, 2**31 - 1), st.sampled_from([2**17, 2**40]))
def test_commit_and_evaluate_equal_numpy(chunks: int, k: int, seed: int, span: int) -> None:
    rng = np.random.default_rng(seed)
    indices = np.stack([rng.choice(span, size=k, replace=False) for _ in range(chunks)]).astype(np.int64)
    values = rng.integers(0, 0xFF80, size=(chunks, k))
    moduli, coeffs = native.commit(indices, values.astype(np.uint16))
    expected_moduli = find_injective_moduli(indices)
    assert np.array_equal(moduli, expected_moduli)
    assert np.array_equal(coeffs, interpolate(indices % expected_moduli[:, None], values))
    probe = rng.integers(0, 2**41, size=(chunks, 50))
    assert np.array_equal(native.evaluate(coeffs, moduli, probe), evaluate(coeffs, probe % moduli[:, None]))
    assert np.array_equal(native.evaluate(coeffs, moduli, indices), values)


def test_adversarial_modulus_search() -> None:
    """{0..63} ∪ {61465 + 64j} collide for every m in [61402, 65497]; the reference settles on 61401."""
    indices = np.array([list(range(64)) + [61465 + 64 * j for j in range(64)]], dtype=np.int64)
    moduli, _ = native.commit(indices, np.zeros((1, 128), np.uint16))
    assert moduli.tolist() == find_injective_moduli(indices).tolist() == [61401]


def test_native_rejects_non_finite_and_bad_arguments() -> None:
    bits = torch.zeros((2, 4096), dtype=torch.bfloat16)
    bits[1, 4000] = float("inf")
    with pytest.raises(ActivationError, match="NaN or Inf"):
        native.select(bits.view(torch.int16).numpy().view(np.uint16), 128)
    with pytest.raises(ValueError, match="invalid arguments"):
        native.evaluate(np.zeros((1, 4), np.int64), np.array([0]), np.zeros((1, 4), np.int64))
    with pytest.raises(ValueError, match="invalid arguments"):
        native.commit(np.full((1, 4), -1, np.int64), np.zeros((1, 4), np.uint16))


def test_whole_api_equal_with_and_without_native(monkeypatch: pytest.MonkeyPatch) -> None:
    acts = torch.randn(100, 512, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    proofs = build_proofs_bytes(acts, 32, 128, False)
    results = verify_proofs_bytes(acts * 1.01, proofs, 32, 128, False)
    monkeypatch.setattr(native, "library", lambda: None)
    assert not native.available()
    assert build_proofs_bytes(acts, 32, 128, False) == proofs
    assert verify_proofs_bytes(acts * 1.01, proofs, 32, 128, False) == results
