"""Document (block-causal) attention over packed rows, from sequence boundaries: no ``L x L`` mask.

A packed row holds several sequences ("documents") back to back; token ``i`` may attend token
``j`` iff ``j <= i`` and both lie in the same document. :func:`grpo.block_causal_mask` writes that
rule down as a dense additive ``[B, 1, L, L]`` mask, which costs O(L²) memory and rules out the
fused attention kernels (SDPA with that mask against FlexAttention with a document block mask, on
an H200 at 16k tokens in 16 documents: ``benchmarks/results/gpu_check.md`` in the repository).
Here the rule comes from the
cumulative document starts ``cu_seqlens`` (:meth:`grpo.PackedBatch.cu_seqlens`), and memory is O(L):

* ``"flash"``: ``flash_attn_varlen_func`` (CUDA, fp16/bf16, where ``flash-attn`` is installed);
* ``"flex"``: FlexAttention, compiled, with a document ``BlockMask`` built from block-level
  document ranges (``(L / 128)²`` entries, never ``L²``) (CUDA);
* ``"sdpa"``: one causal ``scaled_dot_product_attention`` per document (any device; on CPU the
  fused flash kernel, forward and backward). The CPU default: torch's CPU FlexAttention has no
  backward and, uncompiled, materialises the full score matrix.

``"auto"`` picks flash, then flex (where Triton is installed) on CUDA, and sdpa elsewhere. All are
exact up to floating point (tested against separate forwards, values and gradients).

Hugging Face models: :func:`use_document_attention` switches a model to the registered attention
function for a ``with`` block, and :func:`document_kwargs` gives the forward the boundaries under
transformers' own names (``cu_seq_lens_q`` ...). The model then builds no mask at all (transformers
skips mask creation for attention implementations it has no mask function for)::

    packed = grpo.pack_sequences(sequences, 4096)
    with grpo.use_document_attention(model):
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                       **grpo.document_kwargs(packed.cu_seqlens())).logits

Needs torch >= 2.5 (``enable_gqa``, FlexAttention) and, for the HF glue, transformers >= 5.0 (the
``transformers`` extra; tested with 5.19).
Pitfall: ``position_ids`` must still restart per document (RoPE); the boundaries only mask.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, partial
from typing import Any, Literal

import torch
import torch.nn.functional as F

from grpo.errors import InvalidParameterError, ShapeError

__all__ = [
    "HF_DOCUMENT_ATTENTION",
    "document_attention",
    "document_block_mask",
    "document_kwargs",
    "use_document_attention",
]

Backend = Literal["auto", "flash", "flex", "sdpa"]
BACKENDS: tuple[Backend, ...] = ("auto", "flash", "flex", "sdpa")
HF_DOCUMENT_ATTENTION = "grpo_document"  # the name registered with transformers' AttentionInterface
FLEX_BLOCK_SIZE = 128  # FlexAttention's default tile (torch.nn.attention.flex_attention)


def document_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Causal attention within each document of packed rows -> ``[B, Hq, L, D]`` (like SDPA).

    Shapes: ``query [B, Hq, L, D]``, ``key``/``value [B, Hkv, L, D]`` (``Hq`` a multiple of ``Hkv``:
    grouped-query attention); ``cu_seqlens`` int ``[S + 1]``: document starts over the ``B * L``
    tokens of the rows laid end to end (0 first, ``B * L`` last; a row's padding is a document of
    its own), on any device. ``max_seqlen``: the longest document (computed, with a host sync, when
    None). ``scale``: SDPA's (``1 / sqrt(D)`` when None). ``dropout_p``: flex has none (raises).
    """
    batch, heads, length, _ = query.shape
    if key.shape != value.shape or key.shape[0] != batch or key.shape[2] != length or heads % key.shape[1]:
        raise ShapeError(f"query {tuple(query.shape)} and key/value {tuple(key.shape)} do not fit")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ShapeError(f"cu_seqlens must be a 1-D [S + 1] tensor, got shape {tuple(cu_seqlens.shape)}")
    if backend not in BACKENDS:
        raise InvalidParameterError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = _auto_backend(query)
    if backend == "flash":
        return _flash(query, key, value, cu_seqlens, max_seqlen, scale, dropout_p)
    if backend == "flex":
        if dropout_p:
            raise InvalidParameterError("FlexAttention has no dropout: use backend 'flash' or 'sdpa'")
        return _flex(query, key, value, cu_seqlens, scale)
    return _sdpa(query, key, value, cu_seqlens, scale, dropout_p)


def _auto_backend(query: torch.Tensor) -> Backend:
    if query.device.type != "cuda":
        return "sdpa"
    if query.dtype in (torch.float16, torch.bfloat16) and _installed("flash_attn"):
        return "flash"
    return "flex" if _installed("triton") else "sdpa"  # compiled FlexAttention needs Triton


@cache
def _installed(module: str) -> bool:  # asked once per layer and forward: the search is not free
    return importlib.util.find_spec(module) is not None


