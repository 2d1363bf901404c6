"""Deterministic top-k selection over many chunks at once.

A chunk is a row of ``bits``: the int16 bit patterns of bf16 values, flattened
row-major from ``[tokens, hidden]`` (flat index = token * hidden + column).
The top-k of a chunk are its k elements ordered by the key

    (|value| descending, flat index ascending)

which is a total order, so prover and verifier pick the same set on every device
and torch version. For finite bf16, |value| orders exactly like the 15-bit
pattern ``bits & 0x7FFF``, so all comparisons are on integers.

Three exact implementations, equal by construction and by test:

* ``_select_by_keys``: one ``torch.topk`` over int64 keys ``(abs_bits << 32) | (2^32-1-index)``.
  No host synchronisation, so it suits CUDA streams; memory 8 bytes per element.
* ``_select_by_threshold`` (CPU default): a lower bound t on the k-th largest |value|
  from block maxima (the k-th largest of ``nb >= k`` block maxima is <= the k-th
  largest element, since those k maxima are k distinct elements), then a stable
  sort of the few candidates with ``abs_bits >= t``. Memory-bound: about 4 passes
  over the chunk instead of a full top-k.
* ``native.select`` (CPU default where a C compiler exists): the same threshold idea in C,
  2 passes (block maxima with the NaN/Inf check, then candidates of the top blocks).

Pitfall: reference 0.1.6 used ``torch.topk`` on bf16 with unspecified tie order; in
87/100 random chunks the 128th and 129th |values| tie, and the reference may pick a
different index there (one exponent mismatch per disagreement, see reference §5.3).
"""

from __future__ import annotations

import numpy as np
import torch

from toploc import native
from toploc.errors import ActivationError

ABS_MASK = 0x7FFF
#: bf16 patterns with all exponent bits set are Inf/NaN.
NONFINITE_ABS = 0x7F80

_BLOCK = 256


def abs_bits(bits: torch.Tensor) -> torch.Tensor:
    """``bits & 0x7FFF`` as int32 (the |value| order key of finite bf16 patterns)."""
    return bits.to(torch.int32) & ABS_MASK


def check_finite(absolute: torch.Tensor, what: str) -> None:
    """Raise ``ActivationError`` if any pattern is Inf or NaN (reference defect 8)."""
    if absolute.numel() and bool((absolute >= NONFINITE_ABS).any()):
        raise ActivationError(f"{what} contain NaN or Inf; TOPLOC commits to finite bf16 values only")


def select_topk(bits: torch.Tensor, k: int, *, method: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k flat indices and their value bit patterns, per chunk, in key order.

    Args:
        bits: ``[C, n]`` int16 bf16 bit patterns, finite (call ``check_finite`` first).
        k: number of elements per chunk, 1 <= k <= n.
        method: ``"auto"`` (native C kernel on CPU if it compiled, else threshold; keys on
            other devices), ``"native"``, ``"keys"`` or ``"threshold"``. The native kernel
            also raises ``ActivationError`` on NaN/Inf; the others expect ``check_finite`` first.
    Returns:
        ``(indices [C, k] int64, values [C, k] int16)`` on ``bits.device``, each row sorted
        by (|value| desc, index asc).
    """
    n = bits.shape[1]
    if not 1 <= k <= n:
        raise ActivationError(f"topk={k} needs 1 <= topk <= elements per chunk ({n})")
    if method == "auto":
        method = ("native" if native.available() else "threshold") if bits.device.type == "cpu" else "keys"
    if method == "native":
        idx, val = native.select(bits.numpy().view(np.uint16), k)  # also rejects NaN/Inf
        return torch.from_numpy(idx), torch.from_numpy(val.view(np.int16))
    if method == "threshold" and n % _BLOCK == 0 and n // _BLOCK >= k:
        indices = _select_by_threshold(bits, k)
    else:
        indices = _select_by_keys(bits, k)
    return indices, torch.gather(bits, 1, indices)


def _select_by_keys(bits: torch.Tensor, k: int) -> torch.Tensor:
    n = bits.shape[1]
    if n >= 2**32:
        raise ActivationError(f"a chunk of {n} elements exceeds the 2^32 index range of the key path")
    index = torch.arange(n, device=bits.device, dtype=torch.int64)
    keys = (abs_bits(bits).to(torch.int64) << 32) | ((2**32 - 1) - index)
    top = torch.topk(keys, k, dim=1, largest=True, sorted=True).values
    return (2**32 - 1) - (top & (2**32 - 1))


def _select_by_threshold(bits: torch.Tensor, k: int) -> torch.Tensor:
    num_chunks, n = bits.shape
    absolute = bits & ABS_MASK  # int16, non-negative for finite values
    block_max = absolute.view(num_chunks, n // _BLOCK, _BLOCK).amax(dim=2)
    threshold = torch.topk(block_max, k, dim=1, sorted=True).values[:, -1:]
    candidates = torch.nonzero(absolute >= threshold)  # [M, 2] rows sorted by (chunk, index)
    chunk, index = candidates[:, 0], candidates[:, 1]
    cand_abs = absolute[chunk, index].to(torch.int64)
    # A stable sort keeps ascending index among equal (chunk, |value|) keys.
    order_key = chunk * (ABS_MASK + 1) + (ABS_MASK - cand_abs)
    order = torch.sort(order_key, stable=True).indices
    counts = torch.bincount(chunk, minlength=num_chunks)
    starts = torch.cumsum(counts, 0) - counts
    picks = order[starts[:, None] + torch.arange(k, dtype=torch.int64)]
    return index[picks]
