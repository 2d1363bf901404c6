"""The whole-history evidence: oracles, hit-and-run, dilution, honest streams, snapshots."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toploc import (
    EvidenceError,
    EvidencePolicy,
    EvidenceTests,
    NoiseProfile,
    Observations,
    StatisticNoise,
    WorkerEvidence,
)
from toploc.noise import STATISTICS

FLAG = 0.25
"""The orchestrator's default ``release_max_evidence``: a worker at or above it has nothing released."""

TOKENS = EvidencePolicy(unit="token")
"""These tests check the per-token tests' arithmetic on hand-made per-token profiles."""


def _profile(margin_rate: float, *, thresholds: tuple[float, ...] = (0.1,)) -> NoiseProfile:
    """Only ``sampling_margin > threshold`` is testable (p0 = margin_rate); every other bound is 1."""
    statistics = []
    for name in STATISTICS:
        if name == "sampling_margin":
            statistics.append(StatisticNoise(name, thresholds, tuple(margin_rate for _ in thresholds), 1000, 0.0))
        else:
            statistics.append(StatisticNoise(name, (1.0,), (1.0,), 1000, 0.0))
    return NoiseProfile((("model", "test"),), tuple(statistics))


def _obs(margins: list[float] | np.ndarray) -> Observations:
    margins = np.asarray(margins, dtype=np.float64)
    return Observations(margins, np.zeros(margins.size))


def _history_oracle(p0: float, bets: tuple[float, ...], seen: int, exceeded: int) -> float:
    """max over bets c of k·log(c) + (n - k)·log((1 - c·p0)/(1 - p0)): the whole-history LLR."""
    return max(exceeded * math.log(c) + (seen - exceeded) * math.log((1 - c * p0) / (1 - p0)) for c in bets)


def test_history_score_by_hand() -> None:
    # p0 = 1e-3, bets 10 and 100: 3 exceedances in 1,000 observations
    #   c = 10:  3·log 10 + 997·log(0.99/0.999) = 6.908 - 9.022 = -2.114
    #   c = 100: 3·log 100 + 997·log(0.9/0.999) = 13.816 - 104.06 = -90.24
    # and in 100: c = 10: 6.908 + 97·(-0.009050) = 6.030; c = 100: 13.816 + 97·(-0.10436) = 3.693
    tests = EvidenceTests.from_profile(_profile(1e-3), EvidencePolicy(unit="token", alternatives=(10.0, 100.0)))
    evidence = WorkerEvidence(tests)
    state = evidence.update(_obs([0.5, 0.5, 0.5] + [0.0] * 97))
    assert state.history_score == pytest.approx(6.908 - 97 * 0.009050, abs=2e-3)
    assert state.history_score == pytest.approx(_history_oracle(1e-3, (10.0, 100.0), 100, 3), rel=1e-12)
    state = evidence.update(_obs([0.0] * 900))
    assert state.history_score == pytest.approx(6.908 - 997 * 0.009050, abs=2e-2)
    assert state.recent_score == pytest.approx(state.history_score)  # one negative run: no restart yet
    assert tests.history_log_threshold == pytest.approx(math.log(2 * 2 / 1e-6))  # 15.2 nats


def test_hit_and_run_stays_flagged() -> None:
    """2 runner-up swaps in a fresh identity's first 128 tokens, then 5,120 honest tokens.

    p0 = 1e-5 (fp32: honest margins are exactly 0; a 1.4M-token calibration bounds the rate of
    ``margin > 0.1`` by 2·log(1000)/1.4e6). Default policy: K = 5 bets, history threshold
    log(10/1e-6) = 16.12. With k = 2 exceedances in n tokens the best bet is
      n = 128:   c = 300: 2·5.7038 + 126·log(0.997/0.99999)   = 11.03 -> 0.68 (flagged, not banned)
      n = 5,248: c = 30:  2·3.4012 + 5246·log(0.9997/0.99999) = 5.28  -> 0.33 (still flagged)
    The former design (the CUSUM alone, banning at log(K·H/alpha) = 29.2 nats) read the same
    5.28 nats as 0.18 of its threshold and released the batch.
    Dilution is the only way down: the best bet stays above the flag (4.03 nats) while
    2·log(2/(n·p0)) - 2 + n·p0 > 4.03, i.e. for n up to ~0.1/p0 (9,100 tokens; 9,546 with this grid of bets); no test can
    do better, since beyond that honest noise explains 2 exceedances.
    """
    p0, bets = 1e-5, (3.0, 10.0, 30.0, 100.0, 300.0)
    tests = EvidenceTests.from_profile(_profile(p0), TOKENS)
    evidence = WorkerEvidence(tests)
    swaps = np.zeros(128)
    swaps[[5, 77]] = 0.2  # inside the 0.25 tolerance
    hit = evidence.update(_obs(swaps))
    assert hit.fraction == pytest.approx(0.684, abs=1e-3) and not hit.banned
    fractions = [evidence.update(_obs(np.zeros(128))).fraction for _ in range(40)]
    assert min(fractions) >= FLAG  # nothing of this identity is released
    state = evidence.state()
    assert state.recent_score / math.log(5 * 1e6 / 1e-6) < FLAG  # the former design's reading
    assert state.history_score == pytest.approx(_history_oracle(p0, bets, 5248, 2), rel=1e-9)
    assert state.history_score == pytest.approx(5.281, abs=1e-3)
    for _ in range(60):  # diluted, not erased: below the flag only after 9,600 tokens
        state = evidence.update(_obs(np.zeros(128)))
        if state.fraction < FLAG:
            break
    # the c = 30 bet, the last above the flag: 2·log 30 - (n - 2)·0.000290 < 4.03 from n = 9,546 on
    first_below = next(n for n in range(128, 20_000, 128) if _history_oracle(p0, bets, n, 2) < FLAG * math.log(1e7))
    assert state.tokens == first_below == 9_600


