"""Benchmark: the worker's verifiable generation and the validator's check vs plain HF sampling, on CPU.

One table, all rows measured in the same run on the same random Llama (hidden 256, 4 layers,
vocab 32000, fp32), 16 sequences x 32 prompt tokens x 64 new tokens (EOS disabled so every row
generates the same number of tokens):

* ``hf generate``: ``model.generate(do_sample=True)`` with its KV cache (the naive way: no proofs,
  no verifiable randomness, no log-probs);
* ``HFBackend.generate``: our decode loop with toploc's seeded Gumbel sampler, streaming
  ``ProofBuilder`` proofs and sampled-token log-probs;
* ``validator check``: one prefill of the 16 completions plus proof verification, sampling check
  and log-prob check (``prime_rl.validator.checks._model_checks`` path, measured directly);
* with ``--vllm`` (vLLM installed), in the same run after the HF rows: ``vllm plain`` (``LLM.generate``
  at T = 1, no toploc arguments: vLLM's own sampler, no proofs; the capture hook is installed but
  only stores a reference per step) and ``VLLMBackend.generate`` (seeded sampler + proofs +
  log-probs), steady state (one untimed call first: the first call after start-up is slow), on
  the same model saved to a temporary directory. The validator accepts the VLLMBackend completions
  too. vLLM keeps ``--threads`` torch threads because ``OMP_NUM_THREADS`` is set for it.

``--model smollm2`` runs every row on the real SmolLM2-135M-Instruct instead (the demo model,
``prime_rl.launch.demo_model``; the issue's own setting), on chat prompts of mixed lengths
(``detection_workers.prompt_texts``, left-padded for the HF rows), ``--batch`` x ``--new`` tokens.
``--compile`` lets vLLM compile its model (``enforce_eager=False``, both vLLM rows; the worker
setting ``vllm_enforce_eager = false``): slower start, faster steps.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/rollout_bench.py [--repeats 3] [--threads 2]
[--vllm] [--model smollm2 --batch 32 --new 128] [--compile]``.
Reports min and median wall time over repeats and the generated tokens per second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import toploc
from prime_rl.inference.backend import HFBackend, SamplingParams, token_logprobs, verify_proofs
from prime_rl.validator.checks import sampling_margins, sampling_problem

VOCAB, HIDDEN, LAYERS = 32000, 256, 4
BATCH, PROMPT, NEW = 16, 32, 64


def build_smollm2(batch: int) -> tuple[torch.nn.Module, object, list[list[int]]]:
    """The demo model (fp32) and ``batch`` chat prompts of mixed lengths."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from detection_workers import load_model, load_tokenizer, prompt_texts

    tokenizer = load_tokenizer()
    return load_model("float32"), tokenizer, prompt_texts(tokenizer, batch, offset=4242)


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def build() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512, pad_token_id=0,
        bos_token_id=1, eos_token_id=None, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    tokenizer.pad_token = "t0"
    return model, tokenizer


