"""Feasibility of the embedded demo: does INTELLECT-2's GRPO raise SmolLM2-135M's held-out addition
accuracy within a CPU budget? One process (the loop of examples/grpo_one_process.py: rewards from
`verifiers`, advantages and loss from `grpo`; no orchestrator, no proofs), so it measures only the
learning signal and the compute per step that `configs/tiny-cpu.toml` is sized from.

Run: .venv/bin/python benchmarks/recipe_feasibility.py --steps 12 --eval-every 4
Any flag of examples/grpo_one_process.py may follow and overrides the demo's (e.g. --lr 3e-5).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import grpo_one_process as loop

# configs/tiny-cpu.toml: SmolLM2-135M-Instruct, the few-shot 1-2 digit addition prompt, groups of 8 at
# temperature 1.0, up to 6 new tokens ending at a newline, the intellect2 loss with one optimizer step
# per batch, AdamW lr 1e-5, grad-norm clip 1.0; 64 held-out problems, greedy.
DEMO = ["--model", "demo", "--prompts", "8", "--group-size", "8", "--max-new-tokens", "6", "--lr", "1e-5"]
DEMO += [
    "--minibatches",
    "1",
    "--max-grad-norm",
    "1.0",
    "--held-out",
    "64",
    "--steps",
    "12",
    "--eval-every",
    "4",
]


def main() -> None:
    args = loop.parse_args(DEMO + sys.argv[1:])
    torch.set_num_threads(args.threads)
    model, tokenizer = loop.load_policy(args.model, args.seed)
    tasks, held_out = loop.load_tasks(args)
    started = time.perf_counter()
    initial = loop.accuracy(model, tokenizer, held_out, args)
    print(f"step   0 | held-out acc {initial:.3f} ({time.perf_counter() - started:.1f}s)", flush=True)
    logs = loop.train(model, tokenizer, tasks, args, held_out)
    total = time.perf_counter() - started
    accuracies = [f"{initial:.3f} (v0)"] + [
        f"{log.held_out_accuracy:.3f} (v{log.step})" for log in logs if log.held_out_accuracy is not None
    ]
    print(
        "\n| steps | lr | sample s/step (median) | train s/step (median) | held-out greedy accuracy | total s |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {args.steps} | {args.lr:g} | {statistics.median(log.sample_s for log in logs):.1f} | "
        f"{statistics.median(log.train_s for log in logs):.1f} | {' -> '.join(accuracies)} | {total:.0f} |"
    )


if __name__ == "__main__":
    main()
