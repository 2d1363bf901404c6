"""Honest and deviating workers on the real SmolLM2-135M, and the validator's view of their samples.

Used by ``benchmarks/detection_bench.py``. A *worker* here is a real ``HFBackend`` (KV-cache decode,
toploc's seeded sampler, streaming proofs, inference log-probs), honest or altered in one way:

* ``steer``: true weights, but wherever the seeded sampler's runner-up token scores within
  ``steer_within`` logits of the sampled one (inside the per-sample sampling tolerance), the
  worker takes the runner-up, as long as it has steered fewer than ``rate`` of its positions so
  far (a steady budget of ``rate`` of all positions). The runner-up has the smallest possible
  margin, so this is the hardest steering to see.
* ``bf16``: the same weights run in bf16 (an fp32 run's worker saving compute).
* ``int8`` / ``int4``: every decoder ``nn.Linear`` weight fake-quantised with symmetric
  round-to-nearest (int8 per output channel; int4 per group of 32 input columns). The demo
  weights are de-quantised Q4_1 (asymmetric, blocks of 32), so Q4_1 itself would be lossless;
  the symmetric grids are not.
* ``stale``: the validator's policy is one real ``torch.optim.AdamW`` step (language-model loss
  on a few honest completions, weight decay 0 as in the demo) ahead of the worker's weights.
* ``noise``: every parameter tensor + ``rel · std(tensor) · N(0, 1)``.
* ``prompt``: one prompt token replaced (seeded position and token) while generating; the
  sample claims the original prompt.

The validator side is ``HFBackend.prefill`` with the true weights, then exactly the statistics
``prime_rl``'s validator accumulates: per-token sampling margins (``toploc.sampling_margins``),
claimed and recomputed log-probs, and per-chunk proof results.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import prime_rl.inference.backend as backend_module
import toploc
from prime_rl.inference.backend import (
    SAMPLER_SEED,
    Completion,
    HFBackend,
    SamplingParams,
    token_logprobs,
    verify_proofs,
)
from prime_rl.launch.demo_model import prepare_model

if TYPE_CHECKING:
    from prime_rl.inference.vllm_backend import VLLMBackend

TOPICS = (
    "a dragon who learns to bake bread", "the history of the printing press", "how volcanoes form",
    "a detective in a city of robots", "why the sky is blue", "the life cycle of a star",
    "a sailor lost at sea", "how computers store numbers", "a garden on the moon",
    "the invention of the telescope", "a friendship between a cat and a crow", "how bridges stay up",
)  # fmt: skip
KINDS = ("Write a long story about", "Explain in detail", "Write an essay about", "Describe step by step")


def prompt_texts(tokenizer: object, count: int, offset: int = 0) -> list[list[int]]:
    """``count`` prompts (chat instructions of varied length and few-shot arithmetic), deterministic."""
    prompts: list[list[int]] = []
    for i in range(offset, offset + count):
        if i % 4 == 3:
            a, b = (7 * i) % 89 + 3, (13 * i) % 67 + 5
            text = f"3 + 4 = 7\n12 + 5 = 17\n40 + 21 = 61\n{a} + {b} ="
            prompts.append([int(t) for t in tokenizer(text)["input_ids"]])  # type: ignore[operator]
            continue
        topic = TOPICS[(i * 5) % len(TOPICS)]
        instruction = f"{KINDS[i % len(KINDS)]} {topic}." + " Use many details." * (i % 3)
        messages = [{"role": "user", "content": instruction}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)  # type: ignore[attr-defined]
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        prompts.append([int(t) for t in ids])
    return prompts


def load_model(dtype: str = "float32", attn: str = "sdpa") -> torch.nn.Module:
    path = prepare_model(dtype="float32")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtypes[dtype], attn_implementation=attn).eval()


def load_tokenizer() -> object:
    return AutoTokenizer.from_pretrained(str(prepare_model(dtype="float32")))


def make_backend(model: torch.nn.Module, tokenizer: object, max_batch_size: int = 64) -> HFBackend:
    dtype = "bfloat16" if next(model.parameters()).dtype == torch.bfloat16 else "float32"
    backend = HFBackend("", dtype=dtype, model=model, tokenizer=tokenizer, max_batch_size=max_batch_size)
    backend.eos_token_ids = frozenset()  # fixed lengths: every sample runs to max_new_tokens
    return backend


def make_vllm_backend(dtype: str, max_batch_size: int = 64) -> VLLMBackend:
    """prime_rl's vLLM worker backend on the same checkpoint, sized for 64 x 1,100-token sequences."""
    from prime_rl.inference.vllm_backend import EngineMemory, VLLMBackend

    memory = EngineMemory(kv_cache_bytes=4 << 30, max_model_len=2048)
    backend = VLLMBackend(prepare_model(dtype="float32"), dtype=dtype, max_batch_size=max_batch_size, memory=memory)
    backend.eos_token_ids = frozenset()  # fixed lengths, as make_backend
    return backend


