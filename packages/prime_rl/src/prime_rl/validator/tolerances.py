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
* **bf16 / fp16**: a token may fall short of the sampler's choice by up to ``sampling_tolerance``
  (0.25 by default) as often as honest noise does, and by no more than ``hard_limit``. The rule
  (:class:`SamplingRule`): reject iff some margin exceeds ``hard_limit`` or more than
  ``allowed(n)`` of the n tokens exceed the tolerance, where ``allowed(n)`` is the smallest k with
  ``P(Binomial(n, p0) > k) <= false_reject_rate`` and p0 the profile's bound on the honest rate of
  ``margin > tolerance``. An honest sample is then rejected with probability <= 1e-6 at any
  length (if p0 bounds the honest rate), and what hides inside the rule is left to the per-worker
  evidence (``toploc.evidence``), which sees every token of every sample.

Without a profile (evidence off) nothing is widened in bf16: the configured worst-margin rule
stands, since whatever a wider rule lets through would then be seen by nothing else.

Pitfall: the bf16 bound is only as good as the profile it comes from (device, engine, kernels):
measure it where workers run (``prime-rl calibrate-noise``).
"""

from __future__ import annotations

import dataclasses

import toploc
from prime_rl.validator.checks import Checks, SamplingRule, binomial_allowance

__all__ = [
    "FP32_SAMPLING_TOLERANCE",
    "SamplingRule",
    "binomial_allowance",
    "for_precision",
]

FP32_SAMPLING_TOLERANCE = 1e-3
"""fp32 margin floor (logits): honest fp32 margins are exactly 0; a swap falls this close only on a near tie."""


def _rate_at(profile: toploc.NoiseProfile, threshold: float) -> float | None:
    """The profile's bound on P(margin > threshold): the bound of the largest grid threshold <= it."""
    noise = profile.statistic("sampling_margin")
    below = [p for t, p in zip(noise.thresholds, noise.rate_bounds, strict=True) if t <= threshold]
    return below[-1] if below else None


def for_precision(checks: Checks, dtype: str, profile: toploc.NoiseProfile | None) -> Checks:
    """``checks`` with the per-sample sampling and log-prob rules of ``dtype`` (module docstring).

    ``profile`` is the run's honest noise when the per-worker evidence is on (None: off). The
    configured ``sampling_tolerance`` is the bf16 one; fp32 ignores it (it is exact). The log-prob
    rule bounds a sample's *mean* gap, which does not grow with length; with evidence it is widened
    to 3x the largest honest per-token gap of the profile, as before.
    """
    if dtype in ("float32", "float64"):
        honest = profile.statistic("sampling_margin").maximum if profile is not None else 0.0
        tolerance = max(FP32_SAMPLING_TOLERANCE, 3 * honest)
        rule = SamplingRule(tolerance=tolerance, rate=0.0, hard_limit=tolerance)
    elif profile is None:
        tolerance = checks.validator.sampling_tolerance
        rule = SamplingRule(tolerance=tolerance, rate=0.0, hard_limit=tolerance)  # as configured
    else:
        tolerance = checks.validator.sampling_tolerance
        measured = _rate_at(profile, tolerance)
        rate = min(measured if measured is not None else 1.0, 0.5)  # no grid point below: no bound
        hard = profile.per_sample_limit("sampling_margin")
        rule = SamplingRule(tolerance=tolerance, rate=rate, hard_limit=max(tolerance, hard))
    configured = checks.validator.logprob_atol
    atol = configured if profile is None else max(configured, profile.per_sample_limit("logprob_gap"))
    widened = checks.widened(sampling_tolerance=rule.tolerance, logprob_atol=atol)
    return dataclasses.replace(widened, sampling_rule=rule)
