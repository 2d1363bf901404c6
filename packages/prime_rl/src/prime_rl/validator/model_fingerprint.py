"""A model directory's fingerprint for the noise-profile cache, without reading every weight byte.

The honest-noise cache (:mod:`prime_rl.validator.noise_cache`) is keyed by the model it measured.
A sha256 of every byte read the whole model at each validator start (~65 GB for QwQ-32B); this
fingerprint reads a few MiB. It is a sha256 over the sorted top-level files of the directory (the
provenance record ``prime_rl_source.json`` and subfolders such as the cache's own left out: neither
changes what the model computes), each file contributing its name, its size and:

* a file of at most :data:`WHOLE_FILE_BYTES` (64 MiB: ``config.json``, the tokenizer files, the
  generation config, a small model's weights): every byte, as before;
* a larger ``.safetensors`` file: its whole header (every tensor's name, dtype, shape and data
  offsets, and the ``__metadata__``), then each tensor's first and last :data:`TENSOR_EDGE_BYTES`
  (4 KiB; the whole tensor when it is at most twice that);
* any other larger file (a ``.bin``, a ``.gguf``, a safetensors file whose header does not parse):
  :data:`SPREAD_BLOCKS` + 2 blocks of :data:`BLOCK_BYTES` (64 KiB): the first, the last and 16
  evenly spaced between them.

Covered: adding, removing or renaming a file; a file's size; a tensor's name, dtype, shape or
place; any byte of the configuration and tokenizer files; the first and last 4 KiB of every
tensor's values. A fine-tune or a merge changes every value of each tensor it touches, so those
ends too. Not covered: an edit that keeps every shape and leaves both ends of every tensor alone
(one weight changed in the middle of a layer, a row of an embedding swapped); such a model keeps
the old fingerprint. Its identity is never taken from where it lives or when it was written:
copies of the same bytes, anywhere, with any mtime, have the same fingerprint.

Why that is acceptable: the fingerprint only picks which calibration to reuse. A noise profile
describes the validator's own engine (how far an honest decode and its prefill disagree on this
machine); nothing compares the fingerprint with anything a worker sends, and it decides no trust
(the cache is its only user). Someone who can edit the validator's model directory can edit its
cache as well. Such an edit leaves a stale profile, as a BLAS library swapped under the same
wheel does (``noise_cache``'s pitfall): ``validator.recalibrate = true`` measures again.

No shardcast manifest applies: ``model.path`` is a ``from_pretrained`` directory on the
validator's disk, and shardcast carries only the run's policy files, never that directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import BinaryIO

__all__ = ["BLOCK_BYTES", "PROVENANCE", "SPREAD_BLOCKS", "TENSOR_EDGE_BYTES", "WHOLE_FILE_BYTES", "model_fingerprint"]

FORMAT = "prime-rl-model-fingerprint/1"
PROVENANCE = "prime_rl_source.json"
"""What ``launch.model_cache`` writes into a directory it converted (read by ``noise_cache`` too)."""
WHOLE_FILE_BYTES = 64 << 20
"""Files up to this size are hashed whole (Gemma 3's tokenizer.json is 33 MiB)."""
TENSOR_EDGE_BYTES = 4 << 10
"""Bytes read at each end of every tensor of a large safetensors file."""
BLOCK_BYTES = 64 << 10
SPREAD_BLOCKS = 16
"""Blocks between the first and the last one of a large file that is not safetensors."""
MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit on its JSON header
_CHUNK = 4 << 20


def model_fingerprint(model_dir: str | os.PathLike[str]) -> str:
    """sha256 hex of ``model_dir``'s top-level files as the module docstring says (names, sizes,
    whole small files, large files' safetensors headers and tensor ends or fixed blocks)."""
    digest = hashlib.sha256(FORMAT.encode())
    for path in sorted(Path(model_dir).iterdir()):
        if not path.is_file() or path.name == PROVENANCE:
            continue
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as handle:
            for start, length in _spans(handle, path.name, size):
                handle.seek(start)
                while length > 0:
                    block = handle.read(min(_CHUNK, length))
                    if not block:
                        break
                    digest.update(block)
                    length -= len(block)
    return digest.hexdigest()


def _spans(handle: BinaryIO, name: str, size: int) -> list[tuple[int, int]]:
    """The ``(start, length)`` byte ranges of one file that its fingerprint reads, in file order."""
    if size <= WHOLE_FILE_BYTES:
        return [(0, size)]
    if name.endswith(".safetensors"):
        tensors = _safetensors_spans(handle, size)
        if tensors is not None:
            return tensors
    last = size - BLOCK_BYTES
    starts = sorted({round(i * last / (SPREAD_BLOCKS + 1)) for i in range(SPREAD_BLOCKS + 2)})
    return [(start, BLOCK_BYTES) for start in starts]


def _safetensors_spans(handle: BinaryIO, size: int) -> list[tuple[int, int]] | None:
    """The header (length prefix and JSON) and each tensor's two ends; None when the header does not
    parse or a tensor lies outside the file."""
    handle.seek(0)
    prefix = handle.read(8)
    if len(prefix) < 8:
        return None
    (header_bytes,) = struct.unpack("<Q", prefix)
    data_start = 8 + header_bytes
    if header_bytes > MAX_HEADER_BYTES or data_start > size:
        return None
    try:
        header = json.loads(handle.read(header_bytes))
        offsets = [entry["data_offsets"] for name, entry in header.items() if name != "__metadata__"]
        ranges = sorted((int(begin), int(end)) for begin, end in offsets)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if any(not 0 <= begin <= end <= size - data_start for begin, end in ranges):
        return None
    spans = [(0, data_start)]
    for begin, end in ranges:
        if end - begin <= 2 * TENSOR_EDGE_BYTES:
            spans.append((data_start + begin, end - begin))
        else:
            spans.append((data_start + begin, TENSOR_EDGE_BYTES))
            spans.append((data_start + end - TENSOR_EDGE_BYTES, TENSOR_EDGE_BYTES))
    return spans
