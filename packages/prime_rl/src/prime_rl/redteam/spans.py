"""How a cheating worker would forge the version spans of in-flight weight updates (``api/spans.py``).

Every forgery starts from a real HF decode of the lease: either with the lease's version alone, or
with an honest in-flight switch to a newer version that the orchestrator has committed and the
worker's follower has downloaded (:class:`SwitchAt`, the backend's own keep-KV switch at a proof-chunk
boundary). :func:`decode_switching_at` is the one decode no honest backend does: it changes the
weights at any completion position, inside a proof chunk too, token by token through
``HFBackend.extend`` (the validator's chained forward, so everything but the switch point is what
the validator recomputes).

The span relabellings (:func:`relabel`) keep the tokens, proofs and log-probs and change only the
claimed ``(policy_version, first_token)`` list: what the validator must catch is the claim.

Pitfall: a span attack needs a committed version newer than its lease's (:func:`wait_for_newer`);
a lease whose deadline comes first raises ``GenerationError`` and is skipped, like a failed decode.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import torch

from prime_rl.api.protocol import RolloutBatch, RolloutSample
from prime_rl.api.spans import SPAN_ALIGN, as_spans, reseeded
from prime_rl.inference.backend import HFBackend, sample_next, token_logprobs
from prime_rl.inference.contract import (
    Completion,
    FinishReason,
    GenerationError,
    Prefill,
    SamplingParams,
    VersionSource,
    VersionSwitch,
    build_proofs,
    completion_text,
)
from prime_rl.inference.stop_strings import StopStringMatcher

__all__ = [
    "MidChunkSwitch",
    "SpanVersions",
    "SwitchAt",
    "decode_switching_at",
    "points",
    "relabel",
    "switching",
    "wait_for_newer",
]

Points = list[tuple[int, int]]
"""A span list as ``(policy_version, first_token)`` pairs."""


class SpanVersions(Protocol):
    """What a span attack asks of the worker's in-flight source (``worker.inflight.CommittedVersions``)."""

    max_versions: int

    def newer(self, current: int, boundary: int) -> VersionSwitch | None: ...

    def committed(self) -> int: ...


def wait_for_newer(
    versions: SpanVersions, current: int, deadline: float, poll_s: float = 0.1, clock: Callable[[], float] = time.time
) -> VersionSwitch:
    """The first committed, downloaded version newer than ``current`` (polling every ``poll_s``);
    ``GenerationError`` once Unix time ``deadline`` passes without one."""
    while (switch := versions.newer(current, SPAN_ALIGN)) is None:
        if clock() > deadline:
            raise GenerationError(f"no committed version newer than v{current} arrived before the lease's deadline")
        time.sleep(poll_s)
    return switch


class SwitchAt:
    """A ``VersionSource`` that offers ``switch`` once, at the first proof-chunk boundary at or after
    ``boundary``: the honest rule's switch when the version is ready before the lease starts."""

    def __init__(self, switch: VersionSwitch, boundary: int = SPAN_ALIGN, max_versions: int = 2) -> None:
        self.switch, self.boundary, self.max_versions = switch, boundary, max_versions

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        return self.switch if boundary >= self.boundary and current < self.switch.version else None


@contextlib.contextmanager
def switching(backend: HFBackend, source: VersionSource) -> Iterator[None]:
    """``backend`` decodes with in-flight switches offered by ``source`` inside the block."""
    before, backend.version_source = backend.version_source, source
    try:
        yield
    finally:
        backend.version_source = before


def relabel(batch: RolloutBatch, spans_of: Callable[[int, RolloutSample], Points | None]) -> RolloutBatch:
    """``batch`` with sample ``i``'s spans replaced by ``spans_of(i, sample)`` (None: one version)."""
    samples = []
    for i, s in enumerate(batch.samples):
        points = spans_of(i, s)
        spans = None if points is None else as_spans(points)
        samples.append(s.model_copy(update={"spans": spans}))
    return batch.model_copy(update={"samples": samples})


def points(sample: RolloutSample) -> Points | None:
    """``sample``'s spans as ``(policy_version, first_token)`` pairs (None: one version)."""
    return None if sample.spans is None else [(s.policy_version, s.first_token) for s in sample.spans]


