"""One verdict per sample of a submitted batch: the batch's checks around the per-sample ones.

Input is a :class:`prime_rl.api.protocol.PendingBatch` (structurally valid: the orchestrator already
rejected bad JSON, types and base64). A lease is accepted whole or not at all: once any sample
fails, every other sample of the batch is rejected too (``lease_rejected``), and when a failure is
found before the prefill, the batch costs no prefill at all (``structure.py``). In order:

1. lease and version: the batch answers a lease whose task ids, recomputed with
   ``assignment.task_ids`` under the run's assignment key, are the lease's (a mismatch on a lease
   the orchestrator issued means this validator holds another key: ``AssignmentKeyMismatch``);
   the batch answers every task of its lease with all ``group_size`` completions
   (``incomplete_lease``, ``group_incomplete``); the policy version is
   ``>= step - async_level`` of the lease (``stale_policy``), not newer than the newest
   committed version (``future_policy``; default: the lease step), the version the lease fixed
   (``wrong_policy_version``: the one the worker stated before it saw the tasks, or the lease's
   step; a worker that could pick any version of the async window after seeing its tasks could
   generate each lease with the one it likes, and nothing would tell), and available
   (``unknown_policy``);
2. every sample's own checks (``checks.py``: prompt, seed, termination, proofs, sampling,
   log-probs, reward);
3. groups: all ``group_size`` completions of a task present once (``group_incomplete``); a group
   with a rejected member is rejected whole (``group_rejected``), because its advantages depend on
   every member; advantages recomputed with ``grpo.group_zscore`` from the recomputed rewards; the
   claimed ones must match the z-scores of the rewards they rest on (the recomputed ones, or a low
   claim ``rewards.py`` accepted) (``advantage_mismatch``).

Accepted verdicts carry the recomputed reward, advantage and per-token log-probs (from the
prefill); the trainer uses those only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

import grpo
from prime_rl.api.fields import MAX_DETAIL_CHARS
from prime_rl.api.judgement import NOISE_REASONS, NOT_THE_WORKERS, ban_counts
from prime_rl.api.protocol import PendingBatch, Verdict
from prime_rl.inference.backend import GenerationBackend
from prime_rl.validator.checks import (
    Checks,
    Observer,
    Pending,
    Reason,
    RetryLater,
    TaskScorer,
    backend_failure,
    model_checks,
    replay_checks,
    sample_checks,
)
from prime_rl.validator.rewards import reward_checks
from prime_rl.validator.spans import has_spans, plan_spans, span_model_checks
from prime_rl.validator.structure import AssignmentKeyMismatch, coverage_problems, lease_problem

__all__ = ["NOISE_REASONS", "NOT_THE_WORKERS", "ban_counts", "validate_batch"]

def validate_batch(
    batch: PendingBatch,
    *,
    tasks: TaskScorer,
    backend_for: Callable[[int], GenerationBackend | None],
    decode: Callable[[Sequence[int]], str],
    checks: Checks,
    newest_version: int | None = None,
    observe: Observer | None = None,
    tool_seconds_left: float = math.inf,
) -> list[Verdict]:
    """Verdicts for every sample of one batch, in submission order; never raises on hostile content.

    ``backend_for(version)`` returns a backend holding that policy version (None: unavailable);
    ``newest_version`` is the newest committed policy version (None: the lease's step). A lease
    fixes its version (``LeaseRecord.fixed_version``): any other version inside the async window,
    or a newer one committed meanwhile, is ``wrong_policy_version``.
    ``observe(sample_index, observations)`` receives the per-worker evidence statistics of every
    sample whose proofs passed (``validator.evidence``), in submission order.
    ``tool_seconds_left``: what the lease's identity and address may still spend on tool runs.
    """
    pending = [Pending(i, s) for i, s in enumerate(batch.samples)]
    try:
        _batch_checks(batch, pending, tasks, checks, newest_version)
        for p in pending:
            if p.alive:
                sample_checks(batch, p, tasks, decode, checks)
        newest = max(batch.step, newest_version) if newest_version is not None else batch.step
        plan_spans(batch, pending, checks, newest_version=newest)  # each sample's version spans, model-free
        _reject_rest(pending)  # a structural failure anywhere: the batch costs no prefill
        if any(p.alive for p in pending):
            backend = backend_for(batch.policy_version)
            if backend is None:
                for p in pending:
                    p.reject(Reason.UNKNOWN_POLICY, f"policy version {batch.policy_version} is not available")
            else:
                # One-version samples first (one batched prefill), then the mixed-version ones by
                # their span plans, each further version loaded once (validator/spans.py).
                model_checks([p for p in pending if not has_spans(p.sample)], backend, checks, observe)
                span_model_checks([p for p in pending if p.alive and has_spans(p.sample)], backend_for, checks, observe, batch.lease)
        replay_checks(pending, decode, checks, budget_s=tool_seconds_left)  # after every model turn is proven
        _reject_rest(pending)  # the lease is lost: no reward scoring (sandbox runs) either
        reward_checks(pending, tasks, decode, checks)
        advantages = _group_checks(pending, checks)
        _reject_rest(pending)
    except (RetryLater, AssignmentKeyMismatch):
        raise
    except Exception as exc:  # a validator bug must reject, not crash the process
        if (failure := backend_failure(exc)) is not None and failure.kind != "backend":
            raise failure from exc  # out of memory or a device fault while judging: judged again later
        return [_verdict(p.index, Reason.INTERNAL_ERROR, f"{exc!r:.300}") for p in pending]
    return [
        _verdict(p.index, p.reason, p.detail, p.reward, advantages.get(p.index), p.logprobs, p.beyond_tolerance)
        for p in pending
    ]


def _verdict(
    index: int,
    reason: Reason,
    detail: str,
    reward: float | None = None,
    advantage: float | None = None,
    logprobs: Sequence[float] = (),
    beyond_tolerance: int = 0,
) -> Verdict:
    """The wire verdict (reward/advantage 0 where the checks stopped before computing them; the
    recomputed log-probs and the tokens beyond the sampling tolerance only when accepted: they are
    what the trainer learns from, and what keeps it from learning)."""
    accepted = reason is Reason.ACCEPTED
    return Verdict(
        sample_index=index,
        accepted=accepted,
        reason=str(reason),
        detail=detail[:MAX_DETAIL_CHARS],
        reward=float(reward) if reward is not None else 0.0,
        advantage=float(advantage) if advantage is not None else 0.0,
        logprobs=list(logprobs) if accepted else [],
        beyond_tolerance=beyond_tolerance if accepted else 0,
    )


def _reject_rest(pending: list[Pending]) -> None:
    """A lease is accepted whole or not at all: once one sample fails, reject the others too, so a
    worker cannot drop the groups it did badly on by answering them wrongly on purpose."""
    failed = next((p for p in pending if not p.alive), None)
    if failed is not None:
        for p in pending:
            p.reject(Reason.LEASE_REJECTED, f"sample {failed.index} of the batch was rejected: {failed.reason}")


def _batch_checks(
    batch: PendingBatch, pending: list[Pending], tasks: TaskScorer, checks: Checks, newest_version: int | None
) -> None:
    reference = batch.step
    newest = max(batch.step, newest_version) if newest_version is not None else batch.step
    version = batch.policy_version
    leased = batch.lease.fixed_version if batch.lease is not None else reference
    if version < reference - checks.async_level:
        why = f"policy {version} < step {reference} - async_level {checks.async_level}"
        for p in pending:
            p.reject(Reason.STALE_POLICY, why)
    elif version > newest:
        for p in pending:
            p.reject(Reason.FUTURE_POLICY, f"policy {version} is newer than the newest version {newest}")
    elif version != leased:
        why = f"policy {version} is not the lease's version {leased} (the one the lease fixed when it was issued)"
        for p in pending:
            p.reject(Reason.WRONG_POLICY_VERSION, why)
    problem = lease_problem(
        batch, key=checks.assignment_key, num_tasks=tasks.num_tasks, prompts_per_batch=checks.prompts_per_batch
    )
    if problem is not None:
        for p in pending:
            p.reject(Reason.UNASSIGNED_TASK, problem)
        return
    assert batch.lease is not None
    samples = [(p.sample.task_id, p.sample.group_index) for p in pending]
    for p, found in zip(pending, coverage_problems(samples, batch.lease.task_ids, checks.group_size), strict=True):
        if found is not None:
            p.reject(Reason(found[0]), found[1])


def _group_checks(pending: list[Pending], checks: Checks) -> dict[int, float]:
    """Reject incomplete or contaminated groups; recomputed advantages by sample index."""
    groups: dict[int, list[Pending]] = defaultdict(list)
    for p in pending:
        groups[p.sample.task_id].append(p)
    advantages: dict[int, float] = {}
    for task_id, members in groups.items():
        indices = sorted(m.sample.group_index for m in members)
        if indices != list(range(checks.group_size)):
            for m in members:
                m.reject(Reason.GROUP_INCOMPLETE, f"task {task_id}: group indices {indices[:16]}")
            continue
        bad = next((m for m in members if not m.alive), None)
        if bad is not None:
            for m in members:
                m.reject(Reason.GROUP_REJECTED, f"sample {bad.index} of the group was rejected: {bad.reason}")
            continue
        members.sort(key=lambda m: m.sample.group_index)
        recomputed = _zscores([m.reward for m in members], checks.group_size)
        # The claims are checked against the rewards the worker's claims rest on (a low claim accepted
        # by rewards.py rule 3 stands for its own reward there); the verdicts carry the recomputed ones.
        expected = _zscores(
            [m.reward if m.claimed_reward is None else m.claimed_reward for m in members], checks.group_size
        )
        wrong = {
            m.index
            for m, a in zip(members, expected, strict=True)
            if not abs(m.sample.advantage - a) <= checks.validator.advantage_atol
        }
        for m, a, e in zip(members, recomputed, expected, strict=True):
            advantages[m.index] = a
            if wrong:
                reason = Reason.ADVANTAGE_MISMATCH if m.index in wrong else Reason.GROUP_REJECTED
                m.reject(reason, f"claimed advantage {m.sample.advantage:.6g}, recomputed {e:.6g}")
    return advantages


def _zscores(rewards: Sequence[float | None], group_size: int) -> list[float]:
    """``grpo.group_zscore`` of one group's rewards, in float64."""
    return [float(a) for a in grpo.group_zscore(torch.tensor(rewards, dtype=torch.float64), group_size).tolist()]
