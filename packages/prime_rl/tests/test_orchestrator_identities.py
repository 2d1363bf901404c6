"""Issue 34, items 4 and 1: identities that cannot fill the table or starve a newcomer, and unproven
work that never holds back established workers.

The ledger with an injected clock (fast), plus one HTTP test on loopback from several 127.x
source addresses (Linux routes all of 127/8 to lo).
"""

from __future__ import annotations

import contextlib
import http.client
import json
from typing import Any

import pytest

from prime_rl.api.errors import ApiFailure
from prime_rl.orchestrator.identities import newcomer_wait_bound_s
from prime_rl.orchestrator.ledger import Ledger
from prime_rl.orchestrator.rate_limit import network_key
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.orchestrator.store import RolloutStore
from prime_rl.tasks import TaskSet

from .ledger_support import _accept, _batch, _ledger, _submit


def _register(ledger: Ledger, name: str, address: str) -> Any:
    return ledger.workers[ledger.register(name, network_key(address)).worker_id]


def test_ten_thousand_registrations_from_321_addresses_leave_room_for_a_newcomer(config_for: Any) -> None:
    # The flood: 321 addresses (here each in its own /24, the attacker's best case) try
    # 10,000 registrations. Before: all 10,000 succeeded, max_workers (10,000) was full and every
    # newcomer got 503 worker_limit for good.
    ledger, _ = _ledger(config_for)
    addresses = [f"10.{i // 200}.{i % 200}.7" for i in range(321)]
    admitted = refused = 0
    for attempt in range(10_000):
        try:
            _register(ledger, f"sybil{attempt}", addresses[attempt % 321])
            admitted += 1
        except ApiFailure as failure:
            assert failure.status == 429 and failure.error == "rate_limited"
            assert "max_fresh_workers_per_network" in failure.message
            refused += 1
    assert admitted == 321 * 16 and refused == 10_000 - 321 * 16  # 16 fresh identities per network
    newcomer = _register(ledger, "honest", "192.0.2.10")
    assert ledger.lease(newcomer, None, None, "192.0.2.10").batch_index == 0  # first ask, first lease


def test_idle_fresh_identities_retire_and_free_the_table(config_for: Any) -> None:
    ledger, clock = _ledger(
        config_for, "--orchestrator.max_workers", "4", "--orchestrator.fresh_worker_ttl_s", "100",
        "--orchestrator.max_fresh_workers_per_network", "0", "--orchestrator.task_timeout_s", "1000",
    )  # fmt: skip
    veteran, holder, idle, idle2 = (_register(ledger, name, "10.0.0.1") for name in ("v", "h", "i", "j"))
    _accept(ledger, _submit(ledger, veteran, _batch(ledger.lease(veteran, None, None, "10.0.0.1"))).batch_id)
    ledger.lease(holder, None, None, "10.0.0.2")
    with pytest.raises(ApiFailure) as full:
        _register(ledger, "newcomer", "10.0.0.3")
    assert full.value.status == 503 and full.value.error == "worker_limit"
    clock.now += 99
    assert ledger.retire_idle() == 0  # not yet
    clock.now += 1
    assert ledger.retire_idle() == 2  # the two idle ones; the veteran has accepted work, the holder a lease
    assert idle.retired and idle2.retired and not holder.retired and not veteran.retired
    assert ledger.workers.active_count() == 2
    with pytest.raises(ApiFailure) as gone:
        ledger.authenticate(idle.worker_id, "any")
    assert gone.value.status == 404 and "unknown worker_id" in gone.value.message  # the worker registers anew
    assert _register(ledger, "newcomer", "10.0.0.3").worker_id == "w0004"
    # Retirement is durable: a restarted ledger keeps the room it freed.
    restarted = Ledger(ledger.config, ledger.tasks, RolloutStore(ledger.config.orchestrator_data_dir), clock=clock)
    assert restarted.workers[idle.worker_id].retired and restarted.workers.active_count() == 3


def test_a_full_network_reopens_when_its_fresh_identities_retire_or_prove_themselves(config_for: Any) -> None:
    ledger, clock = _ledger(
        config_for, "--orchestrator.max_fresh_workers_per_network", "2", "--orchestrator.fresh_worker_ttl_s", "100"
    )
    first = _register(ledger, "a", "10.0.0.1")
    _register(ledger, "b", "10.0.0.2")
    with pytest.raises(ApiFailure) as full:
        _register(ledger, "c", "10.0.0.3")  # same /24
    assert full.value.status == 429 and full.value.retry_after_s == 60.0
    _register(ledger, "elsewhere", "10.0.1.3")  # another /24 is not affected
    _accept(ledger, _submit(ledger, first, _batch(ledger.lease(first, None, None, "10.0.0.1"))).batch_id)
    _register(ledger, "c", "10.0.0.3")  # `first` has accepted work: no longer counted
    with pytest.raises(ApiFailure):
        _register(ledger, "d", "10.0.0.4")
    clock.now += 100
    _register(ledger, "d", "10.0.0.4")  # b and c retired


