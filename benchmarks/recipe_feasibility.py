"""Feasibility of the embedded demo: does plain GRPO raise SmolLM2-135M's held-out addition accuracy
within a CPU budget? One process, plain torch (no orchestrator, no proofs), so it measures only the
learning signal and the compute per step that `configs/tiny-cpu.toml` is sized from.

Run: .venv/bin/python benchmarks/recipe_feasibility.py --steps 12 --eval-every 4
"""

from __future__ import annotations

import argparse
import random
import re
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prime_rl.launch.demo_model import prepare_model

FEW_SHOT = (
    "Question: 3 + 4 =\nAnswer: 7\n\nQuestion: 12 + 5 =\nAnswer: 17\n\nQuestion: 40 + 21 =\nAnswer: 61\n\n"
)


def problems(seed: int, count: int, max_value: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(0, max_value), rng.randint(0, max_value)
        out.append((f"{FEW_SHOT}Question: {a} + {b} =\nAnswer:", a + b))
    return out


def reward(text: str, answer: int) -> float:
    match = re.search(r"-?\d+", text.split("\n")[0])
    return float(match is not None and int(match.group()) == answer)


@torch.no_grad()
def generate(model, tok, prompts: list[str], *, samples: int, temperature: float, max_new: int):
    enc = tok(prompts, return_tensors="pt", padding=True)
    kwargs = {"do_sample": temperature > 0, "max_new_tokens": max_new, "pad_token_id": tok.pad_token_id}
    if temperature > 0:
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    out = model.generate(
        input_ids=enc.input_ids.repeat_interleave(samples, 0),
        attention_mask=enc.attention_mask.repeat_interleave(samples, 0),
        **kwargs,
    )
    completions = out[:, enc.input_ids.shape[1] :]
    return enc, completions


def accuracy(model, tok, held_out, max_new: int) -> float:
    prompts = [p for p, _ in held_out]
    hits = 0
    for start in range(0, len(prompts), 32):
        chunk = held_out[start : start + 32]
        _, comp = generate(model, tok, [p for p, _ in chunk], samples=1, temperature=0.0, max_new=max_new)
        texts = tok.batch_decode(comp, skip_special_tokens=True)
        hits += sum(reward(t, a) for t, (_, a) in zip(texts, chunk, strict=True))
    return hits / len(held_out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--max-value", type=int, default=99)
    parser.add_argument("--held-out", type=int, default=64)
    parser.add_argument("--max-new", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    path = prepare_model()
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    held_out = problems(10_000 + args.seed, args.held_out, args.max_value)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.eval()
    start = time.perf_counter()
    print(
        f"step 0 held-out acc {accuracy(model, tok, held_out, args.max_new):.3f} ({time.perf_counter() - start:.1f}s)"
    )
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        batch = problems(args.seed * 100_000 + step, args.prompts, args.max_value)
        enc, comp = generate(
            model, tok, [p for p, _ in batch], samples=args.group, temperature=1.0, max_new=args.max_new
        )
        texts = tok.batch_decode(comp, skip_special_tokens=True)
        rewards = torch.tensor([reward(t, batch[i // args.group][1]) for i, t in enumerate(texts)])
        grouped = rewards.view(args.prompts, args.group)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
        keep = adv.abs() > 0
        t1 = time.perf_counter()
        if keep.any():
            ids = torch.cat([enc.input_ids.repeat_interleave(args.group, 0), comp], 1)[keep]
            attn = torch.cat([enc.attention_mask.repeat_interleave(args.group, 0), (comp != -1).long()], 1)[
                keep
            ]
            comp_mask = torch.zeros_like(ids, dtype=torch.float32)
            comp_mask[:, enc.input_ids.shape[1] :] = 1.0
            # mask everything after the first pad/eos in the completion (generate pads finished rows)
            c = comp[keep]
            finished = (c == tok.pad_token_id).cumsum(1) > 1  # keep the first eos, drop padding after it
            comp_mask[:, enc.input_ids.shape[1] :] *= (~finished).float()
            model.train()
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            mask = comp_mask[:, 1:]
            loss = -(logp * adv[keep][:, None] * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            model.eval()
        else:
            gnorm = torch.tensor(0.0)
        t2 = time.perf_counter()
        line = (
            f"step {step} reward {rewards.mean():.3f} informative {int(keep.sum())} "
            f"gen {t1 - t0:.1f}s train {t2 - t1:.1f}s gnorm {float(gnorm):.1f}"
        )
        if step % args.eval_every == 0:
            line += f" held-out acc {accuracy(model, tok, held_out, args.max_new):.3f}"
        print(line, flush=True)
    print(f"total {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
