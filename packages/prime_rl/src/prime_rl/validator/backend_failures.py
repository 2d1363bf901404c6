"""The validator's own failures: what a failing forward means, and how a batch is prefilled in chunks.

A forward that fails because the machine failed (out of memory, a lost or faulty device) says
nothing about the worker's sample: the batch is judged again later (:class:`BackendFailure`, a
:class:`RetryLater`), never rejected, so it never counts towards a ban. Only the backend's own
refusal of an input (``GenerationError``, ``ValueError``, ``IndexError``) is the sample's. Both the
one-version path (``checks.model_checks``) and the spanned paths (``spans.py``: chained forwards,
or one prefill per version for episodes) prefill :func:`in_chunks`: at most ``max_batch_size`` samples' fp32 logits
and KV caches live at a time, and a chunk that runs out of memory is halved before anything of it
is judged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from prime_rl.inference.contract import GenerationError

__all__ = ["BackendFailure", "RetryLater", "backend_failure", "in_chunks", "release_device_memory"]

Item = TypeVar("Item")
State = TypeVar("State")


class RetryLater(Exception):
    """Raised by ``backend_for`` when a version cannot be loaded *now*; ``validate_batch`` re-raises it."""


class BackendFailure(RetryLater):
    """The validator's own backend failed on a batch (out of memory, a lost or faulty device): the
    machine's problem, never a verdict against the worker. ``validate_batch`` re-raises it and the
    batch stays pending, judged again later (``validator/process.py`` backs off per batch).
    ``kind``: ``out_of_memory`` (a smaller chunk may succeed: :func:`in_chunks` halves it first),
    ``device`` (a device fault) or ``backend`` (any other failure of a forward)."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def out_of_memory(self) -> bool:
        return self.kind == "out_of_memory"


_DEVICE_WORDS = ("CUDA", "CUBLAS", "cuDNN", "CUDNN", "NCCL", "HIP", "XPU", "device-side", "out of memory")


def backend_failure(exc: BaseException) -> BackendFailure | None:
    """``exc`` as a :class:`BackendFailure` if it is the machine's, else None (the backend refused the
    input: the sample's problem).

    The machine's: ``torch.OutOfMemoryError``, ``torch.AcceleratorError`` (a device fault), and any
    other ``RuntimeError`` but :class:`GenerationError` (the backend's own refusal of an input, e.g. an
    empty prompt). Every input reaching a forward has passed the model-free checks (token ids inside
    the vocabulary, lengths within the run's limits), so a forward that still raises has failed on
    the machine, not on the worker's tokens. ``ValueError`` and ``IndexError`` stay the input's.
    """
    if isinstance(exc, BackendFailure):
        return exc
    if isinstance(exc, torch.OutOfMemoryError) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc)):
        return BackendFailure(f"validator backend out of memory: {exc}"[:500], kind="out_of_memory")
    if isinstance(exc, GenerationError) or not isinstance(exc, RuntimeError):
        return None
    accelerator = getattr(torch, "AcceleratorError", None)
    device = (accelerator is not None and isinstance(exc, accelerator)) or any(w in str(exc) for w in _DEVICE_WORDS)
    return BackendFailure(
        f"validator {'device fault' if device else 'backend failure'}: {exc!r}"[:500], kind="device" if device else "backend"
    )


def release_device_memory() -> None:
    """Hand cached accelerator memory back after an out-of-memory, so a smaller retry can fit."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def in_chunks(
    items: Sequence[Item], size: int, prefill: Callable[[list[Item]], State], judge: Callable[[list[Item], State], None]
) -> None:
    """``judge(chunk, prefill(chunk))`` over chunks of at most ``size`` items, one chunk held at a time.

    A chunk whose ``prefill`` runs out of memory is split in halves and retried (nothing of it has
    been judged yet, so no evidence is observed twice); a single item that still does not fit, and
    any other backend failure, raises :class:`BackendFailure` (the batch is retried later, never
    blamed on its worker). ``prefill`` must not judge."""
    queue = [list(items[i : i + max(1, size)]) for i in range(0, len(items), max(1, size))]
    while queue:
        chunk = queue.pop(0)
        try:
            state = prefill(chunk)
        except Exception as exc:
            failure = backend_failure(exc)
            if failure is None:
                raise
            if not failure.out_of_memory or len(chunk) == 1:
                raise failure from exc
        else:
            judge(chunk, state)
            del state
            continue
        # Outside the except block: the failed forward's frames (and the tensors they hold) are gone.
        release_device_memory()
        half = len(chunk) // 2
        queue[:0] = [chunk[:half], chunk[half:]]
