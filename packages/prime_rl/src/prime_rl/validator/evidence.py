"""Per-worker evidence in the validator: every judged sample adds to its worker's statistics.

Per-sample checks (``checks.py``) stop gross deviations; their tolerances must leave room for the
honest drift between a worker's decode and the validator's prefill, and a worker can hide inside
that room (choose the runner-up token wherever it is within the sampling tolerance, run cheaper
weights, lag one optimizer step). This module accumulates what each sample shows (per-token
sampling margins and log-prob gaps, per-chunk proof mismatches: :class:`toploc.Observations`)
per worker, and bans a worker once its evidence passes the threshold of toploc's whole-history and CUSUM
likelihood-ratio tests (:mod:`toploc.evidence`: P(an honest worker is ever banned) <= the
configured ``false_ban_rate`` over ``evidence_horizon_samples`` samples, given a noise profile
that bounds honest behaviour).

The honest noise profile comes from ``validator.noise_profile`` (a JSON file written by
``prime-rl calibrate-noise``, see ``noise.py``) or, when that is empty, is measured at start-up
on the validator's own backend.

Pitfall: evidence needs tokens. A deviating worker's samples judged before its ban were accepted
and may be trained on; ``benchmarks/detection_bench.py`` measures how many tokens each deviation
needs (README).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import toploc
from prime_rl.api.judgement import reject_banned as reject_banned  # re-exported: the rule lives in api
from prime_rl.api.protocol import BatchEvidence, EvidenceTestSpec, SampleEvidence

log = logging.getLogger(__name__)

MIN_CALIBRATION_SAMPLES = 200
"""Honest samples a profile needs for per-sample evidence (toploc's default unit). Per-sample rate
bounds fall as 1 / samples (``2·(1 - 0.001^(1/n))`` for an event never seen: 0.069 at 200, 0.2 at
64), and a gross deviation needs about ``log(threshold) / log(p1/p0)`` samples to be banned; below
this the validator uses the per-token tests, whose bound assumes tokens independent (module
``toploc.evidence``), and says so."""


def evidence_tests(profile: toploc.NoiseProfile, policy: toploc.EvidencePolicy) -> toploc.EvidenceTests:
    """The run's evidence tests: per sample (``policy.unit``) when ``profile`` measured at least
    :data:`MIN_CALIBRATION_SAMPLES` samples with per-sample bounds, else per token, with a warning
    naming what to measure (``validator.calibration_tokens``: samples x completion length)."""
    samples = min(s.samples for s in profile.statistics)
    if policy.unit == "token" or (samples >= MIN_CALIBRATION_SAMPLES and all(s.per_sample for s in profile.statistics)):
        return toploc.EvidenceTests.from_profile(profile, policy)
    log.warning(
        "per-worker evidence counts tokens, not samples: the noise profile has %d samples with per-sample "
        "bounds (< %d), so its bans assume the tokens of a sample independent; measure >= %d samples "
        "(validator.calibration_tokens >= %d x the completion length)",
        samples, MIN_CALIBRATION_SAMPLES, MIN_CALIBRATION_SAMPLES, MIN_CALIBRATION_SAMPLES,
    )  # fmt: skip
    return toploc.EvidenceTests.from_profile(profile, dataclasses.replace(policy, unit="token"))


@dataclass
class EvidenceLedger:
    """One :class:`toploc.WorkerEvidence` per worker; each batch is counted once.

    ``record`` returns the worker's :class:`toploc.EvidenceState` after the batch's samples (in
    submission order), or None when the batch was already counted (a batch judged again after a
    failed post must not count twice: repeated samples are not independent evidence).
    ``ban_reasons`` holds, per banned worker, why (set once, when its evidence first crosses).
    """

    tests: toploc.EvidenceTests
    workers: dict[str, toploc.WorkerEvidence] = field(default_factory=dict)
    counted_batches: set[str] = field(default_factory=set)
    ban_reasons: dict[str, str] = field(default_factory=dict)

    def record(
        self, worker_id: str, batch_id: str, observations: Sequence[toploc.Observations]
    ) -> toploc.EvidenceState | None:
        if batch_id in self.counted_batches:
            return None
        self.counted_batches.add(batch_id)
        evidence = self.workers.setdefault(worker_id, toploc.WorkerEvidence(self.tests))
        for sample in observations:
            state = evidence.update(sample)
            if state.banned and worker_id not in self.ban_reasons:  # the sample that crossed, not the last
                self.ban_reasons[worker_id] = ban_reason(state)
        return evidence.state()

    def fraction(self, worker_id: str) -> float:
        """The worker's current evidence as a fraction of the ban threshold (0 before its first
        sample; a non-finite score reads as far past the threshold)."""
        evidence = self.workers.get(worker_id)
        fraction = 0.0 if evidence is None else evidence.state().fraction
        return max(0.0, fraction) if math.isfinite(fraction) else 1e9


def evidence_spec(tests: toploc.EvidenceTests) -> EvidenceTestSpec:
    """``tests`` as the plain numbers the orchestrator's run ledger computes with (it never imports toploc)."""
    return EvidenceTestSpec(
        statistics=list(tests.statistics),
        thresholds=[float(x) for x in tests.thresholds],
        null_rates=[float(x) for x in tests.null_rates],
        alternative_rates=[float(x) for x in tests.alternative_rates],
        log_threshold=float(tests.log_threshold),
        history_log_threshold=float(tests.history_log_threshold),
    )


