"""From claimed rollouts to packed training micro-batches, and back to per-completion log-probs.

The orchestrator hands the trainer whole groups of accepted samples (``protocol.TrainSample``,
with the validator's reward and advantage). Here:

1. :func:`split_minibatches` cuts a step's samples into ``optimizer_steps_per_version``
   contiguous mini-batches of whole groups (one optimizer step each).
2. :func:`make_micro_batches` gathers the samples that share a prompt (a GRPO group: same task,
   same prompt tokens) and packs each such group once as ``[prompt, completion_1, ...,
   completion_G]`` (``grpo.pack_shared_prefix``): the prompt is computed once, every completion
   attends to it and causally to itself, with position ids continuing from the prompt's length, so
   the packed forward equals separate forwards of each ``prompt ⧺ completion`` (values and
   gradients). A sample whose prompt no other shares is a plain sequence ``prompt ⧺ completion``.
   Groups go first-fit-decreasing (``grpo.first_fit_decreasing``) into rows of at most
   ``max_tokens`` tokens (a group too large for a row is split, each part with its own copy of the
   prompt; a longer sequence gets a row of its own). No ``L x L`` mask: the row's attention
   structure (``grpo.SharedPrefixStructure``) drives ``grpo.shared_prefix_attention``, which is
   ``grpo.document_attention`` when nothing is shared.
3. :func:`completion_logprobs` turns the packed logits back into a ``[n, C_max]`` matrix of
   completion-token log-probs, one row per sequence, aligned with :attr:`MicroBatch.mask`.
   The loss is then computed on that padded per-sequence layout, so every ``grpo`` aggregation
   mode (including the sequence-level ones) sees real sequences, not packed rows.

Alignment: completion token ``t`` of a sequence is predicted by the row position
``grpo.SharedPlacement.predictor_positions()[t]``: the prompt's last position for ``t = 0``
(shared by the group), the completion's token ``t - 1`` after that.
Loss mask: only tokens with ``MicroBatch.mask`` True are computed and scattered. Multi-turn
episodes (``TrainSample.segments``): the whole episode is the completion, and the mask is True only
at tokens the model sampled, False at tokens the environment inserted (tool outputs: context, no
loss, no log-prob or ratio term) and at padding.
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

    ``input_ids, position_ids``: ``[1, L]``; ``structure``: the row's attention structure (which
    positions each token sees; ``grpo.SharedPrefixStructure``); ``placements``: where each
    sequence's prompt and completion live in the row (a shared prompt appears once);
    ``prompt_lengths``/``completion_lengths``: per sequence; ``mask``: ``[n, C_max]`` bool, the
    loss mask (True at model-sampled completion tokens; env-inserted tokens and padding are False); ``advantages``: ``[n]``;
    ``behaviour_logprobs``: ``[n, C_max]`` (0 off-mask), the validator's log-probs of the
    generating policy (μ of the loss; never a worker's claim); ``sample_ids``: the claimed samples,
    in row order.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    structure: grpo.SharedPrefixStructure
    placements: tuple[grpo.SharedPlacement, ...]
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


def _row(groups: Sequence[Sequence[TrainSample]], pad_token_id: int) -> MicroBatch:
    samples = [s for group in groups for s in group]
    packed = grpo.pack_shared_prefix(
        [(group[0].prompt_tokens, [s.completion_tokens for s in group]) for group in groups],
        pad_id=pad_token_id,
    )
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
        structure=packed.structure,
        placements=packed.placements,
        prompt_lengths=tuple(len(s.prompt_tokens) for s in samples),
        completion_lengths=tuple(len(s.completion_tokens) for s in samples),
        mask=mask,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        behaviour_logprobs=behaviour,
        sample_ids=tuple(s.sample_id for s in samples),
    )


def prompt_groups(
    samples: Sequence[TrainSample], max_tokens: int, *, share_prompts: bool = True
) -> list[list[TrainSample]]:
    """The samples gathered by identical prompt tokens (first-seen order), each part fitting a row.

    A group whose ``P + sum(C)`` exceeds ``max_tokens`` is cut, in order, into parts that fit (a
    sample longer than a row alone is a part of its own). ``share_prompts=False``: one per sample.
    """
    if not share_prompts:
        return [[s] for s in samples]
    by_prompt: dict[tuple[int, ...], list[TrainSample]] = {}
    for s in samples:
        by_prompt.setdefault(tuple(s.prompt_tokens), []).append(s)
    parts: list[list[TrainSample]] = []
    for prompt, group in by_prompt.items():
        part: list[TrainSample] = []
        size = len(prompt)
        for s in group:
            if part and size + len(s.completion_tokens) > max_tokens:
                parts.append(part)
                part, size = [], len(prompt)
            part.append(s)
            size += len(s.completion_tokens)
        parts.append(part)
    return parts


def make_micro_batches(
    samples: Sequence[TrainSample], max_tokens: int, pad_token_id: int = 0, *, share_prompts: bool = True
) -> list[MicroBatch]:
    """Pack ``samples`` into rows of at most ``max(max_tokens, longest part)`` tokens.

    ``share_prompts``: a group's shared prompt once per row (see the module docstring); False packs
    every sample as its own sequence (the layout before shared prompts; for comparisons).
    """
    if not samples:
        return []
    parts = prompt_groups(samples, max_tokens, share_prompts=share_prompts)
    sizes = [len(p[0].prompt_tokens) + sum(len(s.completion_tokens) for s in p) for p in parts]
    bins = grpo.first_fit_decreasing(sizes, max(max_tokens, max(sizes)))
    return [_row([parts[i] for i in sorted(b)], pad_token_id) for b in bins]


def empty_micro_batch(pad_token_id: int = 0) -> MicroBatch:
    """A one-token row with an all-False mask: a rank's padding micro-batch (adds exactly 0)."""
    placement = grpo.SharedPlacement(
        group=0, member=0, prompt_offset=0, prompt_length=1, completion_offset=1, completion_length=0
    )
    return MicroBatch(
        input_ids=torch.full((1, 1), pad_token_id, dtype=torch.long),
        position_ids=torch.zeros((1, 1), dtype=torch.long),
        structure=grpo.SharedPrefixStructure(bounds=(0, 1), prefix_of=(0,)),
        placements=(placement,),
        prompt_lengths=(1,),
        completion_lengths=(0,),
        mask=torch.zeros((1, 1), dtype=torch.bool),
        advantages=torch.zeros(1),
        behaviour_logprobs=torch.zeros((1, 1)),
        sample_ids=(),
    )


