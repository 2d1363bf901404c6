"""Golden vectors made with reference toploc 0.1.6 + torch 2.6 (data/toploc_golden.json, a copy of the shared reference file).

The activations are regenerated with ``torch26_randn`` (torch 2.6's bf16 ``randn``, which
newer torch no longer reproduces). Two facts are checked separately:

* the commitment (modulus search, GF(65497) interpolation, wire format) is byte-identical
  when fed the reference's own index order (``torch.topk`` on |bf16|);
* our deterministic tie-break (|value| desc, index asc) differs from ``torch.topk`` only on
  ties at the top-k boundary, and each disagreement costs exactly one exponent mismatch.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch26_randn import Torch26BF16Normal

from toploc import ProofPoly, Thresholds, build_proofs_bytes, verify_proofs_bytes
from toploc.commitment import commit
from toploc.field import P, evaluate, find_injective_moduli, interpolate
from toploc.wire import encode_proofs

GOLDEN = json.loads((Path(__file__).parent / "data" / "toploc_golden.json").read_text())
CASES = {case["name"]: case for case in GOLDEN["cases"]}


def _activations(name: str) -> torch.Tensor:
    if name == "small_H256":
        return Torch26BF16Normal(1234).randn(96, 256)
    return Torch26BF16Normal(7).randn(32, 4096)


def test_readme_example_is_byte_identical() -> None:
    case = CASES["readme"]
    rng = Torch26BF16Normal(42)
    activations = [rng.randn(5, 16)] + [rng.randn(16) for _ in range(10)]
    proofs = build_proofs_bytes(activations, decode_batching_size=3, topk=4, skip_prefill=False)
    assert [p.hex() for p in proofs] == case["proofs_hex"]
    results = verify_proofs_bytes(activations, proofs, 3, 4, False)
    assert [r.as_tuple() for r in results] == [(0, 0.0, 0.0)] * 5


def test_from_points_raw() -> None:
    case = CASES["from_points_raw"]
    x = np.array([case["x"]], dtype=np.int64)
    moduli = find_injective_moduli(x)
    assert moduli.tolist() == [case["modulus"]]
    coeffs = interpolate(x % moduli[:, None], np.array([case["y"]]))
    assert coeffs[0].tolist() == case["coeffs"]
    proof = encode_proofs(moduli, coeffs)[0]
    assert proof.hex() == case["bytes_hex"]
    assert base64.b64encode(proof).decode() == case["base64"]
    assert ProofPoly.from_base64(case["base64"]).to_bytes() == proof


@pytest.mark.parametrize("name", ["small_H256", "H4096_1chunk"])
def test_commitment_matches_reference_given_reference_index_order(name: str) -> None:
    case = CASES[name]
    chunks = _activations(name).reshape(-1, 32 * _activations(name).shape[1])
    indices = torch.topk(chunks.abs(), 128, dim=1).indices  # the reference's selection
    values = torch.gather(chunks, 1, indices).view(torch.int16).numpy().view(np.uint16).astype(np.int64)
    moduli, coeffs = commit(indices.numpy(), values)
    assert moduli.tolist() == case["moduli"]
    assert [p.hex() for p in encode_proofs(moduli, coeffs)] == case["proofs_hex"]


@pytest.mark.parametrize("name", ["small_H256", "H4096_1chunk"])
def test_reference_proofs_verify_with_ours(name: str) -> None:
    """Mismatches are exactly the boundary-tie disagreements between the two selections."""
    case = CASES[name]
    activations = _activations(name)
    proofs = [bytes.fromhex(h) for h in case["proofs_hex"]]
    results = verify_proofs_bytes(activations, proofs, 32, 128, True)
    chunks = activations.reshape(len(proofs), -1)
    ref_sets = [set(row.tolist()) for row in torch.topk(chunks.abs(), 128, dim=1).indices]
    ours = build_proofs_bytes(activations, 32, 128, True)
    for result, ref_set, chunk, own in zip(results, ref_sets, chunks, ours, strict=True):
        key = (chunk.view(torch.int16).to(torch.int64) & 0x7FFF) * (1 << 32) - torch.arange(chunk.numel())
        our_set = set(torch.topk(key, 128).indices.tolist())
        assert result.exp_mismatches == len(our_set - ref_set)
        assert result.mant_err_mean == 0.0 and result.sign_mismatches == 0
        assert Thresholds().check(result).passed
        # And our own proofs equal the reference's exactly when the two sets agree.
        assert (own.hex() == case["proofs_hex"][ours.index(own)]) == (our_set == ref_set)


def test_modulus_not_65497_is_reduced_on_every_path() -> None:
    """Reference defect 1: its Python path gave (71, 1.947, 0.0) on these honest data."""
    case = CASES["modulus_not_65497"]
    activations = _activations("H4096_1chunk")
    ours = build_proofs_bytes(activations, 32, 128, True)
    assert int.from_bytes(ours[0][:2], "big") == 65496
    rows = list(activations)  # the list input took the buggy path in the reference
    assert [r.as_tuple() for r in verify_proofs_bytes(rows, ours, 32, 128, True)] == [(0, 0.0, 0.0)]
    assert case["verify_same_C_path"] == [[0, 0.0, 0.0]]


@pytest.mark.parametrize("name", ["small_H256", "H4096_1chunk"])
def test_times_1p01_matches_reference_tolerance(name: str) -> None:
    """x·1.01 in bf16: the reference's C path gave exponent mismatches <= 1, mantissa median 2."""
    case = CASES[name]
    activations = _activations(name)
    proofs = build_proofs_bytes(activations, 32, 128, True)
    results = verify_proofs_bytes(activations * 1.01, proofs, 32, 128, True)
    for ours, (ref_exp, _ref_mean, ref_median) in zip(results, case["verify_times_1p01_C_path"], strict=True):
        assert ours.mant_err_median == ref_median == 2.0
        assert ours.exp_mismatches <= ref_exp
        assert Thresholds().check(ours).passed


def test_field_round_trip_at_huge_indices() -> None:
    """Indices beyond 2^31 (reference defect 9 truncated them to C int)."""
    rng = np.random.default_rng(0)
    indices = rng.choice(2**40, size=(4, 128), replace=False).reshape(4, 128) + 2**33
    values = rng.integers(0, 0xFF80, size=(4, 128))
    moduli, coeffs = commit(indices, values)
    assert (evaluate(coeffs, indices % moduli[:, None]) == values).all()
    assert (coeffs < P).all()
