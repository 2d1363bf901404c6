"""Per-request state of a checkable vLLM request: its sampler arguments and what each step produced.

No vLLM import here: the engine-side pieces (``processor``, ``engine``) feed these objects, and
tests can drive them directly.

A request's trace receives one call per engine step that computed logits for it:
``record(position, token, logprob, hidden_row)``, where ``position`` is the number of tokens
the request had generated before this step (``len(output_token_ids)``). A step whose sampled
token vLLM throws away (a partial chunk of a chunked prefill) reports the same position again
as the step after it, so a repeated position *replaces* the previous entry. Hidden rows are
therefore held back by one step before they go into the request's ``ProofBuilder``: a row is
committed only once a later position shows that its token was kept, and ``finish`` commits the
last one after checking the engine's final token count. Any other sequence of positions (a gap,
a step backwards) marks the trace broken; ``finish`` then raises instead of returning proofs
that could be misaligned with the tokens.

A trace may change its request's sequence id from a generated-token index on (``reseed``): an
in-flight weight update with a fresh per-span seed, where every token from a proof-chunk boundary
on is drawn with the new id. Only the future can be reseeded.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toploc.streaming import ProofBuilder

EXTRA_ARGS_KEY = "toploc"
"""``SamplingParams.extra_args[EXTRA_ARGS_KEY]`` holds a request's ``SamplerArgs`` as a dict."""


class TraceError(RuntimeError):
    """A checkable request's outputs cannot be trusted to match its proofs or its seeded draws."""


@dataclass(frozen=True)
class SamplerArgs:
    """What makes one request checkable.

    Attributes:
        key: unique per request (results are looked up by it).
        seed: the toploc sampler seed (``toploc.sample_tokens(..., seed=seed, ...)``).
        sequence_id: the request's toploc sequence id; distinct per request sharing a seed.
        temperature: T >= 0 of the seeded draw (0 = greedy). vLLM's own temperature is unused.
        proofs: capture final-norm hidden states and build toploc proofs.
        decode_batching_size: tokens per proof (32, INTELLECT-2's value).
        topk: committed values per proof (128); at most the hidden size times the rows of a chunk.
    """

    key: str
    seed: int
    sequence_id: int
    temperature: float = 1.0
    proofs: bool = True
    decode_batching_size: int = 32
    topk: int = 128

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("toploc sampler args need a non-empty key")
        if not self.temperature >= 0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.decode_batching_size < 1 or self.topk < 1:
            raise ValueError("decode_batching_size and topk must be >= 1")

    def to_extra_args(self) -> dict[str, Any]:
        """Plain JSON-able dict for ``SamplingParams.extra_args[EXTRA_ARGS_KEY]``."""
        return {
            "key": self.key,
            "seed": self.seed,
            "sequence_id": self.sequence_id,
            "temperature": self.temperature,
            "proofs": self.proofs,
            "decode_batching_size": self.decode_batching_size,
            "topk": self.topk,
        }

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, Any] | None) -> SamplerArgs | None:
        """Parse ``extra_args[EXTRA_ARGS_KEY]``; ``None`` when the request is not checkable.

        Raises:
            ValueError: the entry exists but is malformed (unknown or missing fields, wrong types).
        """
        if not extra_args or EXTRA_ARGS_KEY not in extra_args:
            return None
        raw = extra_args[EXTRA_ARGS_KEY]
        if not isinstance(raw, Mapping):
            raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] must be a dict, got {type(raw).__name__}")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown toploc sampler args: {sorted(unknown)}")
        for name in ("seed", "sequence_id", "decode_batching_size", "topk"):
            if name in raw and (not isinstance(raw[name], int) or isinstance(raw[name], bool)):
                raise ValueError(f"toploc sampler arg {name!r} must be an int, got {raw[name]!r}")
        try:
            return cls(
                key=str(raw["key"]),
                seed=raw["seed"],
                sequence_id=raw["sequence_id"],
                temperature=float(raw.get("temperature", 1.0)),
                proofs=bool(raw.get("proofs", True)),
                decode_batching_size=raw.get("decode_batching_size", 32),
                topk=raw.get("topk", 128),
            )
        except KeyError as exc:
            raise ValueError(f"toploc sampler args miss {exc.args[0]!r}") from None


