"""HF generation backend: the decode loop against oracles (HF generate, separate prefill), proofs, reload."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import make_tiny_lm, make_tiny_tokenizer

import toploc
from prime_rl.inference.backend import (
    HFBackend,
    SamplingParams,
    build_proofs,
    proof_size,
    token_logprobs,
    verify_proofs,
)
from prime_rl.validator.checks import sampling_margins, sampling_problem
from prime_rl.weights.files import WeightsMismatchError, save_policy

PROMPTS = ["12+7=", "3+4=", "100+250=", "9="]


@pytest.fixture(scope="module")
def backend():
    return HFBackend("unused", model=make_tiny_lm(), tokenizer=make_tiny_tokenizer(), max_batch_size=8)


def encode(backend, texts):
    return [backend.tokenizer(t)["input_ids"] for t in texts]


def test_greedy_matches_hf_generate(backend):
    # Oracle: transformers' own generate (greedy, KV cache) on each prompt alone, no stop criteria.
    prompts = encode(backend, PROMPTS)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    out = backend.generate(prompts, [0] * len(prompts), params)
    for prompt, completion in zip(prompts, out, strict=True):
        ids = torch.tensor([prompt])
        ref = backend.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        expected = ref[: len(completion.completion_tokens)]
        assert list(completion.completion_tokens) == expected
        assert completion.prompt_tokens == tuple(prompt)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_left_padding_equals_one_by_one(backend, temperature):
    # Seeded sampling is keyed by (seed, position), so batch composition and padding cannot matter.
    prompts = encode(backend, PROMPTS)
    params = SamplingParams(temperature=temperature, max_new_tokens=34)
    batched = backend.generate(prompts, [1, 2, 3, 4], params)
    for i, prompt in enumerate(prompts):
        alone = backend.generate([prompt], [i + 1], params)[0]
        assert alone.completion_tokens == batched[i].completion_tokens
        assert len(alone.proofs) == len(batched[i].proofs)
        torch.testing.assert_close(
            torch.tensor(alone.logprobs), torch.tensor(batched[i].logprobs), rtol=0, atol=1e-4
        )


def test_logprobs_and_hidden_rows_equal_one_prefill(backend):
    # The validator's view: one prefill of prompt + completion recomputes the decode-time rows.
    prompts = encode(backend, PROMPTS)
    out = backend.generate(prompts, [0] * 4, SamplingParams(temperature=0.0, max_new_tokens=40))
    pre = backend.prefill([c.prompt_tokens for c in out], [c.completion_tokens for c in out])
    for completion, p in zip(out, pre, strict=True):
        n = len(completion.completion_tokens)
        assert p.hidden.shape == (n, 64) and p.logits.shape == (n, 100)
        tokens = torch.tensor(completion.completion_tokens)
        assert torch.equal(p.logits.argmax(-1), tokens)  # greedy: each token is the argmax
        torch.testing.assert_close(
            token_logprobs(p.logits, tokens, 0.0), torch.tensor(completion.logprobs), rtol=0, atol=1e-4
        )
        results = verify_proofs(p.hidden, completion.proofs)
        assert len(results) == -(-n // 32)
        assert all(toploc.Thresholds().check(r).passed for r in results)
        assert len(completion.proofs) == len(results) * proof_size(64)


def test_proofs_fail_for_other_weights(backend):
    prompts = encode(backend, PROMPTS[:2])
    out = backend.generate(prompts, [0, 0], SamplingParams(temperature=0.0, max_new_tokens=40))
    other = HFBackend("unused", model=make_tiny_lm(seed=1), tokenizer=backend.tokenizer)
    pre = other.prefill([c.prompt_tokens for c in out], [c.completion_tokens for c in out])
    for completion, p in zip(out, pre, strict=True):
        assert not all(
            toploc.Thresholds().check(r).passed for r in verify_proofs(p.hidden, completion.proofs)
        )


def test_stop_strings_eos_and_length(backend):
    prompts = encode(backend, PROMPTS)
    free = backend.generate(prompts, [0] * 4, SamplingParams(temperature=0.0, max_new_tokens=20))
    for prompt, completion in zip(prompts, free, strict=True):
        assert completion.finish_reason in ("eos", "length")
        if completion.finish_reason == "length":
            assert len(completion.completion_tokens) == 20
        # Stop at the first character the free run produced after two tokens: generation must end
        # with the token that completed it.
        text = completion.text
        stop = text[2] if len(text) > 2 else None
        if stop is None:
            continue
        stopped = backend.generate(
            [prompt], [0], SamplingParams(temperature=0.0, max_new_tokens=20, stop=(stop,))
        )[0]
        assert stopped.finish_reason == "stop"
        assert stopped.text.endswith(stop) and stop not in stopped.text[:-1]
        assert stopped.completion_tokens == completion.completion_tokens[: len(stopped.completion_tokens)]


def test_reload_weights_in_place(tmp_path):
    backend = HFBackend("unused", model=make_tiny_lm(), tokenizer=make_tiny_tokenizer())
    params_before = [p for p in backend.model.parameters()]
    other = make_tiny_lm(seed=3)
    path = save_policy(other.state_dict(), tmp_path / "model.safetensors")
    backend.load_weights(path, policy_version=3)
    assert backend.policy_version == 3
    assert [p for p in backend.model.parameters()] == params_before  # same objects: in place
    for name, tensor in other.state_dict().items():
        assert torch.equal(backend.model.state_dict()[name], tensor)
    bad = save_policy({"nope": torch.zeros(2)}, tmp_path / "bad.safetensors")
    with pytest.raises(WeightsMismatchError):
        backend.load_weights(bad, policy_version=4)
    assert backend.policy_version == 3
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(WeightsMismatchError):
        backend.load_weights(garbage, policy_version=5)


def test_bf16_backend_generates_and_proves():
    backend = HFBackend("unused", model=make_tiny_lm(dtype=torch.bfloat16), tokenizer=make_tiny_tokenizer())
    prompts = encode(backend, PROMPTS[:2])
    out = backend.generate(prompts, [0, 0], SamplingParams(temperature=0.0, max_new_tokens=33))
    pre = backend.prefill([c.prompt_tokens for c in out], [c.completion_tokens for c in out])
    for completion, p in zip(out, pre, strict=True):
        results = verify_proofs(p.hidden, completion.proofs)
        assert len(results) == -(-len(completion.completion_tokens) // 32) > 0
        assert all(toploc.Thresholds().check(r).passed for r in results)


def test_proof_builder_equals_batch_proofs(backend):
    # The streaming builder in the decode loop must give the proofs of the stacked rows.
    prompts = encode(backend, PROMPTS)
    out = backend.generate(prompts, [5, 6, 7, 8], SamplingParams(temperature=1.0, max_new_tokens=40))
    pre = backend.prefill([c.prompt_tokens for c in out], [c.completion_tokens for c in out])
    for completion, p in zip(out, pre, strict=True):
        rebuilt = build_proofs(p.hidden)
        assert len(rebuilt) == len(completion.proofs)
        results = verify_proofs(p.hidden, completion.proofs)
        assert len(results) == -(-len(completion.completion_tokens) // 32) > 0
        assert all(toploc.Thresholds().check(r).passed for r in results)
    with pytest.raises(toploc.ProofFormatError):
        verify_proofs(pre[0].hidden, out[0].proofs[:-1])


def test_sampling_is_reproducible_from_prefill_logits(backend):
    prompts = encode(backend, PROMPTS)
    seeds = [11, 12, 13, 14]
    out = backend.generate(prompts, seeds, SamplingParams(temperature=1.0, max_new_tokens=30))
    pre = backend.prefill([c.prompt_tokens for c in out], [c.completion_tokens for c in out])
    for completion, p in zip(out, pre, strict=True):
        tokens = torch.tensor(completion.completion_tokens)
        margins = sampling_margins(p.logits, tokens, completion.seed, 1.0)  # the validator's sampling rule
        assert sampling_problem(margins, tolerance=0.25, max_mismatch_fraction=0.0) is None
        torch.testing.assert_close(
            token_logprobs(p.logits, tokens, 1.0), torch.tensor(completion.logprobs), rtol=0, atol=1e-4
        )
        # The same tokens claimed under another seed are (almost surely) not what the sampler draws.
        other = sampling_margins(p.logits, tokens, completion.seed + 1, 1.0)
        assert sampling_problem(other, tolerance=0.25, max_mismatch_fraction=0.0) is not None or len(tokens) == 1


def test_shared_prompt_prefill_equals_separate_generation(backend):
    # A group repeats its prompt: the backend prefills it once and copies the KV cache per row.
    prompts = encode(backend, PROMPTS[:2])
    grouped = [prompts[0]] * 3 + [prompts[1]] * 3
    seeds = [21, 22, 23, 24, 25, 26]
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    batched = backend.generate(grouped, seeds, params)
    for prompt, seed, completion in zip(grouped, seeds, batched, strict=True):
        alone = backend.generate([prompt], [seed], params)[0]
        assert alone.completion_tokens == completion.completion_tokens
        torch.testing.assert_close(
            torch.tensor(alone.logprobs), torch.tensor(completion.logprobs), rtol=0, atol=1e-4
        )
    assert len({c.completion_tokens for c in batched[:3]}) > 1  # different seeds, different samples


def test_prefill_equals_single_unpadded_forward(backend):
    # Oracle: each (prompt, completion) alone through the decoder in one forward pass. The backend
    # shares prompt prefixes across rows and pads; the rows must agree to fp32 rounding.
    prompts = encode(backend, ["12+7=", "12+7=", "3+4=", "100+250="])
    completions = [[20, 21, 22], [23], [24, 25, 26, 27, 28], [29, 30]]
    rows = backend.prefill(prompts, completions)
    for prompt, completion, got in zip(prompts, completions, rows, strict=True):
        ids = torch.tensor([list(prompt) + completion])
        with torch.no_grad():
            hidden = backend.model.get_decoder()(input_ids=ids).last_hidden_state[0]
        expected = hidden[len(prompt) - 1 : len(prompt) + len(completion) - 1]
        torch.testing.assert_close(got.hidden, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(got.logits, backend.model.lm_head(expected).float(), rtol=0, atol=1e-4)
