"""Generation backends: sample completions with verifiable randomness and capture TOPLOC proofs.

A backend turns prompt token ids into completions for an inference worker, and recomputes hidden
states and logits by one prefill for the validator. Every backend must honour the same contract,
because the validator re-derives everything a worker claims:

* **Sampling** uses toploc's seeded Gumbel-max sampler: the token at completion position ``t`` of
  a sample with (lease-assigned) seed ``s`` is ``toploc.sample_tokens(logits_t, seed=SAMPLER_SEED,
  sequence_ids=[s], positions=[t], temperature=T)``, i.e. ``argmax_v(logits_t[v] / T + g(0, s, t, v))``.
  Keying the noise by the per-sample seed as toploc's *sequence id* lets one call draw a whole
  batch. Given the same logits anyone can redraw it (``toploc.check_sampling``), so a completion
  that was not sampled from the claimed policy fails the validator's sampling check.
  ``temperature == 0`` is greedy.
* **Hidden states** are the final hidden states (after the final norm, i.e. the input of
  ``lm_head``) at the positions whose logits sampled each completion token: row ``t`` is the state
  at absolute position ``len(prompt) + t - 1``. There is one row per completion token and no
  prefill rows (toploc ``skip_prefill=True``), in chunks of 32 rows per proof, each committing to
  the top ``proof_topk(H) = min(128, H)`` values (128 for every real model; a tiny test model with
  ``H = 64`` could not fill a 1-row chunk with 128 values).
* **Log-probs** are ``log_softmax(logits / T)[token]`` in fp32 (``T = 1`` for greedy): the
  behaviour policy's log-probs for the trainer's importance-sampling correction.
* A completion ends at the EOS token (kept), at the first stop string (tokens kept up to and
  including the token that completed it), or after ``max_new_tokens``.

:class:`HFBackend` implements this with a manual decode loop over a transformers KV cache
(batched, left padded). A vLLM backend fits the same :class:`GenerationBackend` protocol: sample
in a logits processor with the same sampler, capture the ``lm_head`` input with a forward pre-hook
on the logits processor (one row per sequence per step; beware vLLM's async output processing,
which shifts rows by one), reload weights with ``load_weights`` on the model runner, and implement
``prefill`` with ``prompt_logprobs`` plus the same hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import toploc
from prime_rl.devices import torch_dtype
from prime_rl.weights.files import load_policy_into

FinishReason = Literal["eos", "stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: temperature (0 = greedy), length limit and stop strings."""

    temperature: float = 1.0
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Completion:
    """One sampled completion with everything a worker submits about it.

    ``logprobs[t]`` and ``proofs`` follow the conventions of the module docstring;
    ``proofs`` are the concatenated toploc proofs (258 bytes per 32 tokens by default).
    """

    prompt_tokens: tuple[int, ...]
    completion_tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    proofs: bytes
    seed: int
    finish_reason: FinishReason
    text: str


@dataclass(frozen=True)
class Prefill:
    """Recomputed tensors for one (prompt, completion): rows align with ``completion_tokens``.

    ``hidden``: ``[n, H]`` final hidden states (model dtype); ``logits``: ``[n, V]`` fp32.
    """

    hidden: torch.Tensor
    logits: torch.Tensor