def _flatten(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, L, D]`` -> ``[1, H, B * L, D]`` (a view when ``B == 1``)."""
    return x if x.shape[0] == 1 else x.transpose(0, 1).reshape(x.shape[1], -1, x.shape[3])[None]


def _unflatten(x: torch.Tensor, batch: int) -> torch.Tensor:
    return x if batch == 1 else x[0].reshape(x.shape[1], batch, -1, x.shape[3]).transpose(0, 1)


def _sdpa(query, key, value, cu_seqlens, scale, dropout_p) -> torch.Tensor:
    bounds = cu_seqlens.tolist()
    documents = list(itertools.pairwise(bounds))
    total = query.shape[0] * query.shape[2]
    if bounds[0] != 0 or bounds[-1] != total or any(start >= end for start, end in documents):
        raise ShapeError(f"cu_seqlens must rise strictly from 0 to B * L = {total}")
    gqa = query.shape[1] != key.shape[1]
    q, k, v = _flatten(query), _flatten(key), _flatten(value)
    parts = [
        F.scaled_dot_product_attention(
            q[:, :, start:end],
            k[:, :, start:end],
            v[:, :, start:end],
            dropout_p=dropout_p,
            is_causal=True,
            scale=scale,
            enable_gqa=gqa,
        )
        for start, end in documents
    ]
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return _unflatten(out, query.shape[0])


def _flash(query, key, value, cu_seqlens, max_seqlen, scale, dropout_p) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    batch, heads, length, dim = query.shape
    cu = cu_seqlens.to(device=query.device, dtype=torch.int32)
    if max_seqlen is None:
        max_seqlen = int(cu.diff().max())

    def tokens_major(x: torch.Tensor) -> torch.Tensor:  # [B, H, L, D] -> [B * L, H, D]
        return x.transpose(1, 2).reshape(batch * length, x.shape[1], dim)

    out = flash_attn_varlen_func(
        tokens_major(query), tokens_major(key), tokens_major(value), cu, cu, max_seqlen, max_seqlen,
        dropout_p=dropout_p, softmax_scale=scale, causal=True,
    )  # fmt: skip
    return out.reshape(batch, length, heads, dim).transpose(1, 2)


def document_block_mask(cu_seqlens: torch.Tensor, length: int, *, block_size: int = FLEX_BLOCK_SIZE):
    """FlexAttention ``BlockMask`` for causal attention within documents of ``length`` tokens.

    Built from each tile's first and last document (document ids rise along the row), so it costs
    ``O(length / block_size)²``, not ``length²``: a (query tile, key tile) pair is skipped when the
    key tile lies wholly before the query tile's first document, *full* (no mask evaluated) when
    both tiles lie in one document and the key tile is strictly earlier, and partial otherwise.
    ``cu_seqlens`` as in :func:`document_attention`; the mask lives on its device.
    """
    cu = cu_seqlens.to(torch.long)
    positions = torch.arange(length, device=cu.device)
    document = torch.searchsorted(cu[1:], positions, right=True)  # [length]: document of each token
    tiles = -(-length // block_size)
    starts = torch.arange(tiles, device=cu.device) * block_size
    first = document[starts]
    last = document[(starts + block_size).clamp(max=length) - 1]
    earlier = torch.ones(tiles, tiles, dtype=torch.bool, device=cu.device).tril()  # key tile <= query tile
    visible = earlier & (last[None, :] >= first[:, None])  # the key tile reaches the query's documents
    one_document = first == last
    full = earlier.tril(-1) & (
        one_document[:, None] & one_document[None, :] & (first[:, None] == first[None, :])
    )

    def same_document_causal(b, h, q_idx, kv_idx):
        return (document[q_idx] == document[kv_idx]) & (q_idx >= kv_idx)

    return _tile_block_mask(visible & ~full, full, same_document_causal, length, block_size)


def _tile_block_mask(partial: torch.Tensor, full: torch.Tensor, mask_mod: Any, length: int, block_size: int):
    """A ``BlockMask`` from ``[q tile, kv tile]`` booleans: ``partial`` tiles run ``mask_mod``, ``full`` ones not.

    Shared by the document mask here and the shared-prefix mask of :mod:`grpo.shared_prefix`:
    each row's visited key tiles are listed first (a stable sort keeps them in order).
    """
    from torch.nn.attention.flex_attention import BlockMask

    def ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        count = blocks.sum(-1, dtype=torch.int32)
        indices = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return count[None, None], indices[None, None]

    (kv_count, kv_indices), (full_count, full_indices) = ordered(partial), ordered(full)
    return BlockMask.from_kv_blocks(
        kv_count, kv_indices, full_count, full_indices,
        BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(length, length),
    )  # fmt: skip


_compiled_flex: Any = None
_block_mask_cache: tuple[torch.Tensor, int, int, Any] | None = None  # (cu_seqlens, version, length, mask)


def _flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale) -> torch.Tensor:
    """FlexAttention of flattened ``[1, H, L, D]`` tensors under ``mask``: compiled on CUDA.

    On the CPU it runs eager, which materialises the scores: a reference for tests of the masks.
    Shared with :mod:`grpo.shared_prefix`, so one compiled kernel serves both masks.
    """
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention)
        attend = _compiled_flex
    else:
        attend = flex_attention
    return attend(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def _flex(query, key, value, cu_seqlens, scale) -> torch.Tensor:
    global _block_mask_cache
    batch = query.shape[0]
    q, k, v = _flatten(query), _flatten(key), _flatten(value)
    length = q.shape[2]
    cu = cu_seqlens.to(query.device)
    cached = _block_mask_cache
    # One mask per forward, not per layer: every layer is handed the same cu_seqlens tensor.
    if (
        cached is not None
        and cached[0] is cu_seqlens
        and cached[1] == cu_seqlens._version
        and cached[2] == length
    ):
        mask = cached[3]
    else:
        mask = document_block_mask(cu, length)
        _block_mask_cache = (cu_seqlens, cu_seqlens._version, length, mask)
    return _unflatten(_flex_attend(q, k, v, mask, scale), batch)


def document_kwargs(cu_seqlens: torch.Tensor, max_seqlen: int | None = None) -> dict[str, Any]:
    """Forward kwargs of a HF model under :func:`use_document_attention`: the boundaries.

    transformers' own names (``cu_seq_lens_q/k``, ``max_length_q/k``), which its models hand to
    the attention function of every layer unchanged.
    """
    if max_seqlen is None:
        max_seqlen = int(cu_seqlens.diff().max())
    return {
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }


def _hf_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    *,
    backend: Backend,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature -> ``([B, L, H, D], None)``."""
    cu_seqlens: Any = kwargs.get("cu_seq_lens_q")
    max_seqlen = kwargs.get("max_length_q")
    shared = kwargs.get("grpo_shared_prefix")  # grpo.shared_prefix_kwargs: a shared-prefix structure
    if cu_seqlens is None and shared is None:
        raise InvalidParameterError(
            "document attention needs the packed boundaries: pass **grpo.document_kwargs(cu_seqlens) "
            "or **grpo.shared_prefix_kwargs(structure) to the forward"
        )
    if (
        attention_mask is not None
        or kwargs.get("is_causal") is False
        or softcap
        or kwargs.get("s_aux") is not None
    ):
        raise InvalidParameterError(
            "document attention is plain causal attention within documents: no attention_mask, "
            "non-causal layers, logit soft-capping or attention sinks (use block_causal_mask and eager attention)"
        )
    if shared is not None:
        max_seqlen = shared.max_span
    elif max_seqlen is None:
        max_seqlen = int(cu_seqlens.diff().max())
    if sliding_window is not None and max_seqlen > sliding_window:
        raise InvalidParameterError(
            f"a document of {max_seqlen} tokens is longer than this layer's sliding window ({sliding_window}); "
            "document attention has no window (use block_causal_mask and eager attention)"
        )
    if shared is not None:  # a grpo.SharedPrefixStructure (duck-typed: that module imports this one)
        out = shared.attend(query, key, value, scale=scaling, dropout_p=dropout, backend=backend)
        return out.transpose(1, 2).contiguous(), None
    out = document_attention(
        query,
        key,
        value,
        cu_seqlens,
        max_seqlen=max_seqlen,
        scale=scaling,
        dropout_p=dropout,
        backend=backend,
    )
    return out.transpose(1, 2).contiguous(), None


