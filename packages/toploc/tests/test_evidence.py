"""Per-worker evidence: confidence bounds, calibration, the CUSUM likelihood-ratio tests, margins."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toploc import (
    EvidenceError,
    EvidencePolicy,
    EvidenceTests,
    NoiseProfile,
    Observations,
    StatisticNoise,
    VerificationResult,
    WorkerEvidence,
    check_sampling,
    sample_tokens,
    sampling_margins,
)
from toploc.noise import DEFAULT_GRIDS, STATISTICS, rate_upper_bound

TOKENS = EvidencePolicy(unit="token")
"""These tests check the per-token tests' arithmetic on hand-made per-token profiles."""


def _kl(p: float, q: float) -> float:
    terms = 0.0 if p == 0 else p * math.log(p / q)
    return terms + (0.0 if p == 1 else (1 - p) * math.log((1 - p) / (1 - q)))


def _profile(margin_rate: float, *, thresholds: tuple[float, ...] = (0.1,)) -> NoiseProfile:
    """Only ``sampling_margin > threshold`` is testable (p0 = margin_rate); every other bound is 1."""
    statistics = []
    for name in STATISTICS:
        if name == "sampling_margin":
            bounds = tuple(margin_rate for _ in thresholds)
            statistics.append(StatisticNoise(name, thresholds, bounds, 1000, 0.0))
        else:
            statistics.append(StatisticNoise(name, (1.0,), (1.0,), 1000, 0.0))
    return NoiseProfile((("model", "test"),), tuple(statistics))


def _obs(margins: list[float], gaps: list[float] | None = None) -> Observations:
    return Observations(np.array(margins), np.array(gaps if gaps is not None else [0.0] * len(margins)))


# -- confidence bound ------------------------------------------------------------------------------
def test_rate_bound_without_exceedances_is_exact() -> None:
    # k = 0: n·KL(0 || u) = -n·log(1 - u) = log(1/δ)  =>  u = 1 - δ^(1/n)
    for n, delta in ((1, 0.5), (100, 1e-3), (100_000, 1e-6)):
        assert rate_upper_bound(0, n, delta) == pytest.approx(1 - delta ** (1 / n), rel=1e-12)


@pytest.mark.parametrize(("k", "n", "delta"), [(1, 4, 1e-3), (5, 1000, 1e-3), (300, 1000, 0.05), (9, 10, 0.1)])
def test_rate_bound_solves_the_chernoff_equation(k: int, n: int, delta: float) -> None:
    u = rate_upper_bound(k, n, delta)
    assert k / n < u < 1
    assert n * _kl(k / n, u) == pytest.approx(math.log(1 / delta), rel=1e-9)


def test_rate_bound_edges_and_errors() -> None:
    assert rate_upper_bound(0, 0, 0.1) == 1.0
    assert rate_upper_bound(7, 7, 0.1) == 1.0
    assert rate_upper_bound(3, 100, 1e-6) > rate_upper_bound(3, 100, 1e-2) > rate_upper_bound(2, 100, 1e-2)
    with pytest.raises(EvidenceError):
        rate_upper_bound(5, 4, 0.1)
    with pytest.raises(EvidenceError):
        rate_upper_bound(1, 4, 1.0)


# -- observations ----------------------------------------------------------------------------------
def test_observations_validate_their_input() -> None:
    with pytest.raises(EvidenceError, match="log-prob gaps"):
        Observations(np.zeros(3), np.zeros(2))
    with pytest.raises(EvidenceError, match="NaN"):
        Observations(np.array([0.0, np.nan]), np.zeros(2))
    with pytest.raises(EvidenceError, match=">= 0"):
        Observations(np.array([0.0, -1.0]), np.zeros(2))
    with pytest.raises(EvidenceError, match="chunk"):
        Observations(np.zeros(2), np.zeros(2), np.zeros(1), np.zeros(0))
    with pytest.raises(EvidenceError, match="unknown statistic"):
        _obs([0.0]).values("margin")


def test_observations_from_checks() -> None:
    results = [VerificationResult(3, 0.5, 0.0), VerificationResult(0, float("nan"), 0.0)]
    obs = Observations.from_checks(
        torch.tensor([0.0, float("nan"), 0.25]), [-1.0, -2.0, float("-inf")], torch.tensor([-1.5, -2.0, -0.1]), results
    )
    assert obs.sampling_margin.tolist() == [0.0, math.inf, 0.25]  # float32 0.25 is exact
    assert obs.logprob_gap.tolist() == [0.5, 0.0, math.inf]  # a non-finite claim is maximal evidence
    assert obs.proof_exp_mismatches.tolist() == [3.0, 0.0]
    assert obs.proof_mant_err_mean.tolist() == [0.5, math.inf]
    cut = obs.prefix(2, chunk_size=1)
    assert cut.num_tokens == 2 and cut.proof_exp_mismatches.tolist() == [3.0, 0.0]
    assert obs.prefix(2).proof_exp_mismatches.size == 0  # no whole 32-token chunk in 2 tokens
    with pytest.raises(EvidenceError):
        Observations.from_checks([0.0], [-1.0, -2.0], [-1.0, -2.0])