@runtime_checkable
class GenerationBackend(Protocol):
    """What workers and validators need from an inference engine."""

    @property
    def policy_version(self) -> int:
        """The policy version of the loaded weights (0 = initial weights)."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        """Sample one completion per (prompt, seed) pair, in order."""
        ...

    def prefill(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[Prefill]:
        """Recompute hidden states and logits for each (prompt, completion) by one prefill."""
        ...

    def load_weights(self, path: str | Path, policy_version: int) -> None:
        """Replace the weights in place from a safetensors file and record its version."""
        ...


PROOF_CHUNK = 32
"""Decode rows per toploc proof (INTELLECT-2's ``decode_batching_size``)."""


def proof_topk(hidden_size: int) -> int:
    """Top-k per proof: 128 (INTELLECT-2), capped at the hidden size."""
    return min(128, hidden_size)


def proof_size(topk: int) -> int:
    """Bytes per proof: big-endian modulus + ``topk`` coefficients (258 for k = 128)."""
    return 2 + 2 * topk


SAMPLER_SEED = 0
"""toploc sampler ``seed``; the per-sample seed is passed as the sampler's ``sequence_id``."""


def build_proofs(hidden_rows: torch.Tensor) -> bytes:
    """Concatenated toploc proofs of ``[n, H]`` decode rows (no prefill chunk)."""
    topk = proof_topk(hidden_rows.shape[-1])
    proofs = toploc.build_proofs_bytes(
        hidden_rows, decode_batching_size=PROOF_CHUNK, topk=topk, skip_prefill=True
    )
    return b"".join(proofs)


def verify_proofs(hidden_rows: torch.Tensor, data: bytes) -> list[Any]:
    """toploc ``VerificationResult`` per proof chunk of ``data`` against recomputed ``[n, H]`` rows.

    Raises ``toploc.ProofFormatError``/``ValueError`` for malformed or wrongly counted proofs.
    """
    topk = proof_topk(hidden_rows.shape[-1])
    return toploc.verify_proofs_bytes(
        hidden_rows,
        toploc.split_proofs(data, topk),
        decode_batching_size=PROOF_CHUNK,
        topk=topk,
        skip_prefill=True,
    )


class GenerationError(RuntimeError):
    """The backend cannot serve the request (empty prompt, context too long, ...)."""


def sample_next(logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float) -> torch.Tensor:
    """Draw one token per row with toploc's seeded sampler (greedy when ``temperature == 0``).

    ``logits``: ``[B, V]``; ``seeds``: ``[B]`` int64 per-sample seeds; ``position``: the completion
    position of every row. Returns ``[B]`` int64 on the logits' device.
    """
    positions = torch.full_like(seeds, position)
    return toploc.sample_tokens(logits, SAMPLER_SEED, seeds, positions, temperature=temperature)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)[token]`` per row in fp32; ``T = 1`` when greedy. Shapes ``[N, V], [N] -> [N]``.

    ``tokens`` may be on the host: they are moved to the logits' device (a no-op when already there).
    """
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / scale, dim=-1)
    return logp.gather(-1, tokens.to(logits.device, torch.long).unsqueeze(-1)).squeeze(-1)


class HFBackend:
    """The default backend: a transformers causal LM with a manual KV-cache decode loop.

    ``model_path`` is a ``from_pretrained`` directory with the tokenizer; ``dtype`` is
    ``"float32"`` or ``"bfloat16"``; ``max_batch_size`` bounds sequences per decode batch.
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
    ) -> None:
        weights_dtype = torch_dtype(dtype)  # an unknown name fails before any file is read
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model_path))
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=weights_dtype)
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self._policy_version = policy_version
        self._decoder = self.model.get_decoder()
        self._lm_head = self.model.get_output_embeddings()
        eos = self.tokenizer.eos_token_id
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else list(eos or []))
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

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
        for start in range(0, len(prompts), self.max_batch_size):
            stop = start + self.max_batch_size
            out.extend(self._generate_batch(prompts[start:stop], seeds[start:stop], params))
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

    def _stopped_by_string(self, tokens: list[int], stop: tuple[str, ...]) -> bool:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return any(s and s in text for s in stop)

    @torch.no_grad()
    def _generate_batch(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        if any(len(p) == 0 for p in prompts):
            raise GenerationError("every prompt needs at least one token")
        batch = len(prompts)
        hidden, mask, positions, cache = self._prefill_prompts(prompts)
        next_position = positions[:, -1] + 1
        seed_tensor = torch.tensor([int(x) for x in seeds], dtype=torch.long, device=self.device)
        builder = toploc.ProofBuilder(batch, hidden.shape[-1], PROOF_CHUNK, proof_topk(hidden.shape[-1]))
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finish: list[FinishReason | None] = [None] * batch
        for step in range(params.max_new_tokens):
            logits = self._lm_head(hidden).float()
            sampled = sample_next(logits, seed_tensor, step, params.temperature)
            sampled_logp = token_logprobs(logits, sampled, params.temperature).tolist()
            builder.add(hidden, active_mask=[f is None for f in finish])
            for i, token in enumerate(sampled.tolist()):
                if finish[i] is not None:
                    continue
                tokens[i].append(token)
                logprobs[i].append(sampled_logp[i])
                if token in self.eos_token_ids:
                    finish[i] = "eos"
                elif params.stop and self._stopped_by_string(tokens[i], params.stop):
                    finish[i] = "stop"
            if all(f is not None for f in finish) or step + 1 == params.max_new_tokens:
                break
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=self.device)], dim=1)
            hidden = self._decoder(
                input_ids=sampled.unsqueeze(-1),
                attention_mask=mask,
                position_ids=next_position.unsqueeze(-1),
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state[:, -1]
            next_position = next_position + 1
        proofs = builder.finish()
        results = []
        for i in range(batch):
            results.append(
                Completion(
                    prompt_tokens=tuple(int(t) for t in prompts[i]),
                    completion_tokens=tuple(tokens[i]),
                    logprobs=tuple(logprobs[i]),
                    proofs=proofs[i],
                    seed=int(seeds[i]),
                    finish_reason=finish[i] or "length",
                    text=str(self.tokenizer.decode(tokens[i], skip_special_tokens=True)),
                )
            )
        return results

    # -- verification ------------------------------------------------------------------------
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
