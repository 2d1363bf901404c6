"""Why the trainer waits for data, in words and counts (never in silence).

The orchestrator answers a claim that is not ready with its counts (``ClaimResponse``): fresh
accepted samples, samples in all-zero-advantage groups (filtered out when
``trainer.filter_zero_advantage``), samples held for their workers' evidence
(``orchestrator.release_*``), batches awaiting validation, stale samples. :func:`explain_wait`
names the cause that keeps the step from its ``samples_per_step``, first match wins:

* ``zero_advantage``: more samples sit in zero-advantage groups than are missing (every group's
  rewards were equal, so no group has anything to teach: a constant reward, or one the model
  cannot reach yet);
* ``held``: accepted samples wait for their workers' evidence to cover them;
* ``validation``: batches wait for a validator;
* ``stale``: accepted samples are too old for this step;
* ``generation``: none of these: the workers have not submitted enough yet.

:class:`ConstantRewardWatch` warns once when the reward cannot vary: ``CONSTANT_GROUPS`` groups
accepted, every one of zero advantage, and not one informative sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["CONSTANT_GROUPS", "ConstantRewardWatch", "WaitReason", "explain_wait"]

CONSTANT_GROUPS = 8
"""Zero-advantage groups with no informative sample before the trainer warns that the reward does not vary."""


class ClaimCounts(Protocol):
    """The counts of a claim that is not ready (``prime_rl.api.protocol.ClaimResponse``)."""

    available_samples: int
    zero_advantage_samples: int
    held_samples: int
    pending_batches: int
    pending_samples: int
    stale_samples: int


@dataclass(frozen=True)
class WaitReason:
    """``cause`` (a word for metrics and summaries) and ``line`` (the sentence the trainer logs)."""

    cause: str
    line: str


_WHY = {
    "zero_advantage": "every group's rewards are equal, so the groups have zero advantage and are filtered out "
    "(trainer.filter_zero_advantage): the reward does not vary within a group",
    "held": "accepted samples are held until their workers' evidence covers them (orchestrator.release_*)",
    "validation": "batches await validation",
    "stale": "accepted samples are too old for this step (orchestrator.async_level)",
    "generation": "the workers have not submitted enough samples yet",
}


def explain_wait(claim: ClaimCounts, needed: int, *, filter_zero_advantage: bool) -> WaitReason:
    """The cause that keeps this step waiting (module docstring) and one line with every count."""
    missing = max(0, needed - claim.available_samples)
    if filter_zero_advantage and claim.zero_advantage_samples >= max(1, missing):
        cause = "zero_advantage"
    elif claim.held_samples:
        cause = "held"
    elif claim.pending_batches:
        cause = "validation"
    elif claim.stale_samples:
        cause = "stale"
    else:
        cause = "generation"
    line = (
        f"{_WHY[cause]} ({claim.available_samples}/{needed} fresh informative samples; "
        f"{claim.zero_advantage_samples} in zero-advantage groups; {claim.held_samples} held for evidence; "
        f"{claim.pending_batches} batches ({claim.pending_samples} samples) await validation; "
        f"{claim.stale_samples} stale)"
    )
    return WaitReason(cause, line)


class ConstantRewardWatch:
    """Warns once (``check`` returns the warning) when ``CONSTANT_GROUPS`` groups were accepted,
    every one of zero advantage, and none of them informative: the run cannot train."""

    def __init__(self, group_size: int, groups: int = CONSTANT_GROUPS) -> None:
        self.threshold = max(1, group_size) * groups
        self.groups = groups
        self.warned = False

    def check(self, claim: ClaimCounts, *, filter_zero_advantage: bool) -> str | None:
        if self.warned or not filter_zero_advantage or claim.available_samples:
            return None
        if claim.zero_advantage_samples < self.threshold:
            return None
        self.warned = True
        return (
            f"the reward has not varied within any of the {claim.zero_advantage_samples} accepted samples "
            f"(at least {self.groups} groups, every one of zero advantage, none informative): nothing can be "
            "trained on. Check the environment's reward: a constant, or one this model cannot reach yet"
        )
