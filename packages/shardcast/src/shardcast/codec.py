"""Shard encodings: ``raw``, ``zstd`` and the ``xor-zstd`` delta.

- ``zstd``: ``stored = zstd(shard)``. Checkpoints of bf16/fp32 weights compress little
  (random-looking mantissas), typically 5–20 %.
- ``xor-zstd``: ``stored = zstd(shard XOR base_shard)`` where ``base_shard`` is the same
  byte span of the previous version. After a small optimizer step most high bytes
  (sign, exponent) are unchanged, so the XOR is mostly zero bytes and compresses well.
  Requires same-size files (same-layout safetensors checkpoints).

XOR uses numpy when it is importable and falls back to Python big integers (much slower;
both rates: ``benchmarks/results/shardcast_compression.txt``) otherwise, so numpy is optional.
"""

from __future__ import annotations

import zstandard

ZSTD_LEVEL = 3
"""zstd's default level: ~300-1000 MB/s per core, close to the best ratio on weights."""


def zstd_compress(data: bytes, level: int = ZSTD_LEVEL) -> bytes:
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def zstd_decompress(data: bytes, expected_size: int) -> bytes:
    """Decompress one frame, refusing to produce more than ``expected_size`` bytes.

    Raises ``ValueError`` on a malformed frame or a size mismatch (zip-bomb safe: the
    output is bounded by ``expected_size``).
    """
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=max(expected_size, 1))
    except zstandard.ZstdError as exc:
        raise ValueError(f"bad zstd frame: {exc}") from None
    if len(out) != expected_size:
        raise ValueError(f"zstd frame decodes to {len(out)} bytes, expected {expected_size}")
    return out


def xor_bytes(left: bytes, right: bytes) -> bytes:
    """Byte-wise XOR of two equal-length buffers."""
    if len(left) != len(right):
        raise ValueError(f"xor of buffers of different lengths ({len(left)} != {len(right)})")
    try:
        import numpy as np
    except ImportError:
        return (int.from_bytes(left, "little") ^ int.from_bytes(right, "little")).to_bytes(
            len(left), "little"
        )
    a = np.frombuffer(left, dtype=np.uint8)
    b = np.frombuffer(right, dtype=np.uint8)
    return np.bitwise_xor(a, b).tobytes()


def encode(shard: bytes, encoding: str) -> bytes:
    """Stored bytes of one shard under a full encoding (``raw`` or ``zstd``)."""
    if encoding == "raw":
        return shard
    if encoding == "zstd":
        return zstd_compress(shard)
    raise ValueError(f"unknown encoding {encoding!r}")


def decode(stored: bytes, encoding: str, size: int) -> bytes:
    """Inverse of :func:`encode`; raises ``ValueError`` on malformed input."""
    if encoding == "raw":
        if len(stored) != size:
            raise ValueError(f"raw shard has {len(stored)} bytes, expected {size}")
        return stored
    if encoding == "zstd":
        return zstd_decompress(stored, size)
    raise ValueError(f"unknown encoding {encoding!r}")


def encode_delta(shard: bytes, base_shard: bytes) -> bytes:
    return zstd_compress(xor_bytes(shard, base_shard))


def decode_delta(stored: bytes, base_shard: bytes) -> bytes:
    return xor_bytes(zstd_decompress(stored, len(base_shard)), base_shard)
