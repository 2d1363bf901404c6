"""Issue 46, item 7: admission that cannot be gamed (the round-four red team's findings 7, 8 and 9).

- 7: an established worker's Retry-After depends only on established identities (300 fresh
  identities parked on fabricated batches once took an honest worker from 86 to 24 leases/min);
- 8: a fresh identity retires at its ttl however often it asks (158 of 160 that kept asking were
  alive 94 s after registering with a ttl of 30 s, holding the table full for good);
- 9: an ask costs the same whatever the first-come queue's length (the whole queue was walked on
  every ask: 25 ms of lock per ask at 10,000 queued);
- and a place stays for a newcomer from an untouched network (``registration_reserve``).
"""

from __future__ import annotations

from typing import Any

import pytest

from prime_rl.api.errors import ApiFailure
from prime_rl.orchestrator.identities import LeaseQueue

from .ledger_support import _accept, _batch, _ledger, _submit


def test_fresh_identities_never_lengthen_an_established_workers_retry_after(config_for: Any) -> None:
    ledger, _ = _ledger(
        config_for, "--orchestrator.max_buffered_samples", "12", "--trainer.samples_per_step", "8",
        "--orchestrator.fresh_buffered_share", "1.0", "--orchestrator.release_after_tokens", "0",
        "--orchestrator.max_fresh_workers_per_network", "0",
    )  # fmt: skip
    honest = ledger.workers[ledger.register("honest").worker_id]
    _accept(ledger, _submit(ledger, honest, _batch(ledger.lease(honest, None, None, "10.0.0.1"))).batch_id)
    for _ in range(2):  # its own work fills the limit: 4 accepted + 8 awaiting verdicts
        _submit(ledger, honest, _batch(ledger.lease(honest, None, None, "10.0.0.1")))
    refused = 0
    for i in range(100):  # fresh identities, each parked on a fabricated batch if it got a lease
        sybil = ledger.workers[ledger.register(f"s{i}").worker_id]
        for _ in range(2):
            try:
                _submit(ledger, sybil, _batch(ledger.lease(sybil, None, None, f"10.1.{i}.1")))
            except ApiFailure as busy:
                assert busy.status == 429
                refused += 1
                break
    assert refused >= 99
    with pytest.raises(ApiFailure) as busy:
        ledger.lease(honest, None, None, "10.0.0.1")
    # Before: the 100 refused fresh identities counted, 101 / 20 polls a second, jittered: 2.5-7.6 s.
    assert busy.value.status == 429 and busy.value.retry_after_s == 1.0


def test_a_fresh_identity_retires_at_its_ttl_however_often_it_asks(config_for: Any) -> None:
    ledger, clock = _ledger(
        config_for, "--orchestrator.task_timeout_s", "1000", "--orchestrator.fresh_worker_ttl_s", "30",
        "--orchestrator.max_open_leases_per_address", "1",
    )  # fmt: skip
    holder = ledger.workers[ledger.register("holder").worker_id]
    ledger.lease(holder, None, None, "10.0.0.1")  # holds the address's one slot for fresh identities
    asker = ledger.workers[ledger.register("asker").worker_id]
    for _ in range(20):  # asks every 5 s for 100 s, always queued
        with pytest.raises(ApiFailure) as queued:
            ledger.lease(ledger.authenticate(asker.worker_id, _token(ledger, asker)), None, None, "10.0.0.1")
        assert queued.value.status == 429 and "queue" in queued.value.message
        clock.now += 5
        ledger.expire_leases()
        if asker.retired:
            break
    assert asker.retired and clock.now - asker.registered_at <= 30 + 30 + 5  # ttl, one recheck, one ask
    assert not holder.retired  # it holds work (a lease): busy
    assert len(ledger.rules.queue) == 0  # the retired identity left the queue


def _token(ledger: Any, worker: Any) -> str:
    """A valid token for ``worker`` (tests only: the registry keeps hashes, so mint a fresh one)."""
    import hashlib

    token = "t-" + worker.worker_id
    worker.token_sha256 = hashlib.sha256(token.encode()).hexdigest()
    return token


@pytest.mark.parametrize("queued", [2_000, 10_000])
def test_an_ask_costs_the_same_whatever_the_queue_length(queued: int) -> None:
    """Counted, not timed: the entries an ask looks at (``eligible`` calls) do not grow with the queue."""
    now = [0.0]
    queue = LeaseQueue(stale_s=60.0, clock=lambda: now[0])
    looked = [0]

    def eligible(worker_id: str) -> bool:
        looked[0] += 1
        return True

    for i in range(queued):
        assert queue.turn(f"w{i}", "10.0.0.1", 0, eligible=eligible) == i + 1
    looked[0] = 0
    for i in range(0, queued, queued // 100):  # 100 keep-alive asks from all over the queue
        assert queue.turn(f"w{i}", "10.0.0.1", 2, eligible=eligible) >= 1 or i < 2
    assert looked[0] <= 100 * 2  # at most ``free`` entries per ask; before: the whole queue, every ask
    # Lapsed entries are dropped as the head passes them, each once.
    now[0] = 61.0
    looked[0] = 0
    assert queue.turn("late", "10.0.0.1", 1, eligible=eligible) == 0
    assert looked[0] <= queued and len(queue) == 0


def test_first_come_order_is_kept(config_for: Any) -> None:
    now = [0.0]
    queue = LeaseQueue(stale_s=60.0, clock=lambda: now[0])
    everyone = {"a", "b", "c", "d"}
    assert [queue.turn(w, "x", 0, eligible=lambda w: w in everyone) for w in "abcd"] == [1, 2, 3, 4]
    assert queue.turn("c", "x", 2, eligible=lambda w: w in everyone) == 3  # a and b come first
    everyone.discard("a")  # retired: dropped when passed
    assert queue.turn("c", "x", 2, eligible=lambda w: w in everyone) == 0  # b, then c
    # b is still ahead; the place reported is an upper bound (c, who left, still counts until b goes)
    assert queue.turn("d", "x", 1, eligible=lambda w: w in everyone) == 3
    assert queue.turn("b", "x", 1, eligible=lambda w: w in everyone) == 0


def test_a_place_is_kept_for_a_newcomer_from_an_untouched_network(config_for: Any) -> None:
    ledger, _ = _ledger(
        config_for, "--orchestrator.max_workers", "40", "--orchestrator.registration_reserve", "4",
        "--orchestrator.max_fresh_workers_per_network", "4",
    )  # fmt: skip
    for network in range(9):  # 36 fresh identities from 9 networks fill max_workers - reserve
        for i in range(4):
            ledger.register(f"a{network}.{i}", f"10.0.{network}.0/24")
    with pytest.raises(ApiFailure) as full:  # another attacker network that already holds identities
        ledger.register("again", "10.0.0.0/24")
    assert full.value.status in (429, 503)
    ledger.register("x", "10.0.9.0/24")  # fills a fresh network's share one short
    with pytest.raises(ApiFailure) as reserved:  # the reserve is not for a network holding fresh identities
        ledger.register("x2", "10.0.9.0/24")
    assert reserved.value.status == 503 and "registration_reserve" in reserved.value.message
    for network in range(10, 13):  # newcomers from untouched networks: the reserve's places
        ledger.register(f"new{network}", f"10.0.{network}.0/24")
    with pytest.raises(ApiFailure) as table_full:
        ledger.register("one too many", "10.0.99.0/24")
    assert table_full.value.status == 503
