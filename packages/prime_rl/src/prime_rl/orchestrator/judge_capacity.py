"""Moving estimates of what the run can still use: how fast the validators judge, how much the
trainer takes per step and how long a step takes (issue 45, item 5: lease only what can be judged).

Three numbers, each updated in O(1) by the event that moves it, never by a walk over history:

  - ``judge_samples_per_s``: samples the validators together judge per second *while work waits*
    (verdict posts, all validators together). Time with nothing awaiting verdicts does not count:
    an idle validator is not a slow one, so a quiet spell never shrinks the estimate, while a dead
    validator (work waiting, no verdicts) does, within ``window_s``. Kept as exponentially decayed
    sums over busy time: ``judged = judged * d + n`` and ``busy = busy * d + dt`` with
    ``d = exp(-dt / window_s)``, estimate ``judged / busy``.
  - ``samples_per_step`` and ``step_s``: the size of the trainer's claims and the time between two
    consecutive claims (steps ``k`` and ``k + 1``), exponentially weighted (``CLAIM_WEIGHT``). The
    interval includes the trainer's wait for data, so ``step_s`` is the pace the run actually keeps.

``budget(...)`` turns them into the two limits of the lease rule (``lease_rules.py``)::

    claims_left(v) = v + off_policy_bound - next_claim_step + 1     (claims that can take version v)
    k           = min(claims_left(step), claims_left(oldest unjudged version))
    total       = k * samples_per_step                     (open leases + unjudged + judged unclaimed)
    unjudged    = max(1, k - 1) * judge_samples_per_s * step_s     (open leases + unjudged)

Each claim takes ``samples_per_step``, oldest batches first. The validators judge the freshest version
first (``BatchBook.pending_unread``), so unjudged work of an older version is judged after everything newer:
it reaches a claim only if that claim needs all the outstanding work, which is why ``k`` is the
claims left to the *oldest unjudged* work, not to the current version (with ``k`` of the current
version, a slow validator overtook and expired a third of the honest work in
``tests/test_lease_judgeable.py``). More outstanding work than ``k`` claims take goes stale untrained.
The validators judge ``judge_samples_per_s * step_s`` samples in the time of one step; more unjudged
work than they judge before the oldest of it goes stale expires unjudged. Cold start (no claim yet): ``samples_per_step`` is the
configured ``trainer.samples_per_step``; no verdict or no step time yet: no ``unjudged`` limit. So
the first steps lease what the trainer will take and nothing waits for an estimate. The rule's floor
(one lease while the window has a claim left) is applied by ``lease_rules.py``: the pipeline never
empties, so the estimates always get new events and no state is a deadlock.

Restart: the trainer's numbers are rebuilt from the last two claims in the store (``restore``: two
indexed reads); the validators' rate starts cold and is measured again within a few verdicts.
Pitfall: ``step_s`` measured across an orchestrator restart would include the outage; ``restore``
uses the stored claim times, which are the orchestrator's clock, so only a gap between the two last
claims that spans an outage is longer than a real step (one step's estimate, then it decays).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CLAIM_WEIGHT", "CapacityEstimates", "JudgeCapacity", "LeaseBudget"]

CLAIM_WEIGHT = 0.3
"""Weight of the newest claim in ``samples_per_step`` and ``step_s`` (about the last 3 steps count)."""


@dataclass(frozen=True)
class CapacityEstimates:
    """A reading of the estimates (None: not measured yet)."""

    judge_samples_per_s: float | None
    samples_per_step: float | None
    step_s: float | None
    last_claimed_step: int | None


class ClaimView(Protocol):
    """What ``restore_claims`` reads of a stored claim (``store_schema.ClaimRecord``)."""

    @property
    def step(self) -> int: ...

    @property
    def time(self) -> float: ...

    @property
    def sample_ids(self) -> Sized: ...


@dataclass(frozen=True)
class LeaseBudget:
    """The two limits of the rule, in samples: ``total`` outstanding work, and of it ``unjudged`` (open
    leases and batches awaiting verdicts; None: no estimate of the validators' pace yet)."""

    total: int
    unjudged: int | None


class JudgeCapacity:
    """The moving estimates of the module docstring. ``window_s``: the validators' rate forgets
    busy time with this time constant. Every method is O(1)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._judged = 0.0  # decayed samples judged
        self._busy = 0.0  # decayed seconds with work waiting
        self._seen_verdict = False
        self._last_time: float | None = None
        self._waiting = False  # whether work awaited verdicts since the last observation
        self._samples_per_step: float | None = None
        self._step_s: float | None = None
        self._claim: tuple[int, float] | None = None  # (step, time) of the newest claim

    # ------------------------------------------------------------------ validators

    def observe(self, now: float, waiting: int) -> None:
        """Advance the busy clock to ``now``; ``waiting``: batches awaiting verdicts from now on."""
        if self._last_time is not None and self._waiting and now > self._last_time:
            dt = now - self._last_time
            decay = math.exp(-dt / self.window_s)
            self._judged *= decay
            self._busy = self._busy * decay + dt
        if self._last_time is None or now >= self._last_time:
            self._last_time = now
        self._waiting = waiting > 0

    def judged(self, now: float, samples: int, waiting: int) -> None:
        """A verdict post judged ``samples`` samples at ``now`` (``waiting``: batches still awaiting)."""
        self.observe(now, waiting)
        self._judged += samples
        self._seen_verdict = True

    def judge_samples_per_s(self) -> float | None:
        """Samples the validators judge per second while work waits; None before the first verdict."""
        if not self._seen_verdict or self._busy <= 0:
            return None
        return self._judged / self._busy

    # ------------------------------------------------------------------ trainer

    def claimed(self, step: int, samples: int, now: float) -> None:
        """The trainer claimed ``samples`` samples for ``step`` at ``now`` (a repeated claim of the
        same step, an answer to a retry, is not a new one)."""
        if self._claim is not None and step <= self._claim[0]:
            return
        weight = CLAIM_WEIGHT
        self._samples_per_step = (
            float(samples) if self._samples_per_step is None else (1 - weight) * self._samples_per_step + weight * samples
        )
        if self._claim is not None and step == self._claim[0] + 1 and now > self._claim[1]:
            interval = now - self._claim[1]
            self._step_s = interval if self._step_s is None else (1 - weight) * self._step_s + weight * interval
        self._claim = (step, now)

    def restore(self, latest: tuple[int, float, int] | None, before: tuple[int, float, int] | None) -> None:
        """Rebuild the trainer's numbers at start from the stored claims ``(step, time, samples)``: the
        newest and the one before it (None where there is none)."""
        if before is not None:
            self.claimed(*_claim_args(before))
        if latest is not None:
            self.claimed(*_claim_args(latest))

    def restore_claims(self, latest_step: int | None, claim_of: Callable[[int], ClaimView | None]) -> None:
        """``restore`` from the store: ``claim_of(step)`` reads one stored claim (an indexed read)."""
        if latest_step is None:
            return
        records = [claim_of(step) for step in (latest_step - 1, latest_step)]
        before, last = ((r.step, r.time, len(r.sample_ids)) if r is not None else None for r in records)
        self.restore(last, before)

    def last_claimed_step(self) -> int | None:
        return None if self._claim is None else self._claim[0]

    def estimates(self) -> CapacityEstimates:
        return CapacityEstimates(
            judge_samples_per_s=self.judge_samples_per_s(),
            samples_per_step=self._samples_per_step,
            step_s=self._step_s,
            last_claimed_step=self.last_claimed_step(),
        )

    # ------------------------------------------------------------------ the rule

    def next_claim_step(self, step: int) -> int:
        """The step of the trainer's next claim: ``step``, or ``step + 1`` once ``step`` is claimed."""
        return step + 1 if self._claim is not None and self._claim[0] >= step else step

    def claims_left(self, step: int, off_policy_bound: int, version: int | None = None) -> int:
        """Claims that can still take a sample of ``version`` (default: ``step``, the current one): those
        of steps ``next_claim_step .. version + off_policy_bound``."""
        version = step if version is None else version
        return max(0, version + off_policy_bound - self.next_claim_step(step) + 1)

    def samples_per_step(self, configured: int) -> float:
        """The trainer's claim size (``configured``, ``trainer.samples_per_step``, until measured)."""
        return self._samples_per_step if self._samples_per_step is not None else float(configured)

    def budget(
        self, step: int, off_policy_bound: int, configured_samples_per_step: int, oldest_unjudged: int | None = None
    ) -> LeaseBudget:
        """The limits on outstanding work now (module docstring; the floor is the caller's).
        ``oldest_unjudged``: the oldest policy version of the unjudged work (None: none)."""
        claims_left = self.claims_left(step, off_policy_bound)
        if oldest_unjudged is not None:
            claims_left = min(claims_left, self.claims_left(step, off_policy_bound, oldest_unjudged))
        total = int(claims_left * self.samples_per_step(configured_samples_per_step))
        rate = self.judge_samples_per_s()
        unjudged = None if rate is None or self._step_s is None else int(max(1, claims_left - 1) * rate * self._step_s)
        return LeaseBudget(total=total, unjudged=unjudged)

    def drain_s(self, excess: float, configured_samples_per_step: int) -> float | None:
        """Seconds until ``excess`` outstanding samples have left the pipeline at the pace of the
        estimates (the trainer's claims, or the validators' if slower); None before any is known."""
        rates = []
        if self._step_s:
            take = self._samples_per_step if self._samples_per_step is not None else configured_samples_per_step
            rates.append(take / self._step_s)
        if (rate := self.judge_samples_per_s()) is not None:
            rates.append(rate)
        drain = min(rates, default=0.0)
        return excess / drain if drain > 0 else None


def _claim_args(claim: tuple[int, float, int]) -> tuple[int, int, float]:
    step, time, samples = claim
    return step, samples, time
