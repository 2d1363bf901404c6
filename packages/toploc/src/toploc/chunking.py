"""Split activations into proof chunks, as reference 0.1.x does, as bf16 bit patterns.

Chunks, in proof order:

1. the prefill, ``activations[0]``, as ONE chunk over all its elements (unless
   ``skip_prefill``), whatever its shape;
2. decode rows ``[i, i + dbs)`` for ``i = start, start + dbs, ...``; each group is
   flattened row-major, so the flat index of (row t of the group, column h) is t·H + h;
   the last group may be short.

``activations`` is a 2-D ``[tokens, hidden]`` tensor (sliced by rows, so with
``skip_prefill=False`` row 0 is the "prefill") or a list of tensors (entry 0 the
prefill; decode entries each flattened, all of equal size).

dtype policy: bf16 is used as is; fp16, fp32 and fp64 are rounded to bf16 with
``Tensor.to(torch.bfloat16)`` (round to nearest even, deterministic on every device).
Integer, bool and complex tensors are rejected (the reference interpolated raw int
values and truncated int64, defect 9).
Pitfall: the reference interpolated fp16 bit patterns unchanged, so fp16 proofs made
by the reference do not verify here (they did not verify there either, defect 11).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toploc.errors import ActivationError

Activations = torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class ChunkGroup:
    """Chunks of equal size: ``bits [C, n]`` int16 bf16 patterns, proofs ``first .. first + C - 1``."""

    first: int
    bits: torch.Tensor


def to_bf16_bits(tensor: torch.Tensor) -> torch.Tensor:
    """Contiguous int16 view of ``tensor`` rounded to bf16 (see the module's dtype policy)."""
    if not isinstance(tensor, torch.Tensor):
        raise ActivationError(f"activations must be torch tensors, got {type(tensor).__name__}")
    if not tensor.dtype.is_floating_point:
        raise ActivationError(f"activations must be floating point, got {tensor.dtype}")
    return tensor.detach().to(torch.bfloat16).contiguous().view(torch.int16)


def split_chunks(activations: Activations, decode_batching_size: int, skip_prefill: bool) -> list[ChunkGroup]:
    """The chunk groups of ``activations`` in proof order (see the module docstring)."""
    if decode_batching_size < 1:
        raise ValueError(f"decode_batching_size must be >= 1, got {decode_batching_size}")
    prefill, decode = _prefill_and_decode(activations, skip_prefill)
    groups: list[ChunkGroup] = []
    if prefill is not None:
        groups.append(ChunkGroup(0, to_bf16_bits(prefill).reshape(1, -1)))
    if decode is None or decode.shape[0] == 0:
        return groups
    rows = decode.shape[0]
    first = len(groups)
    full, tail = divmod(rows, decode_batching_size)
    if full:
        groups.append(ChunkGroup(first, decode[: full * decode_batching_size].reshape(full, -1)))
    if tail:
        groups.append(ChunkGroup(first + full, decode[full * decode_batching_size :].reshape(1, -1)))
    return groups


def num_chunks(groups: list[ChunkGroup]) -> int:
    return sum(group.bits.shape[0] for group in groups)


def _prefill_and_decode(
    activations: Activations, skip_prefill: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(prefill tensor or None, decode rows as ``[N, H]`` int16 bits or None)."""
    if isinstance(activations, torch.Tensor):
        if activations.dim() != 2:
            raise ActivationError(
                f"activations tensor must be 2-D [tokens, hidden], got {tuple(activations.shape)}"
            )
        bits = to_bf16_bits(activations)
        if skip_prefill:
            return None, bits
        return (activations[0] if activations.shape[0] else None), bits[1:]
    if not isinstance(activations, list | tuple):
        raise ActivationError(
            f"activations must be a tensor or a list of tensors, got {type(activations).__name__}"
        )
    entries = list(activations)
    prefill = None
    if not skip_prefill and entries:
        prefill, entries = entries[0], entries[1:]
        if not isinstance(prefill, torch.Tensor) or prefill.numel() == 0:
            raise ActivationError("the prefill activation must be a non-empty tensor")
    if not entries:
        return prefill, None
    decode = [to_bf16_bits(entry).reshape(-1) for entry in entries]
    sizes = {entry.numel() for entry in decode}
    if len(sizes) != 1:
        raise ActivationError(
            f"decode activations must all have the same number of elements, got {sorted(sizes)}"
        )
    return prefill, torch.stack(decode)
