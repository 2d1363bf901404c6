"""The trainer's forward pass: completion-token log-probs (and entropy) of a packed micro-batch.

The loss needs ``log π(token)`` only at completion positions, never the ``[L, V]`` logits: with
Qwen's 152k vocabulary a 32k-token row is 19 GiB of fp32 logits. So by default the model's
``lm_head`` is stood in for, *during the root module's forward* (as FSDP2 requires: the head's
weight is unsharded only inside that window), by :class:`_CompletionHead`, which picks the
completion positions of the final hidden states and calls ``grpo.logprobs_from_hidden``: the
log-softmax is computed tile by tile over the vocabulary, and the backward recomputes the tiles,
so no logits tensor is ever kept for backward. Gradients equal those of the full-logits path
(tested, also under 2-rank FSDP2).

The full-logits path (``fused=False``) stays for models whose forward post-processes the logits
(Gemma-2's final soft-capping, Cohere's logit scale) or whose head has a bias; it is chosen
automatically for them (:func:`supports_fused_head`).

Attention: through ``grpo.use_document_attention`` with ``grpo.shared_prefix_kwargs``, driven by
``MicroBatch.structure``: each completion sees its (possibly shared) prompt and itself, a plain
sequence itself (FlexAttention, or flash-attention varlen when nothing is shared, on CUDA; SDPA per
segment on CPU); no ``[L, L]`` mask is built, so attention memory is O(L) and the fused kernels
stay available. Under activation checkpointing (``[trainer] activation_checkpointing``) the decoder
layers run again during backward, with the same structure object (the checkpoint keeps the layer's
keyword arguments) and, guarded by ``grpo.enable_activation_checkpointing``, the same attention.

Alignment: completion token ``t`` is predicted by the hidden state at row position
``placement.predictor_positions()[t]`` (:func:`prime_rl.trainer.batching.completion_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import grpo
from prime_rl.trainer.batching import (
    MicroBatch,
    completion_entropy,
    completion_logprobs,
    completion_positions,
    completion_targets,
    scatter_completions,
)

__all__ = ["CompletionOutputs", "completion_forward", "supports_fused_head"]

_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


@dataclass(frozen=True)
class CompletionOutputs:
    """Per-completion-token values ``[n, C_max]`` (fp32, with grad; 0 off ``micro.mask``)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None


def supports_fused_head(model: torch.nn.Module) -> bool:
    """True if ``model.lm_head`` is a bias-free linear whose output the model returns unchanged."""
    return _fusable_head(model) is not None


def _fusable_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_POSTPROCESSING):
        return None
    return head


class _CompletionHead(torch.nn.Module):
    """Stands in for ``lm_head`` for one forward: hidden ``[1, L, H]`` -> ``[N, 1 or 2]`` values.

    Column 0 is the log-prob of each completion token (in sequence order), column 1 its entropy.
    The real head is held outside the module tree so parameter names and FSDP state are untouched.
    """

    def __init__(
        self,
        head: torch.nn.Linear,
        positions: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        entropy: bool,
    ) -> None:
        super().__init__()
        self._head = (head,)  # a tuple: not registered as a submodule
        self.positions, self.targets = positions, targets
        self.temperature, self.entropy = temperature, entropy

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        selected = hidden[0, self.positions]
        weight = self._head[0].weight  # read now: FSDP2 has unsharded it for this forward
        if not self.entropy:
            return grpo.logprobs_from_hidden(selected, weight, self.targets, self.temperature)[:, None]
        out = grpo.logprobs_from_hidden(selected, weight, self.targets, self.temperature, return_entropy=True)
        return torch.stack([out.logprobs, out.entropy], dim=-1)


def completion_forward(
    model: torch.nn.Module,
    micro: MicroBatch,
    device: torch.device,
    temperature: float,
    *,
    entropy: bool = False,
    fused: bool = True,
) -> CompletionOutputs:
    """Forward ``micro`` through ``model`` (the root module, as FSDP2 requires) -> completion values.

    ``fused`` uses the chunked LM head where :func:`supports_fused_head` allows it; otherwise the
    full ``[1, L, V]`` logits are built. Both give the same values and gradients.
    Pitfall: with activation checkpointing (``grpo.enable_activation_checkpointing``) the layers
    run again in ``backward()``, which must then happen inside ``grpo.use_document_attention(model)``
    as well (:func:`prime_rl.trainer.step.train_minibatch` holds it over both); a backward after
    this function returns, outside such a block, raises ``grpo.RecomputeError``.
    """
    inputs = {
        "input_ids": micro.input_ids.to(device),
        "position_ids": micro.position_ids.to(device),
        "use_cache": False,  # a training forward: no KV cache (which checkpointed layers refuse anyway)
        **grpo.shared_prefix_kwargs(micro.structure),
    }
    with grpo.use_document_attention(model):
        return _forward(model, micro, inputs, device, temperature, entropy=entropy, fused=fused)


def _forward(
    model: torch.nn.Module,
    micro: MicroBatch,
    inputs: dict,
    device: torch.device,
    temperature: float,
    *,
    entropy: bool,
    fused: bool,
) -> CompletionOutputs:
    head = _fusable_head(model) if fused else None
    if head is None:
        logits = model(**inputs).logits
        return CompletionOutputs(
            logprobs=completion_logprobs(logits, micro, temperature),
            entropy=completion_entropy(logits, micro, temperature) if entropy else None,
        )
    positions = completion_positions(micro)
    targets = completion_targets(micro)
    model.lm_head = _CompletionHead(head, positions.to(device), targets.to(device), temperature, entropy)
    try:
        values = model(**inputs).logits
    finally:
        model.lm_head = head
    mask = micro.mask.to(device)
    return CompletionOutputs(
        logprobs=scatter_completions(values[:, 0], mask),
        entropy=scatter_completions(values[:, 1], mask) if entropy else None,
    )
