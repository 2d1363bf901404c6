"""Honest generation verifies by one prefill; tampering fails (tiny Llama, H = 64, fp32).

Measured with this file's setup (3 prompts, 70 sampled tokens each, dbs 32, topk 128,
9 proofs); per-proof (exp_mismatches, mant_err_mean, mant_err_median):

| scenario                                   | result                                             | verdict |
|--------------------------------------------|----------------------------------------------------|---------|
| honest, sdpa batch 1 / eager batch 2 and 3 | all (0, 0.0, 0.0)                                  | pass    |
| layer-1 down_proj + 0.001·N(0,1)           | exp 0-7, mean <= 0.91                              | pass (undetected) |
| layer-1 down_proj + 0.01·N(0,1)            | exp 9-23, mean 3.1-8.7                             | pass (undetected) |
| layer-1 down_proj + 0.05·N(0,1)            | exp 36-63, mean 8.5-26.6                           | fail    |
| one prompt token changed                   | exp 13-73, mean 4.7-13.5                           | fail    |
| completion token 40 changed                | chunk 0: 0; chunks 1-2: exp 0-11                   | pass (undetected by TOPLOC; caught by check_sampling) |
| different model (seed 1)                   | exp 90-127                                         | fail    |
| bf16 verifier of an fp32 generation        | exp 0-4, mean <= 0.6                               | pass (undetected) |

So the paper's thresholds catch a different model, a changed prompt and large weight
changes, but not small weight perturbations, a single substituted completion token, or
fp32 vs bf16 (hidden states are rounded to bf16 before committing, and a 64-wide random
model has no outlier channels). The sampling check closes the substituted-token case.
"""

from __future__ import annotations

import pytest
import torch
from e2e_support import Rollout, generate_with_proofs, recompute
from tiny_lm import make_tiny_lm

from toploc import Thresholds, VerificationResult, check_sampling, verify_proofs_bytes

PROMPTS = ["What is 2+3?", "Hello there, how are you doing", "x"]
NEW_TOKENS = 70
SEED = 11


@pytest.fixture(scope="module")
def rollout(tiny_tokenizer) -> Rollout:
    model = make_tiny_lm()
    model.set_attn_implementation("sdpa")
    return generate_with_proofs(model, tiny_tokenizer, PROMPTS, NEW_TOKENS, seed=SEED)


def _verify(
    model, rollout: Rollout, *, batch_size: int = 1, prompt_ids=None, completion_ids=None
) -> list[list[VerificationResult]]:
    hidden, _ = recompute(
        model,
        prompt_ids or rollout.prompt_ids,
        completion_ids or rollout.completion_ids,
        batch_size=batch_size,
    )
    return [
        verify_proofs_bytes(h, p, 32, 128, skip_prefill=True)
        for h, p in zip(hidden, rollout.proofs, strict=True)
    ]


def _flat(results: list[list[VerificationResult]]) -> list[VerificationResult]:
    return [r for per_seq in results for r in per_seq]


def test_rollout_shape(rollout: Rollout) -> None:
    assert [len(c) for c in rollout.completion_ids] == [NEW_TOKENS] * 3
    assert [len(p) for p in rollout.proofs] == [3, 3, 3]  # 32 + 32 + 6 tokens
    assert all(len(proof) == 258 for p in rollout.proofs for proof in p)


@pytest.mark.parametrize(("attention", "batch_size"), [("sdpa", 1), ("eager", 3), ("eager", 2)])
def test_honest_rollout_verifies(rollout: Rollout, attention: str, batch_size: int) -> None:
    verifier = make_tiny_lm()
    verifier.set_attn_implementation(attention)
    results = _flat(_verify(verifier, rollout, batch_size=batch_size))
    assert Thresholds().check_all(results).passed
    assert max(r.exp_mismatches for r in results) <= 2 and max(r.sign_mismatches for r in results) == 0


def test_honest_sampling_verifies(rollout: Rollout) -> None:
    _, logits = recompute(make_tiny_lm(), rollout.prompt_ids, rollout.completion_ids, batch_size=3)
    for seq, (seq_logits, tokens) in enumerate(zip(logits, rollout.completion_ids, strict=True)):
        check = check_sampling(seq_logits, torch.tensor(tokens), SEED, seq, torch.arange(len(tokens)), 1.0)
        assert check.passed and check.exact_matches == len(tokens)


def test_perturbed_layer_fails(rollout: Rollout) -> None:
    tampered = make_tiny_lm()
    weight = tampered.model.layers[1].mlp.down_proj.weight
    with torch.no_grad():
        weight.add_(0.05 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    assert not Thresholds().check_all(_flat(_verify(tampered, rollout))).passed


def test_changed_prompt_token_fails(rollout: Rollout) -> None:
    prompts = [list(p) for p in rollout.prompt_ids]
    for p in prompts:
        p[0] = p[0] % 90 + 3  # another printable character
    results = _verify(make_tiny_lm(), rollout, prompt_ids=prompts)
    assert all(not Thresholds().check_all(per_seq).passed for per_seq in results)


def test_changed_completion_token_is_caught_by_sampling_check(rollout: Rollout) -> None:
    completions = [list(c) for c in rollout.completion_ids]
    for c in completions:
        c[40] = c[40] % 90 + 3 if c[40] % 90 + 3 != c[40] else 5
    model = make_tiny_lm()
    results = _verify(model, rollout, completion_ids=completions)
    assert all(per_seq[0].exp_mismatches == 0 for per_seq in results)  # rows before the change agree
    assert sum(per_seq[1].exp_mismatches + per_seq[2].exp_mismatches for per_seq in results) > 0
    _, logits = recompute(model, rollout.prompt_ids, completions, batch_size=3)
    for seq, seq_logits in enumerate(logits):
        check = check_sampling(
            seq_logits, torch.tensor(completions[seq]), SEED, seq, torch.arange(NEW_TOKENS), 1.0
        )
        assert not check.passed and 40 in check.mismatch_positions


def test_different_model_fails(rollout: Rollout) -> None:
    results = _flat(_verify(make_tiny_lm(seed=1), rollout))
    assert all(not Thresholds().check(r).passed for r in results)


def test_bf16_verifier_is_not_distinguished_from_fp32(rollout: Rollout) -> None:
    """Documents a limit: the thresholds cannot tell an fp32 generation from a bf16 recomputation here."""
    results = _flat(_verify(make_tiny_lm(dtype=torch.bfloat16), rollout))
    assert Thresholds().check_all(results).passed
    assert max(r.exp_mismatches for r in results) <= 10
