"""Fresh identities (no accepted work yet): how many a network may hold, when they retire, and
whose turn it is for a lease at a crowded address.

Identities cost nothing to make, so three rules keep them from filling the worker table or
starving a newcomer:

  - **Per network** (``max_fresh_workers_per_network``, 429 ``rate_limited``): at most that many
    live fresh identities registered from one network (``rate_limit.network_key``: IPv4 /24,
    IPv6 /64). ``max_workers`` fresh identities therefore need ``max_workers / cap`` networks
    (625 with the defaults), not a few hundred addresses.
  - **Retirement** (``fresh_worker_ttl_s``): a fresh identity ``ttl`` seconds past its
    registration that holds no lease and has no batch awaiting verdicts is retired, however often
    it asks (issue 46, finding 8: a place in a first-come queue once counted as busy, so identities
    that kept asking never retired and held the table full for good) (store event ``retire``): it no longer counts against ``max_workers`` or its
    network, and the API answers 404 for it (a worker then registers anew). Identities with
    accepted work never retire.
  - **Turns** (``LeaseQueue``): when the fresh identities at one client address may hold no
    more leases (``LeaseRules``' per-address cap), the ones refused queue first come, first
    served: a freed slot goes to the head of the queue, and an identity that got its lease
    joins the back when it asks again. A newcomer waits for at most the identities queued ahead
    of it (at most the fresh identities leasing there) to take one lease each, however many
    leases they take or abandon: ``ceil((ahead + 1) / cap) * task_timeout_s`` at worst, where
    ``cap`` is the address's cap on fresh identities' leases. An entry not
    renewed for ``stale_s`` (its identity stopped asking) is dropped.

Not thread-safe (the ledger's lock). Times are the ledger clock's seconds.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable

from prime_rl.api.errors import ApiFailure
from prime_rl.orchestrator.workers import WorkerRecord, WorkerRegistry

__all__ = ["FreshIdentities", "LeaseQueue", "newcomer_wait_bound_s"]

RECHECK_S = 30.0
"""How long a busy identity past its ``ttl`` waits before it is looked at again."""
REGISTER_RETRY_MAX_S = 60.0
"""The longest ``Retry-After`` of a registration refused for its network's fresh identities."""
QUEUE_RETRY_MAX_S = 10.0
"""The longest ``Retry-After`` of a lease refused to a fresh identity waiting its turn."""


def newcomer_wait_bound_s(
    *, max_fresh_per_network: int, ban_abandoned_leases: int, task_timeout_s: float, ttl_s: float
) -> float:
    """Seconds within which a new honest identity gets its first lease at an address whose
    network's fresh identities all hoard its leases, however many it registered there and whatever
    they abandon, if its client honours every ``Retry-After``:

        (F * L + 1) * T + min(REGISTER_RETRY_MAX_S, ttl) + min(QUEUE_RETRY_MAX_S, T)

    with ``F`` = ``max_fresh_per_network``, ``L`` = ``ban_abandoned_leases``, ``T`` =
    ``task_timeout_s`` (plus the expiry loop's ticks). Derivation: registration waits for one of
    the network's ``F`` fresh identities to leave. Idle ones retire; busy ones hold or wait for the
    address's leases, of which at least one is always open to them (the per-address cap is >= 1,
    handed out first come, first served), so after at most ``F * (L - 1) + 1`` expired leases of
    ``T`` one of them has ``L`` and is banned; the client sleeps at most one more network-cap
    ``Retry-After``. Then at most ``F - 1`` of them are ahead in the address's queue, each taking
    one lease of at most ``T`` first, plus one queue ``Retry-After``. With the shipped values
    (16, 3, 300 s, 600 s): 14,770 s. A newcomer whose network holds fewer than ``F`` fresh
    identities registers at once, and one whose address has a free slot leases at once.

    Pitfall: the bound assumes the attacker makes no new identity on that network meanwhile (it
    shares the network's registrations, and may take each freed slot first) and brings none
    registered elsewhere to lease at the address (each one lengthens the queue by one lease), and
    that the validator judges a fabricated batch within ``T`` (a rejected lease counts as an
    abandoned one). ``inf`` with no per-network cap (``F = 0``)."""
    if max_fresh_per_network == 0:
        return math.inf
    register_retry = min(REGISTER_RETRY_MAX_S, max(1.0, ttl_s)) if ttl_s > 0 else REGISTER_RETRY_MAX_S
    hoarded = max_fresh_per_network * ban_abandoned_leases + 1
    return hoarded * task_timeout_s + register_retry + min(QUEUE_RETRY_MAX_S, task_timeout_s)


