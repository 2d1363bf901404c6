"""The transformers generation backend: :class:`HFBackend`, a manual decode loop over a KV cache.

It implements :class:`prime_rl.inference.contract.GenerationBackend` (seeded toploc sampler,
proofs of the decode hidden states, fp32 log-probs, in-place weight reload) and is the
validator's recompute engine (``prefill``). The contract's names are re-exported here
(``__all__``) for the code that imports them from this module.

:func:`sample_next` is the decode loop's per-step draw (the contract's sampling rule for one
completion position of a batch); tests and benchmarks replace it here to play a steering worker.
:func:`token_logprobs` (the contract's, re-exported) is the log-prob rule over fp32 logits, shared by
the decode loop and the validator's recompute.

Decode steps (``HFBackend(decode=...)``): ``"dynamic"`` grows transformers' ``DynamicCache`` by
one column a step (every step has new shapes); ``"static"`` writes into KV buffers sized for the
whole batch (prompt + ``max_new_tokens``) in place, under a 4D mask updated in place, so every
step has the same shapes and addresses (and an SDPA model's static steps attend without
``repeat_kv``); the steps are in :mod:`prime_rl.inference.decode_steps`; ``"graph"`` replays that static step as one
CUDA graph, without the launch cost of its kernels (hundreds of launches a step for Qwen2-0.5B's
shape, whose host time exceeds the GPU time: ``benchmarks/results/gpu_decode_profile_h200.log``). ``"auto"``: ``"graph"`` on CUDA for models
whose layers all attend fully through SDPA or eager attention (a sliding-window layer needs its
own mask), else ``"dynamic"``. A graph that cannot be captured falls back to the static step,
with a warning and the reason in ``HFBackend.graph_error``. Measured on a GPU:
``benchmarks/results/gpu_check.md``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import toploc
from prime_rl.devices import torch_dtype
from prime_rl.inference.contract import (
    PROOF_CHUNK,
    SAMPLER_SEED,
    Completion,
    FinishReason,
    GenerationBackend,
    GenerationError,
    Prefill,
    SamplingParams,
    VersionSource,
    VersionSwitch,
    build_proofs,
    completion_text,
    proof_size,
    proof_topk,
    token_logprobs,
    tokenizer_eos_ids,
    verify_proofs,
)
from prime_rl.inference.decode_steps import DynamicStep, StaticStep, decode_attention
from prime_rl.inference.stop_strings import StopStringMatcher
from prime_rl.inference.switching import RowSpans
from prime_rl.weights.files import load_policy_into

__all__ = [
    "PROOF_CHUNK",
    "SAMPLER_SEED",
    "Completion",
    "FinishReason",
    "GenerationBackend",
    "GenerationError",
    "HFBackend",
    "Prefill",
    "SamplingParams",
    "VersionSource",
    "VersionSwitch",
    "build_proofs",
    "proof_size",
    "proof_topk",
    "sample_next",
    "token_logprobs",
    "verify_proofs",
]


def sample_next(logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float) -> torch.Tensor:
    """Draw one token per row with toploc's seeded sampler (greedy when ``temperature == 0``).

    ``logits``: ``[B, V]``; ``seeds``: ``[B]`` int64 per-sample seeds; ``position``: the completion
    position of every row. Returns ``[B]`` int64 on the logits' device.
    """
    positions = torch.full_like(seeds, position)
    return toploc.sample_tokens(logits, SAMPLER_SEED, seeds, positions, temperature=temperature)


DecodeMode = Literal["auto", "dynamic", "static", "graph"]
DECODE_MODES: tuple[DecodeMode, ...] = ("auto", "dynamic", "static", "graph")


class HFBackend:
    """The default backend: a transformers causal LM with a manual KV-cache decode loop.

    ``model_path`` is a ``from_pretrained`` directory with the tokenizer; ``dtype`` is
    ``"float32"`` or ``"bfloat16"``; ``max_batch_size`` bounds sequences per decode batch;
    ``sync_every`` is how many decode steps run between the host's reads of the sampled tokens
    (16: two device-to-host copies per 16 tokens instead of several per token; outputs do not
    depend on it, only how far past a batch's last stop the device may run). ``decode`` picks the
    decode step (module docstring): ``"auto"``, ``"dynamic"``, ``"static"`` or ``"graph"`` (CUDA).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        device: str | torch.device = "cpu",
        max_batch_size: int = 64,
        policy_version: int = 0,
        model: Any = None,
        tokenizer: Any = None,
        sync_every: int = 16,
        decode: DecodeMode = "auto",
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        if decode == "graph" and torch.device(device).type != "cuda":
            raise ValueError("decode='graph' replays CUDA graphs: it needs a CUDA device")
        weights_dtype = torch_dtype(dtype)  # an unknown name fails before any file is read
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model_path))
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=weights_dtype)
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.sync_every = sync_every
        self._policy_version = policy_version
        self._decoder = self.model.get_decoder()
        self._lm_head = self.model.get_output_embeddings()
        self.eos_token_ids = tokenizer_eos_ids(self.tokenizer)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.decode = self._resolve_decode(decode)
        self.graph_error: str | None = None  # why a CUDA graph could not be captured (then: static steps)
        self.version_source: VersionSource | None = None
        """In-flight weight updates (``workers.inflight_updates``): where :meth:`generate` finds a newer
        committed version to switch to at a proof-chunk boundary; None: every batch keeps its version."""

    def _resolve_decode(self, decode: DecodeMode) -> DecodeMode:
        """``"auto"`` -> ``"graph"`` on CUDA where the static step applies, else ``"dynamic"``;
        ``"static"``/``"graph"`` for a model the static step cannot serve -> ValueError."""
        config = getattr(self.model, "config", None)  # None: not a transformers model (a test's stand-in)
        layer_types = getattr(config, "layer_types", None) or ["full_attention"]
        fits = (
            config is not None
            and all(kind == "full_attention" for kind in layer_types)
            and getattr(config, "_attn_implementation", None) in ("sdpa", "eager")
            and not getattr(config, "is_encoder_decoder", False)
        )
        if decode == "auto":
            return "graph" if fits and self.device.type == "cuda" else "dynamic"
        if decode != "dynamic" and not fits:
            raise ValueError(
                f"decode={decode!r} needs every layer to attend fully through 'sdpa' or 'eager' attention; "
                f"this model has layer types {sorted(set(layer_types))} and attention "
                f"{getattr(config, '_attn_implementation', None)!r}: use decode='dynamic'"
            )
        return decode

    @property
    def policy_version(self) -> int:
        return self._policy_version

    def load_weights(self, path: str | Path, policy_version: int) -> None:
        load_policy_into(self.model, path)
        self._policy_version = policy_version

    # -- generation --------------------------------------------------------------------------
    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        out: list[Completion] = []
        # A switch inside one decode batch would start the next one on the newer version, while every
        # sample must start on the lease's: in-flight only when the call fits one decode batch.
        source = self.version_source if len(prompts) <= self.max_batch_size else None
        for start in range(0, len(prompts), self.max_batch_size):
            stop = start + self.max_batch_size
            out.extend(self._generate_batch(prompts[start:stop], seeds[start:stop], params, source))
        return out

    def _prefill_prompts(
        self, prompts: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]:
        """Prefill each distinct prompt once and give every row a copy of its prompt's KV cache.

        A GRPO group repeats its prompt ``group_size`` times; the rows after this see identical
        inputs to a per-row prefill. Returns, per row: the last prompt position's final hidden
        state ``[B, H]``, the left-padded attention mask and position ids ``[B, P]``, and the cache.
        """
        distinct: dict[tuple[int, ...], int] = {}
        row_of = [distinct.setdefault(tuple(int(t) for t in p), len(distinct)) for p in prompts]
        ids, mask = self._left_pad(list(distinct))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        last = self._decoder(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        ).last_hidden_state[:, -1]
        if len(distinct) < len(prompts):
            index = torch.tensor(row_of, dtype=torch.long, device=self.device)
            cache.reorder_cache(index)  # type: ignore[arg-type]
            last, mask, positions = last[index], mask[index], positions[index]
        return last, mask, positions, cache

    def _left_pad(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                ids[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
                mask[i, width - len(row) :] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        params: SamplingParams,
        source: VersionSource | None = None,
    ) -> list[Completion]:
        """The decode loop. The device runs ahead of the host: tokens, log-probs and hidden rows
        stay in preallocated device buffers, and the host reads them once every ``sync_every``
        steps (two copies), ends rows at EOS or a stop string there, and hands the window's rows
        of the rows still running to the proof builder. Rows ended inside a window (and a batch
        that ended early) cost at most ``sync_every - 1`` extra decode steps, never other output.

        In-flight updates (``source``): where a settled window ends on a proof-chunk boundary ``b``
        and ``source`` has a newer version, its weights are copied in place before the forward of
        token ``b - 1``, which samples token ``b``; the KV cache is kept (keep-KV), and every row
        still running records the span ``(version, b)``. The rule is "the first chunk boundary
        after the version is on disk and committed" (``docs/inflight.md`` section 4).
        """
        if any(len(p) == 0 for p in prompts):
            raise GenerationError("every prompt needs at least one token")
        batch, limit = len(prompts), params.max_new_tokens
        hidden, prompt_mask, positions, cache = self._prefill_prompts(prompts)
        hidden_size = hidden.shape[-1]
        step_decoder = self._step_decoder(prompt_mask, positions, cache, limit, hidden.dtype)
        del cache  # the step holds it as long as it needs it (a static step: until its first step)
        seed_tensor = torch.tensor([int(x) for x in seeds], dtype=torch.long, device=self.device)
        sampled_tokens = torch.empty((batch, limit), dtype=torch.long, device=self.device)
        sampled_logprobs = torch.empty((batch, limit), dtype=torch.float32, device=self.device)
        window_rows = torch.empty(
            (batch, min(self.sync_every, limit), hidden_size), dtype=hidden.dtype, device=self.device
        )
        builder = toploc.ProofBuilder(batch, hidden_size, PROOF_CHUNK, proof_topk(hidden_size))
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finish: list[FinishReason | None] = [None] * batch
        # Each row's stop strings are checked on its last few tokens, not on a decode of them all.
        matchers = None
        if any(params.stop):
            matchers = [StopStringMatcher(self.tokenizer, params.stop) for _ in range(batch)]
        rows = RowSpans(seeds, self._policy_version)
        with decode_attention(self.model, step_decoder):
            window_start = 0
            for step in range(limit):
                logits = self._lm_head(hidden).float()
                sampled = sample_next(logits, seed_tensor, step, params.temperature)
                sampled_tokens[:, step] = sampled
                sampled_logprobs[:, step] = token_logprobs(logits, sampled, params.temperature)
                window_rows[:, step - window_start] = hidden
                if step + 1 - window_start == window_rows.shape[1] or step + 1 == limit:
                    kept = self._settle_window(
                        sampled_tokens[:, window_start : step + 1], sampled_logprobs[:, window_start : step + 1],
                        tokens, logprobs, finish, matchers,
                    )  # fmt: skip
                    builder.extend(window_rows[:, : step + 1 - window_start], kept)
                    window_start = step + 1
                    if all(f is not None for f in finish):
                        break
                    if source is not None and rows.versions < source.max_versions and window_start % PROOF_CHUNK == 0:
                        self._switch(source, window_start, finish, rows, limit, seed_tensor)
                if step + 1 == limit:
                    break
                hidden = step_decoder(sampled, step)
        proofs = builder.finish()
        return [
            Completion(
                prompt_tokens=tuple(int(t) for t in prompts[i]),
                completion_tokens=tuple(tokens[i]),
                logprobs=tuple(logprobs[i]),
                proofs=proofs[i],
                seed=int(seeds[i]),
                finish_reason=finish[i] or "length",
                text=completion_text(self.tokenizer, tokens[i]),
                spans=rows.spans(i),
            )
            for i in range(batch)
        ]

    def _switch(
        self, source: VersionSource, boundary: int, finish: Sequence[FinishReason | None], rows: RowSpans,
        limit: int, seed_tensor: torch.Tensor,
    ) -> None:  # fmt: skip
        """At completion position ``boundary`` (a proof-chunk boundary, every row settled): load the
        newer version ``source`` offers, if any, and open its span on every running row
        (``inference/switching.py``: with the switch's nonce, each running row is reseeded)."""
        switch = source.newer(self._policy_version, boundary) if boundary < limit else None
        if switch is not None:
            self.load_weights(switch.path, switch.version)
            for row in rows.switch(switch, {row: boundary for row, done in enumerate(finish) if done is None}):
                seed_tensor[row] = rows.seeds[row]

    def _step_decoder(
        self, prompt_mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache, limit: int, dtype: torch.dtype
    ) -> DynamicStep | StaticStep:
        """The decode step of one batch (``self.decode``), after the prompts' prefill into ``cache``."""
        if self.decode == "dynamic" or limit <= 1:
            return DynamicStep(self._decoder, prompt_mask, positions, cache, limit)
        use_graph = self.decode == "graph" and self.graph_error is None
        return StaticStep(
            self._decoder, prompt_mask, positions, cache, limit, dtype, use_graph=use_graph, on_error=self._graph_failed
        )

    def _graph_failed(self, error: str) -> None:
        """A batch gave up the CUDA graph (or the static step): later batches do not try the graph."""
        self.graph_error = error
        warnings.warn(
            f"the fast decode step was given up ({error}); this batch decodes with a slower step "
            "(same rule, more launch overhead)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _settle_window(
        self,
        window_tokens: torch.Tensor,
        window_logprobs: torch.Tensor,
        tokens: list[list[int]],
        logprobs: list[list[float]],
        finish: list[FinishReason | None],
        matchers: list[StopStringMatcher] | None,
    ) -> list[int]:
        """Append one window ``[B, n]`` of sampled tokens and log-probs to the running rows, in place.

        A row ends at its first EOS token or at the first token that completes a stop string (both
        kept); ``finish`` records why. ``matchers``: each row's stop-string check, fed every token it
        keeps but an EOS (None: no stop strings). Returns how many of the window's positions each
        row kept (0 for rows that had ended before the window).
        """
        new_tokens, new_logprobs = window_tokens.tolist(), window_logprobs.tolist()
        kept = [0] * len(tokens)
        for i, row in enumerate(new_tokens):
            for j, token in enumerate(row):
                if finish[i] is not None:
                    break
                tokens[i].append(token)
                logprobs[i].append(new_logprobs[i][j])
                kept[i] = j + 1
                if token in self.eos_token_ids:
                    finish[i] = "eos"
                elif matchers is not None and matchers[i].append(token):
                    finish[i] = "stop"
        return kept

    # -- verification ------------------------------------------------------------------------
    @torch.no_grad()
    def extend(self, tokens: Sequence[int], cache: DynamicCache | None) -> tuple[torch.Tensor, DynamicCache]:
        """Feed ``tokens`` after what ``cache`` holds (None: from position 0) with the loaded weights.

        Returns the final hidden states ``[len(tokens), H]`` (model dtype) and the grown cache: the
        validator's chained forwards over a sample's version spans (keep-KV, ``validator/spans.py``),
        one call per span, each with that span's version loaded.
        """
        if not tokens:
            raise GenerationError("extend needs at least one token")
        cache = cache if cache is not None else DynamicCache()
        start = cache.get_seq_length()
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(tokens), device=self.device)[None]
        hidden = self._decoder(
            input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True
        ).last_hidden_state[0]
        return hidden, cache

    @torch.no_grad()
    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[n, V]`` of final hidden states ``[n, H]`` under the loaded weights."""
        return self._lm_head(hidden).float()

    @torch.no_grad()
    def prefill(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[Prefill]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        out: list[Prefill] = []
        for start in range(0, len(prompts), self.max_batch_size):
            chunk = range(start, min(start + self.max_batch_size, len(prompts)))
            if any(len(prompts[i]) == 0 or len(completions[i]) == 0 for i in chunk):
                raise GenerationError("prefill needs a non-empty prompt and completion")
            out.extend(self._prefill_chunk([prompts[i] for i in chunk], [completions[i] for i in chunk]))
        return out

    def _prefill_chunk(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[Prefill]:
        """Two forward passes: each distinct prompt once (left padded, KV cache copied to its rows),
        then every completion at once (right padded after the prompt). Same hidden states as one
        prefill of prompt + completion, up to float rounding, and far fewer prompt tokens per group."""
        batch = len(prompts)
        last, mask, positions, cache = self._prefill_prompts(prompts)
        width = max(len(c) for c in completions)
        comp_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        comp_mask = torch.zeros((batch, width), dtype=torch.long)
        for row, completion in enumerate(completions):
            comp_ids[row, : len(completion)] = torch.tensor(list(completion), dtype=torch.long)
            comp_mask[row, : len(completion)] = 1
        comp_positions = positions[:, -1:] + 1 + torch.arange(width, device=self.device)[None]
        hidden = self._decoder(
            input_ids=comp_ids.to(self.device),
            attention_mask=torch.cat([mask, comp_mask.to(self.device)], dim=1),
            position_ids=comp_positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        # Completion token t was sampled from the state one position earlier: the prompt's last
        # state for t = 0, then the completion's own states.
        rows = torch.cat([last[:, None], hidden[:, :-1]], dim=1)
        out = []
        for row, completion in enumerate(completions):
            h = rows[row, : len(completion)]
            out.append(Prefill(hidden=h.clone(), logits=self._lm_head(h).float()))
        return out
