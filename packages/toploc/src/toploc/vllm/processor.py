"""toploc's seeded Gumbel-max sampler as a vLLM v1 logits processor (V1 model runner API).

For every row of a request whose ``SamplingParams.extra_args["toploc"]`` holds ``SamplerArgs``
(rows of other requests are untouched), at generated-token index ``t = len(output_token_ids)``:

    token  = toploc.sample_tokens(logits_row, seed, [sequence_id(t)], [t], temperature)
    logp   = log_softmax(logits_row / T)[token]          (T = 1 when greedy)
    logits_row <- -inf everywhere except 0 at ``token``  (vLLM's sampler can only pick it)

where ``sequence_id(t)`` is the request's ``sequence_id`` unless its trace was reseeded from an
index ``<= t`` (``RequestTrace.reseed``: an in-flight switch's per-span seed). So the tokens vLLM
emits are exactly what ``toploc.check_sampling`` expects from the same logits. The draw is Gumbel-max, an exact sample of softmax(logits / T): the processor never
changes a token's probability, only chooses which token the (one) draw lands on. vLLM's
reported log-probs in its default ``logprobs_mode="raw_logprobs"`` are taken before any logits
processor (so at T = 1, unforced); the processed modes would show the forced one-hot row, and
no mode reports the unforced distribution at another temperature, hence ``logp`` is computed
here from the same fp32 row and delivered with the trace (``CheckableOutput.logprobs``).

The same step's final-norm hidden states (``capture.HIDDEN``, same rows, same order) go to the
request's ``RequestTrace`` for its proofs.

Requests that set anything else that shapes the distribution (penalties, logit bias, min
tokens, bad words, allowed tokens, structured outputs, top-k/top-p/min-p, n > 1) are refused
at admission: vLLM applies some of them before this processor (changing the distribution the
draw is checked against) and others after it (where they would be silently ignored).
Pitfall: this is the V1 model runner's interface; vLLM's Model Runner V2 (the GPU default when
Triton is present) has another one: run with ``VLLM_USE_V2_MODEL_RUNNER=0`` (``engine.checkable_llm``
sets it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm import SamplingParams
from vllm.config import VllmConfig
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

import toploc
from toploc.vllm.capture import HIDDEN
from toploc.vllm.trace import TRACES, RequestTrace, SamplerArgs


def _incompatible(params: SamplingParams) -> list[str]:
    """Names of the request's settings that would alter or bypass the seeded draw."""
    checks = {
        "n": params.n != 1,
        "presence_penalty": params.presence_penalty != 0.0,
        "frequency_penalty": params.frequency_penalty != 0.0,
        "repetition_penalty": params.repetition_penalty != 1.0,
        "logit_bias": bool(params.logit_bias),
        "min_tokens": params.min_tokens > 0,
        "bad_words": bool(params.bad_words),
        "allowed_token_ids": params.allowed_token_ids is not None,
        "structured_outputs": params.structured_outputs is not None,
        "top_k": params.top_k not in (0, -1),
        "top_p": params.top_p != 1.0,
        "min_p": params.min_p != 0.0,
        "thinking_token_budget": params.thinking_token_budget is not None,
    }
    return [name for name, bad in checks.items() if bad]


@dataclass
class _Row:
    """A tracked batch slot: the request's trace and its live output-token list."""

    trace: RequestTrace
    output_token_ids: list[int]


class SeededSampler(LogitsProcessor):
    """Pass the class to ``vllm.LLM(logits_processors=[SeededSampler])`` (or its dotted name to ``vllm serve``)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        args = SamplerArgs.from_extra_args(sampling_params.extra_args)  # raises ValueError if malformed
        if args is None:
            return
        bad = _incompatible(sampling_params)
        if bad:
            raise ValueError(
                f"toploc's seeded sampler draws from softmax(logits / T) itself; unset {', '.join(bad)} "
                "(they would change or bypass the draw that validators recompute)"
            )

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._rows: dict[int, _Row] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it picks the token, so it must run for greedy requests too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        # Documented order: removed, added, moved.
        for index in batch_update.removed:
            self._rows.pop(index, None)
        for index, params, _prompt, output_token_ids in batch_update.added:
            args = SamplerArgs.from_extra_args(params.extra_args) if params is not None else None
            if args is None:
                self._rows.pop(index, None)
            else:
                self._rows[index] = _Row(TRACES.open(args), output_token_ids)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self._rows.pop(a, None), self._rows.pop(b, None)
            if row_a is not None:
                self._rows[b] = row_a
            if row_b is not None and direction == MoveDirectionality.SWAP:
                self._rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        hidden = HIDDEN.take(logits.shape[0])
        groups: dict[tuple[int, float], list[int]] = {}
        for index, row in sorted(self._rows.items()):
            if index < logits.shape[0]:
                groups.setdefault((row.trace.args.seed, row.trace.args.temperature), []).append(index)
        for (seed, temperature), indices in groups.items():
            rows = [self._rows[i] for i in indices]
            index_tensor = torch.tensor(indices, device=logits.device)
            # The usual case, every row of the step in one group, works on a view: no [B, V] copies.
            contiguous = indices == list(range(indices[0], indices[0] + len(indices)))
            block = logits.narrow(0, indices[0], len(indices)) if contiguous else logits.index_select(0, index_tensor)
            positions = [len(row.output_token_ids) for row in rows]
            sequence_ids = torch.tensor(
                [row.trace.sequence_id_at(position) for row, position in zip(rows, positions, strict=True)],
                device=logits.device,
            )
            tokens = toploc.sample_tokens(
                block, seed, sequence_ids, torch.tensor(positions, device=logits.device), temperature
            )
            scaled = block.float() if temperature in (0.0, 1.0) else block.float() / temperature
            logprobs = torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]
            # Force the draw: -inf everywhere but 0 at the token (in place when block is a view).
            forced = block.fill_(float("-inf")) if contiguous else torch.full_like(block, float("-inf"))
            forced.scatter_(1, tokens[:, None], 0.0)
            if not contiguous:
                logits.index_copy_(0, index_tensor, forced)
            hidden_rows = hidden.index_select(0, index_tensor).to(torch.bfloat16) if hidden is not None else None
            for i, (row, position, token, logprob) in enumerate(
                zip(rows, positions, tokens.tolist(), logprobs.tolist(), strict=True)
            ):
                hidden_row = hidden_rows[i] if hidden_rows is not None else None
                row.trace.record(position, token, logprob, hidden_row)
        return logits
