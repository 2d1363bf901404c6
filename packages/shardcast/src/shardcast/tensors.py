"""A state dict as the bytes of a safetensors file, read span by span without building the file.

:class:`SafetensorsStream` lays out ``{name: tensor}`` exactly as ``safetensors.torch.save_file``
does, then serves any byte range of that virtual file by copying from the tensors' own memory.
:func:`shardcast.publish.publish_tensors` cuts it into shards, so a checkpoint in memory is
written to disk once (as shards) instead of twice (file, then shards), and clients receive the
same bytes as from ``save_file`` + :func:`~shardcast.publish.publish_file`.

The safetensors format::

    u64 little-endian N || N bytes of JSON header, space-padded to a multiple of 8 || tensor data

Header: ``{"__metadata__": {str: str}`` (only when metadata is given) ``, name: {"dtype": "F32",
"shape": [...], "data_offsets": [begin, end]}, ...}`` in compact JSON (no spaces, UTF-8 kept).
Tensors are ordered by dtype, widest first (safetensors' ``Dtype`` enum order, reversed: the
alignment-friendly order), then by name; their data follow back to back in that order.

Accepted values: ``torch.Tensor`` (any device, any strides: each is moved to CPU and made
contiguous one at a time, when its bytes are first read) and ``numpy.ndarray``. Neither library
is imported here; a value's type decides which one's methods are used.

Pitfall: the tensors are read while the shards are written. Do not modify them (an optimizer
step) until the publish call returns: the manifest always matches the shards, but the version
would mix weights from two steps.
"""

from __future__ import annotations

import bisect
import json
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import PublishError