@torch.no_grad()
def decode_switching_at(
    backend: HFBackend,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    params: SamplingParams,
    switch: VersionSwitch,
    position: int,
    *,
    reseed_at: int | None = None,
    load: bool = True,
) -> list[Completion]:
    """Decode every row with the loaded weights up to completion ``position``, then load ``switch``'s
    weights (keeping every row's KV cache) and decode the rest: the weights change before the
    forward that samples token ``position`` (whose input is token ``position - 1``), as in
    ``HFBackend.generate``'s switch, but wherever that falls in a proof chunk. With ``switch.nonce``
    every row samples with ``span_seed(seed, nonce)`` from ``reseed_at`` (default ``position``) on,
    as after an announced switch; ``load`` False keeps the loaded weights (a forged version: the
    old weights drawing with the new version's seeds).

    Token by token through ``backend.extend`` (one sequence at a time, one KV cache per row), with
    the sampler, stop rule, proofs and log-probs of ``HFBackend.generate``. ``Completion.spans`` is
    left empty: what to claim is the caller's forgery.
    """
    late = (position if reseed_at is None else reseed_at) if switch.nonce is not None else None
    rows = [
        _Row(backend, prompt, seed, params, None if late is None else (late, reseeded(int(seed), [switch.nonce or 0])))
        for prompt, seed in zip(prompts, seeds, strict=True)
    ]
    for row in rows:
        row.run(backend, params, until=position)
    if load:
        backend.load_weights(switch.path, switch.version)
    for row in rows:
        row.run(backend, params, until=params.max_new_tokens)
    return [row.completion(backend) for row in rows]


class MidChunkSwitch:
    """A generation backend (``generate`` only, plus what ``worker.rollout`` reads) that decodes with
    :func:`decode_switching_at` and states ``start_version``: the batch a mid-chunk switch produces."""

    def __init__(
        self,
        backend: HFBackend,
        switch: VersionSwitch,
        position: int,
        start_version: int,
        *,
        reseed_at: int | None = None,
        load: bool = True,
    ) -> None:
        self.backend, self.switch, self.position, self.start_version = backend, switch, position, start_version
        self.reseed_at, self.load = reseed_at, load
        self.tokenizer, self.eos_token_ids = backend.tokenizer, backend.eos_token_ids

    @property
    def policy_version(self) -> int:
        return self.start_version

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams) -> list[Completion]:
        if self.backend.policy_version != self.start_version:
            raise GenerationError(f"the backend holds v{self.backend.policy_version}, not the lease's v{self.start_version}")
        return decode_switching_at(
            self.backend, prompts, seeds, params, self.switch, self.position, reseed_at=self.reseed_at, load=self.load
        )

    def prefill(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[Prefill]:
        return self.backend.prefill(prompts, completions)

    def load_weights(self, path: str | Path, policy_version: int) -> None:
        self.backend.load_weights(path, policy_version)


class _Row:
    """One sequence of :func:`decode_switching_at`: its cache, last hidden state and outputs so far."""

    def __init__(
        self, backend: HFBackend, prompt: Sequence[int], seed: int, params: SamplingParams, late: tuple[int, int] | None
    ) -> None:
        self.prompt, self.seed = tuple(int(t) for t in prompt), int(seed)
        self.late = late  # (position, seed): the seed from that completion position on (an announced switch)
        hidden, self.cache = backend.extend(self.prompt, None)
        self.hidden = hidden[-1:]
        self.tokens: list[int] = []
        self.fed = 0  # tokens whose forward has run (the last sampled one waits for the next step's weights)
        self.logprobs: list[float] = []
        self.rows: list[torch.Tensor] = []
        self.finish: FinishReason | None = None
        self.matcher = StopStringMatcher(backend.tokenizer, params.stop) if any(params.stop) else None

    def run(self, backend: HFBackend, params: SamplingParams, *, until: int) -> None:
        while self.finish is None and len(self.tokens) < min(until, params.max_new_tokens):
            seed = self.late[1] if self.late is not None and len(self.tokens) >= self.late[0] else self.seed
            seeds = torch.tensor([seed], dtype=torch.long, device=backend.device)
            if len(self.tokens) > self.fed:  # the forward of the last token, with the weights loaded now
                self.hidden, self.cache = backend.extend([self.tokens[-1]], self.cache)
                self.fed = len(self.tokens)
            logits = backend.head(self.hidden)
            token = sample_next(logits, seeds, len(self.tokens), params.temperature)
            self.rows.append(self.hidden[0])
            self.logprobs.append(float(token_logprobs(logits, token, params.temperature)[0]))
            self.tokens.append(int(token[0]))
            if self.tokens[-1] in backend.eos_token_ids:
                self.finish = "eos"
            elif self.matcher is not None and self.matcher.append(self.tokens[-1]):
                self.finish = "stop"

    def completion(self, backend: HFBackend) -> Completion:
        return Completion(
            prompt_tokens=self.prompt,
            completion_tokens=tuple(self.tokens),
            logprobs=tuple(self.logprobs),
            proofs=build_proofs(torch.stack(self.rows)),
            seed=self.seed,
            finish_reason=self.finish or "length",
            text=completion_text(backend.tokenizer, self.tokens),
        )
