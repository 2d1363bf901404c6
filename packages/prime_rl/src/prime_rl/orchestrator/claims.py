"""Which accepted samples the trainer gets for a step: a pure function of the stored batches.

``select_claim`` walks the verdicted batches oldest first (submission order) and groups each
batch's accepted, not yet claimed samples by task (one GRPO group = one task of one batch). A
group is

  - *stale* if its batch's ``policy_version < min_policy_version`` (= step - async_level): never
    handed out, only counted;
  - *uninformative* if ``filter_zero_advantage`` and every member's validator advantage is 0
    (all-correct or all-wrong groups carry no gradient): skipped, counted;
  - otherwise *available*.

If at least ``min_samples`` samples are available, whole groups are taken in order until the
count reaches ``min_samples`` (so the claim may exceed it by less than one group). Otherwise
nothing is taken and the counts explain why (how much awaits validation).

A group is judged as a whole: the validator rejects every member of a group once one member
fails (``group_rejected``) and rejects incomplete groups (``group_incomplete``), so each claimed
group has exactly ``group_size`` members; the trainer's packing relies on that fixed stride.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prime_rl.api.protocol import SampleId, Verdict

__all__ = [
    "STALE_REASONS", "BatchView", "ClaimSelection", "StoredClaims", "available_samples", "select_claim", "stale_drops",
]  # fmt: skip

STALE_REASONS = ("past_bound", "expired", "stale_policy")
"""Why samples are never trained for being too old, one name per place they are dropped:

- ``past_bound``: accepted, unclaimed, and older than ``step - max_off_policy_steps`` at this claim
  (``ClaimSelection.stale``). Such samples are never claimed later and the bound only rises, so the
  count only grows: the last claim's is the run's total so far (of workers not banned);
- ``expired``: expired by the orchestrator before validation, too old for any step
  (``BatchBook.expire_useless``, verdict reason ``expired``; run total);