def test_diluted_steering_is_banned() -> None:
    """1 sample in 10 steered (13 of its 128 tokens swapped), honest exceedances at the bound p0.

    Token rate 13/1280 = 1.0% against p0 = 1e-4: the c = 100 bet gains KL(0.01 || 1e-4) ≈ 0.036
    nats per token, the history threshold (16.1) falls after ~450 tokens' worth, i.e. within the
    first few steered samples. The recent score alone would restart after every honest run.
    """
    p0 = 1e-4
    tests = EvidenceTests.from_profile(_profile(p0), TOKENS)
    rng = np.random.default_rng(1)
    banned_at = []
    for worker in range(20):
        evidence = WorkerEvidence(tests)
        for sample in range(200):
            margins = (rng.random(128) < p0).astype(float)  # honest noise at its worst allowed rate
            if sample % 10 == worker % 10:
                margins[rng.choice(128, 13, replace=False)] = 0.2
            if evidence.update(_obs(margins)).banned:
                banned_at.append(evidence.tokens)
                break
    assert len(banned_at) == 20
    assert max(banned_at) <= 10 * 1280  # within 10 steered samples


def test_honest_streams_are_never_flagged() -> None:
    """Calibrate on honest draws, then judge 24 held-out honest workers of 4,352 tokens (104k in all).

    Honest margins: 0 except on near ties (5% of tokens), where they are exponential with mean
    0.02 (the shape of bf16 decode-vs-prefill noise); the profile comes from 100k calibration
    tokens of the same distribution (``NoiseProfile.calibrate``: Chernoff bound at delta 1e-3,
    safety 2). No held-out worker, nor all of them judged as one worker, reaches the flag.
    """
    rng = np.random.default_rng(7)

    def honest(tokens: int) -> np.ndarray:
        margins = np.zeros(tokens)
        ties = rng.random(tokens) < 0.05
        margins[ties] = rng.exponential(0.02, ties.sum())
        return margins

    calibration = [_obs(honest(512)) for _ in range(196)]
    profile = NoiseProfile.calibrate(calibration)
    tests = EvidenceTests.from_profile(profile, TOKENS)
    one = WorkerEvidence(tests)
    worst, total = 0.0, 0
    for _ in range(24):
        evidence = WorkerEvidence(tests)
        for length in (128, 256, 512, 1024, 2048, 384):
            sample = _obs(honest(length))
            worst = max(worst, evidence.update(sample).fraction, one.update(sample).fraction)
            total += length
        assert not evidence.banned
    assert total >= 100_000 and not one.banned and worst < FLAG


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from([0.0, 0.05, 0.2, 0.5, 2.0]), min_size=0, max_size=30), min_size=1, max_size=8)
)
def test_history_equals_the_sum_over_all_observations(samples: list[list[float]]) -> None:
    """However the tokens are cut into samples, the history score is the plain LLR of all of them."""
    tests = EvidenceTests.from_profile(_profile(0.01, thresholds=(0.01, 0.1, 1.0)), TOKENS)
    evidence = WorkerEvidence(tests)
    for sample in samples:
        evidence.update(_obs(sample))
    everything = [x for sample in samples for x in sample]
    assert np.allclose(evidence.history_scores(), tests.log_evidence(_obs(everything)), rtol=0, atol=1e-9)


def test_snapshot_round_trip_and_a_changed_profile() -> None:
    tests = EvidenceTests.from_profile(_profile(1e-3, thresholds=(0.1, 1.0)), TOKENS)
    evidence = WorkerEvidence(tests)
    evidence.update(_obs([0.5, 0.0, 2.0]))
    evidence.update(_obs([0.0] * 5))
    snapshot = json.loads(json.dumps(evidence.snapshot()))  # survives JSON
    back = WorkerEvidence.restore(tests, snapshot)
    assert back.state() == evidence.state()
    assert (back.seen == evidence.seen).all() and (back.exceeded == evidence.exceeded).all()
    # a re-measured profile: counts by (statistic, threshold) carry over, recent scores of changed tests restart
    other = EvidenceTests.from_profile(_profile(2e-3, thresholds=(0.1, 0.3)), TOKENS)
    moved = WorkerEvidence.restore(other, snapshot)
    at_01 = [j for j in range(len(other)) if other.thresholds[j] == 0.1]
    at_03 = [j for j in range(len(other)) if other.thresholds[j] == 0.3]
    assert (moved.seen[at_01] == 8).all() and (moved.exceeded[at_01] == 2).all()
    assert (moved.seen[at_03] == 0).all() and (moved.scores == 0).all()
    assert moved.samples == 2 and moved.tokens == 8


def test_restore_rejects_bad_snapshots() -> None:
    tests = EvidenceTests.from_profile(_profile(1e-3), TOKENS)
    good = WorkerEvidence(tests).snapshot()
    for bad in (
        {},
        {**good, "format": "other"},
        {**good, "counts": [["sampling_margin", 0.1, 3, 5]]},
        {**good, "counts": "x"},
        {**good, "samples": None},
        {**good, "recent": [float("inf")] * len(tests)},
        {**good, "recent": ["x"]},
    ):
        with pytest.raises(EvidenceError):
            WorkerEvidence.restore(tests, bad)
    assert WorkerEvidence.restore(tests, {**good, "banned": True}).state().banned  # a ban is kept
