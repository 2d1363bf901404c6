"""Who may take one more lease now: per-identity allowances earned by answered work, a cap on what
fresh identities may hold per client address, and backpressure on answered work.

The rules (``LeaseRules.check`` raises the API's refusal; ``LeaseBook`` counts, ``ReleaseBook``
knows whose tokens the validator accepted):

  - **Own allowance** (409 ``conflict``): a worker may hold
    ``max(1, min(max_open_leases, 1 + answered) - abandoned)`` unanswered leases, where
    ``answered`` counts its leases a stored batch answers and the validator did not reject, and
    ``abandoned`` those it let expire or whose batch was rejected. A fresh identity therefore
    holds one lease at a time and cannot choose between leases: to hold a second, it must first
    answer one. A rejected batch costs what walking away costs (``LeaseBook.mark_judged``): a
    worker that spoils the leases it does not want trained, instead of walking away from them,
    loses the same allowance, address cap and ban standing, and the tasks go to another identity.
  - **Fresh identities per address** (429 ``busy``): identities without accepted history (no
    completion token of theirs accepted by the validator) leasing from one client address
    (IPv6: its /64) may hold at most ``max(1, max_open_leases_per_address - unforgiven)`` open
    leases together, where ``unforgiven = max(0, abandoned_at - answered_at)`` counts the address's
    abandoned (expired or rejected) leases not offset by answered ones. Identities *with* accepted history are not
    counted and not capped here: however many fresh identities share their address, they keep
    their own allowance (at most ``max_open_leases`` each). The documented bound: the fresh
    identities at one address, however many, hold at most ``max_open_leases_per_address`` leases.
    Those refused take turns, first come, first served (``identities.LeaseQueue``): a free slot
    goes to the longest-waiting one, so a newcomer's first lease waits for at most the identities
    queued ahead of it to take one each, whatever they abandon.
  - **Backpressure** (429 ``busy``, issue 44): the admitted work, usable answered samples buffered
    plus the samples of every open lease (``prompts_per_batch * group_size`` each), is bounded by
    ``max_buffered_samples``: a fresh identity (no accepted work) gets a lease only while all of it
    stays within the limit, so fresh identities only fill room no one uses; an established worker
    counts fresh identities' work (their open leases and batches awaiting verdicts) only up to
    ``fresh_buffered_share`` of the limit, so unproven work holds it back by at most that share,
    however many fresh identities ask. Bound: admitted work <= ``max_buffered_samples`` + the fresh
    identities' work beyond their share, which was admitted only into unused room and drains within
    a lease timeout or a verdict. (Before: open leases did not count, and 992 batches queued against
    a 128-sample limit.) Identities that hoard leases pay for it in allowance and abandonment bans.
  - **Lease only what can be judged** (429 ``busy``, issue 45 item 5; ``orchestrator.lease_judgeable``,
    on by default): the admitted work is also bounded by what the trainer's claims take before it
    goes stale, ``k * samples_per_step`` with ``k`` the claims left to the oldest unjudged work (the
    validators judge the freshest version first, so older unjudged work is judged last and trained
    only if a claim needs all of it), and its unjudged part (open leases, batches awaiting verdicts)
    by what the validators judge in that time, ``max(1, k - 1) * judge_samples_per_s * step_s``
    (``judge_capacity.py``: moving estimates, O(1) per event). At least one lease while ``k > 0``,
    so the pipeline never empties and the estimates keep moving: no deadlock. Cold start: the
    configured ``trainer.samples_per_step`` until a claim is measured, no unjudged limit until the
    validators' pace is. Fresh identities' open leases count for an established worker up to the
    fresh share; their submitted batches count in full (they drain in their turn at the validators,
    and work admitted past them would overtake them and expire them). The oldest unjudged version
    ``k`` is taken to is that of batches awaiting verdicts and of established workers' open leases:
    a fresh identity's open lease never moves it, else identities that take leases and hold them
    while the steps go past pull ``k`` to 0 and every worker down to the one-lease floor (an
    established worker's leases fell from 52.5 to 11-14 a minute in ``test_redteam_trust``); a lease
    they answer that late is theirs to lose. The refusal's ``Retry-After``
    is at least the estimates' time for the excess to drain. Whatever the limit, a refusal records
    nothing against the worker: no abandonment, no allowance, no ban.
  - **Abandonment bans** (``chargeable``): once a worker's expired or rejected leases reach
    ``ban_abandoned_leases`` and ``ban_abandoned_share`` of its leases, it is banned. Rejections the
    worker did not choose never count here (``machine_caused``: its own failures are all
    ``tool_unverifiable``, ``reward_unverifiable``, ``internal_error`` or ``expired``), nor does a
    lease whose answer never reached its client (``LeaseBook.withdraw``) or whose batch reached the
    server before its deadline (the server does not expire a lease while its batch waits in line).
    Their tasks still go to another identity, so no veto is free, and a machine-caused rejection
    still costs the allowance and the address cap as walking away does: a worker can cause some of
    them at will (a tool that loops past its limit), so they must not earn it anything.
  - **Machine-caused rate ban** (``ban_machine_rate``): a worker is banned for machine-caused
    rejections only when their share of its leases is above the measured honest share
    ``p0 = orchestrator.machine_rejected_honest_share`` by a sequential likelihood-ratio test
    (against ``p1 = (1 + p0) / 2``): ban once ``k ln(p1/p0) + (n - k) ln((1-p1)/(1-p0)) >=
    ln(1 / machine_rejected_false_ban)`` with ``k`` machine-caused of ``n`` leases. The ratio is a
    martingale for a worker whose leases are machine-rejected with probability ``<= p0`` each, so
    by Ville's inequality P(such a worker is *ever* banned) <= ``machine_rejected_false_ban``.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from prime_rl.api.errors import ApiFailure
from prime_rl.api.protocol import FOLLOWER_REASONS, UNVERIFIABLE_REASONS, Verdict, machine_rejected
from prime_rl.config.sections import OrchestratorConfig
from prime_rl.orchestrator.identities import QUEUE_RETRY_MAX_S, LeaseQueue
from prime_rl.orchestrator.judge_capacity import JudgeCapacity, LeaseBudget
from prime_rl.orchestrator.leases import LeaseBook
from prime_rl.orchestrator.workers import WorkerRecord, WorkerRegistry

__all__ = ["MACHINE_REASONS", "LeaseRules", "machine_caused", "machine_rate_evidence"]

MACHINE_REASONS = UNVERIFIABLE_REASONS | {"internal_error", "expired"}
"""Rejections the worker did not choose (or need not have): a check the machine limited, a tool
output no replay reproduces, the validator's own failure, a batch no validator judged in time."""