- ``stale_policy``: rejected by the validator, the lease's version already below
  ``lease step - async_level`` when generated (run total)."""


class BatchView(Protocol):
    """What selection needs to know about one stored batch (``verdicts`` None = awaiting validation)."""

    @property
    def batch_id(self) -> str: ...

    @property
    def task_ids(self) -> tuple[int, ...]: ...

    @property
    def verdicts(self) -> Sequence[Verdict] | None: ...

    @property
    def claimed(self) -> set[int]: ...

    @property
    def seq(self) -> int: ...

    @property
    def policy_version(self) -> int: ...


@dataclass(frozen=True)
class ClaimSelection:
    """The outcome: ``sample_ids`` (empty unless ready) and the counts."""

    sample_ids: tuple[SampleId, ...]
    available: int
    pending_batches: int
    pending_samples: int
    stale: int
    zero_advantage: int

    @property
    def ready(self) -> bool:
        return bool(self.sample_ids)


def select_claim(
    batches: Iterable[BatchView], *, min_policy_version: int, min_samples: int, filter_zero_advantage: bool
) -> ClaimSelection:
    """Select whole fresh informative groups, oldest first, until ``min_samples`` (see module doc)."""
    groups: list[tuple[str, list[int]]] = []  # sample ids are made for the chosen groups only
    pending_batches = pending_samples = stale = zero = available = 0
    for batch in sorted(batches, key=lambda b: b.seq):
        if batch.verdicts is None:
            pending_batches += 1
            pending_samples += len(batch.task_ids)
            continue
        for members, all_zero in _open_groups(batch, batch.verdicts):
            if batch.policy_version < min_policy_version:
                stale += len(members)
            elif filter_zero_advantage and all_zero:
                zero += len(members)
            else:
                groups.append((batch.batch_id, members))
                available += len(members)
    chosen: list[SampleId] = []
    if available >= min_samples:
        for batch_id, members in groups:
            if len(chosen) >= min_samples:
                break
            chosen.extend(SampleId(batch_id, i) for i in members)
    return ClaimSelection(tuple(chosen), available, pending_batches, pending_samples, stale, zero)


def available_samples(batches: Iterable[BatchView], *, min_policy_version: int, filter_zero_advantage: bool) -> int:
    """``select_claim(batches, ...).available`` without a selection: the samples a claim could take
    now, summed in any order and with no sample id made. Every lease with backpressure asks it of
    the open batches (``BatchBook.buffered``); sorting them first made each lease's walk several
    times slower."""
    available = 0
    for batch in batches:
        verdicts = batch.verdicts
        if verdicts is None or batch.policy_version < min_policy_version:
            continue
        for members, all_zero in _open_groups(batch, verdicts):
            if not (filter_zero_advantage and all_zero):
                available += len(members)
    return available


_GROUPS = "_claim_groups"


def _open_groups(batch: BatchView, verdicts: Sequence[Verdict]) -> list[tuple[list[int], bool]]:
    """The batch's accepted, unclaimed samples by task, each group with whether every member's
    advantage is 0. Remembered on the batch (attribute ``_claim_groups``) for as long as its
    verdicts and claimed set are the same objects (both are replaced, never changed in place): every
    lease with backpressure and every claim walks the open batches, and most have not changed since."""
    memo = getattr(batch, _GROUPS, None)
    claimed = batch.claimed
    if memo is not None and memo[0] is verdicts and memo[1] is claimed:
        return memo[2]  # type: ignore[no-any-return]
    by_task: dict[int, list[int]] = {}
    for verdict in verdicts:
        if verdict.accepted and verdict.sample_index not in claimed:
            by_task.setdefault(batch.task_ids[verdict.sample_index], []).append(verdict.sample_index)
    groups = [(members, all(verdicts[i].advantage == 0.0 for i in members)) for members in by_task.values()]
    setattr(batch, _GROUPS, (verdicts, claimed, groups))
    return groups


def stale_drops(dropped: tuple[int, int], *, past_bound: int) -> dict[str, int]:
    """Samples dropped as too old, per reason of :data:`STALE_REASONS`: ``past_bound`` as given (the
    run's total at a claim), ``expired`` and ``stale_policy`` from ``dropped`` (the running run
    totals, ``BatchBook.dropped``: never a walk over history)."""
    return {"past_bound": past_bound, "expired": dropped[0], "stale_policy": dropped[1]}


class ClaimStore(Protocol):
    def claim(self, step: int) -> ClaimRecordView | None: ...

    def claim_steps(self) -> list[int]: ...


class ClaimRecordView(Protocol):
    @property
    def sample_ids(self) -> tuple[SampleId, ...]: ...


class StoredClaims(Mapping[int, tuple[SampleId, ...]]):
    """The claims by step, read from the store (one indexed read each); only the latest stays in
    memory (the trainer's retry of its last claim), so memory does not grow with the run's steps.
    Iterating reads every claimed step (an audit)."""

    def __init__(self, store: ClaimStore) -> None:
        self._store = store
        self._latest: tuple[int, tuple[SampleId, ...]] | None = None

    def load_latest(self) -> None:
        steps = self._store.claim_steps()
        if steps:
            self[steps[-1]]

    def latest_step(self) -> int | None:
        """The newest claimed step held in memory (after ``load_latest``: the store's newest), or None."""
        return None if self._latest is None else self._latest[0]

    def add(self, step: int, sample_ids: tuple[SampleId, ...]) -> None:
        """A claim just written to the store."""
        self._latest = (step, sample_ids)

    def __getitem__(self, step: int) -> tuple[SampleId, ...]:
        if self._latest is not None and self._latest[0] == step:
            return self._latest[1]
        record = self._store.claim(step)
        if record is None:
            raise KeyError(step)
        if self._latest is None or step > self._latest[0]:
            self._latest = (step, record.sample_ids)
        return record.sample_ids

    def __contains__(self, step: object) -> bool:
        if self._latest is not None and self._latest[0] == step:
            return True
        return isinstance(step, int) and self._store.claim(step) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self._store.claim_steps())

    def __len__(self) -> int:
        return len(self._store.claim_steps())