def _loss_columns(micro: MicroBatch) -> list[list[int]]:
    """Per sequence, the completion columns ``t`` in the loss (``mask`` True), in order."""
    return [row.nonzero().flatten().tolist() for row in micro.mask]


def completion_positions(micro: MicroBatch) -> torch.Tensor:
    """Row positions ``[N]`` whose output predicts a loss token, sequence by sequence.

    ``N`` = ``micro.num_loss_tokens``, in the row-major order of ``micro.mask``'s True entries. A
    shared prompt's last position appears once per sequence of its group (it predicts each one's
    first token).
    """
    positions = [
        predictors[t]
        for place, columns in zip(micro.placements, _loss_columns(micro), strict=True)
        for predictors in (place.predictor_positions(),)
        for t in columns
    ]
    return torch.tensor(positions, dtype=torch.long)


def completion_targets(micro: MicroBatch) -> torch.Tensor:
    """The loss tokens' ids ``[N]``, in :func:`completion_positions` order."""
    columns = [
        place.completion_offset + t
        for place, loss_columns in zip(micro.placements, _loss_columns(micro), strict=True)
        for t in loss_columns
    ]
    return micro.input_ids[0, torch.tensor(columns, dtype=torch.long)]


def scatter_completions(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Completion values in :func:`completion_positions` order ``[N]`` -> ``[n, C_max]``.

    Off-mask entries are 0 (not NaN), and the result keeps the autograd graph.
    """
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)


def gather_completions(per_position: torch.Tensor, micro: MicroBatch) -> torch.Tensor:
    """``[1, L]`` per-position values (each predicting the next token) -> ``[n, C_max]``."""
    index = completion_positions(micro).to(per_position.device)
    return scatter_completions(per_position[0, index], micro.mask.to(per_position.device))


def completion_logprobs(logits: torch.Tensor, micro: MicroBatch, temperature: float) -> torch.Tensor:
    """Log-probs ``[n, C_max]`` of the completion tokens from packed ``logits [1, L, V]`` (fp32, with grad)."""
    index = completion_positions(micro).to(logits.device)
    targets = completion_targets(micro).to(logits.device)
    values = grpo.selective_log_softmax(logits[0, index], targets, temperature=temperature)
    return scatter_completions(values, micro.mask.to(logits.device))


def completion_entropy(logits: torch.Tensor, micro: MicroBatch, temperature: float) -> torch.Tensor:
    """Entropy ``[n, C_max]`` of the policy at each completion-token position (fp32, with grad)."""
    return gather_completions(grpo.entropy_from_logits(logits, temperature=temperature), micro)
