"""The vLLM generation backend: the same contract as :class:`~prime_rl.inference.backend.HFBackend`, on a vLLM engine in this process.

Generation goes through ``toploc.vllm``: each completion is a vLLM request drawn by toploc's
``SeededSampler`` with ``seed = SAMPLER_SEED`` and ``sequence_id`` = the sample's seed, so token t
is ``toploc.sample_tokens(logits_t, SAMPLER_SEED, [seed], [t], T)`` exactly as in the HF decode
loop; its proofs come from the final-norm rows that sampled each token (one ``ProofBuilder`` per
request, ``proof_topk(H)`` values per 32 tokens) and its log-probs are ``log_softmax(logits / T)``
of the unforced logits. A completion ends at an EOS token of the tokenizer (kept), at the first
stop string (tokens kept up to the one that completed it) or after ``max_new_tokens``; the
model's ``generation_config`` is ignored (``generation_config="vllm"``) so that vLLM knows no
other stop tokens than the HF backend.

``load_weights`` reloads a safetensors policy file (HF parameter names, as shardcast delivers
it) into the running engine with vLLM's in-place ``reload_weights`` (which re-applies its
post-load weight processing; a head tied to the input embedding is re-processed by hand, as
vLLM skips it), then drops the prefix cache, whose KV blocks belong to the old weights. ``prefill`` is not offered: validators recompute with :class:`~prime_rl.inference.backend.HFBackend`.

The engine must live in this process (``toploc.vllm.checkable_llm`` sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0``); vLLM's CPU build also drops torch to one thread and
replaces ``torch.set_num_threads`` in this process, so a worker using it owns its process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoTokenizer

from prime_rl.inference.contract import (
    PROOF_CHUNK,
    SAMPLER_SEED,
    Completion,
    FinishReason,
    GenerationError,
    Prefill,
    SamplingParams,
    completion_text,
    proof_topk,
    tokenizer_eos_ids,
)
from prime_rl.weights.files import WeightsMismatchError


@dataclass(frozen=True)
class EngineMemory:
    """vLLM engine sizing (``[workers]`` ``vllm_*`` settings).

    Attributes:
        kv_cache_bytes: KV cache size in bytes (CPU: taken from RAM; 0 = vLLM's own sizing).
        max_model_len: longest prompt + completion in tokens (0 = the model's own limit).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (GPU only; ignored on CPU
            when ``kv_cache_bytes`` is set).
        enforce_eager: skip torch.compile / CUDA graphs (faster start, slower steps).
    """

    kv_cache_bytes: int = 256 << 20
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True


def _tensor_shapes(files: Sequence[Path]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in ``files`` (headers only; ``WeightsMismatchError`` if unreadable)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    shapes[name] = tuple(handle.get_slice(name).get_shape())
        except (SafetensorError, OSError) as exc:
            raise WeightsMismatchError(f"cannot read policy weights {file}: {exc}") from exc
    return shapes


def _finish_reason(output: Any) -> FinishReason:
    if output.finish_reason == "length":
        return "length"
    return "stop" if isinstance(output.stop_reason, str) else "eos"


def _reload(worker: Any, path: str) -> int:
    """Runs where the model lives: stream the file's tensors into vLLM's in-place reload."""

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        with safe_open(path, framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, handle.get_tensor(name)

    worker.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
    _refresh_tied_head(worker.model_runner.model)
    return os.getpid()


def _refresh_tied_head(model: Any) -> bool:
    """Re-run the output head's post-load processing when it shares the input embedding's weight.

    vLLM's reload re-processes the layers it loaded; a head tied to the embedding (SmolLM2, Qwen2
    small models) loads no tensor of its own, so it is skipped, and on CPU it keeps the packed
    copy of the *old* weights that its GEMM uses: the logits then mix two policies (log-prob gaps
    of ~1e-2 after one small update, and the validator's evidence rightly bans the worker).
    Re-processing is idempotent (the tied weight itself is never removed)."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if head is None or embed is None or method is None or getattr(head, "weight", None) is not embed.weight:
        return False
    method.process_weights_after_loading(head)
    return True


class VLLMBackend:
    """Generation on vLLM, a :class:`~prime_rl.inference.contract.GenerationBackend` (``model_path``: a HF directory with the tokenizer; ``dtype``: float32 or bfloat16)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        max_batch_size: int = 64,
        policy_version: int = 0,
        memory: EngineMemory | None = None,
        seed: int = 0,
    ) -> None:
        from toploc.vllm import checkable_llm

        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        memory = memory or EngineMemory()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.hidden_size = int(AutoConfig.from_pretrained(str(model_path)).hidden_size)
        engine: dict[str, Any] = {
            "dtype": dtype,
            "max_num_seqs": max_batch_size,
            "enforce_eager": memory.enforce_eager,
            "gpu_memory_utilization": memory.gpu_memory_utilization,
            "generation_config": "vllm",
            "seed": seed,
        }
        if memory.kv_cache_bytes:
            engine["kv_cache_memory_bytes"] = memory.kv_cache_bytes
        if memory.max_model_len:
            engine["max_model_len"] = memory.max_model_len
        # The initial checkpoint's tensors define what a policy file must hold (checked before reloading).
        self._shapes = _tensor_shapes(sorted(Path(model_path).glob("*.safetensors")))
        self.llm = checkable_llm(str(model_path), **engine)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._policy_version = policy_version
        self.eos_token_ids = tokenizer_eos_ids(self.tokenizer)

    @property
    def policy_version(self) -> int:
        return self._policy_version

    def load_weights(self, path: str | Path, policy_version: int) -> None:
        """Reload ``path`` into the running engine in place; ``WeightsMismatchError`` if it does not fit."""
        shapes = _tensor_shapes([Path(path)])
        unexpected = sorted(set(shapes) - set(self._shapes))
        missing = sorted(set(self._shapes) - set(shapes))
        wrong = sorted(name for name in set(shapes) & set(self._shapes) if shapes[name] != self._shapes[name])
        if unexpected or missing or wrong:
            raise WeightsMismatchError(
                f"{path} does not match the model: missing {missing[:5]} unexpected {unexpected[:5]} "
                f"wrong shape {wrong[:5]}"
            )
        try:
            self.llm.collective_rpc(_reload, args=(str(path),))
        except (KeyError, ValueError, RuntimeError, AssertionError) as exc:
            raise WeightsMismatchError(f"{path} does not fit the vLLM model: {exc}") from exc
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self._policy_version = policy_version

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        from vllm import SamplingParams as VLLMParams
        from vllm import TokensPrompt

        from toploc.vllm import checkable, collect

        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if any(len(p) == 0 for p in prompts):
            raise GenerationError("every prompt needs at least one token")
        longest = max((len(p) for p in prompts), default=0)
        if longest + params.max_new_tokens > self.max_model_len:
            raise GenerationError(
                f"prompt of {longest} tokens + {params.max_new_tokens} new tokens exceeds the engine's "
                f"max_model_len {self.max_model_len} (raise workers.vllm_max_model_len)"
            )
        base = VLLMParams(
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            stop_token_ids=sorted(self.eos_token_ids),
            ignore_eos=not self.eos_token_ids,  # as HFBackend: an empty eos_token_ids set never stops early
            include_stop_str_in_output=True,
            skip_special_tokens=True,
        )
        requests = [
            checkable(
                base,
                seed=SAMPLER_SEED,
                sequence_id=int(seed),
                temperature=params.temperature,
                decode_batching_size=PROOF_CHUNK,
                topk=proof_topk(self.hidden_size),
            )
            for seed in seeds
        ]
        token_prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        outputs = self.llm.generate(token_prompts, requests, use_tqdm=False)
        results = collect(requests, outputs)
        completions = []
        for prompt, seed, output, result in zip(prompts, seeds, outputs, results, strict=True):
            tokens = list(result.token_ids)
            completions.append(
                Completion(
                    prompt_tokens=tuple(int(t) for t in prompt),
                    completion_tokens=tuple(tokens),
                    logprobs=result.logprobs,
                    proofs=result.proofs,
                    seed=int(seed),
                    finish_reason=_finish_reason(output.outputs[0]),
                    text=completion_text(self.tokenizer, tokens),
                )
            )
        return completions

    def prefill(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[Prefill]:
        raise NotImplementedError("VLLMBackend does not recompute prefills; validators use HFBackend")
