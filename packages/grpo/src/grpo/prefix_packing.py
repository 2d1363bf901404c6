"""Shared-prefix packing: groups ``(prompt, [completion_1, ..., completion_G])`` -> one packed row.

Each group is laid out ``[prompt, completion_1, ..., completion_G]``: the prompt once, with
position ids ``0 .. P - 1``, and every completion with position ids ``P .. P + C_k - 1`` (RoPE sees
each completion right after the prompt, as in a separate forward). The row's attention structure
(:class:`grpo.SharedPrefixStructure`) lets each completion see the prompt and itself only, so the
packed forward equals ``G`` separate forwards of ``prompt ⧺ completion_k`` (values and gradients)
while the prompt is computed once instead of ``G`` times.

A group with one completion (or one non-empty completion) is laid out as one plain document
``prompt ⧺ completion``, exactly as :func:`grpo.pack_sequences` would; a row of such groups only
is plain document attention. Empty completions take no row space (their placement has
``completion_length == 0``).

::

    pack = grpo.pack_shared_prefix([(prompt, completions)])
    with grpo.use_document_attention(model):
        logits = model(input_ids=pack.input_ids, position_ids=pack.position_ids,
                       **grpo.shared_prefix_kwargs(pack.structure)).logits
    per_sequence = pack.unpack(logits)  # [P + C_k, V] each, as model(prompt ⧺ completion_k)

Pitfall: completion ``k``'s first token is predicted by the prompt's last position, shared by the
group; use :meth:`SharedPlacement.predictor_positions`, not "the position before the completion".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpo.errors import InvalidParameterError, ShapeError
from grpo.shared_prefix import SharedPrefixStructure

__all__ = ["SharedPlacement", "SharedPrefixPack", "pack_shared_prefix"]

Tokens = Sequence[int] | torch.Tensor


@dataclass(frozen=True)
class SharedPlacement:
    """Where completion ``member`` of group ``group`` lives in the row, and its prompt.

    Prompt at columns ``[prompt_offset, prompt_offset + prompt_length)`` (shared by the group),
    completion at ``[completion_offset, completion_offset + completion_length)``.
    """

    group: int
    member: int
    prompt_offset: int
    prompt_length: int
    completion_offset: int
    completion_length: int

    def token_positions(self) -> list[int]:
        """Row columns of ``prompt ⧺ completion``, in sequence order."""
        prompt = range(self.prompt_offset, self.prompt_offset + self.prompt_length)
        return [*prompt, *range(self.completion_offset, self.completion_offset + self.completion_length)]

    def predictor_positions(self) -> list[int]:
        """Row columns whose output predicts completion token ``t`` (``t = 0 .. C - 1``).

        Token 0: the prompt's last column; token ``t >= 1``: completion column ``t - 1``.
        """
        if self.completion_length == 0:
            return []
        last_prompt = self.prompt_offset + self.prompt_length - 1
        return [
            last_prompt,
            *range(self.completion_offset, self.completion_offset + self.completion_length - 1),
        ]


@dataclass(frozen=True)
class SharedPrefixPack:
    """One packed row (see the module docstring). ``input_ids``, ``position_ids``: long ``[1, L]``;
    ``placements``: one per (group, completion), groups in order, completions in order."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    structure: SharedPrefixStructure
    placements: tuple[SharedPlacement, ...]

    def unpack(self, packed: torch.Tensor) -> list[torch.Tensor]:
        """``[1, L, ...]`` per-token values -> one ``[P + C_k, ...]`` tensor per placement (with grad)."""
        if packed.shape[:2] != self.input_ids.shape:
            raise ShapeError(
                f"packed values have shape {tuple(packed.shape)}, expected {tuple(self.input_ids.shape)}"
            )
        return [
            packed[0, torch.tensor(p.token_positions(), dtype=torch.long, device=packed.device)]
            for p in self.placements
        ]


def pack_shared_prefix(
    groups: Sequence[tuple[Tokens, Sequence[Tokens]]], *, length: int | None = None, pad_id: int = 0
) -> SharedPrefixPack:
    """Pack ``(prompt, completions)`` groups, in order, into one row of ``length`` tokens.

    ``length`` None: exactly the tokens needed; longer: padded with ``pad_id`` (a segment of its
    own, position ids 0). Raises :class:`~grpo.errors.InvalidParameterError` for an empty prompt,
    a group without completions, or a row longer than ``length``.
    """
    if not groups:
        raise InvalidParameterError("no groups to pack")
    ids: list[torch.Tensor] = []
    positions: list[torch.Tensor] = []
    layout: list[tuple[int, tuple[int, ...]]] = []
    placements: list[SharedPlacement] = []
    offset = 0
    for index, (prompt, completions) in enumerate(groups):
        prompt_ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
        members = [torch.as_tensor(c, dtype=torch.long).reshape(-1) for c in completions]
        prompt_length = prompt_ids.numel()
        if prompt_length == 0 or not members:
            raise InvalidParameterError(f"group {index} needs a non-empty prompt and at least one completion")
        ids.append(prompt_ids)
        positions.append(torch.arange(prompt_length))
        shared = sum(m.numel() > 0 for m in members) > 1  # else one plain document prompt ⧺ completion
        suffixes: list[int] = []
        cursor = offset + prompt_length
        for member, tokens in enumerate(members):
            n = tokens.numel()
            placements.append(SharedPlacement(index, member, offset, prompt_length, cursor, n))
            if n:
                ids.append(tokens)
                positions.append(torch.arange(prompt_length, prompt_length + n))
                cursor += n
                suffixes.append(n)
        layout.append((prompt_length, tuple(suffixes)) if shared else (cursor - offset, ()))
        offset = cursor
    if length is None:
        length = offset
    if offset > length:
        raise InvalidParameterError(f"the groups need {offset} tokens > length {length}")
    if offset < length:
        ids.append(torch.full((length - offset,), pad_id, dtype=torch.long))
        positions.append(torch.zeros(length - offset, dtype=torch.long))
        layout.append((length - offset, ()))
    return SharedPrefixPack(
        input_ids=torch.cat(ids)[None],
        position_ids=torch.cat(positions)[None],
        structure=SharedPrefixStructure.from_groups(layout),
        placements=tuple(placements),
    )
