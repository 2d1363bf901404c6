"""Shared-prefix attention: a GRPO group's prompt computed once, its completions attending to it.

A packed row is cut into *segments* laid back to back. A segment is a *prefix* (a prompt, or a
whole plain document) or a *suffix* (a completion) of the nearest prefix before it; a prefix and
its suffixes form a *group*. Token ``i`` may attend token ``j`` iff ``j <= i`` and either both lie
in one segment or ``j`` lies in the prefix of ``i``'s group. The row
``[prompt, completion_1, ..., completion_G]`` thus computes the prompt once, and every completion
sees the prompt's keys and values and, causally, itself: exactly the ``G`` separate forwards of
``prompt ⧺ completion_k`` when each completion's position ids continue from the prompt's length
(:func:`grpo.pack_shared_prefix` writes them). Gradients are exact as well: it is one graph, whose
prompt activations collect the gradients of all ``G`` completions.

Backends, each with memory O(L) (never an ``L x L`` tensor):

* ``"flex"``: FlexAttention, compiled on CUDA (needs Triton), with a block mask built from
  tile-level segment ranges (:func:`shared_prefix_block_mask`: ``(L / 128)²`` entries);
* ``"sdpa"``: per group one causal SDPA over the prefix, then per suffix one SDPA of its queries
  over ``cat(prefix keys, own keys)`` with the causal diagonal shifted by the prefix length (a
  boolean ``[C, P + C]`` mask per suffix) (any device; the CPU default).

``"auto"`` sends a structure without suffixes (plain documents) to :func:`grpo.document_attention`
(flash varlen, flex or sdpa as there) and otherwise picks flex on CUDA with Triton, sdpa elsewhere.
Hugging Face models: inside :func:`grpo.use_document_attention`, pass
``**shared_prefix_kwargs(structure)`` to the forward.
Pitfall: a group's completions all have their first token predicted by the prompt's last position
(:meth:`grpo.SharedPlacement.predictor_positions`), not by the token before them in the row.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from grpo.attention import (
    FLEX_BLOCK_SIZE,
    _flatten,
    _flex_attend,
    _installed,
    _tile_block_mask,
    _unflatten,
    document_attention,
)
from grpo.errors import InvalidParameterError, ShapeError

__all__ = [
    "SHARED_PREFIX_KWARG",
    "SharedPrefixStructure",
    "shared_prefix_attention",
    "shared_prefix_block_mask",
    "shared_prefix_kwargs",
]

SharedBackend = Literal["auto", "flash", "flex", "sdpa"]
SHARED_PREFIX_KWARG = "grpo_shared_prefix"  # the forward kwarg the registered attention reads


@dataclass(frozen=True)
class SharedPrefixStructure:
    """The segments of packed rows and the prefix each one sees (see the module docstring).

    ``bounds``: segment starts over the ``B * L`` tokens of the rows laid end to end, 0 first and
    ``B * L`` last (as ``cu_seqlens``; a row's padding is a segment of its own). ``prefix_of``: per
    segment, the index of its group's prefix segment (the segment itself for a prefix). A group's
    segments are consecutive: its prefix, then its suffixes. Invalid structures raise
    :class:`~grpo.errors.ShapeError`.
    """

    bounds: tuple[int, ...]
    prefix_of: tuple[int, ...]

    def __post_init__(self) -> None:
        bounds, prefix_of = self.bounds, self.prefix_of
        if len(bounds) < 2 or bounds[0] != 0 or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ShapeError(
                f"bounds must rise strictly from 0 with at least one segment, got {bounds[:8]}..."
            )
        if len(prefix_of) != len(bounds) - 1:
            raise ShapeError(f"{len(bounds) - 1} segments but {len(prefix_of)} prefix_of entries")
        for segment, prefix in enumerate(prefix_of):
            if not 0 <= prefix <= segment or prefix_of[prefix] != prefix:
                raise ShapeError(f"segment {segment}: prefix_of {prefix} is not an earlier prefix segment")
            if prefix != segment and prefix_of[segment - 1] != prefix:
                raise ShapeError(f"segment {segment} is not next to its group (prefix segment {prefix})")

    @classmethod
    def from_groups(cls, groups: Sequence[tuple[int, Sequence[int]]]) -> SharedPrefixStructure:
        """Groups ``(prefix_length, suffix_lengths)`` laid end to end (``()``: a plain document)."""
        bounds, prefix_of = [0], list[int]()
        for prefix_length, suffix_lengths in groups:
            prefix = len(prefix_of)
            for length in (prefix_length, *suffix_lengths):
                bounds.append(bounds[-1] + length)
                prefix_of.append(prefix)
        return cls(tuple(bounds), tuple(prefix_of))

    @property
    def length(self) -> int:
        """Tokens covered (``B * L``)."""
        return self.bounds[-1]

    @property
    def has_suffixes(self) -> bool:
        """False when every segment is a plain document (then it is document attention)."""
        return any(prefix != segment for segment, prefix in enumerate(self.prefix_of))

    @property
    def max_span(self) -> int:
        """The most keys one query sees: a suffix's prefix plus itself, or a prefix alone."""
        size = [b - a for a, b in itertools.pairwise(self.bounds)]
        return max(size[s] + (size[p] if p != s else 0) for s, p in enumerate(self.prefix_of))

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scale: float | None = None,
        dropout_p: float = 0.0,
        backend: SharedBackend = "auto",
    ) -> torch.Tensor:
        """:func:`shared_prefix_attention` over this structure (what the Hugging Face glue calls)."""
        return shared_prefix_attention(
            query, key, value, self, scale=scale, dropout_p=dropout_p, backend=backend
        )

    def cu_seqlens(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The segment starts as an int32 tensor (document attention's ``cu_seqlens``)."""
        return torch.tensor(self.bounds, dtype=torch.int32, device=device)


def shared_prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    structure: SharedPrefixStructure,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: SharedBackend = "auto",
) -> torch.Tensor:
    """Shared-prefix attention over packed rows -> ``[B, Hq, L, D]`` (like SDPA).

    Shapes: ``query [B, Hq, L, D]``, ``key``/``value [B, Hkv, L, D]`` (``Hq`` a multiple of
    ``Hkv``); ``structure.length == B * L``. ``backend``: see the module docstring (``"flash"``
    only for a structure without suffixes). ``dropout_p``: not with flex (raises).
    """
    batch, heads, length, _ = query.shape
    if key.shape != value.shape or key.shape[0] != batch or key.shape[2] != length or heads % key.shape[1]:
        raise ShapeError(f"query {tuple(query.shape)} and key/value {tuple(key.shape)} do not fit")
    if structure.length != batch * length:
        raise ShapeError(f"the structure covers {structure.length} tokens, the rows B * L = {batch * length}")
    if backend not in ("auto", "flash", "flex", "sdpa"):
        raise InvalidParameterError(f"backend must be auto, flash, flex or sdpa, got {backend!r}")
    if not structure.has_suffixes and backend in ("auto", "flash"):
        cu = _cu_seqlens_on(structure, query.device)
        return document_attention(
            query,
            key,
            value,
            cu,
            max_seqlen=structure.max_span,
            scale=scale,
            dropout_p=dropout_p,
            backend=backend,
        )
    if backend == "flash":
        raise InvalidParameterError(
            "flash-attention varlen has no shared prefixes: use backend 'flex' or 'sdpa'"
        )
    if backend == "auto":
        backend = "flex" if query.device.type == "cuda" and _installed("triton") else "sdpa"
    if backend == "flex":
        if dropout_p:
            raise InvalidParameterError("FlexAttention has no dropout: use backend 'sdpa'")
        return _flex(query, key, value, structure, scale)
    return _sdpa(query, key, value, structure, scale, dropout_p)


_cu_cache: tuple[SharedPrefixStructure, torch.device, torch.Tensor] | None = None


def _cu_seqlens_on(structure: SharedPrefixStructure, device: torch.device) -> torch.Tensor:
    """One ``cu_seqlens`` tensor per forward, not per layer (document attention caches its
    FlexAttention mask on that tensor's identity)."""
    global _cu_cache
    cached = _cu_cache
    if cached is not None and cached[0] is structure and cached[1] == device:
        return cached[2]
    cu = structure.cu_seqlens(device)
    _cu_cache = (structure, device, cu)
    return cu


def _sdpa(query, key, value, structure: SharedPrefixStructure, scale, dropout_p) -> torch.Tensor:
    gqa = query.shape[1] != key.shape[1]
    q, k, v = _flatten(query), _flatten(key), _flatten(value)
    bounds, parts = structure.bounds, []
    for segment, prefix in enumerate(structure.prefix_of):
        start, end = bounds[segment], bounds[segment + 1]
        if prefix == segment:
            keys, values, mask, causal = k[:, :, start:end], v[:, :, start:end], None, True
        else:
            prefix_start, prefix_end = bounds[prefix], bounds[prefix + 1]
            keys = torch.cat([k[:, :, prefix_start:prefix_end], k[:, :, start:end]], dim=2)
            values = torch.cat([v[:, :, prefix_start:prefix_end], v[:, :, start:end]], dim=2)
            seen = prefix_end - prefix_start
            # Query t sees the whole prefix and its own keys 0..t: causal, shifted right by the prefix.
            mask = torch.ones(end - start, seen + end - start, dtype=torch.bool, device=q.device).tril(seen)
            causal = False
        attend = F.scaled_dot_product_attention
        parts.append(
            attend(q[:, :, start:end], keys, values, mask, dropout_p, causal, scale=scale, enable_gqa=gqa)
        )
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return _unflatten(out, query.shape[0])


def shared_prefix_block_mask(
    structure: SharedPrefixStructure,
    device: torch.device | str | None = None,
    *,
    block_size: int = FLEX_BLOCK_SIZE,
):
    """FlexAttention ``BlockMask`` of ``structure`` over its ``structure.length`` tokens, on ``device``.

    Per (query tile, key tile), from the query tile's first and last segment and group: a key tile
    before the query tile is visible iff it meets the first query's segment or its group's prefix
    (any later segment or group starts inside the query tile); it is *full* (no mask evaluated) iff
    every query lies in one group and the key tile lies inside that group's prefix or, for a query
    tile within one segment, inside that segment joined to an adjacent prefix. The diagonal tile is
    always partial. Cost ``O(length / block_size)²`` booleans, never ``length²``.
    """
    length = structure.length
    bounds = torch.tensor(structure.bounds, dtype=torch.long, device=device)
    prefix_of = torch.tensor(structure.prefix_of, dtype=torch.long, device=device)
    segment = torch.searchsorted(bounds[1:], torch.arange(length, device=device), right=True)  # [L]
    root = prefix_of[segment]  # [L]: the prefix segment (and group) of each token
    tiles = -(-length // block_size)
    starts = torch.arange(tiles, device=device) * block_size
    ends = (starts + block_size).clamp(max=length)
    first_segment, last_segment = segment[starts], segment[ends - 1]
    first_root, last_root = root[starts], root[ends - 1]
    seg_start, seg_end = bounds[:-1], bounds[1:]

    def meets(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:  # [q tile, kv tile]: meets [low, high)
        return (starts[None, :] < high[:, None]) & (low[:, None] < ends[None, :])

    def inside(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        return (starts[None, :] >= low[:, None]) & (ends[None, :] <= high[:, None])

    ones = torch.ones(tiles, tiles, dtype=torch.bool, device=device)
    before, diagonal = ones.tril(-1), torch.eye(tiles, dtype=torch.bool, device=device)
    prefix_low, prefix_high = seg_start[first_root], seg_end[first_root]
    own_low, own_high = seg_start[first_segment], seg_end[first_segment]
    visible = diagonal | (before & (meets(own_low, own_high) | meets(prefix_low, prefix_high)))
    joined_low = torch.where(own_low == prefix_high, prefix_low, own_low)  # a first suffix joins its prefix
    one_segment = (first_segment == last_segment)[:, None]
    full = (
        before
        & (first_root == last_root)[:, None]
        & (inside(prefix_low, prefix_high) | (one_segment & inside(joined_low, own_high)))
    )

    def same_segment_or_own_prefix(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((segment[q_idx] == segment[kv_idx]) | (root[q_idx] == segment[kv_idx]))

    return _tile_block_mask(visible & ~full, full, same_segment_or_own_prefix, length, block_size)


_mask_cache: tuple[SharedPrefixStructure, torch.device, Any] | None = None


def _flex(query, key, value, structure: SharedPrefixStructure, scale) -> torch.Tensor:
    global _mask_cache
    q, k, v = _flatten(query), _flatten(key), _flatten(value)
    cached = _mask_cache
    # One mask per forward, not per layer: every layer is handed the same structure object.
    if cached is not None and cached[0] is structure and cached[1] == q.device:
        mask = cached[2]
    else:
        mask = shared_prefix_block_mask(structure, q.device)
        _mask_cache = (structure, q.device, mask)
    return _unflatten(_flex_attend(q, k, v, mask, scale), query.shape[0])


def shared_prefix_kwargs(structure: SharedPrefixStructure) -> dict[str, Any]:
    """Forward kwargs of a HF model under :func:`grpo.use_document_attention`: the structure.

    transformers hands unknown forward kwargs to every layer's attention function unchanged.
    """
    if not isinstance(structure, SharedPrefixStructure):
        raise InvalidParameterError(f"expected a SharedPrefixStructure, got {type(structure).__name__}")
    return {SHARED_PREFIX_KWARG: structure}
