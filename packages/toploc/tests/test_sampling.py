"""Seeded Gumbel-max: exact hash oracle, distribution, and the checker on honest and forged tokens."""

from __future__ import annotations

import math

import torch
from splitmix_oracle import position_key, uniform_at

from toploc import check_sampling, gumbel_noise, sample_tokens
from toploc.sampling import uniform_noise


def _uniform_oracle(seed: int, seq: int, pos: int, v: int) -> float:
    """The documented formula in Python integers (no int64 wrapping tricks)."""
    return uniform_at(position_key(seed, seq, pos), v)


def test_uniform_noise_matches_integer_oracle() -> None:
    for seed in (0, 1, 2**63 + 5, 123456789):
        u = uniform_noise(seed, torch.tensor([0, 7, 2**40]), torch.tensor([0, 3, 99]), 5)
        for b, (seq, pos) in enumerate([(0, 0), (7, 3), (2**40, 99)]):
            for v in range(5):
                assert u[b, v].item() == _uniform_oracle(seed, seq, pos, v)


def test_gumbel_max_samples_softmax() -> None:
    """Token frequencies over 20k independent positions match softmax(logits / T) within 4 sigma."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    positions = torch.arange(20000)
    for temperature in (1.0, 0.5):
        tokens = sample_tokens(logits, 17, torch.zeros(20000, dtype=torch.int64), positions, temperature)
        probs = torch.softmax(logits[0] / temperature, dim=0)
        freq = torch.bincount(tokens, minlength=4).double() / 20000
        sigma = (probs * (1 - probs) / 20000).sqrt()
        assert ((freq - probs).abs() <= 4 * sigma + 1e-12).all()
    greedy = sample_tokens(logits[:3], 1, torch.zeros(3), torch.arange(3), 0.0)
    assert greedy.tolist() == [0, 0, 0]


def test_noise_depends_on_every_key_part() -> None:
    base = gumbel_noise(5, torch.tensor([1]), torch.tensor([2]), 64)
    for other in (
        gumbel_noise(6, torch.tensor([1]), torch.tensor([2]), 64),
        gumbel_noise(5, torch.tensor([2]), torch.tensor([2]), 64),
        gumbel_noise(5, torch.tensor([1]), torch.tensor([3]), 64),
    ):
        assert not torch.equal(base, other)
    assert torch.isfinite(base).all()


def test_check_accepts_honest_and_rejects_forged_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 100, generator=g) * 3
    positions = torch.arange(10, 74)
    tokens = sample_tokens(logits, 99, torch.full((64,), 4), positions, 1.0)
    honest = check_sampling(logits, tokens, 99, 4, positions, 1.0)
    assert (
        honest.passed
        and honest.num_mismatches == 0
        and honest.exact_matches == 64
        and honest.max_margin == 0.0
    )
    # Verifier drift: bf16 round trip of the logits (|logit| < 12: spacing <= 0.0625).
    drifted = check_sampling(logits.bfloat16().float(), tokens, 99, 4, positions, 1.0)
    assert drifted.passed
    forged = tokens.clone()
    forged[[3, 40]] = (forged[[3, 40]] + 1) % 100
    result = check_sampling(logits, forged, 99, 4, positions, 1.0)
    assert not result.passed and result.mismatch_positions == (3, 40)
    assert check_sampling(logits, forged, 99, 4, positions, 1.0, max_mismatches=2).passed
    wrong_seed = check_sampling(logits, tokens, 98, 4, positions, 1.0)
    assert wrong_seed.num_mismatches > 32  # a different seed explains few tokens
    greedy = check_sampling(logits, tokens, 99, 4, positions, 0.0)
    assert greedy.exact_matches == int((logits.argmax(-1) == tokens).sum())
    nan_logits = logits.clone()
    nan_logits[0] = math.nan
    assert check_sampling(nan_logits, tokens, 99, 4, positions, 1.0).mismatch_positions == (0,)


def test_row_blocking_does_not_change_results(monkeypatch) -> None:
    from toploc import sampling

    logits = torch.randn(37, 50, generator=torch.Generator().manual_seed(3))
    seq, pos = torch.arange(37) % 5, torch.arange(37)
    expected = sample_tokens(logits, 3, seq, pos, 0.7)
    monkeypatch.setattr(sampling, "_BLOCK_ELEMENTS", 100)  # 2 rows per block
    assert torch.equal(sample_tokens(logits, 3, seq, pos, 0.7), expected)
    assert check_sampling(logits[:9], expected[:9], 3, 0, torch.arange(9), 0.7).num_tokens == 9
