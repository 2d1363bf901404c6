"""One optimizer step on a mini-batch of packed rollouts: forward, grpo loss, backward, clip, step.

``train_minibatch`` is the trainer's inner loop, usable alone (tests, benchmarks) and identical
in one process and under FSDP2 data parallelism:

* every rank holds the same list of micro-batches; rank ``r`` takes micro-batches
  ``r, r + W, r + 2W, …`` and pads with all-masked micro-batches so each rank runs the same number
  of forward/backward passes (FSDP collectives must match; the padding adds exactly zero);
* the loss is normalised by *global* counts of the whole mini-batch (``num_tokens``,
  ``num_seqs``, and ``constant`` for the constant-normaliser recipes), so the sum of micro-batch
  gradients equals the full-batch gradient (grpo.md pitfall 9), and multiplied by ``W`` because
  FSDP averages gradients over ranks;
* gradient norm clipping uses the global norm (FSDP's DTensor norm);
* the forward builds no ``[L, V]`` logits by default: completion log-probs come from the
  chunked LM head (:mod:`prime_rl.trainer.forward`); ``fused_lm_head=False`` builds them;
* the model attends within documents (``grpo.use_document_attention``) over every forward *and
  backward* of the step: with activation checkpointing (``grpo.enable_activation_checkpointing``,
  ``[trainer] activation_checkpointing``) backward recomputes the decoder layers, and a recompute
  after the attention was restored would attend across documents (the guard raises
  ``grpo.RecomputeError`` instead).

Old log-probs: ``old_logprobs_for`` recomputes them with the current weights before the first
update of a policy version (INTELLECT-2), or the caller passes the behaviour log-probs
(``MicroBatch.behaviour_logprobs``: the generating policy's, recomputed by the validator's prefill,
never a worker's claim), in which case the ratio itself corrects the async gap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

import grpo
from prime_rl.trainer import distributed
from prime_rl.trainer.batching import MicroBatch, empty_micro_batch
from prime_rl.trainer.forward import completion_forward


@dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step did (global over ranks). ``grad_norm`` is before clipping."""

    loss: float
    grad_norm: float
    lr: float
    num_tokens: int
    num_sequences: int
    clip_low_fraction: float
    clip_high_fraction: float
    delta_capped_fraction: float
    mean_ratio: float
    mismatch_kl: float | None
    entropy: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return dict(self.__dict__)


def warmup_lambda(warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup ``(k + 1) / warmup_steps`` over the first steps, then 1 (constant)."""
    return lambda k: min(1.0, (k + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def rank_share(micro_batches: Sequence[MicroBatch]) -> list[MicroBatch]:
    """This rank's micro-batches, padded with empty ones to the same count on every rank."""
    world, rank = distributed.world_size(), distributed.rank()
    mine = list(micro_batches[rank::world])
    per_rank = math.ceil(len(micro_batches) / world) if micro_batches else 1
    return mine + [empty_micro_batch() for _ in range(per_rank - len(mine))]


@torch.no_grad()
def old_logprobs_for(
    model: torch.nn.Module,
    micro_batches: Sequence[MicroBatch],
    temperature: float,
    device: torch.device,
    *,
    fused_lm_head: bool = True,
) -> list[torch.Tensor]:
    """Current-policy log-probs ``[n, C_max]`` for each of *this rank's* micro-batches (no grad)."""
    return [
        completion_forward(model, m, device, temperature, fused=fused_lm_head).logprobs.cpu()
        for m in micro_batches
    ]


def train_minibatch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[MicroBatch],
    old_logprobs: Sequence[torch.Tensor] | None,
    loss_fn: grpo.Loss,
    *,
    temperature: float,
    constant: float | None,
    max_grad_norm: float,
    device: torch.device,
    ref_logprobs: Sequence[torch.Tensor] | None = None,
    fused_lm_head: bool = True,
) -> StepMetrics:
    """One optimizer step on ``micro_batches`` (this rank's share, see :func:`rank_share`).

    ``old_logprobs[i]`` belongs to ``micro_batches[i]``; None means "use the behaviour log-probs".
    The global normalisers are computed by all-reducing the local counts.
    """
    cfg = loss_fn.config
    num_tokens = distributed.all_reduce_sum(sum(m.num_loss_tokens for m in micro_batches))
    num_seqs = distributed.all_reduce_sum(sum(m.num_sequences for m in micro_batches))
    scale = float(distributed.world_size())
    optimizer.zero_grad(set_to_none=True)
    sums = torch.zeros(8, dtype=torch.float64)  # loss, low, high, delta, ratio, mismatch, entropy, tokens
    # Held over each backward too: checkpointed layers run their forward again there.
    with grpo.use_document_attention(model):
        for i, micro in enumerate(micro_batches):
            forward = completion_forward(
                model, micro, device, temperature, entropy=cfg.entropy_coef > 0, fused=fused_lm_head
            )
            logprobs, entropy = forward.logprobs, forward.entropy
            mask = micro.mask.to(device)
            behaviour = micro.behaviour_logprobs.to(device)
            old = old_logprobs[i].to(device) if old_logprobs is not None else behaviour
            out = loss_fn(
                logprobs,
                old,
                micro.advantages.to(device),
                mask,
                inference_logprobs=behaviour,
                ref_logprobs=ref_logprobs[i].to(device) if ref_logprobs is not None else None,
                entropy=entropy,
                num_tokens=max(num_tokens, 1.0),
                num_seqs=max(num_seqs, 1.0),
                constant=constant,
            )
            (out.loss * scale).backward()
            tokens = micro.num_loss_tokens
            sums[0] += float(out.loss.detach())
            if tokens == 0:  # a padding micro-batch: its metrics are 0/0
                continue
            m = out.metrics
            sums[1:] += torch.tensor(
                [
                    m.clip_low_fraction * tokens,
                    m.clip_high_fraction * tokens,
                    m.delta_capped_fraction * tokens,
                    m.mean_ratio * tokens,
                    (m.mismatch_kl or 0.0) * tokens,
                    (m.entropy or 0.0) * tokens,
                    tokens,
                ],
                dtype=torch.float64,
            )
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    grad_norm_value = float(distributed.full_tensor(grad_norm))
    optimizer.step()
    if distributed.is_distributed():
        sums = sums.to(distributed.collective_device())
        torch.distributed.all_reduce(sums)
        sums = sums.cpu()
    counted = max(float(sums[7]), 1.0)
    return StepMetrics(
        loss=float(sums[0]),
        grad_norm=grad_norm_value,
        lr=float(optimizer.param_groups[0]["lr"]),
        num_tokens=int(num_tokens),
        num_sequences=int(num_seqs),
        clip_low_fraction=float(sums[1]) / counted,
        clip_high_fraction=float(sums[2]) / counted,
        delta_capped_fraction=float(sums[3]) / counted,
        mean_ratio=float(sums[4]) / counted,
        mismatch_kl=float(sums[5]) / counted,
        entropy=float(sums[6]) / counted if cfg.entropy_coef > 0 else None,
    )
