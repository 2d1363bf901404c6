"""Per-sample tolerances per precision: exact in fp32, statistical in bf16.

A rejected sample rejects its whole lease, so a per-sample rule must never reject honest work, and
it must scale with the sample: the worst margin of more tokens is larger, so a fixed worst-margin
tolerance that holds for 512 honest tokens fails at 2,048 (bf16 on an H200, an outside run reported
in issue #23 whose output is not in this repository: worst margin per sample p50 0.141 / max 0.264
at 512 tokens, p50 0.220 at 2,048, against 0.25: 2 of 128 and 4-6 of 32 honest samples rejected;
our own H200 run with a random-weight model, ``benchmarks/results/gpu_check.md``, saw max 0.045 at
512 tokens and accepted all 1,024 samples).

* **fp32** (``float32``, ``float64``): honest decode and prefill agree exactly, the sampler's
  choice is reproduced and every honest margin is 0.0 (32,768 calibration tokens, HF and vLLM on
  CPU: honest max 0; ``benchmarks/results/detection_fp32.md``). The tolerance is
  ``max(FP32_SAMPLING_TOLERANCE, 3 · largest honest margin of the profile)`` with no token allowed
  beyond it: any runner-up swap is rejected per sample.
* **bf16 / fp16**: a token may fall short of the sampler's choice by more than
  ``sampling_tolerance`` (0.25 by default) only as often as honest noise does, at every threshold
  of the profile's grid up to the hard limit (:class:`TokenRule`, ``token_rule.py``: one count per
  threshold, so a lower tolerance never allows more tokens beyond any margin). The hard limit is
  ``min(HARD_LIMIT_CAP, max(tolerance, HARD_LIMIT_FACTOR · q))`` with q the profile's 99.99th
  percentile (``StatisticNoise.quantile(1e-4)``), not a multiple of the largest honest margin,
  which one outlier sets. An honest sample is rejected with probability <= 1e-6 at any length
  (if the profile's rates bound the honest ones); what hides inside the rule, every token
  beyond the tolerance included, feeds the per-worker whole-history evidence
  (``toploc.evidence``), so a worker that spends its allowance on every sample is banned at the
  rate it steers. A worker that spends it on one sample in ten or thirty, spread over fresh
  identities, lifts no identity's evidence to a ban or the release bound; so an accepted sample
  with any token beyond the tolerance is never trained on (``Verdict.beyond_tolerance``, the
  orchestrator's ``ReleaseBook``): the allowance keeps an honest lease from being rejected, it
  buys a steering worker nothing in training (``benchmarks/results/steering_bf16_tiny.md``).
* **log-probs, per token**: the same rule on ``|claimed - recomputed|`` (``logprob_atol`` as the
  tolerance, the profile's ``logprob_gap`` grid); without a profile every token within
  ``logprob_atol``.

Without a profile (evidence off) nothing is widened in bf16: the configured worst-margin rule
stands, since whatever a wider rule lets through would then be seen by nothing else.

Pitfall: the bf16 bound is only as good as the profile it comes from (device, engine, kernels):
measure it where workers run (``prime-rl calibrate-noise``).
"""

from __future__ import annotations

import dataclasses

import toploc
from prime_rl.validator.checks import Checks
from prime_rl.validator.token_rule import TokenRule, binomial_allowance

__all__ = [
    "FP32_SAMPLING_TOLERANCE",
    "HARD_LIMIT_CAP",
    "HARD_LIMIT_FACTOR",
    "HARD_LIMIT_QUANTILE",
    "TokenRule",
    "binomial_allowance",
    "for_precision",
    "token_rule",
]

FP32_SAMPLING_TOLERANCE = 1e-3
"""fp32 margin floor (logits): honest fp32 margins are exactly 0; a swap falls this close only on a near tie."""

FALSE_REJECT_RATE = 1e-6
"""Bound on P(an honest sample is rejected by one statistic's rule), split over its grid's thresholds."""

