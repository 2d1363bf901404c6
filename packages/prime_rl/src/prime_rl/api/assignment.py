"""Task assignment and sampling seeds: keyed functions only the orchestrator and validators compute.

A worker must not be able to choose its prompts (it would pick easy ones) or its sampling
randomness (it would re-roll until a completion is right). So both are derived from values the
worker does not control, with a keyed hash whose key (the run's assignment key,
``api/secrets.py``) only the orchestrator and the validators hold:

    task_ids(key, worker_id, step, batch_index, num_tasks, prompts_per_batch)
    sampling_seed(key, worker_id, step, batch_index, task_id, group_index)
    switch_nonce(key, worker_id, step, batch_index, policy_version, chunk)   (in-flight switches)

The orchestrator hands out *leases* (worker_id, step, batch_index) and the validator recomputes
both functions from the lease to check every submitted sample. The worker id is chosen by the
orchestrator at registration, the step by the trainer, the batch index by the orchestrator's
per-worker counter. Without the key, a worker learns an identity's tasks only by taking its
lease (and an abandoned lease counts against it), so registering many identities and keeping
those with easy tasks ("grinding") is no longer possible offline. (Before the key, this was a
public function of a run seed that defaulted to 0.)

Hash: the first 8 bytes, read as a big-endian unsigned integer, of HMAC-SHA256 with the key over
the UTF-8 text ``"prime-rl/<purpose>/<worker_id>/<step>/<batch_index>/<...>"``. API.md documents
it so an external validator holding the key can reimplement it byte for byte.

Pitfall: task ids are drawn *without replacement within one batch* by rejection of repeats (so a
batch never holds the same prompt twice), but different batches may share tasks; with
``prompts_per_batch > num_tasks`` there is no valid assignment and we raise ``AssignmentError``.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from prime_rl.seeds import MAX_SEED, span_seed

__all__ = [
    "MAX_SEED",
    "MIN_KEY_BYTES",
    "AssignmentError",
    "mac64",
    "recorded_switch_nonce",
    "sampling_seed",
    "sampling_seeds",
    "span_seed",
    "switch_nonce",
    "task_ids",
]


MIN_KEY_BYTES = 16
"""Shortest key accepted: a short key could be recovered from one lease by trying candidates."""

_MAX_DRAWS_PER_TASK = 64


class AssignmentError(ValueError):
    """Raised for inputs that admit no assignment (e.g. more prompts per batch than tasks)."""


def mac64(key: bytes, *parts: object) -> int:
    """HMAC-SHA256(key, ``"prime-rl/" + "/".join(str(p) for p in parts)``), first 8 bytes, big-endian.

    Pitfall: the parts are joined with "/" so worker ids must not contain "/" (the orchestrator's
    ids never do); ints are formatted in decimal without sign padding.
    """
    text = "prime-rl/" + "/".join(str(p) for p in parts)
    return int.from_bytes(hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()[:8], "big")


def _check_common(key: bytes, worker_id: str, step: int, batch_index: int) -> None:
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise AssignmentError(f"the assignment key must be at least {MIN_KEY_BYTES} bytes")
    if not isinstance(worker_id, str) or not worker_id or "/" in worker_id:
        raise AssignmentError(f"worker_id must be a non-empty string without '/', got {worker_id!r}")
    for name, value in (("step", step), ("batch_index", batch_index)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AssignmentError(f"{name} must be a non-negative int, got {value!r}")


def task_ids(
    *,
    key: bytes,
    worker_id: str,
    step: int,
    batch_index: int,
    num_tasks: int,
    prompts_per_batch: int,
) -> tuple[int, ...]:
    """The task ids (indices into the task set) of one lease, in order.

    Draw ``k = 0, 1, 2, ...``: ``t_k = mac64(key, "task", worker_id, step, batch_index, k) mod
    num_tasks``; keep ``t_k`` unless it is already in the batch; stop after ``prompts_per_batch``
    distinct ids. (The modulo bias is < num_tasks / 2**64.)

    Returns a tuple of ``prompts_per_batch`` distinct ints in ``[0, num_tasks)``.
    Raises ``AssignmentError`` on a short key, invalid inputs or ``prompts_per_batch > num_tasks``.
    """
    _check_common(key, worker_id, step, batch_index)
    if num_tasks < 1 or prompts_per_batch < 1 or prompts_per_batch > num_tasks:
        raise AssignmentError(
            f"need 1 <= prompts_per_batch <= num_tasks, got prompts_per_batch={prompts_per_batch}, "
            f"num_tasks={num_tasks}"
        )
    chosen: list[int] = []
    seen: set[int] = set()
    # Bounded loop: the expected number of draws is tiny unless prompts_per_batch ~ num_tasks;
    # the bound is only a guard against pathological inputs.
    for draw in range(_MAX_DRAWS_PER_TASK * prompts_per_batch + num_tasks):
        task_id = mac64(key, "task", worker_id, step, batch_index, draw) % num_tasks
        if task_id not in seen:
            seen.add(task_id)
            chosen.append(task_id)
            if len(chosen) == prompts_per_batch:
                return tuple(chosen)
    raise AssignmentError(  # pragma: no cover - needs ~2**-64-probability hash collisions
        f"could not draw {prompts_per_batch} distinct tasks out of {num_tasks}"
    )


def sampling_seed(
    *, key: bytes, worker_id: str, step: int, batch_index: int, task_id: int, group_index: int
) -> int:
    """The sampler seed of completion ``group_index`` of ``task_id`` in one lease.

    ``mac64(key, "sample", worker_id, step, batch_index, task_id, group_index) & (2**63 - 1)``.
    """
    _check_common(key, worker_id, step, batch_index)
    if task_id < 0 or group_index < 0:
        raise AssignmentError(f"task_id and group_index must be >= 0, got {task_id}, {group_index}")
    return mac64(key, "sample", worker_id, step, batch_index, task_id, group_index) & MAX_SEED


def sampling_seeds(
    *, key: bytes, worker_id: str, step: int, batch_index: int, task_id: int, group_size: int
) -> tuple[int, ...]:
    """``sampling_seed`` for ``group_index = 0 .. group_size - 1`` of one task."""
    return tuple(
        sampling_seed(
            key=key,
            worker_id=worker_id,
            step=step,
            batch_index=batch_index,
            task_id=task_id,
            group_index=group_index,
        )
        for group_index in range(group_size)
    )


def switch_nonce(
    *, key: bytes, worker_id: str, step: int, batch_index: int, policy_version: int, chunk: int
) -> int:
    """The orchestrator's answer to a worker's in-flight switch announcement (``POST /leases/switch``).

    ``mac64(key, "switch", worker_id, step, batch_index, policy_version, chunk) & (2**63 - 1)``:
    keyed, so the worker learns the noise of its tokens after the switch (``span_seed(seed,
    nonce)``) only once it has fixed the switch chunk, and only for the first chunk it announced for
    that version (the orchestrator records it). The validator recomputes it from the lease's switch
    record. ``chunk`` is the switch's proof-chunk index (first token ``32 * chunk``), >= 1.
    """
    _check_common(key, worker_id, step, batch_index)
    for name, value in (("policy_version", policy_version), ("chunk", chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AssignmentError(f"{name} must be a non-negative int, got {value!r}")
    if chunk < 1:
        raise AssignmentError("chunk must be >= 1: a switch at token 0 is the lease's own version")
    return mac64(key, "switch", worker_id, step, batch_index, policy_version, chunk) & MAX_SEED



def recorded_switch_nonce(key: bytes, lease: Any, policy_version: int) -> int:
    """:func:`switch_nonce` of the switch to ``policy_version`` recorded on ``lease`` (a
    ``LeaseRecord``: ``worker_id``, ``step``, ``batch_index`` and ``switches``, duck-typed so this
    module stays free of the protocol): what the orchestrator answered and the validator recomputes.

    Raises:
        KeyError: the lease has no switch to ``policy_version``.
    """
    chunk = next((s.chunk for s in lease.switches if s.policy_version == policy_version), None)
    if chunk is None:
        raise KeyError(f"the lease has no switch record for v{policy_version}")
    return switch_nonce(
        key=key, worker_id=lease.worker_id, step=lease.step, batch_index=lease.batch_index,
        policy_version=policy_version, chunk=chunk,
    )  # fmt: skip