def test_a_newcomer_gets_its_first_lease_within_a_bounded_wait_at_a_crowded_address(config_for: Any) -> None:
    # Ten fresh identities at one address keep the address's cap (2 leases) full: each holds its lease
    # for 9 of the 10 s timeout, answers it and asks again at once, always before the newcomer does.
    # Before: every freed slot went to whoever asked first, so the newcomer never got one.
    ledger, clock = _ledger(
        config_for, "--orchestrator.max_open_leases_per_address", "2", "--orchestrator.max_open_leases", "1"
    )
    address = "10.0.0.7"
    hoarders = [_register(ledger, f"h{i}", f"10.0.{i + 1}.1") for i in range(10)]
    held: dict[str, tuple[Any, float]] = {}
    newcomer = _register(ledger, "newcomer", "10.0.0.8")
    first_lease_at = None
    start = clock.now
    for _ in range(300):  # one tick per second
        for worker in hoarders:
            lease_and_time = held.get(worker.worker_id)
            if lease_and_time is not None and clock.now - lease_and_time[1] >= 9:
                _submit(ledger, worker, _batch(lease_and_time[0]))
                del held[worker.worker_id]
            if worker.worker_id not in held:
                try:
                    held[worker.worker_id] = (ledger.lease(worker, None, None, address), clock.now)
                except ApiFailure as failure:
                    assert failure.status == 429
        try:
            ledger.lease(newcomer, None, None, address)
            first_lease_at = clock.now
            break
        except ApiFailure as failure:
            assert failure.status == 429 and "in the queue" in failure.message
        clock.now += 1
    assert first_lease_at is not None, "the newcomer never got a lease"
    # The 8 hoarders queued ahead of it take one lease each, then it: ceil((8 + 1) / 2) rounds of <= 10 s.
    assert first_lease_at - start <= 5 * 10
    assert not any(worker.banned for worker in hoarders)


def test_a_newcomer_at_a_hoarded_address_leases_within_the_stated_bound(config_for: Any) -> None:
    # benchmarks/identity_flood.py on a real orchestrator (10,000 registrations from 321 addresses),
    # smaller and on the ledger's clock: 8 addresses, each its own /24, try 64 registrations; every
    # identity takes a lease and never answers it. The 4 at one address keep asking every second,
    # before anyone else, so they hold its leases and queue for them. A newcomer at its own address
    # registers and leases at once; one at theirs, honouring every Retry-After, within
    # newcomer_wait_bound_s = (F * L + 1) * T + min(60, ttl) + min(10, T) = 13 * 10 + 30 + 10 = 170 s.
    fresh_cap, bans_at, timeout, ttl = 4, 3, 10.0, 30.0
    ledger, clock = _ledger(
        config_for, "--orchestrator.max_fresh_workers_per_network", str(fresh_cap),
        "--orchestrator.fresh_worker_ttl_s", str(ttl), "--orchestrator.max_open_leases_per_address", "4",
    )  # fmt: skip
    addresses = [f"10.{i}.0.7" for i in range(8)]
    identities: dict[str, list[Any]] = {address: [] for address in addresses}
    for attempt in range(64):
        address = addresses[attempt % 8]
        try:
            identities[address].append(_register(ledger, f"sybil{attempt}", address))
        except ApiFailure as failure:
            assert failure.status == 429 and failure.error == "rate_limited"
    assert [len(group) for group in identities.values()] == [fresh_cap] * 8
    for address, group in identities.items():
        for worker in group:
            ledger.lease(worker, None, None, address)
    own = _register(ledger, "own", "192.0.2.10")  # first ask, first lease
    assert ledger.lease(own, None, None, "192.0.2.10").batch_index == 0

    shared, hoarders = addresses[0], identities[addresses[0]]
    bound = newcomer_wait_bound_s(
        max_fresh_per_network=fresh_cap, ban_abandoned_leases=bans_at, task_timeout_s=timeout, ttl_s=ttl
    )
    assert bound == 170.0
    start, next_ask = clock.now, clock.now
    newcomer = registered_at = leased_at = None
    while leased_at is None and clock.now - start <= 2 * bound:
        ledger.expire_leases()  # the server's loop, every second
        for worker in hoarders:
            if not worker.banned:
                with contextlib.suppress(ApiFailure):
                    ledger.lease(worker, None, None, shared)
        if clock.now >= next_ask:
            try:
                if newcomer is None:
                    newcomer, registered_at = _register(ledger, "newcomer", shared), clock.now
                ledger.lease(newcomer, None, None, shared)
                leased_at = clock.now
            except ApiFailure as failure:
                assert failure.status == 429
                next_ask = clock.now + failure.retry_after_s
        clock.now += 1
    assert registered_at is not None and registered_at - start <= (fresh_cap * (bans_at - 1) + 1) * timeout + ttl + 1
    assert leased_at is not None and leased_at - start <= bound + 2  # two ticks of the expiry loop
    assert any(worker.banned for worker in hoarders)  # who left the network's share: a banned abandoner


