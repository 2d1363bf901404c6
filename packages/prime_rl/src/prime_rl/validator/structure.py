"""Cheap structural checks, run on a whole batch before the validator spends a prefill on it.

A prefill costs seconds per batch on a real model; these cost microseconds and need no model. A
batch that fails any of them is rejected whole before any prefill (``checks.validate_batch``), so
a worker cannot make the validator burn compute with content it could have checked itself.

* :func:`lease_coverage`: the batch answers every task of its lease with exactly ``group_size``
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

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import toploc
from prime_rl.inference.backend import PROOF_CHUNK
from toploc.wire import decode_proofs

__all__ = ["Coverage", "lease_coverage", "proof_problem", "termination_problem"]


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
