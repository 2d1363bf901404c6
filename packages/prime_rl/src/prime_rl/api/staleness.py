"""How stale the samples of one trainer step are, per token and per rollout (issue 38; docs/inflight.md section 6).

A claim for step ``s`` hands the trainer whole groups of accepted samples. Each completion token was
sampled by one policy version: the version of its span (``TrainSample.spans``, an in-flight sample)
or, without spans, the sample's ``policy_version`` (the lease's version sampled every token). Then

* **token staleness** of a token = ``s - version that sampled it``, counted over the model's tokens
  (environment tokens of an episode were not sampled, so they do not count): the histogram is
  token-weighted, ``{versions behind: tokens}``;
* **rollout staleness** of a sample = ``s - its oldest span's version`` (= ``s - policy_version``),
  the quantity ``orchestrator.max_off_policy_steps`` bounds, queue time included because ``s`` is the
  claim step: ``{versions behind: samples}``;
* **spans per sample**: ``{number of versions: samples}`` (1 for every sample without spans).

A token's staleness is never above its rollout's: spans only move to newer versions.

Pure functions of the claimed samples; the orchestrator logs them with each ``claim`` event, the
trainer with each ``batch`` event, and ``launch/report.py`` sums them over a run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prime_rl.api.protocol import TrainSample

__all__ = ["ClaimStaleness", "claim_staleness", "histogram", "histogram_mean", "histogram_quantile", "merge_histograms"]


@dataclass(frozen=True)
class ClaimStaleness:
    """The staleness of one claim's samples (histograms keyed by whole versions, sorted)."""

    step: int
    token_staleness: dict[int, int]
    """Versions behind -> model tokens sampled that many versions before ``step``."""
    rollout_staleness: dict[int, int]
    """Versions behind the oldest span -> samples."""
    spans_per_sample: dict[int, int]
    """Versions per sample -> samples."""

    def metrics(self) -> dict[str, Any]:
        """The fields a metrics event carries (JSON keys are strings; ``histogram`` reads them back)."""
        tokens = self.token_staleness
        return {
            "token_staleness": {str(k): v for k, v in tokens.items()},
            "token_staleness_mean": histogram_mean(tokens),
            "token_staleness_p50": histogram_quantile(tokens, 0.5),
            "token_staleness_max": max(tokens, default=0),
            "rollout_staleness": {str(k): v for k, v in self.rollout_staleness.items()},
            "rollout_staleness_max": max(self.rollout_staleness, default=0),
            "spans_per_sample": {str(k): v for k, v in self.spans_per_sample.items()},
        }


def _model_token_mask(sample: TrainSample) -> list[bool]:
    """True at each completion position the policy sampled (False at an episode's env tokens)."""
    if not sample.segments:
        return [True] * len(sample.completion_tokens)
    mask: list[bool] = []
    for segment in sample.segments:
        mask.extend([segment.kind == "model"] * segment.length)
    return mask


def claim_staleness(samples: Sequence[TrainSample], step: int) -> ClaimStaleness:
    """Token and rollout staleness of the ``samples`` claimed for ``step`` (see module docstring).

    Pitfall: a sample's span ``k`` covers completion tokens ``[first_token_k, first_token_{k+1})``;
    the last span runs to the end of the completion.
    """
    tokens: Counter[int] = Counter()
    rollouts: Counter[int] = Counter()
    spans_count: Counter[int] = Counter()
    for sample in samples:
        mask = _model_token_mask(sample)
        spans = [(s.policy_version, s.first_token) for s in sample.spans] if sample.spans else [(sample.policy_version, 0)]
        ends = [first for _, first in spans[1:]] + [len(mask)]
        for (version, first), end in zip(spans, ends, strict=True):
            tokens[step - version] += sum(mask[first:end])
        rollouts[step - spans[0][0]] += 1
        spans_count[len(spans)] += 1
    return ClaimStaleness(
        step=step,
        token_staleness={k: v for k, v in sorted(tokens.items()) if v},
        rollout_staleness=dict(sorted(rollouts.items())),
        spans_per_sample=dict(sorted(spans_count.items())),
    )


def histogram(raw: Any) -> dict[int, int]:
    """A histogram read back from a metrics line (``{"2": 120}``); entries that are not whole
    non-negative counts are skipped (metrics lines are untrusted)."""
    out: dict[int, int] = {}
    if not isinstance(raw, Mapping):
        return out
    for key, value in raw.items():
        try:
            bucket = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[bucket] = out.get(bucket, 0) + value
    return dict(sorted(out.items()))


def merge_histograms(histograms: Sequence[Mapping[int, int]]) -> dict[int, int]:
    """The sum of ``histograms``, sorted by bucket."""
    total: Counter[int] = Counter()
    for h in histograms:
        total.update(h)
    return dict(sorted(total.items()))


def histogram_mean(counts: Mapping[int, int]) -> float:
    """Weighted mean of the buckets (0.0 for an empty histogram)."""
    weight = sum(counts.values())
    return sum(k * v for k, v in counts.items()) / weight if weight else 0.0


def histogram_quantile(counts: Mapping[int, int], q: float) -> int:
    """The smallest bucket whose cumulative weight reaches ``q`` of the total (nearest rank; 0 if empty)."""
    weight = sum(counts.values())
    if not weight:
        return 0
    running = 0
    for bucket in sorted(counts):
        running += counts[bucket]
        if running >= q * weight:
            return bucket
    return max(counts)