@dataclass(frozen=True)
class CheckableOutput:
    """One finished request, ready for a verifier.

    Attributes:
        token_ids: the generated tokens (exactly the seeded draws).
        logprobs: ``log_softmax(logits / T)[token]`` per token, fp32 (T = 1 when greedy), from the
            logits before the draw was forced: the unmodified distribution at the sampling temperature.
        proofs: concatenated toploc proofs (``2 + 2·topk`` bytes per ``decode_batching_size`` tokens);
            ``b""`` without proofs or tokens. Row t is the hidden state token t was sampled from.
        args: the request's sampler arguments.
        discarded_steps: engine steps whose draw vLLM threw away (partial prefill chunks).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    proofs: bytes
    args: SamplerArgs
    discarded_steps: int = 0


class RequestTrace:
    """Tokens, log-probs and committed hidden rows of one request, fed step by step (see module doc)."""

    def __init__(self, args: SamplerArgs) -> None:
        self.args = args
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.error: str | None = None
        self.replaced = 0  # steps whose token vLLM discarded (partial prefill chunks), for tests and logs
        self._builder: ProofBuilder | None = None
        self._committed = 0  # rows in the builder; the held-back row is for position len(tokens) - 1
        self._held: torch.Tensor | None = None
        self._reseeds: list[tuple[int, int]] = []  # (from position, sequence id), positions increasing

    def reseed(self, position: int, sequence_id: int) -> None:
        """Draw the tokens at generated-token index ``position`` and later with ``sequence_id``.

        Raises:
            ValueError: ``position`` lies before a token already drawn or before an earlier reseed.
        """
        if position < len(self.tokens) or (self._reseeds and position < self._reseeds[-1][0]):
            raise ValueError(
                f"cannot reseed from token {position}: {len(self.tokens)} tokens are drawn"
                + (f", last reseed from {self._reseeds[-1][0]}" if self._reseeds else "")
            )
        self._reseeds.append((position, sequence_id))

    def sequence_id_at(self, position: int) -> int:
        """The sequence id that draws the token at generated-token index ``position``."""
        sequence_id = self.args.sequence_id
        for start, reseeded in self._reseeds:
            if position >= start:
                sequence_id = reseeded
        return sequence_id

    def fail(self, message: str) -> None:
        """Mark the trace broken (first message wins); ``finish`` will raise it."""
        if self.error is None:
            self.error = message

    def record(self, position: int, token: int, logprob: float, hidden_row: torch.Tensor | None) -> None:
        """One step's draw for this request at generated-token index ``position``."""
        if self.error is not None:
            return
        if position == len(self.tokens):
            if self._held is not None:
                self._commit(self._held)
            self.tokens.append(token)
            self.logprobs.append(logprob)
        elif position == len(self.tokens) - 1:  # the previous step's token was discarded: replace it
            self.tokens[position] = token
            self.logprobs[position] = logprob
            self.replaced += 1
        else:
            self.fail(f"step at token position {position} after {len(self.tokens)} tokens (request resumed from scratch?)")
            return
        if self.args.proofs:
            if hidden_row is None:
                self.fail("no hidden states were captured: call toploc.vllm.attach(llm) before generating")
            self._held = hidden_row

    @torch.inference_mode()  # rows and the builder's buffer are born in vLLM's inference mode
    def _commit(self, row: torch.Tensor) -> None:
        if self._builder is None:
            self._builder = ProofBuilder(1, row.shape[-1], self.args.decode_batching_size, self.args.topk)
        self._builder.add(row.reshape(1, -1))
        self._committed += 1

    def finish(self, emitted: Sequence[int]) -> CheckableOutput:
        """Close the trace against the tokens vLLM returned for the request.

        Raises:
            TraceError: the trace is broken, or vLLM emitted other tokens than the seeded draws
                (something else changed the logits after the sampler), or the proofs fail to build.
        """
        n = len(emitted)
        if self.error is None and len(self.tokens) < n:
            self.fail(f"vLLM emitted {n} tokens but the sampler drew {len(self.tokens)}")
        if self.error is None:
            bad = [i for i in range(n) if int(emitted[i]) != self.tokens[i]]
            if bad:
                self.fail(f"vLLM emitted tokens other than the seeded draws at positions {bad[:8]}")
        if self.error is not None:
            raise TraceError(f"request {self.args.key}: {self.error}")
        proofs = b""
        if self.args.proofs and n:
            if self._held is not None and self._committed == n - 1:
                self._commit(self._held)
            if self._committed != n or self._builder is None:
                raise TraceError(f"request {self.args.key}: {self._committed} hidden rows for {n} tokens")
            try:
                with torch.inference_mode():
                    proofs = self._builder.finish()[0]
            except ValueError as exc:  # ActivationError: NaN/Inf rows, or topk > rows of a short chunk
                raise TraceError(f"request {self.args.key}: cannot build proofs: {exc}") from exc
        self._held = None
        return CheckableOutput(tuple(self.tokens[:n]), tuple(self.logprobs[:n]), proofs, self.args, self.replaced)


class TraceRegistry:
    """The process's open traces by key: created by the logits processor, taken by ``collect``.

    One registry per process, shared by every engine in it (keys are unique per request).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._traces: dict[str, RequestTrace] = {}

    def open(self, args: SamplerArgs) -> RequestTrace:
        """The trace for ``args.key``, created on first sight (a resumed request keeps its trace)."""
        with self._lock:
            trace = self._traces.get(args.key)
            if trace is None:
                trace = self._traces[args.key] = RequestTrace(args)
            elif trace.args != args:
                trace.fail("two requests used the same toploc key with different arguments")
            return trace

    def reseed(self, key: str, position: int, sequence_id: int) -> None:
        """``RequestTrace.reseed`` of the open trace of ``key`` (``TraceError`` if none is open: the
        engine has not scheduled the request yet, or it was taken)."""
        with self._lock:
            trace = self._traces.get(key)
        if trace is None:
            raise TraceError(f"request {key} has no open trace to reseed")
        trace.reseed(position, sequence_id)

    def take(self, key: str) -> RequestTrace | None:
        """Remove and return the trace of ``key`` (``None`` if the engine never scheduled it)."""
        with self._lock:
            return self._traces.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._traces)


TRACES = TraceRegistry()
