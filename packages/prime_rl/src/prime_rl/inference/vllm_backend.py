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

``generate`` adds every request of the call to the engine and steps it by hand
(``LLMEngine.step``, per-step ``DELTA`` outputs), which lets it switch versions in flight
(``version_source``, ``docs/inflight.md``) exactly as the HF decode loop does, keep-KV: where
every running request holds exactly ``b`` tokens (``b`` a multiple of the 32-token proof chunk)
and the source offers a newer version, its weights are reloaded in place between two steps, so
the next step's forward (input: token ``b - 1``, sampling token ``b``) is the new version's and
the KV blocks already written stay as the older versions wrote them; every running request
records the span ``(version, b)`` and, with the switch's nonce, draws from ``b`` on with
``span_seed(sequence id, nonce)`` (``toploc.vllm.reseed``). Each proof chunk is then one version's,
and the validator's chained forwards (``validator/spans.py``) recompute the same mixed cache.
This needs the requests in lock step, which :func:`lockstep_problem` checks before the batch
(idle engine, synchronous scheduling, all requests and prompts in one step, free KV blocks for
every request's full length, so none is preempted and recomputed under the newer weights) and
the loop checks after every step (token counts, and the scheduler's preemption counters: a
preempted request may be recomputed and catch up within one step, so equal counts alone do not
show it); a batch that fails the first check does not switch (logged), one that leaves lock step
after a switch raises ``GenerationError`` rather than return samples the validator would reject. The prefix cache is kept during the batch (the
running requests' blocks are the keep-KV state; no other request joins) and dropped once it ends,
so no later request reuses a block cached under an older version.

The engine must live in this process (``toploc.vllm.checkable_llm`` sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0``); vLLM's CPU build also drops torch to one thread and
replaces ``torch.set_num_threads`` in this process, so a worker using it owns its process.
"""

from __future__ import annotations

import logging
import os
import uuid
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
    VersionSource,
    completion_text,
    proof_topk,
    tokenizer_eos_ids,
)
from prime_rl.inference.switching import RowSpans
from prime_rl.weights.files import WeightsMismatchError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineMemory:
    """vLLM engine sizing (``[workers]`` ``vllm_*`` settings).

    Attributes:
        kv_cache_bytes: KV cache size in bytes (CPU: taken from RAM; 0 = vLLM's own sizing).
        max_model_len: longest prompt + completion in tokens (0 = the model's own limit).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (GPU only; ignored on CPU
            when ``kv_cache_bytes`` is set).
        enforce_eager: skip torch.compile / CUDA graphs (faster start, slower steps).
        max_num_batched_tokens: tokens one engine step may take, prompt tokens of prefills included
            (0 = vLLM's own). An in-flight switch needs a whole lease's prompts in one step
            (:func:`lockstep_problem`).
    """

    kv_cache_bytes: int = 256 << 20
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    max_num_batched_tokens: int = 0


@dataclass(frozen=True)
class EngineLimits:
    """What a vLLM engine can schedule at once, read before a batch (``VLLMBackend._limits``).

    Attributes:
        max_num_seqs: requests per step.
        max_num_batched_tokens: tokens per step (prompt tokens of prefills included).
        block_size: tokens per KV block.
        free_blocks: KV blocks free now (cached blocks no request holds count as free).
        async_scheduling: the engine plans step ``s + 1`` before step ``s``'s tokens are out.
        busy: the engine holds unfinished requests.
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    free_blocks: int
    async_scheduling: bool
    busy: bool


def lockstep_problem(prompt_lengths: Sequence[int], max_new_tokens: int, limits: EngineLimits) -> str | None:
    """Why the engine may not decode these requests in lock step, or None if it will.

    Lock step: every request is prefilled in the engine's first step and then decoded one token a
    step until it finishes, so after step ``s`` every running request holds exactly ``s`` tokens and
    its KV was written by the versions that were loaded at each step. That holds when the engine is
    idle, steps synchronously, schedules every request at once (``max_num_seqs``) with all prompts
    in one step's token budget (else chunked prefill spreads them over steps), and has free KV
    blocks for every request's prompt + ``max_new_tokens`` (so none is ever preempted).
    Pitfall: a preempted request is recomputed from its tokens with the weights loaded at that
    moment, silently replacing the older versions' KV that a keep-KV switch must keep.
    """
    if limits.busy:
        return "the engine is running other requests"
    if limits.async_scheduling:
        return "the engine schedules asynchronously (a step is planned before the previous one's tokens are seen)"
    if len(prompt_lengths) > limits.max_num_seqs:
        return f"{len(prompt_lengths)} requests exceed the engine's max_num_seqs {limits.max_num_seqs}"
    if sum(prompt_lengths) > limits.max_num_batched_tokens:
        return (
            f"{sum(prompt_lengths)} prompt tokens exceed one step's budget of {limits.max_num_batched_tokens} "
            "(chunked prefill would start the requests at different steps)"
        )
    blocks = sum(-(-(n + max_new_tokens) // limits.block_size) for n in prompt_lengths)
    if blocks > limits.free_blocks:
        return f"the requests may need {blocks} KV blocks, {limits.free_blocks} are free (preemption would recompute KV)"
    return None


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
    """Generation on vLLM, a :class:`~prime_rl.inference.contract.GenerationBackend` (``model_path``: a HF
    directory with the tokenizer; ``dtype``: float32 or bfloat16; ``inflight_updates``: build the engine
    for in-flight switches, i.e. without asynchronous scheduling)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        max_batch_size: int = 64,
        policy_version: int = 0,
        memory: EngineMemory | None = None,
        seed: int = 0,
        inflight_updates: bool = False,
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
        if inflight_updates:  # a switch needs each step's tokens before the next step is planned
            engine["async_scheduling"] = False
        if memory.kv_cache_bytes:
            engine["kv_cache_memory_bytes"] = memory.kv_cache_bytes
        if memory.max_model_len:
            engine["max_model_len"] = memory.max_model_len
        if memory.max_num_batched_tokens:
            engine["max_num_batched_tokens"] = memory.max_num_batched_tokens
        # The initial checkpoint's tensors define what a policy file must hold (checked before reloading).
        self._shapes = _tensor_shapes(sorted(Path(model_path).glob("*.safetensors")))
        self.llm = checkable_llm(str(model_path), **engine)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._policy_version = policy_version
        self.eos_token_ids = tokenizer_eos_ids(self.tokenizer)
        self.version_source: VersionSource | None = None
        """In-flight weight updates (``workers.inflight_updates``): where :meth:`generate` finds a newer
        committed version to switch to at a lock-step proof-chunk boundary; None: every batch keeps its version."""

    @property
    def policy_version(self) -> int:
        return self._policy_version

    def load_weights(self, path: str | Path, policy_version: int) -> None:
        """Reload ``path`` into the running engine in place; ``WeightsMismatchError`` if it does not fit."""
        self._reload_in_place(path, policy_version)
        self._drop_prefix_cache()

    def _reload_in_place(self, path: str | Path, policy_version: int) -> None:
        """The weights of ``path`` into the engine, KV blocks and prefix cache untouched."""
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
        self._policy_version = policy_version

    def _drop_prefix_cache(self) -> None:
        """Forget every cached KV block (they belong to older weights); only with no request running."""
        if not self.llm.reset_prefix_cache():
            raise GenerationError("vLLM kept its prefix cache (a request still holds KV blocks)")

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        from vllm import SamplingParams as VLLMParams
        from vllm.sampling_params import RequestOutputKind

        from toploc.vllm import checkable, collect_tokens

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
            output_kind=RequestOutputKind.DELTA,  # each step's new tokens: the loop counts them
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
        source = self.version_source
        if source is not None and prompts:
            problem = lockstep_problem([len(p) for p in prompts], params.max_new_tokens, self._limits())
            if problem is not None:
                log.warning("no in-flight switch in this batch: %s", problem)
                source = None
        run = _Run(self, requests, seeds, source, params.max_new_tokens)
        tokens, outputs = run.decode(prompts)
        results = collect_tokens(requests, tokens)
        completions = []
        for i, (prompt, seed, output, result) in enumerate(zip(prompts, seeds, outputs, results, strict=True)):
            completions.append(
                Completion(
                    prompt_tokens=tuple(int(t) for t in prompt),
                    completion_tokens=tuple(result.token_ids),
                    logprobs=result.logprobs,
                    proofs=result.proofs,
                    seed=int(seed),
                    finish_reason=_finish_reason(output),
                    text=completion_text(self.tokenizer, list(result.token_ids)),
                    spans=run.rows.spans(i),
                )
            )
        return completions

    def _scheduler(self) -> Any:
        """The in-process engine's scheduler (None if the engine core runs elsewhere)."""
        core = getattr(self.llm.llm_engine.engine_core, "engine_core", None)  # InprocClient: the EngineCore itself
        return getattr(core, "scheduler", None)

    def _preemptions(self) -> int:
        """Preemptions of the requests the engine holds (each one recomputed its KV from its tokens)."""
        requests = getattr(self._scheduler(), "requests", None) or {}
        return sum(int(getattr(request, "num_preemptions", 0)) for request in requests.values())

    def _limits(self) -> EngineLimits:
        """What the engine can schedule now (``lockstep_problem``); read from the in-process scheduler."""
        engine = self.llm.llm_engine
        config = engine.vllm_config
        pool = getattr(getattr(self._scheduler(), "kv_cache_manager", None), "block_pool", None)
        return EngineLimits(
            max_num_seqs=int(config.scheduler_config.max_num_seqs),
            max_num_batched_tokens=int(config.scheduler_config.max_num_batched_tokens),
            block_size=int(config.cache_config.block_size),
            free_blocks=int(pool.get_num_free_blocks()) if pool is not None else 0,
            async_scheduling=bool(config.scheduler_config.async_scheduling),
            busy=engine.has_unfinished_requests(),
        )

    def prefill(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[Prefill]:
        raise NotImplementedError("VLLMBackend does not recompute prefills; validators use HFBackend")


class _Run:
    """One batch on the engine, stepped by hand: every request added at once, then ``LLMEngine.step``
    until all have finished, switching versions in flight at lock-step proof-chunk boundaries."""

    def __init__(
        self,
        backend: VLLMBackend,
        requests: Sequence[Any],
        seeds: Sequence[int],
        source: VersionSource | None,
        limit: int,
    ) -> None:
        self.backend, self.requests, self.source, self.limit = backend, requests, source, limit
        self.rows = RowSpans(seeds, backend.policy_version)  # each request's spans and toploc sequence id
        self.switched = False

    def decode(self, prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[Any]]:
        """Each request's emitted tokens and its final ``CompletionOutput``, in ``prompts`` order."""
        from vllm import TokensPrompt

        from toploc.vllm import discard

        engine, source = self.backend.llm.llm_engine, self.source
        tag = uuid.uuid4().hex[:12]
        ids = [f"prime-rl-{tag}-{i}" for i in range(len(prompts))]
        row_of = {request_id: i for i, request_id in enumerate(ids)}
        tokens: list[list[int]] = [[] for _ in ids]
        outputs: list[Any] = [None] * len(ids)
        try:
            for request_id, prompt, request in zip(ids, prompts, self.requests, strict=True):
                engine.add_request(request_id, TokensPrompt(prompt_token_ids=[int(t) for t in prompt]), request)
            steps, lockstep = 0, source is not None
            while any(output is None for output in outputs):
                if not engine.has_unfinished_requests():
                    raise GenerationError("the vLLM engine dropped requests of this batch")
                for out in engine.step():
                    i = row_of[out.request_id]
                    tokens[i].extend(out.outputs[0].token_ids)
                    if out.finished:
                        outputs[i] = out.outputs[0]
                steps += 1
                running = [i for i, output in enumerate(outputs) if output is None]
                if source is None or not lockstep or not running:
                    continue
                preempted = self.backend._preemptions()
                if preempted or any(len(tokens[i]) != steps for i in running):
                    lockstep = False
                    state = f"step {steps}, token counts {sorted({len(tokens[i]) for i in running})}, {preempted} preemptions"
                    if self.switched:  # a request preempted after a switch was recomputed: unverifiable
                        raise GenerationError(f"requests left lock step after an in-flight switch ({state})")
                    log.warning("no further in-flight switch in this batch: %s", state)
                elif steps % PROOF_CHUNK == 0 and steps < self.limit and self.rows.versions < source.max_versions:
                    self._switch(source, steps, running)
        except BaseException:
            engine.abort_request([rid for rid, output in zip(ids, outputs, strict=True) if output is None])
            discard(self.requests)
            raise
        finally:
            if self.switched:  # every request is done: blocks cached under older versions must not serve the next batch
                self.backend._drop_prefix_cache()
        return tokens, outputs

    def _switch(self, source: VersionSource, boundary: int, running: Sequence[int]) -> None:
        """At completion position ``boundary`` (a proof-chunk boundary; every running request holds
        exactly ``boundary`` tokens and the next step feeds token ``boundary - 1``): load the newer
        version ``source`` offers, if any, in place (KV blocks kept), and open its span on every
        running request (``inference/switching.py``: with the switch's nonce each one draws from
        ``boundary`` on with its reseeded sequence id)."""
        from toploc.vllm import reseed

        switch = source.newer(self.backend.policy_version, boundary)
        if switch is None:
            return
        self.switched = True  # from here on the prefix cache may hold blocks of an older version
        self.backend._reload_in_place(switch.path, switch.version)
        for i in self.rows.switch(switch, dict.fromkeys(running, boundary)):
            reseed(self.requests[i], boundary, self.rows.seeds[i])
        log.info("switched to policy v%d at token %d (%d requests running)", switch.version, boundary, len(running))