def test_a_place_in_the_queue_lapses_when_its_identity_stops_asking(config_for: Any) -> None:
    ledger, clock = _ledger(config_for, "--orchestrator.max_open_leases_per_address", "1")
    holder, gone, patient = (_register(ledger, name, f"10.0.{i}.1") for i, name in enumerate("hgp"))
    lease = ledger.lease(holder, None, None, "10.0.0.9")
    for worker in (gone, patient):
        with pytest.raises(ApiFailure):
            ledger.lease(worker, None, None, "10.0.0.9")
    _submit(ledger, holder, _batch(lease))  # the slot frees; `gone` is first but stopped asking
    clock.now += ledger.rules.QUEUE_STALE_S / 2
    with pytest.raises(ApiFailure):
        ledger.lease(patient, None, None, "10.0.0.9")  # `gone` still holds its place
    clock.now += ledger.rules.QUEUE_STALE_S / 2 + 1
    assert ledger.lease(patient, None, None, "10.0.0.9").batch_index == 0


def test_unproven_work_never_holds_back_an_established_worker(config_for: Any) -> None:
    ledger, _ = _ledger(
        config_for, "--orchestrator.max_buffered_samples", "20", "--trainer.samples_per_step", "8",
        "--orchestrator.max_fresh_workers_per_network", "0",
    )  # fmt: skip
    honest = _register(ledger, "honest", "10.0.0.1")
    _accept(ledger, _submit(ledger, honest, _batch(ledger.lease(honest, None, None, "10.0.0.1"))).batch_id)
    _submit(ledger, honest, _batch(ledger.lease(honest, None, None, "10.0.0.1")))  # 8 of its own buffered
    granted = 0
    for i in range(10):  # fabricated work awaiting the validator, as much as fresh identities may admit
        sybil = _register(ledger, f"s{i}", f"10.1.{i}.1")
        try:
            _submit(ledger, sybil, _batch(ledger.lease(sybil, None, None, f"10.1.{i}.1")))
            granted += 1
        except ApiFailure as refused:
            assert refused.status == 429 and "max_buffered_samples" in refused.message
    # Before: 48 buffered >= 20 with 4 of its own, so the established worker was refused (429 busy)
    # while every fresh identity still got its lease. Now fresh identities fill only the room no one
    # uses (issue 44), and count for an established worker only up to orchestrator.fresh_buffered_share.
    assert granted == 3 and ledger.buffered_samples() == 8
    assert ledger.lease(honest, None, None, "10.0.0.1").batch_index == 2
    # The validator's queue: the established worker's batch first.
    batches = ledger.pending(8).batches
    order = [batch.worker_id for batch in batches]
    assert order[0] == honest.worker_id and order.count(honest.worker_id) == 1 and len(order) == 4
    assert batches[0].client == "10.0.0.1"  # the validator's per-address tool budget keys on it


def _http(url: str, method: str, path: str, source: str, *, body: bytes = b"", token: str = "") -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        connection.request(method, path, body=body or None, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_registration_is_bounded_per_network_over_http(config_for: Any) -> None:
    config = config_for(
        "--orchestrator.max_fresh_workers_per_network", "3", "--orchestrator.register_rate_per_minute", "0",
        "--orchestrator.max_open_leases_per_address", "1",
    )  # fmt: skip
    tasks = TaskSet([{"prompt": f"q{i}"} for i in range(20)])
    with OrchestratorServer(config, tasks) as server:
        register = b'{"name": "x"}'
        flood = [_http(server.url, "POST", "/workers/register", f"127.0.0.{i}", body=register) for i in (2, 3, 4, 5, 6)]
        assert [status for status, _ in flood] == [200, 200, 200, 429, 429]  # one /24, three fresh identities
        assert flood[3][1]["error"] == "rate_limited"
        status, honest = _http(server.url, "POST", "/workers/register", "127.0.7.1", body=register)
        assert status == 200
        # The flood's identities hold the one slot of their address; the newcomer elsewhere leases at once.
        sybil = flood[0][1]
        assert _http(server.url, "GET", f"/tasks?worker_id={sybil['worker_id']}", "127.0.0.2", token=sybil["token"])[0] == 200
        status, lease = _http(server.url, "GET", f"/tasks?worker_id={honest['worker_id']}", "127.0.7.1", token=honest["token"])
        assert status == 200 and lease["worker_id"] == honest["worker_id"]
