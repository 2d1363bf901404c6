"""Benchmark: one trainer optimizer step with the chunked LM head vs full logits, on CPU.

``prime_rl.trainer.step.train_minibatch`` on one packed micro-batch, ``fused_lm_head=True``
(completion log-probs and entropy from ``grpo.logprobs_from_hidden`` inside the forward, the
default) vs ``False`` (the model's ``[1, L, V]`` logits, then log-softmax: what a plain HF
trainer does). The model is a random 2-layer Llama with Qwen2.5's vocabulary (V = 151936) and
hidden size 256, so the LM head dominates as it does in small policies (Qwen2.5-0.5B: the head
is 14% of the weights, its logits the largest activation). The row holds 8 sequences of 64
prompt + 192 completion tokens (2048 tokens, 1536 completion tokens); the recipe is
INTELLECT-2's (entropy bonus on, so both paths also compute the entropy).

Memory: peak extra RSS of one step in a fresh child process (as in ``grpo_bench.py``: the
kernel's high-water mark is reset after the model and batch are built). Time: the two variants
alternate in one child; wall min/median and process CPU time median.

Run: ``.venv/bin/python benchmarks/trainer_bench.py [--repeats 3] [--tokens 2048]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

from grpo_bench import reset_peak, status_kib

VOCAB = 151936
HIDDEN = 256
PROMPT, COMPLETION = 64, 192


def build(tokens: int):
    """A model, optimizer and one micro-batch; returns ``step(fused) -> None``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import grpo
    from prime_rl.api.protocol import TrainSample
    from prime_rl.trainer.batching import make_micro_batches

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.0
    )  # no optimizer state: the step is forward+backward
    count = tokens // (PROMPT + COMPLETION)
    samples = [
        TrainSample(
            sample_id=f"b/{i}", batch_id="b", worker_id="w", task_id=i // 4, group_index=i % 4,
            policy_version=0, prompt_tokens=torch.randint(0, VOCAB, (PROMPT,)).tolist(),
            completion_tokens=torch.randint(0, VOCAB, (COMPLETION,)).tolist(),
            behaviour_logprobs=[-12.0] * COMPLETION, temperature=1.0, reward=float(i % 2), advantage=(-1.0) ** i,
        )
        for i in range(count)
    ]  # fmt: skip
    micro = make_micro_batches(samples, tokens)
    loss = grpo.Loss("intellect2")

    def step(fused: bool) -> None:
        from prime_rl.trainer.step import train_minibatch

        train_minibatch(
            model, optimizer, micro, None, loss, temperature=1.0, constant=float(COMPLETION),
            max_grad_norm=1.0, device=torch.device("cpu"), fused_lm_head=fused,
        )  # fmt: skip
        optimizer.zero_grad(set_to_none=True)

    return step


def measure_memory(tokens: int, fused: bool) -> dict[str, float]:
    step = build(tokens)
    step(fused)  # warm-up: lazy init, allocator arenas, gradient buffers exist from here on
    gc.collect()
    before = status_kib("VmRSS")
    exact = reset_peak()
    step(fused)
    peak = status_kib("VmHWM") if exact else status_kib("VmPeak")
    return {"peak_extra_mib": (peak - before) / 1024}


def measure_time(tokens: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    step = build(tokens)
    step(True), step(False)
    times: dict[str, dict[str, list[float]]] = {v: {"wall": [], "cpu": []} for v in ("full", "fused")}
    for _ in range(repeats):
        for variant in ("full", "fused"):
            wall, cpu = time.perf_counter(), time.process_time()
            step(variant == "fused")
            times[variant]["wall"].append(time.perf_counter() - wall)
            times[variant]["cpu"].append(time.process_time() - cpu)
    return times


def _child(*args: str) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    argv = [sys.executable, __file__, "--child", *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens in the packed row")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, variant = args.child
        if kind == "memory":
            print(json.dumps(measure_memory(args.tokens, variant == "fused")))
        else:
            print(json.dumps(measure_time(args.tokens, args.repeats)))
        return
    import torch

    logits_mib = args.tokens * VOCAB * 4 / 2**20
    print(
        f"trainer step benchmark (CPU): torch {torch.__version__}, {os.cpu_count()} cores, load avg "
        f"{os.getloadavg()[0]:.1f}; Llama 2 layers H={HIDDEN} V={VOCAB}; one row of {args.tokens} tokens "
        f"(fp32 logits {logits_mib:.0f} MiB); recipe intellect2 (entropy on); {args.repeats} alternating repeats"
    )
    memory = {
        v: _child("memory", v, "--tokens", str(args.tokens))["peak_extra_mib"] for v in ("full", "fused")
    }
    times = _child("time", "-", "--tokens", str(args.tokens), "--repeats", str(args.repeats))
    header = f"{'variant':24} {'peak extra MiB':>14} {'mem/full':>8} {'wall min s':>10} {'wall med s':>10} {'cpu med s':>9} {'cpu/full':>8}"
    print(header)
    print("-" * len(header))
    for variant, title in (("full", "full logits (HF way)"), ("fused", "chunked head (default)")):
        cpu = statistics.median(times[variant]["cpu"])
        print(
            f"{title:24} {memory[variant]:14.0f} {memory[variant] / memory['full']:8.3f} "
            f"{min(times[variant]['wall']):10.3f} {statistics.median(times[variant]['wall']):10.3f} "
            f"{cpu:9.3f} {cpu / statistics.median(times['full']['cpu']):8.3f}"
        )


if __name__ == "__main__":
    main()
