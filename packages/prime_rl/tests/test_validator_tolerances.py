"""Per-sample tolerances per precision: fp32 rejects any swap, bf16's rule scales with length."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import toploc
from prime_rl.config import load_config
from prime_rl.validator.checks import Checks
from prime_rl.validator.tolerances import (
    FP32_SAMPLING_TOLERANCE,
    TokenRule,
    binomial_allowance,
    for_precision,
)


def _checks() -> Checks:
    """The checks of a default run (every ``[validator]`` tolerance at its default)."""
    return Checks.from_config(
        load_config(None, []), vocab_size=2**31, eos_token_ids=frozenset(), assignment_key=b"", hidden_size=128
    )


def _tail(n: int, p: float, k: int) -> float:
    """Slow reference: P(Binomial(n, p) > k) with exact binomial coefficients."""
    return sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k + 1, n + 1))


def test_binomial_allowance_by_hand() -> None:
    # n = 10, p = 0.1: P(X > 2) = 1 - 0.3487 - 0.3874 - 0.1937 = 0.0702 > 0.05, P(X > 3) = 0.0128 <= 0.05
    assert binomial_allowance(10, 0.1, 0.05) == 3
    assert binomial_allowance(10, 0.1, 0.08) == 2
    assert binomial_allowance(5_000, 0.0, 1e-6) == 0 and binomial_allowance(0, 0.3, 1e-6) == 0
    # one token at p = 1e-3: P(X > 0) = 1e-3 > 1e-6, so it must be allowed
    assert binomial_allowance(1, 1e-3, 1e-6) == 1
    with pytest.raises(ValueError):
        binomial_allowance(10, 1.0, 1e-6)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.floats(1e-4, 0.3), st.sampled_from([1e-6, 1e-3, 0.05]))
def test_binomial_allowance_is_the_smallest_k_with_a_small_tail(n: int, p: float, eps: float) -> None:
    k = binomial_allowance(n, p, eps)
    assert _tail(n, p, k) <= eps * (1 + 1e-9)
    assert k == 0 or _tail(n, p, k - 1) > eps * (1 - 1e-9)


def test_sampling_rule_hard_limit_count_and_nan() -> None:
    rule = TokenRule(tolerance=0.25, rate=1e-3, hard_limit=1.5)
    # n = 128, p = 1e-3 (mean 0.128): P(X > 3) ~ 0.128^4/24 = 1.1e-5 > 1e-6, P(X > 4) ~ 0.128^5/120 = 2.8e-7
    assert rule.allowed(128) == 4
    margins = torch.zeros(128, dtype=torch.float64)
    margins[:4] = 0.9
    assert rule.problem(margins) is None  # 4 beyond 0.25, allowed 4
    margins[4] = 0.3
    assert "5/128 tokens" in (rule.problem(margins) or "")
    margins[:] = 0.0
    margins[7] = 1.6
    assert "token 7" in (rule.problem(margins) or "")
    margins[7] = math.inf  # NaN logits give an infinite margin
    assert rule.problem(margins) is not None
    assert rule.problem(torch.zeros(0)) is None
    with pytest.raises(ValueError):
        TokenRule(tolerance=0.5, rate=0.0, hard_limit=0.25)


def _profile(margins: np.ndarray) -> toploc.NoiseProfile:
    return toploc.NoiseProfile.calibrate([toploc.Observations(margins, np.full(margins.size, 1e-3))])


def test_fp32_rejects_any_runner_up_swap_with_or_without_a_profile() -> None:
    honest = _profile(np.zeros(20_000))  # fp32: decode and prefill agree exactly
    for profile in (honest, None):
        checks = for_precision(_checks(), "float32", profile)
        assert checks.sampling_rule is not None and checks.validator.sampling_tolerance == FP32_SAMPLING_TOLERANCE
        margins = torch.zeros(16_384, dtype=torch.float64)
        assert checks.sampling_rule.problem(margins) is None
        margins[9_000] = 0.01  # one swap anywhere in 16k tokens, well inside bf16's 0.25
        assert checks.sampling_rule.problem(margins) is not None
    assert for_precision(_checks(), "float32", honest).validator.logprob_atol == 0.05  # max(0.05, 3 x 1e-3)


def test_bf16_without_evidence_keeps_the_configured_rule() -> None:
    checks = for_precision(_checks(), "bfloat16", None)
    assert checks.sampling_rule == TokenRule(0.25, 0.0, 0.25) and checks.validator.logprob_atol == 0.05


def test_bf16_rule_scales_with_length_where_the_worst_margin_rule_does_not() -> None:
    """bf16-like honest noise: 0.03% of tokens beyond 0.25 (an H200's 2 of 128 samples of 512 tokens).

    Calibrated on 200k tokens, judged on 1,000 honest samples of 2,048 tokens: the worst-margin rule
    rejects 1 - (1 - 3e-4)^2048 = 46% of them, the rule from the profile none; a steered sample
    that moves 5% of its tokens beyond the tolerance (and none beyond the hard limit) is rejected.
    """
    rng = np.random.default_rng(3)

    def honest(tokens: int) -> np.ndarray:
        margins = np.zeros(tokens)
        ties = rng.random(tokens) < 0.05
        margins[ties] = rng.exponential(0.031, ties.sum())  # P(> 0.25 | tie) = e^-8.06 = 3.2e-4 ... x 0.05
        margins[rng.random(tokens) < 3e-4] = rng.uniform(0.25, 0.5)
        return margins

    profile = _profile(honest(200_000))
    checks = for_precision(_checks(), "bfloat16", profile)
    rule = checks.sampling_rule
    assert rule is not None and rule.tolerance == 0.25
    assert rule.rate == profile.statistic("sampling_margin").rate_bounds[profile.statistic("sampling_margin").thresholds.index(0.25)]  # measured at the tolerance itself
    # 3x the 99.99th percentile (0.3: 3e-4 of tokens lie in (0.25, 0.5)), not 3x the largest margin
    assert rule.hard_limit == pytest.approx(3 * profile.statistic("sampling_margin").quantile(1e-4)) == pytest.approx(0.9)
    samples = [torch.from_numpy(honest(2_048)) for _ in range(1_000)]
    worst_rule = TokenRule(0.25, 0.0, 0.25)
    old = sum(worst_rule.problem(m) is not None for m in samples)
    assert 380 <= old <= 540  # ~46%
    assert sum(rule.problem(m) is not None for m in samples) == 0
    steered = honest(2_048)
    steered[rng.choice(2_048, 102, replace=False)] = rng.uniform(0.26, rule.hard_limit, 102)
    assert rule.problem(torch.from_numpy(steered)) is not None
