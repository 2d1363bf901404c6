"""The generation-backend contract: what every engine must do so that the validator can re-derive it.

A backend turns prompt token ids into completions for an inference worker, and (optionally)
recomputes hidden states and logits by one prefill for the validator. Every backend must honour
the same rules, because the validator re-derives everything a worker claims:

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
  prefill rows (toploc ``skip_prefill=True``), in chunks of :data:`PROOF_CHUNK` rows per proof,
  each committing to the top ``proof_topk(H) = min(128, H)`` values (128 for every real model; a
  tiny test model with ``H = 64`` could not fill a 1-row chunk with 128 values).
* **Log-probs** are ``log_softmax(logits / T)[token]`` in fp32 (``T = 1`` for greedy), the
  behaviour policy's log-probs for the trainer's importance-sampling correction
  (:func:`token_logprobs`, which the validator recomputes them with).
* A completion ends at an EOS token of the tokenizer (kept; :func:`tokenizer_eos_ids`), at the first
  stop string (tokens kept up to and including the token that completed it), or after
  ``max_new_tokens``. Its ``text`` is :func:`completion_text`.

Implementations: ``backend.HFBackend`` (transformers) and ``vllm_backend.VLLMBackend``; a new
engine is one module implementing :class:`GenerationBackend` plus one line in ``select.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

import toploc

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
    spans: tuple[tuple[int, int], ...] = ()
    """In-flight weight updates: ``(policy_version, first_token)`` per version span, the start version
    from token 0 first (``api.spans``); empty: one version sampled every token."""


@dataclass(frozen=True)
class Prefill:
    """Recomputed tensors for one (prompt, completion): rows align with ``completion_tokens``.

    ``hidden``: ``[n, H]`` final hidden states (model dtype); ``logits``: ``[n, V]`` fp32.
    """

    hidden: torch.Tensor
    logits: torch.Tensor


@dataclass(frozen=True)
class VersionSwitch:
    """An in-flight switch a :class:`VersionSource` offers: load ``path`` (version ``version``) and,
    where ``nonce`` is set (the orchestrator's answer to the switch announcement), sample every
    token from the boundary on with ``api.assignment.span_seed(sample seed, nonce)`` instead of the
    sample seed; ``nonce`` None keeps the sample seeds."""

    version: int
    path: Path
    nonce: int | None = None


@runtime_checkable
class VersionSource(Protocol):
    """Where a decoding backend finds a newer policy version to switch to mid-batch (in-flight updates).

    ``max_versions``: the most versions one sample may span (``orchestrator.max_versions_per_sample``).
    """

    max_versions: int

    def newer(self, current: int, boundary: int) -> VersionSwitch | None:
        """A version newer than ``current`` that the orchestrator has committed and whose weights are
        on disk here, to switch to at completion position ``boundary`` (a proof-chunk boundary); None
        if there is none. Called at proof-chunk boundaries, so it must be cheap when it says None."""
        ...


@runtime_checkable
class ChainedForward(Protocol):
    """A backend the validator can recompute mixed-version samples with (``validator/spans.py``):
    forwards that continue a KV cache under whichever weights are loaded (``HFBackend``)."""

    def extend(self, tokens: Sequence[int], cache: Any) -> tuple[torch.Tensor, Any]:
        """Final hidden states ``[len(tokens), H]`` of ``tokens`` fed after ``cache`` (None: empty), and the cache."""
        ...

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[n, V]`` of hidden states ``[n, H]``."""
        ...


class GenerationError(RuntimeError):
    """The backend cannot serve the request (empty prompt, context too long, ...)."""


@runtime_checkable
class GenerationBackend(Protocol):
    """What workers, validators and the evaluator need from an inference engine."""

    tokenizer: Any
    """The model's tokenizer (``encode``/``decode``/``apply_chat_template``; transformers API)."""

    eos_token_ids: frozenset[int]
    """Token ids that end a completion (kept in it); empty = only stop strings and the length limit."""

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


def sampling_margins(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    temperature: float,
    *,
    runs: Sequence[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """Per completion token, the shortfall of the claimed token below the seeded sampler's choice
    (the sampling rule above, redrawn: ``toploc.sampling_margins``). ``[n]`` float64, ``inf`` where
    the logits are NaN.

    ``logits [n, V]`` recomputed at the completion's positions, ``tokens [n]``; the noise of token
    ``t`` is drawn with sequence id ``seed`` at position ``t``. ``runs``: where the seed changes along
    the completion (an announced in-flight switch reseeds the rest, ``seeds.reseeded``),
    ``(first_token, seed)`` per run of one seed in order, the first at 0; ``seed`` is then unused.
    Positions stay completion indices across runs.
    """
    n = tokens.numel()
    runs = runs or [(0, seed)]
    bounds = [first for first, _ in runs[1:]] + [n]
    parts = [
        toploc.sampling_margins(
            logits[first:end], tokens[first:end], SAMPLER_SEED, run_seed,
            torch.arange(first, end, device=logits.device), temperature,
        )
        for (first, run_seed), end in zip(runs, bounds, strict=True)
    ]  # fmt: skip
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)[token]`` per row in fp32; ``T = 1`` when greedy. Shapes ``[N, V], [N] -> [N]``.

    ``tokens`` may be on the host: they are moved to the logits' device (a no-op when already there).
    """
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / scale, dim=-1)
    return logp.gather(-1, tokens.to(logits.device, torch.long).unsqueeze(-1)).squeeze(-1)


def tokenizer_eos_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's EOS ids as a set (``eos_token_id`` may be one id, a list, or ``None``)."""
    eos = tokenizer.eos_token_id
    return frozenset([eos] if isinstance(eos, int) else list(eos or []))


def completion_text(tokenizer: Any, tokens: Sequence[int]) -> str:
    """A completion's ``text``: its tokens decoded without special tokens."""
    return str(tokenizer.decode(list(tokens), skip_special_tokens=True))
