"""From claimed rollouts to packed training micro-batches, and back to per-completion log-probs.

The orchestrator hands the trainer whole groups of accepted samples (``protocol.TrainSample``,
with the validator's reward and advantage). Here:

1. :func:`split_minibatches` cuts a step's samples into ``optimizer_steps_per_version``
   contiguous mini-batches of whole groups (one optimizer step each).
2. :func:`make_micro_batches` packs a mini-batch's sequences ``prompt ⧺ completion``
   first-fit-decreasing (``grpo.first_fit_decreasing``) into rows of at most ``max_tokens``
   tokens (a longer sequence gets a row of its own), with position ids restarting per sequence and
   the sequence boundaries (``cu_seqlens``) for document attention (``grpo.document_attention``:
   causal within each sequence, no ``L x L`` mask), so a packed forward equals separate forwards.
3. :func:`completion_logprobs` turns the packed logits back into a ``[n, C_max]`` matrix of
   completion-token log-probs, one row per sequence, aligned with :attr:`MicroBatch.mask`.
   The loss is then computed on that padded per-sequence layout, so every ``grpo`` aggregation
   mode (including the sequence-level ones) sees real sequences, not packed rows.

Alignment: a sequence with prompt length ``P`` and completion length ``C`` has its completion
token ``t`` predicted by the logits at sequence position ``P - 1 + t``.

Multi-turn episodes (``TrainSample.segments``): the whole episode is the sequence, and
:attr:`MicroBatch.mask` is the per-token LOSS mask: True only at tokens the model sampled, False at
tokens the environment inserted (tool outputs: context, no loss, no log-prob or ratio term) and
at padding. Every per-token value is computed at, and in the order of, the mask's True entries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import grpo
from prime_rl.api.protocol import TrainSample
from prime_rl.api.segments import model_token_mask


def split_minibatches(samples: Sequence[TrainSample], count: int, group_size: int) -> list[list[TrainSample]]:
    """At most ``count`` contiguous, non-empty mini-batches of whole groups (near-equal sizes).

    ``samples`` must hold whole groups in order (as ``/trainer/claim`` returns them).
    """
    groups = [list(samples[i : i + group_size]) for i in range(0, len(samples), group_size)]
    count = max(1, min(count, len(groups)))
    per = math.ceil(len(groups) / count)
    return [[s for group in groups[i : i + per] for s in group] for i in range(0, len(groups), per)]


@dataclass(frozen=True)
class MicroBatch:
    """One packed row and the per-completion tensors of its ``n`` sequences.

    ``input_ids, position_ids``: ``[1, L]``; ``cu_seqlens``: int32 ``[n + 1]``, the sequences'
    starts in the row and ``L`` (attention stays within a sequence); ``max_seqlen``: the longest
    sequence; ``placements``: where each sequence lives in the row;
    ``prompt_lengths``/``completion_lengths``: per sequence; ``mask``: ``[n, C_max]`` bool, the loss
    mask (True at model-sampled completion tokens; env-inserted tokens and padding are False);
    ``advantages``: ``[n]``; ``behaviour_logprobs``: ``[n, C_max]`` (0 off-mask), the validator's
    log-probs of the generating policy (μ of the loss; never a worker's claim); ``sample_ids``: the
    claimed samples, in row order.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    placements: tuple[grpo.Placement, ...]
    prompt_lengths: tuple[int, ...]
    completion_lengths: tuple[int, ...]
    mask: torch.Tensor
    advantages: torch.Tensor
    behaviour_logprobs: torch.Tensor
    sample_ids: tuple[str, ...]

    @property
    def num_sequences(self) -> int:
        return len(self.sample_ids)

    @property
    def num_loss_tokens(self) -> int:
        return int(self.mask.sum())


def _row(samples: Sequence[TrainSample], pad_token_id: int) -> MicroBatch:
    sequences = [list(s.prompt_tokens) + list(s.completion_tokens) for s in samples]
    packed = grpo.pack_sequences(sequences, sum(len(q) for q in sequences), pad_id=pad_token_id)
    width = max(len(s.completion_tokens) for s in samples)
    mask = torch.zeros((len(samples), width), dtype=torch.bool)
    behaviour = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, s in enumerate(samples):
        c = len(s.completion_tokens)
        mask[i, :c] = torch.tensor(model_token_mask(s.segments, c), dtype=torch.bool)
        behaviour[i, :c] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
    return MicroBatch(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        cu_seqlens=packed.cu_seqlens(),
        max_seqlen=max(len(q) for q in sequences),
        placements=packed.placements,
        prompt_lengths=tuple(len(s.prompt_tokens) for s in samples),
        completion_lengths=tuple(len(s.completion_tokens) for s in samples),
        mask=mask,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        behaviour_logprobs=behaviour,
        sample_ids=tuple(s.sample_id for s in samples),
    )


def make_micro_batches(
    samples: Sequence[TrainSample], max_tokens: int, pad_token_id: int = 0
) -> list[MicroBatch]:
    """Pack ``samples`` into rows of at most ``max(max_tokens, longest sequence)`` tokens."""
    if not samples:
        return []
    lengths = [len(s.prompt_tokens) + len(s.completion_tokens) for s in samples]
    bins = grpo.first_fit_decreasing(lengths, max(max_tokens, max(lengths)))
    return [_row([samples[i] for i in sorted(b)], pad_token_id) for b in bins]


def empty_micro_batch(pad_token_id: int = 0) -> MicroBatch:
    """A one-token row with an all-False mask: a rank's padding micro-batch (adds exactly 0)."""
    placement = grpo.Placement(index=0, bin=0, offset=0, length=1)
    return MicroBatch(
        input_ids=torch.full((1, 1), pad_token_id, dtype=torch.long),
        position_ids=torch.zeros((1, 1), dtype=torch.long),
        cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
        max_seqlen=1,
        placements=(placement,),
        prompt_lengths=(1,),
        completion_lengths=(0,),
        mask=torch.zeros((1, 1), dtype=torch.bool),
        advantages=torch.zeros(1),
        behaviour_logprobs=torch.zeros((1, 1)),
        sample_ids=(),
    )


def completion_positions(micro: MicroBatch) -> torch.Tensor:
    """Row positions ``[N]`` whose output predicts a loss token (a True entry of ``micro.mask``).

    Position ``j`` predicts token ``j + 1``; ``N`` = ``micro.num_loss_tokens``, in the row-major
    order of ``micro.mask``'s True entries (sequence by sequence).
    """
    rows, columns = micro.mask.nonzero(as_tuple=True)
    starts = torch.tensor(
        [
            place.offset + prompt - 1
            for place, prompt in zip(micro.placements, micro.prompt_lengths, strict=True)
        ],
        dtype=torch.long,
    )
    return starts[rows.cpu()] + columns.cpu() if rows.numel() else torch.zeros(0, dtype=torch.long)


def scatter_completions(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Completion values in :func:`completion_positions` order ``[N]`` -> ``[n, C_max]``.

    Off-mask entries are 0 (not NaN), and the result keeps the autograd graph.
    """
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)


def gather_completions(per_position: torch.Tensor, micro: MicroBatch) -> torch.Tensor:
    """``[1, L]`` per-position values (position ``j`` predicts token ``j + 1``) -> ``[n, C_max]``."""
    index = completion_positions(micro).to(per_position.device)
    return scatter_completions(per_position[0, index], micro.mask.to(per_position.device))


def completion_logprobs(logits: torch.Tensor, micro: MicroBatch, temperature: float) -> torch.Tensor:
    """Log-probs ``[n, C_max]`` of the completion tokens from packed ``logits [1, L, V]`` (fp32, with grad)."""
    targets = torch.roll(micro.input_ids.to(logits.device), shifts=-1, dims=1)  # the last one is unused
    per_position = grpo.selective_log_softmax(logits, targets, temperature=temperature)
    return gather_completions(per_position, micro)


def completion_entropy(logits: torch.Tensor, micro: MicroBatch, temperature: float) -> torch.Tensor:
    """Entropy ``[n, C_max]`` of the policy at each completion-token position (fp32, with grad)."""
    return gather_completions(grpo.entropy_from_logits(logits, temperature=temperature), micro)
