"""Strict parsing of proofs (reference defect 7) and never-crash properties."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toploc import (
    ProofFormatError,
    ProofPoly,
    build_proofs_base64,
    build_proofs_bytes,
    verify_proofs_base64,
    verify_proofs_bytes,
)
from toploc.wire import decode_proofs, strict_b64decode

ACTIVATIONS = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)


def test_proof_is_258_bytes_and_344_base64_chars() -> None:
    proofs = build_proofs_bytes(ACTIVATIONS, 32, 128, True)
    assert [len(p) for p in proofs] == [258, 258]
    text = build_proofs_base64(ACTIVATIONS, 32, 128, True)
    assert [len(t) for t in text] == [344, 344]
    assert [base64.b64decode(t) for t in text] == proofs


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x00" + b"\x00" * 256, "modulus 0"),  # the reference's null proof
        (b"\xff\xff" + b"\x00" * 256, "modulus 65535"),
        (b"\xff\xd9" + b"\xff\xd9" + b"\x00" * 254, "coefficient"),
        (b"\xff\xd9" + b"\x00" * 255, "257 bytes"),
        (b"\xff\xd9", "2 bytes"),
        (b"", "0 bytes"),
    ],
)
def test_malformed_bytes_are_rejected(data: bytes, message: str) -> None:
    with pytest.raises(ProofFormatError, match=message):
        decode_proofs([data], topk=128)


@pytest.mark.parametrize(
    "text",
    ["!!!!", "/9k", "/9k=\n", " /9k=", "/9k=AAAA", "/9k==", "/9l=", "_-8=", "é"],
)
def test_non_canonical_base64_is_rejected(text: str) -> None:
    with pytest.raises(ProofFormatError):
        strict_b64decode(text)


def test_proof_count_must_match_chunks() -> None:
    proofs = build_proofs_bytes(ACTIVATIONS, 32, 128, True)
    with pytest.raises(ProofFormatError, match="got 1 proofs"):
        verify_proofs_bytes(ACTIVATIONS, proofs[:1], 32, 128, True)
    with pytest.raises(ProofFormatError, match="got 3 proofs"):
        verify_proofs_bytes(ACTIVATIONS, [*proofs, proofs[0]], 32, 128, True)
    with pytest.raises(ProofFormatError, match="got 2 proofs"):
        verify_proofs_bytes(ACTIVATIONS[:0], proofs, 32, 128, True)
    assert verify_proofs_bytes(ACTIVATIONS[:0], [], 32, 128, True) == []


def test_proofpoly_round_trip_and_evaluation() -> None:
    proof = ProofPoly.from_bytes(build_proofs_bytes(ACTIVATIONS, 32, 128, True)[0])
    assert ProofPoly.from_base64(proof.to_base64()) == proof
    chunk = ACTIVATIONS[:32].reshape(-1)
    top = int(torch.argmax(chunk.float().abs()))
    assert proof(top) == int(chunk.view(torch.int16)[top]) & 0xFFFF
    with pytest.raises(ProofFormatError):
        ProofPoly(0, (1, 2))


def verified_or_rejected(verify: Callable[..., list], proof: bytes | str) -> list | None:
    """``verify``'s results for ``proof`` against the first chunk, or None where it raised ``ProofFormatError``."""
    try:
        return verify(ACTIVATIONS[:32], [proof], 32, 128, True)
    except ProofFormatError:
        return None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    results = verified_or_rejected(verify_proofs_bytes, data)
    if results is not None:
        assert len(results) == 1 and len(data) == 258


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_base64_never_crashes(text: str) -> None:
    results = verified_or_rejected(verify_proofs_base64, text)
    if results is not None:
        assert len(results) == 1


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=258, max_size=258))
def test_random_258_byte_proofs_fail_verification(data: bytes) -> None:
    """A proof not made from these activations fails: f is pseudo-random at our indices."""
    from toploc import Thresholds

    results = verified_or_rejected(verify_proofs_bytes, data)
    if results is not None:
        (result,) = results
        assert not Thresholds().check(result).passed