HARD_LIMIT_QUANTILE = 1e-4
"""The honest exceedance rate whose threshold (the 99.99th percentile) scales the hard limit."""

HARD_LIMIT_FACTOR = 3.0
"""Hard limit = this x the 99.99th percentile: room for the honest tail beyond it, which the counts
per threshold bound (the H200 profile: percentile 0.03, largest honest margin 0.041 in 2,112 samples)."""

HARD_LIMIT_CAP = {"sampling_margin": 1.0, "logprob_gap": 1.0}
"""No token beyond this, whatever the profile (logits; nats): the top of toploc's grids, beyond
which a profile measures no rate that could justify an allowance."""


def _rate_at(noise: toploc.StatisticNoise, threshold: float) -> float:
    """The profile's bound on P(x > threshold) (``StatisticNoise.bound_at``: the bound of the
    largest grid threshold <= it, 1 if none), capped at 0.5 (a binomial allowance needs a rate
    below 1). The default tolerance 0.25 is on the grid, so its own honest rate is measured."""
    return min(noise.bound_at(threshold), 0.5)


def token_rule(noise: toploc.StatisticNoise, tolerance: float, *, statistic: str) -> TokenRule:
    """The bf16 rule on one statistic from its honest noise (module docstring).

    Checked thresholds: ``tolerance`` (rate: :func:`_rate_at`), then every grid threshold strictly
    between it and the hard limit with its own bound. The false-reject budget is split evenly over
    the grid's thresholds plus one (a fixed split, so the allowance at a threshold does not depend
    on how many others the tolerance brings in: what keeps ``allowed`` monotone in the tolerance).
    """
    quantile = noise.quantile(HARD_LIMIT_QUANTILE)
    hard = min(HARD_LIMIT_CAP[noise.name], max(tolerance, HARD_LIMIT_FACTOR * quantile))
    hard = max(hard, tolerance)  # a tolerance above the cap is its own limit
    bands = tuple(
        (t, min(p, 0.5)) for t, p in zip(noise.thresholds, noise.rate_bounds, strict=True) if tolerance < t < hard
    )
    rate = _rate_at(noise, tolerance)
    bands = tuple((t, min(p, rate)) for t, p in bands)
    return TokenRule(
        tolerance=tolerance,
        rate=rate,
        hard_limit=hard,
        bands=bands,
        false_reject_rate=FALSE_REJECT_RATE / (len(noise.thresholds) + 1),
        statistic=statistic,
    )


def for_precision(checks: Checks, dtype: str, profile: toploc.NoiseProfile | None) -> Checks:
    """``checks`` with the per-sample sampling and log-prob rules of ``dtype`` (module docstring).

    ``profile`` is the run's honest noise when the per-worker evidence is on (None: off). The
    configured ``sampling_tolerance`` is the bf16 one; fp32 ignores it (it is exact). The log-prob
    rule is per token: ``logprob_atol`` for every token without a profile, counts per threshold
    of the profile's ``logprob_gap`` grid with one.
    """
    logprob_rule = None
    if dtype in ("float32", "float64"):
        honest = profile.statistic("sampling_margin").maximum if profile is not None else 0.0
        tolerance = max(FP32_SAMPLING_TOLERANCE, 3 * honest)
        rule = TokenRule(tolerance=tolerance, rate=0.0, hard_limit=tolerance)
    elif profile is None:
        tolerance = checks.validator.sampling_tolerance
        rule = TokenRule(tolerance=tolerance, rate=0.0, hard_limit=tolerance)  # as configured
    else:
        rule = token_rule(profile.statistic("sampling_margin"), checks.validator.sampling_tolerance, statistic="margin")
        logprob_rule = token_rule(profile.statistic("logprob_gap"), checks.validator.logprob_atol, statistic="|log-prob error|")
    widened = checks.widened(sampling_tolerance=rule.tolerance)
    return dataclasses.replace(widened, sampling_rule=rule, logprob_rule=logprob_rule)
