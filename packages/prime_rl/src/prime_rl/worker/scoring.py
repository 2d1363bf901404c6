"""The worker's own reward for a sample, scored again when the machine may have spoiled it.

A reward can rest on wall-clock-limited checks (a code sandbox whose runner may fail to start, a
test or a symbolic comparison with a time limit); ``verifiers`` reports such a score as
machine-limited (``Score.machine_limit``, collected with ``verifiers.machine_limits()``). On a
loaded machine a correct program can then score 0 on the worker and 1 on the validator, and the
validator rejects the whole lease (``reward_unverifiable``: no ban, but no credit either). So the
worker scores a machine-limited sample again, at most ``rescores`` times, before it sends it: the
first clean score is the claim. A sample still limited after that is sent with its last score and
a warning; the validator then re-scores on its side (:mod:`prime_rl.validator.rewards`).

Nothing here is trusted: the validator recomputes every reward, so this only keeps honest leases
from being lost to the worker's own slow machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import verifiers

__all__ = ["WORKER_RESCORES", "SampleScore", "rescoring", "score_sample"]

log = logging.getLogger(__name__)

WORKER_RESCORES = 2
"""Extra scorings of a machine-limited sample before it is sent (the validator's per-sample bound
``RESCORES_PER_SAMPLE`` is the same)."""

Score = Callable[[int, str, int], float]
"""``score(task_id, completion_text, num_completion_tokens) -> reward`` (``RunTasks.score``)."""


@dataclass(frozen=True)
class SampleScore:
    """A sample's reward as the worker sends it.

    Attributes:
        reward: the last score (the first clean one, if any was clean).
        machine_limit: the cause of the last score's limit (``sandbox_start``, ``test_timeout``,
            ``math_timeout``, ``deadline``), None when it is clean.
        rescores: how many extra scorings were made.
    """

    reward: float
    machine_limit: str | None
    rescores: int


def score_sample(
    score: Score, task_id: int, completion: str, num_tokens: int, *, rescores: int = WORKER_RESCORES
) -> SampleScore:
    """Score one sample, again while the score is machine-limited, at most ``rescores`` extra times."""
    if rescores < 0:
        raise ValueError(f"rescores must be >= 0, got {rescores}")
    attempt = 0
    while True:
        with verifiers.machine_limits() as seen:
            reward = float(score(task_id, completion, num_tokens))
        cause = seen.causes[0] if seen.causes else None
        if cause is None or attempt >= rescores:
            break
        attempt += 1
        log.info(
            "task %d: scoring limited by the machine (%s); scoring again (%d/%d)",
            task_id,
            cause,
            attempt,
            rescores,
        )
    if cause is not None:
        log.warning(
            "task %d: scoring still limited by the machine (%s) after %d re-scores; sending reward %.6g "
            "(the validator re-scores it)",
            task_id,
            cause,
            attempt,
            reward,
        )
    return SampleScore(reward, cause, attempt)


def rescoring(score: Score, *, rescores: int = WORKER_RESCORES) -> Score:
    """``score`` with :func:`score_sample`'s re-scoring, for ``rollout.build_batch(score=...)``."""

    def scored(task_id: int, completion: str, num_tokens: int) -> float:
        return score_sample(score, task_id, completion, num_tokens, rescores=rescores).reward

    return scored
