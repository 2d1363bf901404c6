"""The fast decode loop against the old one: same tokens, same proofs, same log-probs, same reasons.

``reference_generate`` is the loop ``HFBackend`` had before it kept its tokens on the device (one
``.tolist()`` per step, a Python active mask, a per-step ``ProofBuilder.add`` and a ``torch.cat``
of the attention mask), kept here verbatim as the oracle, with the stop-string rule it had then
(:func:`stopped_by_string`: the whole completion decoded after every token).
"""

from __future__ import annotations

import pytest
import torch
from tiny_lm import make_tiny_lm, make_tiny_tokenizer
from transformers import DynamicCache

import toploc
from prime_rl.inference import backend as hf_module
from prime_rl.inference.backend import PROOF_CHUNK, HFBackend, SamplingParams, proof_topk, verify_proofs
from prime_rl.inference.contract import completion_text

PROMPTS = ["12+7=", "3+4=", "100+250=", "9=", "5*5=", "1+1="]


def stopped_by_string(tokenizer, tokens: list[int], stop: tuple[str, ...]) -> bool:
    """The old stop rule: does the whole completion's text contain a stop string?"""
    text = completion_text(tokenizer, tokens)
    return any(s and s in text for s in stop)


def reference_generate(backend: HFBackend, prompts, seeds, params) -> list[tuple]:
    """The old decode loop: ``(tokens, logprobs, proofs, finish_reason)`` per prompt."""
    batch = len(prompts)
    hidden, mask, positions, cache = backend._prefill_prompts(prompts)
    assert isinstance(cache, DynamicCache)
    next_position = positions[:, -1] + 1
    seed_tensor = torch.tensor([int(x) for x in seeds], dtype=torch.long, device=backend.device)
    builder = toploc.ProofBuilder(batch, hidden.shape[-1], PROOF_CHUNK, proof_topk(hidden.shape[-1]))
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float]] = [[] for _ in range(batch)]
    finish: list = [None] * batch
    for step in range(params.max_new_tokens):
        logits = backend._lm_head(hidden).float()
        sampled = hf_module.sample_next(logits, seed_tensor, step, params.temperature)
        sampled_logp = hf_module.token_logprobs(logits, sampled, params.temperature).tolist()
        builder.add(hidden, active_mask=[f is None for f in finish])
        for i, token in enumerate(sampled.tolist()):
            if finish[i] is not None:
                continue
            tokens[i].append(token)
            logprobs[i].append(sampled_logp[i])
            if token in backend.eos_token_ids:
                finish[i] = "eos"
            elif params.stop and stopped_by_string(backend.tokenizer, tokens[i], params.stop):
                finish[i] = "stop"
        if all(f is not None for f in finish) or step + 1 == params.max_new_tokens:
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=backend.device)], dim=1)
        hidden = backend._decoder(
            input_ids=sampled.unsqueeze(-1),
            attention_mask=mask,
            position_ids=next_position.unsqueeze(-1),
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state[:, -1]
        next_position = next_position + 1
    proofs = builder.finish()
    return [(tuple(tokens[i]), tuple(logprobs[i]), proofs[i], finish[i] or "length") for i in range(batch)]


def as_tuples(completions) -> list[tuple]:
    return [(c.completion_tokens, c.logprobs, c.proofs, c.finish_reason) for c in completions]


def make_backend(device: str = "cpu", **kwargs) -> HFBackend:
    return HFBackend("unused", model=make_tiny_lm(), tokenizer=make_tiny_tokenizer(), device=device, **kwargs)


def encode(backend: HFBackend, texts) -> list[list[int]]:
    return [backend.tokenizer(t)["input_ids"] for t in texts]


@pytest.mark.parametrize("sync_every", [1, 3, 16, 100])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=70),  # ragged EOS stops, partial proof chunks
        SamplingParams(temperature=0.0, max_new_tokens=33),
        SamplingParams(temperature=1.3, max_new_tokens=40, stop=("5", "+")),
    ],
)
def test_fast_loop_equals_the_old_loop(sync_every, params):
    # Exact equality: the same floats from the same kernels, only read back at other times.
    backend = make_backend(sync_every=sync_every)
    prompts = encode(backend, PROMPTS)
    seeds = [11, 12, 13, 14, 15, 16]
    expected = reference_generate(backend, prompts, seeds, params)
    got = as_tuples(backend.generate(prompts, seeds, params))
    assert got == expected
    reasons = {e[3] for e in expected}
    assert len(reasons) > 1 or params.temperature == 0.0  # the case really mixes ways of ending


def test_fast_loop_equals_the_old_loop_when_rows_never_stop():
    # No EOS id: every row runs to the limit (the benchmark's setting); 2 full proof chunks + 5 rows.
    backend = make_backend(sync_every=16)
    backend.eos_token_ids = frozenset()
    prompts = encode(backend, PROMPTS[:3])
    params = SamplingParams(temperature=1.0, max_new_tokens=69)
    got = backend.generate(prompts, [1, 2, 3], params)
    assert as_tuples(got) == reference_generate(backend, prompts, [1, 2, 3], params)
    assert all(len(c.completion_tokens) == 69 and c.finish_reason == "length" for c in got)


def test_zero_new_tokens_gives_empty_completions():
    backend = make_backend()
    out = backend.generate(encode(backend, PROMPTS[:2]), [0, 1], SamplingParams(max_new_tokens=0))
    assert [(c.completion_tokens, c.proofs, c.finish_reason) for c in out] == [((), b"", "length")] * 2


def test_sync_every_must_be_positive():
    with pytest.raises(ValueError, match="sync_every"):
        make_backend(sync_every=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_generate_path_on_cuda(dtype):
    # Every tensor of the loop must be on the model's device; on CUDA the fast loop still equals
    # the old one there, and its proofs pass against the same device's prefill.
    backend = HFBackend(
        "unused", model=make_tiny_lm().to(dtype), tokenizer=make_tiny_tokenizer(), device="cuda", sync_every=8
    )
    prompts = encode(backend, PROMPTS)
    params = SamplingParams(temperature=1.0, max_new_tokens=45, stop=("7",))
    seeds = list(range(len(prompts)))
    out = backend.generate(prompts, seeds, params)
    assert as_tuples(out) == reference_generate(backend, prompts, seeds, params)
    pre = backend.prefill([c.prompt_tokens for c in out], [c.completion_tokens for c in out])
    for completion, p in zip(out, pre, strict=True):
        assert p.hidden.device.type == "cuda"
        results = verify_proofs(p.hidden, completion.proofs)
        assert results and all(toploc.Thresholds().check(r).passed for r in results)
