"""Evidence per worker: accumulate statistics over all of a worker's tokens, ban at bounded risk.

A per-sample check needs a tolerance wide enough for the honest numeric drift between a worker's
decode and the validator's prefill, and whatever fits inside it is invisible per sample: choosing
the runner-up token wherever it lies within the sampling tolerance (steering), bf16 or 4-bit
weights in an fp32 run, weights one optimizer step stale. Each leaves small traces in *many*
tokens. This module turns those traces (:class:`toploc.noise.Observations`, compared with a
measured :class:`toploc.noise.NoiseProfile`) into a ban decision with a bounded false-ban rate.

The test. Every (statistic, threshold, alternative) triple is one Bernoulli likelihood-ratio
test of "honest: P(x > threshold | past) <= p0" (p0 from the profile) against "P = p1 = c·p0"
(c in ``EvidencePolicy.alternatives``). Each observation adds ``log(p1/p0)`` to the test's
score if it exceeds the threshold and ``log((1-p1)/(1-p0)) < 0`` otherwise. Scores restart at 0
at a sample boundary whenever they are negative (CUSUM), and a worker is banned once any
score reaches ``log(K · H / alpha)`` (K tests, H = ``horizon_samples``, alpha =
``false_ban_rate``).

Why this test, and not a fixed-window one-sided test with alpha spending:

* **Bounded false bans at any time.** Under the honest hypothesis, a test's likelihood ratio
  started at a sample boundary is a non-negative supermartingale with mean <= 1 (each factor
  has conditional mean ``1 + (q - p0)(p1/p0 - (1-p1)/(1-p0)) <= 1`` for a true rate q <= p0).
  Ville's inequality bounds the chance that it *ever* reaches 1/a by a, however long the run
  and however often we look, so nothing has to be spent per look. The CUSUM score is the
  maximum over at most H start points of such products; a union bound over starts and tests
  gives P(an honest worker is ever banned within H samples) <= alpha.
* **No credit for past honesty.** A plain product (Wald's SPRT) drifts down while a worker is
  honest, so a worker could bank honest tokens and then cheat for free; the CUSUM restart
  forgets that credit and costs only ``log H`` nats of threshold.
* **Unknown deviation, several bets.** The alternatives 3 to 300 times the honest rate (a
  factor ~3 apart) suit weak but frequent deviations (bf16 weights, steering on many positions)
  and rare but large ones (steering on 1% of positions, far outside the honest tail). Every
  true rate q lies within a factor sqrt(3) of a bet, which then grows the score by at most
  ``0.18·q`` nats per observation less than the best bet, ``q·log(q/p0) - (q - p0)`` (small
  rates); each extra bet costs only ``log K`` of threshold.
* **Only rate bounds are assumed.** Nothing about the shape of the honest distribution is
  needed beyond "each threshold is exceeded with conditional probability <= p0", which a
  held-out honest run checks (``benchmarks/detection_bench.py``) and which merging profiles
  keeps true across configurations.

Pitfall: tokens of one sample are not independent; a long near-tied stretch can make honest
exceedances cluster beyond p0 locally. The profile's safety factor absorbs this in the measured
runs (0 false bans over >= 100k honest tokens in fp32 and bf16, README); it is not a theorem.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from toploc.noise import STATISTICS, EvidenceError, NoiseProfile, Observations


@dataclass(frozen=True)
class EvidencePolicy:
    """How much evidence bans a worker.

    Attributes:
        false_ban_rate: alpha, the bound on the probability that an honest worker is *ever*
            banned within ``horizon_samples`` samples (1e-6: a million honest workers per false
            ban, if the profile's rate bounds hold).
        horizon_samples: H, the number of samples per worker the bound covers; beyond it the
            bound grows linearly (alpha · samples / H).
        alternatives: bet sizes c, each testing the alternative rate ``p1 = c · p0``.
        max_alternative_rate: cap on p1 (an alternative >= 1 would make one honest miss fatal).
        max_null_rate: thresholds whose honest rate bound p0 exceeds this carry too little
            evidence per observation to be worth a test.
    """

    false_ban_rate: float = 1e-6
    horizon_samples: int = 1_000_000
    alternatives: tuple[float, ...] = (3.0, 10.0, 30.0, 100.0, 300.0)
    max_alternative_rate: float = 0.5
    max_null_rate: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.false_ban_rate < 1:
            raise EvidenceError(f"false_ban_rate must lie in (0, 1), got {self.false_ban_rate}")
        if self.horizon_samples < 1:
            raise EvidenceError(f"horizon_samples must be >= 1, got {self.horizon_samples}")
        if not self.alternatives or min(self.alternatives) <= 1:
            raise EvidenceError(f"alternatives must be > 1, got {self.alternatives}")
        if not 0 < self.max_null_rate < self.max_alternative_rate < 1:
            raise EvidenceError("need 0 < max_null_rate < max_alternative_rate < 1")


@dataclass(frozen=True)
class EvidenceTests:
    """The compiled tests of a (profile, policy) pair: K parallel Bernoulli CUSUMs.

    Attributes (arrays of length K):
        statistics: the statistic each test watches.
        thresholds: its threshold.
        null_rates: p0, the profile's bound on the honest exceedance rate.
        alternative_rates: p1 > p0.
        log_threshold: ``log(K · H / alpha)``, the score at which a worker is banned (nats).
    """

    statistics: tuple[str, ...]
    thresholds: np.ndarray
    null_rates: np.ndarray
    alternative_rates: np.ndarray
    log_threshold: float

    @classmethod
    def from_profile(cls, profile: NoiseProfile, policy: EvidencePolicy | None = None) -> EvidenceTests:
        policy = policy or EvidencePolicy()
        statistics: list[str] = []
        thresholds, nulls, alternatives = [], [], []
        for name in STATISTICS:
            noise = profile.statistic(name)
            for threshold, p0 in zip(noise.thresholds, noise.rate_bounds, strict=True):
                if p0 > policy.max_null_rate:
                    continue
                bets = sorted({min(policy.max_alternative_rate, c * p0) for c in policy.alternatives})
                for p1 in bets:
                    statistics.append(name)
                    thresholds.append(threshold)
                    nulls.append(p0)
                    alternatives.append(p1)
        if not statistics:
            raise EvidenceError("the profile leaves no usable test (every rate bound > max_null_rate)")
        count = len(statistics)
        return cls(
            statistics=tuple(statistics),
            thresholds=np.array(thresholds, dtype=np.float64),
            null_rates=np.array(nulls, dtype=np.float64),
            alternative_rates=np.array(alternatives, dtype=np.float64),
            log_threshold=math.log(count * policy.horizon_samples / policy.false_ban_rate),
        )

    def __len__(self) -> int:
        return len(self.statistics)

    def describe(self, index: int) -> str:
        return (
            f"{self.statistics[index]} > {self.thresholds[index]:g} "
            f"(honest <= {self.null_rates[index]:.2g}, bet {self.alternative_rates[index]:.2g})"
        )

    @functools.cached_property
    def _compiled(self) -> tuple[np.ndarray, np.ndarray, list[tuple[str, np.ndarray]]]:
        """Per test ``log(p1/p0)`` and ``log((1-p1)/(1-p0))``; test indices per statistic."""
        exceed_log = np.log(self.alternative_rates / self.null_rates)
        stay_log = np.log1p(-self.alternative_rates) - np.log1p(-self.null_rates)
        names = np.array(self.statistics)
        groups = [(name, np.flatnonzero(names == name)) for name in STATISTICS if (names == name).any()]
        return exceed_log, stay_log, groups

    def log_evidence(self, observations: Observations) -> np.ndarray:
        """``[K]`` log-likelihood ratio of one sample's observations under each test (nats).

        ``exceed · log(p1/p0) + (n - exceed) · log((1-p1)/(1-p0))`` with ``n`` the statistic's
        observations in the sample and ``exceed`` those above the test's threshold.
        """
        exceed_log, stay_log, groups = self._compiled
        total = np.zeros(len(self))
        for name, index in groups:
            values = observations.values(name)
            exceed = (values[:, None] > self.thresholds[index][None, :]).sum(axis=0)
            total[index] = exceed * exceed_log[index] + (values.size - exceed) * stay_log[index]
        return total


@dataclass(frozen=True)
class EvidenceState:
    """A worker's evidence after its latest sample.

    Attributes:
        score: the largest CUSUM score over the tests (nats; >= the log of the strongest
            likelihood ratio against honest behaviour since the last restart).
        log_threshold: the score that bans.
        banned: ``score >= log_threshold`` now or at any earlier sample.
        strongest: the test holding ``score``, described.
        samples, tokens: what the worker submitted so far.
    """

    score: float
    log_threshold: float
    banned: bool
    strongest: str
    samples: int
    tokens: int

    @property
    def fraction(self) -> float:
        """``score / log_threshold``: 1.0 bans."""
        return self.score / self.log_threshold


class WorkerEvidence:
    """The running CUSUM scores of one worker; feed it every judged sample in order.

    >>> evidence = WorkerEvidence(EvidenceTests.from_profile(profile))   # doctest: +SKIP
    >>> state = evidence.update(observations)                          # doctest: +SKIP
    >>> state.banned                                                   # doctest: +SKIP
    """

    def __init__(self, tests: EvidenceTests) -> None:
        self.tests = tests
        self.scores = np.zeros(len(tests))
        self.samples = 0
        self.tokens = 0
        self.banned = False

    def update(self, observations: Observations) -> EvidenceState:
        """Add one sample: scores restart at 0 if negative, then add the sample's log-evidence."""
        self.scores = np.maximum(self.scores, 0.0) + self.tests.log_evidence(observations)
        self.samples += 1
        self.tokens += observations.num_tokens
        return self.state()

    def state(self) -> EvidenceState:
        best = int(np.argmax(self.scores)) if len(self.scores) else 0
        score = float(self.scores[best]) if len(self.scores) else 0.0
        self.banned = self.banned or score >= self.tests.log_threshold
        return EvidenceState(
            score=score,
            log_threshold=self.tests.log_threshold,
            banned=self.banned,
            strongest=self.tests.describe(best),
            samples=self.samples,
            tokens=self.tokens,
        )
