"""``ProofBuilder``: build proofs while generating, one hidden-state row per token per sequence.

::

    builder = ProofBuilder(num_sequences=8, hidden_size=4096)      # dbs=32, topk=128
    for step in generation:                                         # inside the decode loop
        builder.add(last_hidden[:, -1, :], active_mask=unfinished)  # [num_seq, H], CPU or CUDA
    proofs = builder.finish()  # list[bytes]: per sequence, its 258-byte proofs concatenated

Per ``add`` the builder copies the rows into a ``[num_seq, dbs, H]`` bf16 buffer on the
rows' device (one indexed copy). When sequences complete a chunk of ``dbs`` rows, their
top-k indices and values are selected in one batched call (on CUDA with no host sync)
and kept on the device; ``finish`` moves the small ``[chunks, k]`` selections to the host
once and interpolates all of them in one vectorised call. The result for each sequence
equals ``build_proofs_bytes(rows_of_that_sequence, dbs, topk, skip_prefill=True)``
concatenated.

Pitfall: pass ``active_mask`` as a CPU bool tensor, list or numpy array; a CUDA mask is
copied to the host on every call (a sync, though HF's generate loop syncs each step anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from toploc import cuda, native
from toploc.chunking import to_bf16_bits
from toploc.commitment import commit
from toploc.errors import ActivationError
from toploc.selection import NONFINITE_ABS, select_topk
from toploc.wire import encode_proofs


class ProofBuilder:
    """Streaming prover for ``num_sequences`` sequences of hidden size ``hidden_size``.

    Args:
        num_sequences: rows per ``add`` call (the generation batch size).
        hidden_size: H, the width of the final-norm hidden states.
        decode_batching_size: tokens per proof (32, the reference default).
        topk: committed values per proof (128; proofs are 2 + 2·topk bytes).
    """

    def __init__(
        self, num_sequences: int, hidden_size: int, decode_batching_size: int = 32, topk: int = 128
    ) -> None:
        if num_sequences < 1 or hidden_size < 1 or decode_batching_size < 1 or topk < 1:
            raise ValueError("num_sequences, hidden_size, decode_batching_size and topk must be >= 1")
        self.num_sequences = num_sequences
        self.hidden_size = hidden_size
        self.decode_batching_size = decode_batching_size
        self.topk = topk
        self._buffer: torch.Tensor | None = None
        self._fill = np.zeros(num_sequences, dtype=np.int64)  # rows in each sequence's open chunk
        self._chunks = np.zeros(num_sequences, dtype=np.int64)  # closed chunks per sequence
        self._closed: list[_Closed] = []
        self._finished = False

    @property
    def tokens(self) -> np.ndarray:
        """Rows added so far per sequence, ``[num_sequences]`` int64."""
        return self._chunks * self.decode_batching_size + self._fill

    def add(
        self, hidden_rows: torch.Tensor, active_mask: torch.Tensor | Sequence[bool] | None = None
    ) -> None:
        """Append one row per active sequence.

        Args:
            hidden_rows: ``[num_sequences, hidden_size]`` (or ``[num_sequences, 1, hidden_size]``)
                floating tensor on any device; rounded to bf16.
            active_mask: ``[num_sequences]`` bools; rows of inactive sequences are ignored
                (finished sequences, padding). ``None`` means all active.
        """
        if self._finished:
            raise RuntimeError("ProofBuilder.finish() was already called")
        rows = to_bf16_bits(hidden_rows).reshape(hidden_rows.shape[0], -1)
        if tuple(rows.shape) != (self.num_sequences, self.hidden_size):
            raise ActivationError(
                f"hidden_rows must be [{self.num_sequences}, {self.hidden_size}], got {tuple(hidden_rows.shape)}"
            )
        if self._buffer is not None and self._buffer.device != rows.device:
            raise ActivationError(f"rows moved from {self._buffer.device} to {rows.device} mid-stream")
        if self._buffer is None:
            self._buffer = torch.empty(
                (self.num_sequences, self.decode_batching_size, self.hidden_size),
                dtype=torch.int16,
                device=rows.device,
            )
        if active_mask is None:
            active = np.arange(self.num_sequences)
        else:
            mask = np.asarray(torch.as_tensor(active_mask).detach().cpu(), dtype=bool).reshape(-1)
            if mask.shape != (self.num_sequences,):
                raise ValueError(f"active_mask must have {self.num_sequences} entries, got {mask.shape[0]}")
            active = np.flatnonzero(mask)
        if active.size == 0:
            return
        fill = self._fill[active]
        if active.size == self.num_sequences and (fill == fill[0]).all():
            self._buffer[:, int(fill[0])] = rows  # lock-step fast path: a plain strided copy
        else:
            seq = torch.from_numpy(active).to(rows.device)
            self._buffer[seq, torch.from_numpy(fill).to(rows.device)] = rows[seq]
        self._fill[active] += 1
        full = active[self._fill[active] == self.decode_batching_size]
        if full.size:
            self._close(full, self.decode_batching_size)

    def _close(self, sequences: np.ndarray, length: int) -> None:
        """Select (and on CUDA also commit) the open chunks of ``sequences`` (``length`` rows each); reset them."""
        assert self._buffer is not None
        seq = torch.from_numpy(sequences).to(self._buffer.device)
        chunk = self._buffer[seq, :length].reshape(len(sequences), length * self.hidden_size)
        positions = self._chunks[sequences].copy()
        if cuda.available(chunk, self.topk):  # fused kernel, asynchronous: flags are read in finish()
            *_, moduli, coeffs, flags = cuda.select_commit(chunk, self.topk)
            self._closed.append(_Closed(sequences.copy(), positions, None, None, moduli, coeffs, flags != 0))
        elif chunk.device.type == "cpu" and native.available():
            try:  # the native kernel rejects NaN/Inf while selecting
                indices, values = select_topk(chunk, self.topk, method="native")
                nonfinite = torch.tensor(False)
            except ActivationError as exc:
                if "NaN" not in str(exc):
                    raise
                indices, values = select_topk(chunk.zero_(), self.topk, method="native")
                nonfinite = torch.tensor(True)
            self._closed.append(_Closed(sequences.copy(), positions, indices, values, None, None, nonfinite))
        else:
            nonfinite = ((chunk & 0x7FFF) >= NONFINITE_ABS).any()  # checked in finish(): no sync here
            indices, values = select_topk(chunk, self.topk)
            self._closed.append(_Closed(sequences.copy(), positions, indices, values, None, None, nonfinite))
        self._chunks[sequences] += 1
        self._fill[sequences] = 0

    def finish(self) -> list[bytes]:
        """Close partial chunks and return each sequence's proofs, concatenated in chunk order.

        A sequence with no rows gets ``b""``. Split a result with ``split_proofs(data, topk)``.
        Raises:
            ActivationError: a row was NaN/Inf, or a partial chunk has fewer than ``topk`` elements.
        """
        if self._finished:
            raise RuntimeError("ProofBuilder.finish() was already called")
        self._finished = True
        for length in sorted(set(self._fill[self._fill > 0].tolist())):
            self._close(np.flatnonzero(self._fill == length), int(length))
        if not self._closed:
            return [b""] * self.num_sequences
        if any(bool(closed.bad.any()) for closed in self._closed):
            raise ActivationError("hidden rows contain NaN or Inf; TOPLOC commits to finite bf16 values only")
        moduli, coeffs = [], []
        for closed in self._closed:
            if closed.moduli is not None and closed.coeffs is not None:
                moduli.append(closed.moduli.cpu().numpy())
                coeffs.append(closed.coeffs.cpu().numpy())
        selected = [c for c in self._closed if c.indices is not None and c.values is not None]
        if selected:  # one vectorised host commit for every chunk selected without the CUDA kernel
            indices = torch.cat([c.indices.cpu() for c in selected if c.indices is not None]).numpy()
            values = torch.cat([c.values.cpu() for c in selected if c.values is not None]).numpy()
            host_moduli, host_coeffs = commit(indices, values.view(np.uint16).astype(np.int64))
            moduli.append(host_moduli)
            coeffs.append(host_coeffs)
        order = [c for c in self._closed if c.moduli is not None] + selected
        proofs = encode_proofs(np.concatenate(moduli), np.concatenate(coeffs))
        sequences = np.concatenate([c.sequences for c in order]).tolist()
        positions = np.concatenate([c.positions for c in order]).tolist()
        per_sequence: list[list[tuple[int, bytes]]] = [[] for _ in range(self.num_sequences)]
        for s, p, proof in zip(sequences, positions, proofs, strict=True):
            per_sequence[s].append((p, proof))
        return [b"".join(proof for _, proof in sorted(items)) for items in per_sequence]


@dataclass(frozen=True)
class _Closed:
    """Chunks closed together: host ``sequences``/``positions`` and device results (selection or commitment)."""

    sequences: np.ndarray
    positions: np.ndarray
    indices: torch.Tensor | None
    values: torch.Tensor | None
    moduli: torch.Tensor | None
    coeffs: torch.Tensor | None
    bad: torch.Tensor  # NaN/Inf (or kernel failure) per chunk or overall, read once in finish()


def split_proofs(data: bytes, topk: int = 128) -> list[bytes]:
    """Split concatenated proofs (as returned by ``ProofBuilder.finish``) into ``2 + 2·topk``-byte proofs.

    Raises:
        ProofFormatError: the length is not a multiple of the proof size.
    """
    from toploc.errors import ProofFormatError

    size = 2 + 2 * topk
    if not isinstance(data, bytes | bytearray) or len(data) % size:
        raise ProofFormatError(f"concatenated proofs must be a multiple of {size} bytes")
    return [bytes(data[i : i + size]) for i in range(0, len(data), size)]
