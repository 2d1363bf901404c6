"""Cheap structural checks, run on a whole batch before the validator spends a prefill on it.

A prefill costs seconds per batch on a real model; these cost microseconds and need no model. A
batch that fails any of them is rejected whole before any prefill (``checks.validate_batch``), so
a worker cannot make the validator burn compute with content it could have checked itself.

* :func:`lease_problem`: the batch answers a lease the orchestrator issued for it, whose tasks this
  validator recomputes with the run's assignment key (when it cannot, the validator's key or task
  set differs from the orchestrator's: :class:`AssignmentKeyMismatch`, a configuration error that
  must stop the validator rather than reject honest work).
* :func:`lease_coverage` / :func:`coverage_problems`: the batch answers every task of its lease with exactly ``group_size``
  completions (group indices ``0 .. group_size - 1`` once each), nothing missing, nothing extra.
  Answering only some prompts of a lease ("half a lease") would let a worker keep the prompts it
  did well on; the validator accepts a lease whole or not at all.
* :func:`termination_problem`: a completion ends the way generation ends: after the first EOS, after
  the token that completes the first stop string, or at ``max_new_tokens``; nothing else (no tail
  after EOS or a stop string, no truncated completion).
* :func:`proof_problem`: the proofs are exactly ``ceil(n / 32)`` toploc proofs of ``2 + 2 * topk``
  bytes for ``n`` completion tokens, each with a modulus in ``1..65497`` and coefficients below
  65497 (the parse toploc's verifier would do after the prefill, done before it).

Every function is pure and returns what is wrong (``None`` when nothing is); ``checks.py`` turns
that into a verdict reason.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import toploc
from prime_rl.api import assignment
from prime_rl.api.protocol import PendingBatch
from prime_rl.inference.backend import PROOF_CHUNK
from toploc.wire import decode_proofs

__all__ = [
    "AssignmentKeyMismatch",
    "Coverage",
    "coverage_problems",
    "lease_coverage",
    "lease_problem",
    "proof_problem",
    "repetition_problem",
    "termination_problem",
]


class AssignmentKeyMismatch(Exception):
    """A lease the orchestrator issued does not match this validator's recomputation (or cannot be
    recomputed): the two hold different assignment keys or task sets, or this one has no key.
    Judging would reject honest work, so ``validate_batch`` raises this instead."""


def lease_problem(batch: PendingBatch, *, key: bytes, num_tasks: int, prompts_per_batch: int) -> str | None:
    """None if ``batch`` answers the lease the orchestrator issued for it, else why not (the worker's
    doing: no lease, or another batch's). Raises ``AssignmentKeyMismatch`` when the orchestrator's
    own lease record does not reproduce under ``key`` (the record is trusted; the key is wrong)."""
    lease = batch.lease
    if lease is None:
        return "no lease was issued for this batch"
    if (lease.worker_id, lease.step, lease.batch_index) != (batch.worker_id, batch.step, batch.batch_index):
        return "the lease belongs to another batch"
    try:
        expected = assignment.task_ids(
            key=key,
            worker_id=lease.source_worker_id,
            step=lease.source_step,
            batch_index=lease.source_batch_index,
            num_tasks=num_tasks,
            prompts_per_batch=prompts_per_batch,
        )
    except assignment.AssignmentError as exc:
        raise AssignmentKeyMismatch(f"cannot recompute the orchestrator's lease: {exc}") from exc
    if tuple(lease.task_ids) != expected:
        raise AssignmentKeyMismatch(
            f"lease {lease.source_worker_id}/s{lease.source_step}/b{lease.source_batch_index} has tasks "
            f"{lease.task_ids}, recomputed {list(expected)}: give the orchestrator and this validator "
            "the same orchestrator.assignment_secret and [tasks]"
        )
    return None


@dataclass(frozen=True)
class Coverage:
    """How a batch's samples cover its lease.

    ``missing_tasks``: lease tasks with no sample at all (the whole batch is incomplete);
    ``bad_groups``: task id -> its sorted group indices, for tasks of the lease whose indices are
    not exactly ``0 .. group_size - 1`` (a member missing, duplicated or extra).
    """

    missing_tasks: tuple[int, ...]
    bad_groups: dict[int, tuple[int, ...]]

    @property
    def complete(self) -> bool:
        return not self.missing_tasks and not self.bad_groups


def lease_coverage(
    samples: Sequence[tuple[int, int]], lease_task_ids: Collection[int], group_size: int
) -> Coverage:
    """Coverage of ``lease_task_ids`` by ``samples`` as ``(task_id, group_index)`` pairs.

    Samples of tasks outside the lease are not counted here (the validator rejects them as
    ``not_assigned``).
    """
    indices: dict[int, list[int]] = defaultdict(list)
    for task_id, group_index in samples:
        if task_id in lease_task_ids:
            indices[task_id].append(group_index)
    missing = tuple(sorted(set(lease_task_ids) - set(indices)))
    expected = list(range(group_size))
    bad = {task: tuple(sorted(found)) for task, found in indices.items() if sorted(found) != expected}
    return Coverage(missing, bad)


def coverage_problems(
    samples: Sequence[tuple[int, int]], lease_task_ids: Collection[int], group_size: int
) -> list[tuple[str, str] | None]:
    """Per sample (``(task_id, group_index)``): None, or ``(reason code, detail)`` with the code
    ``not_assigned`` (a task outside the lease), ``incomplete_lease`` (some lease task has no sample:
    every sample of the batch) or ``group_incomplete`` (its group's indices are not ``0..G-1``)."""
    coverage = lease_coverage(samples, lease_task_ids, group_size)
    problems: list[tuple[str, str] | None] = []
    for task_id, _ in samples:
        if task_id not in lease_task_ids:
            problems.append(("not_assigned", f"task {task_id} is not in the lease"))
        elif coverage.missing_tasks:
            problems.append(("incomplete_lease", f"no samples for lease tasks {list(coverage.missing_tasks)}"))
        elif task_id in coverage.bad_groups:
            indices = list(coverage.bad_groups[task_id][:16])
            problems.append(("group_incomplete", f"task {task_id}: group indices {indices}"))
        else:
            problems.append(None)
    return problems


def termination_problem(
    completion: Sequence[int],
    *,
    decode: Callable[[Sequence[int]], str],
    eos_token_ids: Collection[int],
    stop: Sequence[str],
    max_new_tokens: int,
) -> str | None:
    """None if ``completion`` ends as generation ends (EOS, first stop string, or length), else why not.

    Pitfall: stop strings are matched in decoded text, so a stop string spread over several
    tokens counts where its last token is; the text before the last token must not contain one.
    """
    if not completion:
        return "empty completion"
    for i, token in enumerate(completion[:-1]):
        if token in eos_token_ids:
            return f"EOS at position {i} before the end"
    if completion[-1] in eos_token_ids:
        return None
    stops = [s for s in stop if s]
    if stops:
        if any(s in decode(completion[:-1]) for s in stops):
            return "a stop string appears before the last token"
        if any(s in decode(completion) for s in stops):
            return None
    if len(completion) != max_new_tokens:
        return f"ends after {len(completion)} tokens without EOS or stop string (max_new_tokens {max_new_tokens})"
    return None


def proof_problem(proofs: bytes, num_tokens: int, topk: int) -> str | None:
    """None if ``proofs`` are well-formed toploc proofs for ``num_tokens`` completion tokens, else why not."""
    size = 2 + 2 * topk
    chunks = math.ceil(num_tokens / PROOF_CHUNK)
    if len(proofs) != chunks * size:
        return f"{len(proofs)} proof bytes for {num_tokens} tokens; expected {chunks} proofs of {size} bytes"
    try:
        decode_proofs(toploc.split_proofs(proofs, topk), topk=topk)
    except toploc.ProofFormatError as error:
        return str(error)
    return None


def repetition_problem(tokens: Sequence[int], *, limit: int) -> str | None:
    """None if no token of ``tokens`` repeats on more than ``limit`` consecutive positions (``limit``
    0: no limit), else which token, how often and from where."""
    position = 0
    for token, run in itertools.groupby(tokens):
        length = sum(1 for _ in run)
        if limit and length > limit:
            return f"token {token} repeats on {length} consecutive positions from {position} (limit {limit})"
        position += length
    return None