def batch_evidence(tests: toploc.EvidenceTests, observed: Sequence[toploc.Observations]) -> BatchEvidence:
    """A judged batch's evidence increments for ``POST /validator/verdicts``: per prefilled sample, per
    test, its observations and those above the threshold (``EvidenceTests.counts``), and its tokens."""
    samples = []
    for observations in observed:
        seen, exceeded = tests.counts(observations)
        samples.append(SampleEvidence(seen=[int(n) for n in seen], exceeded=[int(k) for k in exceeded], tokens=int(observations.num_tokens)))
    return BatchEvidence(tests=evidence_spec(tests), samples=samples)


def ban_reason(state: toploc.EvidenceState) -> str:
    """The ban reason sent to the orchestrator (and shown to the worker; at most 200 characters)."""
    reason = (
        f"evidence {state.score:.1f} >= {state.log_threshold:.1f} nats after {state.samples} samples "
        f"({state.tokens} tokens): {state.strongest}"
    )
    return reason[:200]


def metrics_fields(worker_id: str, state: toploc.EvidenceState) -> dict[str, object]:
    """The ``evidence`` metrics line of one worker after a batch."""
    return {
        "worker_id": worker_id,
        "score": round(state.score, 4),
        "log_threshold": round(state.log_threshold, 4),
        "fraction": round(state.fraction, 5),
        "history_score": round(state.history_score, 4),
        "recent_score": round(state.recent_score, 4),
        "strongest": state.strongest,
        "samples": state.samples,
        "tokens": state.tokens,
        "banned": state.banned,
    }


@dataclass
class FailureTracker:
    """Cumulative accepted/rejected counts per worker; decides bans."""

    ban_failure_rate: float
    ban_min_samples: int
    counts: dict[str, list[int]] = field(default_factory=dict)
    banned: set[str] = field(default_factory=set)

    def record(self, worker_id: str, *, accepted: int, rejected: int) -> str | None:
        """Add a batch's counts; returns a ban reason the first time the worker crosses the threshold."""
        entry = self.counts.setdefault(worker_id, [0, 0])
        entry[0] += accepted
        entry[1] += rejected
        total = entry[0] + entry[1]
        if worker_id in self.banned or total < self.ban_min_samples:
            return None
        if entry[1] / total >= self.ban_failure_rate:
            self.banned.add(worker_id)
            return f"{entry[1]}/{total} samples rejected (threshold {self.ban_failure_rate:.0%})"
        return None
