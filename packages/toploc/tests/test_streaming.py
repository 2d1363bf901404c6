"""ProofBuilder equals build_proofs_bytes on each sequence's rows, however rows arrive."""

from __future__ import annotations

import pytest
import torch

from toploc import ActivationError, ProofBuilder, build_proofs_bytes, split_proofs, verify_proofs_bytes


def test_lockstep_equals_batch_api() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 70, 64, generator=g)  # 70 tokens: 2 full chunks + a 6-row tail
    builder = ProofBuilder(3, 64, decode_batching_size=32, topk=64)
    for t in range(70):
        builder.add(rows[:, t])
    proofs = builder.finish()
    for s in range(3):
        expected = build_proofs_bytes(rows[s], 32, 64, skip_prefill=True)
        assert split_proofs(proofs[s], topk=64) == expected
        assert len(proofs[s]) == 3 * 130


def test_ragged_sequences_with_active_mask() -> None:
    g = torch.Generator().manual_seed(1)
    lengths = [5, 40, 64, 0]
    rows = torch.randn(4, 64, 32, generator=g).to(torch.bfloat16)
    builder = ProofBuilder(4, 32, decode_batching_size=16, topk=32)
    for t in range(64):
        builder.add(rows[:, t], active_mask=[t < n for n in lengths])
    assert builder.tokens.tolist() == lengths
    proofs = builder.finish()
    assert proofs[3] == b""
    for s, n in enumerate(lengths[:3]):
        assert split_proofs(proofs[s], 32) == build_proofs_bytes(rows[s, :n], 16, 32, True)
        results = verify_proofs_bytes(rows[s, :n], split_proofs(proofs[s], 32), 16, 32, True)
        assert all(r.exp_mismatches == 0 for r in results)


def test_builder_errors() -> None:
    builder = ProofBuilder(2, 8, decode_batching_size=4, topk=16)
    with pytest.raises(ActivationError, match=r"\[2, 8\]"):
        builder.add(torch.zeros(3, 8))
    builder.add(torch.randn(2, 8))  # one row = 8 elements < topk=16
    with pytest.raises(ActivationError, match="topk=16"):
        builder.finish()
    nan_builder = ProofBuilder(1, 8, decode_batching_size=2, topk=4)
    nan_builder.add(torch.full((1, 8), float("nan")))
    with pytest.raises(ActivationError, match="NaN"):
        nan_builder.finish()
    with pytest.raises(RuntimeError, match="finish"):
        nan_builder.add(torch.zeros(1, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
def test_cuda_rows_give_cpu_identical_proofs() -> None:
    rows = torch.randn(4, 40, 256)
    builder = ProofBuilder(4, 256)
    for t in range(40):
        builder.add(rows[:, t].cuda())
    proofs = builder.finish()
    assert [split_proofs(p) for p in proofs] == [build_proofs_bytes(rows[s], 32, 128, True) for s in range(4)]
