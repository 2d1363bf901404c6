"""Multi-turn episodes on the wire: a completion cut into model and environment segments.

An episode is ONE token sequence: the prompt, then model turn 0, the environment's reply to it
(tool outputs, feedback), model turn 1, ... A sample says which completion tokens are which with
``RolloutSample.segments``, a list of :class:`Segment` in completion order. ``None`` (the default)
is a single-turn sample: every completion token was sampled by the model, exactly as before.

Rules checked here, on every submission, before anything is stored (:func:`segments_problem`):

* between 1 and :data:`MAX_SEGMENTS` segments, kinds ``"model"`` and ``"env"`` only;
* the lengths (each >= 1) add up to the number of completion tokens;
* kinds alternate, starting and ending with a model segment (an episode ends with a model turn);
* ``inference_logprobs`` is exactly 0.0 at every environment position (nothing was sampled there).

``turn`` is the model turn a segment belongs to: a model segment's turn selects its sampling seed
(:func:`turn_seed`); an environment segment carries the turn it answers. That the turns run
``0, 1, 2, ...`` in order is the validator's check (``turn_dropped``, ``turn_reordered``), not the
wire's: those failures have verdict reasons of their own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from prime_rl.api.assignment import MAX_SEED
from prime_rl.seeds import reseeded

__all__ = [
    "MAX_SEGMENTS", "Segment", "model_token_mask", "segments_problem", "switched_turn_seed", "turn_seed", "turn_starts",
]

MAX_SEGMENTS = 63
"""At most 32 model turns and the 31 environment replies between them."""

SegmentKind = Literal["model", "env"]


class Segment(BaseModel):
    """A run of consecutive completion tokens of one kind: ``model`` (sampled) or ``env`` (inserted)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kind: SegmentKind = Field(
        description="'model': sampled by the policy; 'env': inserted by the environment."
    )
    length: Annotated[int, Field(ge=1, le=1 << 24)] = Field(description="Tokens in the segment.")
    turn: Annotated[int, Field(ge=0, le=MAX_SEGMENTS)] = Field(
        description="Model turn index (its seed is turn_seed(sampling_seed, turn)); env: the turn it answers."
    )


def segments_problem(segments: Sequence[Segment], num_tokens: int, logprobs: Sequence[float]) -> str | None:
    """None if ``segments`` describe a completion of ``num_tokens`` tokens whose claimed
    ``logprobs`` are 0.0 at environment positions, else what is wrong."""
    if not 1 <= len(segments) <= MAX_SEGMENTS:
        return f"{len(segments)} segments; an episode has 1 to {MAX_SEGMENTS}"
    total = sum(s.length for s in segments)
    if total != num_tokens:
        return f"segment lengths add up to {total}, the completion has {num_tokens} tokens"
    for i, s in enumerate(segments):
        expected = "model" if i % 2 == 0 else "env"
        if s.kind != expected:
            return f"segment {i} is {s.kind!r}; segments alternate model, env, model, ... starting with model"
    if segments[-1].kind != "model":
        return "an episode ends with a model segment"
    start = 0
    for i, s in enumerate(segments):
        if s.kind == "env" and any(x != 0.0 for x in logprobs[start : start + s.length]):
            return f"inference_logprobs of env segment {i} must be 0.0 (nothing was sampled there)"
        start += s.length
    return None


def model_token_mask(segments: Sequence[Segment] | None, num_tokens: int) -> list[bool]:
    """Per completion token: True where the model sampled it (all True for a single-turn sample)."""
    if segments is None:
        return [True] * num_tokens
    return [s.kind == "model" for s in segments for _ in range(s.length)]


def turn_starts(segments: Sequence[Segment] | None) -> list[int]:
    """Completion index of each model turn's first token, in turn order (``[0]`` for a single-turn
    sample): the only points where an episode may switch policy versions (``api/spans.py``)."""
    if segments is None:
        return [0]
    starts, start = [], 0
    for s in segments:
        if s.kind == "model":
            starts.append(start)
        start += s.length
    return starts


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of model turn ``turn`` of a sample with seed ``seed``: ``seed`` itself for
    turn 0 (a one-turn episode samples exactly as a single-turn sample), else
    ``blake2b(seed, turn) mod (MAX_SEED + 1)``, so every turn draws fresh, reproducible noise."""
    if turn == 0:
        return seed
    digest = hashlib.blake2b(f"prime-rl-turn:{seed}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (MAX_SEED + 1)


def switched_turn_seed(seed: int, turn: int, nonces: Sequence[int]) -> int:
    """The sampling seed of model turn ``turn`` of an episode with seed ``seed`` that switched versions
    before it with the switch nonces ``nonces`` (the lease's recorded switches at turns ``<= turn``,
    oldest first: ``POST /leases/switch``): ``turn_seed(seed, turn)`` chained through
    ``span_seed(., nonce)`` per switch (``seeds.reseeded``), as a single-turn sample's span seeds
    chain. No nonce: the plain turn seed."""
    return reseeded(turn_seed(seed, turn), nonces)