# -- calibration -----------------------------------------------------------------------------------
def test_calibrate_counts_exceedances_on_the_grid() -> None:
    honest = [_obs([0.0, 0.0, 0.5], [1e-6, 0.0, 0.0]), _obs([0.05], [0.02])]
    profile = NoiseProfile.calibrate(honest, description={"dtype": "float32"}, delta=1e-3, safety=2.0)
    margin = profile.statistic("sampling_margin")
    assert margin.observations == 4 and margin.maximum == 0.5 and margin.thresholds == DEFAULT_GRIDS["sampling_margin"]
    # 2 of 4 margins exceed 1e-6 ... 3e-2, 1 of 4 exceeds 0.1 ... 0.3, none exceeds 0.5 or 1.0
    expected = {1e-6: 2, 3e-2: 2, 0.1: 1, 0.3: 1, 0.5: 0, 1.0: 0}
    for threshold, k in expected.items():
        bound = margin.rate_bounds[margin.thresholds.index(threshold)]
        assert bound == pytest.approx(min(1.0, 2.0 * rate_upper_bound(k, 4, 1e-3)))
    assert profile.statistic("proof_exp_mismatches").observations == 0
    assert profile.statistic("proof_exp_mismatches").rate_bounds == (1.0,) * len(DEFAULT_GRIDS["proof_exp_mismatches"])
    assert dict(profile.description) == {"dtype": "float32"}


def test_profile_json_round_trip_merge_and_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = NoiseProfile.calibrate([_obs([0.0] * 1000)], description={"machine": "a"})
    b = NoiseProfile.calibrate([_obs([0.5] * 10 + [0.0] * 990)], description={"machine": "b"})
    path = tmp_path / "noise.json"
    b.save(path)
    assert NoiseProfile.load(path) == b
    merged = NoiseProfile.merge(a, b)
    for name in STATISTICS:
        x, y, m = a.statistic(name), b.statistic(name), merged.statistic(name)
        assert m.rate_bounds == tuple(max(p, q) for p, q in zip(x.rate_bounds, y.rate_bounds, strict=True))
        assert m.observations == x.observations + y.observations
    assert dict(merged.description) == {"machine": "a | b"}
    with pytest.raises(EvidenceError, match="format"):
        NoiseProfile.from_json('{"format": "other"}')
    with pytest.raises(EvidenceError, match="malformed"):
        NoiseProfile.from_json("not json")
    # grids that differ merge on their union: a profile without 0.25 bounds it by its bound at 0.2
    old_grid = NoiseProfile.calibrate([_obs([0.5] * 10 + [0.0] * 990)], grids={**DEFAULT_GRIDS, "sampling_margin": (0.2, 0.3)})
    union = NoiseProfile.merge(a, old_grid).statistic("sampling_margin")
    assert union.thresholds == DEFAULT_GRIDS["sampling_margin"] and union.exceedances == ()
    old_margin = old_grid.statistic("sampling_margin")
    assert union.rate_bounds[union.thresholds.index(0.25)] == old_margin.rate_bounds[0]  # its bound at 0.2
    assert union.rate_bounds[union.thresholds.index(0.1)] == 1.0  # nothing below 0.2 measured there
    assert b.per_sample_limit("sampling_margin") == pytest.approx(1.5)
    assert a.per_sample_limit("sampling_margin", floor=0.25) == 0.25


# -- the tests -------------------------------------------------------------------------------------
def test_threshold_is_the_union_bound() -> None:
    policy = EvidencePolicy(unit="token", false_ban_rate=1e-4, horizon_samples=1000, alternatives=(3.0, 30.0))
    tests = EvidenceTests.from_profile(_profile(0.01, thresholds=(0.1, 1.0)), policy)
    assert len(tests) == 4  # 2 thresholds x 2 bets; every other statistic has p0 = 1 > max_null_rate
    assert tests.alternative_rates.tolist() == [0.03, 0.3, 0.03, 0.3]
    # alpha is split in half: history log(2K/alpha), recent (CUSUM) log(2K·H/alpha)
    assert tests.log_threshold == pytest.approx(math.log(2 * 4 * 1000 / 1e-4))
    assert tests.history_log_threshold == pytest.approx(math.log(2 * 4 / 1e-4))
    with pytest.raises(EvidenceError, match="no usable test"):
        EvidenceTests.from_profile(_profile(0.5), TOKENS)


