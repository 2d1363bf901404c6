"""Validator leases: each pending batch is judged by one validator at a time.

Several validators share one orchestrator (issue 45). ``POST /validator/leases`` hands a validator
pending batches *exclusively* for ``orchestrator.validator_lease_s`` seconds; the validator renews
the leases it still judges (the same request, ``renew``) and posts verdicts before they run out.
A batch whose lease ran out (the validator died, stalled or lost the network) goes back to the
pool and is handed to the next validator that asks: the deadline is read from the ledger's clock,
so nothing has to notice the failure.

Verdicts and leases (``check_verdict``): verdicts for a batch are taken from the validator that
holds its lease, or from anyone while no one holds it (its lease ran out and no other validator
took it: the work is done, and a verdict is a verdict). A validator whose lease has *passed to
another* is refused (409 ``lease_lost``) unless the batch already has identical verdicts (200, the
usual idempotent retry): the new holder is judging the batch, and two judgements of one batch
must never both count.

Leases are open work and live only in memory, sized by the batches awaiting verdicts: a lease
leaves when its batch is judged or expired, and expired leases are dropped on every take. They are
not journalled: an orchestrator restart frees every validator lease, and the validators simply
take the batches again (a validator posting the verdicts of a batch it took before the restart is
accepted while no one else holds the batch). The worst a restart costs is one batch judged twice
by two validators, of which only the first verdict counts (the second is a 200 if identical, a
409 otherwise); it never counts twice.

Not thread-safe: the ledger calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prime_rl.api.errors import ApiFailure

__all__ = ["ValidatorLeases"]


@dataclass
class _Held:
    validator_id: str
    expires_at: float


class ValidatorLeases:
    """Batch id -> (validator id, deadline) of the pending batches a validator holds."""

    def __init__(self, lease_s: float, clock: Callable[[], float]) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._held: dict[str, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def holder(self, batch_id: str) -> str | None:
        """The validator holding ``batch_id`` now (None: free, or its lease ran out)."""
        held = self._held.get(batch_id)
        if held is None or held.expires_at <= self._clock():
            return None
        return held.validator_id

    def free_for(self, validator_id: str) -> Callable[[str], bool]:
        """Whether a batch may be handed to ``validator_id``: no one else holds it."""

        def free(batch_id: str) -> bool:
            holder = self.holder(batch_id)
            return holder is None or holder == validator_id

        return free

    def take(self, validator_id: str, batch_ids: Iterable[str]) -> float:
        """Lease ``batch_ids`` (free for ``validator_id``: ``free_for``) to ``validator_id``, or renew
        its own; returns the deadline."""
        expires_at = self._clock() + self.lease_s
        for batch_id in batch_ids:
            self._held[batch_id] = _Held(validator_id, expires_at)
        return expires_at

    def renew(self, validator_id: str, batch_ids: Iterable[str], waiting: Callable[[str], bool]) -> tuple[list[str], list[str]]:
        """Extend ``validator_id``'s leases of ``batch_ids``: (renewed, lost). A lease is lost when
        its batch no longer awaits verdicts (``waiting`` False: judged, expired) or another validator
        holds it now. A lease that ran out but that no one took meanwhile is renewed (taken again)."""
        renewed, lost = [], []
        expires_at = self._clock() + self.lease_s
        for batch_id in dict.fromkeys(batch_ids):
            holder = self.holder(batch_id)
            if not waiting(batch_id) or (holder is not None and holder != validator_id):
                lost.append(batch_id)
            else:
                self._held[batch_id] = _Held(validator_id, expires_at)
                renewed.append(batch_id)
        return renewed, lost

    def check_verdict(self, batch_id: str, validator_id: str) -> None:
        """ApiFailure 409 ``lease_lost`` when another validator holds ``batch_id`` (module docstring)."""
        holder = self.holder(batch_id)
        if holder is not None and holder != validator_id:
            who = f"validator {validator_id!r}" if validator_id else "a verdict without a validator_id"
            raise ApiFailure(
                409,
                "lease_lost",
                f"batch {batch_id} is leased to validator {holder!r}; {who} no longer holds it (its lease ran "
                "out and passed on): drop the batch",
            )

    def release(self, batch_id: str) -> None:
        """The batch is judged or expired: its lease ends."""
        self._held.pop(batch_id, None)

    def prune(self) -> None:
        """Drop the leases that ran out (memory follows open work)."""
        now = self._clock()
        for batch_id in [b for b, held in self._held.items() if held.expires_at <= now]:
            del self._held[batch_id]

    def held_by(self, validator_id: str) -> list[str]:
        """The batches ``validator_id`` holds now."""
        now = self._clock()
        return [b for b, held in self._held.items() if held.validator_id == validator_id and held.expires_at > now]