# -- weight perturbations -------------------------------------------------------------------------
@torch.no_grad()
def fake_quantize(model: torch.nn.Module, bits: int, group: int | None) -> torch.nn.Module:
    """A copy with every decoder ``nn.Linear`` weight rounded to a symmetric ``bits``-bit grid."""
    out = copy.deepcopy(model)
    levels = 2 ** (bits - 1) - 1
    for module in out.model.layers.modules():  # type: ignore[union-attr]
        if isinstance(module, torch.nn.Linear):
            w = module.weight
            blocks = w.reshape(w.shape[0], -1, group) if group else w.reshape(w.shape[0], 1, -1)
            scale = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / levels
            w.copy_(((blocks / scale).round().clamp(-levels, levels) * scale).reshape(w.shape))
    return out


@torch.no_grad()
def add_noise(model: torch.nn.Module, rel: float, seed: int = 0) -> torch.nn.Module:
    out = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for p in out.parameters():
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
        p.add_((rel * p.float().std() * noise).to(p.dtype))
    return out


def adamw_step(model: torch.nn.Module, lr: float, batches: Sequence[Sequence[int]]) -> torch.nn.Module:
    """A copy one ``torch.optim.AdamW`` step ahead (LM loss on ``batches`` of token ids, wd 0)."""
    out = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(out.parameters(), lr=lr, weight_decay=0.0)
    width = max(len(b) for b in batches)
    ids = torch.zeros((len(batches), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, b in enumerate(batches):
        ids[i, : len(b)] = torch.tensor(list(b))
        mask[i, : len(b)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    out(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    optimizer.step()
    return out.eval()


# -- steering -------------------------------------------------------------------------------------
class Steerer:
    """A replacement for ``prime_rl.backend.sample_next`` that takes the runner-up within ``within``."""

    def __init__(self, rate: float, within: float) -> None:
        self.rate, self.within = rate, within
        self.positions = 0
        self.steered = 0

    def __call__(self, logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float) -> torch.Tensor:
        positions = torch.full_like(seeds, position)
        scores = logits.double()
        if temperature > 0:
            scores = scores + temperature * toploc.gumbel_noise(SAMPLER_SEED, seeds, positions, logits.shape[-1])
        top = scores.topk(2, dim=-1)
        tokens = top.indices[:, 0].clone()
        gaps = (top.values[:, 0] - top.values[:, 1]).tolist()
        for row, gap in enumerate(gaps):
            self.positions += 1
            if gap < self.within and self.steered < self.rate * self.positions:
                tokens[row] = top.indices[row, 1]
                self.steered += 1
        return tokens


@contextlib.contextmanager
def steering(steerer: Steerer) -> Iterator[None]:
    original = backend_module.sample_next
    backend_module.sample_next = steerer
    try:
        yield
    finally:
        backend_module.sample_next = original


# -- the validator's view -------------------------------------------------------------------------
@dataclass(frozen=True)
class SampleStats:
    """What the validator measures on one sample (arrays per token, per chunk)."""

    margins: np.ndarray
    claimed: np.ndarray
    recomputed: np.ndarray
    exp_mismatches: np.ndarray
    mant_err_mean: np.ndarray
    mant_err_median: np.ndarray
    sign_mismatches: np.ndarray

    def observations(self) -> toploc.Observations:
        gap = np.abs(self.claimed - self.recomputed)
        return toploc.Observations(self.margins, gap, self.exp_mismatches, self.mant_err_mean)


def judge(
    validator: HFBackend,
    completions: Sequence[Completion],
    temperature: float,
    claimed_prompts: Sequence[Sequence[int]] | None = None,
    prefill_batch: int = 8,
) -> list[SampleStats]:
    """The validator's statistics for each completion (prefill with its own weights, in small batches)."""
    prompts = [list(p) for p in claimed_prompts] if claimed_prompts else [list(c.prompt_tokens) for c in completions]
    out: list[SampleStats] = []
    for start in range(0, len(completions), prefill_batch):
        part = completions[start : start + prefill_batch]
        prefills = validator.prefill(prompts[start : start + prefill_batch], [c.completion_tokens for c in part])
        for completion, pre in zip(part, prefills, strict=True):
            tokens = torch.tensor(completion.completion_tokens, dtype=torch.long)
            margins = toploc.sampling_margins(
                pre.logits, tokens, SAMPLER_SEED, completion.seed, torch.arange(tokens.numel()), temperature
            )
            results = verify_proofs(pre.hidden, completion.proofs)
            out.append(
                SampleStats(
                    margins=margins.numpy(),
                    claimed=np.array(completion.logprobs, dtype=np.float64),
                    recomputed=token_logprobs(pre.logits, tokens, temperature).double().numpy(),
                    exp_mismatches=np.array([r.exp_mismatches for r in results], dtype=np.float64),
                    mant_err_mean=np.array([r.mant_err_mean for r in results], dtype=np.float64),
                    mant_err_median=np.array([r.mant_err_median for r in results], dtype=np.float64),
                    sign_mismatches=np.array([r.sign_mismatches for r in results], dtype=np.float64),
                )
            )
    return out


def change_one_token(prompt: Sequence[int], vocab: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    changed = list(prompt)
    position = int(rng.integers(0, len(changed)))
    token = int(rng.integers(0, vocab))
    changed[position] = token if token != changed[position] else (token + 1) % vocab
    return changed


def generate(
    worker: HFBackend, prompts: Sequence[Sequence[int]], seeds: Sequence[int], tokens: int, temperature: float
) -> list[Completion]:
    return worker.generate(prompts, seeds, SamplingParams(temperature=temperature, max_new_tokens=tokens))
