"""Activation checkpointing of a transformers model's decoder layers, recomputed with the forward's attention.

At INTELLECT-2's 32k-token rows the activations each decoder layer keeps for backward dominate
training memory. Checkpointing keeps only each layer's input hidden states and runs the layer's
forward again during ``backward()`` (non-reentrant ``torch.utils.checkpoint``), so the full
activations of one layer at a time are alive, for about one more forward of compute, with the same
gradients. It goes through transformers' own ``gradient_checkpointing_enable``, so the module
tree, the parameter names (checkpoints, ``state_dict``) and FSDP2's per-layer wrapping stay as
they are.

Pitfall (why this module exists): the recompute runs *during backward*, and a transformers
attention layer looks its attention function up from the mutable ``config._attn_implementation``
at call time. :func:`grpo.use_document_attention` switches that for a ``with`` block and restores
it on exit, so a ``backward()`` after the block recomputes the layers with the previous attention
(plain causal attention across the packed documents). torch's own recompute check compares only
the number, shapes and dtypes of the saved tensors, so it catches that only when the two attentions
happen to save different ones; otherwise the gradients change silently. Hence:

* the caller keeps the block open over forward *and* backward (``prime_rl``'s ``train_minibatch``
  holds it over its whole loop of micro-batches);
* :func:`enable_activation_checkpointing` adds a guard: every checkpointed call records the
  attention implementation its forward ran with (the name is the function: one registered name per
  document-attention backend), and its recompute raises :class:`~grpo.errors.RecomputeError`,
  before anything is recomputed, when the model's attention implementation is another one.

The guard refuses rather than switching the attention back for the recompute: a switch inside
backward would be a hidden side effect on a model other code may be using at that moment, and
what the caller must change is one line (the ``backward()`` moves into the block). The boundaries
cannot drift the same way: the checkpoint keeps the layer's keyword arguments and hands the very
same objects to the recompute (``grpo.shared_prefix_kwargs``' structure is frozen; do not modify a
``grpo.document_kwargs`` tensor in place between forward and backward).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch

from grpo.errors import InvalidParameterError, RecomputeError

__all__ = ["enable_activation_checkpointing"]


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute ``model``'s decoder layers in backward, refusing a recompute under another attention.

    ``model``: a transformers ``PreTrainedModel`` (every causal LM of transformers 5: its decoder
    layers are ``GradientCheckpointingLayer``s); call it before FSDP wrapping or after, once.
    Layers are checkpointed in training mode with grad enabled; ``model.eval()`` and ``no_grad``
    forwards are unchanged. ``model.gradient_checkpointing_disable()`` undoes it. Raises
    :class:`~grpo.errors.InvalidParameterError` for a model without gradient checkpointing support.
    Pitfall: not for a model compiled whole with ``torch.compile`` (torch accepts only dispatch
    modes as checkpoint contexts there); compiled attention kernels inside the layers are fine.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise InvalidParameterError(
            f"{type(model).__name__} does not support gradient checkpointing (not a transformers "
            "model with GradientCheckpointingLayer decoder layers)"
        )
    config: Any = model.config
    model.gradient_checkpointing_enable(  # type: ignore[operator]
        gradient_checkpointing_kwargs={
            "use_reentrant": False,
            "context_fn": partial(_attention_guard, config),
        }
    )
    # transformers also hooks the input embeddings so that their output requires grad, which only
    # reentrant checkpointing (or frozen embeddings) needs: removed, so that enable then disable
    # leaves the model as it was.
    model.disable_input_require_grads()  # type: ignore[operator]


def _attention_guard(config: Any) -> tuple[AbstractContextManager, AbstractContextManager]:
    """``context_fn`` of one checkpointed call, called by its forward: no forward context, and a
    recompute context that checks the attention implementation recorded now."""
    return nullcontext(), _SameAttention(config, config._attn_implementation)


class _SameAttention:
    """Entered by every recompute of one checkpointed call (more than once under ``retain_graph``)."""

    def __init__(self, config: Any, chosen: str) -> None:
        self.config, self.chosen = config, chosen

    def __enter__(self) -> None:
        current = self.config._attn_implementation
        if current != self.chosen:
            raise RecomputeError(
                f"a checkpointed layer is being recomputed in backward with attention implementation "
                f"{current!r}, but its forward ran with {self.chosen!r}: the gradients would be those of "
                "another attention. Call backward() inside the `with grpo.use_document_attention(model)` "
                "block that ran the forward."
            )

    def __exit__(self, *exc_info: object) -> None:
        return None
