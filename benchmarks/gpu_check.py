"""GPU check: every role's tensor path on one GPU, measured, in one command and one table.

    python benchmarks/gpu_check.py                 # on a GPU, no model hub (times: results/gpu_check.md)
    python benchmarks/gpu_check.py --smoke         # tiny sizes on the CPU (CI runs this)
    python benchmarks/gpu_check.py --model DIR     # a local HF model directory for the rollout rows
    python benchmarks/gpu_check.py --sections attention,noise   # some sections only

On a machine without our dependencies or a package index, ``benchmarks/gpu_prep.py`` downloads
the wheels it lacks and prints the command. Sections (each measured in this process, on the same
device; a section that fails records its error and the others still run; the JSON is saved after
every section, and after every row of ``noise``, so a run stopped at its time limit keeps what
it measured):

* ``toploc``: proofs built by the CUDA kernels, by torch on the GPU (``TOPLOC_CUDA=0``) and on the
  CPU must be byte-identical, and verification results equal; timings of batch build (8,192
  tokens, H = 5120), verify (65,536 tokens), build of those 65,536 tokens (verify / build at
  equal tokens) and the streaming ``ProofBuilder`` (256 x 32 tokens);
* ``attention``: one layer's attention, forward + backward, at 16,384 tokens in 16 documents
  (FlexAttention, per-document SDPA, ``auto``) against one causal SDPA over the row and SDPA under
  the dense block-causal mask; then compiled FlexAttention over 8 new lengths, with dynamo's counts
  of graphs, recompiles and graph breaks;
* ``trainer``: one AdamW step (grpo "intellect2") on a packed row of 4,096 and 16,384 tokens,
  16 sequences, bf16: document attention with the chunked head, with full logits and with
  activation checkpointing, the dense block-causal mask the trainer used before, and a plain HF
  step; at 32,768 tokens the chunked head with and
  without checkpointing and the plain step (``benchmarks/trainer_bench.py`` has the steps); time,
  peak memory, tokens/s;
* ``shared_prompt``: one AdamW step on one GRPO group (``G`` = 8, 16; prompts of 150 and
  1,000 tokens; completions 64-256), packed as today against the prompt computed once
  (FlexAttention with the shared-prefix block mask); time, peak memory, completion tokens/s;
* ``rollouts``: the honest worker's generation (``make_backend(..., backend="hf")``, seeded
  sampler, streaming proofs, log-probs), cold and warm, against each decode step of ``HFBackend``
  and ``model.generate`` on the same prompts, 64 x 256 tokens; then ``validate_batch`` judging
  those rollouts: accepted and rejected counts by reason, and the honest noise (per sample: worst
  sampling margin, mean log-prob gap, most proof exponent mismatches) as quantiles;
* ``noise``: the bf16 noise profile of the worker's decode against the validator's prefill,
  measured on calibration samples, then the honest reject rate of the rule it gives on held-out
  samples of 2k, 8k and 512 tokens (:func:`check_noise`);
* ``validation_cost``: seconds per sample of the honest worker's generation (seeded sampler,
  streaming proofs, log-probs, reward) against the validator's ``validate_batch`` (one prefill,
  proofs, margins, log-probs, rewards) on leases of 8 x 8 completions of 1,024 tokens, warm, and
  their ratio (goal: validation at most 1/20 of generation; the seed design claims up to 100x):
  ``benchmarks/validation_cost.py`` :func:`measure_case`, which measures the same on the CPU for the
  demo's SmolLM2 and the swarm's tiny model (``benchmarks/results/validators.md``).

The model is Qwen2-0.5B-shaped with random weights, built from a config in code. The JSON
(``--out``; default ``benchmarks/results/gpu_check.json``, or ``gpu_check_smoke.json`` with
``--smoke``) names the device, driver, CUDA, torch and transformers, and dynamo's counters after
each section. Results and what they mean: ``benchmarks/results/gpu_check.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "support")]

import torch  # noqa: E402
from trainer_bench import (  # noqa: E402
    QWEN2_05B,
    SHARED_CASES,
    SHARED_ROW_TOKENS,
    group_samples,
    make_steps,
    packed_samples,
    qwen2_model,
)

KEY = b"gpu-check-assignment-key"


@dataclasses.dataclass(frozen=True)
class Sizes:
    shape: dict[str, int]
    trainer_tokens: tuple[int, ...]
    repeats: int
    build_tokens: int
    verify_tokens: int
    proof_hidden: int
    stream_sequences: int
    prompts: int  # prompts per lease; each sampled group_size times
    group_size: int
    prompt_tokens: int
    new_tokens: int
    long_tokens: int  # the trainer's longest row: document attention with and without checkpointing only
    attention_tokens: int  # one layer's attention at this length, in ATTENTION_DOCUMENTS documents
    noise_rows: tuple[NoiseRow, ...]  # the bf16 noise section's test rows
    noise_calibration: NoiseRow  # the honest samples the profile is measured on (not judged)
    cost_tokens: int = 1024  # validation_cost: completion tokens per sample
    cost_repeats: int = 2  # validation_cost: timed leases (after one untimed)


@dataclasses.dataclass(frozen=True)
class NoiseRow:
    """Honest samples of ``prompt + new`` tokens: ``leases`` leases of ``prompts x group`` samples."""

    prompt: int
    new: int
    prompts: int
    group: int
    leases: int

    @property
    def samples(self) -> int:
        return self.prompts * self.group * self.leases


ATTENTION_DOCUMENTS = 16
FULL = Sizes(
    QWEN2_05B, (4096, 16384), 3, 8192, 65536, 5120, 256, 8, 8, 32, 256, 32768, 16384,
    # The 2k row first: 1,024 honest samples of 1,024 new tokens is the acceptance row of issue #37.
    noise_rows=(NoiseRow(1024, 1024, 16, 16, 4), NoiseRow(7168, 1024, 4, 16, 1), NoiseRow(256, 256, 16, 16, 4)),
    noise_calibration=NoiseRow(1024, 1024, 16, 16, 1),
)  # fmt: skip
SMOKE = Sizes(
    {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 1000},
    (256,), 1, 256, 512, 256, 4, 2, 2, 8, 8, 512, 512,
    noise_rows=(NoiseRow(8, 8, 2, 2, 2), NoiseRow(24, 16, 2, 2, 1)),
    noise_calibration=NoiseRow(8, 8, 2, 2, 1),
    cost_tokens=8, cost_repeats=1,
)  # fmt: skip


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, repeats: int, device: torch.device) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return times, out


def environment(device: torch.device) -> dict:
    import transformers

    env = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    if device.type == "cuda":
        try:
            query = [
                "nvidia-smi",
                "--query-gpu=driver_version",
                "--format=csv,noheader",
                f"--id={device.index or 0}",
            ]
            env["driver"] = (
                subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip() or None
            )
        except (OSError, subprocess.SubprocessError):
            pass
    # The device machine gets a copy of the working tree whose .git may be older than the tree:
    # gpu_prep.py passes the commit it prepared the command at.
    env["commit"] = os.environ.get("GPU_CHECK_COMMIT")
    if env["commit"]:
        return env
    try:
        env["commit"] = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    return env


@contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


def check_toploc(device: torch.device, sizes: Sizes) -> dict:
    """GPU kernels vs torch on the GPU vs the CPU: equal proofs and verdicts, and their timings."""
    import toploc

    g = torch.Generator().manual_seed(0)
    hidden, repeats = sizes.proof_hidden, max(3, sizes.repeats)
    build_acts = torch.randn(sizes.build_tokens, hidden, generator=g).to(torch.bfloat16)
    verify_acts = torch.randn(sizes.verify_tokens, hidden, generator=g).to(torch.bfloat16)
    cpu = torch.device("cpu")
    result: dict = {
        "hidden": hidden,
        "build_tokens": sizes.build_tokens,
        "verify_tokens": sizes.verify_tokens,
    }
    build_times, cpu_proofs = timed(lambda: toploc.build_proofs_bytes(build_acts), repeats, cpu)
    proofs = toploc.build_proofs_bytes(verify_acts)
    verify_times, cpu_results = timed(lambda: toploc.verify_proofs_bytes(verify_acts, proofs), repeats, cpu)
    result["cpu"] = {
        "build_ms": 1e3 * statistics.median(build_times),
        "verify_ms": 1e3 * statistics.median(verify_times),
    }
    stream_rows = torch.randn(32, sizes.stream_sequences, hidden, generator=g).to(torch.bfloat16)

    def stream(rows: torch.Tensor) -> list[bytes]:
        builder = toploc.ProofBuilder(sizes.stream_sequences, hidden)
        for row in rows:
            builder.add(row)
        return builder.finish()

    cpu_stream = stream(stream_rows)
    result["cpu"]["stream_ms"] = 1e3 * statistics.median(timed(lambda: stream(stream_rows), repeats, cpu)[0])
    if device.type != "cuda":
        result["kernels"] = "no CUDA device: CPU figures only"
        return result
    on_gpu = build_acts.to(device), verify_acts.to(device), stream_rows.to(device)
    for name, kernels in (("gpu_kernels", "1"), ("gpu_torch", "0")):
        with environment_variable("TOPLOC_CUDA", kernels):  # toploc's switch: "0" runs its torch path
            toploc.build_proofs_bytes(on_gpu[0])  # warm-up: loads (or compiles) the kernels
            build_times, gpu_proofs = timed(lambda: toploc.build_proofs_bytes(on_gpu[0]), repeats, device)
            verify_times, gpu_results = timed(
                lambda: toploc.verify_proofs_bytes(on_gpu[1], proofs), repeats, device
            )
            # Build over the very activations verify checks: verify / build at equal tokens.
            same_times, gpu_same = timed(lambda: toploc.build_proofs_bytes(on_gpu[1]), repeats, device)
            stream_times, gpu_stream = timed(lambda: stream(on_gpu[2]), repeats, device)
        result[name] = {
            "build_ms": 1e3 * statistics.median(build_times),
            "verify_ms": 1e3 * statistics.median(verify_times),
            "build_verify_tokens_ms": 1e3 * statistics.median(same_times),
            "verify_over_build": statistics.median(verify_times) / statistics.median(same_times),
            "proofs_at_verify_tokens_equal_cpu": gpu_same == proofs,
            "stream_ms": 1e3 * statistics.median(stream_times),
            "proofs_equal_cpu": gpu_proofs == cpu_proofs and gpu_stream == cpu_stream,
            "verdicts_equal_cpu": gpu_results == cpu_results,
        }
    from toploc import cuda as toploc_cuda

    bits = on_gpu[0].view(torch.int16).reshape(1, -1)
    result["kernels"] = (
        "available" if toploc_cuda.available(bits, 128) else "unavailable: gpu_kernels ran torch"
    )
    if result["kernels"] == "available":
        try:  # a breakdown only: its failure must not cost the section's figures
            result["gpu_kernels"]["stages_ms"] = verify_stages(on_gpu[1], proofs, repeats, device)
        except Exception as exc:
            result["gpu_kernels"]["stages_error"] = f"{type(exc).__name__}: {exc}"
    return result


def verify_stages(activations: torch.Tensor, proofs: list[bytes], repeats: int, device: torch.device) -> dict:
    """Where verify's time goes beside build's, at the verify tokens in 32-token chunks: the two
    kernels alone (inputs already on the device), the host's proof parsing and the comparison (its
    counts back on the host); median ms."""
    from toploc import cuda as toploc_cuda
    from toploc.chunking import split_chunks
    from toploc.proofs import compare
    from toploc.wire import decode_proofs

    # verify's own chunking: the group of full 32-token decode chunks, with its own proofs
    group = max(split_chunks(activations, 32, skip_prefill=False), key=lambda g: g.bits.shape[0])
    bits, rows = group.bits, slice(group.first, group.first + group.bits.shape[0])
    moduli, coeffs = decode_proofs(proofs, topk=128)
    on_device = torch.from_numpy(moduli[rows]).to(device), torch.from_numpy(coeffs[rows]).to(device)
    _, values, committed, _ = toploc_cuda.select_evaluate(bits, 128, *on_device)
    stages = {
        "select_commit_kernel": lambda: toploc_cuda.select_commit(bits, 128),
        "select_evaluate_kernel": lambda: toploc_cuda.select_evaluate(bits, 128, *on_device),
        "decode_proofs_host": lambda: decode_proofs(proofs, topk=128),
        "compare_with_transfer": lambda: compare(committed, values.long() & 0xFFFF),
    }
    return {name: 1e3 * statistics.median(timed(fn, repeats, device)[0]) for name, fn in stages.items()}


def check_trainer(device: torch.device, sizes: Sizes, dtype: torch.dtype) -> list[dict]:
    """Each step variant at each length: median and min time, peak memory, tokens/s."""
    rows: list[dict] = []
    model = qwen2_model(sizes.shape, max(*sizes.trainer_tokens, sizes.long_tokens), dtype, device)
    every = ("document", "document_ckpt", "document_full", "dense", "plain")
    plan = [(tokens, every) for tokens in sizes.trainer_tokens]
    plan.append((sizes.long_tokens, ("document", "document_ckpt", "plain")))  # 32k: what INTELLECT-2 trains on
    for tokens, variants in plan:
        samples = packed_samples(tokens, sizes.shape["vocab"])
        steps = make_steps(model, samples, tokens, device)
        for variant in variants:
            row: dict = {"tokens": tokens, "variant": variant}
            try:
                steps[variant]()  # warm-up: compiles FlexAttention on the first call at a length
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                times, _ = timed(steps[variant], sizes.repeats, device)
                row.update(
                    median_s=statistics.median(times), min_s=min(times),
                    tokens_per_s=tokens / statistics.median(times),
                    peak_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
                )  # fmt: skip
            except torch.OutOfMemoryError as exc:  # a finding (the plain step at 32k), not a failure
                row["out_of_memory"] = str(exc)[:200]
                model.zero_grad(set_to_none=True)  # a step that died midway leaves its gradients
            except Exception as exc:  # the other variants still run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                model.zero_grad(set_to_none=True)
            rows.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def check_attention(device: torch.device, sizes: Sizes, dtype: torch.dtype) -> dict:
    """One layer's attention, forward + backward, at ``attention_tokens`` in 16 documents (Qwen2-0.5B's
    14 query and 2 KV heads of 64): document attention (auto, flex, per-document SDPA) against one
    causal SDPA over the whole row and SDPA under the dense block-causal mask. Then the compiled
    FlexAttention's compiles over rows of 8 other lengths (dynamo's counters: graphs, recompiles,
    graph breaks): a compile per length would stall every new micro-batch shape."""
    import torch.nn.functional as F

    import grpo

    length, heads, kv_heads, dim = sizes.attention_tokens, 14, 2, 64
    g = torch.Generator().manual_seed(0)

    def tensor(h: int) -> torch.Tensor:
        return torch.randn(1, h, length, dim, generator=g).to(device, dtype).requires_grad_()

    q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
    grad = torch.randn(1, heads, length, dim, generator=g).to(device, dtype)
    cu = torch.arange(0, length + 1, length // ATTENTION_DOCUMENTS, device=device)
    document_ids = torch.repeat_interleave(torch.arange(ATTENTION_DOCUMENTS, device=device), length // ATTENTION_DOCUMENTS)
    variants = {
        "document_auto": lambda: grpo.document_attention(q, k, v, cu),
        "document_sdpa": lambda: grpo.document_attention(q, k, v, cu, backend="sdpa"),
        "causal_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    }
    if device.type == "cuda":
        variants["document_flex"] = lambda: grpo.document_attention(q, k, v, cu, backend="flex")
        dense = grpo.block_causal_mask(document_ids[None], dtype)
        variants["dense_mask_sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True)
    result: dict = {"tokens": length, "documents": ATTENTION_DOCUMENTS, "heads": [heads, kv_heads, dim], "ms": {}}
    for name, attend in variants.items():
        try:
            def step(attend=attend) -> None:
                attend().backward(grad)
                q.grad = k.grad = v.grad = None

            step()  # warm-up (compiles FlexAttention at this length)
            times, _ = timed(step, max(5, sizes.repeats), device)
            result["ms"][name] = {"median": 1e3 * statistics.median(times), "min": 1e3 * min(times)}
        except Exception as exc:
            result["ms"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if device.type == "cuda":
        from torch._dynamo.utils import counters

        before = dynamo_counters()
        for other in range(1, 9):  # 8 new lengths, each a multiple of 16 documents
            n = (length // 2 + other * 1040) // ATTENTION_DOCUMENTS * ATTENTION_DOCUMENTS
            qs, ks, vs = (torch.randn(1, h, n, dim, device=device, dtype=dtype) for h in (heads, kv_heads, kv_heads))
            grpo.document_attention(qs, ks, vs, torch.arange(0, n + 1, n // ATTENTION_DOCUMENTS, device=device), backend="flex")
        after = dynamo_counters()
        result["compiles_over_8_lengths"] = {key: after[key] - before.get(key, 0) for key in after}
        result["graph_breaks"] = dict(counters["graph_break"])
    return result


def dynamo_counters() -> dict[str, int]:
    """dynamo's running totals: frames compiled (``unique_graphs``), recompiles, graph breaks."""
    from torch._dynamo.utils import counters

    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "calls_captured": int(counters["stats"].get("calls_captured", 0)),
        "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0,
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def check_shared_prompt(device: torch.device, sizes: Sizes, dtype: torch.dtype) -> list[dict]:
    """One GRPO group per AdamW step, packed as today vs its prompt once (trainer_bench ``shared``)."""
    import grpo
    from prime_rl.trainer.batching import make_micro_batches
    from prime_rl.trainer.step import train_minibatch

    cases = SHARED_CASES if sizes.shape is QWEN2_05B else ((sizes.group_size, sizes.prompt_tokens),)
    model = qwen2_model(sizes.shape, 4096, dtype, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    rows: list[dict] = []
    for group, prompt in cases:
        lengths = (64, 256) if sizes.shape is QWEN2_05B else (4, 16)
        samples = group_samples(group, prompt, sizes.shape["vocab"], completions=lengths)
        completion = sum(len(s.completion_tokens) for s in samples)
        for layout in ("packed", "shared"):
            micro = make_micro_batches(samples, SHARED_ROW_TOKENS, share_prompts=layout == "shared")

            def step(micro=micro) -> None:
                train_minibatch(
                    model, optimizer, micro, None, grpo.Loss("intellect2"), temperature=1.0, constant=256.0,
                    max_grad_norm=1.0, device=device,
                )  # fmt: skip
                optimizer.zero_grad(set_to_none=True)

            row: dict = {"group": group, "prompt": prompt, "layout": layout}
            try:
                step()  # warm-up: compiles FlexAttention for the shared-prefix block mask
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                times, _ = timed(step, sizes.repeats, device)
                row.update(
                    median_s=statistics.median(times), min_s=min(times),
                    tokens_per_s=completion / statistics.median(times),
                    peak_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
                )  # fmt: skip
            except Exception as exc:  # e.g. out of memory: the other rows still run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                model.zero_grad(set_to_none=True)
            rows.append(row)
    return rows


def byte_tokenizer(vocab: int):
    """A Qwen2 (byte-level BPE) tokenizer of ``vocab`` ids made in code: one id per byte, no merges,
    the other ids decode to ``x<id>``. A Qwen2 directory must hold one: transformers loads every
    qwen2 tokenizer as ``Qwen2Tokenizer``."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    table.update({f"x{i}": i for i in range(len(table), vocab)})
    return Qwen2Tokenizer(
        vocab=table, merges=[], unk_token=None, bos_token=None, eos_token=None, pad_token=None
    )


def check_rollouts(device: torch.device, sizes: Sizes, dtype: torch.dtype, model_dir: Path | None) -> dict:
    """The honest worker's generation vs ``model.generate``, then the validator's verdicts and noise."""
    import numpy as np
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from validator_setup import TinyRun

    from prime_rl.api.protocol import PendingBatch
    from prime_rl.config import load_config
    from prime_rl.inference.backend import HFBackend, SamplingParams
    from prime_rl.inference.select import make_backend
    from prime_rl.validator.verdicts import validate_batch

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        if model_dir is None:
            model_dir = Path(scratch)
            qwen2_model(sizes.shape, 4096, dtype, device).save_pretrained(model_dir)
            byte_tokenizer(sizes.shape["vocab"]).save_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        vocab = len(tokenizer)
        dtype_name = "bfloat16" if dtype == torch.bfloat16 else "float32"
        config = load_config(None, ["--model.path", str(model_dir), "--model.dtype", dtype_name])
        batch_size = sizes.prompts * sizes.group_size
        backend = make_backend(config, backend="hf", device=device, max_batch_size=batch_size)
        g = np.random.default_rng(0)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        texts = {t: "".join(g.choice(letters, sizes.prompt_tokens)) for t in range(64)}  # a token a letter
        run = TinyRun(
            KEY, tokenizer, texts.__getitem__, 64, sizes.group_size, sizes.prompts, sizes.new_tokens
        )
        worker = run.worker("honest")
        # Cold: the first batch at these shapes (CUDA graph capture, attention kernels' plans per shape).
        cold, _ = timed(lambda: worker.answer(run.lease("gpu-check", 0, 0)[0], backend), 1, device)
        lease, record = run.lease("gpu-check", 0, 1)
        times, batch = timed(lambda: worker.answer(lease, backend), 1, device)
        worker_tokens = sum(len(s.completion_tokens) for s in batch.samples)
        generation = {"sequences": batch_size, "new_tokens": sizes.new_tokens, "worker_s": times[0],
                      "worker_tokens_per_s": worker_tokens / times[0], "worker_cold_s": cold[0],
                      "worker_decode": backend.decode, "graph_error": backend.graph_error}  # fmt: skip
        # The same decode loop with the other decode steps, warm (one full-length batch first).
        prompts_list = [s.prompt_tokens for s in batch.samples]
        seeds = [s.sampling_seed for s in batch.samples]
        params = SamplingParams(temperature=1.0, max_new_tokens=sizes.new_tokens)
        modes = ("dynamic", "static") + (("graph",) if device.type == "cuda" else ())
        for mode in modes:
            other = HFBackend(model_dir, model=backend.model, tokenizer=backend.tokenizer, device=device,
                              max_batch_size=batch_size, decode=mode)  # fmt: skip
            other.generate(prompts_list, seeds, params)
            elapsed, out = timed(lambda other=other: other.generate(prompts_list, seeds, params), 1, device)
            same = [list(c.completion_tokens) for c in out] == [list(s.completion_tokens) for s in batch.samples]
            generation[f"{mode}_tokens_per_s"] = batch_size * sizes.new_tokens / elapsed[0]
            generation[f"{mode}_same_tokens_as_worker"] = same

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        width = max(len(s.prompt_tokens) for s in batch.samples)  # left-padded: a real tokenizer's are ragged
        prompts = torch.tensor(
            [[0] * (width - len(s.prompt_tokens)) + s.prompt_tokens for s in batch.samples]
        )
        mask = torch.tensor(
            [[0] * (width - len(s.prompt_tokens)) + [1] * len(s.prompt_tokens) for s in batch.samples]
        )
        prompts, mask = prompts.to(device), mask.to(device)

        def plain_generate(new_tokens: int) -> torch.Tensor:
            with torch.no_grad():
                return model.generate(
                    prompts, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                    top_k=0, top_p=1.0, pad_token_id=0,
                )  # fmt: skip

        plain_generate(sizes.new_tokens)  # warm-up at full length: the same shapes as the timed call
        times, _ = timed(lambda: plain_generate(sizes.new_tokens), 1, device)
        generation.update(generate_s=times[0], generate_tokens_per_s=batch_size * sizes.new_tokens / times[0])

        eos = tokenizer.eos_token_id
        checks = dataclasses.replace(
            run.checks(), hidden_size=int(AutoConfig.from_pretrained(model_dir).hidden_size), vocab_size=vocab,
            eos_token_ids=frozenset([eos] if isinstance(eos, int) else []),
        )  # fmt: skip
        observed: list = []
        pending = PendingBatch(
            batch_id="gpu-check", worker_id=batch.worker_id, step=batch.step, batch_index=batch.batch_index,
            policy_version=batch.policy_version, received_at=time.time(), lease=record, samples=batch.samples,
        )  # fmt: skip

        def judge() -> list:
            observed.clear()
            return validate_batch(
                pending, tasks=run, backend_for=lambda version: backend, decode=run.decode, checks=checks,
                observe=lambda index, observations: observed.append(observations),
            )  # fmt: skip

        times, verdicts = timed(judge, 1, device)
    reasons = Counter(v.reason for v in verdicts)  # type: ignore[union-attr]
    validator = {
        "seconds": times[0], "samples": len(verdicts), "accepted": reasons.pop("ok", 0),  # type: ignore[arg-type]
        "rejected": dict(reasons),
        "noise": {
            "worst_sampling_margin": quantiles([float(o.sampling_margin.max()) for o in observed]),
            "mean_logprob_gap": quantiles([float(o.logprob_gap.mean()) for o in observed]),
            "proof_exp_mismatches": quantiles([float(o.proof_exp_mismatches.max()) for o in observed]),
        },
        "tolerances": {"sampling": checks.validator.sampling_tolerance, "logprob_atol": checks.validator.logprob_atol},
    }  # fmt: skip
    return {"generation": generation, "validator": validator}


def check_validation_cost(device: torch.device, sizes: Sizes, dtype: torch.dtype) -> dict:
    """Generation vs validation per sample on a Qwen2-0.5B-shaped model (module docstring)."""
    from validation_cost import Case, measure_case, run_of

    from prime_rl.config import load_config
    from prime_rl.inference.select import make_backend

    case = Case("qwen2-0.5b-shaped", sizes.prompts, sizes.group_size, sizes.cost_tokens)
    with tempfile.TemporaryDirectory(prefix="gpu_check_cost_") as scratch:
        model_dir = Path(scratch)
        qwen2_model(sizes.shape, 4096, dtype, device).save_pretrained(model_dir)
        tokenizer = byte_tokenizer(sizes.shape["vocab"])
        tokenizer.save_pretrained(model_dir)
        dtype_name = "bfloat16" if dtype == torch.bfloat16 else "float32"
        config = load_config(None, ["--model.path", str(model_dir), "--model.dtype", dtype_name])
        backend = make_backend(config, backend="hf", device=device, max_batch_size=case.prompts * case.group)
        letters = "abcdefghijklmnopqrstuvwxyz"
        prompts = {t: list(tokenizer("".join(letters[(t * 7 + i) % 26] for i in range(sizes.prompt_tokens)))["input_ids"])
                   for t in range(64)}  # fmt: skip
        run = run_of(tokenizer, prompts.__getitem__, 64, case, sizes.shape["hidden"])
        result = measure_case(run, backend, case, repeats=sizes.cost_repeats, device=device,
                              vocab_size=sizes.shape["vocab"], eos_ids=frozenset())  # fmt: skip
    return {**result, "goal_ratio": 1 / 20, "seed_claim_ratio": 1 / 100}


def _cost_rows(part: dict) -> list[tuple[str, str, str]]:
    gen, val = part["generation_s_per_sample"], part["validation_s_per_sample"]
    case = part["case"]
    return [
        ("cost", f"generation per sample ({case['new_tokens']} tokens)", f"{gen['median'] * 1e3:.1f} ms (min {gen['min'] * 1e3:.1f})"),
        ("cost", "validation per sample", f"{val['median'] * 1e3:.1f} ms (min {val['min'] * 1e3:.1f})"),
        ("cost", "validation / generation", f"{part['ratio_median']:.4f} (goal <= 0.05; verdicts {part['verdicts']})"),
    ]  # fmt: skip


def check_noise(device: torch.device, sizes: Sizes, dtype: torch.dtype, out: Path, partial: dict) -> dict:
    """The bf16 noise of this device, and what the bf16 per-sample rules make of honest work.

    The honest worker (``HFBackend`` as ``make_backend`` builds it: the CUDA-graph decode on a GPU)
    answers leases; the validator (``validate_batch``, a dynamic-decode ``HFBackend`` over the same
    weights, prefilling 16 samples at a time) judges them. First the calibration samples (their
    own prompts and seeds) give the :class:`toploc.NoiseProfile`; then held-out samples at each
    row's length are judged with ``for_precision(checks, dtype, profile)``: the rule a run's
    validator uses. Each row also says what the configured worst-margin rule (no profile) would
    have rejected. Rows are saved into ``out`` as they finish (``partial`` is the result so far).
    """
    import numpy as np
    from transformers import AutoConfig, AutoTokenizer
    from validator_setup import TinyRun

    import toploc
    from prime_rl.api.protocol import PendingBatch
    from prime_rl.config import load_config
    from prime_rl.inference.backend import HFBackend
    from prime_rl.inference.select import make_backend
    from prime_rl.validator.checks import Checks, sampling_problem
    from prime_rl.validator.tolerances import for_precision
    from prime_rl.validator.verdicts import validate_batch

    dtype_name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    result: dict = {"dtype": dtype_name, "rows": []}
    partial["noise"] = result
    with tempfile.TemporaryDirectory(prefix="gpu_check_noise_") as scratch:
        model_dir = Path(scratch)
        qwen2_model(sizes.shape, 8192 + 1024, dtype, device).save_pretrained(model_dir)
        byte_tokenizer(sizes.shape["vocab"]).save_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        config = load_config(None, ["--model.path", str(model_dir), "--model.dtype", dtype_name])
        widest = max(r.prompts * r.group for r in (*sizes.noise_rows, sizes.noise_calibration))
        worker_backend = make_backend(config, backend="hf", device=device, max_batch_size=widest)
        judge_backend = HFBackend(model_dir, model=worker_backend.model, tokenizer=tokenizer, device=device,
                                  max_batch_size=16, decode="dynamic")  # fmt: skip
        eos = tokenizer.eos_token_id
        hidden_size = int(AutoConfig.from_pretrained(model_dir).hidden_size)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        result["worker_decode"] = worker_backend.decode

        def judge(row: NoiseRow, name: str, text_seed: int, rule_of) -> tuple[Counter, list, Checks, float, float]:
            g = np.random.default_rng(text_seed)
            texts = {t: "".join(g.choice(letters, row.prompt)) for t in range(64)}  # a token a letter
            run = TinyRun(KEY, tokenizer, texts.__getitem__, 64, row.group, row.prompts, row.new)
            base = dataclasses.replace(
                run.checks(), hidden_size=hidden_size, vocab_size=len(tokenizer),
                eos_token_ids=frozenset([eos] if isinstance(eos, int) else []),
            )  # fmt: skip
            checks = rule_of(base)
            worker = run.worker("honest")
            reasons: Counter = Counter()
            observed: list = []
            generate_s = judge_s = 0.0
            for index in range(row.leases):
                lease, record = run.lease(name, 0, index)
                began = time.perf_counter()
                batch = worker.answer(lease, worker_backend)
                sync(device)
                generate_s += time.perf_counter() - began
                pending = PendingBatch(
                    batch_id=f"{name}-{index}", worker_id=batch.worker_id, step=batch.step,
                    batch_index=batch.batch_index, policy_version=batch.policy_version, received_at=time.time(),
                    lease=record, samples=batch.samples,
                )  # fmt: skip
                began = time.perf_counter()
                verdicts = validate_batch(
                    pending, tasks=run, backend_for=lambda version: judge_backend, decode=run.decode,
                    checks=checks, observe=lambda i, observations: observed.append(observations),
                )  # fmt: skip
                sync(device)
                judge_s += time.perf_counter() - began
                reasons.update(v.reason for v in verdicts)
            return reasons, observed, base, generate_s, judge_s

        cal = sizes.noise_calibration
        reasons, observations, base, generate_s, judge_s = judge(cal, "noise-calibration", 1, lambda c: c)
        profile = toploc.NoiseProfile.calibrate(
            observations, description={"device": str(device), "dtype": dtype_name}
        )
        accepted = reasons.pop("ok", 0)
        result["calibration"] = {
            "samples": cal.samples, "prompt": cal.prompt, "new": cal.new,
            "accepted_by_configured_rule": accepted, "rejected_by_configured_rule": dict(reasons),
            "tokens": sum(o.num_tokens for o in observations), "generate_s": generate_s, "judge_s": judge_s,
            "noise": noise_quantiles(observations),
            "statistics": [statistic.summary() for statistic in profile.statistics],
        }  # fmt: skip
        rule = for_precision(base, dtype_name, profile)
        result["rule"] = {
            "sampling_tolerance": rule.sampling_rule.tolerance if rule.sampling_rule else None,
            "rate": rule.sampling_rule.rate if rule.sampling_rule else None,
            "hard_limit": rule.sampling_rule.hard_limit if rule.sampling_rule else None,
            "logprob_atol": rule.validator.logprob_atol,
        }
        out.write_text(json.dumps(partial, indent=1, default=str) + "\n")
        for number, row in enumerate(sizes.noise_rows):
            began = time.perf_counter()
            try:
                reasons, observations, base, generate_s, judge_s = judge(
                    row, f"noise-test-{number}", 100 + number, lambda c: for_precision(c, dtype_name, profile)
                )
            except Exception as exc:
                result["rows"].append({"prompt": row.prompt, "new": row.new, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                continue
            configured = sum(
                sampling_problem(
                    torch.from_numpy(o.sampling_margin), tolerance=base.validator.sampling_tolerance,
                    max_mismatch_fraction=base.validator.sampling_max_mismatch_fraction,
                ) is not None or float(o.logprob_gap.mean()) > base.validator.logprob_atol
                for o in observations
            )  # fmt: skip
            accepted = reasons.pop("ok", 0)
            result["rows"].append({
                "prompt": row.prompt, "new": row.new, "tokens": row.prompt + row.new, "samples": row.samples,
                "accepted": accepted, "rejected": dict(reasons),
                "configured_rule_would_reject": configured, "observed": len(observations),
                "generate_s": generate_s, "judge_s": judge_s, "seconds": time.perf_counter() - began,
                "noise": noise_quantiles(observations),
            })  # fmt: skip
            out.write_text(json.dumps(partial, indent=1, default=str) + "\n")
    return result


def noise_quantiles(observations: list) -> dict:
    """Per sample: worst sampling margin, mean log-prob gap, most proof exponent mismatches."""
    return {
        "worst_sampling_margin": quantiles([float(o.sampling_margin.max()) for o in observations]),
        "mean_logprob_gap": quantiles([float(o.logprob_gap.mean()) for o in observations]),
        "proof_exp_mismatches": quantiles(
            [float(o.proof_exp_mismatches.max()) for o in observations if o.proof_exp_mismatches.size]
        ),
    }


def quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "max": ordered[-1],
    }


def table(result: dict) -> str:
    """One table of every figure (what, value), section by section (sections not run are left out)."""
    env = result["environment"]
    lines = [f"gpu_check on {env['device']} (driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, "
             f"transformers {env['transformers']}), {'smoke' if result['smoke'] else 'full'} sizes, "
             f"{result['seconds']:.0f} s"]  # fmt: skip
    rows: list[tuple[str, str, str]] = []
    for name, rows_of in TABLE_ROWS.items():
        part = result.get(name)
        if part is None:
            continue
        if isinstance(part, dict) and "error" in part:
            rows.append((name, "error", part["error"]))
            continue
        rows.extend(rows_of(part))
    width = max(len(r[1]) for r in rows)
    lines += [f"{section:11} {name:{width}}  {value}" for section, name, value in rows]
    return "\n".join(lines)


def _toploc_rows(part: dict) -> list[tuple[str, str, str]]:
    rows = []
    for path in ("cpu", "gpu_kernels", "gpu_torch"):
        if path not in part:
            continue
        f = part[path]
        value = f"build {f['build_ms']:.2f} ms, verify {f['verify_ms']:.2f} ms, stream {f['stream_ms']:.2f} ms"
        if path != "cpu":
            value += (f"; verify/build at {part['verify_tokens']:,} tokens {f['verify_over_build']:.2f}x; "
                      f"proofs equal CPU: {f['proofs_equal_cpu'] and f['proofs_at_verify_tokens_equal_cpu']}, "
                      f"verdicts equal: {f['verdicts_equal_cpu']}")  # fmt: skip
        rows.append(("toploc", path, value))
    rows.append(("toploc", "kernels", str(part["kernels"])))
    if stages := part.get("gpu_kernels", {}).get("stages_ms"):
        rows.append(("toploc", "verify stages", ", ".join(f"{name} {ms:.2f} ms" for name, ms in stages.items())))
    return rows


def _attention_rows(part: dict) -> list[tuple[str, str, str]]:
    rows = []
    for name, f in part["ms"].items():
        value = f.get("error") or f"{f['median']:.3f} ms fwd+bwd (min {f['min']:.3f})"
        rows.append(("attention", f"{name} @ {part['tokens']} / {part['documents']} docs", value))
    if "compiles_over_8_lengths" in part:
        rows.append(("attention", "flex over 8 new lengths", str(part["compiles_over_8_lengths"])))
    return rows


def _step_rows(section: str, name_of, rate: str):
    def rows_of(part: list) -> list[tuple[str, str, str]]:
        rows = []
        for row in part:
            if "error" in row or "out_of_memory" in row:
                rows.append((section, name_of(row), row.get("error") or "out of memory"))
                continue
            peak = f", peak {row['peak_gib']:.1f} GiB" if row.get("peak_gib") is not None else ""
            rows.append((section, name_of(row), f"{1e3 * row['median_s']:.0f} ms (min {1e3 * row['min_s']:.0f}), "
                         f"{row['tokens_per_s']:,.0f} {rate}{peak}"))  # fmt: skip
        return rows

    return rows_of


def _rollout_rows(part: dict) -> list[tuple[str, str, str]]:
    gen, val = part["generation"], part["validator"]
    modes = ", ".join(f"{m} {gen[f'{m}_tokens_per_s']:,.0f}" for m in ("dynamic", "static", "graph") if f"{m}_tokens_per_s" in gen)
    rows = [
        ("generation", f"{gen['sequences']} x {gen['new_tokens']}",
         f"worker ({gen.get('worker_decode')}) {gen['worker_tokens_per_s']:,.0f} tok/s (cold {gen.get('worker_cold_s', 0):.1f} s), "
         f"model.generate {gen['generate_tokens_per_s']:,.0f} tok/s"),
        ("generation", "decode steps, warm", f"{modes} tok/s; graph error: {gen.get('graph_error')}"),
        ("validator", f"{val['samples']} samples", f"accepted {val['accepted']}, rejected {val['rejected']}, {val['seconds']:.2f} s"),
    ]  # fmt: skip
    rows += [("validator", name, _quantile_text(q)) for name, q in val["noise"].items() if q is not None]
    return rows


def _noise_rows(part: dict) -> list[tuple[str, str, str]]:
    rows = []
    if "calibration" in part:
        cal = part["calibration"]
        rows.append(("noise", f"calibration {cal['samples']} x {cal['prompt']}+{cal['new']}",
                     f"{cal['tokens']:,} tokens; rule {part.get('rule')}"))  # fmt: skip
    for row in part.get("rows", []):
        name = f"{row.get('samples', '')} x {row['prompt']}+{row['new']}"
        if "error" in row:
            rows.append(("noise", name, row["error"]))
            continue
        rows.append(("noise", name, f"accepted {row['accepted']}, rejected {row['rejected']} "
                     f"(configured rule alone: {row['configured_rule_would_reject']}); "
                     f"margin {_quantile_text(row['noise']['worst_sampling_margin'])}"))  # fmt: skip
    return rows


def _quantile_text(q: dict | None) -> str:
    return "-" if q is None else f"p50 {q['p50']:.4g}, p90 {q['p90']:.4g}, max {q['max']:.4g}"


TABLE_ROWS = {
    "toploc": _toploc_rows,
    "attention": _attention_rows,
    "trainer": _step_rows("trainer", lambda r: f"{r.get('variant', '')} @ {r.get('tokens', '')}", "tok/s"),
    "shared_prompt": _step_rows(
        "prompt", lambda r: f"{r.get('layout', '')} G={r.get('group', '')} P={r.get('prompt', '')}", "loss tok/s"
    ),
    "rollouts": _rollout_rows,
    "noise": _noise_rows,
    "validation_cost": _cost_rows,
}


def failures(result: dict) -> list[str]:
    """Every section or row that recorded an error."""
    found = []
    for name in TABLE_ROWS:
        part = result.get(name)
        if isinstance(part, dict) and "error" in part:
            found.append(name)
        if isinstance(part, list):
            rows = part
        elif isinstance(part, dict):
            rows = part.get("rows", [])  # noise
            found += [f"{name} {k}" for k, v in part.get("ms", {}).items() if "error" in v]  # attention
        else:
            continue  # a section not run
        found += [f"{name} row {i}" for i, row in enumerate(rows) if "error" in row]
    return found


def guarded(fn, *args) -> dict | list:
    try:
        return fn(*args)
    except Exception as exc:
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device (CI runs it on the CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--model", type=Path, help="a local HF model directory for the generation and validator rows"
    )
    parser.add_argument("--out", type=Path, help="where the JSON goes")
    parser.add_argument("--sections", help="comma-separated sections to run (default: all, in order)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sizes = SMOKE if args.smoke else FULL
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = args.out or HERE / "results" / ("gpu_check_smoke.json" if args.smoke else "gpu_check.json")
    start = time.perf_counter()
    result: dict = {"smoke": args.smoke, "environment": environment(device), "dtype": str(dtype)}
    out.parent.mkdir(parents=True, exist_ok=True)
    sections = {
        "toploc": (check_toploc, (device, sizes)),
        "attention": (check_attention, (device, sizes, dtype)),
        "trainer": (check_trainer, (device, sizes, dtype)),
        "shared_prompt": (check_shared_prompt, (device, sizes, dtype)),
        "rollouts": (check_rollouts, (device, sizes, dtype, args.model)),
        "noise": (check_noise, (device, sizes, dtype, out, result)),
        "validation_cost": (check_validation_cost, (device, sizes, dtype)),
    }
    chosen = args.sections.split(",") if args.sections else list(sections)
    if unknown := set(chosen) - set(sections):
        parser.error(f"unknown sections {sorted(unknown)}; choose from {list(sections)}")
    for name in chosen:
        check, check_args = sections[name]
        began = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        result[name] = guarded(check, *check_args)
        result.setdefault("section_seconds", {})[name] = time.perf_counter() - began
        result.setdefault("dynamo", {})[name] = dynamo_counters()
        result["seconds"] = time.perf_counter() - start
        # Saved after every section: a run stopped at its time limit keeps what it measured.
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"[gpu_check] {name} done in {result['section_seconds'][name]:.1f} s", flush=True)
    print(table(result))
    print(f"JSON: {out}")
    if failed := failures(result):
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
