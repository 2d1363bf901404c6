"""Evidence per worker: accumulate statistics over all of a worker's tokens, ban at bounded risk.

A per-sample check needs a tolerance wide enough for the honest numeric drift between a worker's
decode and the validator's prefill, and whatever fits inside it is invisible per sample: choosing
the runner-up token wherever it lies within the sampling tolerance (steering), bf16 or 4-bit
weights in an fp32 run, weights one optimizer step stale. Each leaves small traces in *many*
tokens. This module turns those traces (:class:`toploc.noise.Observations`, compared with a
measured :class:`toploc.noise.NoiseProfile`) into a ban decision with a bounded false-ban rate.

The unit: a sample (default). Tokens of one sample are not independent (a near-tied stretch puts
several honest margins above a threshold in a row), but samples are: each has its own prompt and
sampling seed. So every test watches a per-sample event, "at least m of the sample's values of a
statistic lie above threshold t" (``"samples with m+ sampling_margin" > t``), and its honest rate
bound p0 is measured over the calibration's *samples* (:mod:`toploc.per_sample`,
:meth:`toploc.noise.NoiseProfile.calibrate`): however a sample's tokens cluster, the sample is one
Bernoulli trial, and the calibration saw the clustering. (``EvidencePolicy(unit="token")`` keeps
the per-token tests, one trial per token at the per-token bounds, which assume tokens independent
given the past; ``tests/test_evidence_correlated.py`` shows them banning honest workers whose
samples hold long near-tied stretches.)

The tests. Every (event, alternative) pair j is one Bernoulli likelihood-ratio test of "honest:
P(event | past) <= p0" (p0 from the profile) against "P = p1 = c·p0" (c in
``EvidencePolicy.alternatives``, capped). A trial adds ``a_j = log(p1/p0)`` if the event occurs
and ``b_j = log((1-p1)/(1-p0)) < 0`` otherwise. Two scores per test, K tests:

* **history** (never reset): over the worker's whole history of n_j trials of which k_j
  exceed, ``H_j = k_j·a_j + (n_j - k_j)·b_j``. It depends on the two counts only, so it is
  journalled as counts and survives any restart. Ban when ``max_j H_j >= log(2K/alpha)``.
* **recent** (CUSUM): ``R_j`` restarts at 0 at a sample boundary whenever it is negative; ban when
  ``max_j R_j >= log(2K·H/alpha)`` (H = ``horizon_samples``).

The evidence a worker carries (``EvidenceState.fraction``, sent to the orchestrator, which holds
back a batch while it is high) is ``max(max_j H_j / log(2K/alpha), max_j R_j / log(2K·H/alpha))``.

Why these two, and what they guarantee:

* **Bounded false bans at any time.** The false-ban bound: P(an honest worker is *ever* banned
  within H samples) <= alpha, given that each per-sample event's probability, conditional on the
  worker's earlier samples, is at most its p0. That is what the calibration measures: p0 is a
  Chernoff upper confidence bound (confidence 1 - delta per cell, times a safety factor) on the
  share of honest calibration samples with the event, so the bound needs samples independent of
  each other and like the calibration's (the same model, precision, backend and completion
  lengths), and nothing about the tokens inside a sample. Why it holds: under the honest hypothesis, ``exp(H_j)`` is a
  non-negative supermartingale with mean <= 1 (each factor has conditional mean
  ``1 + (q - p0)(p1/p0 - (1-p1)/(1-p0)) <= 1`` for a true rate q <= p0; a trial is a sample, or
  a token under ``unit="token"``). Ville's inequality
  bounds the chance that it *ever* reaches 1/a by a, however long the run and however often we
  look; a union bound over the K tests gives P(history ever bans an honest worker) <= alpha/2.
  ``exp(R_j)`` is the maximum over at most H start points of such products, so the same holds
  for the recent score within H samples. In all: P(an honest worker is ever banned) <= alpha.
* **Honest trials dilute a deviation but never erase it** (trials are samples, or tokens under
  ``unit="token"``, which the numbers here use). After k deviating exceedances, honest
  trials lower ``H_j`` by ``|b_j| ≈ (c-1)·p0`` nats each, i.e. only as fast as honest noise could
  have produced the same exceedances: a hit-and-run worker's evidence falls back only once its
  exceedance count is what its token count explains (~0.1/p0 tokens for 2 exceedances), and a
  deviation that keeps the rate above p0 (steering 1 sample in 10) grows ``H_j`` for ever. The
  history needs no horizon term, so its threshold is ``log H`` lower (13.8 nats at H = 1e6) than
  the CUSUM's and the same deviation reads as a larger fraction (``R_j >= H_j`` always: the CUSUM
  only restarts from negative values, so it never holds less evidence, only against a higher bar).
  How long a deviation stays visible is set by p0: measure honest noise well (``toploc.noise``).
* **No credit for past honesty.** The history score drifts down while a worker is honest, so a
  worker could bank honest tokens and then deviate while its history score climbs back; the
  recent score has restarted meanwhile and sees the new deviation at once.
* **Unknown deviation, several bets.** The alternatives 3 to 300 times the honest rate (a
  factor ~3 apart) suit weak but frequent deviations (bf16 weights, steering on many positions)
  and rare but large ones (steering on 1% of positions, far outside the honest tail). Each extra
  bet costs only ``log K`` of threshold.
* **Only rate bounds are assumed.** Nothing about the shape of the honest distribution is
  needed beyond "each event occurs with conditional probability <= p0", which a held-out honest
  run checks (``benchmarks/detection_bench.py``) and which merging profiles keeps true across
  configurations.
* **Several counts per threshold.** A deviation that adds many values above t per sample shows in
  "m+ above t" for a large m, whose honest rate is far lower than "1+"; a cell whose bound equals
  that of a cell containing it (a lower threshold or a smaller count) is left out, since it can
  only be rarer under a deviation (:func:`toploc.per_sample.useful_cells`).

Pitfalls. The price of the sample as unit is the calibration floor: with n honest samples and no
event, p0 is ``safety · (1 - delta^(1/n))`` per *sample*, so a deviation needs about as many
samples as the per-token tests needed tokens carrying it; calibrate on many samples. A sample's
count grows with its length: completions much longer than the calibration's need a new profile.
A profile re-measured between restarts changes p0 under a history: the counts stay valid, the
guarantee is then the new profile's.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from toploc.noise import STATISTICS, EvidenceError, NoiseProfile, Observations
from toploc.per_sample import counts_above, parse_label, sample_label, useful_cells


@dataclass(frozen=True)
class EvidencePolicy:
    """How much evidence bans a worker.

    Attributes:
        false_ban_rate: alpha, the bound on the probability that an honest worker is *ever*
            banned within ``horizon_samples`` samples (1e-6: a million honest workers per false
            ban, if the profile's rate bounds hold); half of it is spent on the history score,
            half on the recent one.
        horizon_samples: H, the number of samples per worker the recent score's bound covers;
            beyond it that half grows linearly (alpha/2 · samples / H). The history score's
            bound holds for ever.
        alternatives: bet sizes c, each testing the alternative rate ``p1 = c · p0``.
        max_alternative_rate: cap on p1 (an alternative >= 1 would make one honest miss fatal).
        max_null_rate: thresholds whose honest rate bound p0 exceeds this carry too little
            evidence per observation to be worth a test.
        unit: ``"sample"`` (default): every test watches a per-sample event, "m+ values above t",
            one Bernoulli trial per sample, at the profile's per-sample bounds, so correlation
            between the tokens of a sample is in the calibration; ``"token"``: the per-token tests
            (one trial per token, at the per-token bounds), whose bound assumes tokens independent
            given the past (kept for comparison and for profiles without per-sample bounds).
        max_sample_null_rate, max_sample_alternative_rate: ``max_null_rate`` and
            ``max_alternative_rate`` of the per-sample tests (a sample's event is far more likely
            than a token's, and a calibration has far fewer samples than tokens).
    """

    false_ban_rate: float = 1e-6
    horizon_samples: int = 1_000_000
    alternatives: tuple[float, ...] = (3.0, 10.0, 30.0, 100.0, 300.0)
    max_alternative_rate: float = 0.5
    max_null_rate: float = 0.2
    unit: str = "sample"
    max_sample_null_rate: float = 0.5
    max_sample_alternative_rate: float = 0.9

    def __post_init__(self) -> None:
        if not 0 < self.false_ban_rate < 1:
            raise EvidenceError(f"false_ban_rate must lie in (0, 1), got {self.false_ban_rate}")
        if self.horizon_samples < 1:
            raise EvidenceError(f"horizon_samples must be >= 1, got {self.horizon_samples}")
        if not self.alternatives or min(self.alternatives) <= 1:
            raise EvidenceError(f"alternatives must be > 1, got {self.alternatives}")
        if not 0 < self.max_null_rate < self.max_alternative_rate < 1:
            raise EvidenceError("need 0 < max_null_rate < max_alternative_rate < 1")
        if not 0 < self.max_sample_null_rate < self.max_sample_alternative_rate < 1:
            raise EvidenceError("need 0 < max_sample_null_rate < max_sample_alternative_rate < 1")
        if self.unit not in ("sample", "token"):
            raise EvidenceError(f"unit must be 'sample' or 'token', got {self.unit!r}")


@dataclass(frozen=True)
class EvidenceTests:
    """The compiled tests of a (profile, policy) pair: K parallel Bernoulli likelihood-ratio tests.

    Attributes (arrays of length K):
        statistics: the statistic each test watches.
        thresholds: its threshold.
        null_rates: p0, the profile's bound on the honest exceedance rate.
        alternative_rates: p1 > p0.
        log_threshold: ``log(2K · H / alpha)``, the recent (CUSUM) score that bans (nats).
        history_log_threshold: ``log(2K / alpha)``, the history score that bans (nats).
    """

    statistics: tuple[str, ...]
    thresholds: np.ndarray
    null_rates: np.ndarray
    alternative_rates: np.ndarray
    log_threshold: float
    history_log_threshold: float

    @classmethod
    def from_profile(cls, profile: NoiseProfile, policy: EvidencePolicy | None = None) -> EvidenceTests:
        """The tests of ``policy.unit``: per sample (the default; the profile's per-sample bounds,
        dominated cells left out: :func:`toploc.per_sample.useful_cells`) or per token."""
        policy = policy or EvidencePolicy()
        statistics: list[str] = []
        thresholds, nulls, alternatives = [], [], []

        def add(label: str, threshold: float, p0: float, cap: float) -> None:
            for p1 in sorted({min(cap, c * p0) for c in policy.alternatives}):
                statistics.append(label)
                thresholds.append(threshold)
                nulls.append(p0)
                alternatives.append(p1)

        for name in STATISTICS:
            noise = profile.statistic(name)
            if policy.unit == "token":
                for threshold, p0 in zip(noise.thresholds, noise.rate_bounds, strict=True):
                    if p0 <= policy.max_null_rate:
                        add(name, threshold, p0, policy.max_alternative_rate)
                continue
            if not noise.per_sample:
                raise EvidenceError(
                    f"the profile has no per-sample bounds for {name} (written before toploc measured them): "
                    "calibrate it again, or use EvidencePolicy(unit='token')"
                )
            bounds = np.asarray(noise.sample_rate_bounds, dtype=np.float64)
            for i, j in useful_cells(bounds):
                if bounds[i, j] <= policy.max_sample_null_rate:
                    label = sample_label(name, noise.sample_counts[j])
                    add(label, noise.thresholds[i], float(bounds[i, j]), policy.max_sample_alternative_rate)
        if not statistics:
            raise EvidenceError("the profile leaves no usable test (every rate bound > the policy's largest null rate)")
        count = len(statistics)
        return cls(
            statistics=tuple(statistics),
            thresholds=np.array(thresholds, dtype=np.float64),
            null_rates=np.array(nulls, dtype=np.float64),
            alternative_rates=np.array(alternatives, dtype=np.float64),
            log_threshold=math.log(2 * count * policy.horizon_samples / policy.false_ban_rate),
            history_log_threshold=math.log(2 * count / policy.false_ban_rate),
        )

    def __len__(self) -> int:
        return len(self.statistics)

    def describe(self, index: int) -> str:
        return (
            f"{self.statistics[index]} > {self.thresholds[index]:g} "
            f"(honest <= {self.null_rates[index]:.2g}, bet {self.alternative_rates[index]:.2g})"
        )

    @functools.cached_property
    def _compiled(self) -> tuple[np.ndarray, np.ndarray, list[tuple[str, np.ndarray]], np.ndarray]:
        """Per test ``log(p1/p0)`` and ``log((1-p1)/(1-p0))``; test indices per observed statistic;
        per test its per-sample count m (0: a per-token test)."""
        exceed_log = np.log(self.alternative_rates / self.null_rates)
        stay_log = np.log1p(-self.alternative_rates) - np.log1p(-self.null_rates)
        parsed = [parse_label(label) for label in self.statistics]
        names = np.array([name for name, _ in parsed])
        unknown = set(names) - set(STATISTICS)
        if unknown:
            raise EvidenceError(f"unknown statistic(s) {sorted(unknown)}; expected those of {STATISTICS}")
        groups = [(name, np.flatnonzero(names == name)) for name in STATISTICS if (names == name).any()]
        return exceed_log, stay_log, groups, np.array([m for _, m in parsed], dtype=np.int64)

    @property
    def per_sample(self) -> bool:
        """Whether every test watches a per-sample event (one trial per sample)."""
        return bool((self._compiled[3] > 0).all())

    @functools.cached_property
    def fingerprint(self) -> str:
        """A short digest of the tests (statistics, thresholds, p0, p1): equal tests, equal digest."""
        digest = hashlib.sha256(repr(self.statistics).encode())
        for array in (self.thresholds, self.null_rates, self.alternative_rates):
            digest.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
        return digest.hexdigest()[:16]

    def counts(self, observations: Observations) -> tuple[np.ndarray, np.ndarray]:
        """``[K]`` int64 pair: per test, the sample's trials and those that exceeded. A per-token
        test: the sample's observations of its statistic and those above its threshold (strictly
        greater). A per-sample test: 1 trial, exceeded when at least m of them are above it."""
        _, _, groups, minimum = self._compiled
        seen = np.zeros(len(self), dtype=np.int64)
        exceeded = np.zeros(len(self), dtype=np.int64)
        for name, index in groups:
            values = observations.values(name)
            above = counts_above(values, self.thresholds[index])
            sample = minimum[index] > 0
            seen[index] = np.where(sample, 1, values.size)
            exceeded[index] = np.where(sample, above >= minimum[index], above)
        return seen, exceeded

    def log_ratio(self, seen: np.ndarray, exceeded: np.ndarray) -> np.ndarray:
        """``[K]`` log-likelihood ratio of ``exceeded`` of ``seen`` observations under each test (nats):
        ``exceeded · log(p1/p0) + (seen - exceeded) · log((1-p1)/(1-p0))``."""
        exceed_log, stay_log, _, _ = self._compiled
        return np.asarray(exceeded * exceed_log + (seen - exceeded) * stay_log, dtype=np.float64)

    def log_evidence(self, observations: Observations) -> np.ndarray:
        """``[K]`` log-likelihood ratio of one sample's observations under each test (nats)."""
        return self.log_ratio(*self.counts(observations))


@dataclass(frozen=True)
class EvidenceState:
    """A worker's evidence after its latest sample.

    Attributes:
        score, log_threshold: the binding score (history or recent, whichever is the larger
            fraction of its threshold) and that threshold (nats).
        banned: a score reached its threshold now or at any earlier sample.
        strongest: the test holding ``score``, described, with which score it is.
        samples, tokens: what the worker submitted so far.
        history_score, history_log_threshold: ``max_j H_j`` over the whole history, its threshold.
        recent_score, recent_log_threshold: ``max_j R_j`` (CUSUM), its threshold.
    """

    score: float
    log_threshold: float
    banned: bool
    strongest: str
    samples: int
    tokens: int
    history_score: float = 0.0
    history_log_threshold: float = 1.0
    recent_score: float = 0.0
    recent_log_threshold: float = 1.0

    @property
    def fraction(self) -> float:
        """``score / log_threshold``, the larger of the two scores' fractions: 1.0 bans."""
        return self.score / self.log_threshold


SNAPSHOT_FORMAT = "toploc-worker-evidence/1"
"""Format tag of :meth:`WorkerEvidence.snapshot`."""


class WorkerEvidence:
    """The running scores of one worker; feed it every judged sample in order.

    >>> evidence = WorkerEvidence(EvidenceTests.from_profile(profile))   # doctest: +SKIP
    >>> state = evidence.update(observations)                          # doctest: +SKIP
    >>> state.banned                                                   # doctest: +SKIP
    """

    def __init__(self, tests: EvidenceTests) -> None:
        self.tests = tests
        self.scores = np.zeros(len(tests))  # recent (CUSUM) scores R_j
        self.seen = np.zeros(len(tests), dtype=np.int64)  # n_j over the whole history
        self.exceeded = np.zeros(len(tests), dtype=np.int64)  # k_j over the whole history
        self.samples = 0
        self.tokens = 0
        self.banned = False

    def update(self, observations: Observations) -> EvidenceState:
        """Add one sample: recent scores restart at 0 if negative, then every score adds the
        sample's log-evidence; the history counts grow."""
        seen, exceeded = self.tests.counts(observations)
        self.scores = np.maximum(self.scores, 0.0) + self.tests.log_ratio(seen, exceeded)
        self.seen += seen
        self.exceeded += exceeded
        self.samples += 1
        self.tokens += observations.num_tokens
        return self.state()

    def history_scores(self) -> np.ndarray:
        """``[K]`` whole-history log-likelihood ratios ``H_j`` (from the counts)."""
        return self.tests.log_ratio(self.seen, self.exceeded)

    def state(self) -> EvidenceState:
        history = self.history_scores()
        best_history, best_recent = int(np.argmax(history)), int(np.argmax(self.scores))
        history_score, recent_score = float(history[best_history]), float(self.scores[best_recent])
        history_threshold, recent_threshold = self.tests.history_log_threshold, self.tests.log_threshold
        self.banned = self.banned or history_score >= history_threshold or recent_score >= recent_threshold
        if history_score / history_threshold >= recent_score / recent_threshold:
            score, threshold, strongest = history_score, history_threshold, f"history: {self.tests.describe(best_history)}"
        else:
            score, threshold, strongest = recent_score, recent_threshold, f"recent: {self.tests.describe(best_recent)}"
        return EvidenceState(
            score=score,
            log_threshold=threshold,
            banned=self.banned,
            strongest=strongest,
            samples=self.samples,
            tokens=self.tokens,
            history_score=history_score,
            history_log_threshold=history_threshold,
            recent_score=recent_score,
            recent_log_threshold=recent_threshold,
        )

    def snapshot(self) -> dict[str, Any]:
        """The worker's state as JSON-safe data (for a journal): history counts per (statistic,
        threshold), recent scores with the tests' fingerprint, samples, tokens, banned."""
        counts: dict[tuple[str, float], tuple[int, int]] = {}
        for j, (name, threshold) in enumerate(zip(self.tests.statistics, self.tests.thresholds, strict=True)):
            counts[(name, float(threshold))] = (int(self.seen[j]), int(self.exceeded[j]))
        return {
            "format": SNAPSHOT_FORMAT,
            "counts": [[name, threshold, n, k] for (name, threshold), (n, k) in counts.items()],
            "tests": self.tests.fingerprint,
            "recent": [float(x) for x in self.scores],
            "samples": self.samples,
            "tokens": self.tokens,
            "banned": self.banned,
        }

    @classmethod
    def restore(cls, tests: EvidenceTests, snapshot: Mapping[str, Any]) -> WorkerEvidence:
        """The worker's evidence from :meth:`snapshot`, under ``tests`` (possibly another profile's).

        History counts are matched by (statistic, threshold), so they survive a re-measured profile
        (a threshold the snapshot lacks starts from 0); recent scores are kept when the tests are the
        same (fingerprint) and restart at 0 otherwise. A ban is kept whatever the tests.
        """
        if not isinstance(snapshot, Mapping) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise EvidenceError(f"not a worker evidence snapshot (expected format {SNAPSHOT_FORMAT!r})")
        evidence = cls(tests)
        try:
            counts = {(str(name), float(t)): (int(n), int(k)) for name, t, n, k in snapshot["counts"]}
            recent = np.asarray(snapshot["recent"], dtype=np.float64).reshape(-1)
            if snapshot["tests"] == tests.fingerprint and recent.size == len(tests):
                evidence.scores = recent.copy()
            for j, (name, threshold) in enumerate(zip(tests.statistics, tests.thresholds, strict=True)):
                n, k = counts.get((name, float(threshold)), (0, 0))
                if not 0 <= k <= n:
                    raise EvidenceError(f"{name} > {threshold:g}: {k} exceedances of {n} observations")
                evidence.seen[j], evidence.exceeded[j] = n, k
            evidence.samples = int(snapshot["samples"])
            evidence.tokens = int(snapshot["tokens"])
            evidence.banned = bool(snapshot["banned"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, EvidenceError):
                raise
            raise EvidenceError(f"malformed worker evidence snapshot: {exc!r}") from exc
        if not np.isfinite(evidence.scores).all():
            raise EvidenceError("malformed worker evidence snapshot: non-finite recent score")
        return evidence
