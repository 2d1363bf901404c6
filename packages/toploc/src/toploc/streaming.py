"""``ProofBuilder``: build proofs while generating, one hidden-state row per token per sequence.

::

    builder = ProofBuilder(num_sequences=8, hidden_size=4096)      # dbs=32, topk=128
    for step in generation:                                         # inside the decode loop
        builder.add(last_hidden[:, -1, :], active_mask=unfinished)  # [num_seq, H], CPU or CUDA
    proofs = builder.finish()  # list[bytes]: per sequence, its 258-byte proofs concatenated

or, from a loop that reads its finished flags only every ``n`` steps,
``builder.extend(rows [num_seq, n, H], counts)`` (``counts[i]``: rows sequence ``i`` keeps).

Per ``add`` (or ``extend``) the builder copies the rows into a ``[num_seq, dbs, H]`` bf16
buffer on the rows' device: one copy, rounding to bf16 as it goes, for the sequences in
lock-step, an indexed copy per group otherwise. When sequences complete a chunk of ``dbs`` rows, their
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
        if active_mask is None:
            counts = None
        else:
            mask = np.asarray(torch.as_tensor(active_mask).detach().cpu(), dtype=bool).reshape(-1)
            if mask.shape != (self.num_sequences,):
                raise ValueError(f"active_mask must have {self.num_sequences} entries, got {mask.shape[0]}")
            counts = mask.astype(np.int64)
        rows = self._checked(hidden_rows)
        self._append(self._shaped(hidden_rows, rows.reshape(rows.shape[0], 1, -1)), counts)

    def extend(self, hidden_rows: torch.Tensor, counts: Sequence[int] | np.ndarray | None = None) -> None:
        """Append up to ``n`` rows per sequence at once: sequence ``i`` takes ``hidden_rows[i, :counts[i]]``.

        Equal to ``n`` calls of :meth:`add` with ``active_mask = [j < counts[i] for i]`` for
        ``j = 0..n-1``, in far fewer device operations: sequences in lock-step (same open-chunk
        fill and count) are copied together, one strided copy per chunk they touch. A decode loop
        that learns its finished sequences only every ``n`` steps buffers their rows and hands
        them over here.

        Args:
            hidden_rows: ``[num_sequences, n, hidden_size]`` floating tensor on any device.
            counts: ``[num_sequences]`` ints in ``0..n`` (host data); ``None`` means ``n`` each.
        """
        rows = self._checked(hidden_rows)
        if rows.dim() != 3:
            raise ActivationError(f"hidden_rows must be [num_sequences, n, hidden_size], got {tuple(rows.shape)}")
        rows = self._shaped(hidden_rows, rows)
        if counts is not None:
            counts = np.asarray(counts, dtype=np.int64).reshape(-1)
            if counts.shape != (self.num_sequences,) or (counts < 0).any() or (counts > rows.shape[1]).any():
                raise ValueError(f"counts must be {self.num_sequences} ints in 0..{rows.shape[1]}")
        self._append(rows, counts)

    def _checked(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """``hidden_rows`` detached, once it is known to be a floating tensor and the builder open."""
        if self._finished:
            raise RuntimeError("ProofBuilder.finish() was already called")
        if not isinstance(hidden_rows, torch.Tensor) or not hidden_rows.dtype.is_floating_point:
            to_bf16_bits(hidden_rows)  # raises the ActivationError that names the problem
        return hidden_rows.detach()

    def _shaped(self, hidden_rows: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``rows``, the ``[num_sequences, n, hidden_size]`` view of ``hidden_rows``, checked; allocates the buffer."""
        if rows.shape[0] != self.num_sequences or rows.shape[-1] != self.hidden_size:
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
        return rows

    def _append(self, rows: torch.Tensor, counts: np.ndarray | None) -> None:
        """Sequence ``i`` appends ``rows[i, :counts[i]]`` (all ``n`` when ``counts`` is None); closes full chunks.

        Rows are rounded to bf16 by the copy into the buffer's bf16 view (the same rounding as
        ``to_bf16_bits``), so a lock-step group costs one device copy per chunk it touches.
        """
        assert self._buffer is not None
        buffer = self._buffer.view(torch.bfloat16)
        n, dbs = rows.shape[1], self.decode_batching_size
        first = int(self._fill[0])
        if counts is None and first + n <= dbs and (self._fill == first).all():  # lock-step within one chunk
            buffer[:, first : first + n] = rows  # a plain strided copy
            self._fill += n
            if first + n == dbs:
                self._close(np.arange(self.num_sequences), dbs)
            return
        if counts is None:
            counts = np.full(self.num_sequences, n, dtype=np.int64)
        taken = np.zeros(self.num_sequences, dtype=np.int64)
        while True:
            live = np.flatnonzero(counts > taken)
            if live.size == 0:
                return
            fills, start = self._fill[live], taken[live]
            step = np.minimum(counts[live] - start, dbs - fills)  # rows each copies before its chunk is full
            keys = np.stack([fills, start, step], axis=1)
            groups = [keys[0]] if (keys == keys[0]).all() else np.unique(keys, axis=0)
            if len(groups) > 1 and (step == 1).all():  # one row each at ragged fills: one scattered copy
                seq, at = (torch.from_numpy(a).to(rows.device) for a in (live, fills))
                buffer[seq, at] = rows[seq, torch.from_numpy(start).to(rows.device)].to(torch.bfloat16)
                groups = []
            for f, t, m in (map(int, key) for key in groups):
                if live.size == self.num_sequences and len(groups) == 1:
                    buffer[:, f : f + m] = rows[:, t : t + m]
                else:
                    members = live[(keys == (f, t, m)).all(axis=1)]
                    seq = torch.from_numpy(members).to(rows.device)
                    buffer[seq, f : f + m] = rows[seq, t : t + m].to(torch.bfloat16)
            self._fill[live] += step
            taken[live] += step
            full = live[self._fill[live] == dbs]
            if full.size:
                self._close(full, dbs)

    def _close(self, sequences: np.ndarray, length: int) -> None:
        """Select (and on CUDA also commit) the open chunks of ``sequences`` (``length`` rows each); reset them."""
        assert self._buffer is not None
        if len(sequences) == self.num_sequences:  # lock-step: the buffer itself, no gather
            chunk = self._buffer[:, :length].reshape(len(sequences), length * self.hidden_size)
        else:
            seq = torch.from_numpy(sequences).to(self._buffer.device)
            chunk = self._buffer[seq, :length].reshape(len(sequences), length * self.hidden_size)
        positions = self._chunks[sequences].copy()
        if cuda.available(chunk, self.topk):  # fused kernel, asynchronous: flags are read in finish()
            *_, moduli, coeffs, flags = cuda.select_commit(chunk, self.topk)
            self._closed.append(_Closed(sequences.copy(), positions, None, None, moduli, coeffs, flags))
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
    bad: torch.Tensor  # nonzero: NaN/Inf (or kernel failure) per chunk or overall, read once in finish()


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
