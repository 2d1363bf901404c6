"""The validator's checks of a multi-turn episode (``api/segments.py``), model-free and with the prefill.

Model-free, in this order (each failure has its own :class:`~prime_rl.validator.checks.Reason`,
the first one found is the verdict), before any prefill and without running any tool
(:func:`structure_problem`):

1. labels: every model segment ends as generation ends (EOS, the first stop string, or
   ``max_new_tokens``). One that runs past that end (an EOS or a stop string inside, or longer
   than a turn may be) holds tokens the model did not sample: ``env_tokens_as_model``. One that
   ends early, followed by an env segment, had its tail relabelled as inserted:
   ``model_tokens_as_env``; at the end of the episode: ``episode_truncated``.
2. turn order: the model segments' turns are ``0, 1, 2, ...``: a turn missing from an increasing
   sequence is ``turn_dropped``, any other order ``turn_reordered``; more turns than
   ``max_turns``, or an env segment not answering the turn before it, is ``malformed``. An
   environment that does not declare itself replayable (``Environment.replayable``: a tool that
   reads a clock or the network) cannot be checked by replay, so an untrusted worker's episode
   with any env segment in it is refused: ``tool_not_replayable``.

With the prefill (one over the whole episode as sent: the env tokens are only context there):
each model turn's toploc proofs against its own rows, the seeded sampler with the turn's seed
(``turn_seed``) over its tokens, and the log-probs at model positions only (:func:`episode_values`);
env positions get log-prob 0.0 for the trainer.

3. Only then, and only while every sample of the lease is still alive (a rejected lease is lost
   whatever its tools print), the environment replay (:func:`replay_episode`): the environment
   is re-run on the transcript of the model turns as the worker sent them
   (``episodes.EpisodeEnv.step``: same sandbox, same environment variables, seeded), and every
   env segment must equal its re-derived tokens exactly. A difference is replayed, up to
   ``REPLAYS_PER_TURN`` runs, until two runs were clean (no machine limit); a clean run equal to the
   worker's reply passes. ``tool_output_mismatch``: two clean runs agree with each other but not
   with the worker (also: the environment ended the episode and the worker inserted more).
   ``tool_unverifiable``, which like ``reward_unverifiable`` rejects the lease and never counts
   towards the failure-rate ban (the orchestrator still counts the lease as abandoned, since a
   worker can cause it on purpose): what the machine may explain (clean runs differ, fewer than two clean runs, the
   worker's output cut short by its machine, the lease's tool-time budget spent). An episode that
   stops while the environment wanted another turn and the budget allowed one:
   ``episode_truncated``.

So a fabricated episode (random proofs, tool calls that loop until their timeout) costs the
validator one prefill and no tool time.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import toploc
import verifiers
from prime_rl.api.protocol import RolloutSample, Segment
from prime_rl.api.segments import turn_seed
from prime_rl.episodes import EnvStep, EpisodeEnv
from prime_rl.inference.backend import PROOF_CHUNK, proof_size, proof_topk, token_logprobs, verify_proofs
from prime_rl.validator.structure import proof_problem, repetition_problem
from verifiers.envs import Message

__all__ = [
    "MAX_ENV_TOKENS",
    "REPLAYS_PER_TURN",
    "EpisodeValues",
    "ModelSpan",
    "Replay",
    "episode_checks",
    "episode_problem",
    "episode_values",
    "model_spans",
    "replay_episode",
    "segments_of",
    "structure_problem",
]

REPLAYS_PER_TURN = 4
"""Runs of one model turn's tool calls at most, when the first differs from the worker's reply: enough
for two clean runs on a loaded validator (``benchmarks/results/tool_replay_bench.md``)."""

MAX_ENV_TOKENS = 4096
"""Tokens one environment reply may take (the Python tool's output is cut at 4,000 characters)."""


@dataclass(frozen=True)
class ModelSpan:
    """One model turn: completion positions ``start .. start + length - 1``, sampled as turn ``turn``."""

    start: int
    length: int
    turn: int


def segments_of(sample: RolloutSample) -> list[Segment]:
    """The sample's segments; a single-turn sample is one model segment of turn 0."""
    if sample.segments is not None:
        return list(sample.segments)
    return [Segment(kind="model", length=len(sample.completion_tokens), turn=0)]


def model_spans(segments: Sequence[Segment]) -> list[ModelSpan]:
    spans, start = [], 0
    for s in segments:
        if s.kind == "model":
            spans.append(ModelSpan(start, s.length, s.turn))
        start += s.length
    return spans


def proof_bytes(spans: Sequence[ModelSpan], hidden_size: int) -> int:
    """Bytes of an episode's proofs: each model turn's ``ceil(n / 32)`` proofs."""
    return sum(math.ceil(s.length / PROOF_CHUNK) for s in spans) * proof_size(proof_topk(hidden_size))


def _turn_end(
    tokens: Sequence[int],
    decode: Callable[[Sequence[int]], str],
    eos: frozenset[int],
    stop: Sequence[str],
    limit: int,
) -> tuple[str, str] | None:
    """None if a model turn ends as generation ends, else ("past" | "early", why)."""
    for i, token in enumerate(tokens[:-1]):
        if token in eos:
            return "past", f"EOS at position {i} before the turn's last token"
    if len(tokens) > limit:
        return "past", f"{len(tokens)} tokens in one turn > max_new_tokens {limit}"
    if tokens[-1] in eos:
        return None
    stops = [s for s in stop if s]
    if stops:
        if any(s in decode(tokens[:-1]) for s in stops):
            return "past", "a stop string before the turn's last token"
        if any(s in decode(tokens) for s in stops):
            return None
    if len(tokens) < limit:
        return "early", f"ends after {len(tokens)} tokens without EOS or stop string (max_new_tokens {limit})"
    return None


def episode_problem(
    sample: RolloutSample,
    env: EpisodeEnv,
    decode: Callable[[Sequence[int]], str],
    *,
    eos: frozenset[int],
    stop: Sequence[str],
    max_new_tokens: int,
) -> tuple[str, str, tuple[Message, ...]]:
    """:func:`structure_problem`, then :func:`replay_episode`: (reason code, detail, transcript) of
    the first failure, with reason "" when there is none (the validator runs the two apart, with
    the prefill between them)."""
    code, detail = structure_problem(sample, env, decode, eos=eos, stop=stop, max_new_tokens=max_new_tokens)
    if code:
        return code, detail, ()
    replay = replay_episode(sample, env, decode)
    return replay.code, replay.detail, replay.transcript


def structure_problem(
    sample: RolloutSample,
    env: EpisodeEnv,
    decode: Callable[[Sequence[int]], str],
    *,
    eos: frozenset[int],
    stop: Sequence[str],
    max_new_tokens: int,
) -> tuple[str, str]:
    """(reason code, detail) of the first failure of checks 1 and 2 and the replayability rule of the
    module docstring ("" when there is none). Runs no tool."""
    segments = segments_of(sample)
    tokens = sample.completion_tokens
    for i, (s, (a, b)) in enumerate(zip(segments, _bounds(segments), strict=True)):
        if s.kind != "model":
            continue
        end = _turn_end(tokens[a:b], decode, eos, stop, max_new_tokens)
        if end is not None and end[0] == "past":
            return "env_tokens_as_model", f"model segment {i}: {end[1]}"
        if end is not None:
            code = "model_tokens_as_env" if i + 1 < len(segments) else "episode_truncated"
            return code, f"model segment {i} {end[1]}"
    turns = [s.turn for s in segments if s.kind == "model"]
    if turns != list(range(len(turns))):
        increasing = all(x < y for x, y in itertools.pairwise(turns))
        code = "turn_dropped" if increasing else "turn_reordered"
        return code, f"model turns {turns[:16]} (expected 0, 1, 2, ...)"
    if len(turns) > env.max_turns:
        return "malformed", f"{len(turns)} model turns > max_turns {env.max_turns}"
    for i, s in enumerate(segments):
        if s.kind == "env" and s.turn != segments[i - 1].turn:
            return "malformed", f"env segment {i} says it answers turn {s.turn}, after turn {segments[i - 1].turn}"
    if len(segments) > 1 and not env.replayable:
        return (
            "tool_not_replayable",
            "the environment's tools cannot be re-run exactly; no worker's tool output is trusted",
        )
    return "", ""


def _bounds(segments: Sequence[Segment]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for s in segments:
        bounds.append((start, start + s.length))
        start += s.length
    return bounds


@dataclass(frozen=True)
class Replay:
    """The environment replay of one episode: reason code ("" when every env segment matched),
    detail, the transcript (model turns as sent, the environment's replies re-derived; empty unless
    it matched) and the seconds the environment's turns took (tool runs)."""

    code: str
    detail: str
    transcript: tuple[Message, ...]
    tool_seconds: float


def _timed_step(
    env: EpisodeEnv, task_id: int, messages: tuple[Message, ...], text: str, final: bool
) -> tuple[EnvStep, str | None, float]:
    """One ``env.step``: the step, the first machine limit its tools reported (None: clean), seconds."""
    started = time.monotonic()
    with verifiers.machine_limits() as seen:
        step = env.step(task_id, messages, text, final=final)
    return step, (seen.causes[0] if seen.causes else None), time.monotonic() - started


def _worker_limited(worker_text: str, replay_text: str, markers: Sequence[str]) -> str | None:
    """The limit marker the worker's reply shows right after text the replay agrees with (the worker's
    machine cut the run short where the validator's did not), else None."""
    for marker in markers:
        at = worker_text.find(marker)
        if at >= 0 and replay_text.startswith(worker_text[:at]):
            return marker.strip()
    return None


def replay_episode(
    sample: RolloutSample,
    env: EpisodeEnv,
    decode: Callable[[Sequence[int]], str],
    *,
    seconds_left: float = math.inf,
) -> Replay:
    """Check 3 of the module docstring: re-run the environment on the model turns as sent and compare
    every env segment with its re-derived tokens; ``seconds_left`` bounds the tool time it may spend.

    A turn whose reply differs is replayed again (at most ``REPLAYS_PER_TURN`` runs in all, within the
    budget) until two runs were clean, i.e. reported no machine limit (``verifiers.machine_limits``: a
    timeout, an output or memory limit, a runner that failed). A clean run that prints what the worker
    got passes (the program does print it). Two clean runs that agree with each other but not with the
    worker: ``tool_output_mismatch``. Otherwise ``tool_unverifiable`` (never a ban count): clean runs
    differ from each other (the call is not deterministic: a clock, an address), fewer than two runs
    were clean (the machine), the worker's reply shows a limit marker (``Environment.limit_markers``)
    right after text the clean replay agrees with (the worker's machine was the slower one), or the
    tool-time budget ran out.
    """
    segments = segments_of(sample)
    bounds = _bounds(segments)
    tokens = sample.completion_tokens
    spent = 0.0
    messages = env.start(sample.task_id)
    for k, (s, (a, b)) in enumerate(zip(segments, bounds, strict=True)):
        if s.kind != "model":
            continue
        text, final = decode(tokens[a:b]), s.turn + 1 == env.max_turns
        if spent > seconds_left and not final:  # a final turn is never answered: nothing runs
            return Replay(
                "tool_unverifiable", f"the tool-time budget ran out after {spent:.2f} s, before turn {s.turn}", (), spent
            )
        last = k + 1 == len(segments)
        step, limit, seconds = _timed_step(env, sample.task_id, messages, text, final)
        spent += seconds
        if last:
            if not step.done:
                return Replay(
                    "episode_truncated", f"the episode stops after turn {s.turn}, but the environment replied", (), spent
                )
            return Replay("", "", step.messages, spent)
        inserted = tuple(tokens[bounds[k + 1][0] : bounds[k + 1][1]])
        if step.done:
            return Replay(
                "tool_output_mismatch",
                f"the environment ended the episode at turn {s.turn}; {len(inserted)} tokens were inserted after it",
                (),
                spent,
            )
        if inserted != step.tokens:
            runs = [(step, limit)]
            while len(runs) < REPLAYS_PER_TURN and spent <= seconds_left:
                clean = [r.tokens for r, cause in runs if cause is None]
                if inserted in clean or len(clean) >= 2:
                    break
                again, cause, seconds = _timed_step(env, sample.task_id, messages, text, final)
                spent += seconds
                runs.append((again, cause))
            confirmed = next((r for r, cause in runs if cause is None and r.tokens == inserted), None)
            if confirmed is not None:  # a clean replay prints what the worker got: the program does print it
                messages = confirmed.messages
                continue
            first = next(
                (j for j, (x, y) in enumerate(zip(inserted, step.tokens, strict=False)) if x != y),
                min(len(inserted), len(step.tokens)),
            )
            where = (
                f"env segment after turn {s.turn}: {len(inserted)} tokens inserted, the environment re-run gives "
                f"{len(step.tokens)}; first difference at token {first}"
            )
            clean = [r.tokens for r, cause in runs if cause is None]
            causes = [cause for _, cause in runs if cause is not None]
            worker_limit = _worker_limited(decode(inserted), decode(clean[0] if clean else step.tokens), env.limit_markers)
            if len(set(clean)) > 1:
                why = f"{len(clean)} clean replays of the turn differ from each other (the call is not deterministic)"
            elif len(clean) < 2:
                why = f"{len(causes)} of {len(runs)} replays hit a machine limit ({causes[0] if causes else 'tool budget'})"
            elif worker_limit is not None:
                why = f"the worker's output shows {worker_limit} after output the replay agrees with"
            else:
                return Replay(
                    "tool_output_mismatch", f"{where}; {len(clean)} clean replays agree with each other", (), spent
                )
            return Replay("tool_unverifiable", f"{where}; {why}", (), spent)
        messages = step.messages
    return Replay("", "", messages, spent)  # unreachable: an episode ends with a model segment


def episode_checks(
    sample: RolloutSample,
    env: EpisodeEnv,
    decode: Callable[[Sequence[int]], str],
    *,
    eos: frozenset[int],
    stop: Sequence[str],
    max_new_tokens: int,
    max_repeated: int,
    hidden_size: int,
) -> tuple[str, str]:
    """:func:`structure_problem`, then repetition per model turn (``repeated_token``) and the proofs'
    sizes and parse (``malformed_proof``): (reason code or "", detail). Runs no tool: the replay
    (:func:`replay_episode`) comes after the prefill has checked every model turn."""
    code, detail = structure_problem(sample, env, decode, eos=eos, stop=stop, max_new_tokens=max_new_tokens)
    if code:
        return code, detail
    spans = model_spans(segments_of(sample))
    for span in spans:
        why = repetition_problem(
            sample.completion_tokens[span.start : span.start + span.length], limit=max_repeated
        )
        if why is not None:
            return "repeated_token", f"turn {span.turn}: {why}"
    expected = proof_bytes(spans, hidden_size)
    if len(sample.proofs) != expected:
        return "malformed_proof", f"{len(sample.proofs)} proof bytes; the model turns need {expected}"
    chunks = expected // proof_size(proof_topk(hidden_size))
    why = proof_problem(sample.proofs, PROOF_CHUNK * chunks, proof_topk(hidden_size))
    return ("malformed_proof", why) if why is not None else ("", "")


@dataclass(frozen=True)
class EpisodeValues:
    """What the prefill gives for one episode: toploc results of every model turn's proofs, the sampling
    margins and (recomputed, claimed) log-probs of its model tokens, and the trainer's log-probs of
    every completion token (0.0 at env positions)."""

    proof_results: list[Any]
    margins: torch.Tensor
    recomputed: torch.Tensor
    claimed: list[float]
    trainer_logprobs: tuple[float, ...]


def episode_values(
    sample: RolloutSample,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    hidden_size: int,
    sampling_margins: Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor],
    turn_seeds: Sequence[int] | None = None,
) -> EpisodeValues:
    """The per-turn checks' inputs from one prefill's ``hidden [n, H]`` and ``logits [n, V]`` rows;
    ``sampling_margins`` is ``checks.sampling_margins`` (the one sampler rule). ``turn_seeds``: the
    seed of each model turn, in order (its span plan's, ``validator/spans.py``: a recorded switch
    changes the seeds of the turns after it); None: ``turn_seed(sampling_seed, turn)``.

    Raises ``toploc.ProofFormatError``/``ValueError`` for proofs that do not split into the turns' counts.
    """
    spans = model_spans(segments_of(sample))
    size = proof_size(proof_topk(hidden_size))
    tokens = torch.tensor(sample.completion_tokens, dtype=torch.long, device=logits.device)
    results: list[Any] = []
    margins, offset = [], 0
    for k, span in enumerate(spans):
        chunk = math.ceil(span.length / PROOF_CHUNK) * size
        rows = slice(span.start, span.start + span.length)
        results += verify_proofs(hidden[rows], sample.proofs[offset : offset + chunk])
        offset += chunk
        seed = turn_seed(sample.sampling_seed, span.turn) if turn_seeds is None else turn_seeds[k]
        margins.append(sampling_margins(logits[rows], tokens[rows], seed, sample.temperature))
    if offset != len(sample.proofs):
        raise toploc.ProofFormatError(f"{len(sample.proofs)} proof bytes, the model turns need {offset}")
    everything = token_logprobs(logits, tokens, sample.temperature).cpu()
    mask = torch.zeros(len(sample.completion_tokens), dtype=torch.bool)
    for span in spans:
        mask[span.start : span.start + span.length] = True
    trainer = torch.where(mask, everything, torch.zeros_like(everything))
    claimed = [x for x, keep in zip(sample.inference_logprobs, mask.tolist(), strict=True) if keep]
    return EpisodeValues(
        results, torch.cat(margins), everything[mask], claimed, tuple(float(x) for x in trainer.tolist())
    )