def _registered_name(backend: Backend) -> str:
    from transformers import AttentionInterface

    name = HF_DOCUMENT_ATTENTION if backend == "auto" else f"{HF_DOCUMENT_ATTENTION}_{backend}"
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, partial(_hf_attention, backend=backend))
    return name


@contextmanager
def use_document_attention(model: torch.nn.Module, backend: Backend = "auto") -> Iterator[str]:
    """Inside the block, ``model`` (a transformers model) attends within documents; then restored.

    Registers the attention function with ``transformers.AttentionInterface`` (once) and switches
    with the public ``model.set_attn_implementation``; yields the registered name. Every forward
    inside must pass :func:`document_kwargs` (or :func:`grpo.shared_prefix_kwargs`).
    Pitfall: with activation checkpointing the layers run again during ``backward()``, which must
    then happen inside the block too (:func:`grpo.enable_activation_checkpointing` raises otherwise).
    """
    if backend not in BACKENDS:
        raise InvalidParameterError(f"backend must be one of {BACKENDS}, got {backend!r}")
    name = _registered_name(backend)
    config: Any = model.config
    previous = config._attn_implementation
    if previous == name:  # already switched (by an enclosing block or once for good): nothing to undo
        yield name
        return
    model.set_attn_implementation(name)  # type: ignore[operator]
    if config._attn_implementation != name:  # transformers only warns for such models
        raise InvalidParameterError(
            f"{type(model).__name__} cannot switch its attention implementation (it does not use "
            "transformers' AttentionInterface): pack with grpo.block_causal_mask instead"
        )
    try:
        yield name
    finally:
        model.set_attn_implementation(previous)  # type: ignore[operator]
