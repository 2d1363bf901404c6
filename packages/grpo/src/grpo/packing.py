"""Sequence packing: many variable-length sequences -> a few fixed-length rows, and back.

Sequences are placed into bins of ``max_length`` tokens by first-fit-decreasing (sort by
length, put each into the first bin with room). Each packed row carries

* ``input_ids [num_bins, max_length]`` (``pad_id`` after the last sequence),
* ``position_ids`` restarting at 0 for every sequence (0 on padding),
* ``sequence_index`` = index of the original sequence per token (−1 on padding),

so per-token tensors (masks, advantages, old log-probs) are packed with :meth:`PackedBatch.pack`
and model outputs are unpacked with :meth:`PackedBatch.unpack`.

Attention must not cross sequence boundaries. Give the model the packed ``position_ids`` and
either the boundaries, :meth:`PackedBatch.cu_seqlens`, for document attention
(:func:`grpo.use_document_attention` with :func:`grpo.document_kwargs`: FlexAttention or
flash-attention varlen on CUDA, SDPA per sequence on CPU; memory O(L)), or the dense
:func:`block_causal_mask` (a 4D additive mask that Hugging Face models use as-is, eager and SDPA;
memory O(L²), and it rules out the fused attention kernels).
Pitfall: ``position_ids`` alone are not enough: with transformers 5.23, eager/SDPA and
``attention_mask=None`` the packed rows attend across sequences (checked on the tiny Llama:
log-probs differ by ~0.5), and a 2D all-ones mask does the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpo.errors import InvalidParameterError, ShapeError

__all__ = ["PackedBatch", "Placement", "block_causal_mask", "first_fit_decreasing", "pack_sequences"]


@dataclass(frozen=True)
class Placement:
    """Where original sequence ``index`` lives: row ``bin``, columns ``[offset, offset + length)``."""

    index: int
    bin: int
    offset: int
    length: int


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of sequence indices, each with total length <= ``capacity``; longest first.

    Deterministic: ties keep the original order. Uses at most 11/9·OPT + 6/9 bins
    (Dósa 2007). Raises :class:`~grpo.errors.InvalidParameterError` if a sequence is longer
    than ``capacity`` or empty.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise InvalidParameterError(f"capacity must be an int >= 1, got {capacity!r}")
    for index, length in enumerate(lengths):
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise InvalidParameterError(f"sequence {index} has invalid length {length!r} (need an int >= 1)")
        if length > capacity:
            raise InvalidParameterError(
                f"sequence {index} has {length} tokens > max_length {capacity}; truncate it or raise max_length"
            )
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    free: list[int] = []
    for index in order:
        for b, room in enumerate(free):
            if lengths[index] <= room:
                bins[b].append(index)
                free[b] -= lengths[index]
                break
        else:
            bins.append([index])
            free.append(capacity - lengths[index])
    return bins


@dataclass(frozen=True)
class PackedBatch:
    """Packed rows plus the placement of every original sequence (see module docstring)."""

    input_ids: torch.Tensor  # [num_bins, max_length] long
    position_ids: torch.Tensor  # [num_bins, max_length] long, restarting per sequence
    sequence_index: torch.Tensor  # [num_bins, max_length] long, −1 on padding
    placements: tuple[Placement, ...]  # one per original sequence, in original order

    @property
    def max_length(self) -> int:
        return int(self.input_ids.shape[1])

    def pack(self, values: Sequence[torch.Tensor], pad_value: float = 0) -> torch.Tensor:
        """Pack per-token values (one ``[len_i, ...]`` tensor per sequence) -> ``[num_bins, max_length, ...]``."""
        if len(values) != len(self.placements):
            raise ShapeError(f"got {len(values)} value tensors for {len(self.placements)} sequences")
        first = torch.as_tensor(values[0]) if values else torch.zeros(0)
        out = torch.full(
            (*self.input_ids.shape, *first.shape[1:]), pad_value, dtype=first.dtype, device=first.device
        )
        for place, value in zip(self.placements, values, strict=True):
            value = torch.as_tensor(value)
            if value.shape[0] != place.length:
                raise ShapeError(
                    f"sequence {place.index} has {place.length} tokens but {value.shape[0]} values"
                )
            out[place.bin, place.offset : place.offset + place.length] = value
        return out

    def unpack(self, packed: torch.Tensor) -> list[torch.Tensor]:
        """Split ``[num_bins, max_length, ...]`` back into one ``[len_i, ...]`` tensor per sequence (views)."""
        if packed.shape[:2] != self.input_ids.shape:
            raise ShapeError(
                f"packed values have shape {tuple(packed.shape)}, expected {tuple(self.input_ids.shape)}[, ...]"
            )
        return [packed[p.bin, p.offset : p.offset + p.length] for p in self.placements]

    def cu_seqlens(self) -> torch.Tensor:
        """Cumulative sequence starts over the flattened rows (int32), for :func:`grpo.document_attention`.

        Padding at the end of a row is its own segment so every token belongs to one segment.
        """
        bounds = [0]
        flat_offset = 0
        by_bin: dict[int, list[Placement]] = {}
        for place in self.placements:
            by_bin.setdefault(place.bin, []).append(place)
        for b in range(self.input_ids.shape[0]):
            end = 0
            for place in sorted(by_bin.get(b, []), key=lambda p: p.offset):
                end = place.offset + place.length
                bounds.append(flat_offset + end)
            if end < self.max_length:
                bounds.append(flat_offset + self.max_length)
            flat_offset += self.max_length
        return torch.tensor(bounds, dtype=torch.int32)


def pack_sequences(
    sequences: Sequence[Sequence[int] | torch.Tensor], max_length: int, *, pad_id: int = 0
) -> PackedBatch:
    """Pack token sequences into ``[num_bins, max_length]`` rows by first-fit-decreasing.

    Shapes: ``sequences`` = list of 1-D token lists/tensors -> :class:`PackedBatch`.
    Within a bin, sequences appear in the order FFD placed them (longest first).
    Pitfall: give the model the packed ``position_ids`` and the boundaries (document attention,
    see the module docstring), otherwise attention and RoPE see one long sequence.
    """
    if len(sequences) == 0:
        raise InvalidParameterError("no sequences to pack")
    token_lists = [torch.as_tensor(seq, dtype=torch.long).reshape(-1) for seq in sequences]
    bins = first_fit_decreasing([int(t.numel()) for t in token_lists], max_length)
    input_ids = torch.full((len(bins), max_length), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(bins), max_length), dtype=torch.long)
    sequence_index = torch.full((len(bins), max_length), -1, dtype=torch.long)
    placements: list[Placement | None] = [None] * len(token_lists)
    for b, members in enumerate(bins):
        offset = 0
        for index in members:
            tokens = token_lists[index]
            n = tokens.numel()
            input_ids[b, offset : offset + n] = tokens
            position_ids[b, offset : offset + n] = torch.arange(n)
            sequence_index[b, offset : offset + n] = index
            placements[index] = Placement(index=index, bin=b, offset=offset, length=n)
            offset += n
    return PackedBatch(input_ids, position_ids, sequence_index, tuple(p for p in placements if p is not None))


def block_causal_mask(sequence_index: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive 4D attention mask ``[num_bins, 1, L, L]``: 0 where query i may attend key j, else −inf-like.

    Query i attends key j iff j <= i and both belong to the same sequence. Padding tokens
    (index −1) attend only to themselves, which keeps softmax rows finite. Hugging Face
    models take a 4D ``attention_mask`` as-is (eager and SDPA attention).
    Pitfall: memory is O(L²) per row and it rules out fused kernels; the trainer uses
    :func:`grpo.document_attention` (from :meth:`PackedBatch.cu_seqlens`) instead.
    """
    if not isinstance(sequence_index, torch.Tensor) or sequence_index.dim() != 2:
        raise ShapeError("sequence_index must be a [num_bins, L] tensor")
    length = sequence_index.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=sequence_index.device).tril()
    same = sequence_index[:, :, None] == sequence_index[:, None, :]
    pad_self = (sequence_index[:, :, None] < 0) & torch.eye(
        length, dtype=torch.bool, device=sequence_index.device
    )
    allowed = (same & causal & (sequence_index[:, :, None] >= 0)) | pad_self
    mask = torch.zeros(allowed.shape, dtype=dtype, device=sequence_index.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]
