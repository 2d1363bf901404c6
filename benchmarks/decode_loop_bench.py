"""Benchmark: HFBackend's decode loop before and after it kept its tokens on the device, vs ``model.generate``.

Interleaved in one process so that a loaded machine slows every path alike: each round times
``model.generate(do_sample=True)`` (no proofs, no seeded sampler, no log-probs), the old loop
(``reference_generate`` of ``packages/prime_rl/tests/test_backend_decode.py``, the equivalence
test's oracle: ``.tolist()`` per step, per-step ``ProofBuilder.add``, ``torch.cat`` of the mask)
and ``HFBackend.generate`` (the new loop), all with proofs and the seeded sampler except the first.
Model and prompts are ``rollout_bench.py``'s (random Llama h=256, 4 layers, V=32000, fp32,
16 x 32 prompt tokens, 64 new tokens, no EOS). The old and new loop must give equal outputs.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/decode_loop_bench.py [--rounds 5]
[--device cuda] [--new 64] [--batch 16]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "prime_rl" / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # the test's tiny_lm
from rollout_bench import PROMPT, VOCAB, build
from test_backend_decode import as_tuples, reference_generate

from prime_rl.inference.backend import HFBackend, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, tokenizer = build()
    backend = HFBackend("unused", model=model, tokenizer=tokenizer, device=device, max_batch_size=args.batch)
    backend.eos_token_ids = frozenset()
    prompts = torch.randint(2, VOCAB, (args.batch, PROMPT), generator=torch.Generator().manual_seed(1))
    prompt_lists, seeds = prompts.tolist(), list(range(args.batch))
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new)
    ids = prompts.to(device)

    def hf_generate() -> object:
        with torch.no_grad():
            return model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=args.new,
                min_new_tokens=args.new, top_k=0, top_p=1.0, pad_token_id=0, eos_token_id=None,
            )  # fmt: skip

    def old_loop() -> object:
        with torch.no_grad():
            return reference_generate(backend, prompt_lists, seeds, params)

    def new_loop() -> object:
        return as_tuples(backend.generate(prompt_lists, seeds, params))

    paths = {"model.generate (no proofs)": hf_generate, "old loop (proofs+seed)": old_loop,
             "HFBackend.generate (proofs+seed)": new_loop}  # fmt: skip
    assert old_loop() == new_loop(), "the new loop must give the old loop's outputs"
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    tokens = args.batch * args.new
    base = min(times["model.generate (no proofs)"])
    print(f"random Llama, {args.batch} seqs x {PROMPT}+{args.new} tokens, {device}, {args.threads} threads, "
          f"{args.rounds} interleaved rounds, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'path':<34}{'min s':>8}{'median s':>10}{'tok/s (min)':>13}{'vs generate':>13}")
    for name, walls in times.items():
        low = min(walls)
        print(f"{name:<34}{low:>8.3f}{statistics.median(walls):>10.3f}{tokens / low:>13.0f}{base / low:>12.2f}x")


if __name__ == "__main__":
    main()
