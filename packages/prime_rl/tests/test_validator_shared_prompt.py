"""The validator's prefill computes a GRPO group's shared prompt once (issue #26): the decoder sees
each distinct prompt's tokens once per prefill batch, and every completion's hidden states and
logits (what the toploc proofs and log-prob checks read) equal a prefill of that sample alone."""

from __future__ import annotations

import torch
from tiny_lm import make_tiny_lm, make_tiny_tokenizer

from prime_rl.inference.backend import HFBackend


def test_prefill_computes_each_distinct_prompt_once() -> None:
    model = make_tiny_lm(dtype=torch.float64)
    backend = HFBackend("unused", model=model, tokenizer=make_tiny_tokenizer(), max_batch_size=16)
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(3, 90, (40,), generator=g).tolist()
    other = torch.randint(3, 90, (7,), generator=g).tolist()
    prompts = [shared] * 8 + [other] * 3
    completions = [
        torch.randint(3, 90, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 20, (11,), generator=g)
    ]
    seen: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(int(args[0].numel()))
    )
    try:
        together = backend.prefill(prompts, completions)
    finally:
        hook.remove()
    # Pass 1: the two distinct prompts, left padded to 40 tokens; pass 2: the completions, right padded.
    width = max(len(c) for c in completions)
    assert seen == [2 * 40, 11 * width]  # not 8·40 + 3·7 prompt tokens
    for prompt, completion, pre in zip(prompts, completions, together, strict=True):
        (alone,) = backend.prefill([prompt], [completion])
        torch.testing.assert_close(pre.hidden, alone.hidden, rtol=0, atol=1e-10)
        torch.testing.assert_close(pre.logits, alone.logits, rtol=0, atol=1e-10)