def timed(fn, repeats: int) -> tuple[float, float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm", action="store_true", help="also measure the vLLM backend and plain vLLM")
    parser.add_argument("--model", choices=["random", "smollm2"], default="random")
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences (smollm2 only)")
    parser.add_argument("--new", type=int, default=NEW, help="new tokens per sequence (smollm2 only)")
    parser.add_argument("--compile", action="store_true", help="vLLM with enforce_eager=False")
    parser.add_argument("--eos", action="store_true", help="smollm2: keep EOS stops (the RL workload: ragged lengths)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # vLLM's CPU engine leaves torch threads alone then
    torch.set_num_threads(args.threads)
    if args.model == "smollm2":
        batch, new = args.batch, args.new
        model, tokenizer, prompt_lists = build_smollm2(batch)
        prompts, mask = left_padded(prompt_lists, int(tokenizer.pad_token_id or 0))
        described = f"SmolLM2-135M-Instruct fp32, {batch} chat prompts ({min(map(len, prompt_lists))}-{max(map(len, prompt_lists))} tokens) + {new} new"
    else:
        batch, new = BATCH, NEW
        model, tokenizer = build()
        prompts = torch.randint(2, VOCAB, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
        mask, prompt_lists = torch.ones_like(prompts), prompts.tolist()
        described = f"random Llama h={HIDDEN} L={LAYERS} V={VOCAB}, {BATCH} seqs x {PROMPT}+{NEW} tokens"
    backend = HFBackend("unused", model=model, tokenizer=tokenizer, max_batch_size=batch)
    eos = args.eos and args.model == "smollm2"
    eos_id = int(tokenizer.eos_token_id) if eos else None
    if not eos:
        backend.eos_token_ids = frozenset()  # every row generates exactly `new` tokens
    seeds = list(range(batch))
    params = SamplingParams(temperature=1.0, max_new_tokens=new)

    def hf_generate():
        with torch.no_grad():
            out = model.generate(
                prompts, attention_mask=mask, do_sample=True, max_new_tokens=new, min_new_tokens=0 if eos else new,
                top_k=0, top_p=1.0, pad_token_id=int(tokenizer.pad_token_id or 0), eos_token_id=eos_id,
            )  # fmt: skip
        return sum(_length(row, eos_id) for row in out[:, prompts.shape[1] :].tolist())

    def ours():
        return backend.generate(prompt_lists, seeds, params)

    def validate(completions):
        pre = backend.prefill(
            [c.prompt_tokens for c in completions], [c.completion_tokens for c in completions]
        )
        ok = 0
        for c, p in zip(completions, pre, strict=True):
            tokens = torch.tensor(c.completion_tokens)
            proofs_ok = all(toploc.Thresholds().check(r).passed for r in verify_proofs(p.hidden, c.proofs))
            margins = sampling_margins(p.logits, tokens, c.seed, 1.0)
            sampled_ok = sampling_problem(margins, tolerance=0.25, max_mismatch_fraction=0.0) is None
            gap = (token_logprobs(p.logits, tokens, 1.0) - torch.tensor(c.logprobs)).abs().mean().item()
            ok += proofs_ok and sampled_ok and gap < 0.05
        return ok

    hf_min, hf_med, hf_tokens = timed(hf_generate, args.repeats)
    our_min, our_med, completions = timed(ours, args.repeats)
    our_tokens = sum(len(c.completion_tokens) for c in completions)  # type: ignore[union-attr]
    assert eos or our_tokens == batch * new
    val_min, val_med, ok = timed(lambda: validate(completions), args.repeats)
    rows = [
        ("hf generate (no proofs)", hf_min, hf_med, hf_tokens),
        ("HFBackend.generate (proofs+seed)", our_min, our_med, our_tokens),
        ("validator check (prefill+verify)", val_min, val_med, our_tokens),
    ]
    vllm_note = ""
    if args.vllm:
        vllm_rows, vllm_ok, vllm_completions = measure_vllm(
            model, tokenizer, prompt_lists, seeds, params, args.repeats, validate, args.compile, eos
        )
        rows += vllm_rows
        plain, ours_vllm = vllm_rows[0], vllm_rows[1]
        same = sum(a.completion_tokens == b.completion_tokens for a, b in zip(completions, vllm_completions, strict=True))
        vllm_note = (
            f"; VLLMBackend vs HFBackend (same {same}/{batch} completions): {our_min / ours_vllm[1]:.2f}x faster; "
            f"proofs+sampler cost {plain[3] / plain[1] / (ours_vllm[3] / ours_vllm[1]) - 1:+.0%} (min) and "
            f"{plain[3] / plain[2] / (ours_vllm[3] / ours_vllm[2]) - 1:+.0%} (median) per token over plain vLLM; "
            f"validator accepted {vllm_ok}/{batch} vLLM completions"
        )
    print(f"{described}, {args.threads} threads" + (", vLLM compiled" if args.compile else "")
          + (", EOS stops on" if eos else ""))  # fmt: skip
    print(f"{'path':<34}{'min s':>8}{'median s':>10}{'tokens':>8}{'tok/s (min)':>13}{'rollouts/s':>12}")
    for name, lo, med, tokens in rows:
        print(f"{name:<34}{lo:>8.3f}{med:>10.3f}{tokens:>8}{tokens / lo:>13.0f}{batch / lo:>12.2f}")
    print(f"generation overhead vs hf generate: {our_min / hf_min:.2f}x; validator accepted {ok}/{batch}{vllm_note}")
    print(draw_row(args.repeats))


def draw_row(repeats: int) -> str:
    """One decode step's seeded draw (BATCH x VOCAB): the torch reference vs the fused C kernel."""
    from toploc import native
    from toploc.sampling import _best_and_claimed

    logits = torch.randn(BATCH, VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    seq, pos = torch.arange(BATCH), torch.full((BATCH,), 7)
    n = max(5, 5 * repeats)
    ref, _, _ = timed(lambda: _best_and_claimed(logits, 1, seq, pos, 1.0)[0], n)
    fast, _, _ = timed(lambda: toploc.sample_tokens(logits, 1, seq, pos, 1.0), n)
    return (
        f"one step's draw ({BATCH}x{VOCAB}, min of {n}): torch reference {ref * 1e3:.1f} ms, "
        f"toploc.sample_tokens (native: {native.available()}) {fast * 1e3:.1f} ms"
    )


def _length(row: list[int], eos_id: int | None) -> int:
    """Tokens of one generated row up to and including its first EOS (all of them without EOS stops)."""
    return row.index(eos_id) + 1 if eos_id is not None and eos_id in row else len(row)


def measure_vllm(model, tokenizer, prompts, seeds, params, repeats, validate, compile_model=False, eos=False):
    """Rows for plain vLLM and VLLMBackend on the same weights, and how many completions validate."""
    import tempfile

    from vllm import SamplingParams as VLLMParams
    from vllm import TokensPrompt

    from prime_rl.inference.vllm_backend import EngineMemory, VLLMBackend

    folder = tempfile.mkdtemp(prefix="rollout_bench_")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    longest = max(len(p) for p in prompts) + params.max_new_tokens
    kv_bytes = max(256 << 20, 2 * len(prompts) * longest * 4 * model.config.num_hidden_layers
                   * model.config.num_key_value_heads * (model.config.hidden_size // model.config.num_attention_heads))  # fmt: skip
    memory = EngineMemory(kv_cache_bytes=kv_bytes, max_model_len=longest + 8, enforce_eager=not compile_model)
    backend = VLLMBackend(folder, max_batch_size=len(prompts), memory=memory)
    if not eos:
        backend.eos_token_ids = frozenset()  # as the HF rows: exactly max_new_tokens each
    plain_params = VLLMParams(temperature=1.0, max_tokens=params.max_new_tokens, ignore_eos=not eos)
    token_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def plain():
        return backend.llm.generate(token_prompts, [plain_params] * len(prompts), use_tqdm=False)

    def ours():
        return backend.generate(prompts, seeds, params)

    plain(), ours()  # start-up: the first calls compile and warm caches
    plain_min, plain_med, outputs = timed(plain, repeats)
    ours_min, ours_med, completions = timed(ours, repeats)
    ok = validate(completions)
    plain_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    our_tokens = sum(len(c.completion_tokens) for c in completions)
    return [
        ("vllm plain (no proofs)", plain_min, plain_med, plain_tokens),
        ("VLLMBackend.generate (proofs+seed)", ours_min, ours_med, our_tokens),
    ], ok, completions


if __name__ == "__main__":
    main()
