"""Encodings: zstd and XOR delta round-trip; malformed frames and zip bombs are refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcast import codec


@given(st.binary(max_size=5000), st.binary(max_size=5000))
@settings(deadline=None)
def test_delta_round_trip(new: bytes, base: bytes) -> None:
    base = (base + bytes(len(new)))[: len(new)]
    assert codec.decode_delta(codec.encode_delta(new, base), base) == new
    assert codec.decode(codec.encode(new, "zstd"), "zstd", len(new)) == new


def test_xor_hand_computed() -> None:
    assert codec.xor_bytes(b"\x0f\xf0", b"\xff\xff") == b"\xf0\x0f"
    with pytest.raises(ValueError):
        codec.xor_bytes(b"a", b"ab")


def test_malformed_and_oversized_frames() -> None:
    with pytest.raises(ValueError, match="bad zstd frame"):
        codec.zstd_decompress(b"not zstd", 10)
    bomb = codec.zstd_compress(bytes(10_000_000))
    with pytest.raises(ValueError):
        codec.zstd_decompress(bomb, 1000)
    with pytest.raises(ValueError, match="expected 5"):
        codec.decode(b"1234", "raw", 5)
