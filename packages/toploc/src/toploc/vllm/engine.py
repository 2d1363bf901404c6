"""Wire the sampler and the hidden-state capture into a ``vllm.LLM``, and collect per-request results.

    llm = checkable_llm(model_dir, dtype="float32")            # or: LLM(..., logits_processors=[SeededSampler]); attach(llm)
    params = [checkable(SamplingParams(max_tokens=64), seed=7, sequence_id=i, temperature=1.0) for i in range(n)]
    outputs = llm.generate(prompts, params)
    results = collect(params, outputs)                          # CheckableOutput per request, in order

The engine must run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the logits processor
and the capture hook leave their results in this process's ``TRACES``. ``checkable_llm`` sets
that, and ``VLLM_USE_V2_MODEL_RUNNER=0`` (the sampler implements the V1 model runner's
logits-processor interface), unless the environment already says otherwise.

Pitfall: creating an engine writes variables meant for vLLM's own worker processes into this
process's environment (on CPU: ``LD_PRELOAD`` of tcmalloc and torch's libgomp,
``LOCAL_WORLD_SIZE``). In-process there are no such workers, but every process started later
would inherit them (a preloaded allocator and OpenMP runtime in a sandboxed verifier, or in a
``torchrun`` of the trainer started from the same process). ``checkable_llm`` puts ``CHILD_ENV``
back as it was.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

from toploc.vllm.capture import install
from toploc.vllm.trace import EXTRA_ARGS_KEY, TRACES, CheckableOutput, SamplerArgs, TraceError

IN_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}

CHILD_ENV = ("LD_PRELOAD", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Variables vLLM may set for its worker processes that ``checkable_llm`` restores (module docstring)."""


def checkable(
    params: Any,
    *,
    seed: int,
    sequence_id: int,
    temperature: float = 1.0,
    proofs: bool = True,
    decode_batching_size: int = 32,
    topk: int = 128,
) -> Any:
    """A copy of vLLM ``SamplingParams`` whose request is drawn by the seeded sampler and proven.

    vLLM's own ``temperature`` is set to 0: the seeded sampler forces its draw, and a greedy
    request lets vLLM skip its own random sampling work. Each call gets a fresh ``key``.
    """
    args = SamplerArgs(
        key=uuid.uuid4().hex,
        seed=seed,
        sequence_id=sequence_id,
        temperature=temperature,
        proofs=proofs,
        decode_batching_size=decode_batching_size,
        topk=topk,
    )
    out = params.clone()
    out.temperature = 0.0
    out.extra_args = {**(out.extra_args or {}), EXTRA_ARGS_KEY: args.to_extra_args()}
    return out


def attach(llm: Any) -> None:
    """Install the hidden-state capture in the model of an in-process ``vllm.LLM``.

    Raises:
        RuntimeError: the engine runs in another process (set ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
            before creating it), so its draws and proofs could not reach this process.
    """
    if any(pid != os.getpid() for pid in llm.apply_model(install)):
        raise RuntimeError(
            "the vLLM engine runs in another process; create it with VLLM_ENABLE_V1_MULTIPROCESSING=0 "
            "(toploc.vllm.checkable_llm does) so that proofs and draws reach this process"
        )


def checkable_llm(model: str, **llm_kwargs: Any) -> Any:
    """``vllm.LLM(model, **llm_kwargs)`` in this process, with the seeded sampler and capture attached."""
    for name, value in IN_PROCESS_ENV.items():
        os.environ.setdefault(name, value)
    from vllm import LLM

    from toploc.vllm.processor import SeededSampler

    processors = list(llm_kwargs.pop("logits_processors", None) or [])
    if SeededSampler not in processors:
        processors.append(SeededSampler)
    before = {name: os.environ.get(name) for name in CHILD_ENV}
    try:
        llm = LLM(model=model, logits_processors=processors, **llm_kwargs)
    finally:
        for name, previous in before.items():
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous
    attach(llm)
    return llm


def _key(params: Any) -> str:
    args = SamplerArgs.from_extra_args(params.extra_args)
    if args is None:
        raise ValueError("sampling params without toploc args: build them with toploc.vllm.checkable")
    return args.key


def reseed(params: Any, position: int, sequence_id: int) -> None:
    """Draw the running request of ``params`` with ``sequence_id`` from generated-token index ``position``
    on (an in-flight switch's per-span seed; between engine steps, in this process).

    Raises:
        TraceError: the engine has not scheduled the request yet, or its trace was collected.
        ValueError: ``position`` lies before a token already drawn (``RequestTrace.reseed``).
    """
    TRACES.reseed(_key(params), position, sequence_id)


def discard(params: Sequence[Any]) -> None:
    """Drop the traces of requests that will not be collected (aborted), so none outlives them."""
    for p in params:
        TRACES.take(_key(p))


def collect(params: Sequence[Any], outputs: Sequence[Any]) -> list[CheckableOutput]:
    """Per request (same order as ``params``): the ``CheckableOutput`` of ``outputs[i].outputs[0]``.

    Raises:
        TraceError: a request was never scheduled by a ``SeededSampler`` engine in this process,
            or its trace is inconsistent (see ``RequestTrace.finish``).
        ValueError: ``params`` and ``outputs`` differ in length, or a params has no toploc args.
    """
    if len(params) != len(outputs):
        raise ValueError(f"{len(params)} sampling params but {len(outputs)} outputs")
    return collect_tokens(params, [list(output.outputs[0].token_ids) for output in outputs])


def collect_tokens(params: Sequence[Any], token_ids: Sequence[Sequence[int]]) -> list[CheckableOutput]:
    """``collect`` for a caller that gathered each request's emitted tokens itself (an engine stepped
    by hand, with ``RequestOutputKind.DELTA`` outputs): ``token_ids[i]`` are request ``i``'s tokens.

    Raises: as ``collect``.
    """
    if len(params) != len(token_ids):
        raise ValueError(f"{len(params)} sampling params but {len(token_ids)} token lists")
    keys = [_key(p) for p in params]
    traces = [TRACES.take(key) for key in keys]  # take all first: nothing leaks if one fails
    results = []
    for key, trace, emitted in zip(keys, traces, token_ids, strict=True):
        if trace is None:
            raise TraceError(
                f"request {key} was not drawn by toploc's SeededSampler in this process "
                "(engine without logits_processors=[SeededSampler], or running in another process)"
            )
        results.append(trace.finish(list(emitted)))
    return results