# safetensors dtype codes in the order of its ``Dtype`` enum (``safetensors/src/tensor.rs``);
# the file lists tensors in the reverse of this order. Keys are the dtype names of torch
# (``str(dtype)`` without ``torch.``) and numpy (``dtype.name``), which agree.
_DTYPE_ORDER = (
    ("bool", "BOOL"),
    ("uint8", "U8"),
    ("int8", "I8"),
    ("float8_e5m2", "F8_E5M2"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e8m0fnu", "F8_E8M0"),
    ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
    ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
    ("int16", "I16"),
    ("uint16", "U16"),
    ("float16", "F16"),
    ("bfloat16", "BF16"),
    ("int32", "I32"),
    ("uint32", "U32"),
    ("float32", "F32"),
    ("complex64", "C64"),
    ("float64", "F64"),
    ("int64", "I64"),
    ("uint64", "U64"),
)
_CODES = {name: code for name, code in _DTYPE_ORDER}
_RANK = {name: rank for rank, (name, _) in enumerate(_DTYPE_ORDER)}
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's place in the file: safetensors dtype code, shape, ``[begin, end)`` of its data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsStream:
    """The bytes of ``safetensors.torch.save_file(tensors, path, metadata)``, without the file.

    ::

        stream = SafetensorsStream(model.state_dict())
        stream.size                    # bytes of the file save_file would write
        stream.read(0, 1 << 20)        # its first MiB, copied from the tensors

    Args:
        tensors: ``{name: torch.Tensor | numpy.ndarray}``; names are non-empty strings other
            than ``"__metadata__"``.
        metadata: the header's free-form ``{str: str}`` (``None``: no ``__metadata__`` key).
            Pitfall: safetensors writes a metadata dict of more than one key in hash order
            (it differs between runs); this writes it in the dict's order.

    Raises:
        PublishError: a value that is neither a torch tensor nor a numpy array, a dtype
            safetensors cannot store (or float4, whose packed shape this does not lay out),
            a bad name or metadata entry, or a big-endian host.
    """

    def __init__(self, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> None:
        if not isinstance(tensors, Mapping):
            raise PublishError(f"expected a mapping of name -> tensor, got {type(tensors).__name__}")
        if sys.byteorder != "little":
            raise PublishError("publishing tensors needs a little-endian host (safetensors is little-endian)")
        described = [_describe(name, value) for name, value in tensors.items()]
        described.sort(key=lambda item: (-_RANK[item[1]], item[0]))
        header: dict[str, object] = {}
        if metadata is not None:
            header[METADATA_KEY] = _checked_metadata(metadata)
        entries: list[TensorEntry] = []
        offset = 0
        for name, dtype_name, shape, nbytes in described:
            entries.append(TensorEntry(name, _CODES[dtype_name], shape, offset, offset + nbytes))
            header[name] = {
                "dtype": _CODES[dtype_name],
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        text += b" " * (-len(text) % 8)
        self.header = struct.pack("<Q", len(text)) + text
        self.entries = tuple(entries)
        self.size = len(self.header) + offset
        self._values = [tensors[entry.name] for entry in entries]
        # Where each piece (header, then each tensor's data) starts in the file, for bisect.
        self._starts = [0] + [len(self.header) + entry.begin for entry in entries]
        self._cached: tuple[int, memoryview] | None = None

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes of the file from ``offset`` (fewer only past the end)."""
        if offset < 0 or size < 0:
            raise ValueError(f"bad range: offset {offset}, size {size}")
        end = min(offset + size, self.size)
        parts: list[bytes | memoryview] = []
        piece = max(0, bisect.bisect_right(self._starts, offset) - 1)
        position = offset
        while position < end:
            data = self._piece(piece)
            start = self._starts[piece]
            parts.append(data[position - start : min(end, start + len(data)) - start])
            position = start + len(data)
            piece += 1
        return b"".join(parts)

    def _piece(self, piece: int) -> bytes | memoryview:
        if piece == 0:
            return self.header
        if self._cached is None or self._cached[0] != piece:
            entry = self.entries[piece - 1]
            data = _raw_bytes(self._values[piece - 1])
            if len(data) != entry.end - entry.begin:
                raise PublishError(
                    f"tensor {entry.name!r} changed size while publishing "
                    f"({len(data)} bytes, expected {entry.end - entry.begin})"
                )
            self._cached = (piece, data)  # one tensor's CPU copy at a time, at most
        return self._cached[1]


def _describe(name: object, value: Any) -> tuple[str, str, tuple[int, ...], int]:
    """``(name, dtype name, shape, nbytes)`` of one tensor, without touching its data."""
    if not isinstance(name, str) or not name or name == METADATA_KEY:
        raise PublishError(f"bad tensor name {name!r}: use a non-empty string other than {METADATA_KEY!r}")
    library = type(value).__module__.split(".")[0]
    if library == "torch":
        dtype_name = str(value.dtype).removeprefix("torch.")
        shape, nbytes = tuple(int(n) for n in value.shape), int(value.numel()) * int(value.element_size())
        if getattr(value, "layout", None) is not None and str(value.layout) != "torch.strided":
            raise PublishError(f"tensor {name!r} is {value.layout}: make it dense first (.to_dense())")
    elif library == "numpy":
        dtype_name = value.dtype.name
        shape, nbytes = tuple(int(n) for n in value.shape), int(value.nbytes)
    else:
        raise PublishError(
            f"tensor {name!r} is a {type(value).__name__}: expected a torch.Tensor or numpy.ndarray"
        )
    if dtype_name not in _CODES:
        raise PublishError(
            f"tensor {name!r} has dtype {dtype_name}, which this writer does not lay out: "
            "save it with safetensors and use publish_file"
        )
    return name, dtype_name, shape, nbytes


def _raw_bytes(value: Any) -> memoryview:
    """The tensor's bytes in C order (little-endian), as a view of CPU memory."""
    if type(value).__module__.split(".")[0] == "torch":
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        tensor = tensor.resolve_conj().resolve_neg().contiguous().reshape(-1)
        torch = sys.modules["torch"]
        return memoryview(tensor.view(torch.uint8).numpy())
    numpy = sys.modules["numpy"]
    array = numpy.ascontiguousarray(value)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return memoryview(array.reshape(-1).view(numpy.uint8))


def _checked_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(metadata, Mapping):
        raise PublishError(f"metadata must be a mapping of str -> str, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PublishError(f"metadata entries must be str -> str, got {key!r}: {type(value).__name__}")
    return dict(metadata)
