"""The field types of the wire models: bounded ids and numbers, proofs, sample ids.

Kept apart from ``protocol.py`` (the message models) so both the models and their users can name
a field's type without importing every message.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, StringConstraints

from prime_rl.api.assignment import MAX_SEED  # one definition: seeds are made there

__all__ = [
    "MAX_DETAIL_CHARS",
    "MAX_PROOF_CHARS",
    "MAX_SEED",
    "MAX_TOKEN_ID",
    "NonNegInt",
    "ProofBytes",
    "Reason",
    "SampleId",
    "Seed",
    "TokenId",
    "WorkerId",
    "WorkerName",
    "printable",
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
