"""How a cheating worker would tamper with an honestly played multi-turn episode (``worker/episodes.py``).

Pure functions ``RolloutSample -> RolloutSample`` that keep the wire format valid (segments still
alternate, add up, and carry log-prob 0.0 at env positions), so each one reaches the validator's
episode checks and is rejected there with its own reason (``validator/episodes.py``). A sample
with too few turns for a tampering is returned unchanged (its lease mates carry the attack).

A forged tool output is played, not patched in afterwards (:class:`ForgingEnv`): the model's later
turns are generated after the forged reply, so their proofs pass the prefill and only the
validator's tool replay can tell (``tool_output_mismatch``). Patched in afterwards
(:func:`forge_tool_output`), the later turns' proofs no longer match their context
(``toploc_mismatch``), before any tool runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prime_rl.api.protocol import RolloutSample, Segment
from prime_rl.episodes import EnvStep, EpisodeEnv
from verifiers.envs import Message

__all__ = [
    "ForgingEnv",
    "drop_turn",
    "env_as_model",
    "forge_tool_output",
    "model_as_env",
    "reorder_turns",
    "truncate_episode",
]


@dataclass(frozen=True)
class _Piece:
    segment: Segment
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    proofs: bytes  # a model turn's own proofs (b"" for env)


def _pieces(sample: RolloutSample) -> list[_Piece]:
    segments = sample.segments or [Segment(kind="model", length=len(sample.completion_tokens), turn=0)]
    chunks = sum(-(-s.length // 32) for s in segments if s.kind == "model")
    size = len(sample.proofs) // max(chunks, 1)
    pieces, start, offset = [], 0, 0
    for s in segments:
        end = start + s.length
        proofs = b""
        if s.kind == "model":
            proofs = sample.proofs[offset : offset + -(-s.length // 32) * size]
            offset += len(proofs)
        pieces.append(
            _Piece(
                s,
                tuple(sample.completion_tokens[start:end]),
                tuple(sample.inference_logprobs[start:end]),
                proofs,
            )
        )
        start = end
    return pieces


def _join(sample: RolloutSample, pieces: Sequence[_Piece]) -> RolloutSample:
    return sample.model_copy(
        update={
            "completion_tokens": [t for p in pieces for t in p.tokens],
            "inference_logprobs": [x for p in pieces for x in p.logprobs],
            "proofs": b"".join(p.proofs for p in pieces),
            "segments": [p.segment for p in pieces],
        }
    )


def _resized(
    piece: _Piece, tokens: tuple[int, ...], logprobs: tuple[float, ...], **segment: object
) -> _Piece:
    return _Piece(
        piece.segment.model_copy(update={"length": len(tokens), **segment}), tokens, logprobs, piece.proofs
    )


def forge_tool_output(sample: RolloutSample) -> RolloutSample:
    """Every token of the first environment reply replaced by a neighbouring id (a made-up tool output)."""
    pieces = _pieces(sample)
    if len(pieces) < 3:
        return sample
    env = pieces[1]
    forged = tuple(t - 1 if t > 0 else t + 1 for t in env.tokens)
    return _join(sample, [pieces[0], _resized(env, forged, env.logprobs), *pieces[2:]])


def drop_turn(sample: RolloutSample) -> RolloutSample:
    """Model turn 0 and the reply to it left out (the episode starts at turn 1)."""
    pieces = _pieces(sample)
    return sample if len(pieces) < 3 else _join(sample, pieces[2:])


def reorder_turns(sample: RolloutSample) -> RolloutSample:
    """Model turns 0 and 1 swapped (each with its own tokens, log-probs and proofs)."""
    pieces = _pieces(sample)
    if len(pieces) < 3:
        return sample
    return _join(sample, [pieces[2], pieces[1], pieces[0], *pieces[3:]])


def truncate_episode(sample: RolloutSample) -> RolloutSample:
    """Only model turn 0 kept: the episode stops where the environment had replied."""
    pieces = _pieces(sample)
    return sample if len(pieces) < 3 else _join(sample, pieces[:1])


def model_as_env(sample: RolloutSample) -> RolloutSample:
    """The last sampled token of turn 0 labelled as inserted by the environment."""
    pieces = _pieces(sample)
    if len(pieces) < 3 or pieces[0].segment.length < 2:
        return sample
    model, env = pieces[0], pieces[1]
    moved_model = _resized(model, model.tokens[:-1], model.logprobs[:-1])
    moved_env = _resized(env, model.tokens[-1:] + env.tokens, (0.0, *env.logprobs))
    return _join(sample, [moved_model, moved_env, *pieces[2:]])


def env_as_model(sample: RolloutSample) -> RolloutSample:
    """The environment's first reply labelled as sampled: turns 0 and 1 and the reply between them as one turn."""
    pieces = _pieces(sample)
    if len(pieces) < 3:
        return sample
    first, env, second = pieces[:3]
    merged = _Piece(
        first.segment.model_copy(
            update={"length": first.segment.length + env.segment.length + second.segment.length}
        ),
        first.tokens + env.tokens + second.tokens,
        first.logprobs + env.logprobs + second.logprobs,
        first.proofs + second.proofs,
    )
    return _join(sample, [merged, *pieces[3:]])


class ForgingEnv(EpisodeEnv):
    """The run's environment, except that the first reply of every episode is made up: each of its
    tokens replaced by a neighbouring id, as :func:`forge_tool_output` does, but before the model
    answers it."""

    def __init__(self, env: EpisodeEnv) -> None:
        super().__init__(env.env, env.task_set, env.tokenizer, turn_template=env.turn_template)

    def step(self, task_id: int, messages: tuple[Message, ...], model_text: str, *, final: bool = False) -> EnvStep:
        first = not any(m.role == "assistant" for m in messages)
        step = super().step(task_id, messages, model_text, final=final)
        if not first or step.done:
            return step
        return EnvStep(step.messages, tuple(t - 1 if t > 0 else t + 1 for t in step.tokens), step.done)
