"""The bf16 per-token rules (issue #34 item 9): allowance monotone in the tolerance, hard limit from a
quantile with a cap, log-probs judged per token."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import toploc
from prime_rl.config import load_config
from prime_rl.validator.checks import Checks, logprob_problem
from prime_rl.validator.tolerances import for_precision

GRID = toploc.noise.DEFAULT_GRIDS["sampling_margin"]


def _checks(**validator: float) -> Checks:
    checks = Checks.from_config(
        load_config(None, []), vocab_size=2**31, eos_token_ids=frozenset(), assignment_key=b"", hidden_size=128
    )
    return checks.widened(**validator) if validator else checks


def _bf16_profile(seed: int = 0, tokens: int = 100_000) -> toploc.NoiseProfile:
    """bf16-like honest noise: 2% near ties with exponential margins (mean 0.02), log-prob gaps ~ 0.01."""
    rng = np.random.default_rng(seed)
    margins = np.where(rng.random(tokens) < 0.02, rng.exponential(0.02, tokens), 0.0)
    gaps = rng.exponential(0.006, tokens)
    return toploc.NoiseProfile.calibrate([toploc.Observations(margins, gaps)])


PROFILE = _bf16_profile()


def _rule(tolerance: float) -> object:
    rule = for_precision(_checks(sampling_tolerance=tolerance), "bfloat16", PROFILE).sampling_rule
    assert rule is not None
    return rule


def test_a_lower_tolerance_never_allows_more_swaps_beyond_a_margin() -> None:
    """The issue's numbers: the old rule allowed 16 of 1,024 tokens beyond 0.25 at tolerance 0.25, but
    588 at tolerance 0 (rate 0.5 at no grid point), each up to the hard limit. Now tolerance 0
    allows no more tokens beyond 0.25 than tolerance 0.25 does, and a sample with 100 tokens at
    0.3 (a steering worker spending the tolerance-0 allowance far out) fails at both."""
    loose, strict = _rule(0.25), _rule(0.0)
    assert strict.allowed(1024, above=0.25) <= loose.allowed(1024)
    assert strict.allowed(1024) >= loose.allowed(1024)  # more tokens beyond 0: honest bf16 ties are many
    steered = torch.zeros(1024, dtype=torch.float64)
    steered[:100] = 0.3
    assert loose.problem(steered) is not None
    assert strict.problem(steered) is not None


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from((0.0, *GRID[:-1])),  # (0.25 is on the grid)
    st.floats(0.0, 0.6),
    st.floats(0.0, 0.6),
    st.integers(1, 2048),
    st.lists(st.floats(0.0, 1.2), min_size=1, max_size=300),
)
def test_allowed_is_monotone_in_the_tolerance_and_the_margin(
    on_grid: float, a: float, b: float, tokens: int, values: list[float]
) -> None:
    """For tolerances t1 <= t2 (one of them possibly a grid point): for every margin x, the rule at t1
    allows no more tokens beyond x than the rule at t2, allowed(n, above=x) is non-increasing in x,
    and every sample the rule at t1 accepts, the rule at t2 accepts."""
    t1, t2 = sorted((on_grid if a < 0.3 else a, b))
    strict, loose = _rule(t1), _rule(t2)
    margins = [0.0, t1, t2, *GRID, strict.hard_limit, loose.hard_limit, 2.0]
    for x in margins:
        assert strict.allowed(tokens, above=x) <= loose.allowed(tokens, above=x), (t1, t2, x)
    for rule in (strict, loose):
        ordered = [rule.allowed(tokens, above=x) for x in sorted(margins)]
        assert ordered == sorted(ordered, reverse=True)
    sample = torch.tensor(values, dtype=torch.float64)
    if strict.problem(sample) is None:
        assert loose.problem(sample) is None, (t1, t2, values)


def test_the_hard_limit_is_a_capped_quantile_not_three_times_one_outlier() -> None:
    """200k honest tokens whose margins stay below 0.03 but for one outlier at 0.9: the old hard limit
    was 3 x 0.9 = 2.7 logits, so a worker could put its allowance anywhere up to 2.7. The 99.99th
    percentile is 0.03 (grid), 3x that is below the tolerance, so the limit is the tolerance 0.25.
    And a profile whose tail is wide everywhere is capped at 1.0 logit."""
    rng = np.random.default_rng(1)
    margins = np.where(rng.random(200_000) < 0.02, rng.uniform(0, 0.03, 200_000), 0.0)
    margins[17] = 0.9
    profile = toploc.NoiseProfile.calibrate([toploc.Observations(margins, np.full(margins.size, 1e-3))])
    rule = for_precision(_checks(), "bfloat16", profile).sampling_rule
    assert rule is not None and rule.hard_limit == 0.25
    far = torch.zeros(1024, dtype=torch.float64)
    far[5] = 0.6
    assert "token 5" in (rule.problem(far) or "")
    wide = toploc.NoiseProfile.calibrate([toploc.Observations(rng.uniform(0, 2.0, 50_000), np.full(50_000, 1e-3))])
    capped = for_precision(_checks(), "bfloat16", wide).sampling_rule
    assert capped is not None and capped.hard_limit == 1.0


def test_the_h200_profile_gives_a_rule_that_accepts_its_honest_samples() -> None:
    """The H200 calibration (benchmarks/results/gpu_check.json, section noise: 262,144 honest bf16
    tokens, largest margin 0.037; judged rows: largest worst margin 0.041 over 2,112 samples of
    256-1,024 new tokens, 0 rejected): its 99.99th percentile is 0.03, so the hard limit is the
    tolerance 0.25, above every honest margin seen; the 6 tokens beyond 0.03 in 262,144 give
    allowance >= 1 beyond 0.03 in a 1,024-token sample, where the honest mean is 0.02."""
    noise = _gpu_margin_noise()
    assert noise.quantile(1e-4) == 0.03
    rule = for_precision(_checks(), "bfloat16", toploc.NoiseProfile((), (noise, *_other_statistics()))).sampling_rule
    assert rule is not None and rule.hard_limit == 0.25 >= 0.041
    assert rule.allowed(1024, above=0.03) >= 1 and rule.allowed(1024, above=0.0) >= 10
    worst = torch.zeros(1024, dtype=torch.float64)
    worst[:5] = 0.02
    worst[9] = 0.041
    assert rule.problem(worst) is None
    # log-prob gaps (same calibration: 54,950 of 262,144 above 0.01, 128 above 0.03, largest 0.039):
    # per token, the tolerance 0.05 lies above every honest gap, and 3x the 99.99th percentile (0.1)
    gaps_noise = _gpu_noise("logprob_gap", (255634, 244423, 226788, 223029, 217578, 191559, 54950, 128, 0, 0, 0), 0.0391)
    profile = toploc.NoiseProfile((), (noise, gaps_noise, *_other_statistics()[1:]))
    logprob_rule = for_precision(_checks(), "bfloat16", profile).logprob_rule
    assert logprob_rule is not None and logprob_rule.hard_limit == pytest.approx(0.3)
    honest_gaps = torch.full((1024,), 0.02, dtype=torch.float64)
    honest_gaps[:3] = 0.0391
    assert logprob_rule.problem(honest_gaps) is None


def _gpu_noise(name: str, counts: tuple[int, ...], maximum: float, grid: tuple[float, ...] | None = None) -> toploc.StatisticNoise:
    """One statistic of gpu_check.json's calibration (262,144 tokens; exceedance counts as printed
    there, on the grid of the day), with the bounds ``NoiseProfile.calibrate`` gives them."""
    bounds = np.minimum.accumulate([min(1.0, 2 * toploc.noise.rate_upper_bound(k, 262_144, 1e-3)) for k in counts])
    grid = grid or toploc.noise.DEFAULT_GRIDS[name]
    return toploc.StatisticNoise(name, grid, tuple(float(b) for b in bounds), 262_144, maximum, counts)


def _gpu_margin_noise() -> toploc.StatisticNoise:
    """Measured before the grid gained 0.25 (a profile file of that day still loads and judges)."""
    grid = (1e-6, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.2, 0.3, 0.5, 1.0)
    return _gpu_noise("sampling_margin", (1194, 1193, 1182, 1067, 844, 335, 6, 0, 0, 0, 0, 0), 0.037, grid)


def _other_statistics() -> tuple[toploc.StatisticNoise, ...]:
    """logprob_gap, then the proof statistics, of a flat stand-in profile."""
    flat = toploc.NoiseProfile.calibrate([toploc.Observations(np.zeros(10_000), np.full(10_000, 5e-3))])
    return tuple(s for s in flat.statistics if s.name != "sampling_margin")


@pytest.mark.parametrize("profile", [None, PROFILE])
def test_the_logprob_check_is_per_token(profile: toploc.NoiseProfile | None) -> None:
    """One token of 1,024 claims a log-prob 1 nat off: the mean gap (0.001) was far inside the old
    per-sample bound (0.05, or 3x the largest honest per-token gap); per token it fails, with or
    without a profile. Honest-sized gaps on every token pass."""
    checks = for_precision(_checks(), "bfloat16", profile)
    recomputed = torch.full((1024,), -1.0, dtype=torch.float64)
    honest = (recomputed + 0.004).tolist()
    assert logprob_problem(recomputed, honest, checks) is None
    lying = list(honest)
    lying[700] -= 1.0
    assert "1/1024 tokens" in (logprob_problem(recomputed, lying, checks) or "") or "token 700" in (
        logprob_problem(recomputed, lying, checks) or ""
    )
    lying[700] = float("nan")
    assert logprob_problem(recomputed, lying, checks) is not None


def test_spending_the_allowance_on_every_sample_feeds_the_identitys_evidence_until_it_is_banned() -> None:
    """CPU-bf16-like noise (5% near ties, margins ~ Exp(mean 0.05): 9e-4 of tokens beyond 0.2). A worker
    fills every sample up to exactly ``allowed(256)`` tokens just beyond the tolerance (0.26): each sample
    passes the per-sample rule, but each such sample is an event ("allowed(256)+ margins above 0.25")
    that honest samples almost never show, so by its second sample the evidence is above the release
    bound (0.25 of the threshold: nothing it sent is released; its first sample is withheld anyway,
    for its tokens beyond the tolerance, ``orchestrator/release.py``) and it is banned within a few
    samples. An honest worker through the same 200 samples stays far below the bound."""
    rng = np.random.default_rng(5)

    def honest(tokens: int) -> np.ndarray:
        return np.where(rng.random(tokens) < 0.05, rng.exponential(0.05, tokens), 0.0)

    # 800 samples of 256 tokens: the evidence's unit is the sample, so its calibration needs samples
    profile = toploc.NoiseProfile.calibrate([toploc.Observations(honest(256), np.full(256, 5e-3)) for _ in range(800)])
    rule = for_precision(_checks(), "bfloat16", profile).sampling_rule
    assert rule is not None and rule.allowed(256) >= 2
    tests = toploc.EvidenceTests.from_profile(profile)
    cheat, fair = toploc.WorkerEvidence(tests), toploc.WorkerEvidence(tests)
    fractions, banned_after = [], None
    for sample in range(200):
        margins = honest(256)
        spend = rule.allowed(256) - int((margins > rule.tolerance).sum())  # it knows its margins in advance
        positions = rng.choice(np.flatnonzero(margins <= rule.tolerance), max(spend, 0), replace=False)
        margins[positions] = 0.26
        assert rule.problem(torch.from_numpy(margins)) is None
        state = cheat.update(toploc.Observations(margins, np.full(256, 5e-3)))
        fractions.append(state.fraction)
        if state.banned and banned_after is None:
            banned_after = sample + 1
        fair_state = fair.update(toploc.Observations(honest(256), np.full(256, 5e-3)))
        assert not fair_state.banned and fair_state.fraction < 0.25
    assert fractions[1] >= 0.25
    assert banned_after is not None and banned_after <= 10, fractions[:10]
