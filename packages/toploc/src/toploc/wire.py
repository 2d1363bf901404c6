"""The proof wire format: ``be16(m) || k × be16(c_i)``, and its strict parser.

| offset | size              | field                                        |
|--------|-------------------|----------------------------------------------|
| 0      | 2 B, big-endian   | modulus m, 1 <= m <= 65497                   |
| 2 + 2i | 2 B, big-endian   | coefficient c_i < 65497, i = 0..k-1 (ascending powers) |

k = 128 gives 258 bytes (344 base64 characters). Byte-compatible with reference
0.1.x ``ProofPoly.to_bytes``; unlike its ``from_bytes``, parsing here rejects every
deviation (reference defect 7) with ``ProofFormatError``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np

from toploc.errors import ProofFormatError
from toploc.field import P, evaluate


@dataclass(frozen=True)
class ProofPoly:
    """One chunk's commitment: the injective modulus and the polynomial over GF(65497).

    Attributes:
        modulus: m in 1..65497; the polynomial is evaluated at ``flat_index % m``.
        coeffs: k coefficients in [0, 65497), ascending powers.
    """

    modulus: int
    coeffs: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= self.modulus <= P:
            raise ProofFormatError(
                f"modulus {self.modulus} is outside 1..{P} (0 is the reference's null proof)"
            )
        if not self.coeffs:
            raise ProofFormatError("a proof needs at least one coefficient")
        if any(not 0 <= c < P for c in self.coeffs):
            raise ProofFormatError(f"coefficients must lie in [0, {P})")

    def __call__(self, x: int) -> int:
        """f(x mod m) as a 16-bit bf16 pattern (the committed value at flat index x)."""
        residue = np.array([[x % self.modulus]], dtype=np.int64)
        return int(evaluate(np.array([self.coeffs], dtype=np.int64), residue)[0, 0])

    def to_bytes(self) -> bytes:
        return encode_proofs(np.array([self.modulus]), np.array([self.coeffs]))[0]

    def to_base64(self) -> str:
        return base64.b64encode(self.to_bytes()).decode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes, topk: int | None = None) -> ProofPoly:
        moduli, coeffs = decode_proofs([data], topk=topk if topk is not None else _infer_topk(data))
        return cls(int(moduli[0]), tuple(int(c) for c in coeffs[0]))

    @classmethod
    def from_base64(cls, text: str | bytes, topk: int | None = None) -> ProofPoly:
        return cls.from_bytes(strict_b64decode(text), topk=topk)


def _infer_topk(data: bytes) -> int:
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) < 4 or len(data) % 2:
        raise ProofFormatError("a proof is 2 + 2k bytes with k >= 1")
    return (len(data) - 2) // 2


def encode_proofs(moduli: np.ndarray, coeffs: np.ndarray) -> list[bytes]:
    """Serialise ``[C]`` moduli and ``[C, k]`` coefficients into C proofs of 2 + 2k bytes."""
    table = np.concatenate([np.asarray(moduli, np.int64)[:, None], np.asarray(coeffs, np.int64)], axis=1)
    raw = table.astype(">u2").tobytes()
    width = 2 * table.shape[1]
    return [raw[i * width : (i + 1) * width] for i in range(table.shape[0])]


def decode_proofs(proofs: list[bytes], *, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """Strictly parse proofs of exactly ``2 + 2·topk`` bytes into ``([C] moduli, [C, k] coeffs)``.

    Raises:
        ProofFormatError: a proof is not bytes, has the wrong length, m = 0 or m > 65497,
        or a coefficient >= 65497. The message names the proof's position.
    """
    expected = 2 + 2 * topk
    for position, proof in enumerate(proofs):
        if not isinstance(proof, (bytes, bytearray, memoryview)):  # a tuple: twice as fast as a union here
            raise ProofFormatError(f"proof {position} is {type(proof).__name__}, expected bytes")
        if len(proof) != expected:
            raise ProofFormatError(
                f"proof {position} has {len(proof)} bytes, expected {expected} (topk={topk})"
            )
    # Checked on a big-endian view of the joined bytes (join takes any bytes-like); only the
    # results are widened to int64: one 8-byte copy of the table, not three (verify's host time).
    table = np.frombuffer(b"".join(proofs), dtype=">u2").reshape(len(proofs), topk + 1)
    moduli = table[:, 0].astype(np.int64)
    bad_modulus = np.flatnonzero((moduli < 1) | (moduli > P))
    if bad_modulus.size:
        i = int(bad_modulus[0])
        raise ProofFormatError(f"proof {i} has modulus {int(moduli[i])}, outside 1..{P}")
    if table[:, 1:].max(initial=0) >= P:
        bad_coeff = int(np.flatnonzero((table[:, 1:] >= P).any(axis=1))[0])
        raise ProofFormatError(f"proof {bad_coeff} has a coefficient >= {P}")
    return moduli, table[:, 1:].astype(np.int64)


def strict_b64decode(text: str | bytes) -> bytes:
    """Standard padded base64 → bytes, accepting only the canonical encoding.

    Rejects whitespace, URL-safe or other characters, missing or extra padding,
    trailing data, and non-zero unused bits, by requiring that re-encoding the
    decoded bytes reproduces the input exactly.
    """
    if isinstance(text, str):
        try:
            raw = text.encode("ascii")
        except UnicodeEncodeError:
            raise ProofFormatError("base64 proof contains non-ASCII characters") from None
    elif isinstance(text, bytes | bytearray):
        raw = bytes(text)
    else:
        raise ProofFormatError(f"base64 proof is {type(text).__name__}, expected str")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProofFormatError(f"invalid base64 proof: {exc}") from None
    if base64.b64encode(data) != raw:
        raise ProofFormatError("base64 proof is not in canonical padded form")
    return data
