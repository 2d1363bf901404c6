"""Benchmark: ``VLLMBackend.generate`` stepping its engine by hand vs ``LLM.generate`` on the same requests.

Since in-flight updates (``docs/inflight.md``) the vLLM backend adds a batch's requests and calls
``LLMEngine.step`` itself, with ``DELTA`` outputs (one ``RequestOutput`` per request per step), so
that it can count tokens and switch versions between steps. Before, it called ``LLM.generate``
(``FINAL_ONLY`` outputs, the same step loop inside vLLM). This measures what the hand loop costs:
both paths draw the same seeded tokens with proofs (``toploc.vllm.checkable`` + ``collect``), on one
in-process engine, alternating call by call (one untimed call of each first), no version source.

Run: ``.venv/bin/python benchmarks/vllm_step_loop.py [--batch 16] [--new 64] [--repeats 5] [--hidden 256]
[--out benchmarks/results/vllm_step_loop.md]``. Reports min and median wall time per call and
generated tokens per second; the tokens of both paths must be equal (checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from tiny_lm import save_tiny_lm

from prime_rl.inference.contract import PROOF_CHUNK, SAMPLER_SEED, SamplingParams, proof_topk
from prime_rl.inference.vllm_backend import EngineMemory, VLLMBackend


def llm_generate(backend: VLLMBackend, prompts: list[list[int]], seeds: list[int], params: SamplingParams) -> list:
    """The backend's previous path: ``LLM.generate`` on the same checkable requests, then ``collect``."""
    from vllm import SamplingParams as VLLMParams
    from vllm import TokensPrompt

    from toploc.vllm import checkable, collect

    base = VLLMParams(max_tokens=params.max_new_tokens, stop_token_ids=sorted(backend.eos_token_ids), ignore_eos=True)
    requests = [
        checkable(base, seed=SAMPLER_SEED, sequence_id=s, temperature=params.temperature,
                  decode_batching_size=PROOF_CHUNK, topk=proof_topk(backend.hidden_size))
        for s in seeds
    ]  # fmt: skip
    outputs = backend.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], requests, use_tqdm=False)
    return [tuple(r.token_ids) for r in collect(requests, outputs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_lm(Path(tmp) / "model", hidden_size=args.hidden, num_layers=4)
        backend = VLLMBackend(model_dir, max_batch_size=args.batch, memory=EngineMemory(kv_cache_bytes=64 << 20, max_model_len=512))
        backend.eos_token_ids = frozenset()  # fixed lengths: both paths generate batch x new tokens
        prompts = [[3 + (7 * i + j) % 90 for j in range(32)] for i in range(args.batch)]
        seeds = list(range(1, args.batch + 1))
        params = SamplingParams(temperature=1.0, max_new_tokens=args.new)
        paths = {
            "LLM.generate (before)": lambda: llm_generate(backend, prompts, seeds, params),
            "VLLMBackend.generate, hand-stepped (now)": lambda: [
                c.completion_tokens for c in backend.generate(prompts, seeds, params)
            ],
        }
        tokens = {name: run() for name, run in paths.items()}  # untimed first calls
        assert len(set(map(tuple, tokens.values()))) == 1, "the two paths drew different tokens"
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.repeats):
            for name, run in paths.items():
                started = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - started)
    generated = args.batch * args.new
    lines = [
        f"vLLM step loop: tiny Llama H={args.hidden}, 4 layers, fp32, {args.batch} x 32 prompt tokens x {args.new} new "
        f"tokens, {args.repeats} alternating repeats, torch threads {torch.get_num_threads()}",
        "",
        "| path | min s | median s | tokens/s (min) |",
        "|---|---|---|---|",
    ]
    for name, values in times.items():
        lines.append(f"| {name} | {min(values):.3f} | {statistics.median(values):.3f} | {generated / min(values):.0f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
