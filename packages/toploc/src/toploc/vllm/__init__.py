"""Make a vLLM engine's outputs checkable with toploc (optional: ``pip install intellect2-toploc[vllm]``).

Two pieces run inside an in-process vLLM engine (V1 model runner):

* ``SeededSampler``, a vLLM v1 logits processor: draws each token of a checkable request with
  ``toploc.sample_tokens`` keyed by (seed, sequence_id, generated-token index) and forces it,
  so validators can redraw it with ``toploc.check_sampling``; it also records
  ``log_softmax(logits / T)`` of the drawn token (the unmodified distribution);
* a capture of the final-norm hidden states each step, matched to requests through vLLM's
  persistent batch (requests join, finish and move at any step), feeding one
  ``toploc.ProofBuilder`` per request.

    from vllm import SamplingParams
    from toploc.vllm import checkable, checkable_llm, collect

    llm = checkable_llm(model_dir, dtype="float32")
    params = [checkable(SamplingParams(max_tokens=64), seed=7, sequence_id=i) for i in range(len(prompts))]
    results = collect(params, llm.generate(prompts, params))   # token_ids, logprobs, proofs per request

``import toploc`` never imports this subpackage; vLLM itself is imported on first use of
``SeededSampler`` or the engine helpers (``toploc.vllm.trace`` is pure).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toploc.vllm.trace import EXTRA_ARGS_KEY, CheckableOutput, SamplerArgs, TraceError

if TYPE_CHECKING:
    from toploc.vllm.engine import (
        IN_PROCESS_ENV,
        attach,
        checkable,
        checkable_llm,
        collect,
        collect_tokens,
        discard,
        reseed,
    )
    from toploc.vllm.processor import SeededSampler

# vLLM is imported on first use of these names, so that ``toploc.vllm.trace`` (pure) imports without it.
_LAZY = {
    "IN_PROCESS_ENV": "toploc.vllm.engine",
    "attach": "toploc.vllm.engine",
    "checkable": "toploc.vllm.engine",
    "checkable_llm": "toploc.vllm.engine",
    "collect": "toploc.vllm.engine",
    "collect_tokens": "toploc.vllm.engine",
    "discard": "toploc.vllm.engine",
    "reseed": "toploc.vllm.engine",
    "SeededSampler": "toploc.vllm.processor",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'toploc.vllm' has no attribute {name!r}")

__all__ = [
    "EXTRA_ARGS_KEY",
    "IN_PROCESS_ENV",
    "CheckableOutput",
    "SamplerArgs",
    "SeededSampler",
    "TraceError",
    "attach",
    "checkable",
    "checkable_llm",
    "collect",
    "collect_tokens",
    "discard",
    "reseed",
]
