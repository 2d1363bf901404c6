"""Deprecated (one release): the checks of mixed-version episodes moved into ``validator/spans.py``,
which judges single-turn samples and episodes with one span plan (``api.spans.SpanPlan``: an episode's
spans start at its model turns' starts, a single-turn sample's at proof-chunk boundaries). These
names stay for one release and call the plan."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prime_rl.api.protocol import LeaseRecord, RolloutSample
from prime_rl.api.spans import SpanPlan, Turn, VersionSpan
from prime_rl.inference.contract import GenerationBackend
from prime_rl.validator.checks import Checks, Observer, Pending
from prime_rl.validator.episodes import ModelSpan
from prime_rl.validator.spans import span_model_checks

__all__ = [
    "episode_proof_reason",
    "episode_span_model_checks",
    "episode_turn_seeds",
    "point_limit",
    "switch_points",
    "turn_versions",
]


def switch_points(sample: RolloutSample) -> list[tuple[int, int]]:
    """Deprecated: ``SpanPlan.points``."""
    return SpanPlan.of(sample, 0).points() if sample.spans else []


def episode_turn_seeds(sample: RolloutSample, lease: LeaseRecord, key: bytes) -> list[int]:
    """Deprecated: ``SpanPlan.recorded_seeds`` of an episode (its seeds per model turn)."""
    return [
        seed
        for _, seed in SpanPlan.of(sample, 0, episode=True).recorded_seeds(sample.sampling_seed, key, lease)
    ]


def point_limit(sample: RolloutSample) -> int:
    """Deprecated: ``SpanPlan.limit``."""
    return SpanPlan.of(sample, 0).limit


def turn_versions(sample: RolloutSample) -> list[int] | None:
    """Deprecated: ``SpanPlan.turn_versions``."""
    versions = SpanPlan.of(sample, 0, episode=True).turn_versions
    return None if versions is None else list(versions)


def episode_span_model_checks(
    spanned: Sequence[Pending],
    backend_for: Callable[[int], GenerationBackend | None],
    checks: Checks,
    observe: Observer | None,
    lease: LeaseRecord | None = None,
) -> None:
    """Deprecated: ``validator.spans.span_model_checks`` (in a multi-turn run)."""
    span_model_checks([p for p in spanned if p.alive], backend_for, checks, observe, lease)


def episode_proof_reason(
    failed: Sequence[bool], turns: Sequence[ModelSpan], versions: Sequence[int], spans: Sequence[VersionSpan]
) -> tuple[str, str]:
    """Deprecated: ``SpanPlan.proof_reason`` of an episode (``versions`` follow from ``spans``)."""
    plan = SpanPlan(
        tuple(s.policy_version for s in spans), tuple(s.first_token for s in spans), num_tokens=0,
        turns=tuple(Turn(t.start, t.length, t.turn) for t in turns),
    )  # fmt: skip
    assert plan.turn_versions == tuple(versions), "versions must be the spans' versions per turn"
    return plan.proof_reason(failed)
