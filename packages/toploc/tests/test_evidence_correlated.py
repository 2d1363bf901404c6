"""Per-worker evidence when honest exceedances are correlated within a sample.

The evidence tests are Bernoulli likelihood ratios: their false-ban bound assumes that each token
exceeds a threshold with conditional probability at most p0. Real decode-vs-prefill noise
clusters: a stretch of near-tied logits (a list of numbers, a run of code) gives several margins
above a threshold in a row. Here an honest worker's margins come from a two-state Markov chain
(inside a near-tie stretch half the tokens exceed 0.01, outside none), the profile is calibrated
on one set of such samples and held-out honest workers of the same process are judged, so the
calibration sees the correlation it is judged under (``test_evidence.py`` uses independent tokens
throughout). The evidence's unit is the sample (``EvidencePolicy.unit``, default): each test is one
trial per sample ("m+ margins above t" at the profile's per-sample bound), so stretches of any
length keep false bans within the policy's rate, and a deviating worker is still caught. The
per-token tests (``unit="token"``) assume independent tokens: under stretches of ~30 tokens they
ban about half the honest workers (the last test pins that, so the difference stays visible).
"""

from __future__ import annotations

import numpy as np
import pytest

from toploc import EvidencePolicy, EvidenceTests, NoiseProfile, Observations, WorkerEvidence

LENGTH, CALIBRATION_SAMPLES, WORKERS, SAMPLES_PER_WORKER = 256, 64, 120, 30
ALPHA = 0.01


def honest_sample(rng: np.random.Generator, start: float, stay: float) -> Observations:
    """Margins of one honest sample: near-tie stretches begin w.p. ``start`` and go on w.p. ``stay``
    (mean length 1 / (1 - stay)); inside one, a token exceeds 0.01 w.p. 1/2."""
    margins = np.zeros(LENGTH)
    inside = False
    for t in range(LENGTH):
        inside = rng.random() < (stay if inside else start)
        if inside and rng.random() < 0.5:
            margins[t] = 0.02 + 0.05 * rng.random()
    return Observations(margins, np.zeros(LENGTH))


def false_bans(start: float, stay: float, seed: int, steer: float = 0.0, unit: str = "sample") -> int:
    """Held-out workers banned, with the profile calibrated on the same process (``steer``: the
    share of other tokens a deviating worker pushes past every threshold but the top)."""
    rng = np.random.default_rng(seed)
    profile = NoiseProfile.calibrate([honest_sample(rng, start, stay) for _ in range(CALIBRATION_SAMPLES)])
    policy = EvidencePolicy(false_ban_rate=ALPHA, horizon_samples=10**4, unit=unit)
    tests = EvidenceTests.from_profile(profile, policy)
    banned = 0
    for _ in range(WORKERS):
        evidence = WorkerEvidence(tests)
        for _ in range(SAMPLES_PER_WORKER):
            sample = honest_sample(rng, start, stay)
            if steer:
                steered = rng.random(LENGTH) < steer
                sample = Observations(np.where(steered, 0.2, sample.sampling_margin), sample.logprob_gap)
            evidence.update(sample)
        banned += evidence.banned
    return banned


# 120 workers at alpha = 0.01: 1.2 false bans expected at most; 4 or more has probability < 0.04.
@pytest.mark.parametrize(
    ("start", "stay"),
    [(0.004, 0.0), (0.002, 0.5)],
    ids=["independent tokens", "stretches of 2 tokens"],
)
def test_honest_workers_stay_within_the_false_ban_rate(start: float, stay: float) -> None:
    assert false_bans(start, stay, seed=7) <= 3


def test_a_deviation_is_still_caught_under_correlated_noise() -> None:
    # Steering 2% of tokens past 0.1 (honest stretches never exceed 0.07) on top of the
    # two-token stretches: every deviating worker is banned within its 30 samples.
    assert false_bans(0.002, 0.5, seed=8, steer=0.02) == WORKERS


def test_long_near_tie_stretches_stay_within_the_false_ban_rate() -> None:
    # Stretches of ~33 tokens (stay 0.97), one sample in 20 holding one: a stretch puts ~16
    # margins above 0.01 in a row, which per-sample tests see as one sample's event.
    assert false_bans(0.0002, 0.97, seed=9) <= 3


def test_a_deviation_is_still_caught_under_long_stretches() -> None:
    # The same 2% steering on top of the long stretches: a per-sample event ("1+ margin above
    # 0.1") in nearly every sample against an honest bound of one calibration sample in five.
    assert false_bans(0.0002, 0.97, seed=10, steer=0.02) == WORKERS


def test_a_deviation_inside_a_long_stretch_process_is_caught_when_sparse() -> None:
    # Steering one token in 100 (2-3 per sample) past 0.1: still one event per sample.
    assert false_bans(0.0002, 0.97, seed=11, steer=0.01) == WORKERS


def test_per_token_tests_ban_honest_workers_under_long_stretches() -> None:
    # Why the unit is the sample: the per-token tests, calibrated on the same stretches, treat a
    # stretch's ~16 exceedances as 16 independent ones and ban far beyond alpha.
    assert false_bans(0.0002, 0.97, seed=9, unit="token") > 10
