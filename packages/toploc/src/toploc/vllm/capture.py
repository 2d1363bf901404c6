"""Capture the final-norm hidden states that vLLM turns into logits, one row per request per step.

vLLM's model runner computes, each step, ``logits = model.compute_logits(hidden[logits_indices])``:
one row per request of the persistent batch, in batch order, and the rows are the output of
the model's final norm (the input of ``lm_head``) at the position whose logits sample the
request's next token. ``install`` wraps ``compute_logits`` on the model instance so that each
call leaves its input in ``HIDDEN``; the seeded-sampler logits processor, which runs on the
same rows in the same order later in the same step, takes it from there.

Pitfall: the slot holds the tensor vLLM passed (on GPU possibly a view of a reused buffer); the
processor copies the rows it needs in the same step, before the next forward pass can
overwrite them.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

_MARK = "_toploc_captures_hidden"


class HiddenSlot:
    """The latest ``compute_logits`` input of this process, with a call counter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hidden: torch.Tensor | None = None
        self._calls = 0
        self._taken = 0

    def put(self, hidden: torch.Tensor) -> None:
        with self._lock:
            self._hidden = hidden
            self._calls += 1

    def take(self, rows: int) -> torch.Tensor | None:
        """The captured ``[rows, H]`` tensor if one arrived since the last ``take`` with that many rows."""
        with self._lock:
            hidden, fresh = self._hidden, self._calls != self._taken
            self._taken = self._calls
            self._hidden = None
        if hidden is None or not fresh or hidden.dim() != 2 or hidden.shape[0] != rows:
            return None
        return hidden

    @property
    def calls(self) -> int:
        """``compute_logits`` calls seen (0 means ``install`` never ran in this process)."""
        return self._calls


HIDDEN = HiddenSlot()


def install(model: Any) -> int:
    """Wrap ``model.compute_logits`` (a vLLM model, in the process that runs it) to fill ``HIDDEN``.

    Idempotent. Returns the process id it ran in. Raises ``TypeError`` if the model has no ``compute_logits``.
    Used through ``LLM.apply_model(install)`` so that it runs wherever the model lives.
    """
    if getattr(model, _MARK, False):
        return os.getpid()
    original = getattr(model, "compute_logits", None)
    if original is None:
        raise TypeError(f"{type(model).__name__} has no compute_logits; toploc cannot capture its hidden states")

    def compute_logits(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        HIDDEN.put(hidden_states)
        return original(hidden_states, *args, **kwargs)

    # Instance attributes win over the class method; nn.Module.__setattr__ stores plain callables.
    model.compute_logits = compute_logits
    setattr(model, _MARK, True)
    return os.getpid()
