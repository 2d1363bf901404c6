"""Per-worker evidence when honest exceedances are correlated within a sample.

The evidence tests are Bernoulli likelihood ratios: their false-ban bound assumes that each token
exceeds a threshold with conditional probability at most p0. Real decode-vs-prefill noise
clusters: a stretch of near-tied logits (a list of numbers, a run of code) gives several margins
above a threshold in a row. Here an honest worker's margins come from a two-state Markov chain
(inside a near-tie stretch half the tokens exceed 0.01, outside none), the profile is calibrated
on one set of such samples and held-out honest workers of the same process are judged, so the
calibration sees the correlation it is judged under (``test_evidence.py`` uses independent tokens
throughout). Short stretches keep false bans within the policy's rate; long ones break the
bound, a known limit of per-token tests, pinned by the strict xfail below.
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


def false_bans(start: float, stay: float, seed: int, steer: float = 0.0) -> int:
    """Held-out workers banned, with the profile calibrated on the same process (``steer``: the
    share of other tokens a deviating worker pushes past every threshold but the top)."""
    rng = np.random.default_rng(seed)
    profile = NoiseProfile.calibrate([honest_sample(rng, start, stay) for _ in range(CALIBRATION_SAMPLES)])
    tests = EvidenceTests.from_profile(profile, EvidencePolicy(false_ban_rate=ALPHA, horizon_samples=10**4))
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


@pytest.mark.xfail(
    strict=True,
    reason="known limit: near-tie stretches of ~30 tokens make honest exceedances cluster far beyond "
    "the per-token Bernoulli bound the evidence assumes; simulated, about half the honest workers are "
    "banned at alpha = 0.01. Needs tests over samples, not tokens (issue #34).",
)
def test_long_near_tie_stretches_stay_within_the_false_ban_rate() -> None:
    assert false_bans(0.0002, 0.97, seed=9) <= 3