def test_log_evidence_by_hand_and_cusum_restart() -> None:
    tests = EvidenceTests.from_profile(_profile(0.01), EvidencePolicy(unit="token", alternatives=(3.0,)))
    exceed, stay = math.log(0.03 / 0.01), math.log(0.97 / 0.99)
    # 2 of 4 margins exceed 0.1 (0.1 itself does not: strictly greater)
    assert tests.log_evidence(_obs([0.5, 0.0, 0.1, 0.2]))[0] == pytest.approx(2 * exceed + 2 * stay)
    evidence = WorkerEvidence(tests)
    first = evidence.update(_obs([0.0] * 10))
    assert first.recent_score == pytest.approx(10 * stay) and first.tokens == 10 and first.samples == 1
    assert first.history_score == pytest.approx(10 * stay)
    second = evidence.update(_obs([0.5]))  # the negative recent score restarts at 0 before this sample
    assert second.recent_score == pytest.approx(exceed)
    assert second.history_score == pytest.approx(exceed + 10 * stay)  # the history never restarts
    third = evidence.update(_obs([0.5, 0.0]))  # a positive score carries over
    assert third.recent_score == pytest.approx(2 * exceed + stay)
    assert third.history_score == pytest.approx(2 * exceed + 11 * stay)
    assert "sampling_margin > 0.1" in third.strongest and not third.banned
    # the binding score is the larger fraction of its own threshold
    fractions = (third.history_score / tests.history_log_threshold, third.recent_score / tests.log_threshold)
    assert third.fraction == pytest.approx(max(fractions))


def test_ban_is_final() -> None:
    policy = EvidencePolicy(unit="token", false_ban_rate=0.5, horizon_samples=1, alternatives=(30.0,))
    tests = EvidenceTests.from_profile(_profile(0.01), policy)  # recent threshold log(2 / 0.5) = 1.39 < log 30
    evidence = WorkerEvidence(tests)
    assert evidence.update(_obs([0.5])).banned
    assert evidence.update(_obs([0.0] * 1000)).banned  # later honesty does not lift a ban
    assert evidence.state().fraction < 0


def test_false_bans_stay_below_alpha_and_deviations_are_caught() -> None:
    """Simulated workers whose exceedances are Bernoulli(p0) (the worst honest case) vs 5·p0."""
    p0, alpha, horizon, samples, length = 0.01, 0.1, 20, 20, 50
    tests = EvidenceTests.from_profile(_profile(p0), EvidencePolicy(unit="token", false_ban_rate=alpha, horizon_samples=horizon))
    rng = np.random.default_rng(0)

    def banned_share(rate: float, workers: int) -> float:
        bans = 0
        for _ in range(workers):
            evidence = WorkerEvidence(tests)
            for _ in range(samples):
                evidence.update(_obs((rng.random(length) < rate).astype(float).tolist()))
            bans += evidence.banned
        return bans / workers

    assert banned_share(p0, 300) <= alpha  # Ville + union bound
    assert banned_share(5 * p0, 60) >= 0.95


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 2, allow_nan=False), min_size=0, max_size=40),
    st.lists(st.floats(0, 2, allow_nan=False), min_size=0, max_size=40),
)
def test_log_evidence_is_additive_and_monotone(a: list[float], b: list[float]) -> None:
    tests = EvidenceTests.from_profile(_profile(0.01, thresholds=(0.01, 0.1, 1.0)), TOKENS)
    whole = tests.log_evidence(_obs(a + b))
    assert np.allclose(whole, tests.log_evidence(_obs(a)) + tests.log_evidence(_obs(b)), rtol=0, atol=1e-9)
    assert np.allclose(whole, tests.log_evidence(_obs(b + a)), rtol=0, atol=1e-9)
    if a:  # raising one observation never lowers any test's evidence
        raised = [a[0] + 1.0, *a[1:]]
        assert (tests.log_evidence(_obs(raised + b)) >= whole - 1e-12).all()


def test_policy_validation() -> None:
    for bad in (
        {"false_ban_rate": 0.0},
        {"horizon_samples": 0},
        {"alternatives": (1.0,)},
        {"max_null_rate": 0.6},
    ):
        with pytest.raises(EvidenceError):
            EvidencePolicy(**bad)  # type: ignore[arg-type]


# -- sampling margins ------------------------------------------------------------------------------
def test_sampling_margins_agree_with_check_sampling() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=generator) * 3
    positions = torch.arange(64)
    honest = sample_tokens(logits, 7, torch.full((64,), 3), positions, temperature=0.8)
    assert sampling_margins(logits, honest, 7, 3, positions, 0.8).eq(0).all()
    forged = honest.clone()
    forged[::5] = (forged[::5] + 1) % 50
    margins = sampling_margins(logits, forged, 7, 3, positions, 0.8)
    check = check_sampling(logits, forged, 7, 3, positions, 0.8, tolerance=0.25)
    assert margins.max().item() == check.max_margin
    assert int((margins == 0).sum()) == check.exact_matches
    assert tuple(torch.nonzero(margins > 0.25).flatten().tolist()) == check.mismatch_positions
    logits[3, 0] = float("nan")
    assert sampling_margins(logits, forged, 7, 3, positions, 0.8)[3].item() == math.inf
    with pytest.raises(ValueError):
        sampling_margins(logits, forged[:10], 7, 3, positions, 0.8)