def machine_caused(verdicts: Sequence[Verdict]) -> bool:
    """Whether a judged batch was rejected only for ``MACHINE_REASONS`` (``protocol.machine_rejected``
    for the unverifiable ones; followers such as ``lease_rejected`` aside)."""
    if machine_rejected(verdicts):
        return True
    own = {v.reason for v in verdicts if not v.accepted and v.reason not in FOLLOWER_REASONS}
    return bool(own) and own <= MACHINE_REASONS


def machine_rate_evidence(machine: int, leases: int, honest_share: float) -> float:
    """The log likelihood ratio of ``machine`` machine-caused rejections among ``leases`` leases, a
    share ``(1 + honest_share) / 2`` against ``honest_share`` (module docstring; 0 if the share is 1)."""
    p0 = honest_share
    if p0 >= 1.0 or leases <= 0:
        return 0.0
    p1 = (1.0 + p0) / 2
    hit = math.log(p1 / p0) if p0 > 0 else math.inf
    miss = math.log((1 - p1) / (1 - p0))
    return (machine * hit if machine else 0.0) + max(0, leases - machine) * miss


class LeaseRules:
    """The lease rules of the module docstring over the ledger's books.

    ``has_history(worker_id)``: whether the validator accepted any of the worker's tokens.
    ``buffered()``: usable answered samples buffered, fresh identities' batches awaiting verdicts
    included, and those batches' samples (``BatchBook.buffered``).
    ``clock``: the ledger's seconds (the first-come queue's staleness).
    ``lease_samples``: the samples one lease asks for (``prompts_per_batch * group_size``).
    ``capacity`` / ``step`` / ``samples_per_step``: the moving estimates, the current step and the
    configured ``trainer.samples_per_step`` (the judgeable limits; without ``capacity`` they are off).
    ``unjudged()``: usable samples awaiting verdicts and their oldest policy version (None: none; the
    open leases are added here).
    """

    BUSY_WINDOW_S = 10.0
    """Identities refused for backpressure within this window count as waiting (``busy_retry_after``;
    established and fresh identities apart)."""
    BUSY_POLLS_PER_S = 20.0
    """How many backpressure polls a second the waiting identities together are asked to send."""
    MAX_BUSY_RETRY_S = 15.0
    """The longest ``Retry-After`` of a backpressure answer (a stalled pipeline costs a waiting worker
    at most this long once it moves again)."""

    QUEUE_STALE_S = 60.0
    """A fresh identity that has not asked for a lease for this long loses its place (the client
    honours ``Retry-After`` up to 60 s)."""

    def __init__(
        self,
        orch: OrchestratorConfig,
        leases: LeaseBook,
        workers: WorkerRegistry,
        *,
        has_history: Callable[[str], bool],
        buffered: Callable[[], tuple[int, int]],
        clock: Callable[[], float],
        lease_samples: int = 1,
        capacity: JudgeCapacity | None = None,
        step: Callable[[], int] = lambda: 0,
        samples_per_step: int = 1,
        unjudged: Callable[[], tuple[int, int | None]] = lambda: (0, None),
    ) -> None:
        self._orch = orch
        self._leases = leases
        self._workers = workers
        self._has_history = has_history
        self._buffered = buffered
        self.queue = LeaseQueue(stale_s=self.QUEUE_STALE_S, clock=clock)
        self._clock = clock
        # worker id -> last backpressure refusal; established identities, then fresh ones (apart, so
        # fresh identities never lengthen an established worker's Retry-After: issue 46, finding 7)
        self._refused: tuple[OrderedDict[str, float], OrderedDict[str, float]] = (OrderedDict(), OrderedDict())
        self._lease_samples = lease_samples
        self._jitter = random.Random()
        self.capacity = capacity
        self._step = step
        self._samples_per_step = samples_per_step
        self._unjudged_of = unjudged
        self.last_budget: LeaseBudget | None = None  # GET /status: the judgeable limits and the admitted work
        self.last_admitted: int | None = None  # at the last lease decision (None before any)

    def busy_retry_after(self, worker_id: str, *, established: bool = True) -> float:
        """``Retry-After`` seconds for a backpressure refusal of ``worker_id``: the identities refused
        in the last ``BUSY_WINDOW_S`` over ``BUSY_POLLS_PER_S``, jittered over [0.5, 1.5) so they do
        not come back together, within [1, ``MAX_BUSY_RETRY_S``]. A few waiting workers ask every
        second as before; many ask together about ``BUSY_POLLS_PER_S`` times a second, whatever their
        number, and any of them takes a freed slot within a fraction of a second. With a fixed 1 s,
        256 waiting identities sent some 200 requests a second for 8 leases, and their 429s took the
        orchestrator's core (``benchmarks/results/swarm.md``). Established and fresh identities are
        counted apart: each waits among its own kind."""
        now = self._clock()
        refused = self._refused[0 if established else 1]
        refused[worker_id] = now
        refused.move_to_end(worker_id)
        while refused and next(iter(refused.values())) < now - self.BUSY_WINDOW_S:
            refused.popitem(last=False)
        seconds = len(refused) / self.BUSY_POLLS_PER_S * self._jitter.uniform(0.5, 1.5)
        return min(self.MAX_BUSY_RETRY_S, max(1.0, seconds))

    def abandoned(self, worker_id: str) -> int:
        """Leases ``worker_id`` let expire or answered with a batch the validator rejected."""
        return self._leases.expired(worker_id) + self._leases.rejected(worker_id)

    def chargeable(self, worker_id: str) -> int:
        """Abandoned leases that count towards the abandonment ban: not the machine-caused rejections."""
        return self.abandoned(worker_id) - self._leases.machine_rejected(worker_id)

    def allowance(self, worker_id: str) -> int:
        """Open leases ``worker_id`` may hold (module docstring, "own allowance")."""
        answered = self._leases.answered(worker_id) - self._leases.rejected(worker_id)
        earned = min(self._orch.max_open_leases, 1 + answered)
        return max(1, earned - self.abandoned(worker_id))

    def fresh_cap(self, address: str) -> int:
        """Open leases the fresh identities at ``address`` may hold together."""
        leases = self._leases
        answered = leases.answered_at(address) - leases.rejected_at(address)
        unforgiven = max(0, leases.expired_at(address) + leases.rejected_at(address) - answered)
        return max(1, self._orch.max_open_leases_per_address - unforgiven)

    def _fresh(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        return worker is not None and worker.active and not self._has_history(worker_id)

    def fresh_open_at(self, address: str) -> int:
        """Open leases at ``address`` held by identities without accepted history."""
        return self._leases.open_at(address, among=lambda worker_id: not self._has_history(worker_id))

    def ban_abandoners(self, worker_ids: set[str]) -> None:
        """Ban those of ``worker_ids`` whose chargeable abandoned (expired or rejected, not machine-caused)
        leases pass both limits, or whose machine-caused rejections pass the rate test."""
        orch = self._orch
        for worker_id in sorted(worker_ids):
            worker = self._workers.get(worker_id)
            if worker is None or worker.banned:
                continue
            abandoned, issued = self.chargeable(worker_id), self._leases.issued(worker_id)
            if abandoned >= orch.ban_abandoned_leases and abandoned >= orch.ban_abandoned_share * issued:
                self._workers.ban(worker, f"abandoned {abandoned} of {issued} leases (expired unanswered or rejected)")
                continue
            machine = self._leases.machine_rejected(worker_id)
            evidence = machine_rate_evidence(machine, issued, orch.machine_rejected_honest_share)
            if machine >= orch.ban_abandoned_leases and evidence >= -math.log(orch.machine_rejected_false_ban):
                self._workers.ban(
                    worker,
                    f"{machine} of {issued} leases rejected for reasons that may be the machine's, above the "
                    f"honest share {orch.machine_rejected_honest_share:g} "
                    f"(false-ban bound {orch.machine_rejected_false_ban:g})",
                )

    def check(self, worker: WorkerRecord, address: str) -> None:
        """ApiFailure 409 / 429 when ``worker`` (leasing from ``address``) may not take a lease now."""
        worker_id = worker.worker_id
        open_leases, allowance = self._leases.open_count(worker_id), self.allowance(worker_id)
        if open_leases >= allowance:
            raise ApiFailure(
                409,
                "conflict",
                f"{open_leases} unanswered leases open (you may hold {allowance}: one more per answered lease up "
                "to orchestrator.max_open_leases, less one per lease you let expire or had rejected); submit them first",
            )
        if not self._has_history(worker_id):
            at_address, cap = self.fresh_open_at(address), self.fresh_cap(address)
            place = self.queue.turn(worker_id, address, cap - at_address, eligible=self._fresh)
            if place:
                raise ApiFailure(
                    429,
                    "busy",
                    f"{at_address} unanswered leases are open to identities without accepted work at your "
                    f"address {address} (they may hold {cap}: orchestrator.max_open_leases_per_address less "
                    f"the address's abandoned leases not offset by answered ones); you are number {place} in "
                    "the queue for the next free one: ask again within "
                    f"{self.QUEUE_STALE_S:.0f} s to keep your place",
                    retry_after_s=min(QUEUE_RETRY_MAX_S, self._orch.task_timeout_s),
                )
        self.check_backpressure(worker_id)

    def admitted_work(self) -> tuple[int, int]:
        """(all, fresh identities') admitted samples: usable answered samples buffered plus the samples
        of open leases. Costs one walk of the buffered batches and of the workers holding leases."""
        per_lease = self._lease_samples
        everything, fresh_buffered = self._buffered()
        fresh_open = sum(n for w, n in self._leases.open_by_worker().items() if not self._has_history(w))
        return everything + self._leases.open_total() * per_lease, fresh_buffered + fresh_open * per_lease

    def judgeable_limits(self, oldest_unjudged: int | None) -> LeaseBudget | None:
        """The limits on outstanding work so that each sample can still be judged and trained in the
        off-policy window (module docstring), the floor applied; None when ``lease_judgeable`` is off.
        ``oldest_unjudged``: the oldest policy version of the unjudged work (None: none)."""
        if self.capacity is None or not self._orch.lease_judgeable:
            return None
        capacity, bound, step = self.capacity, self._orch.off_policy_bound, self._step()
        budget = capacity.budget(step, bound, self._samples_per_step, oldest_unjudged)
        if capacity.claims_left(step, bound) > 0:  # the floor: one lease is always in flight
            floor = self._lease_samples
            budget = LeaseBudget(max(budget.total, floor), None if budget.unjudged is None else max(budget.unjudged, floor))
        self.last_budget = budget
        return budget

    def status_fields(self) -> dict[str, Any]:
        """``GET /status``'s lease budget and estimates (O(1): the last lease decision's numbers)."""
        budget = self.last_budget
        estimates = self.capacity.estimates() if self.capacity is not None else None
        return {
            "lease_budget_samples": budget.total if budget else None,
            "unjudged_budget_samples": budget.unjudged if budget else None,
            "admitted_samples": self.last_admitted,
            "judge_samples_per_s": estimates.judge_samples_per_s if estimates else None,
            "trainer_samples_per_step": estimates.samples_per_step if estimates else None,
            "trainer_step_s": estimates.step_s if estimates else None,
        }

    def _unjudged(self) -> tuple[int, int, int | None]:
        """(unjudged samples, fresh identities' open-lease samples, oldest policy version among the
        batches awaiting verdicts and established workers' open leases, module docstring): awaiting
        verdicts plus open leases. O(open leases + waiting batches)."""
        per_lease = self._lease_samples
        waiting, oldest = self._unjudged_of()
        fresh_open = 0
        for worker_id, count in self._leases.open_by_worker().items():
            if not self._has_history(worker_id):
                fresh_open += count
                continue
            for held in self._leases.open_leases(worker_id):
                record = held.record
                version = record.step if record.policy_version is None else record.policy_version
                oldest = version if oldest is None else min(oldest, version)
        return waiting + self._leases.open_total() * per_lease, fresh_open * per_lease, oldest

    def check_backpressure(self, worker_id: str) -> None:
        """ApiFailure 429 ``busy`` when one more lease for ``worker_id`` would take the admitted work
        past ``max_buffered_samples`` or the judgeable limits (or a fresh identity's past the fresh
        share of a limit)."""
        configured = self._orch.max_buffered_samples
        judging = self.capacity is not None and self._orch.lease_judgeable
        if not configured and not judging:
            return
        established = self._has_history(worker_id)
        admitted, fresh = self.admitted_work()
        self.last_admitted = admitted
        if configured:
            self._refuse_over(worker_id, configured, admitted, fresh, established, "configured")
        if not judging:
            return
        unjudged, fresh_open, oldest = self._unjudged()
        budget = self.judgeable_limits(oldest)
        assert budget is not None
        # Here fresh identities' submitted work counts in full for everyone: the validators judge it in
        # its turn (one place in four), so it drains, and work admitted past it would overtake it in the
        # validators' queue and expire it. Only their open leases (which they could hoard) count for an
        # established worker up to the fresh share.
        self._refuse_over(worker_id, budget.total, admitted, fresh_open, established, "judgeable")
        if budget.unjudged is not None:
            self._refuse_over(worker_id, budget.unjudged, unjudged, fresh_open, established, "unjudged")

    def _refuse_over(
        self, worker_id: str, limit: int, admitted: int, fresh: int, established: bool, source: str
    ) -> None:
        """ApiFailure 429 ``busy`` if one more lease takes ``admitted`` samples (``fresh`` of them fresh
        identities') past ``limit``; ``source`` names the limit in the answer."""
        per_lease = self._lease_samples
        share = max(per_lease, int(self._orch.fresh_buffered_share * limit))
        # An established worker sees fresh identities' work only up to their share; a fresh identity
        # sees all of it, so it only fills room no one uses (a run's start, a drained pipeline).
        counted = admitted - fresh + min(fresh, share) if established else admitted
        if counted + per_lease <= limit:
            return
        retry_s = self.busy_retry_after(worker_id, established=established)
        if source != "configured" and self.capacity is not None:
            drain = self.capacity.drain_s(counted + per_lease - limit, self._samples_per_step)
            if drain is not None:  # the estimates' time for the excess to leave the pipeline
                retry_s = max(retry_s, min(self.MAX_BUSY_RETRY_S, drain * self._jitter.uniform(0.5, 1.5)))
        kind = "awaiting verdicts or leased" if source == "unjudged" else "buffered or leased"
        which = (
            f"{counted} samples {kind} (of identities without accepted work at most {share} count for you: "
            "orchestrator.fresh_buffered_share)"
            if established
            else f"{admitted} samples {kind}"
        )
        which += {
            "configured": f" against orchestrator.max_buffered_samples = {limit}",
            "judgeable": f" against {limit}, what the trainer can take before this step's version goes stale "
            "(orchestrator.lease_judgeable); this refusal costs you nothing",
            "unjudged": f" against {limit}, what the validators can judge before the oldest of it goes stale "
            "(orchestrator.lease_judgeable); this refusal costs you nothing",
        }[source]
        raise ApiFailure(
            429, "busy", f"{which}; a lease adds {per_lease}; retry in {math.ceil(retry_s)} s", retry_after_s=retry_s
        )
