"""Registration hardening: per-address token buckets, the registration token, the worker cap.

The HTTP tests drive the rate limit with a hand-moved clock (``registration_clock``) and the
client's waits with an injected ``sleep`` that moves the same clock, so nothing sleeps for real.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prime_rl.api.client import (
    ClientRequestError,
    OrchestratorBusy,
    OrchestratorClient,
    OrchestratorUnavailable,
)
from prime_rl.config import ConfigError, load_config
from prime_rl.orchestrator.rate_limit import TokenBuckets, client_key, network_key
from prime_rl.orchestrator.server import OrchestratorServer
from prime_rl.tasks import TaskSet


class FakeClock:
    """Seconds that only move when a test (or the client's injected ``sleep``) moves them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def limited_server(tmp_path: Path) -> Any:
    """``start(*overrides) -> (server, clock)``: an orchestrator whose registration limit runs on a FakeClock."""
    servers: list[OrchestratorServer] = []

    def start(*overrides: str) -> tuple[OrchestratorServer, FakeClock]:
        config = load_config(
            None, ["--run_dir", str(tmp_path), "--orchestrator.port", "0", "--orchestrator.prompts_per_batch", "2", *overrides]
        )  # fmt: skip
        clock = FakeClock()
        tasks = TaskSet([{"prompt": f"{a} + {a} ="} for a in range(8)], "{prompt}")
        server = OrchestratorServer(config, tasks, registration_clock=clock).start()
        servers.append(server)
        return server, clock

    yield start
    for server in servers:
        server.stop()


def _register_raw(url: str, *, token: str = "", source: str | None = None) -> tuple[int, dict[str, Any], Any]:
    """POST /workers/register from ``source`` (a loopback address to bind, default the OS's choice)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(
        host, int(port), timeout=10, source_address=(source, 0) if source else None
    )
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        connection.request("POST", "/workers/register", body=b'{"name": "x"}', headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read()), response.headers
    finally:
        connection.close()


# ---------------------------------------------------------------- token buckets (pure)


def test_token_bucket_oracle() -> None:
    """rate 6/min = 0.1 token/s, burst 2. Derivation: two tokens at t=0; the third call finds 0 tokens
    -> wait (1 - 0) / 0.1 = 10 s; at t=4 it has 0.4 -> wait 6 s; at t=10 one token again."""
    clock = FakeClock()
    buckets = TokenBuckets(6, 2, clock=clock)
    assert buckets.admit("a").allowed and buckets.admit("a").allowed
    refused = buckets.admit("a")
    assert not refused.allowed and refused.retry_after_s == pytest.approx(10.0, abs=1e-12)
    assert buckets.admit("b").allowed  # another key has its own bucket
    clock.now = 4.0
    assert buckets.admit("a").retry_after_s == pytest.approx(6.0, abs=1e-12)
    clock.now = 10.0
    assert buckets.admit("a").allowed and not buckets.admit("a").allowed
    clock.now = 5.0  # a clock stepping back neither refills nor drains
    assert buckets.admit("a").retry_after_s == pytest.approx(10.0, abs=1e-12)
    clock.now = 1e6  # a long idle refills to burst, never beyond
    assert [buckets.admit("a").allowed for _ in range(3)] == [True, True, False]


def test_token_bucket_off_and_bounded_memory() -> None:
    clock = FakeClock()
    assert all(TokenBuckets(0, 1, clock=clock).admit("a").allowed for _ in range(1000))
    buckets = TokenBuckets(6, 1, clock=clock, max_keys=2)
    assert buckets.admit("a").allowed and buckets.admit("b").allowed and buckets.admit("c").allowed
    assert len(buckets) == 2  # "a", least recently used, was dropped...
    assert not buckets.admit("c").allowed and buckets.admit("a").allowed  # ...and starts full again
    with pytest.raises(ValueError, match="burst"):
        TokenBuckets(6, 0)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 120),
    burst=st.integers(1, 10),
    calls=st.lists(st.tuples(st.floats(0, 30), st.sampled_from("ab")), max_size=80),
)
def test_token_bucket_never_admits_more_than_burst_plus_rate(
    rate: int, burst: int, calls: list[tuple[float, str]]
) -> None:
    """Property: over [0, T] a key is admitted at most burst + T * rate / 60 times, and a refused call
    retried after its retry_after_s (with no call in between) is admitted."""
    clock = FakeClock()
    buckets = TokenBuckets(rate, burst, clock=clock)
    admitted = {"a": 0, "b": 0}
    for gap, key in calls:
        clock.now += gap
        answer = buckets.admit(key)
        admitted[key] += answer.allowed
        assert admitted[key] <= burst + clock.now * rate / 60 + 1e-9
        if not answer.allowed:
            assert 0 < answer.retry_after_s <= 60 / rate + 1e-9
            clock.now += answer.retry_after_s + 1e-9
            assert buckets.admit(key).allowed
            admitted[key] += 1


def test_client_key_groups_ipv6_by_64_and_keeps_ipv4() -> None:
    assert client_key("10.1.2.3") == "10.1.2.3"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_key("fe80::1%eth0") == "fe80::/64"
    assert client_key(None) == "<unknown>" and client_key("not an ip") == "not an ip"


def test_network_key_groups_ipv4_by_24_and_ipv6_by_64() -> None:
    assert network_key("10.1.2.3") == network_key("10.1.2.250") == "10.1.2.0/24"
    assert network_key("10.1.3.3") != network_key("10.1.2.3")
    assert network_key("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert network_key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert network_key(None) == "<unknown>" and network_key("not an ip") == "not an ip"


# ---------------------------------------------------------------- over HTTP


def test_registration_rate_limit_answers_429_and_serves_everyone_else(limited_server: Any) -> None:
    server, clock = limited_server(
        "--orchestrator.register_rate_per_minute", "6", "--orchestrator.register_burst", "2"
    )
    with OrchestratorClient(server.url, retries=0) as client:
        client.register("a")
        second = client.register("b")  # the client keeps the last registered worker's token
        status, body, headers = _register_raw(server.url)
        assert status == 429 and body["error"] == "rate_limited" and set(body) == {"error", "message"}
        assert headers["Retry-After"] == "10"  # (1 - 0 tokens) / (6/60 per s)
        with pytest.raises(OrchestratorBusy):
            client.register("c")
        # The limited address is still served on every other endpoint; its /24 shares its bucket,
        # and other networks may register.
        assert client.status().workers == 2
        assert client.get_tasks(second.worker_id).worker_id == second.worker_id
        assert _register_raw(server.url, source="127.0.0.2")[0] == 429
        assert _register_raw(server.url, source="127.0.1.2")[0] == 200
        clock.now += 9.0
        assert _register_raw(server.url)[2]["Retry-After"] == "1"  # 0.1 token short: 1 s (whole seconds)
        clock.now += 1.0
        assert client.register("d").worker_id == "w0003"
    # Off: 0 means no limit at all.
    server, _ = limited_server(
        "--orchestrator.register_rate_per_minute", "0", "--orchestrator.register_burst", "1"
    )
    with OrchestratorClient(server.url, retries=0) as client:
        assert len({client.register().worker_id for _ in range(5)}) == 5


def test_client_waits_the_servers_retry_after_then_gives_up(limited_server: Any) -> None:
    server, clock = limited_server(
        "--orchestrator.register_rate_per_minute", "6", "--orchestrator.register_burst", "1"
    )
    with OrchestratorClient(server.url, retries=3, sleep=clock.sleep) as client:
        client.register("first")
        assert client.register("second").worker_id == "w0001"
        assert clock.sleeps == [10.0]  # one 429, then exactly the Retry-After (> the 0.25 s backoff)
    stuck: list[float] = []
    client = OrchestratorClient(server.url, retries=2, sleep=stuck.append)  # time never moves
    with pytest.raises(OrchestratorBusy, match="3 attempts"):
        client.register("third")
    assert stuck == [10.0, 10.0]  # bounded: 1 + retries attempts
    client = OrchestratorClient(server.url, retries=1, max_retry_after_s=2.0, sleep=stuck.append)
    with pytest.raises(OrchestratorBusy):
        client.register("fourth")
    assert stuck[-1] == 2.0  # Retry-After honoured only up to max_retry_after_s


def test_registration_token_is_required_when_set(limited_server: Any) -> None:
    server, _ = limited_server(
        "--orchestrator.registration_token", "let-me-in", "--orchestrator.admin_token", "admin-admin-admin-admin"
    )
    with OrchestratorClient(server.url, retries=0) as anonymous:
        with pytest.raises(ClientRequestError) as error:
            anonymous.register("nobody")
        assert error.value.status == 401 and error.value.error == "unauthorized"
        assert "registration token" in error.value.message
    for wrong in ("let-me-i", "let-me-inn", "admin-admin-admin-admin"):
        status, body, _ = _register_raw(server.url, token=wrong)
        assert status == 401 and body["error"] == "unauthorized"
    with OrchestratorClient(server.url, retries=0, registration_token="let-me-in") as worker:
        registered = worker.register("invited")
        assert worker.get_tasks(registered.worker_id).worker_id == registered.worker_id
    with OrchestratorClient(server.url, retries=0, admin_token="admin-admin-admin-admin") as admin:
        assert [w.worker_id for w in admin.workers().workers] == [registered.worker_id]


def test_worker_cap_counts_unbanned_workers_and_survives_restart(limited_server: Any) -> None:
    server, _ = limited_server("--orchestrator.max_workers", "2")
    client = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    first = client.register()
    client.register()
    status, body, headers = _register_raw(server.url)
    assert status == 503 and body["error"] == "worker_limit" and "max_workers = 2" in body["message"]
    assert headers["Retry-After"] == "60"
    with pytest.raises(OrchestratorUnavailable):
        client.register()
    client.ban(first.worker_id, "hostile")
    assert client.register().worker_id == "w0002"  # a ban frees room; ids are never reused
    server.stop()
    restarted, _ = limited_server("--orchestrator.max_workers", "2")
    assert _register_raw(restarted.url)[0] == 503  # the cap holds after a rebuild from disk
    with OrchestratorClient(restarted.url, retries=0) as reader:
        assert [w.banned for w in reader.workers().workers] == [True, False, False]


def test_registration_config_is_validated() -> None:
    defaults = load_config(None, []).orchestrator
    assert (defaults.registration_token, defaults.max_workers) == ("", 10_000)
    assert (
        defaults.register_burst >= 8 and defaults.register_rate_per_minute >= 8
    )  # a demo's workers never wait
    for override in (
        ["--orchestrator.register_burst", "0"],
        ["--orchestrator.register_rate_per_minute", "-1"],
        ["--orchestrator.register_rate_per_minute", "nan"],
        ["--orchestrator.max_workers", "0"],
    ):
        with pytest.raises(ConfigError, match=override[0].removeprefix("--")):
            load_config(None, override)


def test_a_client_connects_from_its_source_address(server: Any, batch_for: Any) -> None:
    """``OrchestratorClient(source_address=...)``: the orchestrator sees the client at that address
    (the red teams' identities each come from their own loopback address this way)."""
    admin = OrchestratorClient(server.url, retries=0, admin_token=server.admin_token)
    worker = OrchestratorClient(server.url, retries=0, source_address="127.0.0.3")
    reg = worker.register()
    worker.submit_rollouts(batch_for(worker.get_tasks(reg.worker_id), 0))
    assert [b.client for b in admin.pending().batches] == ["127.0.0.3"]
