"""Generation with a KV cache that proves as it goes, and the validator's one-prefill recomputation.

Shared by ``test_end_to_end.py``; kept separate so the tests read as claims.
Hidden states are the output of the final norm (``model.model.norm``), captured by a
forward hook exactly as the reference's vLLM hook did. The row that proves generated
token t is the hidden state it was sampled from: position ``len(prompt) - 1 + t``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toploc import ProofBuilder, sample_tokens, split_proofs


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    proofs: list[list[bytes]]


def _capture_norm(model: torch.nn.Module) -> tuple[list[torch.Tensor], torch.utils.hooks.RemovableHandle]:
    captured: list[torch.Tensor] = []
    handle = model.model.norm.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()))
    return captured, handle


@torch.no_grad()
def generate_with_proofs(
    model, tokenizer, prompts: list[str], new_tokens: int, seed: int, dbs: int = 32, topk: int = 128
) -> Rollout:
    """Left-padded batch, KV-cache decode loop, seeded Gumbel-max sampling, ProofBuilder per step."""
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    input_ids, attention = batch["input_ids"], batch["attention_mask"]
    num_seq = input_ids.shape[0]
    builder = ProofBuilder(num_seq, model.config.hidden_size, decode_batching_size=dbs, topk=topk)
    captured, handle = _capture_norm(model)
    try:
        past = None
        step_ids = input_ids
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
        generated = []
        for t in range(new_tokens):
            captured.clear()
            out = model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=position_ids,
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            hidden = captured[-1][:, -1, :]  # post-norm hidden state of the last position
            builder.add(hidden)
            tokens = sample_tokens(
                out.logits[:, -1, :], seed, torch.arange(num_seq), torch.full((num_seq,), t), 1.0
            )
            generated.append(tokens)
            step_ids = tokens[:, None]
            attention = torch.cat([attention, torch.ones(num_seq, 1, dtype=attention.dtype)], dim=1)
            position_ids = position_ids[:, -1:] + 1
    finally:
        handle.remove()
    completions = torch.stack(generated, dim=1)
    prompt_ids = [
        row[mask.bool()].tolist()
        for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    ]
    return Rollout(prompt_ids, completions.tolist(), [split_proofs(p, topk) for p in builder.finish()])


@torch.no_grad()
def recompute(
    model, prompt_ids: list[list[int]], completion_ids: list[list[int]], *, batch_size: int, pad_id: int = 0
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One prefill of prompt + completion per sequence (left-padded batches of ``batch_size``).

    Returns per sequence the ``[n, H]`` post-norm hidden rows that prove its n completion
    tokens and the ``[n, V]`` logits that sampled them.
    """
    hidden_out: list[torch.Tensor] = []
    logits_out: list[torch.Tensor] = []
    captured, handle = _capture_norm(model)
    try:
        for start in range(0, len(prompt_ids), batch_size):
            seqs = [
                p + c
                for p, c in zip(
                    prompt_ids[start : start + batch_size],
                    completion_ids[start : start + batch_size],
                    strict=True,
                )
            ]
            width = max(len(s) for s in seqs)
            ids = torch.tensor([[pad_id] * (width - len(s)) + s for s in seqs])
            mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
            captured.clear()
            logits = model(
                input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
            ).logits
            for row, (_prompt, c) in enumerate(
                zip(
                    prompt_ids[start : start + batch_size],
                    completion_ids[start : start + batch_size],
                    strict=True,
                )
            ):
                first = width - len(c) - 1  # position that sampled completion token 0
                hidden_out.append(captured[-1][row, first : first + len(c)])
                logits_out.append(logits[row, first : first + len(c)])
    finally:
        handle.remove()
    return hidden_out, logits_out