class LeaseQueue:
    """First come, first served turns for leases, one queue per client address (module docstring).

    Cost (issue 46, finding 9: the queue was walked whole on every ask, under the server's lock;
    ``benchmarks/results/identity_flood.md``): an ask looks at most at the ``free`` entries ahead of the slots it may take,
    and drops for good every lapsed or ineligible entry it passes, so an ask costs O(free) plus
    the entries it drops (each dropped once): O(1) amortised, whatever the queue's length. A place
    is a ticket number; the place reported is ``ticket - head ticket + 1``, an upper bound (those
    who left between count until the head passes them)."""

    def __init__(self, *, stale_s: float, clock: Callable[[], float]) -> None:
        self.stale_s = stale_s
        self._clock = clock
        # address -> worker id -> (ticket, last asked); OrderedDict: O(1) removal anywhere, order kept
        self._queues: dict[str, OrderedDict[str, tuple[int, float]]] = {}
        self._tickets: dict[str, int] = {}  # address -> next ticket
        self._address_of: dict[str, str] = {}

    def waiting(self, worker_id: str) -> bool:
        """Whether ``worker_id`` holds a place in a queue that has not gone stale."""
        address = self._address_of.get(worker_id)
        if address is None:
            return False
        entry = self._queues[address].get(worker_id)
        return entry is not None and entry[1] >= self._clock() - self.stale_s

    def __len__(self) -> int:
        return len(self._address_of)

    def turn(self, worker_id: str, address: str, free: int, *, eligible: Callable[[str], bool]) -> int:
        """0 when ``worker_id`` may take one of the ``free`` slots at ``address`` now (it leaves the
        queue); else (an upper bound on) its 1-based place in the queue, which it joins or keeps
        (its ask renewed). ``eligible(worker_id)``: still fresh and active (others are dropped)."""
        now = self._clock()
        queue = self._queues.setdefault(address, OrderedDict())
        ahead = 0  # live entries ahead of it: once ``free``, it must wait
        while ahead < free:
            first = _first(queue, ahead + 1)  # the entries before index ``ahead`` are live (checked)
            if len(first) <= ahead or first[ahead] == worker_id:
                break
            other = first[ahead]
            if queue[other][1] < now - self.stale_s or not eligible(other):
                self._leave(other, address)  # lapsed or ineligible: dropped for good
            else:
                ahead += 1
        if ahead < free:
            if worker_id in queue:
                self._leave(worker_id, address)
            if not queue:
                del self._queues[address]
                self._tickets.pop(address, None)
            return 0
        if self._address_of.get(worker_id, address) != address:  # asks from elsewhere now
            self._leave(worker_id, self._address_of[worker_id])
        entry = queue.get(worker_id)
        if entry is None:
            ticket = self._tickets.get(address, 0)
            self._tickets[address] = ticket + 1
        else:
            ticket = entry[0]
        queue[worker_id] = (ticket, now)  # renews the ask, keeps the place (an OrderedDict keeps a key's position)
        self._address_of[worker_id] = address
        head = next(iter(queue.values()))[0]
        return ticket - head + 1

    def leave(self, worker_id: str) -> None:
        """Drop ``worker_id``'s place (it retired or was banned), O(1)."""
        address = self._address_of.get(worker_id)
        if address is not None:
            self._leave(worker_id, address)
            if not self._queues[address]:
                del self._queues[address]
                self._tickets.pop(address, None)

    def _leave(self, worker_id: str, address: str) -> None:
        self._queues[address].pop(worker_id, None)
        self._address_of.pop(worker_id, None)


