"""The field types of the wire models: bounded ids and numbers, proofs, sample ids.

Kept apart from ``protocol.py`` (the message models) so both the models and their users can name
a field's type without importing every message.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, StringConstraints

from prime_rl.api.assignment import MAX_SEED  # one definition: seeds are made there

__all__ = [
    "MAX_DETAIL_CHARS",
    "MAX_PROOF_CHARS",
    "MAX_SEED",
    "MAX_TOKEN_ID",
    "PACKED_FLOAT64",
    "PACKED_INT32",
    "NonNegInt",
    "ProofBytes",
    "Reason",
    "SampleId",
    "Seed",
    "TokenId",
    "WorkerId",
    "WorkerName",
    "packed_array",
    "printable",
    "unpacking",
]

MAX_TOKEN_ID = 2**31 - 1
MAX_PROOF_CHARS = 1 << 24  # 16 MiB of base64 per sample

WorkerId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
NonNegInt = Annotated[int, Field(ge=0, le=2**62)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Reason = Annotated[str, StringConstraints(min_length=1, max_length=200)]
MAX_DETAIL_CHARS = 1000


def printable(text: str) -> str:
    """``text`` safe to print on a terminal or in a log line: every character that is not printable
    (control characters such as ESC and newline, format characters such as a right-to-left
    override) becomes its Python escape (``\\x1b``, ``\\n``, ``\\u202e``); printable text is unchanged.

    Call it wherever text a worker chose (its name, anything it sent) is printed: a name holding
    ``"\\x1b[2J\\n[run] run finished with exit code 0"`` must neither clear the operator's console
    nor forge a line of it. (JSON metrics escape control characters already.)
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _printable_name(name: str) -> str:
    bad = next((i for i, c in enumerate(name) if not c.isprintable()), None)
    if bad is not None:
        raise ValueError(
            f"worker name must be printable: character {bad} is {printable(name[bad])!r} (a control or format "
            "character); use letters, digits, punctuation and spaces"
        )
    return name


WorkerName = Annotated[str, StringConstraints(max_length=64), AfterValidator(_printable_name)]
"""A worker's free-form label: at most 64 printable characters (checked at registration)."""


def _proofs_from_wire(value: Any) -> Any:
    """Standard padded base64 (the wire) -> bytes; bytes (built in-process) pass through."""
    if isinstance(value, str):
        if len(value) > MAX_PROOF_CHARS:
            raise ValueError(f"proofs has {len(value)} base64 characters > max {MAX_PROOF_CHARS}")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as error:
            raise ValueError(f"proofs is not standard padded base64: {error}") from None
    return value


ProofBytes = Annotated[
    bytes,
    BeforeValidator(_proofs_from_wire),
    PlainSerializer(lambda data: base64.b64encode(data).decode("ascii"), return_type=str, when_used="json"),
]
"""toploc proofs: raw bytes inside every process, standard padded base64 on the wire (JSON)."""


PACKED_INT32 = "<i4"
PACKED_FLOAT64 = "<f8"
_PACKED_KEYS = {"dtype", "b64"}


def packed_array(values: np.ndarray, dtype: str | None = None) -> dict[str, str]:
    """A per-token array in its packed wire form: ``{"dtype": "<i4" | "<f8", "b64": <standard padded
    base64 of the values' little-endian bytes>}`` (int32 token ids, float64 log-probs; ``dtype``: one
    of them, by default the one of ``values``' kind). An orchestrator serializes a listing of 128
    samples in less than half the CPU time of JSON numbers (``benchmarks/results/listing_cost.md``);
    it parses back to the same values (``unpacking``)."""
    if dtype is None:
        dtype = PACKED_INT32 if np.issubdtype(values.dtype, np.integer) else PACKED_FLOAT64
    return {"dtype": dtype, "b64": base64.b64encode(values.astype(dtype, copy=False).tobytes()).decode("ascii")}


def unpacking(dtype: str) -> BeforeValidator:
    """A list field's validator that also takes the packed form of ``packed_array`` with ``dtype``
    (``PACKED_INT32`` or ``PACKED_FLOAT64``): it becomes the list of its values, which the field then
    validates as if it had been sent as a JSON list (every bound and length rule applies)."""
    itemsize = np.dtype(dtype).itemsize

    def unpack(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if set(value) != _PACKED_KEYS:
            raise ValueError(f"a packed array is an object with exactly the keys 'dtype' and 'b64', got {sorted(value)}")
        if value["dtype"] != dtype:
            raise ValueError(f"packed array of dtype {printable(str(value['dtype']))!r}: this field takes {dtype!r}")
        if not isinstance(value["b64"], str):
            raise ValueError("packed array: 'b64' must be a string of standard padded base64")
        try:
            raw = base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as error:
            raise ValueError(f"packed array: 'b64' is not standard padded base64: {error}") from None
        if len(raw) % itemsize:
            raise ValueError(f"packed array: {len(raw)} bytes is not a whole number of {dtype} values")
        return np.frombuffer(raw, dtype).tolist()

    return BeforeValidator(unpack)


@dataclass(frozen=True, order=True)
class SampleId:
    """One sample of one stored batch; on the wire and on disk it is the text ``<batch_id>/<index>``.

    The only place sample ids are made (``str(SampleId(...))``) and parsed (``SampleId.parse``).
    """

    batch_id: str
    index: int

    def __str__(self) -> str:
        return f"{self.batch_id}/{self.index}"

    @classmethod
    def parse(cls, text: str) -> SampleId:
        """``"<batch_id>/<index>"`` -> SampleId; ValueError on anything else."""
        batch_id, sep, index = text.rpartition("/")
        if not sep or not batch_id or not index.isdigit() or not index.isascii():
            raise ValueError(f"not a sample id '<batch_id>/<index>': {text!r}")
        return cls(batch_id, int(index))
