"""GPU check: every role's tensor path on one GPU, measured, in one command and one table.

    python benchmarks/gpu_check.py                 # on a GPU: under 5 minutes, no model hub
    python benchmarks/gpu_check.py --smoke         # tiny sizes on the CPU (CI runs this)
    python benchmarks/gpu_check.py --model DIR     # a local HF model directory instead of the random one

Sections (each measured in this process, on the same device; a section that fails records its
error and the others still run):

* ``toploc``: proofs built by the CUDA kernels, by torch on the GPU (``TOPLOC_CUDA=0``) and on the
  CPU must be byte-identical, and verification results equal; timings of batch build (8,192
  tokens, H = 5120), verify (65,536 tokens) and the streaming ``ProofBuilder`` (256 x 32 tokens);
* ``trainer``: one AdamW step (grpo "intellect2") on a packed row of 4,096 and 16,384 tokens,
  16 sequences, bf16: document attention with the chunked head, with full logits and with
  activation checkpointing, today's dense-mask step, and a plain HF step (``benchmarks/trainer_bench.py`` has the steps); time,
  peak memory, tokens/s;
* ``prompt`` (shared prompt): one AdamW step on one GRPO group (``G`` = 8, 16; prompts of 150 and
  1,000 tokens; completions 64-256), packed as today against the prompt computed once
  (FlexAttention with the shared-prefix block mask); time, peak memory, completion tokens/s;
* ``generation``: the honest worker's generation (``make_backend(..., backend="hf")``, seeded
  sampler, streaming proofs, log-probs) vs ``model.generate`` on the same prompts, 64 x 256 tokens;
* ``validator``: ``validate_batch`` judging those rollouts on the GPU: accepted and rejected
  counts by reason, and the honest noise (per sample: worst sampling margin, mean log-prob gap,
  most proof exponent mismatches) as quantiles.

The model is Qwen2-0.5B-shaped with random weights, built from a config in code (``--model``
takes a local directory instead). The JSON (``--out``; default ``benchmarks/results/gpu_check.json``,
or ``gpu_check_smoke.json`` with ``--smoke``) names the device, driver, torch and transformers.
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


FULL = Sizes(QWEN2_05B, (4096, 16384), 3, 8192, 65536, 5120, 256, 8, 8, 32, 256)
SMOKE = Sizes(
    {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 1000},
    (256,), 1, 256, 512, 256, 4, 2, 2, 8, 8,
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
            stream_times, gpu_stream = timed(lambda: stream(on_gpu[2]), repeats, device)
        result[name] = {
            "build_ms": 1e3 * statistics.median(build_times),
            "verify_ms": 1e3 * statistics.median(verify_times),
            "stream_ms": 1e3 * statistics.median(stream_times),
            "proofs_equal_cpu": gpu_proofs == cpu_proofs and gpu_stream == cpu_stream,
            "verdicts_equal_cpu": gpu_results == cpu_results,
        }
    from toploc import cuda as toploc_cuda

    bits = on_gpu[0].view(torch.int16).reshape(1, -1)
    result["kernels"] = (
        "available" if toploc_cuda.available(bits, 128) else "unavailable: gpu_kernels ran torch"
    )
    return result


def check_trainer(device: torch.device, sizes: Sizes, dtype: torch.dtype) -> list[dict]:
    """Each step variant at each length: median and min time, peak memory, tokens/s."""
    rows: list[dict] = []
    model = qwen2_model(sizes.shape, max(sizes.trainer_tokens), dtype, device)
    for tokens in sizes.trainer_tokens:
        samples = packed_samples(tokens, sizes.shape["vocab"])
        steps = make_steps(model, samples, tokens, device)
        for variant in ("document", "document_full", "document_ckpt", "dense", "plain"):
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
            except Exception as exc:  # e.g. out of memory: the other variants still run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                model.zero_grad(set_to_none=True)  # a step that died midway leaves its gradients
            rows.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


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
        short = dataclasses.replace(run, max_new_tokens=min(8, sizes.new_tokens))
        worker.answer(short.lease("gpu-check", 0, 0)[0], backend)  # warm-up (8 tokens)
        lease, record = run.lease("gpu-check", 0, 1)
        times, batch = timed(lambda: worker.answer(lease, backend), 1, device)
        worker_tokens = sum(len(s.completion_tokens) for s in batch.samples)
        generation = {"sequences": batch_size, "new_tokens": sizes.new_tokens, "worker_s": times[0],
                      "worker_tokens_per_s": worker_tokens / times[0]}  # fmt: skip

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

        plain_generate(min(8, sizes.new_tokens))  # warm-up
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
    """One table of every figure (what, value), section by section."""
    lines = [f"gpu_check on {result['environment']['device']} (driver {result['environment']['driver']}, "
             f"torch {result['environment']['torch']}, CUDA {result['environment']['cuda']}), "
             f"{'smoke' if result['smoke'] else 'full'} sizes, {result['seconds']:.0f} s"]  # fmt: skip
    rows: list[tuple[str, str, str]] = []
    toploc_result = result["toploc"]
    if "error" in toploc_result:
        rows.append(("toploc", "error", toploc_result["error"]))
    else:
        for path in ("cpu", "gpu_kernels", "gpu_torch"):
            if path in toploc_result:
                figures = toploc_result[path]
                equal = (
                    ""
                    if path == "cpu"
                    else f"; proofs equal CPU: {figures['proofs_equal_cpu']}, verdicts equal: {figures['verdicts_equal_cpu']}"
                )
                rows.append(("toploc", path, f"build {figures['build_ms']:.2f} ms, verify {figures['verify_ms']:.2f} ms, "
                             f"stream {figures['stream_ms']:.2f} ms{equal}"))  # fmt: skip
        rows.append(("toploc", "kernels", str(toploc_result["kernels"])))
    for row in result["trainer"] if isinstance(result["trainer"], list) else [result["trainer"]]:
        name = f"{row.get('variant', '')} @ {row.get('tokens', '')}"
        if "error" in row:
            rows.append(("trainer", name, row["error"]))
        else:
            peak = f", peak {row['peak_gib']:.1f} GiB" if row["peak_gib"] is not None else ""
            rows.append(("trainer", name, f"{1e3 * row['median_s']:.0f} ms (min {1e3 * row['min_s']:.0f}), "
                         f"{row['tokens_per_s']:,.0f} tok/s{peak}"))  # fmt: skip
    for row in (
        result["shared_prompt"] if isinstance(result["shared_prompt"], list) else [result["shared_prompt"]]
    ):
        name = f"{row.get('layout', '')} G={row.get('group', '')} P={row.get('prompt', '')}"
        if "error" in row:
            rows.append(("prompt", name, row["error"]))
        else:
            peak = f", peak {row['peak_gib']:.1f} GiB" if row["peak_gib"] is not None else ""
            rows.append(
                (
                    "prompt",
                    name,
                    f"{1e3 * row['median_s']:.0f} ms, {row['tokens_per_s']:,.0f} loss tok/s{peak}",
                )
            )
    rollouts = result["rollouts"]
    if "error" in rollouts:
        rows.append(("rollouts", "error", rollouts["error"]))
    else:
        gen, val = rollouts["generation"], rollouts["validator"]
        rows.append(("generation", f"{gen['sequences']} x {gen['new_tokens']}",
                     f"worker {gen['worker_tokens_per_s']:,.0f} tok/s, model.generate {gen['generate_tokens_per_s']:,.0f} tok/s"))  # fmt: skip
        rows.append(
            (
                "validator",
                f"{val['samples']} samples",
                f"accepted {val['accepted']}, rejected {val['rejected']}, {val['seconds']:.2f} s",
            )
        )
        for name, q in val["noise"].items():
            if q is not None:
                rows.append(
                    ("validator", name, f"p50 {q['p50']:.4g}, p90 {q['p90']:.4g}, max {q['max']:.4g}")
                )
    width = max(len(r[1]) for r in rows)
    lines += [f"{section:11} {name:{width}}  {value}" for section, name, value in rows]
    return "\n".join(lines)


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
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sizes = SMOKE if args.smoke else FULL
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = args.out or HERE / "results" / ("gpu_check_smoke.json" if args.smoke else "gpu_check.json")
    start = time.perf_counter()
    result: dict = {"smoke": args.smoke, "environment": environment(device), "dtype": str(dtype)}
    out.parent.mkdir(parents=True, exist_ok=True)
    sections = (
        ("toploc", check_toploc, (device, sizes)),
        ("trainer", check_trainer, (device, sizes, dtype)),
        ("shared_prompt", check_shared_prompt, (device, sizes, dtype)),
        ("rollouts", check_rollouts, (device, sizes, dtype, args.model)),
    )
    for name, check, check_args in sections:
        began = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        result[name] = guarded(check, *check_args)
        result.setdefault("section_seconds", {})[name] = time.perf_counter() - began
        result["seconds"] = time.perf_counter() - start
        # Saved after every section: a run stopped at its time limit keeps what it measured.
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"[gpu_check] {name} done in {result['section_seconds'][name]:.1f} s", flush=True)
    print(table(result))
    print(f"JSON: {out}")
    failed = any("error" in part for part in (result["toploc"], result["rollouts"]) if isinstance(part, dict))
    for trainer in (result["trainer"], result["shared_prompt"]):
        failed |= isinstance(trainer, dict) or any("error" in row for row in trainer)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