def _first(queue: OrderedDict[str, tuple[int, float]], count: int) -> list[str]:
    """The first ``count`` worker ids of ``queue`` (O(count))."""
    out: list[str] = []
    for worker_id in queue:
        if len(out) >= count:
            break
        out.append(worker_id)
    return out


class FreshIdentities:
    """Per-network caps and retirement of identities without accepted work (module docstring).

    ``has_history(worker_id)``: whether the validator accepted any of its tokens.
    """

    def __init__(
        self,
        workers: WorkerRegistry,
        *,
        max_per_network: int,
        ttl_s: float,
        has_history: Callable[[str], bool],
        clock: Callable[[], float],
    ) -> None:
        self._workers = workers
        self.max_per_network = max_per_network
        self.ttl_s = ttl_s
        self._has_history = has_history
        self._clock = clock
        self._by_network: dict[str, set[str]] = {}
        self._due: list[tuple[float, str]] = []  # (retire-at, worker id), a heap

    def fresh(self, worker_id: str) -> bool:
        """Active and without accepted work."""
        worker = self._workers.get(worker_id)
        return worker is not None and worker.active and not self._has_history(worker_id)

    def track(self, worker: WorkerRecord) -> None:
        """Count a newly registered (or replayed) active ``worker`` while it is fresh."""
        if not worker.active or self._has_history(worker.worker_id):
            return
        if worker.network:
            self._by_network.setdefault(worker.network, set()).add(worker.worker_id)
        if self.ttl_s > 0:
            heapq.heappush(self._due, (worker.registered_at + self.ttl_s, worker.worker_id))

    def live_at(self, network: str) -> int:
        """Fresh identities registered from ``network`` now (drops those no longer fresh)."""
        members = self._by_network.get(network)
        if not members:
            return 0
        members.difference_update([w for w in members if not self.fresh(w)])
        return len(members)

    def check_register(self, network: str) -> None:
        """ApiFailure 429 ``rate_limited`` when ``network`` already holds ``max_per_network`` fresh
        identities (no limit for an unknown network: in-process callers)."""
        if not network or not self.max_per_network or self.live_at(network) < self.max_per_network:
            return
        now = self._clock()
        first_due = min(self._workers[w].registered_at for w in self._by_network[network]) + self.ttl_s
        retry = min(REGISTER_RETRY_MAX_S, max(1.0, first_due - now)) if self.ttl_s > 0 else REGISTER_RETRY_MAX_S
        raise ApiFailure(
            429,
            "rate_limited",
            f"{self.max_per_network} identities without accepted work were registered from your network {network} "
            "(orchestrator.max_fresh_workers_per_network); register again once one has accepted work or retired "
            "(orchestrator.fresh_worker_ttl_s)",
            retry_after_s=retry,
        )

    def retire_idle(self, busy: Callable[[str], bool]) -> list[WorkerRecord]:
        """Retire the fresh identities past ``ttl_s`` that are not ``busy`` (holding a lease or a batch
        awaiting verdicts); returns them."""
        now, retired = self._clock(), []
        while self._due and self._due[0][0] <= now:
            _, worker_id = heapq.heappop(self._due)
            if not self.fresh(worker_id):
                continue  # banned, retired or established: nothing to do, ever
            if busy(worker_id):
                heapq.heappush(self._due, (now + min(RECHECK_S, self.ttl_s), worker_id))
                continue
            worker = self._workers[worker_id]
            self._workers.retire(worker, f"no accepted work within {self.ttl_s:g} s of registering")
            self._by_network.get(worker.network, set()).discard(worker_id)
            retired.append(worker)
        return retired
